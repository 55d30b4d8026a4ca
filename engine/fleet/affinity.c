/* The session affinity table and the prefix index: see affinity.h. */

#include "fleet/affinity.h"
#include "base/clock.h"

#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include <xxhash.h>

/* A seed for hashing keys that clients choose (session ids, prompts): without it, anyone could compute
 * keys that all land in one bucket and turn every lookup into a long scan. */
static uint64_t random_seed(const void *salt)
{
    uint64_t seed;
    if (getrandom(&seed, sizeof(seed), GRND_NONBLOCK) == (ssize_t)sizeof(seed))
        return seed;
    uint64_t now = atc_mono_ns();
    return XXH3_64bits_withSeed(&now, sizeof(now), (uint64_t)(uintptr_t)salt);
}

/* ---- Session affinity table ----
 *
 * A chained hash table (bucket heads in an array sized to max_entries, so chains average <= 1 entry)
 * plus an intrusive circular LRU list. One allocation per entry holds the key and the id, so a lookup
 * touches the bucket and then the entry only. */

/* How many of the least recently used entries set() looks at for an expired one to evict instead of
 * the least recently used: enough to catch sessions that ended, small enough to stay O(1). */
#define EVICT_SCAN 8

struct lru_link {
    struct lru_link *prev, *next;
};

struct entry {
    struct lru_link lru; /* first member: a link is its entry */
    struct entry *chain; /* next entry in the same bucket */
    uint64_t hash;
    uint64_t expires_at;
    uint16_t keylen;
    uint8_t idcap; /* bytes for the id after the key, its NUL included */
    char data[];   /* key (keylen bytes, no NUL), then the id */
};

struct atc_affinity {
    pthread_mutex_t mu; /* held by every public function: the rest is read and written under it */
    struct entry **buckets;
    size_t mask; /* buckets - 1; a power of two */
    size_t count, max;
    uint64_t seed;
    uint64_t now;        /* the latest now_ms given to get(), to tell expired entries at eviction */
    struct lru_link lru; /* sentinel: lru.next is the most recently used, lru.prev the least */
    atc_affinity_observer observer; /* set before any worker uses the table, then read plainly */
    void *observer_ctx;
};

void atc_affinity_observe(struct atc_affinity *t, atc_affinity_observer fn, void *ctx)
{
    t->observer = fn;
    t->observer_ctx = ctx;
}

static inline struct entry *entry_of(struct lru_link *l)
{
    return (struct entry *)l;
}

static inline const char *entry_id(struct entry *e)
{
    return e->data + e->keylen;
}

static void lru_unlink(struct lru_link *l)
{
    l->prev->next = l->next;
    l->next->prev = l->prev;
}

static void lru_push_front(struct atc_affinity *t, struct lru_link *l)
{
    l->prev = &t->lru;
    l->next = t->lru.next;
    t->lru.next->prev = l;
    t->lru.next = l;
}

struct atc_affinity *atc_affinity_create(size_t max_entries)
{
    if (max_entries == 0)
        max_entries = ATC_AFFINITY_DEFAULT_ENTRIES;
    struct atc_affinity *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return NULL;
    size_t nbuckets = 1;
    while (nbuckets < max_entries)
        nbuckets <<= 1;
    t->buckets = calloc(nbuckets, sizeof(*t->buckets));
    if (t->buckets == NULL) {
        free(t);
        return NULL;
    }
    t->mask = nbuckets - 1;
    t->max = max_entries;
    t->seed = random_seed(t);
    t->lru.prev = t->lru.next = &t->lru;
    if (pthread_mutex_init(&t->mu, NULL) != 0) {
        free(t->buckets);
        free(t);
        return NULL;
    }
    return t;
}

void atc_affinity_destroy(struct atc_affinity *t)
{
    if (t == NULL)
        return;
    struct lru_link *l = t->lru.next;
    while (l != &t->lru) {
        struct lru_link *next = l->next;
        free(entry_of(l));
        l = next;
    }
    pthread_mutex_destroy(&t->mu);
    free(t->buckets);
    free(t);
}

/* The chain link that points at the entry for key, or at the chain's terminating NULL. */
static struct entry **find_link(struct atc_affinity *t, uint64_t hash, const char *key, size_t keylen)
{
    struct entry **link = &t->buckets[hash & t->mask];
    for (struct entry *e; (e = *link) != NULL; link = &e->chain)
        if (e->hash == hash && e->keylen == keylen && memcmp(e->data, key, keylen) == 0)
            break;
    return link;
}

static void remove_at(struct atc_affinity *t, struct entry **link)
{
    struct entry *e = *link;
    *link = e->chain;
    lru_unlink(&e->lru);
    free(e);
    t->count--;
}

/* Removes e, found from the LRU list, so its chain link is looked up by identity. */
static void remove_entry(struct atc_affinity *t, struct entry *e)
{
    struct entry **link = &t->buckets[e->hash & t->mask];
    while (*link != e)
        link = &(*link)->chain;
    remove_at(t, link);
}

static void evict_one(struct atc_affinity *t)
{
    struct lru_link *l = t->lru.prev;
    for (int i = 0; i < EVICT_SCAN && l != &t->lru; i++, l = l->prev) {
        if (entry_of(l)->expires_at <= t->now) {
            remove_entry(t, entry_of(l));
            return;
        }
    }
    remove_entry(t, entry_of(t->lru.prev));
}

