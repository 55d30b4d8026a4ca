/* Decision latency of a policy inside atc's real runtime, and the cost of the budget machinery.
 * Not a test: prints a markdown table, or with --format json one line "ATC-BENCH {...}" for tests/bench/run
 * (latencies in µs). Reaches the budget functions through policy/watchdog.h. Usage:
 *   policy_bench [--entry scripts/policy.lua] [--endpoints 64] [--prompt-tokens 8192] [--decisions 200000]
 *                [--jit on|off] [--format table|json] [--sessions on|off] [--budget-us 1000]
 * --sessions off: every request as tests/bench/run's chat load sends it (no session, priority 0).
 * --budget-us: the decision's budget (a larger one lets a profiler such as valgrind run it without
 * overruns). */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "config/config.h"
#include "base/log.h"
#include "fleet/affinity.h"
#include "fleet/balancer.h"
#include "fleet/endpoint.h"
#include "policy/state.h"
#include "policy/watchdog.h"

#define WARMUP 5000

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static double pct(const uint64_t *sorted, size_t n, double q)
{
    return (double)sorted[(size_t)(q * (double)(n - 1))] / 1000.0;
}

static const char *bench_header(void *ctx, const char *name)
{
    return NULL;
}

int main(int argc, char **argv)
{
    const char *entry = "scripts/policy.lua";
    bool jit = false, json = false, sessions = true;
    size_t nendpoints = 64, prompt_tokens = 8192, n = 200000, budget_us = 1000;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--entry") == 0)
            entry = argv[i + 1];
        else if (strcmp(argv[i], "--endpoints") == 0)
            nendpoints = strtoul(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--prompt-tokens") == 0)
            prompt_tokens = strtoul(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--decisions") == 0)
            n = strtoul(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--budget-us") == 0)
            budget_us = strtoul(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--jit") == 0)
            jit = strcmp(argv[i + 1], "on") == 0;
        else if (strcmp(argv[i], "--sessions") == 0)
            sessions = strcmp(argv[i + 1], "off") != 0;
        else if (strcmp(argv[i], "--format") == 0)
            json = strcmp(argv[i + 1], "json") == 0;
    }
    atc_log_set_level(ATC_LOG_WARN);

    /* A fleet of one model with random load, some of it on a canary version. */
    struct atc_model_config model = {.name = "llama-3-8b"};
    struct atc_config cfg = {.models = &model, .nmodels = 1};
    atc_signal_params_init(&cfg.signals); /* the priors a config has (0 here made every predicted TTFT inf) */
    struct atc_endpoint_table *table = atc_endpoint_table_create(&cfg);
    uint64_t rng = 42;
    for (size_t i = 0; i < nendpoints; i++) {
        char id[32];
        snprintf(id, sizeof(id), "ep-%zu", i);
        struct atc_endpoint *ep = atc_endpoint_table_add(table, "llama-3-8b", id, "127.0.0.1", 9000, 64);
        ep->version = strdup(i % 16 == 0 ? "v2" : "v1");
        ep->inflight = (unsigned)(atc_random_next(&rng) % 48);
        ep->inflight_tokens = ep->inflight * 600;
    }
    struct atc_affinity *aff = atc_affinity_create(0);
    struct atc_prefix_index *pfx = atc_prefix_index_create(0);

    /* An 8k-token chat prompt (about 4 bytes a token), and a few endpoints that saw its prefix. */
    size_t content = prompt_tokens * 4;
    char *body = malloc(content + 128);
    int off =
        snprintf(body, 128, "{\"model\":\"llama-3-8b\",\"messages\":[{\"role\":\"user\",\"content\":\"");
    for (size_t i = 0; i < content; i++)
        body[off + (int)i] = (char)('a' + (i * 7 + i / 13) % 26);
    size_t len = (size_t)off + content;
    len += (size_t)snprintf(body + len, 64, "\"}],\"max_tokens\":256}");
    static struct atc_features f;
    const char *err;
    if (atc_features_scan(ATC_KIND_CHAT, body, len, &f, &err) < 0) {
        fprintf(stderr, "scan: %s\n", err);
        return 1;
    }
    for (unsigned e = 0; e < 4; e++)
        atc_prefix_index_insert(pfx, f.blocks, f.nblocks / (e + 1), e * 5, 64, 0);

    struct atc_policy_settings s = {
        .entry = entry,
        .stdlib_dir = atc_policy_stdlib_dir(),
        .budget_us = budget_us,
        .memory = 64u << 20,
        .jit = jit,
    };
    char *perr = NULL;
    struct atc_policy_runtime *rt = atc_policy_runtime_create(&s, table, aff, pfx, &perr);
    if (rt == NULL) {
        fprintf(stderr, "policy: %s\n", perr);
        return 1;
    }

    uint64_t *lat = malloc(n * sizeof(uint64_t));
    uint64_t *lat_c = malloc(n * sizeof(uint64_t));
    uint64_t *cpu = malloc(n * sizeof(uint64_t));
    unsigned fallbacks = 0;
    char session[32];
    /* Warm up first (the first decision of each session pins it; caches fill), then measure. */
    for (size_t i = 0; i < n + WARMUP; i++) {
        /* Half the requests carry one of 1000 sessions; priorities spread over 0-9. */
        snprintf(session, sizeof(session), "s-%zu", i % 1000 + (i % 100 == 0 ? i : 0)); /* 1% new sessions */
        struct atc_route_request req = {
            .id = "bench",
            .path = "/v1/chat/completions",
            .kind = ATC_KIND_CHAT,
            .features = &f,
            .priority = sessions ? (int)(i % 10) : 0,
            .tenant = "t",
            .session = sessions && i % 2 ? session : "",
            .attempt = 1,
            .header = bench_header,
        };
        struct atc_decision d;
        uint64_t c0 = atc_thread_cpu_ns();
        uint64_t t0 = atc_mono_ns();
        atc_policy_route(rt, &req, &d);
        uint64_t t1 = atc_mono_ns();
        uint64_t c1 = atc_thread_cpu_ns();
        t1 = atc_mono_ns();
        atc_balancer_pick(&table->models[0], &rng, NULL, 0, 8448);
        uint64_t t2 = atc_mono_ns();
        if (i < WARMUP)
            continue;
        lat[i - WARMUP] = t1 - t0;
        lat_c[i - WARMUP] = t2 - t1;
        cpu[i - WARMUP] = c1 - c0;
        fallbacks += d.kind == ATC_DECISION_FALLBACK;
    }
    qsort(lat, n, sizeof(uint64_t), cmp_u64);
    qsort(lat_c, n, sizeof(uint64_t), cmp_u64);
    qsort(cpu, n, sizeof(uint64_t), cmp_u64);

    /* The budget machinery alone: what every decision pays to be stoppable. */
    struct watchdog *w = rt->watchdog;
    size_t reps = 2000000;
    uint64_t t0 = atc_mono_ns();
    for (size_t i = 0; i < reps; i++) {
        policy_budget_begin(w, rt->current->L, 1000);
        policy_budget_end(w, rt->current->L);
    }
    double budget_ns = (double)(atc_mono_ns() - t0) / (double)reps;

    if (json) {
        printf("ATC-BENCH {\"entry\": \"%s\", \"jit\": %s, \"endpoints\": %zu, \"prompt_tokens\": %zu, "
               "\"prefix_blocks\": %zu, \"decisions\": %zu, \"lua_p50_us\": %.3f, \"lua_p99_us\": %.3f, "
               "\"lua_p999_us\": %.3f, \"lua_cpu_p50_us\": %.3f, \"lua_cpu_p99_us\": %.3f, "
               "\"c_p50_us\": %.3f, \"c_p99_us\": %.3f, \"c_p999_us\": %.3f, \"budget_ns\": %.1f, "
               "\"fallbacks\": %u}\n",
               entry, jit ? "true" : "false", nendpoints, prompt_tokens, f.nblocks, n, pct(lat, n, 0.5),
               pct(lat, n, 0.99), pct(lat, n, 0.999), pct(cpu, n, 0.5), pct(cpu, n, 0.99), pct(lat_c, n, 0.5),
               pct(lat_c, n, 0.99), pct(lat_c, n, 0.999), budget_ns, fallbacks);
        goto done;
    }
    printf(
        "| decision (%zu endpoints, %zu-token prompt, %zu prefix blocks, %zu decisions) | p50 µs | p99 µs | "
        "p99.9 µs |\n|---|--:|--:|--:|\n",
        nendpoints, prompt_tokens, f.nblocks, n);
    printf("| Lua policy %s, %s | %.2f | %.2f | %.2f |\n", entry, jit ? "JIT on (trusted)" : "interpreted",
           pct(lat, n, 0.5), pct(lat, n, 0.99), pct(lat, n, 0.999));
    printf(
        "| the same, thread CPU time (leaves out preemption; includes ~0.5 µs of clock call) | %.2f | %.2f | "
        "%.2f |\n",
        pct(cpu, n, 0.5), pct(cpu, n, 0.99), pct(cpu, n, 0.999));
    printf("| built-in C balancer | %.2f | %.2f | %.2f |\n", pct(lat_c, n, 0.5), pct(lat_c, n, 0.99),
           pct(lat_c, n, 0.999));
    printf("\nbudget machinery per decision (arm + disarm the watchdog): %.1f ns; policy fallbacks: %u\n",
           budget_ns, fallbacks);
done:
    atc_policy_runtime_destroy(rt);
    atc_affinity_destroy(aff);
    atc_prefix_index_destroy(pfx);
    atc_endpoint_table_destroy(table);
    free(lat);
    free(lat_c);
    free(cpu);
    free(body);
    return 0;
}
