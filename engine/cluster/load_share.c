/* Shared load: the text a replica publishes of its endpoints' load and the sum of the others' figures
 * (load_share.h). */

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/load_share.h"
#include "fleet/endpoint.h"
#include "fleet/signals.h"

struct replica {
    char name[64];
    uint64_t seq;
    uint64_t changed_ms; /* reader's monotonic ms when seq last changed */
    char *text;          /* the last text published (owned) */
};

struct atc_load_share {
    char self[64];
    struct replica r[ATC_LOAD_SHARE_REPLICAS];
    size_t n;
};

struct atc_load_share *atc_load_share_create(const char *self)
{
    struct atc_load_share *s = calloc(1, sizeof(*s));
    if (s != NULL)
        snprintf(s->self, sizeof(s->self), "%s", self);
    return s;
}

void atc_load_share_destroy(struct atc_load_share *s)
{
    if (s == NULL)
        return;
    for (size_t i = 0; i < s->n; i++)
        free(s->r[i].text);
    free(s);
}

char *atc_load_share_encode(const struct atc_endpoint_table *t, uint64_t seq, uint64_t now_us, size_t *len)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (f == NULL)
        return NULL;
    fprintf(f, "atc1 %" PRIu64 "\n", seq);
    for (size_t i = 0; i < t->nendpoints; i++) {
        const struct atc_endpoint *ep = t->endpoints[i];
        const struct atc_signals *g = &ep->sig;
        fprintf(f, "%u %" PRIu64 " %" PRIu64 " %u %u %.1f %s\n",
                atomic_load_explicit(&ep->inflight, memory_order_relaxed),
                atomic_load_explicit(&ep->inflight_tokens, memory_order_relaxed),
                atomic_load_explicit(&g->prefill_tokens, memory_order_relaxed),
                atomic_load_explicit(&g->prefilling, memory_order_relaxed),
                atomic_load_explicit(&g->decoding, memory_order_relaxed),
                atc_signals_recent(g, &t->signals, now_us), ep->id);
    }
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

int atc_load_share_update(struct atc_load_share *s, const char *name, size_t namelen, const char *text,
                          size_t len, uint64_t now_ms)
{
    uint64_t seq;
    if (len < 6 || memcmp(text, "atc1 ", 5) != 0 || memchr(text, '\0', len) != NULL ||
        sscanf(text + 5, "%" SCNu64, &seq) != 1 || namelen >= sizeof(s->r[0].name))
        return -1;
    if (namelen == strlen(s->self) && memcmp(name, s->self, namelen) == 0)
        return 0;
    struct replica *r = NULL;
    for (size_t i = 0; i < s->n && r == NULL; i++)
        if (strlen(s->r[i].name) == namelen && memcmp(s->r[i].name, name, namelen) == 0)
            r = &s->r[i];
    if (r == NULL) {
        if (s->n == ATC_LOAD_SHARE_REPLICAS)
            return -1;
        r = &s->r[s->n++];
        memcpy(r->name, name, namelen);
        r->name[namelen] = '\0';
        r->seq = seq + 1; /* differs: counts as new */
    }
    if (r->seq == seq && r->text != NULL)
        return 0; /* not republished since: it ages */
    char *copy = strndup(text, len);
    if (copy == NULL)
        return -1;
    free(r->text);
    r->text = copy;
    r->seq = seq;
    r->changed_ms = now_ms;
    return 0;
}

struct sum {
    uint64_t inflight, tokens, prefill, prefilling, decoding;
    double recent;
    uint64_t oldest_ms;
};

static void store(struct atc_endpoint_table *t, const struct sum *sums)
{
    for (size_t i = 0; i < t->nendpoints; i++) {
        struct atc_remote_load *rl = &t->endpoints[i]->remote;
        const struct sum *m = &sums[t->endpoints[i]->index]; /* by slot */
        atomic_store_explicit(&rl->inflight, (unsigned)(m->inflight < UINT32_MAX ? m->inflight : UINT32_MAX),
                              memory_order_relaxed);
        atomic_store_explicit(&rl->tokens, m->tokens, memory_order_relaxed);
        atomic_store_explicit(&rl->prefill_tokens, m->prefill, memory_order_relaxed);
        atomic_store_explicit(&rl->prefilling, (unsigned)m->prefilling, memory_order_relaxed);
        atomic_store_explicit(&rl->decoding, (unsigned)m->decoding, memory_order_relaxed);
        atomic_store_explicit(&rl->recent_tokens, m->recent, memory_order_relaxed);
        atomic_store_explicit(&rl->at_ms, m->oldest_ms, memory_order_relaxed);
    }
}

unsigned atc_load_share_apply(struct atc_load_share *s, struct atc_endpoint_table *t, uint64_t now_ms,
                              uint64_t stale_ms)
{
    struct sum *sums = calloc(t->nslots ? t->nslots : 1, sizeof(*sums));
    if (sums == NULL)
        return 0;
    unsigned used = 0;
    for (size_t i = 0; i < s->n; i++) {
        const struct replica *r = &s->r[i];
        if (r->text == NULL || now_ms - r->changed_ms > stale_ms)
            continue;
        used++;
        const char *line = strchr(r->text, '\n');
        while (line != NULL && *++line != '\0') {
            const char *end = strchr(line, '\n');
            uint64_t a, b, c;
            unsigned d, e;
            double rec;
            int off = 0;
            if (sscanf(line, "%" SCNu64 " %" SCNu64 " %" SCNu64 " %u %u %lf %n", &a, &b, &c, &d, &e, &rec,
                       &off) == 6 &&
                off > 0) {
                char id[256];
                size_t idlen = (size_t)((end != NULL ? end : line + strlen(line)) - (line + off));
                if (idlen < sizeof(id)) {
                    memcpy(id, line + off, idlen);
                    id[idlen] = '\0';
                    const struct atc_endpoint *ep = atc_endpoint_table_find(t, id);
                    if (ep != NULL) {
                        struct sum *m = &sums[ep->index];
                        m->inflight += a;
                        m->tokens += b;
                        m->prefill += c;
                        m->prefilling += d;
                        m->decoding += e;
                        m->recent += rec > 0 ? rec : 0;
                        if (m->oldest_ms == 0 || r->changed_ms < m->oldest_ms)
                            m->oldest_ms = r->changed_ms ? r->changed_ms : 1;
                    }
                }
            }
            line = end;
        }
    }
    store(t, sums);
    free(sums);
    return used;
}

void atc_load_share_clear(struct atc_endpoint_table *t)
{
    struct sum *zero = calloc(t->nslots ? t->nslots : 1, sizeof(*zero));
    if (zero != NULL)
        store(t, zero);
    free(zero);
}

void atc_load_share_each(struct atc_load_share *s, uint64_t now_ms, uint64_t forget_ms,
                         void (*fn)(void *ctx, const char *name, uint64_t age_ms), void *ctx)
{
    for (size_t i = 0; i < s->n;) {
        struct replica *r = &s->r[i];
        if (now_ms - r->changed_ms > forget_ms) {
            free(r->text);
            *r = s->r[--s->n]; /* forgotten: a replica gone for good */
            continue;
        }
        if (fn != NULL)
            fn(ctx, r->name, now_ms - r->changed_ms);
        i++;
    }
}
