/* Shared load: a replica's text, the sum of the others' figures into the endpoints' remote part, and
 * figures that stop changing ageing out. */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cluster/load_share.h"
#include "config/config.h"
#include "fleet/endpoint.h"

static struct atc_endpoint_table *table(void)
{
    static struct atc_endpoint_config eps[2] = {
        {.id = "a", .url = "http://127.0.0.1:1", .host = "127.0.0.1", .port = 1, .capacity = 8, .weight = 1},
        {.id = "b", .url = "http://127.0.0.1:2", .host = "127.0.0.1", .port = 2, .capacity = 8, .weight = 1},
    };
    static struct atc_model_config model = {.name = "m", .endpoints = eps, .nendpoints = 2};
    struct atc_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.models = &model;
    cfg.nmodels = 1;
    atc_signal_params_init(&cfg.signals);
    struct atc_endpoint_table *t = atc_endpoint_table_create(&cfg);
    assert_non_null(t);
    return t;
}

static void test_the_others_figures_are_summed_and_their_own_skipped(void **state)
{
    struct atc_endpoint_table *t = table();
    struct atc_load_share *s = atc_load_share_create("self");
    const char *r1 = "atc1 7\n3 300 1000 2 1 50.0 a\n1 10 0 0 1 0.0 b\n";
    const char *r2 = "atc1 1\n2 200 500 1 1 25.5 a\n4 40 7 0 0 0.0 unknown-endpoint\n";
    const char *me = "atc1 9\n100 100 100 100 100 100 a\n";
    assert_int_equal(atc_load_share_update(s, "r1", 2, r1, strlen(r1), 1000), 0);
    assert_int_equal(atc_load_share_update(s, "r2", 2, r2, strlen(r2), 1000), 0);
    assert_int_equal(atc_load_share_update(s, "self", 4, me, strlen(me), 1000), 0);
    assert_int_equal(atc_load_share_update(s, "bad", 3, "garbage", 7, 1000), -1);
    assert_int_equal(atc_load_share_apply(s, t, 1010, 400), 2);
    struct atc_endpoint *a = atc_endpoint_table_find(t, "a"), *b = atc_endpoint_table_find(t, "b");
    assert_int_equal(a->remote.inflight, 5);
    assert_int_equal(a->remote.tokens, 500);
    assert_int_equal(a->remote.prefill_tokens, 1500);
    assert_int_equal(a->remote.prefilling, 3);
    assert_int_equal(a->remote.decoding, 2);
    assert_true(a->remote.recent_tokens > 75 && a->remote.recent_tokens < 76);
    assert_int_equal(a->remote.at_ms, 1000);
    assert_int_equal(b->remote.inflight, 1);
    a->inflight = 2;
    assert_int_equal(atc_endpoint_fleet_inflight(a), 7);
    atc_load_share_destroy(s);
    atc_endpoint_table_destroy(t);
}

static void test_a_replica_that_stops_publishing_ages_out(void **state)
{
    struct atc_endpoint_table *t = table();
    struct atc_load_share *s = atc_load_share_create("self");
    const char *r1 = "atc1 1\n3 300 0 0 0 0.0 a\n";
    const char *r2 = "atc1 1\n2 200 0 0 0 0.0 a\n", *r2b = "atc1 2\n1 100 0 0 0 0.0 a\n";
    atc_load_share_update(s, "r1", 2, r1, strlen(r1), 1000);
    atc_load_share_update(s, "r2", 2, r2, strlen(r2), 1000);
    /* later: r1 republishes the same seq (it stopped), r2 a new one */
    atc_load_share_update(s, "r1", 2, r1, strlen(r1), 1500);
    atc_load_share_update(s, "r2", 2, r2b, strlen(r2b), 1500);
    assert_int_equal(atc_load_share_apply(s, t, 1500, 400), 1);
    struct atc_endpoint *a = atc_endpoint_table_find(t, "a");
    assert_int_equal(a->remote.inflight, 1);
    assert_int_equal(a->remote.at_ms, 1500);
    assert_int_equal(atc_load_share_apply(s, t, 2000, 400), 0);
    assert_int_equal(a->remote.inflight, 0);
    assert_int_equal(a->remote.at_ms, 0); /* nil age: nothing summed */
    atc_load_share_destroy(s);
    atc_endpoint_table_destroy(t);
}

static void test_the_text_round_trips(void **state)
{
    struct atc_endpoint_table *t = table(), *u = table();
    struct atc_endpoint *a = atc_endpoint_table_find(t, "a");
    a->inflight = 4;
    a->inflight_tokens = 4096;
    a->sig.prefill_tokens = 333;
    size_t len;
    char *text = atc_load_share_encode(t, 5, 0, &len);
    assert_non_null(text);
    struct atc_load_share *s = atc_load_share_create("self");
    assert_int_equal(atc_load_share_update(s, "r", 1, text, len, 10), 0);
    atc_load_share_apply(s, u, 10, 100);
    struct atc_endpoint *ua = atc_endpoint_table_find(u, "a");
    assert_int_equal(ua->remote.inflight, 4);
    assert_int_equal(ua->remote.tokens, 4096);
    assert_int_equal(ua->remote.prefill_tokens, 333);
    atc_load_share_clear(u);
    assert_int_equal(ua->remote.inflight, 0);
    free(text);
    atc_load_share_destroy(s);
    atc_endpoint_table_destroy(t);
    atc_endpoint_table_destroy(u);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_others_figures_are_summed_and_their_own_skipped),
        cmocka_unit_test(test_a_replica_that_stops_publishing_ages_out),
        cmocka_unit_test(test_the_text_round_trips),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
