/* admission.c: the one view (admin JSON, Prometheus text) over the admissions of several workers: for
 * one admission exactly what it holds, for several their sum, queues merged by model. */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "fleet/admission.h"

static bool place; /* what try_place answers */

static bool try_place(void *owner)
{
    return place;
}

static void expired(void *owner, uint64_t waited_ms)
{
    fail_msg("no deadline passes in these tests");
}

static const struct atc_admission_callbacks callbacks = {try_place, expired};

static struct atc_admission *admission(struct event_base *base)
{
    struct atc_admission_settings s = {.max_queue = 3, .deadline_ms = 60000, .max_deadline_ms = 60000};
    struct atc_admission *adm = atc_admission_create(base, &s, &callbacks);
    assert_non_null(adm);
    return adm;
}

/* Queues @p it for @p model at @p priority, as if it had arrived @p age_ms ago. */
static void enqueue(struct atc_admission *adm, struct atc_queue_item *it, const char *model, int priority,
                    uint64_t age_ms)
{
    memset(it, 0, sizeof(*it));
    snprintf(it->model, sizeof(it->model), "%s", model);
    snprintf(it->tenant, sizeof(it->tenant), "t");
    it->priority = priority;
    assert_int_equal(atc_admission_enqueue(adm, it, 0), 0);
    it->enqueued_ms -= age_ms;
}

/* @p b's text with every "oldest_ms":N replaced by "oldest_ms":# once N is checked to be in [lo, lo + 50]:
 * the wait is measured against the clock, so its last digits are not the test's. */
static char *text_of(struct evbuffer *b, const uint64_t *lo, size_t nlo)
{
    size_t len = evbuffer_get_length(b);
    char *s = calloc(1, len + 1);
    evbuffer_remove(b, s, len);
    char *w = s;
    size_t k = 0;
    for (const char *r = s; *r != '\0';) {
        static const char key[] = "\"oldest_ms\":";
        if (strncmp(r, key, sizeof(key) - 1) == 0) {
            r += sizeof(key) - 1;
            char *end;
            unsigned long long v = strtoull(r, &end, 10);
            assert_true(k < nlo);
            assert_in_range(v, lo[k], lo[k] + 50);
            k++;
            memcpy(w, key, sizeof(key) - 1); /* with '#', no longer than what it replaces */
            w += sizeof(key) - 1;
            *w++ = '#';
            r = end;
        } else {
            *w++ = *r++;
        }
    }
    *w = '\0';
    assert_int_equal(k, nlo);
    return s;
}

static void test_one_admission_as_it_is(void **state)
{
    struct event_base *base = event_base_new();
    struct atc_admission *adm = admission(base);
    struct atc_queue_item it[5];
    enqueue(adm, &it[0], "m", 3, 200);
    enqueue(adm, &it[1], "m", 12, 0);      /* above the top: counted at 9 */
    enqueue(adm, &it[2], "a\"b", -1, 700); /* below 0: counted at 0 */
    enqueue(adm, &it[3], "m", 3, 0);
    struct atc_queue_item full;
    memset(&full, 0, sizeof(full));
    snprintf(full.model, sizeof(full.model), "m");
    assert_int_equal(atc_admission_enqueue(adm, &full, 0), -1); /* max_queue 3 */
    atc_admission_remove(adm, &it[3]);
    atc_admission_count_direct(adm);
    atc_admission_count_direct(adm);

    struct evbuffer *b = evbuffer_new();
    atc_admission_status_json(&adm, 1, b);
    const uint64_t oldest[] = {700, 200}; /* newest queue first, as the admission lists them */
    char *json = text_of(b, oldest, 2);
    assert_string_equal(
        json, "{\"waiting\":3,\"models\":["
              "{\"model\":\"a\\\"b\",\"waiting\":1,\"oldest_ms\":#,\"by_priority\":[1,0,0,0,0,0,0,0,0,0]},"
              "{\"model\":\"m\",\"waiting\":2,\"oldest_ms\":#,\"by_priority\":[0,0,0,1,0,0,0,0,0,1]}],"
              "\"admitted_direct\":2,\"admitted_queued\":0,\"shed_queue_full\":1,\"shed_deadline\":0,"
              "\"left_queue\":1,\"wait_ms_sum\":0,\"wait_ms_buckets\":{\"1\":0,\"5\":0,\"10\":0,\"50\":0,"
              "\"100\":0,\"500\":0,\"1000\":0,\"5000\":0,\"10000\":0,\"30000\":0,\"60000\":0,\"+Inf\":0}}");
    free(json);

    atc_admission_metrics(&adm, 1, b);
    json = text_of(b, NULL, 0);
    assert_non_null(strstr(json, "# TYPE atc_queue_waiting_requests gauge\n"
                                 "atc_queue_waiting_requests{model=\"a\\\"b\",priority=\"0\"} 1\n"));
    assert_non_null(strstr(json, "atc_queue_waiting_requests{model=\"m\",priority=\"3\"} 1\n"
                                 "atc_queue_waiting_requests{model=\"m\",priority=\"4\"} 0\n"));
    assert_non_null(strstr(json, "atc_queue_waiting_requests{model=\"m\",priority=\"9\"} 1\n"
                                 "# HELP atc_queue_wait_seconds"));
    assert_non_null(
        strstr(json, "atc_admitted_total{how=\"direct\"} 2\natc_admitted_total{how=\"queued\"} 0\n"));
    assert_non_null(strstr(json, "atc_shed_total{reason=\"queue_full\"} 1\n"));
    assert_non_null(strstr(json, "atc_shed_total{reason=\"client_left\"} 1\n"));
    free(json);

    evbuffer_free(b);
    atc_admission_destroy(adm);
    event_base_free(base);
}

