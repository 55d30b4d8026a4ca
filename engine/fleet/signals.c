/* Routing signals (signals.h): counters a request moves through as it is sent, answers and ends. */

#include "fleet/signals.h"

#include <math.h>
#include <string.h>

/* The rate is the prior until this much prompt work was measured: a few short prompts' time is mostly
 * one decode step and the network, and says little about the server's prefill speed. */
#define MIN_RATE_TOKENS 1024
/* Samples are kept within this factor of the prior: a stall (a server paused, preempting) must not make
 * one endpoint look ten times slower for the next hundred decisions. */
#define RATE_CLAMP 8.0
#define EWMA_ALPHA 0.1

void atc_signals_init(struct atc_signals *s)
{
    memset(s, 0, sizeof(*s));
}

/* ---- the decaying sum: a float and a 32-bit millisecond stamp in one word ---- */

static uint64_t pack(float v, uint32_t ms)
{
    uint32_t bits;
    memcpy(&bits, &v, sizeof(bits));
    return (uint64_t)bits << 32 | ms;
}

static float unpack_at(uint64_t word, const struct atc_signal_params *p, uint32_t now_ms)
{
    uint32_t bits = (uint32_t)(word >> 32);
    float v;
    memcpy(&v, &bits, sizeof(v));
    int32_t dt = (int32_t)(now_ms - (uint32_t)word); /* wraps every 49 days; differences stay right */
    if (dt <= 0 || v == 0)
        return v;
    return (float)(v * exp2(-(double)dt / (double)(p->recent_half_life_ms ? p->recent_half_life_ms : 1)));
}

static void recent_add(struct atc_signals *s, const struct atc_signal_params *p, double tokens, uint64_t now_us)
{
    uint32_t now_ms = (uint32_t)(now_us / 1000u);
    uint64_t old = atomic_load_explicit(&s->recent, memory_order_relaxed);
    uint64_t next;
    do
        next = pack(unpack_at(old, p, now_ms) + (float)tokens, now_ms);
    while (!atomic_compare_exchange_weak_explicit(&s->recent, &old, next, memory_order_relaxed,
                                                  memory_order_relaxed));
}

void atc_signals_recent_set(struct atc_signals *s, double tokens, uint64_t now_us)
{
    atomic_store_explicit(&s->recent, pack((float)tokens, (uint32_t)(now_us / 1000u)), memory_order_relaxed);
}

double atc_signals_recent_at(uint64_t recent, const struct atc_signal_params *p, uint64_t now_us)
{
    return unpack_at(recent, p, (uint32_t)(now_us / 1000u));
}

/* ---- a request's way through ---- */

/* Moves the EWMA @p avg towards @p sample (0: none yet, the sample is taken as it is); returns it. */
static double ewma_move(_Atomic double *avg, double sample)
{
    double old = atomic_load_explicit(avg, memory_order_relaxed);
    double next = old == 0 ? sample : old + EWMA_ALPHA * (sample - old);
    atomic_store_explicit(avg, next, memory_order_relaxed);
    return next;
}

static void ewma_add(_Atomic double *avg, _Atomic uint64_t *n, double sample)
{
    ewma_move(avg, sample);
    atomic_fetch_add_explicit(n, 1, memory_order_relaxed);
}

/* Subtracts, saturating at 0: a counter never wraps, even if a bug undid something twice. */
static void sub_u64(_Atomic uint64_t *c, uint64_t x)
{
    uint64_t old = atomic_load_explicit(c, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(c, &old, old > x ? old - x : 0, memory_order_relaxed,
                                                  memory_order_relaxed))
        ;
}

static void dec_unsigned(_Atomic unsigned *c)
{
    unsigned old = atomic_load_explicit(c, memory_order_relaxed);
    while (old > 0 && !atomic_compare_exchange_weak_explicit(c, &old, old - 1, memory_order_relaxed,
                                                             memory_order_relaxed))
        ;
}

/* @p t's prompt leaves the prefill queue (its first token came, or it ended without one): the server is
 * on time again, from now (the callers set head_us). */
static void prefill_left(struct atc_signals *s, const struct atc_signal_ticket *t)
{
    sub_u64(&s->prefill_tokens, t->uncached);
    dec_unsigned(&s->prefilling);
    if (t->streamed)
        dec_unsigned(&s->awaiting);
    atomic_store_explicit(&s->late_us, 0, memory_order_relaxed);
    atomic_store_explicit(&s->behind_tokens, 0, memory_order_relaxed);
}

