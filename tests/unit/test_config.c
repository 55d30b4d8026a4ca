/* config.c: YAML → struct atc_config, and every error as "file:line:col: key 'x': reason". */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/config.h"
#include "config/roles.h"
#include "config/engine_profile.h"
#include "base/config_value.h"

/* A valid models: block, appended to files whose other lines are under test; it starts on the line
 * after them, so the lines of the bad values stay easy to count. */
#define MODELS                                                                                               \
    "models:\n"                                                                                              \
    "  - name: m\n"                                                                                          \
    "    endpoints:\n"                                                                                       \
    "      - id: a\n"                                                                                        \
    "        url: http://127.0.0.1:9001\n"

static struct atc_config *parse_ok(const char *yaml)
{
    struct atc_config *cfg = NULL;
    char *errors = NULL;
    int rc = atc_config_parse(yaml, strlen(yaml), "t.yaml", "/etc/atc", &cfg, &errors);

    if (rc != 0)
        print_error("unexpected errors:\n%s\n", errors ? errors : "(none)");
    assert_int_equal(rc, 0);
    assert_null(errors);
    assert_non_null(cfg);
    return cfg;
}

/* Returns the owned error text of a file that must not parse. */
static char *parse_bad(const char *yaml)
{
    struct atc_config *cfg = (struct atc_config *)1;
    char *errors = NULL;

    assert_int_equal(atc_config_parse(yaml, strlen(yaml), "t.yaml", "/etc/atc", &cfg, &errors), -1);
    assert_null(cfg);
    assert_non_null(errors);
    return errors;
}

static size_t count_lines(const char *s)
{
    size_t n = *s ? 1 : 0;

    for (; *s; s++)
        n += *s == '\n';
    return n;
}

#define assert_has(errors, needle)                                                                           \
    do {                                                                                                     \
        if (!strstr((errors), (needle))) {                                                                   \
            print_error("expected \"%s\" in:\n%s\n", (needle), (errors));                                    \
            fail();                                                                                          \
        }                                                                                                    \
    } while (0)

/* The file has exactly one error, and it starts with @p prefix (position and key) and contains @p reason. */
static void expect_one_error(const char *yaml, const char *prefix, const char *reason)
{
    char *errors = parse_bad(yaml);

    if (strncmp(errors, prefix, strlen(prefix)) != 0 || count_lines(errors) != 1) {
        print_error("expected one error starting \"%s\", got:\n%s\n", prefix, errors);
        fail();
    }
    assert_has(errors, reason);
    free(errors);
}

static void test_full_file(void **state)
{
    const char *yaml = "listen: \"[::1]:0\"\n"
                       "admin: \":9100\"\n"
                       "policy:\n"
                       "  entry: policies/main.lua\n"
                       "  path: [lib, /opt/atc/lib]\n"
                       "  budget: 500us\n"
                       "  memory: 32MiB\n"
                       "  jit: true\n"
                       "upstream:\n"
                       "  connect_timeout: 250ms\n"
                       "  first_byte_timeout: 1.5s\n"
                       "  idle_timeout: 2m\n"
                       "  token_timeout: 250ms\n"
                       "  tries: 3\n"
                       "  keepalive: 0\n"
                       "max_body: 1GiB\n"
                       "drain_timeout: 0\n"
                       "client_timeout: 45s\n"
                       "models:\n"
                       "  - name: llama-3-8b\n"
                       "    endpoints:\n"
                       "      - id: a\n"
                       "        url: http://10.0.0.1:8000/\n"
                       "        capacity: 128\n"
                       "        weight: 3\n"
                       "        version: v2\n"
                       "        tags: [small, fast]\n"
                       "      - id: b\n"
                       "        url: HTTP://gpu-box\n"
                       "  - name: qwen\n"
                       "simulate:\n"
                       "  - model: qwen\n"
                       "    count: 4\n"
                       "    capacity: 16\n"
                       "    max_seqs: 32\n"
                       "    prefill_tps: 12000.5\n"
                       "    decode_ms: 20\n"
                       "    kv_blocks: 1000\n"
                       "    error_rate: 0.25\n"
                       "    hang_rate: 0.1\n"
                       "    not_ready_for: 3s\n"
                       "    die_after: 100\n"
                       "    seed: 18446744073709551615\n"
                       "  - model: llama-3-8b\n"
                       "    max_seqs: 8\n";
    struct atc_config *cfg = parse_ok(yaml);
    struct atc_endpoint_config *a, *b;
    struct atc_simulate_config *s;

    assert_string_equal(cfg->path, "t.yaml");
    assert_string_equal(cfg->dir, "/etc/atc");
    assert_string_equal(cfg->listen_host, "::1");
    assert_int_equal(cfg->listen_port, 0);
    assert_string_equal(cfg->admin_host, "127.0.0.1");
    assert_int_equal(cfg->admin_port, 9100);
    assert_string_equal(cfg->policy.entry, "/etc/atc/policies/main.lua");
    assert_int_equal(cfg->policy.npath, 2);
    assert_string_equal(cfg->policy.path[0], "/etc/atc/lib");
    assert_string_equal(cfg->policy.path[1], "/opt/atc/lib");
    assert_int_equal(cfg->policy.budget_us, 500);
    assert_int_equal(cfg->policy.memory, 32 << 20);
    assert_true(cfg->policy.jit);
    assert_int_equal(cfg->upstream.connect_timeout_ms, 250);
    assert_int_equal(cfg->upstream.first_byte_timeout_ms, 1500);
    assert_int_equal(cfg->upstream.idle_timeout_ms, 120000);
    assert_int_equal(cfg->upstream.token_timeout_ms, 250);
    assert_int_equal(cfg->upstream.tries, 3);
    assert_int_equal(cfg->upstream.keepalive, 0);
    assert_int_equal(cfg->max_body, (size_t)1 << 30);
    assert_int_equal(cfg->drain_timeout_ms, 0);
    assert_int_equal(cfg->client_timeout_ms, 45000);

    assert_int_equal(cfg->nmodels, 2);
    assert_string_equal(cfg->models[0].name, "llama-3-8b");
    assert_int_equal(cfg->models[0].nendpoints, 2);
    a = &cfg->models[0].endpoints[0];
    assert_string_equal(a->id, "a");
    assert_string_equal(a->url, "http://10.0.0.1:8000/");
    assert_string_equal(a->host, "10.0.0.1");
    assert_int_equal(a->port, 8000);
    assert_string_equal(a->model, "llama-3-8b");
    assert_string_equal(a->version, "v2");
    assert_int_equal(a->ntags, 2);
    assert_string_equal(a->tags[0], "small");
    assert_string_equal(a->tags[1], "fast");
    assert_int_equal(a->capacity, 128);
    assert_int_equal(a->weight, 3);
    b = &cfg->models[0].endpoints[1];
    assert_string_equal(b->host, "gpu-box");
    assert_int_equal(b->port, 80);
    assert_null(b->version);
    assert_int_equal(b->ntags, 0);
    assert_int_equal(b->capacity, 64);
    assert_int_equal(b->weight, 1);
    assert_string_equal(cfg->models[1].name, "qwen");
    assert_int_equal(cfg->models[1].nendpoints, 0);

    assert_int_equal(cfg->nsimulate, 2);
    s = &cfg->simulate[0];
    assert_string_equal(s->params.model, "qwen");
    assert_int_equal(s->count, 4);
    assert_int_equal(s->capacity, 16);
    assert_int_equal(s->params.max_seqs, 32);
    assert_true(s->params.prefill_tps == 12000.5);
    assert_true(s->params.decode_ms == 20);
    assert_int_equal(s->params.kv_blocks, 1000);
    assert_true(s->params.error_rate == 0.25);
    assert_true(s->params.hang_rate == 0.1);
    assert_int_equal(s->params.not_ready_for_ms, 3000);
    assert_int_equal(s->params.die_after, 100);
    assert_true(s->params.seed == UINT64_MAX);
    s = &cfg->simulate[1];
    assert_string_equal(s->params.model, "llama-3-8b");
    assert_int_equal(s->count, 1);
    assert_int_equal(s->capacity, 8); /* defaults to max_seqs */
    assert_true(s->params.prefill_tps == 15000);
    assert_int_equal(s->params.seed, 1);
    atc_config_free(cfg);
}

