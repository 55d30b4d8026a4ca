/* The endpoint table's accounting and the built-in C balancer. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "fleet/balancer.h"
#include "config/config.h"
#include "fleet/endpoint.h"

static struct atc_endpoint_table *three_endpoints(void)
{
    static struct atc_config cfg;
    static struct atc_model_config model = {.name = "m"};
    memset(&cfg, 0, sizeof(cfg));
    cfg.models = &model;
    cfg.nmodels = 1;
    struct atc_endpoint_table *t = atc_endpoint_table_create(&cfg);
    assert_non_null(t);
    assert_non_null(atc_endpoint_table_add(t, "m", "a", "127.0.0.1", 9001, 2));
    assert_non_null(atc_endpoint_table_add(t, "m", "b", "127.0.0.1", 9002, 2));
    assert_non_null(atc_endpoint_table_add(t, "m", "c", "127.0.0.1", 9003, 4));
    return t;
}

static void test_acquire_release_counts(void **state)
{
    struct atc_endpoint_table *t = three_endpoints();
    struct atc_endpoint *a = atc_endpoint_table_find(t, "a");
    assert_non_null(a);
    assert_string_equal(a->url, "http://127.0.0.1:9001");
    atc_endpoint_acquire(a, 100);
    atc_endpoint_acquire(a, 50);
    assert_int_equal(a->inflight, 2);
    assert_int_equal(a->inflight_tokens, 150);
    assert_false(atc_endpoint_available(a, 0)); /* capacity 2 */
    atc_endpoint_release(a, 100);
    assert_int_equal(a->inflight, 1);
    assert_int_equal(a->inflight_tokens, 50);
    assert_true(atc_endpoint_available(a, 0));
    atc_endpoint_release(a, 50);
    atc_endpoint_release(a, 50); /* one too many: saturates instead of wrapping */
    assert_int_equal(a->inflight, 0);
    assert_int_equal(a->inflight_tokens, 0);
    atc_endpoint_table_destroy(t);
}

static void test_record_errors_and_ttft_ewma(void **state)
{
    struct atc_endpoint_table *t = three_endpoints();
    struct atc_endpoint *b = atc_endpoint_table_find(t, "b");
    atc_endpoint_record(b, false, -1);
    atc_endpoint_record(b, false, -1);
    assert_int_equal(b->errors_total, 2);
    assert_int_equal(b->consecutive_errors, 2);
    atc_endpoint_record(b, true, 100.0);
    assert_int_equal(b->consecutive_errors, 0);
    assert_true(b->ttft_ewma_ms == 100.0); /* the first sample is taken as is */
    atc_endpoint_record(b, true, 200.0);
    assert_true(b->ttft_ewma_ms > 100.0 && b->ttft_ewma_ms < 200.0);
    assert_int_equal(b->requests_total, 4);
    atc_endpoint_table_destroy(t);
}

static void test_token_budget(void **state)
{
    struct atc_endpoint_table *t = three_endpoints();
    struct atc_endpoint *a = atc_endpoint_table_find(t, "a");
    a->token_budget = 1000;
    assert_true(atc_endpoint_available(a, 5000)); /* idle: any request fits */
    atc_endpoint_acquire(a, 600);
    assert_true(atc_endpoint_available(a, 400));
    assert_false(atc_endpoint_available(a, 401)); /* over the budget with this request */
    atc_endpoint_release(a, 600);
    /* the server's own queue, as scraped, can mark it full too */
    a->max_server_queue = 4;
    a->server_queue = 3;
    assert_true(atc_endpoint_available(a, 0));
    a->server_queue = 4;
    assert_false(atc_endpoint_available(a, 0));
    atc_endpoint_table_destroy(t);
}

static void test_model_lookup(void **state)
{
    struct atc_endpoint_table *t = three_endpoints();
    assert_non_null(atc_endpoint_table_model(t, "m", 1));
    assert_null(atc_endpoint_table_model(t, "mm", 2));
    assert_null(atc_endpoint_table_model(t, "", 0));
    assert_int_equal(atc_endpoint_table_model(t, "m", 1)->nendpoints, 3);
    assert_null(atc_endpoint_table_add(t, "nope", "x", "127.0.0.1", 1, 1));
    atc_endpoint_table_destroy(t);
}

static void test_balancer_prefers_the_less_loaded(void **state)
{
    struct atc_endpoint_table *t = three_endpoints();
    struct atc_model *m = atc_endpoint_table_model(t, "m", 1);
    struct atc_endpoint *a = atc_endpoint_table_find(t, "a"), *c = atc_endpoint_table_find(t, "c");
    atc_endpoint_acquire(a, 1);
    atc_endpoint_acquire(c, 1);
    atc_endpoint_acquire(c, 1); /* a: 1/2, b: 0/2, c: 2/4 */
    uint64_t rng = 42;
    int picks[3] = {0};
    for (int i = 0; i < 3000; i++)
        picks[atc_balancer_pick(m, &rng, NULL, 0, 0)->index]++;
    /* b is idle: it wins every pair it is in, which is two pairs of three. */
    assert_true(picks[1] > 1800);
    assert_true(picks[0] > 0 && picks[2] > 0);
    atc_endpoint_table_destroy(t);
}

static void test_balancer_skips_full_excluded_and_unroutable(void **state)
{
    struct atc_endpoint_table *t = three_endpoints();
    struct atc_model *m = atc_endpoint_table_model(t, "m", 1);
    struct atc_endpoint *a = atc_endpoint_table_find(t, "a"), *b = atc_endpoint_table_find(t, "b"),
                        *c = atc_endpoint_table_find(t, "c");
    atc_endpoint_acquire(a, 1);
    atc_endpoint_acquire(a, 1); /* full */
    b->routable = false;
    uint64_t rng = 7;
    for (int i = 0; i < 100; i++)
        assert_ptr_equal(atc_balancer_pick(m, &rng, NULL, 0, 0), c);
    struct atc_endpoint *exclude[] = {c};
    assert_null(atc_balancer_pick(m, &rng, exclude, 1, 0));
    b->routable = true;
    assert_ptr_equal(atc_balancer_pick(m, &rng, exclude, 1, 0), b);
    atc_endpoint_table_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_acquire_release_counts),
        cmocka_unit_test(test_record_errors_and_ttft_ewma),
        cmocka_unit_test(test_model_lookup),
        cmocka_unit_test(test_token_budget),
        cmocka_unit_test(test_balancer_prefers_the_less_loaded),
        cmocka_unit_test(test_balancer_skips_full_excluded_and_unroutable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
