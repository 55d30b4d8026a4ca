/* Power of two choices (atc_balancer_p2c): the one choice both the built-in balancer and atc.p2c make. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdint.h>

#include <cmocka.h>

#include "fleet/balancer.h"

struct pool {
    bool usable[8];
    int load[8];
};

static bool usable(void *ctx, size_t i)
{
    return ((struct pool *)ctx)->usable[i];
}

static bool lighter(void *ctx, size_t a, size_t b)
{
    struct pool *p = ctx;
    return p->load[a] < p->load[b];
}

static void test_none_usable_is_minus_one(void **state)
{
    struct pool p = {{false, false, false}, {0}};
    uint64_t rng = 1;
    assert_int_equal(atc_balancer_p2c(3, &rng, usable, lighter, &p), -1);
    assert_int_equal(atc_balancer_p2c(0, &rng, usable, lighter, &p), -1);
}

static void test_one_usable_is_always_it(void **state)
{
    struct pool p = {{false, true, false}, {0, 9, 0}};
    uint64_t rng = 7;
    for (int i = 0; i < 100; i++)
        assert_int_equal(atc_balancer_p2c(3, &rng, usable, lighter, &p), 1);
}

static void test_two_usable_the_lighter_always_wins(void **state)
{
    struct pool p = {{true, false, true, false}, {5, 0, 2, 0}};
    uint64_t rng = 3;
    for (int i = 0; i < 100; i++)
        assert_int_equal(atc_balancer_p2c(4, &rng, usable, lighter, &p), 2);
}

static void test_many_usable_never_the_heaviest_and_all_others_picked(void **state)
{
    /* Of two distinct draws the lighter wins: the heaviest never does, every other one sometimes. */
    struct pool p = {{true, true, true, true, false}, {1, 2, 3, 4, 0}};
    uint64_t rng = 11;
    int counts[5] = {0};
    for (int i = 0; i < 4000; i++) {
        long k = atc_balancer_p2c(5, &rng, usable, lighter, &p);
        assert_true(k >= 0 && k < 4);
        counts[k]++;
    }
    assert_int_equal(counts[3], 0);
    assert_true(counts[0] > counts[1] && counts[1] > counts[2] && counts[2] > 0);
    /* Exact shares: P(pick i) = (number of heavier ones) / C(4,2) = 3/6, 2/6, 1/6. */
    assert_true(counts[0] > 1800 && counts[0] < 2200);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_none_usable_is_minus_one),
        cmocka_unit_test(test_one_usable_is_always_it),
        cmocka_unit_test(test_two_usable_the_lighter_always_wins),
        cmocka_unit_test(test_many_usable_never_the_heaviest_and_all_others_picked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