/* The example from the issue that asked for this parser, comments and all. */
static void test_issue_example(void **state)
{
    const char *yaml =
        "listen: 127.0.0.1:8080        # the OpenAI-compatible front door\n"
        "admin: 127.0.0.1:8081         # admin API and /metrics\n"
        "policy:\n"
        "  entry: scripts/policy.lua   # used once the policy runtime lands\n"
        "models:\n"
        "  - name: llama-3-8b\n"
        "    endpoints:\n"
        "      - id: llama-a\n"
        "        url: http://127.0.0.1:9001\n"
        "        capacity: 64          # max concurrent requests it should get\n"
        "        version: v1           # optional\n"
        "        tags: [small]         # optional\n"
        "simulate:                     # optional: simulated servers that atc starts itself on loopback\n"
        "  - model: llama-3-8b\n"
        "    count: 3                  # each becomes an endpoint of that model\n";
    struct atc_config *cfg = parse_ok(yaml);

    assert_int_equal(cfg->listen_port, 8080);
    assert_int_equal(cfg->admin_port, 8081);
    assert_string_equal(cfg->policy.entry, "/etc/atc/scripts/policy.lua");
    assert_int_equal(cfg->nmodels, 1);
    assert_int_equal(cfg->models[0].nendpoints, 1);
    assert_string_equal(cfg->models[0].endpoints[0].id, "llama-a");
    assert_int_equal(cfg->models[0].endpoints[0].port, 9001);
    assert_string_equal(cfg->models[0].endpoints[0].version, "v1");
    assert_string_equal(cfg->models[0].endpoints[0].tags[0], "small");
    assert_int_equal(cfg->nsimulate, 1);
    assert_int_equal(cfg->simulate[0].count, 3);
    assert_int_equal(cfg->simulate[0].capacity, 64);
    atc_config_free(cfg);
}

static void test_defaults(void **state)
{
    struct atc_config *cfg = parse_ok(MODELS);
    char *errors = NULL;

    assert_string_equal(cfg->listen_host, "127.0.0.1");
    assert_int_equal(cfg->listen_port, 8080);
    assert_string_equal(cfg->admin_host, "127.0.0.1");
    assert_int_equal(cfg->admin_port, 8081);
    assert_string_equal(cfg->policy.entry, "/etc/atc/scripts/policy.lua");
    assert_int_equal(cfg->policy.npath, 0);
    assert_int_equal(cfg->policy.budget_us, 1000);
    assert_int_equal(cfg->policy.memory, 64 << 20);
    assert_false(cfg->policy.jit);
    assert_int_equal(cfg->upstream.connect_timeout_ms, 2000);
    assert_int_equal(cfg->upstream.first_byte_timeout_ms, 60000);
    assert_int_equal(cfg->upstream.idle_timeout_ms, 60000);
    assert_int_equal(cfg->upstream.token_timeout_ms, 100);
    assert_int_equal(cfg->upstream.tries, 2);
    assert_int_equal(cfg->upstream.keepalive, 32);
    assert_int_equal(cfg->max_body, 8 << 20);
    assert_int_equal(cfg->drain_timeout_ms, 10000);
    assert_int_equal(cfg->client_timeout_ms, 30000);
    assert_int_equal(cfg->models[0].endpoints[0].capacity, 64);
    assert_int_equal(cfg->models[0].endpoints[0].weight, 1);
    assert_int_equal(cfg->nsimulate, 0);
    atc_config_free(cfg);

    /* Without a directory, relative paths stay relative to the working directory. */
    assert_int_equal(atc_config_parse(MODELS, strlen(MODELS), NULL, NULL, &cfg, &errors), 0);
    assert_string_equal(cfg->path, "<config>");
    assert_string_equal(cfg->dir, ".");
    assert_string_equal(cfg->policy.entry, "./scripts/policy.lua");
    atc_config_free(cfg);

    /* Empty sections mean "all defaults", not an error. */
    cfg = parse_ok("policy:\nupstream: {}\nsimulate:\n" MODELS);
    assert_int_equal(cfg->upstream.tries, 2);
    atc_config_free(cfg);
}

static void test_health_defaults(void **state)
{
    struct atc_config *cfg = parse_ok(MODELS);
    const struct atc_health_config *h = &cfg->models[0].endpoints[0].health;

    assert_true(h->enabled);
    assert_true(h->live.enabled && h->ready.enabled && h->deep.enabled && h->scrape.enabled);
    assert_string_equal(h->live.path, "/health");
    assert_int_equal(h->live.interval_ms, 2000);
    assert_int_equal(h->live.timeout_ms, 1000);
    assert_string_equal(h->ready.path, "/v1/models");
    assert_int_equal(h->ready.interval_ms, 2000);
    assert_string_equal(h->deep.path, "/v1/chat/completions");
    assert_int_equal(h->deep.interval_ms, 60000);
    assert_int_equal(h->deep.timeout_ms, 30000);
    assert_string_equal(h->scrape.path, "/metrics");
    assert_int_equal(h->scrape.interval_ms, 1000);
    assert_int_equal(h->failure_threshold, 3);
    assert_int_equal(h->recovery_threshold, 2);
    assert_int_equal(h->fast_interval_ms, 500);
    assert_int_equal(h->down_interval_ms, 2000);
    assert_true(h->jitter == 0.1);
    assert_int_equal(h->eject.consecutive_errors, 5);
    assert_int_equal(h->eject.base_time_ms, 30000);
    assert_int_equal(h->eject.max_time_ms, 300000);
    assert_true(h->eject.max_share == 0.5);
    assert_int_equal(h->panic, ATC_PANIC_ROUTE_ALL);
    assert_int_equal(h->slow_start_ms, 10000);
    /* The levels are copies, not shared strings. */
    assert_ptr_not_equal(h->live.path, cfg->health.live.path);
    assert_ptr_not_equal(cfg->models[0].health.live.path, cfg->health.live.path);
    atc_config_free(cfg);
}

