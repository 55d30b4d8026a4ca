#ifndef ATC_TRACE_LRU_H
#define ATC_TRACE_LRU_H

/* The best a fleet's prefix caches could do on a trace: one LRU cache the size of all of them together
 * (a "pooled" cache, as if every request could use every server's KV), fed the trace's prefix blocks in
 * order. A request's leading blocks found there are hits, as in the simulated server (sim.h): the
 * first miss ends them, and every block it brings is then cached, least recently used evicted first.
 * No routing policy can beat it, so `atc trace stats` and the replay grid report it beside the hit rate
 * a policy reached. */

#include <stddef.h>
#include <stdint.h>

struct atc_trace;

/** The share of the prefix blocks of @p t's first @p limit requests (0: all) found in a pooled LRU cache of
 * @p capacity_tokens tokens (each block costs its record's block_tokens, rounded up to the simulated
 * server's 16-token KV blocks); 0 when they have no prefix blocks, -1 when memory runs out. */
double atc_trace_pooled_lru_hit_rate(const struct atc_trace *t, size_t limit, uint64_t capacity_tokens);

/** The same cache's floor on time to first token: for each of the first @p limit requests (0: all) the
 * prefill of its prompt tokens not in the pooled cache at @p prefill_tps, in chunks of @p chunk_tokens
 * each costing one decode step of @p step_ms (as the simulated server runs them), with no waiting at
 * all; returns its p90 in ms, or -1 when memory runs out. Routing can only come near it: the load a
 * policy cannot avoid (queueing) and hits it misses are what the distance to it measures. */
double atc_trace_pooled_lru_ttft_p90_ms(const struct atc_trace *t, size_t limit, uint64_t capacity_tokens,
                                        double prefill_tps, uint32_t chunk_tokens, double step_ms);

#endif
