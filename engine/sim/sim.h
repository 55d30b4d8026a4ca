#ifndef ATC_SIM_H
#define ATC_SIM_H

/* The simulated inference server's model: continuous batching, prefill/decode timing and a prefix KV
 * cache, with no I/O. Time is passed in by the caller (microseconds), so the same model runs behind
 * real sockets (sim_server.c, wall-clock timers) and in virtual-time replay.
 *
 * The model, aimed at one Llama-3-8B-class model on one H100 under vLLM:
 *
 * - The engine runs in iterations, like vLLM's scheduler steps. An iteration starts when the previous
 *   one ends (or when a request arrives at an idle engine). It first schedules one decode token for
 *   every running sequence whose prompt is done, then continues prompts being prefilled, then admits
 *   waiting sequences (FIFO) while fewer than max_seqs run, the iteration's token budget
 *   (max_batched_tokens, chunked prefill) is not spent and the KV cache has room.
 * - An iteration lasts prefill_tokens / prefill_tps + decode_step(B), where B is the number of sequences
 *   that emit a token at its end (decoders plus those whose prefill completes in it) and
 *   decode_step(B) = decode_ms * (1 + (decode_batch_factor - 1) * (min(B, decode_batch_sat) - 1) /
 *   (decode_batch_sat - 1)): decode_ms at batch 1, decode_batch_factor x decode_ms at batch >= sat.
 *   So a sequence's first token comes at the end of the iteration that finishes its prefill, and each
 *   later token one iteration later.
 * - KV cache: kv_blocks blocks of ATC_SIM_KV_BLOCK_TOKENS (16) tokens, vLLM's block size. A request
 *   brings chained prefix block hashes, each covering block_tokens tokens (64 for atc's own feature
 *   scan, 512 for Mooncake traces); a cached hash costs ceil(block_tokens / 16) blocks. On admission
 *   the request's leading hashes found in the cache are hits (their prefill is skipped; the last prompt
 *   token is always computed, as in vLLM), the rest are inserted. A running sequence pins its hashes
 *   and holds blocks for its tail (prompt tokens past the last full hash block) and for the tokens it
 *   has produced, one more block every 16 tokens. Admission needs room for the uncached blocks and the
 *   tail; when decoding runs out of room, the newest running sequences are preempted, as in vLLM: back
 *   to the head of the queue, their blocks freed, to be prefilled again (prompt and tokens produced so
 *   far) when readmitted. Finished sequences unpin their hashes, which stay cached and are evicted
 *   least recently used first (deepest block of a prompt first) when room is needed; the blocks they
 *   held for tail and output join the LRU just before their prompt (never hit), as vLLM frees a request's
 *   blocks to the end of its free queue, last block first. A sequence too
 *   large for the whole cache runs only when nothing else does.
 * - Prefix cache queries and hits are counted in prompt tokens, like vllm:prefix_cache_queries/hits.
 * - Output length is the request's own (max_tokens) or a draw, uniform in [output_min, output_max],
 *   from the model's seeded PRNG: the same seed and the same submissions give the same timings.
 *
 * Defaults, and why (the calibration for an 8B model on one H100):
 *   prefill_tps 15000      the middle of the 10-20k prompt tokens/s measured for such a setup
 *   decode_ms 12, x2.2     12 ms per token alone, 26.4 ms at a batch of 64 or more (measured 25-30)
 *   decode_batch_sat 64    where the decode step stops growing (measured up to 64; past it the step
 *                          stays at 2.2x)
 *   max_seqs 1024          vLLM's max_num_seqs on a large GPU (ATC_SIM_DEFAULT_MAX_SEQS): it batches
 *                          rather than queue, and the KV cache is the limit
 *   kv_blocks 25000        x 16 tokens = 400k tokens: about 60 GiB left after the weights, at 128 KiB
 *                          of KV per token for Llama-3-8B
 *   max_batched_tokens 8192  vLLM V1's default for its OpenAI server on large GPUs
 *   output 16..512         when a request gives no max_tokens: a short-to-medium chat answer */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/sim_params.h"


struct atc_sim;

/* One request handed to the model. Everything is borrowed for the duration of atc_sim_submit. */
struct atc_sim_request {
    uint32_t prompt_tokens; /* prompt length (an estimate is fine) */
    int64_t max_tokens;     /* output length; < 0 = draw one (output_min..output_max) */
    const uint64_t *blocks; /* chained prefix block hashes (may be NULL when nblocks == 0) */
    size_t nblocks;         /* full blocks only */
    uint32_t block_tokens;  /* tokens covered by one hash (0 = ATC_SIM_KV_BLOCK_TOKENS) */
    bool kv_arrives; /* a disaggregated decode server's: the prompt's KV comes from a prefill server. It
                      * takes KV room as a computed prompt would, but no prefill (one step for its first
                      * token) and counts in no prefix-cache figure */
};

/* One output token, as reported to the on_token callback. */
struct atc_sim_token {
    uint64_t id;    /* the sequence, as returned by atc_sim_submit */
    void *user;     /* as given to atc_sim_submit */
    uint64_t at_us; /* end of the iteration that produced it */
    uint32_t index; /* 0 = first token */
    bool last;      /* the sequence is finished and forgotten after this call */
};