void atc_signals_sent(struct atc_signals *s, const struct atc_signal_params *p, struct atc_signal_ticket *t,
                      uint64_t uncached, uint64_t now_us)
{
    t->uncached = uncached;
    double tps = atc_signals_prefill_tps(s, p);
    uint64_t queued = atomic_load_explicit(&s->prefill_tokens, memory_order_relaxed),
             head = atomic_load_explicit(&s->head_us, memory_order_relaxed);
    if (atomic_load_explicit(&s->late_us, memory_order_relaxed) != 0) {
        /* the server is late: this prompt waits behind the one it is still on */
        atomic_fetch_add_explicit(&s->behind_tokens, uncached, memory_order_relaxed);
    } else if (queued > 0 && head != 0 && now_us > head && (double)(now_us - head) * tps / 1e6 >= (double)queued &&
               atomic_load_explicit(&s->awaiting, memory_order_relaxed) > 0) {
        /* all of it was due, and a first token is still awaited: late since it was due */
        uint64_t due = head + (uint64_t)((double)queued / tps * 1e6);
        atomic_store_explicit(&s->behind_tokens, uncached, memory_order_relaxed);
        atomic_store_explicit(&s->late_us, due, memory_order_relaxed);
    } else if (atc_signals_queued(s, tps, now_us) <= 0) {
        /* Nothing queued, or all of it done by the estimate though no first token said so (answers that
         * are not streamed give none, and leave the count only when they end): this prompt starts now at
         * the latest, and the estimate starts again from here rather than count it done before it was
         * sent. */
        atomic_store_explicit(&s->head_us, now_us ? now_us : 1, memory_order_relaxed); /* 0: not known */
    }
    if (t->streamed)
        atomic_fetch_add_explicit(&s->awaiting, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->prefill_tokens, uncached, memory_order_relaxed);
    t->sent_us = now_us;
    t->first_us = 0;
    t->guessed = UINT64_MAX;
    t->phase = ATC_SIGNAL_PREFILL;
    atomic_fetch_add_explicit(&s->prefilling, 1, memory_order_relaxed);
    recent_add(s, p, (double)uncached, now_us);
    ewma_add(&s->uncached_ewma, &s->uncached_samples, (double)uncached);
}

void atc_signals_sent_guessed(struct atc_signals *s, const struct atc_signal_params *p,
                              struct atc_signal_ticket *t, uint64_t prompt_tokens, uint64_t cached_blocks,
                              uint64_t block_tokens, uint64_t now_us)
{
    atc_signals_sent(s, p, t, atc_signals_uncached(prompt_tokens, cached_blocks, block_tokens), now_us);
    t->guessed = cached_blocks * block_tokens;
}

void atc_signals_first_byte(struct atc_signals *s, const struct atc_signal_params *p, struct atc_signal_ticket *t,
                            uint64_t now_us, bool sample)
{
    if (t->phase != ATC_SIGNAL_PREFILL)
        return;
    prefill_left(s, t);
    atomic_fetch_add_explicit(&s->decoding, 1, memory_order_relaxed);
    t->phase = ATC_SIGNAL_DECODE;
    t->first_us = now_us;
    /* the next prompt there starts now; this one started when it was sent or when the one before it was
     * done, whichever is later */
    atomic_store_explicit(&s->head_us, now_us ? now_us : 1, memory_order_relaxed); /* 0: not known */
    uint64_t before = atomic_exchange_explicit(&s->first_byte_us, now_us, memory_order_relaxed);
    uint64_t start = t->sent_us > before ? t->sent_us : before;
    if (!sample || now_us < start)
        return;
    double tok = ewma_move(&s->busy_tokens_ewma, (double)t->uncached),
           ms = ewma_move(&s->busy_ms_ewma, (double)(now_us - start) / 1000.0);
    atomic_fetch_add_explicit(&s->prefill_samples, 1, memory_order_relaxed);
    if (atomic_fetch_add_explicit(&s->busy_tokens, t->uncached, memory_order_relaxed) + t->uncached <
            MIN_RATE_TOKENS ||
        ms <= 0)
        return;
    double tps = tok / (ms / 1000.0);
    double lo = p->prefill_tps / RATE_CLAMP, hi = p->prefill_tps * RATE_CLAMP;
    atomic_store_explicit(&s->prefill_tps_ewma, tps < lo ? lo : tps > hi ? hi : tps, memory_order_relaxed);
}

