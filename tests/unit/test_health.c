/* health.c: what a good answer to a probe is, how a metrics page becomes an endpoint's load, and the
 * state machine of passive ejection, its cap, panic mode and drain, on a fresh event base with the
 * active checks off (the integration tests drive the probes against real servers). */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "../../engine/fleet/health.c"
#include "fleet/health_report.h"

static void test_models_list(void **state)
{
    const char *vllm =
        "{\"object\":\"list\",\"data\":[{\"id\":\"other\",\"object\":\"model\",\"permission\":[{\"id\":"
        "\"llama-3-8b\"}]},{\"object\":\"model\",\"meta\":{\"id\":\"x\"},\"id\":\"llama-3-8b\"}]}";
    assert_null(atc_probe_answer_lists_model(vllm, strlen(vllm), "llama-3-8b"));
    assert_non_null(atc_probe_answer_lists_model(vllm, strlen(vllm), "x")); /* nested, not a model's own id */
    assert_non_null(atc_probe_answer_lists_model(vllm, strlen(vllm), "llama-3-8")); /* whole names only */
    const char *escaped = "{\"data\":[{\"id\":\"meta-llama\\/Llama-3 \\u00e9\\\"q\\\"\"}]}";
    assert_null(atc_probe_answer_lists_model(escaped, strlen(escaped), "meta-llama/Llama-3 \xc3\xa9\"q\""));
    const char *loading = "{\"object\":\"list\",\"data\":[]}";
    assert_string_equal(atc_probe_answer_lists_model(loading, strlen(loading), "m"),
                        "the model list does not name this endpoint's model");
    assert_string_equal(atc_probe_answer_lists_model("{\"models\":[]}", 13, "m"),
                        "the answer has no 'data' list of models");
    assert_string_equal(atc_probe_answer_lists_model("OK", 2, "m"), "the answer is not a JSON object");
    assert_string_equal(atc_probe_answer_lists_model("[1]", 3, "m"), "the answer is not a JSON object");
    assert_string_equal(atc_probe_answer_lists_model("", 0, "m"), "the answer is not a JSON object");
    const char *truncated = "{\"data\":[{\"id\":\"m\"";
    assert_non_null(atc_probe_answer_lists_model(truncated, strlen(truncated), "m"));
}

static void test_inference_answer(void **state)
{
    const char *chat = "{\"id\":\"c\",\"choices\":[{\"message\":{\"content\":\"hi\"}}]}";
    assert_null(atc_probe_answer_inference(chat, strlen(chat)));
    assert_null(atc_probe_answer_inference("{\"data\":[{\"embedding\":[0.1]}]}", 31));
    assert_non_null(atc_probe_answer_inference("{\"error\":{\"message\":\"x\"}}", 25));
    assert_non_null(atc_probe_answer_inference("<html>", 6));
}