/** Called by atc_sim_advance for every token produced. It may call atc_sim_submit and atc_sim_cancel
 * (also on the sequence being reported), never atc_sim_advance or atc_sim_destroy. */
typedef void (*atc_sim_on_token)(void *ctx, const struct atc_sim_token *tok);

/* Model state, for /metrics and the replay's reports. */
struct atc_sim_stats {
    unsigned running;        /* sequences admitted (prefilling or decoding) */
    unsigned waiting;        /* sequences queued */
    double kv_usage;         /* share of KV blocks held by running sequences, 0..1 */
    uint64_t kv_cached;      /* KV blocks holding cached prefixes (pinned or not) */
    uint64_t prefix_queries; /* prompt tokens looked up in the prefix cache, total */
    uint64_t prefix_hits;    /* of which were found, total */
    uint64_t prefix_blocks;     /* prefix block hashes looked up at admission, total */
    uint64_t prefix_block_hits; /* of which were cached (the leading ones found), total */
    uint64_t iterations;     /* engine iterations run, total */
    uint64_t tokens;         /* output tokens produced, total */
    uint64_t preemptions;    /* sequences sent back to the queue for lack of KV room, total */
};

/* What the prefix cache did, as an engine's KV-cache events tell it: @p hashes (n of them, in a
 * prompt's order) were stored, or evicted; ATC_SIM_KV_CLEARED: everything is gone (n is 0). */
enum atc_sim_kv_op { ATC_SIM_KV_STORED, ATC_SIM_KV_REMOVED, ATC_SIM_KV_CLEARED };
typedef void (*atc_sim_on_kv)(void *ctx, enum atc_sim_kv_op op, const uint64_t *hashes, size_t n);

/** Calls @p on_kv with @p ctx for every change of the prefix cache from now on (NULL: none). It must
 * not call into the model. */
void atc_sim_set_kv_listener(struct atc_sim *sim, atc_sim_on_kv on_kv, void *ctx);

/** Creates a model; @p p is copied (the model name is not used here, so it is not kept). Knobs out of
 * range (0 for max_seqs, kv_blocks, prefill_tps and the fields after seed; negative decode_ms) are
 * replaced by their defaults. @p on_token with @p ctx receives every token.
 * Returns NULL on allocation failure. */
struct atc_sim *atc_sim_create(const struct atc_sim_params *p, atc_sim_on_token on_token, void *ctx);
/** Frees the model and forgets every sequence without calling back. NULL is fine. */
void atc_sim_destroy(struct atc_sim *sim);

/** Queues a request arriving at @p now_us (not earlier than the previous submission's). It is admitted
 * by the first iteration that starts at or after its arrival, so requests submitted at the same time
 * before the next atc_sim_advance are batched together. Returns its sequence id (never 0), and in
 * *output_tokens (may be NULL) the number of tokens it will produce; 0 on allocation failure.
 * Never calls back. */
uint64_t atc_sim_submit(struct atc_sim *sim, uint64_t now_us, const struct atc_sim_request *req, void *user,
                        uint32_t *output_tokens);
/** Forgets sequence @p id, waiting or running, and frees its slot and its KV reservation. The iteration
 * in progress keeps its planned end. Unknown or finished ids are ignored. Never calls back. */
void atc_sim_cancel(struct atc_sim *sim, uint64_t id);

/** When the next iteration ends or starts, in microseconds; UINT64_MAX when there is nothing to do. */
uint64_t atc_sim_next_event_us(const struct atc_sim *sim);
/** Runs every iteration that ends at or before @p now_us, calling on_token for its tokens, and starts
 * the next one. */
void atc_sim_advance(struct atc_sim *sim, uint64_t now_us);

/** Fills @p st with the current state. */
void atc_sim_stats(const struct atc_sim *sim, struct atc_sim_stats *st);
/** How many of the leading @p nblocks hashes are cached now (no side effect). */
size_t atc_sim_prefix_cached(const struct atc_sim *sim, const uint64_t *blocks, size_t nblocks);
/** How long from @p now_us until the model could start a new prompt's prefill: the rest of the iteration
 * in progress, then the prefill not yet scheduled at its prefill rate (what running sequences have left
 * to compute, and the waiting ones' prompts less what the cache holds of them now). No side effect. */
double atc_sim_backlog_ms(const struct atc_sim *sim, uint64_t now_us);
/** @p tokens of prefill in ms, at the model's prefill rate. */
double atc_sim_prefill_ms(const struct atc_sim *sim, uint64_t tokens);

/** An engine restart between iterations: every cached prefix block nobody uses is dropped, and the KV
 * events' listener hears ATC_SIM_KV_CLEARED, then STORED for the blocks the running sequences still pin
 * (they run on: a restart drained first, or one that kept its running batch). Counters stay. */
void atc_sim_restart(struct atc_sim *sim);

/** splitmix64: advances *state and returns the next value; the model's and the server's PRNG. */
uint64_t atc_sim_rand(uint64_t *state);
/** A uniform draw in [0, 1) from atc_sim_rand's next value (its top 53 bits). */
double atc_sim_uniform(uint64_t *state);

#endif