/* Top level, then the model, then the endpoint: each starts from the level above. */
static void test_health_overrides(void **state)
{
    struct atc_config *cfg =
        parse_ok("health:\n"
                 "  failure_threshold: 5\n"
                 "  live: {path: /ping, interval: 500ms}\n"
                 "  eject: {consecutive_errors: 0}\n"
                 "  panic: fail\n"
                 "models:\n"
                 "  - name: m\n"
                 "    health:\n"
                 "      live: {timeout: 250ms}\n"
                 "      deep: {enabled: false, path: /v1/completions}\n"
                 "      eject: {max_share: 0.25}\n"
                 "    endpoints:\n"
                 "      - id: a\n"
                 "        url: http://127.0.0.1:9001\n"
                 "        health: {recovery_threshold: 4, live: {interval: 1s}, slow_start: 0}\n"
                 "      - id: b\n"
                 "        url: http://127.0.0.1:9002\n"
                 "  - name: n\n"
                 "    endpoints:\n"
                 "      - id: c\n"
                 "        url: http://127.0.0.1:9003\n");
    const struct atc_health_config *top = &cfg->health, *m = &cfg->models[0].health;
    const struct atc_health_config *a = &cfg->models[0].endpoints[0].health;
    const struct atc_health_config *b = &cfg->models[0].endpoints[1].health;
    const struct atc_health_config *c = &cfg->models[1].endpoints[0].health;

    assert_int_equal(top->failure_threshold, 5);
    assert_string_equal(top->live.path, "/ping");
    assert_int_equal(top->live.interval_ms, 500);
    assert_int_equal(top->live.timeout_ms, 1000);
    assert_int_equal(top->panic, ATC_PANIC_FAIL);

    assert_int_equal(m->failure_threshold, 5);
    assert_string_equal(m->live.path, "/ping");
    assert_int_equal(m->live.timeout_ms, 250);
    assert_false(m->deep.enabled);
    assert_string_equal(m->deep.path, "/v1/completions");
    assert_int_equal(m->eject.consecutive_errors, 0);
    assert_true(m->eject.max_share == 0.25);

    assert_int_equal(a->recovery_threshold, 4);
    assert_int_equal(a->live.interval_ms, 1000);
    assert_int_equal(a->live.timeout_ms, 250);
    assert_string_equal(a->live.path, "/ping");
    assert_int_equal(a->slow_start_ms, 0);
    assert_true(a->eject.max_share == 0.25);
    assert_int_equal(b->recovery_threshold, 2);
    assert_int_equal(b->live.interval_ms, 500);
    assert_int_equal(b->slow_start_ms, 10000);

    assert_int_equal(c->live.timeout_ms, 1000);
    assert_true(c->deep.enabled);
    assert_true(c->eject.max_share == 0.5);
    atc_config_free(cfg);

    cfg = parse_ok("health: {enabled: no}\n" MODELS);
    assert_false(cfg->models[0].endpoints[0].health.enabled);
    atc_config_free(cfg);
}

static void test_health_errors(void **state)
{
    expect_one_error("health:\n  panic: sometimes\n" MODELS, "t.yaml:2:10: key 'health.panic': ",
                     "must be one of: route_all, fail (got 'sometimes')");
    expect_one_error("health:\n  live: {path: health}\n" MODELS,
                     "t.yaml:2:16: key 'health.live.path': ", "must start with '/'");
    expect_one_error(
        "health:\n  ready: {path: \"/v1/models x\"}\n" MODELS,
        "t.yaml:2:17: key 'health.ready.path': ", "must not contain spaces or control characters");
    expect_one_error("health:\n  failure_threshold: 0\n" MODELS,
                     "t.yaml:2:22: key 'health.failure_threshold': ", "must be greater than 0");
    expect_one_error("health:\n  recovery_threshold: 101\n" MODELS,
                     "t.yaml:2:23: key 'health.recovery_threshold': ", "must be from 1 to 100");
    expect_one_error("health:\n  jitter: 2\n" MODELS,
                     "t.yaml:2:11: key 'health.jitter': ", "must be between 0 and 1");
    expect_one_error("health:\n  live: {interval: 0s}\n" MODELS,
                     "t.yaml:2:20: key 'health.live.interval': ", "must be greater than 0");
    expect_one_error("health:\n  scrape: {timeout: soon}\n" MODELS,
                     "t.yaml:2:21: key 'health.scrape.timeout': ", "expected a duration");
    expect_one_error("health:\n  deep: {enable: false}\n" MODELS, "t.yaml:2:10: key 'health.deep': ",
                     "unknown key 'enable' (expected one of: enabled, path, interval, timeout)");
    expect_one_error(
        "health:\n  eject: {base_time: 1m, max_time: 30s}\n" MODELS,
        "t.yaml:2:3: key 'health': ", "eject.base_time (60000ms) must not exceed eject.max_time (30000ms)");
    expect_one_error("health: [1]\n" MODELS, "t.yaml:1:9: key 'health': ", "expected a mapping, got a list");
    expect_one_error(
        "models:\n  - name: m\n    health: {live: {timeout: -1s}}\n    endpoints:\n      - id: a\n"
        "        url: http://127.0.0.1:9001\n",
        "t.yaml:3:30: key 'models[0].health.live.timeout': ", "must not be negative");
    /* Model-wide settings are refused where they cannot apply. */
    expect_one_error(MODELS "        health: {panic: fail}\n",
                     "t.yaml:6:18: key 'models[0].endpoints[0].health.panic': ",
                     "applies to a whole model: set it in the model's or the top-level health section");
    expect_one_error(
        MODELS "        health:\n          eject: {max_share: 0.1}\n",
        "t.yaml:7:19: key 'models[0].endpoints[0].health.eject.max_share': ", "applies to a whole model");
    /* ... and the file is still checked to its end. */
    char *errors =
        parse_bad("health: {jitter: -1}\n" MODELS "        health: {panic: fail, fast_interval: x}\n");
    assert_int_equal(count_lines(errors), 3);
    free(errors);
}

/* engine: on a model (its endpoints inherit it) and on an endpoint; a profile sets the defaults the file
 * does not set, at any level; api_key_env / api_key_file read at load; forward_authorization. */
static void test_engines_and_keys(void **state)
{
    setenv("ATC_TEST_KEY", "sk-123", 1);
    struct atc_config *cfg = parse_ok("health: {ready: {path: /ready}}\n"
                                      "models:\n"
                                      "  - name: m\n"
                                      "    engine: sglang\n"
                                      "    api_key_env: ATC_TEST_KEY\n"
                                      "    endpoints:\n"
                                      "      - {id: a, url: \"http://127.0.0.1:1\"}\n"
                                      "      - {id: b, url: \"http://127.0.0.1:2\", engine: llamacpp,\n"
                                      "         health: {live: {timeout: 2s}}}\n"
                                      "      - {id: c, url: \"http://127.0.0.1:3\", engine: openai,\n"
                                      "         forward_authorization: true, health: {startup_grace: 1m}}\n"
                                      "      - {id: d, url: \"http://127.0.0.1:4\", engine: tgi}\n");
    const struct atc_endpoint_config *e = cfg->models[0].endpoints;
    assert_int_equal(e[0].access.engine, ATC_ENGINE_SGLANG); /* inherited */
    assert_int_equal(e[0].health.live.timeout_ms, 5000);     /* SGLang's slow /health */
    assert_string_equal(e[0].health.ready.path, "/ready");   /* the file's, at the top level */
    assert_int_equal(e[0].health.startup_grace_ms, 600000);
    assert_string_equal(e[0].access.api_key, "sk-123");
    assert_string_equal(e[0].access.api_key_source, "env ATC_TEST_KEY");
    assert_false(e[0].access.forward_authorization);
    assert_int_equal(e[1].access.engine, ATC_ENGINE_LLAMACPP);
    assert_int_equal(e[1].health.live.timeout_ms, 2000); /* set: the profile leaves it */
    assert_string_equal(e[1].access.api_key, "sk-123");  /* the model's key */
    assert_int_equal(e[2].health.live.timeout_ms, 1000); /* openai: as always */
    assert_int_equal(e[2].health.startup_grace_ms, 60000);
    assert_true(e[2].access.forward_authorization);
    assert_string_equal(e[3].health.ready.path, "/ready");         /* the file wins over TGI's /health */
    assert_int_equal(cfg->models[0].health.live.timeout_ms, 5000); /* simulated endpoints take the model's */
    atc_config_free(cfg);
    cfg = parse_ok(
        "models:\n  - name: m\n    engine: tgi\n    endpoints:\n      - {id: a, url: \"http://h:1\"}\n");
    assert_string_equal(cfg->models[0].endpoints[0].health.ready.path, "/health");
    assert_string_equal(cfg->models[0].endpoints[0].health.live.path, "/health");
    assert_int_equal(cfg->models[0].endpoints[0].health.startup_grace_ms, 600000);
    atc_config_free(cfg);
    cfg = parse_ok(MODELS); /* no engine: atc's defaults, no grace, no key */
    assert_int_equal(cfg->models[0].endpoints[0].health.live.timeout_ms, 1000);
    assert_int_equal(cfg->models[0].endpoints[0].health.startup_grace_ms, 0);
    assert_null(cfg->models[0].endpoints[0].access.api_key);
    atc_config_free(cfg);

    expect_one_error(
        "models:\n  - name: m\n    engine: vllmx\n    endpoints:\n      - {id: a, url: \"http://h:1\"}\n",
        "t.yaml:3:13: key 'models[0].engine': ",
        "must be one of: openai, vllm, sglang, llamacpp, tgi (got 'vllmx')");
    unsetenv("ATC_TEST_NO_KEY");
    expect_one_error(MODELS "        api_key_env: ATC_TEST_NO_KEY\n",
                     "t.yaml:6:22: key 'models[0].endpoints[0].api_key_env': ",
                     "variable 'ATC_TEST_NO_KEY' is not set in atc's environment");
    expect_one_error(MODELS "        api_key_file: /nonexistent/key\n",
                     "t.yaml:6:23: key 'models[0].endpoints[0].api_key_file': ",
                     "file '/nonexistent/key' No such file or directory");
    expect_one_error(MODELS "        api_key_env: ATC_TEST_KEY\n        api_key_file: k\n",
                     "t.yaml:7:23: key 'models[0].endpoints[0].api_key_file': ", "not both");
    setenv("ATC_TEST_KEY", "two words", 1);
    char *errors = parse_bad(MODELS "        api_key_env: ATC_TEST_KEY\n");
    assert_has(errors, "spaces or control characters");
    assert_null(strstr(errors, "two words")); /* the key is never printed */
    free(errors);
    unsetenv("ATC_TEST_KEY");
}

