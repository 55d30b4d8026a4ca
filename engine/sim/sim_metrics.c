/* atc sim's GET /metrics (sim_metrics.h). */

#include "sim/sim_metrics.h"

#include <event2/buffer.h>

#include "base/json.h"
#include "sim/sim.h"

/* One sample; with_model adds the model_name label (vLLM, SGLang) and vLLM V1's engine="0". */
static void add_metric(struct evbuffer *b, const struct atc_sim_params *p, const char *name, const char *type,
                       const char *help, double v)
{
    evbuffer_add_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s", name, help, name, type, name);
    if (p->engine == ATC_SIM_VLLM || p->engine == ATC_SIM_SGLANG) {
        evbuffer_add_printf(b, "{%smodel_name=", p->engine == ATC_SIM_VLLM ? "engine=\"0\"," : "");
        atc_json_write_string(b, p->model); /* Prometheus label escaping is JSON's for \ and " */
        evbuffer_add(b, "}", 1);
    }
    evbuffer_add_printf(b, " %.17g\n", v);
}

/* vLLM V1's names (vllm/v1/metrics/loggers.py, PrometheusStatLogger; counters get _total). */
static void metrics_vllm(struct evbuffer *b, const struct atc_sim_params *p, const struct atc_sim_stats *st)
{
    add_metric(b, p, "vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
               st->running);
    add_metric(b, p, "vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
               st->waiting);
    add_metric(b, p, "vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
               st->kv_usage);
    add_metric(b, p, "vllm:prefix_cache_queries_total", "counter",
               "Prefix cache queries, in terms of number of queried tokens.", (double)st->prefix_queries);
    add_metric(b, p, "vllm:prefix_cache_hits_total", "counter",
               "Prefix cache hits, in terms of number of cached tokens.", (double)st->prefix_hits);
    add_metric(b, p, "vllm:num_preemptions_total", "counter",
               "Cumulative number of preemption from the engine.", (double)st->preemptions);
    add_metric(b, p, "vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
               (double)st->tokens);
    /* The info metric: the cache's size is in its labels (atc's scrape learns ep.kv_tokens from it). */
    evbuffer_add_printf(b,
                        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
                        "# TYPE vllm:cache_config_info gauge\n"
                        "vllm:cache_config_info{block_size=\"%u\",num_gpu_blocks=\"%llu\"} 1.0\n",
                        (unsigned)ATC_SIM_KV_BLOCK_TOKENS,
                        (unsigned long long)(atc_sim_params_kv_tokens(p) / ATC_SIM_KV_BLOCK_TOKENS));
}

/* SGLang's (python/sglang/srt/metrics/collector.py, SchedulerMetricsCollector): gauges only, the hit
 * rate a share. */
static void metrics_sglang(struct evbuffer *b, const struct atc_sim_params *p, const struct atc_sim_stats *st)
{
    uint64_t kv = atc_sim_params_kv_tokens(p);
    add_metric(b, p, "sglang:num_running_reqs", "gauge", "The number of running requests.", st->running);
    add_metric(b, p, "sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.",
               st->waiting);
    add_metric(b, p, "sglang:num_used_tokens", "gauge", "The number of used tokens.",
               st->kv_usage * (double)kv);
    add_metric(b, p, "sglang:token_usage", "gauge", "The token usage.", st->kv_usage);
    add_metric(b, p, "sglang:max_total_num_tokens", "gauge",
               "Maximum total number of tokens in the KV cache.", (double)kv);
    add_metric(b, p, "sglang:cache_hit_rate", "gauge", "The prefix cache hit rate.",
               st->prefix_queries ? (double)st->prefix_hits / (double)st->prefix_queries : 0.0);
    add_metric(b, p, "sglang:generation_tokens_total", "counter", "Number of generation tokens processed.",
               (double)st->tokens);
}

/* llama.cpp's (tools/server/server.cpp get_metrics, --metrics): no labels; kv_cache_usage_ratio and
 * kv_cache_tokens are gone from the current server. */
static void metrics_llamacpp(struct evbuffer *b, const struct atc_sim_params *p,
                             const struct atc_sim_stats *st)
{
    add_metric(b, p, "llamacpp:prompt_tokens_total", "counter", "Number of prompt tokens processed.",
               (double)(st->prefix_queries - st->prefix_hits));
    add_metric(b, p, "llamacpp:tokens_predicted_total", "counter", "Number of generation tokens processed.",
               (double)st->tokens);
    add_metric(b, p, "llamacpp:n_decode_total", "counter", "Total number of llama_decode() calls",
               (double)st->iterations);
    add_metric(b, p, "llamacpp:requests_processing", "gauge", "Number of requests processing.", st->running);
    add_metric(b, p, "llamacpp:requests_deferred", "gauge", "Number of requests deferred.", st->waiting);
}

/* TGI's router (router/src/infer, router/src/server.rs): no labels. */
static void metrics_tgi(struct evbuffer *b, const struct atc_sim_params *p, const struct atc_sim_stats *st,
                        uint64_t accepted)
{
    add_metric(b, p, "tgi_queue_size", "gauge", "Current queue size", st->waiting);
    add_metric(b, p, "tgi_batch_current_size", "gauge", "Current batch size", st->running);
    add_metric(b, p, "tgi_request_count", "counter", "Total number of requests", (double)accepted);
}

void atc_sim_metrics_write(struct evbuffer *b, const struct atc_sim_params *p, const struct atc_sim_stats *st,
                           uint64_t accepted)
{
    switch (p->engine) {
    case ATC_SIM_VLLM:
        metrics_vllm(b, p, st);
        break;
    case ATC_SIM_SGLANG:
        metrics_sglang(b, p, st);
        break;
    case ATC_SIM_LLAMACPP:
        metrics_llamacpp(b, p, st);
        break;
    case ATC_SIM_TGI:
        metrics_tgi(b, p, st, accepted);
        break;
    }
}
