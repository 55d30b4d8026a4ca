#ifndef ATC_SIGNALS_H
#define ATC_SIGNALS_H

/* Routing signals: what the engine observes of each endpoint's work, for policies to weigh.
 *
 * atc sees every request go out to a server and its answer's first token and last byte come back, so it
 * knows better than any guess in Lua how much prompt work is queued on a server. Per endpoint:
 *
 *   prefill_tokens  uncached prompt tokens of the requests sent there whose first token has not come back
 *                   (the prefill queue a new request waits behind; "uncached" by the prefix index at send
 *                   time); prefilling / decoding: those requests, and the ones past their first token;
 *   recent_tokens   the same uncached tokens, summed with exponential decay (half-life recent_half_life):
 *                   traffic that arrives one request at a time reads 0 in flight at every pick, but not 0
 *                   here;
 *   prefill_rate    prompt tokens per second the server gets through: the uncached tokens of streamed
 *                   answers over the time the server spent on each, EWMAs of both (a ratio of sums, so a
 *                   long prompt weighs as much as its time). An engine prefills in arrival order (vLLM,
 *                   vllm/v1/core/sched/scheduler.py schedule(): the RUNNING requests, partial prefills
 *                   included, take the step's token budget before any WAITING one), so a request's
 *                   prefill starts when it was sent or when the one before it there gave its first token,
 *                   whichever is later, and ends at its own first token; the prior until MIN_RATE_TOKENS
 *                   were measured;
 *   queued          prefill_tokens less what the server has done of them since the last first token
 *                   there (or since it was sent when nothing was queued), at prefill_rate: a long prompt
 *                   half done is half queued (atc_signals_queued). A server behind that estimate (all
 *                   of it due, and a streamed prompt's first token not come) did more work than atc
 *                   counted: a prompt the prefix index took for cached was evicted, or evicted while it
 *                   waited, or the engine preempted. From when it was due, queued is the time it is
 *                   late, as long again (the longer a prompt overruns, the more it likely has left),
 *                   plus the prompts sent since, which wait behind it, until a first token comes;
 *   uncached_mean   uncached prompt tokens per request sent there, an EWMA: the mean prefill a request
 *                   brings, so prefill_tokens / uncached_mean is how many requests' work is queued;
 *   itl             milliseconds per output token, an EWMA of (last byte - first token) / (events - 1) over
 *                   streamed answers; the prior until then;
 *   cached_share    the share of prompt tokens the server itself reported cached (usage's
 *                   prompt_tokens_details.cached_tokens / prompt_tokens), an EWMA over the answers that
 *                   reported it, prompt-token weighted; not known (nil) until one did: the engine's real
 *                   cache hits, beside the router's guess by its prefix index;
 *   guess error     over the answers that reported cached tokens: the prompt tokens atc's prefix index
 *                   guessed the server held when the request was sent, the tokens the server said it
 *                   found cached, and |guessed - reported| summed (counters: /metrics
 *                   atc_prefix_guess_*), so an operator sees how far the guess is off, per endpoint;
 *   scraped         the server's own running / waiting / KV usage / prefix hit rate from its /metrics,
 *                   with the time of that scrape (never scraped: not known, shown as nil).
 *
 *   predicted TTFT = (queued + the request's uncached tokens) / prefill_rate + itl.
 *
 * The same functions run live (relay.c, with the monotonic clock) and in replay (replay.c, with virtual
 * time): the clock is always the caller's @p now_us, so a replayed policy sees what it would see live.
 *
 * Threads: every field is a C11 atomic written by whichever worker handles a request of the endpoint
 * (the scraped values by the main thread's health checks); each is consistent on its own, not with the
 * others, as endpoint.h's counters. The EWMAs are a load and a store, not a CAS loop (a sample lost when
 * two workers record at once does not move an average of many); the decaying sum is one CAS on a packed
 * word, so no assignment is lost. */

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "config/signal_params.h"