/* The entry for key, made the most recently used, or NULL (an expired one is dropped). Under t->mu. */
static struct entry *get_locked(struct atc_affinity *t, uint64_t hash, const char *key, size_t keylen,
                                uint64_t now_ms)
{
    if (now_ms > t->now)
        t->now = now_ms;
    struct entry **link = find_link(t, hash, key, keylen);
    struct entry *e = *link;
    if (e == NULL)
        return NULL;
    if (e->expires_at <= now_ms) {
        remove_at(t, link);
        return NULL;
    }
    lru_unlink(&e->lru);
    lru_push_front(t, &e->lru);
    return e;
}

size_t atc_affinity_get(struct atc_affinity *t, const char *key, size_t keylen, uint64_t now_ms, char *out,
                        size_t outsize)
{
    if (outsize > 0)
        out[0] = '\0';
    if (keylen > ATC_AFFINITY_KEY_MAX)
        return 0;
    /* Hashed before locking (the seed never changes) to keep the lock short. */
    uint64_t hash = XXH3_64bits_withSeed(key, keylen, t->seed);
    size_t idlen = 0;
    pthread_mutex_lock(&t->mu);
    struct entry *e = get_locked(t, hash, key, keylen, now_ms);
    if (e != NULL) {
        /* Copied under the lock: once it is released, another worker may free or rewrite the entry. */
        const char *id = entry_id(e);
        idlen = strlen(id);
        if (outsize > 0) {
            size_t n = idlen < outsize ? idlen : outsize - 1;
            memcpy(out, id, n);
            out[n] = '\0';
        }
    }
    pthread_mutex_unlock(&t->mu);
    if (idlen == 0 && t->observer != NULL) /* after the lock: the observer may take its own */
        t->observer(t->observer_ctx, ATC_AFFINITY_MISS, key, keylen, NULL, 0);
    return idlen;
}

/* Under t->mu. */
static int set_locked(struct atc_affinity *t, uint64_t hash, const char *key, size_t keylen,
                      const char *endpoint_id, size_t idlen, uint64_t expires_at_ms)
{
    struct entry **link = find_link(t, hash, key, keylen);
    struct entry *e = *link;
    if (e != NULL && idlen < e->idcap) {
        /* Same key, and the new id fits: update in place. */
        memcpy(e->data + keylen, endpoint_id, idlen + 1);
        e->expires_at = expires_at_ms;
        lru_unlink(&e->lru);
        lru_push_front(t, &e->lru);
        return 0;
    }
    /* Allocate before removing anything, so a failure leaves the table as it was. */
    struct entry *n = malloc(sizeof(*n) + keylen + idlen + 1);
    if (n == NULL)
        return -1;
    if (e != NULL) {
        remove_at(t, link); /* the old entry is too small for the new id */
    } else if (t->count >= t->max) {
        evict_one(t);
    }
    n->hash = hash;
    n->expires_at = expires_at_ms;
    n->keylen = (uint16_t)keylen;
    n->idcap = (uint8_t)(idlen + 1);
    memcpy(n->data, key, keylen);
    memcpy(n->data + keylen, endpoint_id, idlen + 1);
    struct entry **head = &t->buckets[hash & t->mask];
    n->chain = *head;
    *head = n;
    lru_push_front(t, &n->lru);
    t->count++;
    return 0;
}

static int set_quiet(struct atc_affinity *t, const char *key, size_t keylen, const char *endpoint_id,
                     uint64_t expires_at_ms)
{
    if (keylen > ATC_AFFINITY_KEY_MAX || endpoint_id == NULL)
        return -1;
    size_t idlen = strnlen(endpoint_id, ATC_AFFINITY_ID_MAX + 1);
    if (idlen == 0 || idlen > ATC_AFFINITY_ID_MAX)
        return -1;
    uint64_t hash = XXH3_64bits_withSeed(key, keylen, t->seed);
    pthread_mutex_lock(&t->mu);
    int rc = set_locked(t, hash, key, keylen, endpoint_id, idlen, expires_at_ms);
    pthread_mutex_unlock(&t->mu);
    return rc;
}

int atc_affinity_set(struct atc_affinity *t, const char *key, size_t keylen, const char *endpoint_id,
                     uint64_t expires_at_ms)
{
    int rc = set_quiet(t, key, keylen, endpoint_id, expires_at_ms);
    if (rc == 0 && t->observer != NULL)
        t->observer(t->observer_ctx, ATC_AFFINITY_SET, key, keylen, endpoint_id, expires_at_ms);
    return rc;
}

int atc_affinity_put(struct atc_affinity *t, const char *key, size_t keylen, const char *endpoint_id,
                     uint64_t expires_at_ms)
{
    return set_quiet(t, key, keylen, endpoint_id, expires_at_ms);
}

void atc_affinity_del(struct atc_affinity *t, const char *key, size_t keylen)
{
    atc_affinity_forget(t, key, keylen);
    if (keylen <= ATC_AFFINITY_KEY_MAX && t->observer != NULL)
        t->observer(t->observer_ctx, ATC_AFFINITY_DEL, key, keylen, NULL, 0);
}

