/* The exact prefix index (kv_index.h): open addressing with linear probing, a seqlock per slot,
 * deletion by shifting the rest of the probe chain back, and per endpoint a ring of its stores in
 * order for the overflow rule and for clearing it. */

#include "fleet/kv_index.h"

#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

struct slot {
    _Atomic unsigned seq;  /* odd while the writer changes the slot */
    _Atomic unsigned used; /* 1: the slot holds a key (its masks may be 0 a moment, during a compaction) */
    _Atomic uint64_t key;
    _Atomic uint64_t mask[2]; /* [enum atc_kv_tier]: bit i = endpoint i holds it there */
};

struct store { /* one store, in an endpoint's ring */
    uint64_t key;
    unsigned tier;
};

struct ep_state {
    size_t cap;
    size_t held; /* writer only: blocks held, both tiers */
    struct store *ring;
    size_t ring_cap, head, len; /* oldest at head */
    _Atomic size_t blocks[2];   /* writer stores (relaxed), anyone loads */
    _Atomic uint64_t evicted;
};

struct atc_kv_index {
    _Atomic unsigned moving; /* odd while the writer moves entries or clears bits a moment (a seqlock over
                                the whole table that only a reader who found nothing consults) */
    struct slot *slots;
    size_t mask; /* slots - 1 */
    unsigned n;
    struct ep_state eps[];
};

static size_t home(const struct atc_kv_index *ix, uint64_t key)
{
    key ^= key >> 33; /* the keys are hashes already; mixed anyway, against a publisher that counts */
    key *= UINT64_C(0xff51afd7ed558ccd);
    key ^= key >> 33;
    return (size_t)key & ix->mask;
}

struct slot_view {
    unsigned used;
    uint64_t key, mask[2];
};

/* The seqlock's writer (the main thread only): odd seq, the fields, even seq. Without fences (which
 * ThreadSanitizer does not model): the fields are stored with release and read with acquire, so a reader
 * that sees a new field also sees the odd seq stored before it (and the `moving` count before that),
 * and its second load of seq cannot move before its field loads. */
static void slot_write(struct slot *s, const struct slot_view *v)
{
    unsigned seq = atomic_load_explicit(&s->seq, memory_order_relaxed);
    atomic_store_explicit(&s->seq, seq + 1, memory_order_relaxed);
    atomic_store_explicit(&s->used, v->used, memory_order_release);
    atomic_store_explicit(&s->key, v->key, memory_order_release);
    atomic_store_explicit(&s->mask[0], v->mask[0], memory_order_release);
    atomic_store_explicit(&s->mask[1], v->mask[1], memory_order_release);
    atomic_store_explicit(&s->seq, seq + 2, memory_order_release);
}

static void moving_begin(struct atc_kv_index *ix)
{
    unsigned m = atomic_load_explicit(&ix->moving, memory_order_relaxed);
    atomic_store_explicit(&ix->moving, m + 1, memory_order_relaxed);
}

static void moving_end(struct atc_kv_index *ix)
{
    unsigned m = atomic_load_explicit(&ix->moving, memory_order_relaxed);
    atomic_store_explicit(&ix->moving, m + 1, memory_order_release);
}

/* The writer's own reads need no retry: nobody else writes. */
static struct slot_view slot_own(const struct slot *s)
{
    return (struct slot_view){.used = atomic_load_explicit(&s->used, memory_order_relaxed),
                              .key = atomic_load_explicit(&s->key, memory_order_relaxed),
                              .mask = {atomic_load_explicit(&s->mask[0], memory_order_relaxed),
                                       atomic_load_explicit(&s->mask[1], memory_order_relaxed)}};
}

/* Where a writer may run in the middle of a reader's loads of one slot. tests/unit/test_kv_events.c
 * defines it (it includes this file) to run the writer exactly there, so that its test of the retry
 * below fails when the retry is gone; nothing otherwise. */
#ifndef KV_INDEX_MID_READ
#define KV_INDEX_MID_READ(s) ((void)0)
#endif

static struct slot_view slot_read(const struct slot *s)
{
    struct slot_view v;
    unsigned before, after, tries = 0;
    do {
        if (tries++ > 0 && tries % 64 == 0)
            sched_yield(); /* the writer was preempted mid-slot: let it finish */
        before = atomic_load_explicit(&s->seq, memory_order_acquire);
        v.used = atomic_load_explicit(&s->used, memory_order_acquire);
        v.key = atomic_load_explicit(&s->key, memory_order_acquire);
        KV_INDEX_MID_READ(s);
        v.mask[0] = atomic_load_explicit(&s->mask[0], memory_order_acquire);
        v.mask[1] = atomic_load_explicit(&s->mask[1], memory_order_acquire);
        after = atomic_load_explicit(&s->seq, memory_order_relaxed);
    } while ((before & 1) || before != after); /* the writer was in the slot meanwhile: read it again */
    return v;
}

/* Writer: the slot of @p key, or the empty slot that ends its chain. The table is never more than half
 * full, so there is always one. */
