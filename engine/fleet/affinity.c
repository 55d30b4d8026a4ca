/* The session affinity table and the prefix index: see affinity.h. */

#include "fleet/affinity.h"
#include "base/clock.h"

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

size_t atc_affinity_count(struct atc_affinity *t)
{
    pthread_mutex_lock(&t->mu);
    size_t n = t->count;
    pthread_mutex_unlock(&t->mu);
    return n;
}

/* ---- Prefix index ----
 *
 * Two generations of open-addressing tables, block hash -> endpoint bitmask. Inserts go to the current
 * generation; lookups try the current one, then the previous one. When the current one holds
 * max_blocks / 2 entries, the previous one is cleared and becomes the current one.
 *
 * Why generations rather than an LRU list or CLOCK: the index is approximate, so "forget whatever was
 * not touched during the last max_blocks / 2 inserts" is a good enough notion of old, and it costs
 * nothing per insert or lookup: no list pointers, no reference bits to write from a lookup (overlaps()
 * stays read-only) and no deletions inside a probed table (linear probing needs none). The price is one
 * memset of a generation per max_blocks / 2 new blocks.
 *
 * An insert of a block already in the previous generation copies its endpoints into the current one
 * (promotion), so the current copy is always a superset: a lookup that finds a block in the current
 * generation never needs the previous one, and a block that keeps being requested survives rotations.
 *
 * Each slot is {block hash, endpoint mask, two KV clock stamps, the bit stamped last}, 32 bytes, two to a
 * cache line; hash 0 marks an empty slot, so a block whose hash is 0 is stored as 1 (an alias of one in
 * 2^64, harmless for an approximate index).
 * Slots are found from the block hash re-hashed with a random seed: block hashes are plain XXH3 of
 * client-chosen text and would otherwise let a client pile its blocks into one probe run. */

#define PREFIX_LOAD_NUM 7 /* each generation is at most 70% full: short probe runs for linear probing */
#define PREFIX_LOAD_DEN 10

struct slot {
    uint64_t block;
    uint64_t endpoints;
    uint32_t stamp;  /* the ingest clock when endpoint bit `recent` last got this block */
    uint32_t before; /* ... and when any other endpoint of the mask last did, at the latest */
    uint8_t recent;
};

/* What one endpoint bit has taken into its KV cache since a moment, to tell what it must have evicted:
 * a server's cache holds kv_tokens; once it has taken in that many new prompt tokens since a block was
 * last sent there, the block is gone (LRU, as vLLM and SGLang evict). marks[] holds the clock each time
 * the ingest passed a multiple of cap / KV_STEPS, so "cap tokens ago" is known within 1/KV_STEPS of cap,
 * on the safe side (a block is taken as evicted only when it surely is). */
#define KV_STEPS 16
#define KV_MARKS 32 /* a ring of marks: KV_STEPS + 1 are needed */

struct kv_clock {
    uint64_t cap;    /* tokens; 0 = unknown (nothing is taken as evicted) */
    uint64_t ingest; /* uncached prompt tokens sent there since cap was set */
    uint64_t step;   /* cap / KV_STEPS */
    uint64_t marks_taken;
    uint32_t marks[KV_MARKS];
    bool folded; /* several endpoints share this bit (>= 64 endpoints): not modelled */
};

struct generation {
    struct slot *slots;
    size_t count;
};

struct atc_prefix_index {
    pthread_mutex_t mu; /* held by every public function but bytes(): the rest is used under it */
    struct generation cur, prev;
    size_t nslots; /* per generation */
    size_t cap;    /* entries per generation before rotating: max_blocks / 2 */
    uint64_t seed;
    uint32_t clock; /* uncached prompt tokens sent anywhere, in KV_CLOCK_TOKENS units (wraps) */
    uint64_t clock_rest;
    struct kv_clock kv[ATC_PREFIX_INDEX_ENDPOINTS];
};

#define KV_CLOCK_TOKENS 64 /* the clock's unit: 2^31 units is 137G tokens, far more than the index keeps */

static inline bool before(uint32_t a, uint32_t b)
{
    return (int32_t)(a - b) < 0;
}

/* Endpoint bits whose cache is modelled, and per bit the stamp below which a block is surely evicted. */
static uint64_t horizons(const struct atc_prefix_index *idx, uint32_t *h)
{
    uint64_t modelled = 0;
    for (unsigned b = 0; b < ATC_PREFIX_INDEX_ENDPOINTS; b++) {
        const struct kv_clock *c = &idx->kv[b];
        if (c->cap == 0 || c->folded || c->ingest < c->cap)
            continue;
        uint64_t m = (c->ingest - c->cap) / c->step; /* the mark taken at ingest m * step <= ingest - cap */
        h[b] = c->marks[m % KV_MARKS];
        modelled |= UINT64_C(1) << b;
    }
    return modelled;
}

