/* Unit tests for engine/fleet/signals.c: what a request's way through an endpoint does to its signals. */

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "fleet/signals.h"

static struct atc_signal_params params(void)
{
    struct atc_signal_params p;
    atc_signal_params_init(&p);
    return p;
}

static void test_uncached(void **state)
{
    assert_int_equal(atc_signals_uncached(1000, 0, 64), 1000);
    assert_int_equal(atc_signals_uncached(1000, 10, 64), 360);
    /* a prompt found whole still computes its last token, as vLLM does */
    assert_int_equal(atc_signals_uncached(1000, 16, 64), 1);
}

static void test_prefill_tokens_follow_the_first_byte(void **state)
{
    struct atc_signal_params p = params();
    struct atc_signals s;
    atc_signals_init(&s);
    struct atc_signal_ticket a = {0}, b = {0};
    atc_signals_sent(&s, &p, &a, 8000, 0);
    assert_int_equal(s.prefill_tokens, 8000);
    assert_int_equal(s.prefilling, 1);
    atc_signals_sent(&s, &p, &b, 3000, 1000);
    assert_int_equal(s.prefill_tokens, 11000);
    /* queued: a started at 0 (nothing was queued): at 15000 tokens/s, 4050 of its tokens done at 0.27 s */
    assert_true(fabs(atc_signals_queued(&s, 15000, 0) - 11000) < 0.1);
    assert_true(fabs(atc_signals_queued(&s, 15000, 270000) - 6950) < 0.1);
    assert_true(atc_signals_queued(&s, 15000, 5000000) == 0); /* slower than thought: never below 0 */
    atc_signals_first_byte(&s, &p, &a, 550000, true);
    assert_int_equal(s.prefill_tokens, 3000);
    /* b starts when a's first token comes: all of it queued then */
    assert_true(fabs(atc_signals_queued(&s, 15000, 550000) - 3000) < 1e-6);
    assert_true(fabs(atc_signals_queued(&s, 15000, 650000) - 1500) < 1e-6);
    assert_int_equal(s.prefilling, 1);
    assert_int_equal(s.decoding, 1);
    /* a decoding request finishing does not touch the prefill queue */
    atc_signals_done(&s, &a, 5000000, 400);
    assert_int_equal(s.prefill_tokens, 3000);
    assert_int_equal(s.decoding, 0);
    /* a request that fails before its first byte takes its tokens back out, once */
    atc_signals_done(&s, &b, 6000000, 0);
    atc_signals_done(&s, &b, 6000000, 0);
    assert_int_equal(s.prefill_tokens, 0);
    assert_int_equal(s.prefilling, 0);
    /* a first byte after the end changes nothing */
    atc_signals_first_byte(&s, &p, &b, 7000000, true);
    assert_int_equal(s.decoding, 0);
    /* uncached_mean: the first request's tokens, then a moving average */
    assert_true(atc_signals_uncached_mean(&s) > 3000 && atc_signals_uncached_mean(&s) < 8000);
    struct atc_signals fresh;
    atc_signals_init(&fresh);
    assert_true(atc_signals_uncached_mean(&fresh) == 0);
    for (int i = 0; i < 200; i++) {
        atc_signals_sent(&fresh, &p, &a, 2000, (uint64_t)i);
        atc_signals_done(&fresh, &a, (uint64_t)i, 0);
    }
    assert_true(fabs(atc_signals_uncached_mean(&fresh) - 2000) < 1e-6);
}

static void test_rates_are_learned_from_samples(void **state)
{
    struct atc_signal_params p = params();
    struct atc_signals s;
    atc_signals_init(&s);
    assert_true(atc_signals_prefill_tps(&s, &p) == 15000);
    assert_true(atc_signals_itl_ms(&s, &p) == 12);
    struct atc_signal_ticket a = {0};
    /* 10000 tokens, first byte after 1 s: 10000 tokens/s */
    atc_signals_sent(&s, &p, &a, 10000, 0);
    atc_signals_first_byte(&s, &p, &a, 1000000, true);
    assert_true(fabs(atc_signals_prefill_tps(&s, &p) - 10000) < 1);
    /* 101 tokens over 2 s after the first: 20 ms each */
    atc_signals_done(&s, &a, 3000000, 101);
    assert_true(fabs(atc_signals_itl_ms(&s, &p) - 20) < 1e-6);
    /* predicted: (queued 0 + 5000) / 10000 tokens/s + 20 ms */
    assert_true(fabs(atc_signals_predict_ttft_ms(&s, &p, 5000, 3000000) - 520) < 1e-6);
    /* a non-streamed answer's first byte is its last: no sample */
    struct atc_signal_ticket b = {0};
    atc_signals_sent(&s, &p, &b, 10000, 4000000);
    atc_signals_first_byte(&s, &p, &b, 9000000, false);
    assert_true(fabs(atc_signals_prefill_tps(&s, &p) - 10000) < 1);
    assert_int_equal(s.prefill_samples, 1);
    /* Two prompts sent together: the second one's prefill starts at the first one's first token, so each
     * is timed on its own (5000 tokens in 0.5 s, then 3000 in 0.3 s): still 10000 tokens/s. Timed from its
     * send, the second would read 3000 / 0.8 s. */
    struct atc_signal_ticket c = {0}, d = {0};
    atc_signals_sent(&s, &p, &c, 5000, 10000000);
    atc_signals_sent(&s, &p, &d, 3000, 10000000);
    atc_signals_first_byte(&s, &p, &c, 10500000, true);
    atc_signals_first_byte(&s, &p, &d, 10800000, true);
    assert_true(fabs(atc_signals_prefill_tps(&s, &p) - 10000) < 1);
    /* with d's prefill half done, the prediction counts the other half */
    struct atc_signal_ticket e = {0}, f = {0};
    atc_signals_sent(&s, &p, &e, 4000, 20000000);
    atc_signals_sent(&s, &p, &f, 1000, 20000000);
    assert_true(fabs(atc_signals_predict_ttft_ms(&s, &p, 0, 20200000) - (3000.0 / 10 + 20)) < 1e-6);
}