void atc_affinity_forget(struct atc_affinity *t, const char *key, size_t keylen)
{
    if (keylen > ATC_AFFINITY_KEY_MAX)
        return;
    uint64_t hash = XXH3_64bits_withSeed(key, keylen, t->seed);
    pthread_mutex_lock(&t->mu);
    struct entry **link = find_link(t, hash, key, keylen);
    if (*link != NULL)
        remove_at(t, link);
    pthread_mutex_unlock(&t->mu);
}

size_t atc_affinity_forget_endpoint(struct atc_affinity *t, const char *endpoint_id)
{
    size_t n = 0;
    pthread_mutex_lock(&t->mu);
    for (struct lru_link *l = t->lru.next, *next; l != &t->lru; l = next) {
        next = l->next;
        if (strcmp(entry_id(entry_of(l)), endpoint_id) == 0) {
            remove_entry(t, entry_of(l));
            n++;
        }
    }
    pthread_mutex_unlock(&t->mu);
    return n;
}

size_t atc_affinity_count(struct atc_affinity *t)
{
    pthread_mutex_lock(&t->mu);
    size_t n = t->count;
    pthread_mutex_unlock(&t->mu);
    return n;
}

/* ---- Prefix index ----
 *
 * Two generations of open-addressing tables, block hash -> the endpoints that hold it. Inserts go to the
 * current generation; lookups try the current one, then the previous one. When the current one holds
 * max_blocks / 2 entries, the previous one is cleared and becomes the current one.
 *
 * Why generations rather than an LRU list or CLOCK: the index is approximate, so "forget whatever was
 * not touched during the last max_blocks / 2 inserts" is a good enough notion of old, and it costs
 * nothing per insert or lookup: no list pointers, no reference bits to write from a lookup (overlaps()
 * stays read-only) and no deletions inside a probed table (linear probing needs none). The price is one
 * memset of a generation per max_blocks / 2 new blocks.
 *
 * An insert of a block already in the previous generation copies its holders into the current one
 * (promotion), so the current copy is always a superset: a lookup that finds a block in the current
 * generation never needs the previous one, and a block that keeps being requested survives rotations.
 *
 * The holders of a block, exact at any fleet size up to ATC_PREFIX_INDEX_ENDPOINTS_MAX: most blocks are
 * held by a few endpoints (a policy with affinity sends a prefix back where it went), so a slot lists up
 * to INLINE_HOLDERS endpoint indices itself; a block held by more (a system prompt every server has) moves
 * to a "wide" set, a bitmap of every endpoint, from a pool of the generation's own (wide_cap of them, reset
 * with the generation). Only when that pool is full does a fifth holder replace the least recent one
 * (counted: atc_prefix_index_dropped).
 *
 * Each slot is 32 bytes, two to a cache line; hash 0 marks an empty slot, so a block whose hash is 0 is
 * stored as 1 (an alias of one in 2^64, harmless for an approximate index).
 * Slots are found from the block hash re-hashed with a random seed: block hashes are plain XXH3 of
 * client-chosen text and would otherwise let a client pile its blocks into one probe run. */

#define PREFIX_LOAD_NUM 7 /* each generation is at most 70% full: short probe runs for linear probing */
#define PREFIX_LOAD_DEN 10
#define INLINE_HOLDERS 4
#define WIDE_WORDS (ATC_PREFIX_INDEX_ENDPOINTS_MAX / 64)
#define WIDE_SHARE 8 /* wide sets per generation: one per this many entries */

struct slot {
    uint64_t block;
    uint32_t stamp;  /* the clock when endpoint `recent` last got this block */
    uint32_t before; /* ... and when any other holder last did, at the latest */
    uint32_t wide;   /* 0: the holders are ep[0..n); else 1 + the number of the generation's wide set */
    uint16_t recent;
    uint16_t n;
    uint16_t ep[INLINE_HOLDERS];
};

/* What one endpoint's KV cache must have evicted, as an LRU cache of kv_tokens (vLLM's and SGLang's
 * evict least recently used blocks first): a block is gone once more distinct tokens than the cache holds
 * were sent there after it last was. Counting only the new tokens (the blocks it did not have) is not
 * enough: a hit moves its blocks to the front too (vLLM, vllm/v1/core/kv_cache_utils.py
 * FreeKVCacheBlockQueue: a cached block a request uses leaves the free queue and goes back at its end),
 * pushing every block sent since they last were one place back; on Mooncake's trace that count took 21%
 * of the uncached tokens for cached ones (the server computed 21.1M prompt tokens where the index said
 * 17.5M; an exact LRU of what atc sent said 21.1M). So the endpoint's own clock counts every token sent there (touched), in buckets of cap /
 * KV_STEPS of them; live[] counts, per bucket, the tokens whose latest send there falls in it (a block
 * sent again leaves its old bucket for the current one). The distinct tokens sent since a block last was
 * are the live tokens of the buckets after its own: once the newest buckets hold cap, everything before
 * them is gone, and of the bucket where the cache fills, the older share that no longer fits (its tokens
 * taken as spread evenly over its time). An estimate either way: a request's blocks share one stamp, so
 * the horizon takes or leaves all of them. The ring keeps KV_BUCKETS buckets, cap x KV_BUCKETS /
 * KV_STEPS tokens sent; a block older than the ring is taken as gone. */
