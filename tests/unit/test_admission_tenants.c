/* admission.c's tenant records: bounded by what waits, whatever names clients send (x-atc-tenant is
 * the client's to choose); configured tenants kept with their weights. Includes admission.c to count
 * its records. */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "../../engine/fleet/admission.c"

static bool place;

static bool try_place(void *owner)
{
    return place;
}

static void expired(void *owner, uint64_t waited_ms)
{
}

static const struct atc_admission_callbacks callbacks = {try_place, expired};

static size_t ntenants(const struct atc_admission *adm)
{
    size_t n = 0;
    for (const struct tenant *t = adm->tenants; t != NULL; t = t->next)
        n++;
    return n;
}

static struct atc_admission *admission(struct event_base *base, const char *const *names,
                                       const unsigned *weights, size_t n)
{
    struct atc_admission_settings s = {.max_queue = 3, .deadline_ms = 60000, .max_deadline_ms = 60000,
                                       .tenants = names, .weights = weights, .ntenants = n};
    struct atc_admission *adm = atc_admission_create(base, &s, &callbacks);
    assert_non_null(adm);
    return adm;
}

static int enqueue(struct atc_admission *adm, struct atc_queue_item *it, const char *tenant)
{
    memset(it, 0, sizeof(*it));
    snprintf(it->model, sizeof(it->model), "m");
    snprintf(it->tenant, sizeof(it->tenant), "%s", tenant);
    return atc_admission_enqueue(adm, it, 0);
}

static void test_shed_requests_leave_no_tenant_behind(void **state)
{
    struct event_base *base = event_base_new();
    struct atc_admission *adm = admission(base, NULL, NULL, 0);
    struct atc_queue_item full[3], it;
    for (int i = 0; i < 3; i++)
        assert_int_equal(enqueue(adm, &full[i], "a"), 0);
    char name[32];
    for (int i = 0; i < 100000; i++) {
        snprintf(name, sizeof(name), "client-%d", i);
        assert_int_equal(enqueue(adm, &it, name), -1); /* the queue is full: shed */
    }
    assert_int_equal(ntenants(adm), 1);
    atc_admission_destroy(adm);
    event_base_free(base);
}

static void test_placed_and_departed_tenants_are_forgotten(void **state)
{
    struct event_base *base = event_base_new();
    const char *const names[] = {"gold"};
    const unsigned weights[] = {4};
    struct atc_admission *adm = admission(base, names, weights, 1);
    struct atc_queue_item a, b, c;
    place = false;
    assert_int_equal(enqueue(adm, &a, "gold"), 0);
    assert_int_equal(enqueue(adm, &b, "x-1"), 0);
    assert_int_equal(enqueue(adm, &c, "x-2"), 0);
    assert_int_equal(ntenants(adm), 3);
    atc_admission_remove(adm, &c); /* its client left */
    assert_int_equal(ntenants(adm), 2);
    atc_admission_kick(adm); /* no room: all stay */
    assert_int_equal(ntenants(adm), 2);
    place = true;
    atc_admission_kick(adm); /* placed */
    assert_int_equal(atc_admission_waiting(adm), 0);
    assert_int_equal(ntenants(adm), 1); /* gold, configured, is kept with its weight */
    assert_string_equal(adm->tenants->name, "gold");
    assert_int_equal(adm->tenants->weight, 4);
    atc_admission_destroy(adm);
    event_base_free(base);
}

static void test_a_long_name_finds_its_own_record(void **state)
{
    struct event_base *base = event_base_new();
    struct atc_admission *adm = admission(base, NULL, NULL, 0);
    char name[63 + 1];
    memset(name, 'n', sizeof(name) - 1);
    name[sizeof(name) - 1] = '\0';
    struct atc_queue_item a, b;
    place = false;
    assert_int_equal(enqueue(adm, &a, name), 0);
    assert_int_equal(enqueue(adm, &b, name), 0);
    assert_int_equal(ntenants(adm), 1);
    atc_admission_destroy(adm);
    event_base_free(base);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shed_requests_leave_no_tenant_behind),
        cmocka_unit_test(test_placed_and_departed_tenants_are_forgotten),
        cmocka_unit_test(test_a_long_name_finds_its_own_record),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
