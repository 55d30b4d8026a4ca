#include "base/histogram.h"

#include <string.h>

#include <event2/buffer.h>

void atc_histogram_init(struct atc_histogram *h, const double *bounds, unsigned nbounds)
{
    memset(h, 0, sizeof(*h));
    h->bounds = bounds;
    h->nbounds = nbounds;
}

void atc_histogram_observe(struct atc_histogram *h, double value)
{
    unsigned b = 0;
    while (b < h->nbounds && value > h->bounds[b])
        b++;
    h->counts[b]++;
    h->count++;
    h->sum += value;
}

void atc_histogram_render(const struct atc_histogram *h, struct evbuffer *out, const char *name,
                          const char *labels)
{
    uint64_t cumulative = 0;
    for (unsigned b = 0; b < h->nbounds; b++) {
        cumulative += h->counts[b];
        evbuffer_add_printf(out, "%s_bucket{%sle=\"%g\"} %llu\n", name, labels, h->bounds[b],
                            (unsigned long long)cumulative);
    }
    evbuffer_add_printf(out, "%s_bucket{%sle=\"+Inf\"} %llu\n", name, labels, (unsigned long long)h->count);
    /* _sum and _count carry the same labels, without the trailing comma */
    int n = (int)strlen(labels);
    if (n == 0)
        evbuffer_add_printf(out, "%s_sum %.9g\n%s_count %llu\n", name, h->sum, name,
                            (unsigned long long)h->count);
    else
        evbuffer_add_printf(out, "%s_sum{%.*s} %.9g\n%s_count{%.*s} %llu\n", name, n - 1, labels, h->sum,
                            name, n - 1, labels, (unsigned long long)h->count);
}

void atc_histogram_label(struct evbuffer *out, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\' || *s == '"')
            evbuffer_add_printf(out, "\\%c", *s);
        else if (*s == '\n')
            evbuffer_add(out, "\\n", 2);
        else
            evbuffer_add(out, s, 1);
    }
}