static void test_load_from_a_page(void **state)
{
    const char *page = "# TYPE vllm:num_requests_running gauge\n"
                       "vllm:num_requests_running{model_name=\"m\",engine=\"0\"} 3\n"
                       "vllm:num_requests_running{model_name=\"m\",engine=\"1\"} 4\n"
                       "vllm:num_requests_running{model_name=\"other\"} 100\n"
                       "vllm:num_requests_waiting{engine=\"0\"} 2\n"
                       "vllm:num_requests_waiting{engine=\"1\"} NaN\n"
                       "vllm:kv_cache_usage_perc{model_name=\"m\",engine=\"0\"} 0.25\n"
                       "vllm:kv_cache_usage_perc{model_name=\"m\",engine=\"1\"} 0.5\n"
                       "sglang:cache_hit_rate 0.75\n";
    struct atc_server_load load = {.prefix_hit_rate = NAN};
    struct atc_load_counters prev = {0};
    char why[128];
    assert_int_equal(
        atc_load_scrape_page("m", ATC_ENGINE_OPENAI, page, strlen(page), &load, &prev, why, sizeof(why)), 0);
    assert_true(load.running == 7);    /* this model's series, summed */
    assert_true(load.waiting == 2);    /* no model label: every series; NaN skipped */
    assert_true(load.kv_usage == 0.5); /* a share: the fullest engine */
    assert_true(load.prefix_hit_rate == 0.75);
    assert_false(prev.have); /* no prefix cache counters on the page */
    /* vLLM's counters: the hit rate between two pages; a restart (counters going back) starts over */
    const char *p1 = "vllm:prefix_cache_queries_total 100\nvllm:prefix_cache_hits_total 40\n";
    const char *p2 = "vllm:prefix_cache_queries_total 300\nvllm:prefix_cache_hits_total 190\n";
    assert_int_equal(
        atc_load_scrape_page("m", ATC_ENGINE_OPENAI, p1, strlen(p1), &load, &prev, why, sizeof(why)), 0);
    assert_true(load.prefix_hit_rate == 0.75 && isnan(load.running)); /* kept: one page tells no rate */
    assert_int_equal(
        atc_load_scrape_page("m", ATC_ENGINE_OPENAI, p2, strlen(p2), &load, &prev, why, sizeof(why)), 0);
    assert_true(fabs(load.prefix_hit_rate - 0.75) < 1e-9); /* 150 of 200 */
    assert_int_equal(
        atc_load_scrape_page("m", ATC_ENGINE_OPENAI, p1, strlen(p1), &load, &prev, why, sizeof(why)), 0);
    assert_true(fabs(load.prefix_hit_rate - 0.75) < 1e-9 && prev.queries == 100);
    assert_int_equal(atc_load_scrape_page("m", ATC_ENGINE_OPENAI, "x{", 2, &load, &prev, why, sizeof(why)),
                     -1);
    assert_non_null(strstr(why, "malformed metrics page: line 1"));
    /* the KV cache's size: vLLM puts it in an info metric's labels, SGLang in a gauge */
    assert_true(isnan(load.kv_tokens) || load.kv_tokens == 0);
    const char *v =
        "vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",num_gpu_blocks=\"27000\"} 1.0\n";
    assert_int_equal(
        atc_load_scrape_page("m", ATC_ENGINE_OPENAI, v, strlen(v), &load, &prev, why, sizeof(why)), 0);
    assert_true(load.kv_tokens == 432000);
    const char *bad = "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"None\"} 1.0\n";
    assert_int_equal(
        atc_load_scrape_page("m", ATC_ENGINE_OPENAI, bad, strlen(bad), &load, &prev, why, sizeof(why)), 0);
    assert_true(isnan(load.kv_tokens));
    const char *sg = "sglang:max_total_num_tokens{model_name=\"m\"} 900000\n";
    assert_int_equal(
        atc_load_scrape_page("m", ATC_ENGINE_OPENAI, sg, strlen(sg), &load, &prev, why, sizeof(why)), 0);
    assert_true(load.kv_tokens == 900000);
}

/* Each engine's /metrics page as it writes it today, read by its profile; the generic profile reads the
 * names of every engine, old ones too, and an engine profile only its own engine's current names. */
static void test_load_by_engine(void **state)
{
    static const struct {
        unsigned engine;
        const char *page;
        double running, waiting, kv;
    } pages[] = {
        {ATC_ENGINE_VLLM,
         "# TYPE vllm:num_requests_running gauge\n"
         "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 5.0\n"
         "vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 2.0\n"
         "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.4\n",
         5, 2, 0.4},
        {ATC_ENGINE_SGLANG,
         "sglang:num_running_reqs{model_name=\"m\",engine_type=\"unified\",tp_rank=\"0\"} 6.0\n"
         "sglang:num_queue_reqs{model_name=\"m\",engine_type=\"unified\",tp_rank=\"0\"} 3.0\n"
         "sglang:token_usage{model_name=\"m\",engine_type=\"unified\",tp_rank=\"0\"} 0.3\n",
         6, 3, 0.3},
        {ATC_ENGINE_LLAMACPP,
         "# HELP llamacpp:requests_processing Number of requests processing.\n"
         "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 4\n"
         "# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 1\n"
         "llamacpp:n_tokens_max 4096\n",
         4, 1, NAN},
        {ATC_ENGINE_TGI,
         "# TYPE tgi_queue_size gauge\ntgi_queue_size 7\n"
         "# TYPE tgi_batch_current_size gauge\ntgi_batch_current_size 8\ntgi_batch_max_total_tokens 64000\n",
         8, 7, NAN},
    };
    char why[128];
    for (size_t i = 0; i < sizeof(pages) / sizeof(pages[0]); i++) {
        for (unsigned as = 0; as < 2; as++) { /* its own profile, then the generic one */
            struct atc_server_load load = {.prefix_hit_rate = NAN};
            struct atc_load_counters prev = {0};
            const char *pg = pages[i].page;
            unsigned engine = as == 0 ? pages[i].engine : ATC_ENGINE_OPENAI;
            assert_int_equal(
                atc_load_scrape_page("m", engine, pg, strlen(pg), &load, &prev, why, sizeof(why)), 0);
            assert_true(load.running == pages[i].running);
            assert_true(load.waiting == pages[i].waiting);
            assert_true(isnan(pages[i].kv) ? isnan(load.kv_usage) : load.kv_usage == pages[i].kv);
        }
    }
    /* TGI's token budget is its KV cache's size */
    struct atc_server_load load = {.prefix_hit_rate = NAN};
    struct atc_load_counters prev = {0};
    const char *tgi = pages[3].page;
    assert_int_equal(
        atc_load_scrape_page("m", ATC_ENGINE_TGI, tgi, strlen(tgi), &load, &prev, why, sizeof(why)), 0);
    assert_true(load.kv_tokens == 64000);
    /* an engine profile reads its own names only: llama.cpp's old KV gauge, or another engine's names */
    const char *old = "llamacpp:kv_cache_usage_ratio 0.9\nvllm:num_requests_running 3\n";
    assert_int_equal(
        atc_load_scrape_page("m", ATC_ENGINE_LLAMACPP, old, strlen(old), &load, &prev, why, sizeof(why)), 0);
    assert_true(isnan(load.kv_usage) && isnan(load.running));
    assert_int_equal(
        atc_load_scrape_page("m", ATC_ENGINE_OPENAI, old, strlen(old), &load, &prev, why, sizeof(why)), 0);
    assert_true(load.kv_usage == 0.9 && load.running == 3);
}

