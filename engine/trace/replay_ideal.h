#ifndef ATC_REPLAY_IDEAL_H
#define ATC_REPLAY_IDEAL_H

/* The ideal fleet on a trace, the yardstick every replayed policy is measured against:
 *
 *  - every server's KV cache pooled into one LRU cache of the fleet's total KV tokens (trace_lru.h), so
 *    no request misses a prefix any server could have kept;
 *  - the servers as parallel prefill lanes, each at its own prefill rate;
 *  - one central FIFO queue: in arrival order, every request starts its prefill on the first lane to come
 *    free (the lowest-numbered of those free at once).
 *
 * A request's TTFT is its wait in that queue, plus the prefill of its prompt tokens not in the pooled
 * cache (at least one: the last prompt token is always computed, as in the simulated server), plus one
 * decode step at batch 1 (decode_ms: the simulated server's first token comes at the end of the
 * iteration that finishes its prefill). A lane is busy for the prefill only.
 *
 * It ignores decode interference (a real server decodes other requests in the same iterations, which
 * slows prefill) and the servers' batch and KV room limits, so it is a target, not a strict bound: a
 * policy can come near it, and in rare cells beat it by a little. */

#include <stddef.h>
#include <stdint.h>

struct atc_config;
struct atc_trace;

/* One server as the ideal fleet sees it. */
struct atc_replay_lane {
    double prefill_tps;    /* prompt tokens a second */
    double first_token_ms; /* fixed time from the end of the prefill to the first token */
};

struct atc_replay_ideal {
    size_t requests;
    double ttft_p50_ms, ttft_p90_ms, ttft_p99_ms;
    double cache_hit_rate; /* prefix blocks found in the pooled cache / prefix blocks requested */
    double *ttft_ms;       /* per request, owned */
};

/** The ideal fleet of @p nlanes lanes and one pooled cache of @p kv_tokens over the first @p limit
 * requests of @p t (0: all). Fills @p out (free with atc_replay_ideal_dispose). Returns 0, or -1 when
 * memory runs out (@p out then holds nothing). */
int atc_replay_ideal_run(const struct atc_trace *t, size_t limit, const struct atc_replay_lane *lanes,
                         size_t nlanes, uint64_t kv_tokens, struct atc_replay_ideal *out);

/** The same for the fleet `atc replay` simulates from @p cfg (replay.h: every simulate: server with its
 * knobs, every configured endpoint with the default server model). Returns 0, or -1 when memory runs
 * out or the fleet is empty. */
int atc_replay_ideal_of_fleet(const struct atc_config *cfg, const struct atc_trace *t, size_t limit,
                              struct atc_replay_ideal *out);

void atc_replay_ideal_dispose(struct atc_replay_ideal *ideal);

#endif