/* The endpoints of slot s that still have its block. */
static inline uint64_t fresh(const struct slot *s, uint64_t modelled, const uint32_t *h)
{
    uint64_t out = s->endpoints;
    for (uint64_t m = out & modelled; m != 0; m &= m - 1) {
        unsigned b = (unsigned)__builtin_ctzll(m);
        if (before(b == s->recent ? s->stamp : s->before, h[b]))
            out &= ~(UINT64_C(1) << b);
    }
    return out;
}

/* Bit b got slot s's block now (its mask already set): the stamps move on. */
static inline void touch(struct slot *s, unsigned b, uint32_t now)
{
    if (b != s->recent) { /* the last one to get it joins the others, at its own time */
        s->before = s->stamp;
        s->recent = (uint8_t)b;
    }
    s->stamp = now;
}

/* Bit b took in @p tokens new prompt tokens: its marks and the clock move on. */
static void ingest(struct atc_prefix_index *idx, unsigned b, uint64_t tokens)
{
    struct kv_clock *c = &idx->kv[b];
    uint64_t units = (idx->clock_rest + tokens) / KV_CLOCK_TOKENS;
    idx->clock_rest = (idx->clock_rest + tokens) % KV_CLOCK_TOKENS;
    if (c->cap != 0) {
        c->ingest += tokens;
        uint64_t due = c->ingest / c->step + 1; /* marks at ingest 0, step, 2 step, ... up to now */
        if (due - c->marks_taken > KV_MARKS)    /* one huge request: only the ring's worth is kept */
            c->marks_taken = due - KV_MARKS;
        while (c->marks_taken < due) /* each mark: the clock as ingest passed it */
            c->marks[c->marks_taken++ % KV_MARKS] = idx->clock;
    }
    idx->clock += (uint32_t)units;
}

/* The KV cache size of the endpoint at bit b (0: unknown); a change starts its clock again. */
static void set_capacity(struct atc_prefix_index *idx, unsigned endpoint_index, uint64_t kv_tokens)
{
    struct kv_clock *c = &idx->kv[endpoint_index % ATC_PREFIX_INDEX_ENDPOINTS];
    if (endpoint_index >= ATC_PREFIX_INDEX_ENDPOINTS)
        c->folded = true;
    if (c->folded || c->cap == kv_tokens)
        return;
    memset(c, 0, sizeof(*c));
    c->cap = kv_tokens;
    c->step = kv_tokens / KV_STEPS > 0 ? kv_tokens / KV_STEPS : 1;
}