static void test_jitter_and_ramp(void **state)
{
    struct atc_health h = {.rng = 42};
    for (int i = 0; i < 1000; i++) {
        uint64_t d = jittered(&h, 2000, 0.1);
        assert_true(d >= 1800 && d <= 2200);
    }
    assert_int_equal(jittered(&h, 2000, 0), 2000);
    assert_int_equal(jittered(&h, 0, 0.5), 0);
    struct atc_health_config cfg = {.slow_start_ms = 1000};
    struct hep e = {.cfg = &cfg, .ramp_start_ms = 5000};
    assert_true(fabs(ramp_share(&e, 5000) - SLOW_START_FLOOR) < 1e-9);
    assert_true(fabs(ramp_share(&e, 5500) - 0.55) < 1e-9);
    assert_true(ramp_share(&e, 6000) == 1.0);
    e.ramp_start_ms = 0;
    assert_true(ramp_share(&e, 6000) == 1.0);
}

/* Three endpoints of one model, active checks and scrapes off, ejection after 2 failed requests. */
struct fixture {
    struct event_base *base;
    struct atc_config *cfg;
    struct atc_endpoint_table *table;
    struct atc_health *h;
    struct atc_endpoint *ep[3];
};

static int setup(void **state)
{
    static const char yaml[] =
        "health:\n"
        "  enabled: false\n"
        "  scrape: {enabled: false}\n"
        "  eject: {consecutive_errors: 2, base_time: 1h, max_time: 2h, max_share: 0.5}\n"
        "  slow_start: 0s\n"
        "models:\n"
        "  - name: m\n"
        "    endpoints:\n"
        "      - {id: a, url: \"http://127.0.0.1:1\"}\n"
        "      - {id: b, url: \"http://127.0.0.1:2\"}\n"
        "      - {id: c, url: \"http://127.0.0.1:3\"}\n";
    struct fixture *f = calloc(1, sizeof(*f));
    char *errors = NULL;
    const char *err = NULL;
    assert_int_equal(atc_config_parse(yaml, sizeof(yaml) - 1, "t.yaml", ".", &f->cfg, &errors), 0);
    f->base = event_base_new();
    f->table = atc_endpoint_table_create(f->cfg);
    f->h = atc_health_create(f->base, f->table, f->cfg, NULL, &err);
    assert_non_null(f->h);
    for (int i = 0; i < 3; i++)
        f->ep[i] = f->table->endpoints[i];
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    atc_health_destroy(f->h);
    atc_endpoint_table_destroy(f->table);
    atc_config_free(f->cfg);
    event_base_free(f->base);
    free(f);
    return 0;
}

/* One finished attempt as the relay reports it: into the endpoint's counters, and to health. */
static void outcome(struct atc_endpoint *ep, bool ok, double ttft_ms)
{
    atc_endpoint_record(ep, ok, ttft_ms);
    atc_health_observe(ep, ok);
}

static void test_without_checks_endpoints_are_healthy_at_once(void **state)
{
    struct fixture *f = *state;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(f->ep[i]->health->state, ATC_HEALTH_HEALTHY);
        assert_true(f->ep[i]->routable);
        assert_true(atc_endpoint_available(f->ep[i], 1));
    }
}

