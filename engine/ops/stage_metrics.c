/* A disaggregated model's stages in /metrics: stage_metrics.h. */

#include "ops/stage_metrics.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "base/histogram.h"

#define NELEMS(a) (sizeof(a) / sizeof((a)[0]))

/* ms to minutes: a prefill of a long prompt on a busy server takes seconds, a transfer milliseconds */
static const double stage_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                      0.5,   1,      2.5,   5,    10,    30,   60};

const char *const atc_stage_failure_names[ATC_STAGE_FAIL_COUNT] = {
    "connection", "timeout", "http_5xx", "http_429", "no_kv_transfer_params", "other",
};

static const char *const stage_names[] = {"prefill", "decode"};

/* One configured model's figures: few (the config's disaggregated models), on a list. */
struct model_stages {
    char model[128];
    uint64_t failures[2][ATC_STAGE_FAIL_COUNT];
    uint64_t retries[2];
    struct atc_histogram prefill, decode_first;
    struct model_stages *next;
};

struct atc_stage_metrics {
    pthread_mutex_t mu; /* covers the list and every figure on it */
    struct model_stages *models;
};

struct atc_stage_metrics *atc_stage_metrics_create(void)
{
    struct atc_stage_metrics *s = calloc(1, sizeof(*s));
    if (s != NULL && pthread_mutex_init(&s->mu, NULL) != 0) {
        free(s);
        return NULL;
    }
    return s;
}

void atc_stage_metrics_free(struct atc_stage_metrics *s)
{
    if (s == NULL)
        return;
    while (s->models != NULL) {
        struct model_stages *m = s->models;
        s->models = m->next;
        free(m);
    }
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* Under the lock: @p model's figures, made on first use; NULL when out of memory. */
static struct model_stages *model_of(struct atc_stage_metrics *s, const char *model)
{
    size_t n = strnlen(model, sizeof(s->models->model) - 1);
    for (struct model_stages *m = s->models; m != NULL; m = m->next)
        if (memcmp(m->model, model, n) == 0 && m->model[n] == '\0')
            return m;
    struct model_stages *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return NULL;
    memcpy(m->model, model, n);
    atc_histogram_init(&m->prefill, stage_bounds, NELEMS(stage_bounds));
    atc_histogram_init(&m->decode_first, stage_bounds, NELEMS(stage_bounds));
    m->next = s->models;
    s->models = m;
    return m;
}

void atc_stage_failed(struct atc_stage_metrics *s, const char *model, enum atc_stage stage,
                      enum atc_stage_failure why)
{
    pthread_mutex_lock(&s->mu);
    struct model_stages *m = model_of(s, model);
    if (m != NULL)
        m->failures[stage][why]++;
    pthread_mutex_unlock(&s->mu);
}

void atc_stage_retried(struct atc_stage_metrics *s, const char *model, enum atc_stage stage)
{
    pthread_mutex_lock(&s->mu);
    struct model_stages *m = model_of(s, model);
    if (m != NULL)
        m->retries[stage]++;
    pthread_mutex_unlock(&s->mu);
}

void atc_stage_times(struct atc_stage_metrics *s, const char *model, double prefill_s, double decode_first_s)
{
    pthread_mutex_lock(&s->mu);
    struct model_stages *m = model_of(s, model);
    if (m != NULL && prefill_s >= 0)
        atc_histogram_observe(&m->prefill, prefill_s);
    if (m != NULL && decode_first_s >= 0)
        atc_histogram_observe(&m->decode_first, decode_first_s);
    pthread_mutex_unlock(&s->mu);
}

static void model_label(struct evbuffer *out, const struct model_stages *m)
{
    evbuffer_add(out, "model=\"", 7);
    atc_histogram_label(out, m->model);
    evbuffer_add(out, "\"", 1);
}

void atc_stage_metrics_render(struct atc_stage_metrics *s, struct evbuffer *out)
{
    pthread_mutex_lock(&s->mu);
    if (s->models == NULL) {
        pthread_mutex_unlock(&s->mu);
        return;
    }
    evbuffer_add_printf(out, "# HELP atc_disagg_failures_total Failures of a disaggregated model's stage, by "
                             "reason.\n# TYPE atc_disagg_failures_total counter\n");
    for (const struct model_stages *m = s->models; m != NULL; m = m->next)
        for (int st = 0; st < 2; st++)
            for (int why = 0; why < ATC_STAGE_FAIL_COUNT; why++) {
                evbuffer_add(out, "atc_disagg_failures_total{", 26);
                model_label(out, m);
                evbuffer_add_printf(out, ",stage=\"%s\",reason=\"%s\"} %llu\n", stage_names[st],
                                    atc_stage_failure_names[why], (unsigned long long)m->failures[st][why]);
            }
    evbuffer_add_printf(out, "# HELP atc_disagg_retries_total A stage sent again to another server (SGLang: "
                             "the pair again).\n# TYPE atc_disagg_retries_total counter\n");
    for (const struct model_stages *m = s->models; m != NULL; m = m->next)
        for (int st = 0; st < 2; st++) {
            evbuffer_add(out, "atc_disagg_retries_total{", 25);
            model_label(out, m);
            evbuffer_add_printf(out, ",stage=\"%s\"} %llu\n", stage_names[st],
                                (unsigned long long)m->retries[st]);
        }
    static const char *const names[] = {"atc_disagg_prefill_seconds",
                                        "atc_disagg_decode_first_token_seconds"};
    static const char *const helps[] = {
        "From the prefill request's send to its answer (vLLM).",
        "From the prefill answer (SGLang: the pair's send) to the first token: KV transfer and first step.",
    };
    for (int k = 0; k < 2; k++) {
        evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s histogram\n", names[k], helps[k], names[k]);
        for (const struct model_stages *m = s->models; m != NULL; m = m->next) {
            struct evbuffer *labels = evbuffer_new();
            if (labels == NULL)
                continue;
            model_label(labels, m);
            evbuffer_add(labels, ",", 2); /* and its NUL */
            atc_histogram_render(k == 0 ? &m->prefill : &m->decode_first, out, names[k],
                                 (const char *)evbuffer_pullup(labels, -1));
            evbuffer_free(labels);
        }
    }
    pthread_mutex_unlock(&s->mu);
}