struct atc_prefix_index *atc_prefix_index_create(size_t max_blocks)
{
    if (max_blocks == 0)
        max_blocks = ATC_PREFIX_INDEX_DEFAULT_BLOCKS;
    struct atc_prefix_index *idx = calloc(1, sizeof(*idx));
    if (idx == NULL)
        return NULL;
    idx->cap = max_blocks / 2 > 0 ? max_blocks / 2 : 1;
    /* At least one slot more than cap, so a probe always reaches an empty slot and stops. */
    idx->nslots = (idx->cap * PREFIX_LOAD_DEN + PREFIX_LOAD_NUM - 1) / PREFIX_LOAD_NUM + 1;
    idx->cur.slots = calloc(idx->nslots, sizeof(struct slot));
    idx->prev.slots = calloc(idx->nslots, sizeof(struct slot));
    if (idx->cur.slots == NULL || idx->prev.slots == NULL) {
        free(idx->cur.slots);
        free(idx->prev.slots);
        free(idx);
        return NULL;
    }
    if (pthread_mutex_init(&idx->mu, NULL) != 0) {
        free(idx->cur.slots);
        free(idx->prev.slots);
        free(idx);
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
    free(idx->cur.slots);
    free(idx->prev.slots);
    free(idx);
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
    idx->cur = dropped;
}

size_t atc_prefix_index_insert(struct atc_prefix_index *idx, const uint64_t *blocks, size_t n,
                               unsigned endpoint_index, uint32_t block_tokens, uint64_t kv_tokens)
{
    unsigned b = endpoint_index % ATC_PREFIX_INDEX_ENDPOINTS;
    uint64_t bit = UINT64_C(1) << b;
    size_t had = 0;
    bool leading = true; /* every block so far was recorded for this endpoint */
    uint32_t h[ATC_PREFIX_INDEX_ENDPOINTS];
    pthread_mutex_lock(&idx->mu);
    set_capacity(idx, endpoint_index, kv_tokens);
    uint64_t modelled = horizons(idx, h);
    for (size_t k = 0; k < n; k++) {
        uint64_t block = stored_block(blocks[k]);
        size_t home = home_slot(idx, block);
        struct slot *s = probe(idx, &idx->cur, home, block);
        if (s->block == block) {
            uint64_t still = fresh(s, modelled, h); /* a refreshed stamp must not revive evicted copies */
            leading = leading && (still & bit) != 0;
            had += leading;
            s->endpoints = still | bit;
            touch(s, b, idx->clock);
            continue;
        }
        if (idx->cur.count >= idx->cap) {
            rotate(idx);
            s = &idx->cur.slots[home]; /* the new current generation is empty */
        }
        const struct slot *old = probe(idx, &idx->prev, home, block);
        if (old->block == block) { /* promoted: its holders and their times come along */
            *s = *old;
            s->endpoints = fresh(old, modelled, h);
        } else {
            *s = (struct slot){.block = block, .recent = (uint8_t)b, .stamp = idx->clock, .before = idx->clock};
        }
        leading = leading && (s->endpoints & bit) != 0;
        had += leading;
        s->endpoints |= bit;
        touch(s, b, idx->clock);
        idx->cur.count++;
    }
    ingest(idx, b, (uint64_t)(n - had) * (block_tokens ? block_tokens : 1));
    pthread_mutex_unlock(&idx->mu);
    return had;
}

static const struct slot *lookup(const struct atc_prefix_index *idx, uint64_t block)
{
    block = stored_block(block);
    size_t home = home_slot(idx, block);
    const struct slot *s = probe(idx, &idx->cur, home, block);
    if (s->block == block)
        return s;
    s = probe(idx, &idx->prev, home, block);
    return s->block == block ? s : NULL;
}

void atc_prefix_index_overlaps(struct atc_prefix_index *idx, const uint64_t *blocks, size_t n, uint16_t *out,
                               size_t nendpoints)
{
    if (nendpoints == 0)
        return;
    uint16_t depth[ATC_PREFIX_INDEX_ENDPOINTS] = {0}; /* overlap per bit */
    uint32_t h[ATC_PREFIX_INDEX_ENDPOINTS];
    uint64_t matching =
        nendpoints >= ATC_PREFIX_INDEX_ENDPOINTS ? UINT64_MAX : (UINT64_C(1) << nendpoints) - 1;
    size_t k = 0;
    pthread_mutex_lock(&idx->mu);
    uint64_t modelled = horizons(idx, h);
    for (; k < n && matching != 0; k++) {
        const struct slot *s = lookup(idx, blocks[k]);
        uint64_t still = s != NULL ? matching & fresh(s, modelled, h) : 0;
        /* Endpoints that stop matching at block k have exactly k leading blocks. */
        for (uint64_t gone = matching & ~still; gone != 0; gone &= gone - 1)
            depth[__builtin_ctzll(gone)] = k > UINT16_MAX ? UINT16_MAX : (uint16_t)k;
        matching = still;
    }
    pthread_mutex_unlock(&idx->mu);
    for (; matching != 0; matching &= matching - 1)
        depth[__builtin_ctzll(matching)] = k > UINT16_MAX ? UINT16_MAX : (uint16_t)k;
    for (size_t i = 0; i < nendpoints; i++)
        out[i] = depth[i % ATC_PREFIX_INDEX_ENDPOINTS];
}

void atc_prefix_index_clear(struct atc_prefix_index *idx)
{
    pthread_mutex_lock(&idx->mu);
    memset(idx->cur.slots, 0, idx->nslots * sizeof(struct slot));
    memset(idx->prev.slots, 0, idx->nslots * sizeof(struct slot));
    idx->cur.count = idx->prev.count = 0;
    memset(idx->kv, 0, sizeof(idx->kv));
    pthread_mutex_unlock(&idx->mu);
}

size_t atc_prefix_index_count(struct atc_prefix_index *idx)
{
    pthread_mutex_lock(&idx->mu);
    size_t n = idx->cur.count + idx->prev.count;
    pthread_mutex_unlock(&idx->mu);
    return n;
}

size_t atc_prefix_index_bytes(const struct atc_prefix_index *idx)
{
    return sizeof(*idx) + 2 * idx->nslots * sizeof(struct slot);
}