static size_t find(const struct atc_kv_index *ix, uint64_t key)
{
    size_t i = home(ix, key);
    for (;;) {
        struct slot_view v = slot_own(&ix->slots[i]);
        if (!v.used || v.key == key)
            return i;
        i = (i + 1) & ix->mask;
    }
}

/* Writer: empties slot @p i and moves back the entries after it whose home allows it, so that every
 * chain stays unbroken (no tombstones to grow over time). */
static void delete_at(struct atc_kv_index *ix, size_t i)
{
    size_t j = i;
    moving_begin(ix);
    for (;;) {
        j = (j + 1) & ix->mask;
        struct slot_view v = slot_own(&ix->slots[j]);
        if (!v.used)
            break;
        size_t k = home(ix, v.key);
        /* Stays where it is when its home lies cyclically in (i, j]. */
        bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
        if (!stays) {
            slot_write(&ix->slots[i], &v);
            i = j;
        }
    }
    slot_write(&ix->slots[i], &(struct slot_view){0});
    moving_end(ix);
}

/* Writer: sets or clears endpoint @p ep's bit for @p key on @p tier; 1 when it changed. */
static int set_bit(struct atc_kv_index *ix, unsigned ep, uint64_t key, unsigned tier, bool on)
{
    size_t i = find(ix, key);
    struct slot_view v = slot_own(&ix->slots[i]);
    uint64_t bit = UINT64_C(1) << ep;
    if (on == (v.used && (v.mask[tier] & bit)))
        return 0;
    if (!v.used)
        v = (struct slot_view){.used = 1, .key = key};
    v.mask[tier] = on ? v.mask[tier] | bit : v.mask[tier] & ~bit;
    if (v.mask[0] == 0 && v.mask[1] == 0)
        delete_at(ix, i);
    else
        slot_write(&ix->slots[i], &v);
    return 1;
}

static bool holds(const struct atc_kv_index *ix, unsigned ep, uint64_t key, unsigned tier)
{
    struct slot_view v = slot_own(&ix->slots[find(ix, key)]);
    return v.used && (v.mask[tier] & (UINT64_C(1) << ep));
}

static void count(struct ep_state *e, unsigned tier, int delta)
{
    size_t b = atomic_load_explicit(&e->blocks[tier], memory_order_relaxed);
    atomic_store_explicit(&e->blocks[tier], b + (size_t)delta, memory_order_relaxed);
    e->held += (size_t)delta;
}

/* Writer: drops the ring's stale stores (removed since) and duplicates (removed and stored again: the
 * older copy goes), keeping order. A duplicate is found by clearing each kept store's bit as the walk
 * from the newest passes it, then setting them again: readers may miss those keys meanwhile. */
static void compact(struct atc_kv_index *ix, unsigned ep)
{
    struct ep_state *e = &ix->eps[ep];
    size_t kept = 0;
    moving_begin(ix);
    for (size_t n = e->len; n-- > 0;) {
        struct store s = e->ring[(e->head + n) % e->ring_cap];
        if (holds(ix, ep, s.key, s.tier)) {
            /* the key's slot keeps used=1 with both masks 0 a moment: chains stay whole */
            size_t i = find(ix, s.key);
            struct slot_view v = slot_own(&ix->slots[i]);
            v.mask[s.tier] &= ~(UINT64_C(1) << ep);
            slot_write(&ix->slots[i], &v);
            e->ring[(e->head + e->len - 1 - kept) % e->ring_cap] = s; /* packed towards the newest end */
            kept++;
        }
    }
    size_t start = (e->head + e->len - kept) % e->ring_cap;
    struct store *tmp = malloc(kept * sizeof *tmp + 1);
    for (size_t n = 0; n < kept; n++) {
        struct store s = e->ring[(start + n) % e->ring_cap];
        size_t i = find(ix, s.key);
        struct slot_view v = slot_own(&ix->slots[i]);
        v.mask[s.tier] |= UINT64_C(1) << ep;
        slot_write(&ix->slots[i], &v);
        if (tmp)
            tmp[n] = s;
    }
    if (tmp) { /* re-based at 0 */
        memcpy(e->ring, tmp, kept * sizeof *tmp);
        free(tmp);
        e->head = 0;
    } else {
        e->head = start;
    }
    e->len = kept;
    moving_end(ix);
    /* A slot left with both masks 0 (none: every kept store set its bit again) would need delete_at. */
}

static void evict_oldest(struct atc_kv_index *ix, unsigned ep)
{
    struct ep_state *e = &ix->eps[ep];
    while (e->held > e->cap && e->len > 0) {
        struct store s = e->ring[e->head];
        e->head = (e->head + 1) % e->ring_cap;
        e->len--;
        if (set_bit(ix, ep, s.key, s.tier, false)) {
            count(e, s.tier, -1);
            atomic_fetch_add_explicit(&e->evicted, 1, memory_order_relaxed);
        }
    }
}