#define KV_STEPS 16
#define KV_BUCKETS 128

struct kv_clock {
    uint64_t cap;     /* tokens; 0 = unknown (nothing is taken as evicted) */
    uint64_t step;    /* cap / KV_STEPS */
    uint64_t touched; /* prompt tokens sent there since cap was set */
    uint64_t opened;  /* buckets opened: bucket b (opened - KV_BUCKETS <= b < opened) is b % KV_BUCKETS */
    uint32_t start[KV_BUCKETS]; /* the index's clock when each bucket opened */
    uint32_t live[KV_BUCKETS];  /* tokens whose latest send there falls in the bucket */
    uint32_t horizon; /* when evicting: a block last sent there before this clock is gone */
};

struct generation {
    struct slot *slots;
    size_t count;
    uint64_t *wide; /* wide_cap sets of WIDE_WORDS words */
    size_t nwide;
};

struct atc_prefix_index {
    pthread_mutex_t mu; /* held by every public function but bytes(): the rest is used under it */
    struct generation cur, prev;
    size_t nslots;   /* per generation */
    size_t cap;      /* entries per generation before rotating: max_blocks / 2 */
    size_t wide_cap; /* wide sets per generation */
    uint64_t seed;
    uint32_t clock; /* prompt tokens sent anywhere, in KV_CLOCK_TOKENS units (wraps) */
    uint64_t clock_rest;
    uint64_t dropped; /* holders forgotten because the wide sets ran out */
    uint64_t evicting[WIDE_WORDS]; /* endpoints whose horizon is set: their cache has filled */
    struct kv_clock *kv; /* ATC_PREFIX_INDEX_ENDPOINTS_MAX of them */
};

/* The clock's unit. Stamps compare right within 2^31 units (137G tokens): a block not sent anywhere for
 * that long has left the index's generations, and an endpoint's ring starts again once its newest
 * bucket is 2^30 units old (KV_RING_STALE). */
#define KV_CLOCK_TOKENS 64
#define KV_RING_STALE (UINT32_C(1) << 30)

static inline bool before(uint32_t a, uint32_t b)
{
    return (int32_t)(a - b) < 0;
}

/* Whether endpoint e, which last got a block at clock @p t, must have evicted it since. */
static inline bool gone(const struct atc_prefix_index *idx, unsigned e, uint32_t t)
{
    return ((idx->evicting[e / 64] >> (e % 64)) & 1) && before(t, idx->kv[e].horizon);
}

static inline uint32_t held_since(const struct slot *s, unsigned e)
{
    return e == s->recent ? s->stamp : s->before;
}

static inline uint64_t *wide_of(const struct generation *g, const struct slot *s)
{
    return g->wide + (size_t)(s->wide - 1) * WIDE_WORDS;
}

/* Whether slot s of g lists endpoint e (evicted or not). */
static inline bool lists(const struct generation *g, const struct slot *s, unsigned e)
{
    if (s->wide)
        return (wide_of(g, s)[e / 64] >> (e % 64)) & 1;
    for (unsigned i = 0; i < s->n; i++)
        if (s->ep[i] == e)
            return true;
    return false;
}

/* Drops the holders of slot s that must have evicted its block, so that a refreshed stamp does not
 * revive them; all but @p keep (an endpoint that held it pinned, or UINT_MAX). */
static void prune(const struct atc_prefix_index *idx, struct generation *g, struct slot *s, unsigned keep)
{
    if (!s->wide) {
        unsigned k = 0;
        for (unsigned i = 0; i < s->n; i++)
            if (s->ep[i] == keep || !gone(idx, s->ep[i], held_since(s, s->ep[i])))
                s->ep[k++] = s->ep[i];
        s->n = (uint16_t)k;
        return;
    }
    uint64_t *w = wide_of(g, s);
    for (unsigned i = 0; i < WIDE_WORDS; i++)
        for (uint64_t m = w[i]; m != 0; m &= m - 1) {
            unsigned b = (unsigned)__builtin_ctzll(m);
            if (i * 64 + b != keep && gone(idx, i * 64 + b, held_since(s, i * 64 + b)))
                w[i] &= ~(UINT64_C(1) << b);
        }
}

/* A fresh wide set of g, cleared; NULL when the generation has used them all. */
static uint64_t *wide_alloc(struct atc_prefix_index *idx, struct generation *g, uint32_t *number)
{
    if (g->nwide == idx->wide_cap)
        return NULL;
    uint64_t *w = g->wide + g->nwide * WIDE_WORDS;
    memset(w, 0, WIDE_WORDS * sizeof(uint64_t));
    *number = (uint32_t)++g->nwide;
    return w;
}

