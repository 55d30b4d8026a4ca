#ifndef ATC_KV_TOKEN_CACHE_H
#define ATC_KV_TOKEN_CACHE_H

/* What the /tokenize step before a decision (proxy/tokenize.h) shares across workers: an endpoint's
 * tokenize settings, and a cache of the block keys of requests already tokenized.
 *
 * The cache maps a whole request (its model, its kind and the raw JSON of its messages or prompt, as
 * a 128-bit XXH3) to the block keys its token ids chained into: a repeat or a retry of the same
 * request is not tokenized again. A conversation's next turn is a new request and is tokenized whole:
 * reusing an earlier turn's token ids for a longer conversation would need the chat template's
 * boundaries, which only the engine knows. Bounded: ATC_KV_TOKEN_CACHE_ENTRIES requests, each at most
 * ATC_KV_TOKEN_KEYS_MAX keys (a longer prompt keeps its first ones: a prefix is all the index is asked),
 * the least recently used going first.
 *
 * Threads: any; the entries are under the cache's own mutex (held for a scan of the entries and one
 * copy), the counters are relaxed atomics. */

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/buffer.h>

#include "request/kv_keys.h"

#define ATC_KV_TOKEN_CACHE_ENTRIES 256
#define ATC_KV_TOKEN_KEYS_MAX 2048

/* An endpoint's kv_events.tokenize settings (config/config.h), fixed once kv_events starts. */
struct atc_kv_tokenize {
    struct atc_kv_keyer keyer; /* hash, block_size, seed */
    uint64_t timeout_ms;
    size_t min_bytes;
};

struct atc_kv_token_cache;

struct atc_kv_token_counters {
    _Atomic uint64_t calls;    /* POST /tokenize sent */
    _Atomic uint64_t hits;     /* requests whose keys came from the cache */
    _Atomic uint64_t timeouts; /* calls past their budget (the decision guessed) */
    _Atomic uint64_t failures; /* calls that failed: connection, status, an answer without tokens */
};

/** A new empty cache, or NULL. */
struct atc_kv_token_cache *atc_kv_token_cache_create(void);
/** Frees it. NULL is fine. */
void atc_kv_token_cache_destroy(struct atc_kv_token_cache *c);

/** Its counters (the cache owns them; callers add with relaxed atomics). */
struct atc_kv_token_counters *atc_kv_token_cache_counters(struct atc_kv_token_cache *c);

/** The key of a request: @p model, @p kind and its @p len bytes of @p prompt. */
void atc_kv_token_cache_id(const char *model, int kind, const char *prompt, size_t len, uint64_t id[2]);

/** Copies the keys cached for @p id into @p out (at most @p max) and returns how many, or -1 when
 * none are cached. Counts a hit. */
long atc_kv_token_cache_get(struct atc_kv_token_cache *c, const uint64_t id[2], uint64_t *out, size_t max);

/** Caches @p n keys (copied) for @p id, in place of the least recently used entry. */
void atc_kv_token_cache_put(struct atc_kv_token_cache *c, const uint64_t id[2], const uint64_t *keys,
                            size_t n);

/** The atc_kv_tokenize_* counters in Prometheus' text format. */
void atc_kv_token_cache_metrics(struct atc_kv_token_cache *c, struct evbuffer *out);

#endif