static size_t count(const char *s, const char *what)
{
    size_t n = 0;
    for (; (s = strstr(s, what)) != NULL; s++)
        n++;
    return n;
}

static void test_several_admissions_summed(void **state)
{
    struct event_base *base = event_base_new();
    struct atc_admission *adms[2] = {admission(base), admission(base)};
    struct atc_queue_item a[3], b[2];
    enqueue(adms[0], &a[0], "m", 1, 200);
    enqueue(adms[0], &a[1], "m", 5, 20); /* waits well inside their buckets: a slow machine adds ms */
    enqueue(adms[0], &a[2], "x", 0, 20);
    enqueue(adms[1], &b[0], "y", 2, 20);
    enqueue(adms[1], &b[1], "m", 5, 700); /* the oldest of m's waits is in the second admission */
    atc_admission_count_direct(adms[0]);
    atc_admission_count_direct(adms[1]);
    atc_admission_count_direct(adms[1]);

    struct evbuffer *out = evbuffer_new();
    atc_admission_status_json(adms, 2, out);
    const uint64_t oldest[] = {20, 700, 20};
    char *json = text_of(out, oldest, 3);
    /* The first admission's queues in its order (x, m), then what only the second has (y); m once. */
    assert_string_equal(
        json, "{\"waiting\":5,\"models\":["
              "{\"model\":\"x\",\"waiting\":1,\"oldest_ms\":#,\"by_priority\":[1,0,0,0,0,0,0,0,0,0]},"
              "{\"model\":\"m\",\"waiting\":3,\"oldest_ms\":#,\"by_priority\":[0,1,0,0,0,2,0,0,0,0]},"
              "{\"model\":\"y\",\"waiting\":1,\"oldest_ms\":#,\"by_priority\":[0,0,1,0,0,0,0,0,0,0]}],"
              "\"admitted_direct\":3,\"admitted_queued\":0,\"shed_queue_full\":0,\"shed_deadline\":0,"
              "\"left_queue\":0,\"wait_ms_sum\":0,\"wait_ms_buckets\":{\"1\":0,\"5\":0,\"10\":0,\"50\":0,"
              "\"100\":0,\"500\":0,\"1000\":0,\"5000\":0,\"10000\":0,\"30000\":0,\"60000\":0,\"+Inf\":0}}");
    free(json);

    /* Everything placed: waits land in the buckets of both admissions and add up. */
    place = true;
    atc_admission_kick(adms[0]);
    atc_admission_kick(adms[1]);
    place = false;
    atc_admission_status_json(adms, 2, out);
    json = text_of(out, (const uint64_t[]){0, 0, 0}, 3);
    assert_non_null(strstr(json, "{\"waiting\":0,"));
    assert_non_null(strstr(json, "\"admitted_direct\":3,\"admitted_queued\":5,"));
    /* Waits of 20, 20, 20, 200 and 700 ms (give or take the test's own run time). */
    assert_non_null(strstr(json, "\"wait_ms_buckets\":{\"1\":0,\"5\":0,\"10\":0,\"50\":3,\"100\":0,"
                                 "\"500\":1,\"1000\":1,\"5000\":0,"));
    assert_non_null(strstr(json, "\"+Inf\":0}}"));
    uint64_t sum = strtoull(strstr(json, "\"wait_ms_sum\":") + 14, NULL, 10);
    assert_in_range(sum, 960, 1010);
    free(json);

    atc_admission_metrics(adms, 2, out);
    json = text_of(out, NULL, 0);
    assert_int_equal(count(json, "atc_queue_waiting_requests{model=\"m\",priority=\"5\"} 0\n"), 1);
    assert_int_equal(count(json, "atc_queue_waiting_requests{"), 30); /* 3 models x 10 priorities */
    assert_non_null(strstr(json, "atc_queue_wait_seconds_bucket{le=\"0.01\"} 0\n"
                                 "atc_queue_wait_seconds_bucket{le=\"0.05\"} 3\n"));
    assert_non_null(strstr(json, "atc_queue_wait_seconds_bucket{le=\"0.5\"} 4\n"
                                 "atc_queue_wait_seconds_bucket{le=\"1\"} 5\n"));
    assert_non_null(strstr(json, "atc_queue_wait_seconds_bucket{le=\"+Inf\"} 5\n"));
    assert_non_null(strstr(json, "atc_queue_wait_seconds_count 5\n"));
    assert_non_null(
        strstr(json, "atc_admitted_total{how=\"direct\"} 3\natc_admitted_total{how=\"queued\"} 5\n"));
    free(json);

    /* No admission at all: an empty view. */
    atc_admission_status_json(adms, 0, out);
    json = text_of(out, NULL, 0);
    assert_non_null(strstr(json, "{\"waiting\":0,\"models\":[],\"admitted_direct\":0,"));
    free(json);

    evbuffer_free(out);
    atc_admission_destroy(adms[0]);
    atc_admission_destroy(adms[1]);
    event_base_free(base);
}