/* Endpoint e now holds slot s's block too. */
static void add_holder(struct atc_prefix_index *idx, struct generation *g, struct slot *s, unsigned e)
{
    if (lists(g, s, e))
        return;
    if (s->wide) {
        wide_of(g, s)[e / 64] |= UINT64_C(1) << (e % 64);
        return;
    }
    if (s->n < INLINE_HOLDERS) {
        s->ep[s->n++] = (uint16_t)e;
        return;
    }
    uint32_t number;
    uint64_t *w = wide_alloc(idx, g, &number);
    if (w != NULL) {
        for (unsigned i = 0; i < s->n; i++)
            w[s->ep[i] / 64] |= UINT64_C(1) << (s->ep[i] % 64);
        w[e / 64] |= UINT64_C(1) << (e % 64);
        s->wide = number;
        s->n = 0;
        return;
    }
    /* No wide set left: e takes the place of a holder that is not the most recent (all of those share
     * the `before` stamp, so none is known to be older than the others). */
    unsigned i = s->ep[0] != s->recent ? 0 : 1;
    s->ep[i] = (uint16_t)e;
    idx->dropped++;
}

/* Copies slot @p old of the previous generation into @p s of the current one (promotion). */
static void promote(struct atc_prefix_index *idx, struct slot *s, const struct slot *old)
{
    *s = *old;
    if (!old->wide)
        return;
    uint32_t number;
    uint64_t *w = wide_alloc(idx, &idx->cur, &number);
    const uint64_t *from = wide_of(&idx->prev, old);
    if (w != NULL) {
        memcpy(w, from, WIDE_WORDS * sizeof(uint64_t));
        s->wide = number;
        return;
    }
    /* No wide set left: the most recent holder and the first others, the rest counted as dropped. */
    s->wide = 0;
    s->n = 0;
    if ((from[old->recent / 64] >> (old->recent % 64)) & 1)
        s->ep[s->n++] = old->recent;
    for (unsigned i = 0; i < WIDE_WORDS; i++)
        for (uint64_t m = from[i]; m != 0; m &= m - 1) {
            unsigned e = i * 64 + (unsigned)__builtin_ctzll(m);
            if (e == old->recent)
                continue;
            if (s->n < INLINE_HOLDERS)
                s->ep[s->n++] = (uint16_t)e;
            else
                idx->dropped++;
        }
}

/* Endpoint e got slot s's block now (already listed): the stamps move on. */
static inline void touch(struct slot *s, unsigned e, uint32_t now)
{
    if (e != s->recent) { /* the last one to get it joins the others, at its own time */
        s->before = s->stamp;
        s->recent = (uint16_t)e;
    }
    s->stamp = now;
}

/* The bucket of endpoint clock @p c that the clock value @p t falls in, -1 when it is older than the ring:
 * the newest bucket opened at or before t. */
static int64_t bucket_of(const struct kv_clock *c, uint32_t t)
{
    uint64_t lo = c->opened > KV_BUCKETS ? c->opened - KV_BUCKETS : 0, hi = c->opened;
    if (lo == hi || before(t, c->start[lo % KV_BUCKETS]))
        return -1;
    while (hi - lo > 1) { /* start[lo] <= t < start[hi] (hi: not yet opened) */
        uint64_t mid = lo + (hi - lo) / 2;
        if (before(t, c->start[mid % KV_BUCKETS]))
            hi = mid;
        else
            lo = mid;
    }
    return (int64_t)lo;
}

/* A block of @p tokens that endpoint e last got at clock @p t is sent there again: it leaves its bucket for
 * the current one. Returns the tokens it was counted for in the current one already (0 when it was in an
 * older one), which the current one must not count twice. */
static uint64_t resent(struct atc_prefix_index *idx, unsigned e, uint32_t t, uint64_t tokens)
{
    struct kv_clock *c = &idx->kv[e];
    if (c->cap == 0)
        return 0;
    int64_t b = bucket_of(c, t);
    if (b < 0)
        return 0;
    if ((uint64_t)b == c->opened - 1)
        return tokens;
    uint32_t *live = &c->live[b % KV_BUCKETS];
    *live = *live > tokens ? *live - (uint32_t)tokens : 0;
    return 0;
}

/* Endpoint e's ring starts again at the clock: everything sent there before is taken as gone. */
static void ring_restart(struct atc_prefix_index *idx, unsigned e)
{
    struct kv_clock *c = &idx->kv[e];
    memset(c->live, 0, sizeof(c->live));
    c->touched = 0;
    c->opened = 1;
    c->start[0] = c->horizon = idx->clock;
    idx->evicting[e / 64] |= UINT64_C(1) << (e % 64);
}

/* Endpoint e was sent @p tokens prompt tokens now (all its blocks, cached or not), @p again of them counted
 * in the current bucket already: the rest join it, the clocks move on, and the horizon follows the newest
 * buckets that hold the cache. */
