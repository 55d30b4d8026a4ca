/* Per-tenant limits: one-minute windows spent locally, and leases of a shared budget: three limit
 * objects play three replicas against one counter that stands in for Redis's INCRBY. */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cluster/limits.h"
#include "config/config.h"

static char *names[] = {"gold"};
static struct atc_limit_rule rules[] = {{.requests_per_minute = 6, .tokens_per_minute = 1000}};

static struct atc_limits *make(uint64_t default_rpm)
{
    struct atc_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.limits.enabled = true;
    cfg.limits.tenants = names;
    cfg.limits.rules = rules;
    cfg.limits.ntenants = 1;
    cfg.limits.dflt.requests_per_minute = default_rpm;
    struct atc_limits *l = atc_limits_create(&cfg);
    assert_non_null(l);
    return l;
}

static int admit(struct atc_limits *l, const char *tenant, uint64_t tokens, uint64_t now)
{
    struct atc_limit_ticket t;
    enum atc_limit_kind kind;
    return atc_limits_admit(l, tenant, tokens, now, &t, &kind);
}

#define MINUTE 60000ull
#define T0 (1000 * MINUTE + 5000) /* 5 s into a window */

static void test_local_window_admits_the_budget_then_refuses_until_the_next_minute(void **state)
{
    struct atc_limits *l = make(0);
    for (int i = 0; i < 6; i++)
        assert_int_equal(admit(l, "gold", 10, T0 + (uint64_t)i), 0);
    assert_int_equal(admit(l, "gold", 10, T0 + 10), 55); /* Retry-After: the 55 s left */
    assert_int_equal(admit(l, "silver", 10, T0), 0);      /* no default: others are not limited */
    assert_int_equal(admit(l, "gold", 10, T0 + MINUTE), 0); /* a new window */
    atc_limits_destroy(l);
}

static void test_tokens_are_corrected_by_the_usage(void **state)
{
    struct atc_limits *l = make(0);
    struct atc_limit_ticket t;
    enum atc_limit_kind kind;
    assert_int_equal(atc_limits_admit(l, "gold", 900, T0, &t, &kind), 0);
    atc_limits_settle(l, &t, 100); /* the answer used far less than its estimate */
    assert_int_equal(atc_limits_admit(l, "gold", 800, T0, &t, &kind), 0);
    atc_limits_settle(l, &t, 950);
    assert_true(atc_limits_admit(l, "gold", 1, T0, &t, &kind) > 0); /* 1050 spent */
    assert_int_equal(kind, ATC_LIMIT_TOKENS);
    atc_limits_destroy(l);
}

static void test_the_default_applies_to_each_other_tenant_alone(void **state)
{
    struct atc_limits *l = make(2);
    assert_int_equal(admit(l, "a", 1, T0), 0);
    assert_int_equal(admit(l, "a", 1, T0), 0);
    assert_true(admit(l, "a", 1, T0) > 0);
    assert_int_equal(admit(l, "b", 1, T0), 0);
    assert_int_equal(admit(l, NULL, 1, T0), 0); /* anonymous: the tenant "" */
    atc_limits_destroy(l);
}

/* A client rotating tenant names (issue 25 finding 7: 2,000 names took the table, then one overflow
 * budget every other new tenant shared, so each got 429 on its first request for the rest of the
 * minute): a new tenant is still admitted, and a tenant that spent its budget is still refused. */
static void test_rotating_tenant_names_starve_no_other_tenant(void **state)
{
    struct atc_limits *l = make(3);
    for (int i = 0; i < 3; i++)
        assert_int_equal(admit(l, "spent", 1, T0), 0);
    assert_true(admit(l, "spent", 1, T0) > 0);
    int admitted = 0;
    for (int i = 0; i < 1200; i++) {
        char name[32];
        snprintf(name, sizeof(name), "rot-%d", i);
        admitted += admit(l, name, 1, T0 + 1) == 0;
    }
    assert_int_equal(admit(l, "newcomer", 1, T0 + 2), 0); /* 429 before: the overflow budget was spent */
    assert_int_equal(admitted, 1200); /* each name its first request: what any new tenant gets */
    assert_int_equal(admit(l, "newcomer", 1, T0 + 2), 0);
    assert_int_equal(admit(l, "newcomer", 1, T0 + 2), 0);
    assert_true(admit(l, "newcomer", 1, T0 + 2) > 0); /* its own budget, whole */
    assert_true(admit(l, "spent", 1, T0 + 3) > 0);    /* not evicted by names that spent less */
    atc_limits_destroy(l);
}