struct atc_signals {
    _Atomic uint64_t prefill_tokens;
    _Atomic uint64_t head_us;       /* when the queue's first prompt started: 0 = not known (not drained) */
    _Atomic uint64_t late_us;       /* when the queue was due while a first token was awaited: 0 = on time */
    _Atomic uint64_t behind_tokens; /* uncached tokens sent since late_us: they wait behind the late one */
    _Atomic unsigned awaiting;      /* streamed prompts sent there whose first token has not come */
    _Atomic uint64_t first_byte_us; /* the last first token there */
    _Atomic double busy_tokens_ewma, busy_ms_ewma; /* prefill_rate's parts */
    _Atomic uint64_t busy_tokens;                  /* tokens measured so far (MIN_RATE_TOKENS) */
    _Atomic unsigned prefilling, decoding;
    _Atomic uint64_t recent; /* float tokens (high 32 bits) as of a ms timestamp (low 32 bits) */
    _Atomic double prefill_tps_ewma, itl_ms_ewma, uncached_ewma; /* 0 = no sample yet */
    _Atomic uint64_t prefill_samples, itl_samples, uncached_samples;
    _Atomic double cached_share_ewma; /* meaningful once cached_samples > 0 */
    _Atomic uint64_t cached_samples;
    _Atomic uint64_t guess_samples, guessed_tokens, reported_tokens, guess_error_tokens; /* guess error */
    /* scraped (main thread writes); scraped_at_us 0 = never */
    _Atomic double scraped_running, scraped_waiting, scraped_kv_usage, scraped_prefix_hit_rate;
    _Atomic uint64_t scraped_at_us;
};

/* One request's part in its endpoint's signals, kept by whoever sends it (the relay, the replay). */
enum atc_signal_phase { ATC_SIGNAL_IDLE, ATC_SIGNAL_PREFILL, ATC_SIGNAL_DECODE };

struct atc_signal_ticket {
    uint64_t uncached; /* its tokens counted in prefill_tokens */
    uint64_t sent_us, first_us;
    uint64_t guessed; /* prompt tokens the prefix index guessed the endpoint held; UINT64_MAX: no guess */
    bool streamed; /* set by the sender: its first token will be seen (an event stream), so its lateness
                    * tells (an answer sent whole gives none: late, it is only decoding) */
    enum atc_signal_phase phase;
};

/** Resets @p s to nothing observed. */
void atc_signals_init(struct atc_signals *s);

/** The uncached prompt tokens of a request of @p prompt_tokens whose @p cached_blocks leading blocks of
 * @p block_tokens each the endpoint likely holds. At least 1: the last prompt token is always computed.
 * (Inline, as the readers below: a decision calls them for every endpoint of its pool.) */
static inline uint64_t atc_signals_uncached(uint64_t prompt_tokens, uint64_t cached_blocks,
                                            uint64_t block_tokens)
{
    uint64_t cached = cached_blocks * block_tokens;
    return cached < prompt_tokens ? prompt_tokens - cached : 1;
}

/** A request with @p uncached tokens to prefill was sent to the endpoint of @p s at @p now_us: counts it
 * in prefill_tokens, prefilling and recent_tokens (and awaiting when @p t is streamed), and starts @p t.
 * Any thread. */
void atc_signals_sent(struct atc_signals *s, const struct atc_signal_params *p, struct atc_signal_ticket *t,
                      uint64_t uncached, uint64_t now_us);

/** atc_signals_sent for a request of @p prompt_tokens whose @p cached_blocks leading blocks of
 * @p block_tokens each the prefix index guesses the endpoint holds (atc_signals_uncached), keeping that
 * guess in @p t for atc_signals_cached to compare with the engine's own count. Any thread. */
void atc_signals_sent_guessed(struct atc_signals *s, const struct atc_signal_params *p,
                              struct atc_signal_ticket *t, uint64_t prompt_tokens, uint64_t cached_blocks,
                              uint64_t block_tokens, uint64_t now_us);
/** The answer's first token came back at @p now_us (a stream's first data event, never its head: vLLM,
 * SGLang and TGI send the head before prefill): moves the request from prefilling to decoding and, when
 * @p sample, takes a prefill-rate sample. An answer that is not streamed never calls it: its prompt
 * leaves the backlog at atc_signals_done, and it gives no rate sample.
 * Does nothing unless @p t is prefilling. */
void atc_signals_first_byte(struct atc_signals *s, const struct atc_signal_params *p, struct atc_signal_ticket *t,
                            uint64_t now_us, bool sample);

/** The request ended at @p now_us, any way (finished, failed, cancelled, retried elsewhere), after
 * @p tokens output tokens (0 when unknown; >= 2 of a streamed answer gives an ITL sample). Undoes what
 * sent/first_byte counted; a ticket that is idle already is left alone, so calling it twice is safe. */
