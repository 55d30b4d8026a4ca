/* An endpoint's last minute (fleet/recent.h): what the status page shows as rates over 60 s. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "fleet/recent.h"

#define T0 UINT64_C(5000000) /* ms: any monotonic time well past the start of the clock */

static struct atc_recent *fresh(void)
{
    static struct atc_recent r;
    memset(&r, 0, sizeof(r));
    return &r;
}

static void test_sums_attempts_errors_and_mean_ttft(void **state)
{
    struct atc_recent *r = fresh();
    struct atc_recent_sum s;
    atc_recent_sum(r, T0, &s);
    assert_int_equal(s.attempts, 0);
    assert_true(isnan(s.ttft_ms)); /* no sample: not known, not 0 */
    atc_recent_record(r, T0, true, 100.0);
    atc_recent_record(r, T0 + 10, true, 300.0);
    atc_recent_record(r, T0 + 2500, false, -1);
    atc_recent_record(r, T0 + 2600, true, -1); /* ok, but no first byte timed */
    atc_recent_sum(r, T0 + 3000, &s);
    assert_int_equal(s.attempts, 4);
    assert_int_equal(s.errors, 1);
    assert_int_equal(s.ttft_n, 2);
    assert_true(fabs(s.ttft_ms - 200.0) < 0.01);
}

/* An incident a minute ago no longer shows; one 59 s ago still does. */
static void test_old_seconds_leave_the_window(void **state)
{
    struct atc_recent *r = fresh();
    struct atc_recent_sum s;
    for (int i = 0; i < 10; i++)
        atc_recent_record(r, T0 + (uint64_t)i, false, -1);
    atc_recent_sum(r, T0 + 59000, &s);
    assert_int_equal(s.errors, 10);
    atc_recent_sum(r, T0 + 60000, &s);
    assert_int_equal(s.attempts, 0);
    assert_int_equal(s.errors, 0);
    /* the slot of T0 is reused 60 s later: it starts over instead of adding to the old second */
    atc_recent_record(r, T0 + 60000, true, 50.0);
    atc_recent_sum(r, T0 + 60000, &s);
    assert_int_equal(s.attempts, 1);
    assert_int_equal(s.errors, 0);
    assert_true(fabs(s.ttft_ms - 50.0) < 0.01);
    /* an hour of silence, then the sum is empty, whatever slots the old seconds filled */
    atc_recent_sum(r, T0 + 3600000, &s);
    assert_int_equal(s.attempts, 0);
}

/* One attempt per 100 ms for two minutes: the window holds the last 60 s of it, 600 attempts. */
static void test_a_steady_rate_reads_as_the_last_minute(void **state)
{
    struct atc_recent *r = fresh();
    struct atc_recent_sum s;
    for (uint64_t t = 0; t < 120000; t += 100)
        atc_recent_record(r, T0 + t, t % 1000 != 0, 20.0); /* one error a second */
    atc_recent_sum(r, T0 + 119999, &s);
    assert_int_equal(s.attempts, 600);
    assert_int_equal(s.errors, 60);
}

static void test_keeps_the_last_changes_oldest_first(void **state)
{
    struct atc_recent *r = fresh();
    struct atc_recent_change ch[ATC_RECENT_CHANGES];
    assert_int_equal(atc_recent_changes(r, ch), 0);
    atc_recent_note_change(r, 10, 0, 1);
    atc_recent_note_change(r, 20, 1, 2);
    assert_int_equal(atc_recent_changes(r, ch), 2);
    assert_int_equal(ch[0].at_ms, 10);
    assert_int_equal(ch[0].from, 0);
    assert_int_equal(ch[1].to, 2);
    for (int i = 0; i < ATC_RECENT_CHANGES + 5; i++)
        atc_recent_note_change(r, 100 + (uint64_t)i, i % 2 + 1, 2 - i % 2);
    assert_int_equal(atc_recent_changes(r, ch), ATC_RECENT_CHANGES);
    assert_int_equal(ch[0].at_ms, 105); /* 2 + 21 noted: the first 7 are forgotten */
    assert_int_equal(ch[ATC_RECENT_CHANGES - 1].at_ms, 100 + ATC_RECENT_CHANGES + 4);
}

/* Two workers recording at once, across second boundaries: every attempt is counted once. */
struct hammer {
    struct atc_recent *r;
    uint64_t start;
};

static void *hammer(void *arg)
{
    const struct hammer *h = arg;
    for (uint64_t i = 0; i < 200000; i++)
        atc_recent_record(h->r, h->start + i / 5000 * 1000, i % 4 != 0, 1.0); /* over 40 s */
    return NULL;
}

static void test_two_threads_lose_no_count(void **state)
{
    struct atc_recent *r = fresh();
    struct hammer h = {r, T0};
    pthread_t a, b;
    assert_int_equal(pthread_create(&a, NULL, hammer, &h), 0);
    assert_int_equal(pthread_create(&b, NULL, hammer, &h), 0);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    struct atc_recent_sum s;
    atc_recent_sum(r, T0 + 39999, &s);
    assert_int_equal(s.attempts, 400000);
    assert_int_equal(s.errors, 100000);
    assert_int_equal(s.ttft_n, 300000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sums_attempts_errors_and_mean_ttft),
        cmocka_unit_test(test_old_seconds_leave_the_window),
        cmocka_unit_test(test_a_steady_rate_reads_as_the_last_minute),
        cmocka_unit_test(test_keeps_the_last_changes_oldest_first),
        cmocka_unit_test(test_two_threads_lose_no_count),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