void atc_signals_done(struct atc_signals *s, struct atc_signal_ticket *t, uint64_t now_us, uint64_t tokens)
{
    if (t->phase == ATC_SIGNAL_PREFILL) { /* (failed, cancelled, or an answer not streamed) */
        prefill_left(s, t);
        /* what is left of the queue started by now at the latest: never count it done before it began */
        atomic_store_explicit(&s->head_us, now_us ? now_us : 1, memory_order_relaxed);
    } else if (t->phase == ATC_SIGNAL_DECODE) {
        dec_unsigned(&s->decoding);
        if (tokens >= 2 && now_us > t->first_us)
            ewma_add(&s->itl_ms_ewma, &s->itl_samples,
                     (double)(now_us - t->first_us) / 1000.0 / (double)(tokens - 1));
    }
    t->phase = ATC_SIGNAL_IDLE;
}

/* A share, weighted by the answer's prompt: a 10-token prompt with nothing cached says less about the
 * server's cache than a 4,000-token one. The weight is capped so that one huge prompt moves it at most
 * half way. */
#define CACHED_WEIGHT_TOKENS 20000.0

void atc_signals_cached(struct atc_signals *s, const struct atc_signal_ticket *t, uint64_t prompt,
                        uint64_t cached)
{
    if (prompt == 0)
        return;
    if (t != NULL && t->guessed != UINT64_MAX) {
        atomic_fetch_add_explicit(&s->guess_samples, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&s->guessed_tokens, t->guessed, memory_order_relaxed);
        atomic_fetch_add_explicit(&s->reported_tokens, cached, memory_order_relaxed);
        atomic_fetch_add_explicit(&s->guess_error_tokens,
                                  t->guessed > cached ? t->guessed - cached : cached - t->guessed,
                                  memory_order_relaxed);
    }
    double share = cached >= prompt ? 1.0 : (double)cached / (double)prompt;
    double w = (double)prompt / CACHED_WEIGHT_TOKENS;
    w = w > 0.5 ? 0.5 : w < EWMA_ALPHA / 10 ? EWMA_ALPHA / 10 : w;
    uint64_t n = atomic_fetch_add_explicit(&s->cached_samples, 1, memory_order_relaxed);
    double old = atomic_load_explicit(&s->cached_share_ewma, memory_order_relaxed);
    atomic_store_explicit(&s->cached_share_ewma, n == 0 ? share : old + w * (share - old),
                          memory_order_relaxed);
}

void atc_signals_guess(const struct atc_signals *s, struct atc_signals_guess *out)
{
    *out = (struct atc_signals_guess){
        .samples = atomic_load_explicit(&s->guess_samples, memory_order_relaxed),
        .guessed_tokens = atomic_load_explicit(&s->guessed_tokens, memory_order_relaxed),
        .reported_tokens = atomic_load_explicit(&s->reported_tokens, memory_order_relaxed),
        .error_tokens = atomic_load_explicit(&s->guess_error_tokens, memory_order_relaxed),
    };
}

double atc_signals_cached_share(const struct atc_signals *s)
{
    if (atomic_load_explicit(&s->cached_samples, memory_order_relaxed) == 0)
        return -1;
    return atomic_load_explicit(&s->cached_share_ewma, memory_order_relaxed);
}

void atc_signals_scraped(struct atc_signals *s, double running, double waiting, double kv_usage,
                         double prefix_hit_rate, uint64_t now_us)
{
    atomic_store_explicit(&s->scraped_running, running, memory_order_relaxed);
    atomic_store_explicit(&s->scraped_waiting, waiting, memory_order_relaxed);
    atomic_store_explicit(&s->scraped_kv_usage, kv_usage, memory_order_relaxed);
    atomic_store_explicit(&s->scraped_prefix_hit_rate, prefix_hit_rate, memory_order_relaxed);
    atomic_store_explicit(&s->scraped_at_us, now_us ? now_us : 1, memory_order_release);
}

/* ---- reading ---- */

double atc_signals_predict_ttft_ms(const struct atc_signals *s, const struct atc_signal_params *p,
                                   uint64_t uncached, uint64_t now_us)
{
    double tps = atc_signals_prefill_tps(s, p);
    return (atc_signals_queued(s, tps, now_us) + (double)uncached) * 1000.0 / tps + atc_signals_itl_ms(s, p);
}
