#ifndef ATC_METRICS_H
#define ATC_METRICS_H

/* Prometheus metrics: counters and histograms the request path feeds, and the text exposition format
 * (version 0.0.4) rendered on scrape together with the gauges read from the live tables. */

#include <stdint.h>

#include "core/histogram.h"

struct evbuffer;
struct atc_metrics;
struct atc_server;

/* What one finished request contributes. */
struct atc_request_metrics {
    const char *model;
    const char *endpoint; /* NULL when it never reached one */
    int status;           /* as the client saw it; 499 when the client left first */
    int priority;
    double ttft_s;        /* < 0 when no answer started */
    double total_s;
    unsigned retries;
    uint64_t bytes;       /* relayed to the client */
    uint64_t sse_events;
};

struct atc_metrics *atc_metrics_create(void);
void atc_metrics_destroy(struct atc_metrics *m);

void atc_metrics_request(struct atc_metrics *m, const struct atc_request_metrics *r);
/** One policy decision: its latency and, when the C balancer had to step in, why (else NULL). */
void atc_metrics_decision(struct atc_metrics *m, double seconds, const char *fallback_reason);

/** Renders every metric, including gauges read now from @p srv's tables, into @p out. */
void atc_metrics_render(struct atc_metrics *m, const struct atc_server *srv, struct evbuffer *out);

#endif
