/* The simulated inference server's model; see sim.h for what it models and why. No I/O, no clock:
 * every time is the caller's. */

#include "sim/sim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NONE UINT32_MAX

#define DEFAULT_MAX_SEQS ATC_SIM_DEFAULT_MAX_SEQS
#define DEFAULT_PREFILL_TPS 15000.0
#define DEFAULT_DECODE_MS 12.0

#define DEFAULT_BATCH_FACTOR 2.2
#define DEFAULT_BATCH_SAT 64

#define DEFAULT_OUTPUT_MIN 16
#define DEFAULT_OUTPUT_MAX 512

/* A cached prefix block. Unpinned entries (refs == 0) sit on the LRU list, the oldest at its head. */
struct kv_entry {
    uint64_t hash;
    uint32_t units; /* KV blocks it costs */
    uint32_t refs;  /* running sequences pinning it */
    uint32_t prev, next;
    bool spent; /* a finished sequence's tail and output: no prefix, never hit, never announced */
};

struct kv_cache {
    struct kv_entry *entries;
    uint32_t nentries, cap; /* entries[0..nentries) are used or on the free list */
    uint32_t free_head;     /* free entries chained through next */
    uint32_t *table;        /* open addressing on hash: entry index + 1, 0 = empty */
    uint32_t mask;          /* table size - 1 */
    uint32_t count;         /* live entries */
    uint32_t lru_head, lru_tail;
    uint64_t units;  /* blocks held by all cached entries */
    uint64_t pinned; /* blocks held by pinned entries */
};

struct seq {
    struct seq *prev, *next; /* on the waiting or the running list */
    uint64_t id;
    void *user;
    uint64_t arrival_us;
    uint32_t prompt_tokens, output_tokens, block_tokens;
    uint32_t tail_tokens;  /* prompt tokens past the last full hash block */
    uint32_t prefill_left; /* uncached prompt tokens still to compute */
    uint32_t emitted;
    uint32_t held; /* KV blocks held for the tail and the output while running */
    bool running;
    bool kv_arrives; /* atc_sim_request's: its prompt's KV was computed elsewhere */
    bool emits;      /* emits a token at the end of the current iteration */
    bool dead;       /* finished or cancelled during callbacks; freed after them */
    size_t nblocks;
    uint32_t *pins;   /* entries pinned while running, nblocks of them */
    uint64_t *hashes; /* nblocks; the two arrays live in the same allocation */
};

struct seq_list {
    struct seq *head, *tail;
    unsigned n;
};

struct atc_sim {
    struct atc_sim_params p; /* with defaults filled in; p.model is not owned */
    atc_sim_on_token on_token;
    void *ctx;
    uint64_t rng;

    struct seq **slots; /* sequence ids are (generation << 32 | slot) */
    uint32_t *gens;
    uint32_t nslots;
    uint32_t *free_slots;
    uint32_t nfree;

    struct seq_list waiting, running;
    struct kv_cache kv;
    uint64_t held;  /* KV blocks held by running sequences outside the prefix cache */
    uint64_t spent; /* spent entries made: their hashes */

    bool busy; /* an iteration is in progress, ending at iter_end */
    bool in_callbacks;
    uint64_t iter_end;
    uint64_t clock; /* start of the last iteration: nothing is scheduled before it */

    uint64_t prefix_queries, prefix_hits, prefix_blocks, prefix_block_hits, iterations, tokens, preemptions;
    atc_sim_on_kv on_kv; /* the KV events' listener, or NULL */
    void *kv_ctx;
};