int atc_kv_index_store(struct atc_kv_index *ix, unsigned ep, uint64_t key, enum atc_kv_tier tier)
{
    if (ep >= ix->n || (tier != ATC_KV_GPU && tier != ATC_KV_CPU))
        return -1;
    struct ep_state *e = &ix->eps[ep];
    if (!set_bit(ix, ep, key, tier, true))
        return 0;
    count(e, tier, +1);
    if (e->len == e->ring_cap)
        compact(ix, ep); /* leaves at most cap + 1 of 2 * cap + 2 */
    e->ring[(e->head + e->len++) % e->ring_cap] = (struct store){.key = key, .tier = tier};
    evict_oldest(ix, ep);
    return 1;
}

int atc_kv_index_remove(struct atc_kv_index *ix, unsigned ep, uint64_t key, enum atc_kv_tier tier)
{
    if (ep >= ix->n || (tier != ATC_KV_GPU && tier != ATC_KV_CPU))
        return 0;
    if (!set_bit(ix, ep, key, tier, false))
        return 0;
    count(&ix->eps[ep], tier, -1);
    return 1;
}

void atc_kv_index_clear(struct atc_kv_index *ix, unsigned ep)
{
    if (ep >= ix->n)
        return;
    struct ep_state *e = &ix->eps[ep];
    for (size_t n = 0; n < e->len; n++) {
        struct store s = e->ring[(e->head + n) % e->ring_cap];
        if (set_bit(ix, ep, s.key, s.tier, false))
            count(e, s.tier, -1);
    }
    e->head = e->len = 0;
}

static bool held_once(const struct atc_kv_index *ix, uint64_t bit, uint64_t key, unsigned tiers)
{
    size_t i = home(ix, key);
    for (size_t probes = 0; probes <= ix->mask; probes++) {
        struct slot_view v = slot_read(&ix->slots[i]);
        if (!v.used)
            return false;
        if (v.key == key)
            return ((tiers & 1) && (v.mask[0] & bit)) || ((tiers & 2) && (v.mask[1] & bit));
        i = (i + 1) & ix->mask;
    }
    return false;
}

/* A key not found is looked up again while the writer was moving entries meanwhile (it may have passed
 * the reader by), a bounded number of times: a reader never waits on a writer that keeps moving. */
static bool held(const struct atc_kv_index *ix, uint64_t bit, uint64_t key, unsigned tiers)
{
    for (int tries = 0; tries < 64; tries++) {
        if (tries > 0 && tries % 8 == 0)
            sched_yield();
        unsigned before = atomic_load_explicit(&ix->moving, memory_order_acquire);
        if (held_once(ix, bit, key, tiers)) /* (its acquire loads keep the load below after them) */
            return true;
        if (!(before & 1) && before == atomic_load_explicit(&ix->moving, memory_order_relaxed))
            return false;
    }
    return false;
}

size_t atc_kv_index_held_prefix(const struct atc_kv_index *ix, unsigned ep, const uint64_t *keys, size_t n,
                                unsigned tiers)
{
    if (ep >= ix->n)
        return 0;
    for (size_t k = 0; k < n; k++)
        if (!held(ix, UINT64_C(1) << ep, keys[k], tiers))
            return k;
    return n;
}

size_t atc_kv_index_blocks(const struct atc_kv_index *ix, unsigned ep, enum atc_kv_tier tier)
{
    if (ep >= ix->n || (tier != ATC_KV_GPU && tier != ATC_KV_CPU))
        return 0;
    return atomic_load_explicit(&ix->eps[ep].blocks[tier], memory_order_relaxed);
}

uint64_t atc_kv_index_evicted(const struct atc_kv_index *ix, unsigned ep)
{
    return ep < ix->n ? atomic_load_explicit(&ix->eps[ep].evicted, memory_order_relaxed) : 0;
}

struct atc_kv_index *atc_kv_index_create(const size_t *caps, unsigned n)
{
    if (n == 0 || n > ATC_KV_INDEX_MAX_ENDPOINTS)
        return NULL;
    size_t total = 0;
    for (unsigned i = 0; i < n; i++) {
        if (caps[i] == 0 || caps[i] > (SIZE_MAX / 64) / ATC_KV_INDEX_MAX_ENDPOINTS)
            return NULL;
        total += caps[i];
    }
    size_t slots = 16;
    while (slots < 2 * (total + n)) /* + n: each endpoint may be one over its cap, a moment */
        slots *= 2;
    struct atc_kv_index *ix = calloc(1, sizeof *ix + n * sizeof ix->eps[0]);
    if (!ix)
        return NULL;
    ix->n = n;
    ix->mask = slots - 1;
    if (!(ix->slots = calloc(slots, sizeof *ix->slots)))
        goto error;
    for (unsigned i = 0; i < n; i++) {
        ix->eps[i].cap = caps[i];
        ix->eps[i].ring_cap = 2 * caps[i] + 2;
        if (!(ix->eps[i].ring = malloc(ix->eps[i].ring_cap * sizeof *ix->eps[i].ring)))
            goto error;
    }
    return ix;
error:
    atc_kv_index_destroy(ix);
    return NULL;
}

void atc_kv_index_destroy(struct atc_kv_index *ix)
{
    if (!ix)
        return;
    for (unsigned i = 0; i < ix->n; i++)
        free(ix->eps[i].ring);
    free(ix->slots);
    free(ix);
}