/* role: and disaggregation: (issue 30): read, defaulted, and a disaggregated model without a server for a
 * stage refused at its disaggregation: key, simulate: entries counted. */
static void test_disaggregation(void **state)
{
    (void)state;
    struct atc_config *cfg = parse_ok("models:\n"
                                      "  - name: m\n"
                                      "    disaggregation: sglang\n"
                                      "    endpoints:\n"
                                      "      - {id: p, url: \"http://127.0.0.1:1\", role: prefill,\n"
                                      "         bootstrap_port: 9000}\n"
                                      "      - {id: d, url: \"http://127.0.0.1:2\", role: decode}\n"
                                      "      - {id: q, url: \"http://127.0.0.1:3\", role: prefill}\n"
                                      "  - name: n\n"
                                      "    endpoints: [{id: c, url: \"http://127.0.0.1:4\"}]\n");
    const struct atc_endpoint_config *e = cfg->models[0].endpoints;
    assert_int_equal(cfg->models[0].disaggregation, ATC_DISAGG_SGLANG);
    assert_int_equal(e[0].role, ATC_ROLE_PREFILL);
    assert_int_equal(e[0].bootstrap_port, 9000);
    assert_int_equal(e[1].role, ATC_ROLE_DECODE);
    assert_int_equal(e[2].bootstrap_port, ATC_SGLANG_BOOTSTRAP_PORT); /* SGLang's default */
    assert_int_equal(cfg->models[1].disaggregation, ATC_DISAGG_NONE);
    assert_int_equal(cfg->models[1].endpoints[0].role, ATC_ROLE_BOTH);
    atc_config_free(cfg);
    /* simulated servers with roles make a whole fleet */
    cfg = parse_ok("models:\n  - name: m\n    disaggregation: vllm\n"
                   "simulate:\n  - {model: m, role: prefill, transfer_gbps: 10}\n  - {model: m, role: decode}\n");
    assert_int_equal(cfg->simulate[0].params.role, ATC_ROLE_PREFILL);
    assert_true(cfg->simulate[0].params.transfer_gbps == 10);
    atc_config_free(cfg);
    expect_one_error("models:\n  - name: m\n    disaggregation: vllm\n    endpoints:\n"
                     "      - {id: a, url: \"http://127.0.0.1:1\", role: decode}\n",
                     "t.yaml:3:21: key 'models[0].disaggregation': ", "model 'm' has no prefill server");
    expect_one_error("models:\n  - name: m\n    disaggregation: sglang\n"
                     "simulate:\n  - {model: m, role: prefill}\n",
                     "t.yaml:3:21: key 'models[0].disaggregation': ", "model 'm' has no decode server");
}

static void test_bad_port(void **state)
{
    expect_one_error("listen: 127.0.0.1:70000\n" MODELS, "t.yaml:1:9: key 'listen': ",
                     "the port must be a number from 0 to 65535 (got '127.0.0.1:70000')");
    expect_one_error("admin: 127.0.0.1\n" MODELS, "t.yaml:1:8: key 'admin': ", "missing ':port'");
    expect_one_error("admin: \"127.0.0.1:80x\"\n" MODELS, "t.yaml:1:8: key 'admin': ", "the port must be");
    expect_one_error("listen: \"::1:80\"\n" MODELS,
                     "t.yaml:1:9: key 'listen': ", "must be written in brackets");
    expect_one_error("listen: 127.0.0.1:8081\n" MODELS,
                     "t.yaml:1:9: key 'listen': ", "must differ from 'admin'");
    expect_one_error("admin: \":8080\"\n" MODELS, "t.yaml:1:8: key 'admin': ", "must differ from 'listen'");
    expect_one_error("models:\n  - name: m\n    endpoints:\n      - id: a\n        url: http://h:0\n",
                     "t.yaml:5:14: key 'models[0].endpoints[0].url': ", "the port must be from 1 to 65535");
}

static void test_bad_url(void **state)
{
    static const struct {
        const char *url, *reason;
    } cases[] = {
        {"ftp://h:21", "expected a URL of the form http://host:port"},
        {"127.0.0.1:9001", "expected a URL of the form http://host:port"},
        {"http://:9001", "missing host"},
        {"http://h:9001/v1", "a path, query or fragment is not supported"},
        {"http://h:9001?x=1", "a path, query or fragment is not supported"},
        {"http://u@h:9001", "user info in the URL is not supported"},
        {"http://h:99999", "the port must be a number from 0 to 65535"},
        {"http://[::1:9001", "missing ']'"},
        {"http://h o:1", "bad character in the host name"},
    };
    char yaml[256];

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(yaml, sizeof yaml,
                 "models:\n  - name: m\n    endpoints:\n      - id: a\n        url: \"%s\"\n", cases[i].url);
        expect_one_error(yaml, "t.yaml:5:14: key 'models[0].endpoints[0].url': ", cases[i].reason);
    }
}

static void test_https_url(void **state)
{
    expect_one_error(
        "models:\n  - name: m\n    endpoints:\n      - id: a\n        url: https://h:443\n",
        "t.yaml:5:14: key 'models[0].endpoints[0].url': ", "https is not supported, use http://");
}

static void test_ipv6_url(void **state)
{
    struct atc_config *cfg = parse_ok(
        "models:\n  - name: m\n    endpoints:\n      - id: a\n        url: http://[fe80::1]:9001/\n");

    assert_string_equal(cfg->models[0].endpoints[0].host, "fe80::1");
    assert_int_equal(cfg->models[0].endpoints[0].port, 9001);
    atc_config_free(cfg);
}

