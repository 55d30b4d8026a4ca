/* atc_prom_parse over any bytes: a server's /metrics page, as the health checks scrape it.
 *
 * Besides not crashing or reading outside the page: a failed parse says on which line and why, and
 * every sample it reported survives a round trip: written back in the exposition format (names and
 * label values escaped, quoted where they are not plain names) and parsed again, it comes out the same. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "fuzz.h"
#include "fleet/prometheus.h"

struct copy {
    char *name;
    size_t name_len;
    size_t nlabels;
    char **lname, **lvalue;
    size_t *lname_len, *lvalue_len;
    double value;
    bool has_timestamp;
    int64_t timestamp_ms;
};

struct list {
    struct copy *v;
    size_t n, cap;
};

static char *dup_bytes(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

static int on_sample(void *arg, const struct atc_prom_sample *s)
{
    struct list *l = arg;
    CHECK(s->name != NULL && s->name_len > 0);
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 16;
        l->v = realloc(l->v, l->cap * sizeof(*l->v));
    }
    struct copy *c = &l->v[l->n++];
    c->name = dup_bytes(s->name, s->name_len);
    c->name_len = s->name_len;
    c->nlabels = s->nlabels;
    c->lname = calloc(s->nlabels + 1, sizeof(char *));
    c->lvalue = calloc(s->nlabels + 1, sizeof(char *));
    c->lname_len = calloc(s->nlabels + 1, sizeof(size_t));
    c->lvalue_len = calloc(s->nlabels + 1, sizeof(size_t));
    for (size_t i = 0; i < s->nlabels; i++) {
        CHECK(s->labels[i].name_len > 0);
        c->lname[i] = dup_bytes(s->labels[i].name, s->labels[i].name_len);
        c->lname_len[i] = s->labels[i].name_len;
        c->lvalue[i] = dup_bytes(s->labels[i].value, s->labels[i].value_len);
        c->lvalue_len[i] = s->labels[i].value_len;
    }
    c->value = s->value;
    c->has_timestamp = s->has_timestamp;
    c->timestamp_ms = s->timestamp_ms;
    return 0;
}

static void list_free(struct list *l)
{
    for (size_t i = 0; i < l->n; i++) {
        struct copy *c = &l->v[i];
        for (size_t k = 0; k < c->nlabels; k++) {
            free(c->lname[k]);
            free(c->lvalue[k]);
        }
        free(c->name);
        free(c->lname);
        free(c->lvalue);
        free(c->lname_len);
        free(c->lvalue_len);
    }
    free(l->v);
}

static bool plain(const char *s, size_t n, bool metric)
{
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (metric && c == ':') ||
                  (i > 0 && c >= '0' && c <= '9');
        if (!ok)
            return false;
    }
    return n > 0;
}

static void quote(struct evbuffer *b, const char *s, size_t n)
{
    evbuffer_add(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\\' || s[i] == '"')
            evbuffer_add_printf(b, "\\%c", s[i]);
        else if (s[i] == '\n')
            evbuffer_add(b, "\\n", 2);
        else
            evbuffer_add(b, s + i, 1);
    }
    evbuffer_add(b, "\"", 1);
}

static void render(struct evbuffer *b, const struct copy *c)
{
    bool plain_name = plain(c->name, c->name_len, true);
    if (plain_name)
        evbuffer_add(b, c->name, c->name_len);
    if (!plain_name || c->nlabels > 0) {
        evbuffer_add(b, "{", 1);
        if (!plain_name)
            quote(b, c->name, c->name_len);
        for (size_t i = 0; i < c->nlabels; i++) {
            if (!plain_name || i > 0)
                evbuffer_add(b, ",", 1);
            if (plain(c->lname[i], c->lname_len[i], false))
                evbuffer_add(b, c->lname[i], c->lname_len[i]);
            else
                quote(b, c->lname[i], c->lname_len[i]);
            evbuffer_add(b, "=", 1);
            quote(b, c->lvalue[i], c->lvalue_len[i]);
        }
        evbuffer_add(b, "}", 1);
    }
    if (isnan(c->value))
        evbuffer_add_printf(b, " NaN");
    else if (isinf(c->value))
        evbuffer_add_printf(b, " %sInf", c->value < 0 ? "-" : "+");
    else
        evbuffer_add_printf(b, " %.17g", c->value);
    if (c->has_timestamp)
        evbuffer_add_printf(b, " %lld", (long long)c->timestamp_ms);
    evbuffer_add(b, "\n", 1);
}

static bool same(const struct copy *a, const struct copy *b)
{
    if (a->name_len != b->name_len || memcmp(a->name, b->name, a->name_len) != 0 || a->nlabels != b->nlabels)
        return false;
    for (size_t i = 0; i < a->nlabels; i++)
        if (a->lname_len[i] != b->lname_len[i] || memcmp(a->lname[i], b->lname[i], a->lname_len[i]) != 0 ||
            a->lvalue_len[i] != b->lvalue_len[i] || memcmp(a->lvalue[i], b->lvalue[i], a->lvalue_len[i]) != 0)
            return false;
    if (!(isnan(a->value) ? isnan(b->value) : a->value == b->value))
        return false;
    return a->has_timestamp == b->has_timestamp && (!a->has_timestamp || a->timestamp_ms == b->timestamp_ms);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size ? size : 1); /* exactly the page: an overread is an ASan report */
    memcpy(text, data, size);
    struct list first = {0}, second = {0};
    struct atc_prom_error err = {0};
    int rc = atc_prom_parse(text, size, on_sample, &first, &err);
    CHECK(rc == 0 || rc == -1);
    if (rc < 0) {
        size_t lines = 1;
        for (size_t i = 0; i < size; i++)
            lines += text[i] == '\n';
        CHECK(err.msg != NULL && err.line >= 1 && err.line <= lines);
    }

    struct evbuffer *b = evbuffer_new();
    for (size_t i = 0; i < first.n; i++)
        render(b, &first.v[i]);
    size_t len = evbuffer_get_length(b);
    char *again = malloc(len ? len : 1);
    evbuffer_remove(b, again, len);
    evbuffer_free(b);
    if (atc_prom_parse(again, len, on_sample, &second, &err) != 0) {
        fprintf(stderr, "round trip failed at line %zu (%s):\n%.*s\n", err.line, err.msg, (int)len, again);
        abort();
    }
    CHECK(second.n == first.n);
    for (size_t i = 0; i < first.n; i++)
        CHECK(same(&first.v[i], &second.v[i]));

    free(again);
    list_free(&first);
    list_free(&second);
    free(text);
    return 0;
}
