#ifndef ATC_TRACE_LRU_H
#define ATC_TRACE_LRU_H

/* The best a fleet's prefix caches could do on a trace: one LRU cache the size of all of them together
 * (a "pooled" cache, as if every request could use every server's KV), fed the trace's prefix blocks in
 * order. A request's leading blocks found there are hits, as in the simulated server (sim.h): the
 * first miss ends them, and every block it brings is then cached, least recently used evicted first.
 * No routing policy can beat it, so `atc trace stats` and the ideal fleet of `atc replay` report it beside
 * the hit rate a policy reached. */

#include <stddef.h>
#include <stdint.h>

struct atc_trace;

/** The share of the prefix blocks of @p t's first @p limit requests (0: all) found in a pooled LRU cache of
 * @p capacity_tokens tokens (each block costs its record's block_tokens, rounded up to the simulated
 * server's 16-token KV blocks); 0 when they have no prefix blocks, -1 when memory runs out. */
double atc_trace_pooled_lru_hit_rate(const struct atc_trace *t, size_t limit, uint64_t capacity_tokens);

/** The same cache, fed the first @p n requests of @p t (n <= t->n): each request's leading blocks found
 * there in @p hit_blocks[i] (the ideal fleet's hits, replay_ideal.h). Returns the share of prefix blocks
 * found (0 when there are none), or -1 when memory runs out. */
double atc_trace_pooled_lru_hits(const struct atc_trace *t, size_t n, uint64_t capacity_tokens,
                                 uint32_t *hit_blocks);

#endif