static void sent(struct atc_prefix_index *idx, unsigned e, uint64_t tokens, uint64_t again)
{
    struct kv_clock *c = &idx->kv[e];
    uint32_t units = (uint32_t)((idx->clock_rest + tokens) / KV_CLOCK_TOKENS);
    idx->clock_rest = (idx->clock_rest + tokens) % KV_CLOCK_TOKENS;
    if (c->cap == 0) {
        idx->clock += units;
        return;
    }
    if ((uint32_t)(idx->clock - c->start[(c->opened - 1) % KV_BUCKETS]) > KV_RING_STALE)
        ring_restart(idx, e); /* idle while the clock went on: its stamps would wrap */
    /* this request's blocks carry the clock before it moves on: they join the bucket open now */
    uint32_t *now = &c->live[(c->opened - 1) % KV_BUCKETS];
    uint64_t add = tokens - again;
    *now = add < UINT32_MAX - *now ? *now + (uint32_t)add : UINT32_MAX;
    idx->clock += units;
    c->touched += tokens;
    uint64_t due = c->touched / c->step + 1; /* buckets open at 0, step, 2 step, ... sent */
    if (due - c->opened > KV_BUCKETS)        /* one huge request: only the ring's worth is kept */
        c->opened = due - KV_BUCKETS;
    while (c->opened < due) {
        c->start[c->opened % KV_BUCKETS] = idx->clock;
        c->live[c->opened++ % KV_BUCKETS] = 0;
    }
    uint64_t sum = 0, oldest = c->opened > KV_BUCKETS ? c->opened - KV_BUCKETS : 0;
    bool full = false;
    uint64_t b = c->opened;
    while (b > oldest && !full) {
        b--;
        sum += c->live[b % KV_BUCKETS];
        full = sum >= c->cap;
    }
    if (full || oldest > 0) { /* before bucket b (full) or before the ring (not): gone */
        c->horizon = c->start[b % KV_BUCKETS];
        uint32_t live = c->live[b % KV_BUCKETS];
        if (full && live > 0) { /* the cache holds the newest (cap - the newer buckets) of bucket b's tokens:
                                 * taken as spread evenly over its time */
            uint32_t end = b + 1 < c->opened ? c->start[(b + 1) % KV_BUCKETS] : idx->clock;
            double keep = (double)(c->cap - (sum - live)) / live;
            c->horizon += (uint32_t)((1 - keep) * (double)(uint32_t)(end - c->horizon));
        }
        idx->evicting[e / 64] |= UINT64_C(1) << (e % 64);
    } else {
        idx->evicting[e / 64] &= ~(UINT64_C(1) << (e % 64));
    }
}

/* The KV cache size of endpoint e (0: unknown); a change starts its clock again. */
static void set_capacity(struct atc_prefix_index *idx, unsigned e, uint64_t kv_tokens)
{
    struct kv_clock *c = &idx->kv[e];
    if (c->cap == kv_tokens)
        return;
    memset(c, 0, sizeof(*c));
    idx->evicting[e / 64] &= ~(UINT64_C(1) << (e % 64));
    c->cap = kv_tokens;
    c->step = kv_tokens / KV_STEPS > 0 ? kv_tokens / KV_STEPS : 1;
    if (kv_tokens != 0) {
        c->opened = 1; /* bucket 0 from now: a block sent twice in the first prompt is found in it */
        c->start[0] = idx->clock;
    }
}

static void index_free(struct atc_prefix_index *idx)
{
    free(idx->cur.slots);
    free(idx->prev.slots);
    free(idx->cur.wide);
    free(idx->prev.wide);
    free(idx->kv);
    free(idx);
}

struct atc_prefix_index *atc_prefix_index_create(size_t max_blocks)
{
    if (max_blocks == 0)
        max_blocks = ATC_PREFIX_INDEX_DEFAULT_BLOCKS;
    struct atc_prefix_index *idx = calloc(1, sizeof(*idx));
    if (idx == NULL)
        return NULL;
    idx->cap = max_blocks / 2 > 0 ? max_blocks / 2 : 1;
    idx->wide_cap = idx->cap / WIDE_SHARE > 16 ? idx->cap / WIDE_SHARE : 16;
    /* At least one slot more than cap, so a probe always reaches an empty slot and stops. */
    idx->nslots = (idx->cap * PREFIX_LOAD_DEN + PREFIX_LOAD_NUM - 1) / PREFIX_LOAD_NUM + 1;
    idx->cur.slots = calloc(idx->nslots, sizeof(struct slot));
    idx->prev.slots = calloc(idx->nslots, sizeof(struct slot));
    idx->cur.wide = calloc(idx->wide_cap * WIDE_WORDS, sizeof(uint64_t));
    idx->prev.wide = calloc(idx->wide_cap * WIDE_WORDS, sizeof(uint64_t));
    idx->kv = calloc(ATC_PREFIX_INDEX_ENDPOINTS_MAX, sizeof(*idx->kv));
    if (idx->cur.slots == NULL || idx->prev.slots == NULL || idx->cur.wide == NULL || idx->prev.wide == NULL ||
        idx->kv == NULL || pthread_mutex_init(&idx->mu, NULL) != 0) {
        index_free(idx);
        return NULL;
    }
    idx->seed = random_seed(idx);
    return idx;
}

void atc_prefix_index_destroy(struct atc_prefix_index *idx)
{
    if (idx == NULL)
        return;
    pthread_mutex_destroy(&idx->mu);
    index_free(idx);
}

static inline uint64_t stored_block(uint64_t block)
{
    return block != 0 ? block : 1;
}

/* The first slot to probe: the seeded re-hash mapped onto [0, nslots) by a multiply-shift, which needs
 * no power-of-two size, so the table can be sized to its load factor exactly. */
static inline size_t home_slot(const struct atc_prefix_index *idx, uint64_t block)
{
    uint64_t h = XXH3_64bits_withSeed(&block, sizeof(block), idx->seed);
    return (size_t)(((unsigned __int128)h * idx->nslots) >> 64);
}