/* Answers that are not streamed give no first token and leave the queue only when they end: a busy
 * endpoint's queue then never empties, and a prompt sent there must not read as done before it was sent
 * (a review found queued() at 0 with 50,000 tokens counted and a 30,000-token prompt just sent). */
static void test_queue_without_first_tokens(void **state)
{
    struct atc_signal_params p = params();
    struct atc_signals s;
    atc_signals_init(&s);
    struct atc_signal_ticket t[10] = {{0}};
    uint64_t now = 1000000;
    for (int i = 0; i < 100; i++, now += 200000) { /* 2,000 tokens every 200 ms, each answered 2 s later */
        if (i >= 10)
            atc_signals_done(&s, &t[i % 10], now, 0);
        atc_signals_sent(&s, &p, &t[i % 10], 2000, now);
    }
    struct atc_signal_ticket big = {0};
    atc_signals_sent(&s, &p, &big, 30000, now);
    assert_true(atc_signals_queued(&s, 15000, now) >= 30000);
    /* and it drains from its send on */
    assert_true(fabs(atc_signals_queued(&s, 15000, now + 1000000) - (atc_signals_queued(&s, 15000, now) - 15000)) < 1);
}

/* A streamed prompt whose first token is overdue: the server did more than atc counted (a prefix the index
 * took for cached was evicted: Mooncake's 191k-token prompt read as 400 tokens, 12 s of prefill, while
 * the estimate said the server was free and the policy kept sending there). From when it was due, queued
 * is the time it is late, as long again, plus what was sent since; a first token puts it on time. */
static void test_a_late_first_token_reads_as_busy(void **state)
{
    struct atc_signal_params p = params();
    struct atc_signals s;
    atc_signals_init(&s);
    struct atc_signal_ticket big = {.streamed = true}, next = {.streamed = true};
    atc_signals_sent(&s, &p, &big, 3000, 1000000); /* due at 1.2 s, at the prior 15k tokens/s */
    assert_true(fabs(atc_signals_queued(&s, 15000, 1100000) - 1500) < 1e-6);
    assert_true(atc_signals_queued(&s, 15000, 1200000) == 0);
    /* 0.5 s late: as long again */
    assert_true(fabs(atc_signals_queued(&s, 15000, 1700000) - 7500) < 1e-6);
    /* a prompt sent now waits behind it, and the lateness keeps growing */
    atc_signals_sent(&s, &p, &next, 2000, 1700000);
    assert_true(fabs(atc_signals_queued(&s, 15000, 1700000) - 9500) < 1e-6);
    assert_true(fabs(atc_signals_queued(&s, 15000, 2200000) - 17000) < 1e-6);
    assert_true(fabs(atc_signals_predict_ttft_ms(&s, &p, 1000, 2200000) - (18000.0 / 15 + 12)) < 1e-6);
    /* its first token: on time again, the next one queued from now */
    atc_signals_first_byte(&s, &p, &big, 3000000, false);
    assert_true(fabs(atc_signals_queued(&s, 15000, 3000000) - 2000) < 1e-6);
    assert_true(fabs(atc_signals_queued(&s, 15000, 3100000) - 500) < 1e-6);
    /* an answer sent whole shows no first token: past due it is decoding, not late */
    struct atc_signal_ticket whole = {0};
    atc_signals_first_byte(&s, &p, &next, 3100000, false);
    atc_signals_sent(&s, &p, &whole, 3000, 4000000);
    assert_true(atc_signals_queued(&s, 15000, 5000000) == 0);
    /* and a late one that ends without a first token (failed, cancelled) leaves no lateness behind */
    struct atc_signal_ticket lost = {.streamed = true};
    atc_signals_done(&s, &whole, 5000000, 10);
    atc_signals_sent(&s, &p, &lost, 1500, 5000000);
    assert_true(atc_signals_queued(&s, 15000, 5300000) > 0);
    atc_signals_done(&s, &lost, 5300000, 0);
    assert_true(atc_signals_queued(&s, 15000, 5300000) == 0);
}