static void test_zero_capacity(void **state)
{
    expect_one_error(MODELS "        capacity: 0\n",
                     "t.yaml:6:19: key 'models[0].endpoints[0].capacity': ", "must be greater than 0");
    expect_one_error(MODELS "        weight: 0\n",
                     "t.yaml:6:17: key 'models[0].endpoints[0].weight': ", "must be greater than 0");
    expect_one_error(MODELS "        capacity: 2000000\n",
                     "t.yaml:6:19: key 'models[0].endpoints[0].capacity': ", "must be from 1 to 1000000");
}

/* from: / until: (a replay's fleet over time): durations, until after from; simulate: entries too. */
static void test_replay_windows(void **state)
{
    struct atc_config *cfg = parse_ok(MODELS "        from: 10m\n        until: 20m\n"
                                             "simulate:\n  - {model: m, count: 2, from: 90s}\n");
    assert_int_equal(cfg->models[0].endpoints[0].window.from_ms, 600000);
    assert_int_equal(cfg->models[0].endpoints[0].window.until_ms, 1200000);
    assert_int_equal(cfg->simulate[0].window.from_ms, 90000);
    assert_int_equal(cfg->simulate[0].window.until_ms, 0);
    atc_config_free(cfg);
    expect_one_error(MODELS "        from: 20m\n        until: 10m\n",
                     "t.yaml:7:16: key 'models[0].endpoints[0].until': ", "must be later than from:");
    expect_one_error(MODELS "simulate:\n  - {model: m, until: 0s}\n",
                     "t.yaml:7:23: key 'simulate[0].until': ", "must be greater than 0");
}

static void test_duplicate_id(void **state)
{
    /* Endpoint ids are unique across all models: they name endpoints in metrics and the admin API. */
    expect_one_error(MODELS "  - name: n\n"
                            "    endpoints:\n"
                            "      - id: a\n"
                            "        url: http://127.0.0.1:9002\n",
                     "t.yaml:8:13: key 'models[1].endpoints[0].id': ",
                     "duplicate endpoint id 'a' (first declared at 4:13)");
}

static void test_duplicate_model(void **state)
{
    expect_one_error(MODELS "  - name: m\n"
                            "    endpoints:\n"
                            "      - id: b\n"
                            "        url: http://127.0.0.1:9002\n",
                     "t.yaml:6:11: key 'models[1].name': ", "duplicate model 'm' (first declared at 2:11)");
}

/* record: writes live traffic to trace files; every key, the defaults, and errors where they are. */
static void test_record(void **state)
{
    struct atc_config *cfg = parse_ok(MODELS);

    assert_false(cfg->record.enabled);
    assert_string_equal(cfg->record.dir, "/etc/atc/traces");
    assert_string_equal(cfg->record.prefix, "atc");
    assert_int_equal(cfg->record.rotate_size, 256 << 20);
    assert_int_equal(cfg->record.rotate_interval_ms, 3600 * 1000);
    assert_int_equal(cfg->record.buffer, 8 << 20);
    assert_false(cfg->record.text);
    assert_true(cfg->record.sample == 1.0);
    atc_config_free(cfg);

    cfg = parse_ok("record:\n" MODELS);
    assert_true(cfg->record.enabled);
    assert_string_equal(cfg->record.dir, "/etc/atc/traces");
    atc_config_free(cfg);

    cfg = parse_ok("record:\n"
                   "  dir: /var/lib/atc/traces\n"
                   "  prefix: edge-1\n"
                   "  rotate_size: 64MiB\n"
                   "  rotate_interval: 10m\n"
                   "  text: true\n"
                   "  buffer: 1MiB\n"
                   "  sample: 0.25\n" MODELS);
    assert_true(cfg->record.enabled);
    assert_string_equal(cfg->record.dir, "/var/lib/atc/traces");
    assert_string_equal(cfg->record.prefix, "edge-1");
    assert_int_equal(cfg->record.rotate_size, 64 << 20);
    assert_int_equal(cfg->record.rotate_interval_ms, 600 * 1000);
    assert_true(cfg->record.text);
    assert_int_equal(cfg->record.buffer, 1 << 20);
    assert_true(cfg->record.sample == 0.25);
    atc_config_free(cfg);

    cfg = parse_ok("record:\n  dir: traces/live\n" MODELS);
    assert_string_equal(cfg->record.dir, "/etc/atc/traces/live");
    atc_config_free(cfg);

    expect_one_error("record:\n  rotate_size: 0\n" MODELS, "t.yaml:2:16: key 'record.rotate_size': ",
                     "must be greater than 0");
    expect_one_error("record:\n  rotate_interval: soon\n" MODELS, "t.yaml:2:20: key 'record.rotate_interval': ",
                     "expected a duration");
    expect_one_error("record:\n  sample: 1.5\n" MODELS, "t.yaml:2:11: key 'record.sample': ",
                     "must be between 0 and 1");
    expect_one_error("record:\n  text: maybe\n" MODELS, "t.yaml:2:9: key 'record.text': ", "true or false");
    expect_one_error("record:\n  prefix: ../etc\n" MODELS, "t.yaml:2:11: key 'record.prefix': ",
                     "only letters, digits");
    expect_one_error("record:\n  dirr: x\n" MODELS, "t.yaml:2:3: key 'record': unknown key 'dirr'", "dir");
    expect_one_error("record: yes\n" MODELS, "t.yaml:1:9: key 'record': ", "expected a mapping");
}

static void test_unknown_key(void **state)
{
    expect_one_error("foo: 1\n" MODELS, "t.yaml:1:1: unknown key 'foo' (expected one of: listen, admin,", "");
    expect_one_error("upstream:\n  conect_timeout: 1s\n" MODELS,
                     "t.yaml:2:3: key 'upstream': unknown key 'conect_timeout'", "connect_timeout");
    expect_one_error(MODELS "        capacty: 3\n",
                     "t.yaml:6:9: key 'models[0].endpoints[0]': unknown key 'capacty'", "capacity");
    expect_one_error("simulate:\n  - model: m\n    max_seq: 3\n" MODELS,
                     "t.yaml:3:5: key 'simulate[0]': unknown key 'max_seq'", "max_seqs");
}

static void test_duplicate_key(void **state)
{
    expect_one_error("listen: \":1\"\nlisten: \":2\"\n" MODELS,
                     "t.yaml:2:1: key 'listen': ", "duplicate key (first at 1:1)");
}

static void test_bad_duration(void **state)
{
    expect_one_error("policy:\n  budget: 5 parsecs\n" MODELS, "t.yaml:2:11: key 'policy.budget': ",
                     "expected a duration such as 500us, 250ms, 2s, 1m or 1h");
    expect_one_error("upstream:\n  connect_timeout: 0s\n" MODELS,
                     "t.yaml:2:20: key 'upstream.connect_timeout': ", "must be greater than 0");
    expect_one_error("drain_timeout: -1s\n" MODELS,
                     "t.yaml:1:16: key 'drain_timeout': ", "must not be negative");
    expect_one_error("client_timeout: 1.s\n" MODELS,
                     "t.yaml:1:17: key 'client_timeout': ", "expected a duration");
    /* a bare number is refused, not read as ms: `connect_timeout: 2` was 2 ms to atc and 2 s to its reader */
    expect_one_error("upstream:\n  connect_timeout: 2\n" MODELS,
                     "t.yaml:2:20: key 'upstream.connect_timeout': ", "needs a unit: 500us, 250ms, 2s");
    expect_one_error("policy:\n  budget: 1.5\n" MODELS, "t.yaml:2:11: key 'policy.budget': ", "needs a unit");
}