void atc_signals_done(struct atc_signals *s, struct atc_signal_ticket *t, uint64_t now_us, uint64_t tokens);

/** An answer's usage said @p cached of its @p prompt prompt tokens were cached (@p prompt > 0). With
 * @p t (may be NULL) of that request sent with a guess (atc_signals_sent_guessed), also counts the
 * guess's error. */
void atc_signals_cached(struct atc_signals *s, const struct atc_signal_ticket *t, uint64_t prompt,
                        uint64_t cached);
/** The guess error's counters (see above). */
struct atc_signals_guess {
    uint64_t samples, guessed_tokens, reported_tokens, error_tokens;
};
void atc_signals_guess(const struct atc_signals *s, struct atc_signals_guess *out);
/** cached_share in [0, 1]; -1 when no answer ever reported cached tokens. */
double atc_signals_cached_share(const struct atc_signals *s);

/** A scrape of the server's metrics at @p now_us (NaN for a value the server does not report). */
void atc_signals_scraped(struct atc_signals *s, double running, double waiting, double kv_usage,
                         double prefix_hit_rate, uint64_t now_us);

/** Sets recent_tokens to @p tokens as of @p now_us (a reset; `atc test` endpoint specs). */
void atc_signals_recent_set(struct atc_signals *s, double tokens, uint64_t now_us);
/** recent_tokens as of @p now_us, from the packed word @p recent (atc_signals_recent's slow part). */
double atc_signals_recent_at(uint64_t recent, const struct atc_signal_params *p, uint64_t now_us);
/** recent_tokens as of @p now_us. Inline for the common 0 (a tie-break reads it for a whole pool). */
static inline double atc_signals_recent(const struct atc_signals *s, const struct atc_signal_params *p,
                                        uint64_t now_us)
{
    uint64_t word = atomic_load_explicit(&s->recent, memory_order_relaxed);
    return word >> 32 == 0 ? 0.0 : atc_signals_recent_at(word, p, now_us); /* +0.0f: no tokens */
}
/** The prefill rate (tokens/s) and ITL (ms): observed, or the priors. */
static inline double atc_signals_prefill_tps(const struct atc_signals *s, const struct atc_signal_params *p)
{
    double v = atomic_load_explicit(&s->prefill_tps_ewma, memory_order_relaxed);
    return v > 0 ? v : p->prefill_tps;
}
static inline double atc_signals_itl_ms(const struct atc_signals *s, const struct atc_signal_params *p)
{
    double v = atomic_load_explicit(&s->itl_ms_ewma, memory_order_relaxed);
    return v > 0 ? v : (double)p->itl_us / 1000.0;
}
/** The prompt tokens still to prefill there at @p now_us (queued above), at @p tps tokens/s. */
static inline double atc_signals_queued(const struct atc_signals *s, double tps, uint64_t now_us)
{
    double q = (double)atomic_load_explicit(&s->prefill_tokens, memory_order_relaxed);
    if (q <= 0) /* (most endpoints of a large pool: nothing more to read) */
        return q;
    uint64_t late = atomic_load_explicit(&s->late_us, memory_order_relaxed);
    if (late != 0) /* late since then, as long again, and what was sent since waits behind it */
        return (now_us > late ? (double)(now_us - late) * tps / 1e6 : 0) +
               (double)atomic_load_explicit(&s->behind_tokens, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&s->head_us, memory_order_relaxed);
    if (head == 0 || now_us <= head)
        return q;
    q -= (double)(now_us - head) * tps / 1e6;
    if (q > 0)
        return q;
    /* all of it due: a first token awaited past then is late by -q tokens' time, so as long again */
    return atomic_load_explicit(&s->awaiting, memory_order_relaxed) > 0 ? -q : 0;
}
/** uncached_mean: tokens per request sent; 0 before the first. */
static inline double atc_signals_uncached_mean(const struct atc_signals *s)
{
    return atomic_load_explicit(&s->uncached_ewma, memory_order_relaxed);
}

/** Predicted ms to the first token of a request with @p uncached tokens to prefill, sent there at
 * @p now_us. */
double atc_signals_predict_ttft_ms(const struct atc_signals *s, const struct atc_signal_params *p,
                                   uint64_t uncached, uint64_t now_us);

#endif