/* The slot holding block in g, or the empty slot where it would go. */
static inline struct slot *probe(const struct atc_prefix_index *idx, const struct generation *g, size_t i,
                                 uint64_t block)
{
    for (;;) {
        struct slot *s = &g->slots[i];
        if (s->block == block || s->block == 0)
            return s;
        if (++i == idx->nslots)
            i = 0;
    }
}

static void rotate(struct atc_prefix_index *idx)
{
    struct generation dropped = idx->prev;
    idx->prev = idx->cur;
    memset(dropped.slots, 0, idx->nslots * sizeof(struct slot));
    dropped.count = 0;
    dropped.nwide = 0; /* a wide set is cleared when it is handed out again */
    idx->cur = dropped;
}

/* Endpoint e got blocks[0..n) now: sent there (@p pinned false), or given back by a request that held them
 * pinned while it ran, with @p extra tokens more (its output). */
static size_t record(struct atc_prefix_index *idx, const uint64_t *blocks, size_t n, unsigned e,
                     uint32_t block_tokens, uint64_t kv_tokens, bool pinned, uint64_t extra)
{
    if (e >= ATC_PREFIX_INDEX_ENDPOINTS_MAX)
        return 0;
    size_t had = 0;
    uint64_t bt = block_tokens ? block_tokens : 1, again = 0;
    bool leading = true; /* every block so far was recorded for this endpoint */
    pthread_mutex_lock(&idx->mu);
    set_capacity(idx, e, kv_tokens);
    if (extra > 0) /* freed before the blocks (vLLM frees a request's blocks last one first): older */
        sent(idx, e, extra, 0);
    for (size_t k = 0; k < n; k++) {
        uint64_t block = stored_block(blocks[k]);
        size_t home = home_slot(idx, block);
        struct slot *s = probe(idx, &idx->cur, home, block);
        if (s->block != block) {
            if (idx->cur.count >= idx->cap) {
                rotate(idx);
                s = &idx->cur.slots[home]; /* the new current generation is empty */
            }
            const struct slot *old = probe(idx, &idx->prev, home, block);
            if (old->block == block) /* promoted: its holders and their times come along */
                promote(idx, s, old);
            else
                *s = (struct slot){.block = block, .recent = (uint16_t)e, .stamp = idx->clock, .before = idx->clock};
            idx->cur.count++;
        }
        prune(idx, &idx->cur, s, pinned ? e : UINT_MAX); /* a refreshed stamp must not revive evicted copies */
        bool held = lists(&idx->cur, s, e);
        if (held)
            again += resent(idx, e, held_since(s, e), bt);
        leading = leading && held;
        had += leading;
        add_holder(idx, &idx->cur, s, e);
        touch(s, e, idx->clock);
    }
    sent(idx, e, (uint64_t)n * bt, again);
    pthread_mutex_unlock(&idx->mu);
    return had;
}

size_t atc_prefix_index_insert(struct atc_prefix_index *idx, const uint64_t *blocks, size_t n,
                               unsigned endpoint_index, uint32_t block_tokens, uint64_t kv_tokens)
{
    return record(idx, blocks, n, endpoint_index, block_tokens, kv_tokens, false, 0);
}

void atc_prefix_index_released(struct atc_prefix_index *idx, const uint64_t *blocks, size_t n,
                               unsigned endpoint_index, uint32_t block_tokens, uint64_t kv_tokens,
                               uint64_t extra_tokens)
{
    record(idx, blocks, n, endpoint_index, block_tokens, kv_tokens, true, extra_tokens);
}

static const struct slot *lookup(const struct atc_prefix_index *idx, uint64_t block,
                                 const struct generation **g)
{
    block = stored_block(block);
    size_t home = home_slot(idx, block);
    const struct slot *s = probe(idx, &idx->cur, home, block);
    *g = &idx->cur;
    if (s->block == block)
        return s;
    s = probe(idx, &idx->prev, home, block);
    *g = &idx->prev;
    return s->block == block ? s : NULL;
}

/* The endpoints of @p match (words lo..hi-1; the others are 0) that still hold slot s's block, into
 * @p still (the same words). One pass over those words, which are one or two once a long prompt is down
 * to the few endpoints that hold it. */
static void still_held(const struct atc_prefix_index *idx, const struct generation *g, const struct slot *s,
                       const uint64_t *match, uint64_t *still, unsigned lo, unsigned hi)
{
    const uint64_t *wide = s != NULL && s->wide ? wide_of(g, s) : NULL;
    for (unsigned i = lo; i < hi; i++) {
        uint64_t held = 0;
        if (wide != NULL)
            held = wide[i];
        else if (s != NULL)
            for (unsigned h = 0; h < s->n; h++)
                if (s->ep[h] / 64 == i)
                    held |= UINT64_C(1) << (s->ep[h] % 64);
        held &= match[i];
        /* Only endpoints whose cache has filled can have evicted it: the rest need no check. */
        for (uint64_t m = held & idx->evicting[i]; m != 0; m &= m - 1) {
            unsigned e = i * 64 + (unsigned)__builtin_ctzll(m);
            if (before(held_since(s, e), idx->kv[e].horizon))
                held &= ~(UINT64_C(1) << (e % 64));
        }
        still[i] = held;
    }
}

