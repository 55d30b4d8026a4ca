#ifndef ATC_STAGE_METRICS_H
#define ATC_STAGE_METRICS_H

/* The two stages of a disaggregated model's requests (proxy/disagg.c) in /metrics, per model and stage:
 * failures by reason, retries on another server of the stage, and the stages' times as histograms
 * (prefill: from the prefill send to its answer, vLLM; decode first token: from that answer, or from the
 * pair's send for SGLang, to the client's first token: the KV's transfer and the first decode step).
 * One per process, fed by every worker under its own lock, a few times per request at most. */

#include <stdbool.h>

struct evbuffer;
struct atc_stage_metrics;

enum atc_stage { ATC_STAGE_PREFILL, ATC_STAGE_DECODE };

/* Why a stage failed: the reasons a failure is counted under (atc_stage_failure_names). */
enum atc_stage_failure {
    ATC_STAGE_FAIL_CONNECTION, /* refused, reset, closed before the answer ended */
    ATC_STAGE_FAIL_TIMEOUT,
    ATC_STAGE_FAIL_HTTP_5XX,
    ATC_STAGE_FAIL_HTTP_429,
    ATC_STAGE_FAIL_NO_KV_PARAMS, /* vLLM: a prefill answer without kv_transfer_params */
    ATC_STAGE_FAIL_OTHER,        /* a refused key, no memory */
    ATC_STAGE_FAIL_COUNT,
};

extern const char *const atc_stage_failure_names[ATC_STAGE_FAIL_COUNT];

struct atc_stage_metrics *atc_stage_metrics_create(void);
void atc_stage_metrics_free(struct atc_stage_metrics *s);

/** A failure of @p stage of a request of @p model (a configured model's name), for @p why. */
void atc_stage_failed(struct atc_stage_metrics *s, const char *model, enum atc_stage stage,
                      enum atc_stage_failure why);
/** The stage went to another server (vLLM: another prefill server, or a decode retry with the same
 * transfer params; SGLang: the pair again, counted under the stage that failed). */
void atc_stage_retried(struct atc_stage_metrics *s, const char *model, enum atc_stage stage);
/** The times of one request's stages, in seconds; < 0: not known (SGLang has no prefill time). */
void atc_stage_times(struct atc_stage_metrics *s, const char *model, double prefill_s, double decode_first_s);

/** Appends the series to @p out (nothing before a disaggregated request). */
void atc_stage_metrics_render(struct atc_stage_metrics *s, struct evbuffer *out);

#endif
