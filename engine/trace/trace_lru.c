/* The pooled-LRU bound on prefix cache hits (trace_lru.h): a hash table of cached blocks over a doubly
 * linked list in recency order, both in arrays indexed by node number. */

#include "trace/trace_lru.h"

#include <stdbool.h>
#include <stdlib.h>

#include "sim/sim.h"
#include "trace/trace.h"

#define NONE UINT32_MAX

struct node {
    uint64_t block;
    uint32_t prev, next; /* towards the most / least recently used */
    uint32_t cost;       /* tokens */
};

struct lru {
    struct node *nodes;
    uint32_t nnodes, cap_nodes, free_list; /* free nodes chained through next */
    uint32_t head, tail;                   /* most and least recently used */
    uint32_t *slots;                       /* open addressing: node numbers, NONE when empty */
    size_t mask, used;
    uint64_t tokens, capacity;
};

static size_t slot_of(const struct lru *c, uint64_t block)
{
    return (size_t)((block * 0x9E3779B97F4A7C15ull) >> 17) & c->mask;
}

static size_t find_slot(const struct lru *c, uint64_t block)
{
    size_t i = slot_of(c, block);
    while (c->slots[i] != NONE && c->nodes[c->slots[i]].block != block)
        i = (i + 1) & c->mask;
    return i;
}

static int grow_slots(struct lru *c)
{
    size_t n = c->mask ? (c->mask + 1) * 2 : 1024;
    uint32_t *old = c->slots;
    size_t old_n = c->mask ? c->mask + 1 : 0;
    if ((c->slots = malloc(n * sizeof(*c->slots))) == NULL) {
        c->slots = old;
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        c->slots[i] = NONE;
    c->mask = n - 1;
    for (size_t i = 0; i < old_n; i++)
        if (old[i] != NONE)
            c->slots[find_slot(c, c->nodes[old[i]].block)] = old[i];
    free(old);
    return 0;
}

/* Removes the entry at slot i, shifting back the entries of its probe run (no tombstones). */
static void remove_slot(struct lru *c, size_t i)
{
    c->slots[i] = NONE;
    c->used--;
    for (size_t j = (i + 1) & c->mask; c->slots[j] != NONE; j = (j + 1) & c->mask) {
        uint32_t n = c->slots[j];
        size_t home = slot_of(c, c->nodes[n].block);
        /* n may move to i if i lies in its probe path [home, j) (cyclically) */
        if ((j > i && (home <= i || home > j)) || (j < i && home <= i && home > j)) {
            c->slots[i] = n;
            c->slots[j] = NONE;
            i = j;
        }
    }
}

static void unlink_node(struct lru *c, uint32_t n)
{
    struct node *x = &c->nodes[n];
    if (x->prev != NONE)
        c->nodes[x->prev].next = x->next;
    else
        c->head = x->next;
    if (x->next != NONE)
        c->nodes[x->next].prev = x->prev;
    else
        c->tail = x->prev;
}

static void push_front(struct lru *c, uint32_t n)
{
    struct node *x = &c->nodes[n];
    x->prev = NONE;
    x->next = c->head;
    if (c->head != NONE)
        c->nodes[c->head].prev = n;
    c->head = n;
    if (c->tail == NONE)
        c->tail = n;
}

static void evict_one(struct lru *c)
{
    uint32_t n = c->tail;
    unlink_node(c, n);
    remove_slot(c, find_slot(c, c->nodes[n].block));
    c->tokens -= c->nodes[n].cost;
    c->nodes[n].next = c->free_list;
    c->free_list = n;
}

static int insert(struct lru *c, uint64_t block, uint32_t cost)
{
    if (cost > c->capacity)
        return 0; /* never fits */
    while (c->tokens + cost > c->capacity)
        evict_one(c);
    if ((c->used + 1) * 2 > c->mask + 1 && grow_slots(c) < 0)
        return -1;
    uint32_t n;
    if (c->free_list != NONE) {
        n = c->free_list;
        c->free_list = c->nodes[n].next;
    } else {
        if (c->nnodes == c->cap_nodes) {
            uint32_t cap = c->cap_nodes ? c->cap_nodes * 2 : 1024;
            struct node *nodes = realloc(c->nodes, (size_t)cap * sizeof(*nodes));
            if (nodes == NULL)
                return -1;
            c->nodes = nodes;
            c->cap_nodes = cap;
        }
        n = c->nnodes++;
    }
    c->nodes[n].block = block;
    c->nodes[n].cost = cost;
    push_front(c, n);
    c->slots[find_slot(c, block)] = n;
    c->used++;
    c->tokens += cost;
    return 0;
}

/* Feeds the first n requests of t to a pooled LRU cache of capacity_tokens: blocks looked up and hit,
 * and each request's leading cached blocks in hit_blocks[i] when not NULL. Returns 0, or -1 when memory
 * runs out. */
static int pooled_lru(const struct atc_trace *t, size_t n, uint64_t capacity_tokens, uint64_t *blocks_out,
                      uint64_t *hits_out, uint32_t *hit_blocks)
{
    struct lru c = {.free_list = NONE, .head = NONE, .tail = NONE, .capacity = capacity_tokens};
    uint64_t blocks = 0, hits = 0;
    int rc = grow_slots(&c);
    for (size_t i = 0; i < n && rc == 0; i++) {
        const struct atc_trace_record *r = &t->records[i];
        uint32_t bt = r->block_tokens ? r->block_tokens : ATC_SIM_KV_BLOCK_TOKENS;
        uint32_t cost = (bt + ATC_SIM_KV_BLOCK_TOKENS - 1) / ATC_SIM_KV_BLOCK_TOKENS * ATC_SIM_KV_BLOCK_TOKENS;
        bool leading = true;
        uint32_t mine = 0;
        for (size_t k = 0; k < r->nblocks && rc == 0; k++) {
            blocks++;
            size_t s = find_slot(&c, r->blocks[k]);
            if (c.slots[s] != NONE) {
                uint32_t node = c.slots[s];
                hits += leading;
                mine += leading;
                unlink_node(&c, node);
                push_front(&c, node);
            } else {
                leading = false;
                rc = insert(&c, r->blocks[k], cost);
            }
        }
        if (hit_blocks != NULL)
            hit_blocks[i] = mine;
    }
    free(c.nodes);
    free(c.slots);
    *blocks_out = blocks;
    *hits_out = hits;
    return rc;
}

double atc_trace_pooled_lru_hit_rate(const struct atc_trace *t, size_t limit, uint64_t capacity_tokens)
{
    size_t n = limit > 0 && limit < t->n ? limit : t->n;
    uint64_t blocks, hits;
    if (pooled_lru(t, n, capacity_tokens, &blocks, &hits, NULL) < 0)
        return -1;
    return blocks ? (double)hits / (double)blocks : 0;
}

double atc_trace_pooled_lru_hits(const struct atc_trace *t, size_t n, uint64_t capacity_tokens,
                                 uint32_t *hit_blocks)
{
    uint64_t blocks, hits;
    if (pooled_lru(t, n, capacity_tokens, &blocks, &hits, hit_blocks) < 0)
        return -1;
    return blocks ? (double)hits / (double)blocks : 0;
}