/* A ticket of a tenant whose slot another name took corrects nothing of the new tenant's. */
static void test_settling_after_eviction_touches_no_other_tenant(void **state)
{
    struct atc_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.limits.dflt.tokens_per_minute = 100;
    struct atc_limits *l = atc_limits_create(&cfg);
    assert_non_null(l);
    struct atc_limit_ticket first, t;
    enum atc_limit_kind kind;
    assert_int_equal(atc_limits_admit(l, "a", 90, T0, &first, &kind), 0);
    /* names until one takes a's slot */
    char name[32];
    for (int i = 0; i < 100000; i++) {
        snprintf(name, sizeof(name), "n-%d", i);
        assert_int_equal(atc_limits_admit(l, name, 100, T0, &t, &kind), 0); /* its budget, all of it */
        if (t.slot == first.slot)
            break;
    }
    assert_int_equal(t.slot, first.slot);
    atc_limits_settle(l, &first, 0); /* a's answer used nothing: must not give the new tenant 90 back */
    assert_true(atc_limits_admit(l, name, 1, T0, &t, &kind) > 0);
    assert_int_equal(kind, ATC_LIMIT_TOKENS);
    atc_limits_destroy(l);
}

/* Sends every due refill of @p l to the counters, as cluster.c does with INCRBY. */
static void sync_one(struct atc_limits *l, int64_t *counter, uint64_t now)
{
    struct atc_limit_refill rf[8];
    size_t n = atc_limits_refills(l, now, rf, 8);
    for (size_t i = 0; i < n; i++) {
        counter[rf[i].kind] += (int64_t)rf[i].amount;
        atc_limits_refilled(l, &rf[i], counter[rf[i].kind]);
    }
}

static void test_three_replicas_admit_the_budget_once_between_them(void **state)
{
    struct atc_limits *r[3] = {make(0), make(0), make(0)};
    int64_t counter[2] = {0, 0};
    for (int i = 0; i < 3; i++)
        atc_limits_set_shared(r[i], true, 3);
    int admitted = 0;
    for (int k = 0; k < 30; k++) {
        struct atc_limits *l = r[k % 3];
        if (admit(l, "gold", 1, T0 + (uint64_t)k) == 0)
            admitted++;
        sync_one(l, counter, T0 + (uint64_t)k);
    }
    assert_int_equal(admitted, 6);
    assert_true(counter[ATC_LIMIT_REQUESTS] >= 6);
    for (int i = 0; i < 3; i++)
        atc_limits_destroy(r[i]);
}

static void test_a_failed_refill_is_sent_again(void **state)
{
    struct atc_limits *l = make(0);
    atc_limits_set_shared(l, true, 1);
    assert_int_equal(admit(l, "gold", 1, T0), 0); /* the credit of one chunk */
    struct atc_limit_refill rf[4];
    size_t n = atc_limits_refills(l, T0, rf, 4);
    assert_true(n >= 1);
    uint64_t amount = rf[0].amount;
    for (size_t i = 0; i < n; i++)
        atc_limits_refilled(l, &rf[i], -1); /* Redis went away */
    n = atc_limits_refills(l, T0, rf, 4);
    assert_true(n >= 1);
    assert_int_equal(rf[0].amount, amount);
    atc_limits_destroy(l);
}

static void test_spending_in_local_mode_is_reported_on_return(void **state)
{
    struct atc_limits *l = make(0);
    for (int i = 0; i < 4; i++)
        assert_int_equal(admit(l, "gold", 1, T0), 0);
    atc_limits_set_shared(l, true, 1);
    struct atc_limit_refill rf[4];
    size_t n = atc_limits_refills(l, T0, rf, 4);
    assert_true(n >= 1);
    assert_int_equal(rf[0].kind, ATC_LIMIT_REQUESTS);
    assert_true(rf[0].amount >= 4); /* the debt, then a chunk */
    atc_limits_destroy(l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_local_window_admits_the_budget_then_refuses_until_the_next_minute),
        cmocka_unit_test(test_tokens_are_corrected_by_the_usage),
        cmocka_unit_test(test_the_default_applies_to_each_other_tenant_alone),
        cmocka_unit_test(test_rotating_tenant_names_starve_no_other_tenant),
        cmocka_unit_test(test_settling_after_eviction_touches_no_other_tenant),
        cmocka_unit_test(test_three_replicas_admit_the_budget_once_between_them),
        cmocka_unit_test(test_a_failed_refill_is_sent_again),
        cmocka_unit_test(test_spending_in_local_mode_is_reported_on_return),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