uint64_t atc_sim_rand(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

double atc_sim_uniform(uint64_t *state)
{
    return (double)(atc_sim_rand(state) >> 11) / 9007199254740992.0;
}

static uint32_t div_up(uint64_t a, uint64_t b)
{
    uint64_t q = (a + b - 1) / b;
    return q > UINT32_MAX ? UINT32_MAX : (uint32_t)q;
}

/* ---- lists ---- */

static void list_push(struct seq_list *l, struct seq *s)
{
    s->next = NULL;
    s->prev = l->tail;
    if (l->tail)
        l->tail->next = s;
    else
        l->head = s;
    l->tail = s;
    l->n++;
}

static void list_push_front(struct seq_list *l, struct seq *s)
{
    s->prev = NULL;
    s->next = l->head;
    if (l->head)
        l->head->prev = s;
    else
        l->tail = s;
    l->head = s;
    l->n++;
}

static void list_unlink(struct seq_list *l, struct seq *s)
{
    if (s->prev)
        s->prev->next = s->next;
    else
        l->head = s->next;
    if (s->next)
        s->next->prev = s->prev;
    else
        l->tail = s->prev;
    s->prev = s->next = NULL;
    l->n--;
}

/* ---- KV prefix cache ---- */

static uint32_t hash_slot(uint64_t h, uint32_t mask)
{
    /* Block hashes are XXH3 outputs already, but tests use small integers: mix anyway. */
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return (uint32_t)h & mask;
}

static uint32_t kv_find(const struct kv_cache *kv, uint64_t hash)
{
    if (!kv->table)
        return NONE;
    for (uint32_t i = hash_slot(hash, kv->mask);; i = (i + 1) & kv->mask) {
        uint32_t e = kv->table[i];
        if (e == 0)
            return NONE;
        if (kv->entries[e - 1].hash == hash)
            return e - 1;
    }
}

static void table_put(uint32_t *table, uint32_t mask, uint64_t hash, uint32_t entry)
{
    uint32_t i = hash_slot(hash, mask);
    while (table[i] != 0)
        i = (i + 1) & mask;
    table[i] = entry + 1;
}

static int kv_grow_table(struct kv_cache *kv)
{
    uint32_t size = kv->table ? (kv->mask + 1) * 2 : 64;
    uint32_t *t = calloc(size, sizeof(*t));
    if (!t)
        return -1;
    if (kv->table) {
        for (uint32_t i = 0; i <= kv->mask; i++)
            if (kv->table[i])
                table_put(t, size - 1, kv->entries[kv->table[i] - 1].hash, kv->table[i] - 1);
    }
    free(kv->table);
    kv->table = t;
    kv->mask = size - 1;
    return 0;
}

/* Linear probing with backward-shift deletion, so there are no tombstones to clean up. */
static void kv_table_remove(struct kv_cache *kv, uint64_t hash)
{
    uint32_t i = hash_slot(hash, kv->mask);
    while (kv->entries[kv->table[i] - 1].hash != hash)
        i = (i + 1) & kv->mask;
    for (uint32_t j = (i + 1) & kv->mask; kv->table[j] != 0; j = (j + 1) & kv->mask) {
        uint32_t home = hash_slot(kv->entries[kv->table[j] - 1].hash, kv->mask);
        /* Move j back into the hole at i unless its home lies cyclically in (i, j]. */
        if (((j - home) & kv->mask) >= ((j - i) & kv->mask)) {
            kv->table[i] = kv->table[j];
            i = j;
        }
    }
    kv->table[i] = 0;
}

static void lru_unlink(struct kv_cache *kv, uint32_t e)
{
    struct kv_entry *x = &kv->entries[e];
    if (x->prev != NONE)
        kv->entries[x->prev].next = x->next;
    else
        kv->lru_head = x->next;
    if (x->next != NONE)
        kv->entries[x->next].prev = x->prev;
    else
        kv->lru_tail = x->prev;
    x->prev = x->next = NONE;
}

static void lru_push(struct kv_cache *kv, uint32_t e)
{
    struct kv_entry *x = &kv->entries[e];
    x->next = NONE;
    x->prev = kv->lru_tail;
    if (kv->lru_tail != NONE)
        kv->entries[kv->lru_tail].next = e;
    else
        kv->lru_head = e;
    kv->lru_tail = e;
}

static void kv_pin(struct kv_cache *kv, uint32_t e)
{
    struct kv_entry *x = &kv->entries[e];
    if (x->refs++ == 0) {
        lru_unlink(kv, e);
        kv->pinned += x->units;
    }
}

static void kv_unpin(struct kv_cache *kv, uint32_t e)
{
    struct kv_entry *x = &kv->entries[e];
    if (--x->refs == 0) {
        lru_push(kv, e);
        kv->pinned -= x->units;
    }
}

/* Inserts @p hash pinned; returns its entry or NONE on allocation failure. */
static uint32_t kv_insert_pinned(struct kv_cache *kv, uint64_t hash, uint32_t units)
{
    if ((uint64_t)(kv->count + 1) * 2 > (uint64_t)kv->mask + 1 || !kv->table) {
        if (kv_grow_table(kv) < 0)
            return NONE;
    }
    uint32_t e = kv->free_head;
    if (e != NONE) {
        kv->free_head = kv->entries[e].next;
    } else {
        if (kv->nentries == kv->cap) {
            uint32_t cap = kv->cap ? kv->cap * 2 : 64;
            struct kv_entry *n = realloc(kv->entries, cap * sizeof(*n));
            if (!n)
                return NONE;
            kv->entries = n;
            kv->cap = cap;
        }
        e = kv->nentries++;
    }
    kv->entries[e] = (struct kv_entry){.hash = hash, .units = units, .refs = 1, .prev = NONE, .next = NONE};
    table_put(kv->table, kv->mask, hash, e);
    kv->count++;
    kv->units += units;
    kv->pinned += units;
    return e;
}

/* Drops the least recently used unpinned entry; returns -1 when there is none. */
static int kv_evict_one(struct kv_cache *kv)
{
    uint32_t e = kv->lru_head;
    if (e == NONE)
        return -1;
    lru_unlink(kv, e);
    kv_table_remove(kv, kv->entries[e].hash);
    kv->units -= kv->entries[e].units;
    kv->count--;
    kv->entries[e].next = kv->free_head;
    kv->free_head = e;
    return 0;
}

/* kv_evict_one, told to the KV events' listener. */
static int evict_one(struct atc_sim *sim)
{
    uint32_t e = sim->kv.lru_head;
    uint64_t hash = e != NONE ? sim->kv.entries[e].hash : 0;
    bool spent = e != NONE && sim->kv.entries[e].spent;
    if (kv_evict_one(&sim->kv) < 0)
        return -1;
    if (sim->on_kv != NULL && !spent)
        sim->on_kv(sim->kv_ctx, ATC_SIM_KV_REMOVED, &hash, 1);
    return 0;
}

void atc_sim_set_kv_listener(struct atc_sim *sim, atc_sim_on_kv on_kv, void *ctx)
{
    sim->on_kv = on_kv;
    sim->kv_ctx = ctx;
}

/* ---- sequences ---- */

static struct seq *seq_lookup(const struct atc_sim *sim, uint64_t id)
{
    uint32_t slot = (uint32_t)id, gen = (uint32_t)(id >> 32);
    if (slot >= sim->nslots || sim->gens[slot] != gen)
        return NULL;
    return sim->slots[slot];
}

/* Gives back what a running @p s holds in the KV cache; its prefix stays cached, unpinned. */
static void seq_release_kv(struct atc_sim *sim, struct seq *s)
{
    /* What it held past its prefix goes first onto the LRU tail, then its prefix deepest block first, so a
     * shared head outlives its private tails, as vLLM frees a request's blocks in reverse order to the end
     * of its free queue (vllm/v1/core/single_type_kv_cache_manager.py free, block_pool.py free_blocks):
     * its output is evicted before its prompt, but after everything freed before it. */
    sim->held -= s->held;
    if (s->held > 0) {
        uint64_t n = ++sim->spent;
        uint32_t e = kv_insert_pinned(&sim->kv, atc_sim_rand(&n), s->held);
        if (e != NONE) {
            sim->kv.entries[e].spent = true;
            kv_unpin(&sim->kv, e);
        }
    }
    for (size_t i = s->nblocks; i-- > 0;)
        kv_unpin(&sim->kv, s->pins[i]);
    s->held = 0;
    s->running = false;
}

/* Unpins and frees @p s, which must be on neither list. */
static void seq_free(struct atc_sim *sim, struct seq *s)
{
    if (s->running)
        seq_release_kv(sim, s);
    uint32_t slot = (uint32_t)s->id;
    sim->slots[slot] = NULL;
    sim->gens[slot]++;
    if (sim->gens[slot] == 0)
        sim->gens[slot] = 1;
    sim->free_slots[sim->nfree++] = slot;
    free(s);
}

static int slot_alloc(struct atc_sim *sim, uint32_t *slot)
{
    if (sim->nfree == 0) {
        uint32_t n = sim->nslots ? sim->nslots * 2 : 64;
        struct seq **slots = realloc(sim->slots, n * sizeof(*slots));
        if (!slots)
            return -1;
        sim->slots = slots;
        uint32_t *gens = realloc(sim->gens, n * sizeof(*gens));
        if (!gens)
            return -1;
        sim->gens = gens;
        uint32_t *fr = realloc(sim->free_slots, n * sizeof(*fr));
        if (!fr)
            return -1;
        sim->free_slots = fr;
        for (uint32_t i = n; i-- > sim->nslots;) {
            sim->slots[i] = NULL;
            sim->gens[i] = 1;
            sim->free_slots[sim->nfree++] = i;
        }
        sim->nslots = n;
    }
    *slot = sim->free_slots[--sim->nfree];
    return 0;
}

/* ---- the engine ---- */

static uint64_t kv_free_units(const struct atc_sim *sim)
{
    uint64_t used = sim->kv.units + sim->held;
    return used >= sim->p.kv_blocks ? 0 : sim->p.kv_blocks - used;
}

/* KV blocks @p s needs outside its prefix to compute its next token: its tail and its output so far. */
static uint32_t kv_need(const struct seq *s)
{
    return div_up((uint64_t)s->tail_tokens + s->emitted + 1, ATC_SIM_KV_BLOCK_TOKENS);
}

/* Looks up and pins @p s's prefix, takes its KV room and moves it to the running list.
 * Returns -1 (and changes nothing) when the cache has no room for it yet, or on allocation failure. */
static int admit(struct atc_sim *sim, struct seq *s)
{
    struct kv_cache *kv = &sim->kv;
    uint32_t units = div_up(s->block_tokens, ATC_SIM_KV_BLOCK_TOKENS);
    size_t hits = 0;
    while (hits < s->nblocks && kv_find(kv, s->hashes[hits]) != NONE)
        hits++;
    uint32_t reserve = kv_need(s);
    uint64_t need = (uint64_t)(s->nblocks - hits) * units + reserve;
    size_t done = 0;

    /* Pin the hits first so that eviction cannot take them, then check before evicting anything that
     * the unpinned rest would make enough room: a head that must keep waiting evicts nothing. */
    for (; done < hits; done++) {
        s->pins[done] = kv_find(kv, s->hashes[done]);
        kv_pin(kv, s->pins[done]);
    }
    if (kv_free_units(sim) + (kv->units - kv->pinned) < need && sim->running.n > 0)
        goto undo;
    while (kv_free_units(sim) < need && evict_one(sim) == 0)
        ;
    for (; done < s->nblocks; done++) {
        /* A hash repeated within the prompt is found here and pinned twice, which is fine. */
        uint32_t e = kv_find(kv, s->hashes[done]);
        if (e != NONE)
            kv_pin(kv, e);
        else if ((e = kv_insert_pinned(kv, s->hashes[done], units)) == NONE)
            goto undo;
        else if (sim->on_kv != NULL)
            sim->on_kv(sim->kv_ctx, ATC_SIM_KV_STORED, &s->hashes[done], 1);
        s->pins[done] = e;
    }

    uint64_t hit_tokens = s->kv_arrives ? s->prompt_tokens : (uint64_t)hits * s->block_tokens;
    if (hit_tokens >= s->prompt_tokens && s->emitted == 0)
        hit_tokens = s->prompt_tokens > 0 ? s->prompt_tokens - 1 : 0; /* the last token is recomputed */
    if (hit_tokens > s->prompt_tokens)
        hit_tokens = s->prompt_tokens;
    if (!s->kv_arrives) {
        sim->prefix_queries += s->prompt_tokens;
        sim->prefix_hits += hit_tokens;
        sim->prefix_blocks += s->nblocks;
        sim->prefix_block_hits += hits;
    }
    /* A preempted sequence recomputes the tokens it had produced, as vLLM's recompute preemption. */
    uint64_t left = s->prompt_tokens - hit_tokens + s->emitted;
    s->prefill_left = left == 0 ? 1 : left > UINT32_MAX ? UINT32_MAX : (uint32_t)left;
    s->held = reserve;
    sim->held += reserve;
    s->running = true;
    list_unlink(&sim->waiting, s);
    list_push(&sim->running, s);
    return 0;

undo:
    /* Unpin in reverse, as seq_free does; fresh entries then stay cached, which is harmless. */
    while (done-- > 0)
        kv_unpin(kv, s->pins[done]);
    return -1;
}

static double decode_step_us(const struct atc_sim *sim, unsigned batch)
{
    double f = sim->p.decode_batch_factor, mult;
    unsigned sat = sim->p.decode_batch_sat;
    if (sat <= 1)
        mult = f;
    else
        mult = 1.0 + (f - 1.0) * (double)((batch < sat ? batch : sat) - 1) / (double)(sat - 1);
    return sim->p.decode_ms * 1000.0 * mult;
}

/* Gives @p s up to *budget prefill tokens of this iteration. */
static void schedule_prefill(struct seq *s, uint64_t *budget, uint64_t *prefill, unsigned *emitters)
{
    uint32_t chunk = s->prefill_left < *budget ? s->prefill_left : (uint32_t)*budget;
    s->prefill_left -= chunk;
    *budget -= chunk;
    *prefill += chunk;
    if (s->prefill_left == 0) {
        s->emits = true;
        (*emitters)++;
    }
}

/* Sends the newest running sequence back to the head of the queue, freeing its KV blocks. */
static void preempt(struct atc_sim *sim, struct seq *s)
{
    seq_release_kv(sim, s);
    list_unlink(&sim->running, s);
    list_push_front(&sim->waiting, s);
    sim->preemptions++;
}

/* Every decoding sequence writes one more token's KV in this iteration. When the cache cannot hold
 * that even after evicting unpinned prefixes, the newest sequences are preempted, as vLLM does; the
 * last one left runs even if it overflows (it is then bigger than the whole cache). */
static void grow_kv(struct atc_sim *sim)
{
    for (;;) {
        uint64_t grow = 0;
        for (struct seq *s = sim->running.head; s; s = s->next)
            if (s->prefill_left == 0 && kv_need(s) > s->held)
                grow += kv_need(s) - s->held;
        if (grow == 0)
            return;
        while (kv_free_units(sim) < grow && evict_one(sim) == 0)
            ;
        if (kv_free_units(sim) >= grow || sim->running.n <= 1)
            break;
        preempt(sim, sim->running.tail);
    }
    for (struct seq *s = sim->running.head; s; s = s->next) {
        uint32_t need = kv_need(s);
        if (s->prefill_left == 0 && need > s->held) {
            sim->held += need - s->held;
            s->held = need;
        }
    }
}

/* Plans the iteration starting at @p t; leaves the engine idle when there is nothing to run. */
static void iteration_start(struct atc_sim *sim, uint64_t t)
{
    uint64_t budget = sim->p.max_batched_tokens, prefill = 0;
    unsigned emitters = 0;

    sim->clock = t;
    sim->busy = false;
    grow_kv(sim);
    for (struct seq *s = sim->running.head; s; s = s->next) {
        s->emits = s->prefill_left == 0;
        if (s->emits) {
            emitters++;
            budget = budget > 0 ? budget - 1 : 0;
        }
    }
    for (struct seq *s = sim->running.head; s && budget > 0; s = s->next)
        if (s->prefill_left > 0)
            schedule_prefill(s, &budget, &prefill, &emitters);
    while (sim->waiting.head && sim->waiting.head->arrival_us <= t && sim->running.n < sim->p.max_seqs &&
           budget > 0) {
        struct seq *s = sim->waiting.head;
        if (admit(sim, s) < 0)
            break; /* FIFO: nobody overtakes the head, as in vLLM */
        s->emits = false;
        schedule_prefill(s, &budget, &prefill, &emitters);
    }
    if (emitters == 0 && prefill == 0)
        return;
    double us = (double)prefill * 1e6 / sim->p.prefill_tps + (emitters ? decode_step_us(sim, emitters) : 0);
    uint64_t dur = (uint64_t)llround(us);
    sim->iter_end = t + (dur > 0 ? dur : 1);
    sim->busy = true;
    sim->iterations++;
}

/* Reports the tokens of the iteration that just ended, then frees the sequences that are done. */
static void iteration_end(struct atc_sim *sim)
{
    sim->busy = false;
    sim->in_callbacks = true;
    for (struct seq *s = sim->running.head; s; s = s->next) {
        if (!s->emits || s->dead)
            continue;
        s->emits = false;
        struct atc_sim_token tok = {
            .id = s->id, .user = s->user, .at_us = sim->iter_end, .index = s->emitted};
        s->emitted++;
        sim->tokens++;
        tok.last = s->emitted >= s->output_tokens;
        s->dead = tok.last; /* before the call, so that cancelling it from there is a no-op */
        sim->on_token(sim->ctx, &tok);
    }
    sim->in_callbacks = false;
    for (struct seq *s = sim->running.head, *next; s; s = next) {
        next = s->next;
        if (s->dead) {
            list_unlink(&sim->running, s);
            seq_free(sim, s);
        }
    }
}

void atc_sim_advance(struct atc_sim *sim, uint64_t now_us)
{
    if (sim->in_callbacks)
        return;
    for (;;) {
        if (sim->busy) {
            if (sim->iter_end > now_us)
                return;
            uint64_t t = sim->iter_end;
            iteration_end(sim);
            iteration_start(sim, t);
        } else if (sim->waiting.head && sim->waiting.head->arrival_us <= now_us) {
            uint64_t t = sim->waiting.head->arrival_us;
            iteration_start(sim, t > sim->clock ? t : sim->clock);
            if (!sim->busy)
                return; /* cannot happen: an idle engine admits its head (see admit) */
        } else {
            return;
        }
    }
}

uint64_t atc_sim_next_event_us(const struct atc_sim *sim)
{
    if (sim->busy)
        return sim->iter_end;
    if (sim->waiting.head) {
        uint64_t t = sim->waiting.head->arrival_us;
        return t > sim->clock ? t : sim->clock;
    }
    return UINT64_MAX;
}

uint64_t atc_sim_submit(struct atc_sim *sim, uint64_t now_us, const struct atc_sim_request *req, void *user,
                        uint32_t *output_tokens)
{
    size_t n = req->nblocks;
    uint32_t slot;
    struct seq *s = malloc(sizeof(*s) + n * (sizeof(uint64_t) + sizeof(uint32_t)));
    if (!s || slot_alloc(sim, &slot) < 0) {
        free(s);
        return 0;
    }
    uint32_t out;
    if (req->max_tokens >= 0) {
        out = req->max_tokens > UINT32_MAX ? UINT32_MAX : (uint32_t)req->max_tokens;
    } else {
        uint32_t span = sim->p.output_max - sim->p.output_min + 1;
        out = sim->p.output_min + (uint32_t)(atc_sim_rand(&sim->rng) % span);
    }
    if (out == 0)
        out = 1; /* vLLM rejects max_tokens 0; the model always produces something */
    uint32_t bt = req->block_tokens ? req->block_tokens : ATC_SIM_KV_BLOCK_TOKENS;
    uint64_t covered = (uint64_t)n * bt;

    *s = (struct seq){
        .id = (uint64_t)sim->gens[slot] << 32 | slot,
        .user = user,
        .arrival_us = now_us,
        .prompt_tokens = req->prompt_tokens,
        .output_tokens = out,
        .block_tokens = bt,
        .kv_arrives = req->kv_arrives,
        .tail_tokens = covered < req->prompt_tokens ? (uint32_t)(req->prompt_tokens - covered) : 0,
        .nblocks = n,
    };
    s->hashes = (uint64_t *)(s + 1);
    s->pins = (uint32_t *)(s->hashes + n);
    if (n)
        memcpy(s->hashes, req->blocks, n * sizeof(uint64_t));
    sim->slots[slot] = s;
    list_push(&sim->waiting, s);
    if (output_tokens)
        *output_tokens = out;
    return s->id;
}

void atc_sim_cancel(struct atc_sim *sim, uint64_t id)
{
    struct seq *s = seq_lookup(sim, id);
    if (!s || s->dead)
        return;
    if (s->running && sim->in_callbacks) {
        s->dead = true; /* iteration_end is walking the running list: it frees s after the calls */
        return;
    }
    list_unlink(s->running ? &sim->running : &sim->waiting, s);
    seq_free(sim, s);
}

struct atc_sim *atc_sim_create(const struct atc_sim_params *p, atc_sim_on_token on_token, void *ctx)
{
    struct atc_sim *sim = calloc(1, sizeof(*sim));
    if (!sim)
        return NULL;
    sim->p = *p;
    sim->p.model = NULL;
    sim->on_token = on_token;
    sim->ctx = ctx;
    sim->rng = p->seed;
    sim->kv.free_head = sim->kv.lru_head = sim->kv.lru_tail = NONE;
    struct atc_sim_params *q = &sim->p;
    if (q->max_seqs == 0)
        q->max_seqs = DEFAULT_MAX_SEQS;
    if (!(q->prefill_tps > 0))
        q->prefill_tps = DEFAULT_PREFILL_TPS;
    if (!(q->decode_ms >= 0))
        q->decode_ms = DEFAULT_DECODE_MS; /* 0 is allowed: tokens as fast as the loop turns */
    if (q->kv_blocks == 0)
        q->kv_blocks = ATC_SIM_DEFAULT_KV_BLOCKS;
    if (!(q->decode_batch_factor > 0))
        q->decode_batch_factor = DEFAULT_BATCH_FACTOR;
    if (q->decode_batch_sat == 0)
        q->decode_batch_sat = DEFAULT_BATCH_SAT;
    if (q->max_batched_tokens == 0)
        q->max_batched_tokens = ATC_SIM_DEFAULT_BATCHED_TOKENS;
    if (q->output_min == 0)
        q->output_min = DEFAULT_OUTPUT_MIN;
    if (q->output_max == 0)
        q->output_max = q->output_min > DEFAULT_OUTPUT_MAX ? q->output_min : DEFAULT_OUTPUT_MAX;
    if (q->output_max < q->output_min)
        q->output_max = q->output_min;
    return sim;
}

void atc_sim_destroy(struct atc_sim *sim)
{
    if (!sim)
        return;
    for (uint32_t i = 0; i < sim->nslots; i++)
        free(sim->slots[i]);
    free(sim->slots);
    free(sim->gens);
    free(sim->free_slots);
    free(sim->kv.entries);
    free(sim->kv.table);
    free(sim);
}

void atc_sim_stats(const struct atc_sim *sim, struct atc_sim_stats *st)
{
    /* As vLLM's: the blocks held by running requests (cached blocks nobody uses count as free). */
    uint64_t used = sim->kv.pinned + sim->held;
    double usage = (double)used / (double)sim->p.kv_blocks;
    *st = (struct atc_sim_stats){
        .running = sim->running.n,
        .waiting = sim->waiting.n,
        .kv_usage = usage > 1.0 ? 1.0 : usage,
        .kv_cached = sim->kv.units,
        .prefix_queries = sim->prefix_queries,
        .prefix_hits = sim->prefix_hits,
        .prefix_blocks = sim->prefix_blocks,
        .prefix_block_hits = sim->prefix_block_hits,
        .iterations = sim->iterations,
        .tokens = sim->tokens,
        .preemptions = sim->preemptions,
    };
}

size_t atc_sim_prefix_cached(const struct atc_sim *sim, const uint64_t *blocks, size_t nblocks)
{
    size_t n = 0;
    while (n < nblocks && kv_find(&sim->kv, blocks[n]) != NONE)
        n++;
    return n;
}

double atc_sim_prefill_ms(const struct atc_sim *sim, uint64_t tokens)
{
    return (double)tokens * 1000.0 / sim->p.prefill_tps;
}

double atc_sim_backlog_ms(const struct atc_sim *sim, uint64_t now_us)
{
    uint64_t tokens = 0;
    for (const struct seq *s = sim->running.head; s != NULL; s = s->next)
        tokens += s->prefill_left;
    for (const struct seq *s = sim->waiting.head; s != NULL; s = s->next) {
        uint64_t cached = (uint64_t)atc_sim_prefix_cached(sim, s->hashes, s->nblocks) * s->block_tokens;
        uint64_t prompt = s->kv_arrives ? 1 : cached < s->prompt_tokens ? s->prompt_tokens - cached : 1;
        tokens += prompt + s->emitted; /* a preempted sequence computes its tokens again, as admit() does */
    }
    /* a chunk is taken off prefill_left when its iteration starts: the iteration in progress is the rest */
    double rest = sim->busy && sim->iter_end > now_us ? (double)(sim->iter_end - now_us) / 1000.0 : 0;
    return rest + atc_sim_prefill_ms(sim, tokens);
}

void atc_sim_restart(struct atc_sim *sim)
{
    struct kv_cache *kv = &sim->kv;
    while (kv_evict_one(kv) == 0) /* silently: AllBlocksCleared below says it once */
        ;
    if (sim->on_kv == NULL)
        return;
    sim->on_kv(sim->kv_ctx, ATC_SIM_KV_CLEARED, NULL, 0);
    /* What the running sequences pin is still there (they run on); the new engine's first batch tells it. */
    for (uint32_t e = 0; e < kv->nentries; e++)
        if (kv->entries[e].refs > 0)
            sim->on_kv(sim->kv_ctx, ATC_SIM_KV_STORED, &kv->entries[e].hash, 1);
}
