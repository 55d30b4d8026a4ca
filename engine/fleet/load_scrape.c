/* The load scrape (load_scrape.h): a server's /metrics page, by the metric names of each server, into
 * the numbers of its load. */

#include "fleet/load_scrape.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/engine_profile.h"
#include "fleet/prometheus.h"

enum load_slot { L_RUNNING, L_WAITING, L_KV, L_KV_TOKENS, L_QUERIES, L_HITS, L_HIT_RATE, NSLOTS };

struct load_acc {
    const char *model;
    unsigned engine;
    double mine[NSLOTS], all[NSLOTS]; /* series labelled with this model / every series */
    bool has_mine[NSLOTS], has_all[NSLOTS];
};

/* Metric names by engine, for each slot. Gauges of a share are combined by max, counts by sum. An engine
 * profile (engine: in the config) scrapes its engine's current names; the generic openai profile tries
 * every name below, old ones included. */
#define OLD ATC_ENGINE_COUNT /* a name an engine no longer exports: the generic profile's only */
static const struct {
    const char *name;
    enum load_slot slot;
    unsigned engine; /* enum atc_engine, or OLD */
} load_metrics[] = {
    /* vllm-project/vllm, vllm/v1/metrics/loggers.py (PrometheusStatLogger) */
    {"vllm:num_requests_running", L_RUNNING, ATC_ENGINE_VLLM},
    {"vllm:num_requests_waiting", L_WAITING, ATC_ENGINE_VLLM},
    {"vllm:kv_cache_usage_perc", L_KV, ATC_ENGINE_VLLM},
    {"vllm:gpu_cache_usage_perc", L_KV, OLD}, /* vLLM before 0.10 */
    {"vllm:prefix_cache_queries_total", L_QUERIES, ATC_ENGINE_VLLM},
    {"vllm:prefix_cache_hits_total", L_HITS, ATC_ENGINE_VLLM},
    {"vllm:gpu_prefix_cache_hit_rate", L_HIT_RATE, OLD}, /* vLLM v0 */
    /* sgl-project/sglang, python/sglang/srt/metrics/collector.py (SchedulerMetricsCollector); only
     * with --enable-metrics */
    {"sglang:num_running_reqs", L_RUNNING, ATC_ENGINE_SGLANG},
    {"sglang:num_queue_reqs", L_WAITING, ATC_ENGINE_SGLANG},
    {"sglang:token_usage", L_KV, ATC_ENGINE_SGLANG},
    {"sglang:max_total_num_tokens", L_KV_TOKENS, ATC_ENGINE_SGLANG},
    {"sglang:cache_hit_rate", L_HIT_RATE, ATC_ENGINE_SGLANG},
    /* huggingface/text-generation-inference, backends/v3/src/backend.rs, queue.rs, lib.rs: the batch,
     * the queue, and the token budget warmup found room for (its KV cache) */
    {"tgi_batch_current_size", L_RUNNING, ATC_ENGINE_TGI},
    {"tgi_queue_size", L_WAITING, ATC_ENGINE_TGI},
    {"tgi_batch_max_total_tokens", L_KV_TOKENS, ATC_ENGINE_TGI},
    /* ggml-org/llama.cpp, tools/server/server-context.cpp (the /metrics handler; with --metrics) */
    {"llamacpp:requests_processing", L_RUNNING, ATC_ENGINE_LLAMACPP},
    {"llamacpp:requests_deferred", L_WAITING, ATC_ENGINE_LLAMACPP},
    {"llamacpp:kv_cache_usage_ratio", L_KV, OLD}, /* removed from llama.cpp's server */
};

static void acc_add(double *v, bool *has, enum load_slot slot, double x)
{
    bool share = slot == L_KV || slot == L_HIT_RATE || slot == L_KV_TOKENS;
    v[slot] = !*has ? x : share ? fmax(v[slot], x) : v[slot] + x;
    *has = true;
}

/* A label's value as a number; NaN when absent or not a number. */
static double label_number(const struct atc_prom_sample *s, const char *name)
{
    for (size_t i = 0; i < s->nlabels; i++) {
        const struct atc_prom_label *l = &s->labels[i];
        if (l->name_len != strlen(name) || memcmp(l->name, name, l->name_len) != 0 || l->value_len >= 32)
            continue;
        char buf[32], *end;
        memcpy(buf, l->value, l->value_len);
        buf[l->value_len] = '\0';
        double x = strtod(buf, &end);
        return end != buf && *end == '\0' && isfinite(x) && x >= 0 ? x : NAN;
    }
    return NAN;
}

static int on_load_sample(void *arg, const struct atc_prom_sample *s)
{
    struct load_acc *a = arg;
    if (!isfinite(s->value))
        return 0;
    if ((a->engine == ATC_ENGINE_OPENAI || a->engine == ATC_ENGINE_VLLM) &&
        atc_prom_name_is(s, "vllm:cache_config_info")) { /* an info metric: the sizes are labels */
        double blocks = label_number(s, "num_gpu_blocks"), size = label_number(s, "block_size");
        if (!isnan(blocks) && !isnan(size))
            acc_add(a->all, &a->has_all[L_KV_TOKENS], L_KV_TOKENS, blocks * size);
        return 0;
    }
    for (size_t i = 0; i < sizeof(load_metrics) / sizeof(load_metrics[0]); i++) {
        if ((a->engine != ATC_ENGINE_OPENAI && load_metrics[i].engine != a->engine) ||
            !atc_prom_name_is(s, load_metrics[i].name))
            continue;
        enum load_slot slot = load_metrics[i].slot;
        acc_add(a->all, &a->has_all[slot], slot, s->value);
        if (atc_prom_label_is(s, "model_name", a->model))
            acc_add(a->mine, &a->has_mine[slot], slot, s->value);
        break;
    }
    return 0;
}

/* A server may serve several models (and label each series): this endpoint's model's series when there
 * are any, else all of them. NaN when the page has none. */
static double acc_get(const struct load_acc *a, enum load_slot slot)
{
    return a->has_mine[slot] ? a->mine[slot] : a->has_all[slot] ? a->all[slot] : NAN;
}

int atc_load_scrape_page(const char *model, unsigned engine, const char *page, size_t len,
                         struct atc_server_load *load, struct atc_load_counters *prev, char *why, size_t size)
{
    struct load_acc a = {.model = model, .engine = engine};
    struct atc_prom_error perr = {0};
    if (atc_prom_parse(page, len, on_load_sample, &a, &perr) != 0) {
        snprintf(why, size, "malformed metrics page: line %zu: %s", perr.line, perr.msg);
        return -1;
    }
    load->running = acc_get(&a, L_RUNNING);
    load->waiting = acc_get(&a, L_WAITING);
    load->kv_usage = acc_get(&a, L_KV);
    load->kv_tokens = acc_get(&a, L_KV_TOKENS);
    double q = acc_get(&a, L_QUERIES), hits = acc_get(&a, L_HITS), rate = acc_get(&a, L_HIT_RATE);
    if (!isnan(rate)) {
        load->prefix_hit_rate = rate;
    } else if (!isnan(q) && !isnan(hits)) {
        /* Counters: the rate since the last scrape (a restart resets them: start again). */
        if (prev->have && q > prev->queries && hits >= prev->hits)
            load->prefix_hit_rate = (hits - prev->hits) / (q - prev->queries);
        prev->queries = q;
        prev->hits = hits;
        prev->have = true;
    }
    return 0;
}