static void test_ejection_needs_consecutive_failures_and_is_capped(void **state)
{
    struct fixture *f = *state;
    outcome(f->ep[0], false, -1);
    outcome(f->ep[0], true, 5); /* a success resets the run */
    outcome(f->ep[0], false, -1);
    assert_int_equal(f->ep[0]->health->state, ATC_HEALTH_HEALTHY);
    outcome(f->ep[0], false, -1);
    assert_int_equal(f->ep[0]->health->state, ATC_HEALTH_EJECTED);
    assert_false(f->ep[0]->routable);
    assert_int_equal(atc_health_hep_of(f->ep[0])->ejections_total, 1);
    char err[200];
    assert_true(atc_health_last_error(f->ep[0]->health, err, sizeof(err)) > 0);
    assert_non_null(strstr(err, "ejected for 3600.0s: 2 requests in a row failed"));
    /* 50% of 3 endpoints, rounded down: one ejected at a time. */
    outcome(f->ep[1], false, -1);
    outcome(f->ep[1], false, -1);
    outcome(f->ep[1], false, -1);
    assert_int_equal(f->ep[1]->health->state, ATC_HEALTH_HEALTHY);
    assert_true(f->ep[1]->routable);
    struct atc_health_stats st;
    atc_health_stats(f->h, &st);
    assert_int_equal(st.ejections_total, 1);
    assert_int_equal(st.models_in_panic, 0);
}

static void test_record_alone_does_not_eject(void **state)
{
    struct fixture *f = *state;
    /* The counters are the table's; ejection is health's, told by the caller (on its own thread). */
    for (int i = 0; i < 5; i++)
        atc_endpoint_record(f->ep[0], false, -1);
    assert_int_equal(f->ep[0]->consecutive_errors, 5);
    assert_int_equal(f->ep[0]->health->state, ATC_HEALTH_HEALTHY);
    assert_true(f->ep[0]->routable);
    atc_health_observe(f->ep[0], false);
    atc_health_observe(f->ep[0], false);
    assert_int_equal(f->ep[0]->health->state, ATC_HEALTH_EJECTED);
}

static void test_drain_and_panic(void **state)
{
    struct fixture *f = *state;
    atc_health_set_drained(f->h, f->ep[2], true);
    assert_int_equal(f->ep[2]->health->state, ATC_HEALTH_DRAINING);
    assert_false(f->ep[2]->routable);
    outcome(f->ep[0], false, -1);
    outcome(f->ep[0], false, -1);
    assert_int_equal(f->ep[0]->health->state, ATC_HEALTH_EJECTED);
    /* Mark b out by hand (as its live check would): with a ejected and c drained, nothing is healthy. */
    struct hep *b = atc_health_hep_of(f->ep[1]);
    b->live = ATC_CHECK_FAILED;
    set_state(b, "test");
    assert_int_equal(f->ep[1]->health->state, ATC_HEALTH_UNHEALTHY);
    struct atc_health_stats st;
    atc_health_stats(f->h, &st);
    assert_int_equal(st.models_in_panic, 1);
    assert_int_equal(st.panics_total, 1);
    assert_true(f->ep[0]->routable); /* panic: route_all routes to what is out ... */
    assert_true(f->ep[1]->routable);
    assert_false(f->ep[2]->routable); /* ... but never to a drained endpoint */
    atc_health_set_drained(f->h, f->ep[2], false);
    assert_int_equal(f->ep[2]->health->state, ATC_HEALTH_HEALTHY);
    atc_health_stats(f->h, &st);
    assert_int_equal(st.models_in_panic, 0);
    assert_false(f->ep[0]->routable);
    assert_false(f->ep[1]->routable);
    assert_true(f->ep[2]->routable);
    assert_int_equal(st.state_changes_total, 4);
}

/* Endpoints that join and leave at run time (the admin API, discovery): a removed one is out of routing and
 * out of its model's counts (panic, the ejection cap) at once, its health kept for the workers that may
 * still read it until it is forgotten; an added one starts as at start-up (healthy at once without
 * checks) and counts from then on. */