void atc_prefix_index_overlaps(struct atc_prefix_index *idx, const uint64_t *blocks, size_t n, uint16_t *out,
                               size_t nendpoints)
{
    if (nendpoints == 0)
        return;
    memset(out, 0, nendpoints * sizeof(*out));
    size_t known = nendpoints < ATC_PREFIX_INDEX_ENDPOINTS_MAX ? nendpoints : ATC_PREFIX_INDEX_ENDPOINTS_MAX;
    unsigned nw = (unsigned)((known + 63) / 64);
    uint64_t match[WIDE_WORDS], still[WIDE_WORDS]; /* endpoints that hold every block so far */
    for (unsigned i = 0; i < nw; i++)
        match[i] = i + 1 < nw || known % 64 == 0 ? UINT64_MAX : (UINT64_C(1) << (known % 64)) - 1;
    /* match's words lo..hi-1 hold every endpoint still matching: a long prompt is soon held by a few
     * endpoints of one or two words, and the blocks after that look at those words only. */
    unsigned lo = 0, hi = n > 0 ? nw : 0;
    size_t k = 0;
    pthread_mutex_lock(&idx->mu);
    for (; k < n && lo < hi; k++) {
        const struct generation *g;
        const struct slot *s = lookup(idx, blocks[k], &g);
        still_held(idx, g, s, match, still, lo, hi);
        for (unsigned i = lo; i < hi; i++) {
            /* Endpoints that stop matching at block k have exactly k leading blocks: out is 0 already
             * for those that never matched. */
            for (uint64_t m = k > 0 ? match[i] & ~still[i] : 0; m != 0; m &= m - 1)
                out[i * 64 + (unsigned)__builtin_ctzll(m)] = k > UINT16_MAX ? UINT16_MAX : (uint16_t)k;
            match[i] = still[i];
        }
        while (lo < hi && match[lo] == 0)
            lo++;
        while (hi > lo && match[hi - 1] == 0)
            hi--;
    }
    pthread_mutex_unlock(&idx->mu);
    for (unsigned i = lo; i < hi; i++)
        for (uint64_t m = match[i]; m != 0; m &= m - 1)
            out[i * 64 + (unsigned)__builtin_ctzll(m)] = k > UINT16_MAX ? UINT16_MAX : (uint16_t)k;
}

void atc_prefix_index_clear(struct atc_prefix_index *idx)
{
    pthread_mutex_lock(&idx->mu);
    memset(idx->cur.slots, 0, idx->nslots * sizeof(struct slot));
    memset(idx->prev.slots, 0, idx->nslots * sizeof(struct slot));
    idx->cur.count = idx->prev.count = 0;
    idx->cur.nwide = idx->prev.nwide = 0;
    memset(idx->kv, 0, ATC_PREFIX_INDEX_ENDPOINTS_MAX * sizeof(*idx->kv));
    memset(idx->evicting, 0, sizeof(idx->evicting));
    pthread_mutex_unlock(&idx->mu);
}

/* Drops endpoint e from the holders of every slot of g. */
static void forget_in(struct generation *g, size_t nslots, unsigned e)
{
    for (size_t i = 0; i < nslots; i++) {
        struct slot *s = &g->slots[i];
        if (s->block == 0)
            continue;
        if (s->wide) {
            wide_of(g, s)[e / 64] &= ~(UINT64_C(1) << (e % 64));
            continue;
        }
        unsigned k = 0;
        for (unsigned j = 0; j < s->n; j++)
            if (s->ep[j] != e)
                s->ep[k++] = s->ep[j];
        s->n = (uint16_t)k;
    }
}

void atc_prefix_index_forget(struct atc_prefix_index *idx, unsigned endpoint_index)
{
    if (endpoint_index >= ATC_PREFIX_INDEX_ENDPOINTS_MAX)
        return;
    pthread_mutex_lock(&idx->mu);
    forget_in(&idx->cur, idx->nslots, endpoint_index);
    forget_in(&idx->prev, idx->nslots, endpoint_index);
    memset(&idx->kv[endpoint_index], 0, sizeof(idx->kv[endpoint_index]));
    idx->evicting[endpoint_index / 64] &= ~(UINT64_C(1) << (endpoint_index % 64));
    pthread_mutex_unlock(&idx->mu);
}

size_t atc_prefix_index_count(struct atc_prefix_index *idx)
{
    pthread_mutex_lock(&idx->mu);
    size_t n = idx->cur.count + idx->prev.count;
    pthread_mutex_unlock(&idx->mu);
    return n;
}

uint64_t atc_prefix_index_dropped(struct atc_prefix_index *idx)
{
    pthread_mutex_lock(&idx->mu);
    uint64_t n = idx->dropped;
    pthread_mutex_unlock(&idx->mu);
    return n;
}

size_t atc_prefix_index_bytes(const struct atc_prefix_index *idx)
{
    return sizeof(*idx) + 2 * idx->nslots * sizeof(struct slot) +
           2 * idx->wide_cap * WIDE_WORDS * sizeof(uint64_t) + ATC_PREFIX_INDEX_ENDPOINTS_MAX * sizeof(struct kv_clock);
}
