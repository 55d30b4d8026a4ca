/* The /tokenize step's shared cache and counters (kv_token_cache.h). */

#include "fleet/kv_token_cache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

struct entry {
    uint64_t id[2];
    uint64_t used; /* the cache's tick when last read or written; 0: empty */
    uint64_t *keys;
    size_t n;
};

struct atc_kv_token_cache {
    pthread_mutex_t mu;
    uint64_t tick;                                    /* (mu) */
    struct entry entries[ATC_KV_TOKEN_CACHE_ENTRIES]; /* (mu) */
    struct atc_kv_token_counters counters;
};

struct atc_kv_token_cache *atc_kv_token_cache_create(void)
{
    struct atc_kv_token_cache *c = calloc(1, sizeof *c);
    if (c != NULL && pthread_mutex_init(&c->mu, NULL) != 0) {
        free(c);
        return NULL;
    }
    return c;
}

void atc_kv_token_cache_destroy(struct atc_kv_token_cache *c)
{
    if (c == NULL)
        return;
    for (size_t i = 0; i < ATC_KV_TOKEN_CACHE_ENTRIES; i++)
        free(c->entries[i].keys);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

struct atc_kv_token_counters *atc_kv_token_cache_counters(struct atc_kv_token_cache *c)
{
    return &c->counters;
}

void atc_kv_token_cache_id(const char *model, int kind, const char *prompt, size_t len, uint64_t id[2])
{
    uint64_t seed = XXH3_64bits(model, strlen(model)) ^ (uint64_t)kind;
    XXH128_hash_t h = XXH3_128bits_withSeed(prompt, len, seed);
    id[0] = h.low64;
    id[1] = h.high64;
}

long atc_kv_token_cache_get(struct atc_kv_token_cache *c, const uint64_t id[2], uint64_t *out, size_t max)
{
    long got = -1;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < ATC_KV_TOKEN_CACHE_ENTRIES; i++) {
        struct entry *e = &c->entries[i];
        if (e->used != 0 && e->id[0] == id[0] && e->id[1] == id[1]) {
            e->used = ++c->tick;
            size_t n = e->n < max ? e->n : max;
            memcpy(out, e->keys, n * sizeof *out);
            got = (long)n;
            break;
        }
    }
    pthread_mutex_unlock(&c->mu);
    if (got >= 0)
        atomic_fetch_add_explicit(&c->counters.hits, 1, memory_order_relaxed);
    return got;
}

void atc_kv_token_cache_put(struct atc_kv_token_cache *c, const uint64_t id[2], const uint64_t *keys,
                            size_t n)
{
    if (n > ATC_KV_TOKEN_KEYS_MAX)
        n = ATC_KV_TOKEN_KEYS_MAX;
    uint64_t *copy = malloc((n > 0 ? n : 1) * sizeof *copy);
    if (copy == NULL)
        return; /* not cached: the next repeat asks again */
    memcpy(copy, keys, n * sizeof *copy);
    pthread_mutex_lock(&c->mu);
    struct entry *victim = &c->entries[0];
    for (size_t i = 0; i < ATC_KV_TOKEN_CACHE_ENTRIES; i++) {
        struct entry *e = &c->entries[i];
        if (e->used != 0 && e->id[0] == id[0] && e->id[1] == id[1]) {
            victim = e; /* two workers tokenized the same request: the later copy wins */
            break;
        }
        if (e->used < victim->used)
            victim = e;
    }
    uint64_t *old = victim->keys;
    *victim = (struct entry){.id = {id[0], id[1]}, .used = ++c->tick, .keys = copy, .n = n};
    pthread_mutex_unlock(&c->mu);
    free(old);
}

void atc_kv_token_cache_metrics(struct atc_kv_token_cache *c, struct evbuffer *out)
{
    static const struct {
        const char *name, *help;
        size_t off;
    } counters[] = {
        {"calls", "POST /tokenize calls made before a decision",
         offsetof(struct atc_kv_token_counters, calls)},
        {"cache_hits", "requests whose block keys came from the tokenize cache",
         offsetof(struct atc_kv_token_counters, hits)},
        {"timeouts", "tokenize calls past kv_events.tokenize_timeout (the decision guessed)",
         offsetof(struct atc_kv_token_counters, timeouts)},
        {"failures", "tokenize calls that failed (the decision guessed)",
         offsetof(struct atc_kv_token_counters, failures)},
    };
    for (size_t i = 0; i < sizeof counters / sizeof counters[0]; i++) {
        const _Atomic uint64_t *v = (const _Atomic uint64_t *)((const char *)&c->counters + counters[i].off);
        evbuffer_add_printf(out,
                            "# HELP atc_kv_tokenize_%s_total %s\n# TYPE atc_kv_tokenize_%s_total counter\n"
                            "atc_kv_tokenize_%s_total %llu\n",
                            counters[i].name, counters[i].help, counters[i].name, counters[i].name,
                            (unsigned long long)atomic_load_explicit(v, memory_order_relaxed));
    }
}