static void test_bad_size(void **state)
{
    expect_one_error("max_body: 8 MeB\n" MODELS, "t.yaml:1:11: key 'max_body': ",
                     "expected a size such as 512KiB, 8MiB or 1GiB, got '8 MeB'");
    expect_one_error("max_body: 4096\n" MODELS, "t.yaml:1:11: key 'max_body': ", "needs a unit");
    expect_one_error("record:\n  buffer: 8\n" MODELS, "t.yaml:2:11: key 'record.buffer': ", "needs a unit");
    expect_one_error("policy:\n  memory: 0\n" MODELS,
                     "t.yaml:2:11: key 'policy.memory': ", "must be greater than 0");
    expect_one_error("max_body: -1\n" MODELS, "t.yaml:1:11: key 'max_body': ", "must not be negative");
}

static void test_numbers(void **state)
{
    expect_one_error("upstream:\n  tries: two\n" MODELS,
                     "t.yaml:2:10: key 'upstream.tries': ", "expected a whole number, got 'two'");
    expect_one_error("upstream:\n  tries: 0\n" MODELS,
                     "t.yaml:2:10: key 'upstream.tries': ", "must be greater than 0");
    expect_one_error("upstream:\n  keepalive: -1\n" MODELS,
                     "t.yaml:2:14: key 'upstream.keepalive': ", "must not be negative (got '-1')");
    expect_one_error("upstream:\n  tries: 2.5\n" MODELS,
                     "t.yaml:2:10: key 'upstream.tries': ", "expected a whole number");
    expect_one_error("simulate:\n  - model: m\n    seed: 18446744073709551616\n" MODELS,
                     "t.yaml:3:11: key 'simulate[0].seed': ", "expected a whole number");
    expect_one_error("simulate:\n  - model: m\n    error_rate: 1.5\n" MODELS,
                     "t.yaml:3:17: key 'simulate[0].error_rate': ", "must be between 0 and 1");
    expect_one_error("simulate:\n  - model: m\n    hang_rate: nan\n" MODELS,
                     "t.yaml:3:16: key 'simulate[0].hang_rate': ", "expected a number, got 'nan'");
    expect_one_error("simulate:\n  - model: m\n    prefill_tps: 0\n" MODELS,
                     "t.yaml:3:18: key 'simulate[0].prefill_tps': ", "must be greater than 0");
    expect_one_error("simulate:\n  - model: m\n    count: 1025\n" MODELS,
                     "t.yaml:3:12: key 'simulate[0].count': ", "must be from 1 to 1024");
    expect_one_error("workers: 0\n" MODELS, "t.yaml:1:10: key 'workers': ", "must be greater than 0");
    expect_one_error("workers: 17\n" MODELS, "t.yaml:1:10: key 'workers': ", "must be from 1 to 16");
    expect_one_error("policy:\n  jit: maybe\n" MODELS,
                     "t.yaml:2:8: key 'policy.jit': ", "expected true or false");
}

static void test_simulate_undeclared_model(void **state)
{
    /* simulate: may come before models: in the file; the check must not depend on the order. */
    expect_one_error("simulate:\n  - model: gpt-5\n" MODELS, "t.yaml:2:12: key 'simulate[0].model': ",
                     "no model named 'gpt-5' is declared under 'models'");
    expect_one_error("simulate:\n  - count: 2\n" MODELS,
                     "t.yaml:2:5: key 'simulate[0]': ", "missing 'model'");
}

/* discover: takes dns: (A/AAAA records) with port:, or srv: (SRV records, which carry the port) alone. */
static void test_discover(void **state)
{
    (void)state;
    struct atc_config *cfg = parse_ok("models:\n  - name: m\n    discover: {dns: vllm.llm.svc, port: 8000}\n"
                                      "  - name: n\n    discover:\n"
                                      "      srv: _http._tcp.vllm.default.svc.cluster.local.\n"
                                      "      interval: 2s\n      resolver: 10.96.0.10:53\n");
    assert_string_equal(cfg->models[0].discover.dns, "vllm.llm.svc");
    assert_null(cfg->models[0].discover.srv);
    assert_int_equal(cfg->models[0].discover.port, 8000);
    assert_null(cfg->models[1].discover.dns);
    assert_string_equal(cfg->models[1].discover.srv, "_http._tcp.vllm.default.svc.cluster.local.");
    assert_int_equal(cfg->models[1].discover.port, 0);
    assert_int_equal(cfg->models[1].discover.interval_ms, 2000);
    assert_string_equal(cfg->models[1].discover.resolver, "10.96.0.10");
    assert_int_equal(cfg->models[1].discover.rport, 53);
    atc_config_free(cfg);

#define M "models:\n  - name: m\n"
    expect_one_error(M "    discover: {srv: _x._tcp.a.test, port: 80}\n",
                     "t.yaml:3:43: key 'models[0].discover.port': ", "SRV records carry the port");
    expect_one_error(M "    discover: {dns: a.test, srv: _x._tcp.a.test, port: 80}\n",
                     "t.yaml:3:34: key 'models[0].discover.srv': ", "set dns: or srv:, not both");
    expect_one_error(M "    discover: {dns: a.test}\n",
                     "t.yaml:3:15: key 'models[0].discover': ", "missing 'port' (A records carry none)");
    expect_one_error(
        M "    discover: {interval: 1s}\n    endpoints: [{id: a, url: 'http://127.0.0.1:1'}]\n",
        "t.yaml:3:15: key 'models[0].discover': ", "missing 'dns' (A records) or 'srv' (SRV records)");
    expect_one_error(M "    discover: {srv: _x._tcp..a.test}\n",
                     "t.yaml:3:21: key 'models[0].discover.srv': ", "not a DNS name: an empty label");
    expect_one_error(
        M "    discover: {srv: 'http://a.test'}\n",
        "t.yaml:3:21: key 'models[0].discover.srv': ", "not a DNS name: a name of letters, digits");
#undef M
}

static void test_model_without_endpoints(void **state)
{
    struct atc_config *cfg;

    expect_one_error(MODELS "  - name: lonely\n", "t.yaml:6:5: key 'models[1]': ",
                     "model 'lonely' has no endpoints, no discover: and no simulate entry");
    expect_one_error(MODELS "  - name: lonely\n    endpoints: []\n",
                     "t.yaml:6:5: key 'models[1]': ", "has no endpoints");
    expect_one_error("models: []\n", "t.yaml:1:9: key 'models': ", "at least one model is required");
    expect_one_error("listen: \":0\"\n", "t.yaml:1:1: key 'models': ", "at least one model is required");

    cfg = parse_ok("models:\n  - name: sim-only\nsimulate:\n  - model: sim-only\n");
    assert_int_equal(cfg->models[0].nendpoints, 0);
    atc_config_free(cfg);
}

static void test_missing_required(void **state)
{
    expect_one_error("models:\n  - endpoints:\n      - id: a\n        url: http://h:1\n",
                     "t.yaml:2:5: key 'models[0]': ", "missing 'name'");
    expect_one_error("models:\n  - name: m\n    endpoints:\n      - url: http://h:1\n",
                     "t.yaml:4:9: key 'models[0].endpoints[0]': ", "missing 'id'");
    expect_one_error("models:\n  - name: m\n    endpoints:\n      - id: a\n",
                     "t.yaml:4:9: key 'models[0].endpoints[0]': ", "missing 'url'");
    expect_one_error("models:\n  - name:\n    endpoints:\n      - id: a\n        url: http://h:1\n",
                     "t.yaml:2:10: key 'models[0].name': ", "expected a string, got nothing");
    expect_one_error("models:\n  - name: \"\"\n    endpoints:\n      - id: a\n        url: http://h:1\n",
                     "t.yaml:2:11: key 'models[0].name': ", "must not be empty");
}