/* The process-wide limit holds while a worker tries to place its head and fails: the head keeps its
 * place (it used to give it up during the try, so another worker queued one past the limit). */
static void test_a_failed_placement_keeps_the_shared_place(void **state)
{
    struct event_base *base = event_base_new();
    struct atc_admission_shared *sh = atc_admission_shared_create();
    struct atc_admission_settings s = {.max_queue = 1, .shared = sh, .deadline_ms = 60000,
                                       .max_deadline_ms = 60000};
    struct atc_admission *a = atc_admission_create(base, &s, &callbacks),
                         *b = atc_admission_create(base, &s, &callbacks);
    assert_true(a != NULL && b != NULL && sh != NULL);
    struct atc_queue_item first, second, third;
    enqueue(a, &first, "m", 0, 0);
    memset(&second, 0, sizeof(second));
    snprintf(second.model, sizeof(second.model), "m");
    assert_int_equal(atc_admission_enqueue(b, &second, 0), -1); /* the one place is a's */
    place = false;
    atc_admission_kick(a); /* no room: first goes back in line */
    assert_int_equal(atc_admission_waiting(a), 1);
    assert_int_equal(atc_admission_enqueue(b, &second, 0), -1); /* and still holds the place */
    place = true;
    atc_admission_kick(a); /* placed: the place is free */
    assert_int_equal(atc_admission_waiting(a), 0);
    enqueue(b, &third, "m", 0, 0);
    atc_admission_destroy(a);
    atc_admission_destroy(b);
    atc_admission_shared_destroy(sh);
    event_base_free(base);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_admission_as_it_is),
        cmocka_unit_test(test_several_admissions_summed),
        cmocka_unit_test(test_a_failed_placement_keeps_the_shared_place),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
