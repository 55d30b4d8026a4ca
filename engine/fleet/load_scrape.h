#ifndef ATC_LOAD_SCRAPE_H
#define ATC_LOAD_SCRAPE_H

/* The load scrape: the numbers of a server's load from its /metrics page (Prometheus text; vLLM, SGLang,
 * TGI and llama.cpp names). health.c runs the scrape on its timer and owns the structs below (main
 * thread); these functions touch nothing else. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The load a server reports on its /metrics page. Unknown values are NaN. Main thread only (health.c
 * publishes running and prefix_hit_rate to the workers in struct atc_endpoint_health). */
struct atc_server_load {
    double running;  /* requests being generated */
    double waiting;  /* requests queued in the server */
    double kv_usage; /* share of the KV cache in use, 0..1 */
    double kv_tokens; /* the KV cache's size in tokens (vLLM: num_gpu_blocks x block_size of
                         vllm:cache_config_info; SGLang: sglang:max_total_num_tokens) */
    double
        prefix_hit_rate; /* share of prompt tokens found in the prefix cache, between the last two scrapes */
    double scraped_ms;   /* monotonic ms of the last good scrape; 0 = none yet */
    uint64_t scrapes_total;
    uint64_t scrape_errors_total; /* failed requests and malformed pages */
    char last_error[160];         /* "" if none */
};

/* The prefix cache counters of the last page that had them, for a hit rate between two scrapes. */
struct atc_load_counters {
    double queries, hits;
    bool have;
};

/** Reads the metrics page @p page (@p len bytes) of a server of @p model, by the metric names of
 * @p engine (an enum atc_engine: that engine's current names; openai: every name atc knows), into @p load (running, waiting,
 * kv_usage, kv_tokens, prefix_hit_rate; NaN for what the page does not say, the hit rate kept when it cannot be
 * told) and @p prev. Returns 0, or -1 with why in @p why (@p size bytes) when the page is malformed:
 * then nothing changes. Counts nothing and sets no time (the caller does). */
int atc_load_scrape_page(const char *model, unsigned engine, const char *page, size_t len, struct atc_server_load *load,
                         struct atc_load_counters *prev, char *why, size_t size);

#endif