static void test_wrong_type(void **state)
{
    expect_one_error("policy: fast\n" MODELS, "t.yaml:1:9: key 'policy': ", "expected a mapping, got 'fast'");
    expect_one_error("policy:\n  - entry: x\n" MODELS,
                     "t.yaml:2:3: key 'policy': ", "expected a mapping, got a list");
    expect_one_error("policy:\n  path: lib\n" MODELS,
                     "t.yaml:2:9: key 'policy.path': ", "expected a list, got 'lib'");
    expect_one_error("listen: {host: x}\n" MODELS,
                     "t.yaml:1:9: key 'listen': ", "expected host:port, got a mapping");
    expect_one_error("models: llama\n", "t.yaml:1:9: key 'models': ", "expected a list, got 'llama'");
    expect_one_error(MODELS "  - llama\n",
                     "t.yaml:6:5: key 'models[1]': ", "expected a mapping, got 'llama'");
    expect_one_error(MODELS "        tags: small\n",
                     "t.yaml:6:15: key 'models[0].endpoints[0].tags': ", "expected a list, got 'small'");
    expect_one_error(
        MODELS "        tags: [a, {b: c}]\n",
        "t.yaml:6:19: key 'models[0].endpoints[0].tags[1]': ", "expected a string, got a mapping");
    expect_one_error(MODELS "        version: [1]\n",
                     "t.yaml:6:18: key 'models[0].endpoints[0].version': ", "expected a string, got a list");
    expect_one_error("- a\n- b\n", "t.yaml:1:1: ", "expected a mapping, got a list");
    expect_one_error("[a]: 1\n" MODELS, "t.yaml:1:1: ", "expected a plain key, got a list");
}

static void test_yaml_syntax_error(void **state)
{
    expect_one_error("listen: [a\n" MODELS,
                     "t.yaml:2:7: ", "YAML syntax error: did not find expected ',' or ']'");
    expect_one_error("policy:\n  entry: a\n bad: 1\n" MODELS, "t.yaml:3:2: ", "YAML syntax error");
    expect_one_error("listen:\t1\n\tadmin: 2\n",
                     "t.yaml:2:1: ", "found a tab character that violates indentation");
    expect_one_error(MODELS "---\nlisten: :1\n",
                     "t.yaml:7:1: ", "only one YAML document per file is supported");
}

static void test_empty_file(void **state)
{
    expect_one_error("", "t.yaml:1:1: ", "the file is empty");
    expect_one_error("# nothing but a comment\n\n", "t.yaml:1:1: ", "the file is empty");
}

/* One pass reports every problem, sorted by position, each on its own line. */
static void test_all_errors_reported(void **state)
{
    const char *yaml = "listen: 127.0.0.1:99999\n" /* 1 */
                       "foo: 1\n"                  /* 2 */
                       "policy:\n"                 /* 3 */
                       "  budget: soon\n"          /* 4 */
                       "  bar: 2\n"                /* 5 */
                       "models:\n"                 /* 6 */
                       "  - name: m\n"             /* 7 */
                       "    endpoints:\n"          /* 8 */
                       "      - id: a\n"           /* 9 */
                       "        url: https://h\n"  /* 10 */
                       "        capacity: 0\n"     /* 11 */
                       "      - id: a\n"           /* 12 */
                       "        url: http://h:1\n" /* 13 */
                       "simulate:\n"               /* 14 */
                       "  - model: nope\n"         /* 15 */
                       "    error_rate: 2\n";      /* 16 */
    static const char *const want[] = {
        "t.yaml:1:9: key 'listen': the port must be",
        "t.yaml:2:1: unknown key 'foo'",
        "t.yaml:4:11: key 'policy.budget': expected a duration",
        "t.yaml:5:3: key 'policy': unknown key 'bar'",
        "t.yaml:10:14: key 'models[0].endpoints[0].url': https is not supported",
        "t.yaml:11:19: key 'models[0].endpoints[0].capacity': must be greater than 0",
        "t.yaml:12:13: key 'models[0].endpoints[1].id': duplicate endpoint id 'a'",
        "t.yaml:15:12: key 'simulate[0].model': no model named 'nope'",
        "t.yaml:16:17: key 'simulate[0].error_rate': must be between 0 and 1",
    };
    char *errors = parse_bad(yaml), *line = errors;

    assert_int_equal(count_lines(errors), sizeof want / sizeof want[0]);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        if (strncmp(line, want[i], strlen(want[i])) != 0) {
            print_error("line %zu: expected \"%s\" in:\n%s\n", i + 1, want[i], errors);
            fail();
        }
        line = strchr(line, '\n') + 1;
    }
    free(errors);
}

static void test_load_file(void **state)
{
    char dir[] = "/tmp/atc-test-config-XXXXXX", path[128];
    struct atc_config *cfg;
    char *errors;
    FILE *f;

    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/atc.yaml", dir);
    assert_non_null(f = fopen(path, "w"));
    fputs("policy:\n  entry: p.lua\n  path: [lib]\n" MODELS, f);
    fclose(f);

    assert_int_equal(atc_config_load(path, &cfg, &errors), 0);
    assert_null(errors);
    assert_string_equal(cfg->path, path);
    assert_string_equal(cfg->dir, dir);
    assert_true(strncmp(cfg->policy.entry, dir, strlen(dir)) == 0);
    assert_string_equal(cfg->policy.entry + strlen(dir), "/p.lua");
    assert_string_equal(cfg->policy.path[0] + strlen(dir), "/lib");
    atc_config_free(cfg);

    /* Errors name the file as given. */
    assert_non_null(f = fopen(path, "w"));
    fputs("listen: x\n" MODELS, f);
    fclose(f);
    assert_int_equal(atc_config_load(path, &cfg, &errors), -1);
    assert_null(cfg);
    assert_true(strncmp(errors, path, strlen(path)) == 0);
    assert_has(errors, ":1:9: key 'listen': missing ':port'");
    free(errors);

    unlink(path);
    assert_int_equal(atc_config_load(path, &cfg, &errors), -1);
    assert_has(errors, "cannot open: No such file or directory");
    free(errors);
    rmdir(dir);
}

/* Found by tests/fuzz (config): a quoted key with a newline split its error over two lines. */
static void test_error_with_control_characters_stays_on_one_line(void **state)
{
    expect_one_error("\"a\\nb\\tc\": 1\n" MODELS, "t.yaml:1:1: ", "unknown key 'a\\x0ab\\x09c'");
}