static void test_endpoints_added_and_removed_at_run_time(void **state)
{
    struct fixture *f = *state;
    atc_health_remove(f->h, f->ep[2], f->cfg);
    assert_false(f->ep[2]->routable);
    assert_non_null(f->ep[2]->health); /* workers may still read it */
    assert_int_equal(f->ep[2]->health->state, ATC_HEALTH_DRAINING);
    assert_int_equal(atc_health_nendpoints(f->h), 2);
    outcome(f->ep[0], false, -1);
    outcome(f->ep[0], false, -1);
    assert_int_equal(f->ep[0]->health->state, ATC_HEALTH_EJECTED); /* 50% of 2: one may be ejected */
    struct hep *b = atc_health_hep_of(f->ep[1]);
    b->live = ATC_CHECK_FAILED;
    set_state(b, "test");
    struct atc_health_stats st;
    atc_health_stats(f->h, &st);
    assert_int_equal(st.models_in_panic, 1); /* a and b out, and c no longer counts */
    atc_health_forget(f->h, f->ep[2]);
    assert_null(f->ep[2]->health);

    struct atc_endpoint *d = atc_endpoint_table_add(f->table, "m", "d", "127.0.0.1", 4, 8);
    const char *err = NULL;
    assert_int_equal(atc_health_add(f->h, d, f->cfg, &err), 0);
    assert_int_equal(d->health->state, ATC_HEALTH_HEALTHY);
    assert_true(d->routable);
    assert_int_equal(atc_health_nendpoints(f->h), 3);
    atc_health_stats(f->h, &st);
    assert_int_equal(st.models_in_panic, 0); /* d is healthy: the model is out of panic */
    assert_false(f->ep[0]->routable);
    struct atc_endpoint *x = atc_endpoint_table_add(f->table, "m", "x", "127.0.0.1", 5, 8);
    free(x->model);
    x->model = strdup("nope");
    assert_int_equal(atc_health_add(f->h, x, f->cfg, &err), -1);
    assert_string_equal(err, "no model with this name");
    assert_null(x->health);
}

/* The text the workers read: what was set, cut to fit either side, "" before anything was set. */
static void test_last_error_text(void **state)
{
    struct atc_endpoint_health pub = {0};
    char out[ATC_HEALTH_TEXT_WORDS * 8 + 16], small[6];
    assert_int_equal(atc_health_last_error(&pub, out, sizeof(out)), 0);
    assert_string_equal(out, "");
    atc_health_text_set(&pub.last_error, "live check: GET /health: answered 500");
    assert_int_equal(atc_health_last_error(&pub, out, sizeof(out)), 37);
    assert_string_equal(out, "live check: GET /health: answered 500");
    assert_int_equal(atc_health_last_error(&pub, small, sizeof(small)), 5);
    assert_string_equal(small, "live ");
    char longer[400];
    memset(longer, 'x', sizeof(longer) - 1);
    longer[sizeof(longer) - 1] = '\0';
    assert_int_equal(
        atc_health_last_error((atc_health_text_set(&pub.last_error, longer), &pub), out, sizeof(out)),
        ATC_HEALTH_TEXT_WORDS * 8 - 1);
    atc_health_text_set(&pub.last_error, "short");
    assert_string_equal((atc_health_last_error(&pub, out, sizeof(out)), out), "short"); /* no tail left */
    assert_int_equal(atomic_load(&pub.last_error.seq) % 2, 0);
}

static void test_json(void **state)
{
    struct fixture *f = *state;
    struct evbuffer *b = evbuffer_new();
    atc_health_endpoint_json(f->ep[0], b);
    atc_health_status_json(f->h, b);
    size_t n = evbuffer_get_length(b);
    char *s = malloc(n + 1);
    evbuffer_remove(b, s, n);
    s[n] = '\0';
    assert_non_null(strstr(s, ",\"state\":\"healthy\",\"live\":true,\"ready\":true,\"deep\":true,"));
    assert_non_null(strstr(s, "\"last_error\":null"));
    assert_non_null(strstr(s, "\"running\":null"));
    assert_non_null(strstr(s, "{\"models\":[{\"name\":\"m\",\"panic\":false,\"panic_mode\":\"route_all\""));
    free(s);
    evbuffer_free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_models_list),
        cmocka_unit_test(test_inference_answer),
        cmocka_unit_test(test_load_from_a_page),
        cmocka_unit_test(test_load_by_engine),
        cmocka_unit_test(test_jitter_and_ramp),
        cmocka_unit_test(test_last_error_text),
        cmocka_unit_test_setup_teardown(test_without_checks_endpoints_are_healthy_at_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ejection_needs_consecutive_failures_and_is_capped, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_record_alone_does_not_eject, setup, teardown),
        cmocka_unit_test_setup_teardown(test_drain_and_panic, setup, teardown),
        cmocka_unit_test_setup_teardown(test_endpoints_added_and_removed_at_run_time, setup, teardown),
        cmocka_unit_test_setup_teardown(test_json, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