static void test_recent_tokens_decay(void **state)
{
    struct atc_signal_params p = params(); /* half-life 2 s */
    struct atc_signals s;
    atc_signals_init(&s);
    struct atc_signal_ticket a = {0}, b = {0};
    atc_signals_sent(&s, &p, &a, 1000, 10000000);
    assert_true(fabs(atc_signals_recent(&s, &p, 10000000) - 1000) < 1e-3);
    assert_true(fabs(atc_signals_recent(&s, &p, 12000000) - 500) < 0.5);
    assert_true(fabs(atc_signals_recent(&s, &p, 14000000) - 250) < 0.5);
    /* it stays after the request is done: it is work recently given, not work in flight */
    atc_signals_done(&s, &a, 14000000, 0);
    atc_signals_sent(&s, &p, &b, 1000, 14000000);
    assert_true(fabs(atc_signals_recent(&s, &p, 14000000) - 1250) < 0.5);
}

static void test_scrape(void **state)
{
    struct atc_signals s;
    atc_signals_init(&s);
    assert_int_equal(s.scraped_at_us, 0); /* never scraped: the policy API says nil */
    atc_signals_scraped(&s, 3, 1, 0.5, NAN, 0);
    assert_true(s.scraped_at_us != 0); /* even at time 0 */
    assert_true(s.scraped_running == 3);
    assert_true(isnan(s.scraped_prefix_hit_rate));
}

/* cached_token_share: not known until an answer reports it; a 0 share is a sample like any other;
 * large prompts weigh more than small ones. */
static void test_cached_share(void **state)
{
    (void)state;
    struct atc_signals s;
    atc_signals_init(&s);
    assert_true(atc_signals_cached_share(&s) < 0);
    atc_signals_cached(&s, NULL, 0, 0); /* no prompt: no sample */
    assert_true(atc_signals_cached_share(&s) < 0);
    atc_signals_cached(&s, NULL, 1000, 0);
    assert_true(atc_signals_cached_share(&s) == 0);
    atc_signals_cached(&s, NULL, 100, 100); /* a small prompt moves it a little */
    double small = atc_signals_cached_share(&s);
    assert_true(small > 0 && small < 0.05);
    atc_signals_cached(&s, NULL, 100000, 100000); /* a huge one half way at most */
    assert_true(atc_signals_cached_share(&s) <= 0.5 + small / 2 + 1e-9);
    assert_true(atc_signals_cached_share(&s) > 0.5);
}

/* The guess's error: counted only for a request sent with a guess, too high and too low. */
static void test_guess_error(void **state)
{
    (void)state;
    struct atc_signals s;
    struct atc_signal_params p = {.prefill_tps = 10000, .itl_us = 10000, .recent_half_life_ms = 1000};
    struct atc_signal_ticket t = {0};
    struct atc_signals_guess g;
    atc_signals_init(&s);
    atc_signals_sent(&s, &p, &t, 100, 0);
    atc_signals_cached(&s, &t, 1000, 600); /* sent without a guess: nothing to compare */
    atc_signals_guess(&s, &g);
    assert_int_equal(g.samples, 0);
    atc_signals_sent_guessed(&s, &p, &t, 1000, 50, 16, 0); /* guessed 800 tokens: too much */
    assert_int_equal(t.uncached, 200);
    atc_signals_cached(&s, &t, 1000, 600);
    atc_signals_sent_guessed(&s, &p, &t, 1000, 0, 16, 0); /* cached around atc: guessed too little */
    atc_signals_cached(&s, &t, 1000, 512);
    atc_signals_guess(&s, &g);
    assert_int_equal(g.samples, 2);
    assert_int_equal(g.guessed_tokens, 800);
    assert_int_equal(g.reported_tokens, 1112);
    assert_int_equal(g.error_tokens, 200 + 512);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_uncached),
        cmocka_unit_test(test_prefill_tokens_follow_the_first_byte),
        cmocka_unit_test(test_rates_are_learned_from_samples),
        cmocka_unit_test(test_queue_without_first_tokens),
        cmocka_unit_test(test_a_late_first_token_reads_as_busy),
        cmocka_unit_test(test_recent_tokens_decay),
        cmocka_unit_test(test_scrape),
        cmocka_unit_test(test_cached_share),
        cmocka_unit_test(test_guess_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