static void test_parse_duration(void **state)
{
    uint64_t v;

    assert_int_equal(atc_parse_duration_ms("250ms", &v), 0);
    assert_int_equal(v, 250);
    assert_int_equal(atc_parse_duration_ms("2s", &v), 0);
    assert_int_equal(v, 2000);
    assert_int_equal(atc_parse_duration_ms("1m", &v), 0);
    assert_int_equal(v, 60000);
    assert_int_equal(atc_parse_duration_ms("1h", &v), 0);
    assert_int_equal(v, 3600000);
    assert_int_equal(atc_parse_duration_ms("1500us", &v), 0);
    assert_int_equal(v, 2); /* rounds up: a non-zero duration never becomes 0 */
    assert_int_equal(atc_parse_duration_ms("1us", &v), 0);
    assert_int_equal(v, 1);
    assert_int_equal(atc_parse_duration_ms("0", &v), 0);
    assert_int_equal(v, 0);
    assert_int_equal(atc_parse_duration_ms("42", &v), 0);
    assert_int_equal(v, 42);
    assert_int_equal(atc_parse_duration_ms("1.5s", &v), 0);
    assert_int_equal(v, 1500);
    assert_int_equal(atc_parse_duration_ms("2 S", &v), 0);
    assert_int_equal(v, 2000);
    assert_int_equal(atc_parse_duration_us("500us", &v), 0);
    assert_int_equal(v, 500);
    assert_int_equal(atc_parse_duration_us("1ms", &v), 0);
    assert_int_equal(v, 1000);

    assert_int_equal(atc_parse_duration_ms("", &v), -1);
    assert_int_equal(atc_parse_duration_ms("s", &v), -1);
    assert_int_equal(atc_parse_duration_ms("-1s", &v), -1);
    assert_int_equal(atc_parse_duration_ms("+1s", &v), -1);
    assert_int_equal(atc_parse_duration_ms(" 1s", &v), -1);
    assert_int_equal(atc_parse_duration_ms("1d", &v), -1);
    assert_int_equal(atc_parse_duration_ms("1.s", &v), -1);
    assert_int_equal(atc_parse_duration_ms("1s2", &v), -1);
    assert_int_equal(atc_parse_duration_ms("99999999999999999999", &v), -1);
    assert_int_equal(atc_parse_duration_ms("9999999999999h", &v), -1);
}

static void test_parse_size(void **state)
{
    size_t v;

    assert_int_equal(atc_parse_size("8MiB", &v), 0);
    assert_int_equal(v, 8 << 20);
    assert_int_equal(atc_parse_size("512KiB", &v), 0);
    assert_int_equal(v, 512 << 10);
    assert_int_equal(atc_parse_size("1GiB", &v), 0);
    assert_int_equal(v, (size_t)1 << 30);
    assert_int_equal(atc_parse_size("64MB", &v), 0);
    assert_int_equal(v, 64000000);
    assert_int_equal(atc_parse_size("1.5KiB", &v), 0);
    assert_int_equal(v, 1536);
    assert_int_equal(atc_parse_size("100", &v), 0);
    assert_int_equal(v, 100);
    assert_int_equal(atc_parse_size("100b", &v), 0);
    assert_int_equal(v, 100);
    assert_int_equal(atc_parse_size("2 mib", &v), 0);
    assert_int_equal(v, 2 << 20);

    assert_int_equal(atc_parse_size("", &v), -1);
    assert_int_equal(atc_parse_size("MiB", &v), -1);
    assert_int_equal(atc_parse_size("-1", &v), -1);
    assert_int_equal(atc_parse_size("8 MeB", &v), -1);
    assert_int_equal(atc_parse_size("8MiBs", &v), -1);
    assert_int_equal(atc_parse_size("16777216TiB", &v), -1); /* 2^64: overflows */
}

static void test_parse_hostport(void **state)
{
    char *host = NULL;
    uint16_t port = 0;

    assert_int_equal(atc_parse_hostport("127.0.0.1:8080", &host, &port, NULL), 0);
    assert_string_equal(host, "127.0.0.1");
    assert_int_equal(port, 8080);
    free(host);
    assert_int_equal(atc_parse_hostport("[::1]:8080", &host, &port, NULL), 0);
    assert_string_equal(host, "::1");
    assert_int_equal(port, 8080);
    free(host);
    assert_int_equal(atc_parse_hostport(":9000", &host, &port, NULL), 0);
    assert_string_equal(host, "127.0.0.1");
    assert_int_equal(port, 9000);
    free(host);
    assert_int_equal(atc_parse_hostport("localhost:0", &host, &port, NULL), 0);
    assert_string_equal(host, "localhost");
    assert_int_equal(port, 0);
    free(host);
    assert_int_equal(atc_parse_hostport("h:65535", &host, &port, NULL), 0);
    assert_int_equal(port, 65535);
    free(host);

    host = NULL;
    assert_int_equal(atc_parse_hostport("h:65536", &host, &port, NULL), -1);
    assert_int_equal(atc_parse_hostport("h", &host, &port, NULL), -1);
    assert_int_equal(atc_parse_hostport("h:", &host, &port, NULL), -1);
    assert_int_equal(atc_parse_hostport("h:-1", &host, &port, NULL), -1);
    assert_int_equal(atc_parse_hostport("h:80x", &host, &port, NULL), -1);
    assert_int_equal(atc_parse_hostport("::1:80", &host, &port, NULL), -1);
    assert_int_equal(atc_parse_hostport("[::1]80", &host, &port, NULL), -1);
    assert_int_equal(atc_parse_hostport("[::1", &host, &port, NULL), -1);
    assert_int_equal(atc_parse_hostport("[]:80", &host, &port, NULL), -1);
    assert_int_equal(atc_parse_hostport("[zz]:80", &host, &port, NULL), -1);
    assert_int_equal(atc_parse_hostport("a b:80", &host, &port, NULL), -1);
    assert_int_equal(atc_parse_hostport("", &host, &port, NULL), -1);
    assert_null(host); /* nothing is allocated on failure */
}

/* An empty section (`limits:` with nothing under it) is one with every field absent: found by the fuzzer,
 * parse_limits then read the fields' nodes from an array the empty section had left unset. */
static void test_empty_sections(void **state)
{
    (void)state;
    const char *sections[] = {"limits:\n", "limits:\nupstream:\n", "upstream:\nlimits:\nsignals:\n"};
    for (size_t i = 0; i < sizeof(sections) / sizeof(sections[0]); i++) {
        char yaml[1024];
        snprintf(yaml, sizeof(yaml), "%s" MODELS, sections[i]);
        struct atc_config *cfg = parse_ok(yaml);
        assert_true(cfg->limits.enabled);
        assert_int_equal(cfg->limits.ntenants, 0);
        assert_int_equal(cfg->limits.dflt.requests_per_minute, 0);
        assert_int_equal(cfg->limits.dflt.tokens_per_minute, 0);
        atc_config_free(cfg);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_file),
        cmocka_unit_test(test_issue_example),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_health_defaults),
        cmocka_unit_test(test_health_overrides),
        cmocka_unit_test(test_health_errors),
        cmocka_unit_test(test_engines_and_keys),
        cmocka_unit_test(test_disaggregation),
        cmocka_unit_test(test_bad_port),
        cmocka_unit_test(test_bad_url),
        cmocka_unit_test(test_https_url),
        cmocka_unit_test(test_ipv6_url),
        cmocka_unit_test(test_zero_capacity),
        cmocka_unit_test(test_replay_windows),
        cmocka_unit_test(test_duplicate_id),
        cmocka_unit_test(test_duplicate_model),
        cmocka_unit_test(test_record),
        cmocka_unit_test(test_unknown_key),
        cmocka_unit_test(test_duplicate_key),
        cmocka_unit_test(test_bad_duration),
        cmocka_unit_test(test_bad_size),
        cmocka_unit_test(test_numbers),
        cmocka_unit_test(test_simulate_undeclared_model),
        cmocka_unit_test(test_model_without_endpoints),
        cmocka_unit_test(test_discover),
        cmocka_unit_test(test_missing_required),
        cmocka_unit_test(test_wrong_type),
        cmocka_unit_test(test_yaml_syntax_error),
        cmocka_unit_test(test_empty_file),
        cmocka_unit_test(test_all_errors_reported),
        cmocka_unit_test(test_load_file),
        cmocka_unit_test(test_error_with_control_characters_stays_on_one_line),
        cmocka_unit_test(test_empty_sections),
        cmocka_unit_test(test_parse_duration),
        cmocka_unit_test(test_parse_size),
        cmocka_unit_test(test_parse_hostport),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
