#ifndef ATC_METRICS_H
#define ATC_METRICS_H

/* Prometheus metrics: counters and histograms the request path feeds, and the text exposition format
 * (version 0.0.4) rendered on scrape together with the gauges read from the live tables. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h" /* ATC_MAX_WORKERS */

struct evbuffer;
struct atc_metrics;
struct atc_endpoint_table;
struct atc_policy_runtime;
struct atc_admission;
struct atc_health;

/* What a scrape shows besides the counters of this file, gathered by whoever holds the workers (the admin
 * API: the workers' parts are copies each made on its own thread, atc_workers_visit) and borrowed for the
 * length of atc_metrics_render. metrics.c reads these through the owning subsystems' headers and knows
 * nothing of the server or its workers; it does not read the workers' upstream pools (theirs alone). */
struct atc_cluster;
struct atc_limits;
struct atc_kv_events;

struct atc_metrics_sources {
    const struct atc_endpoint_table *table;
    unsigned nworkers;                                    /* worker_requests[0..nworkers) */
    const size_t *idle; /* [table->nendpoints]: idle upstream connections, all workers; NULL: none known */
    struct atc_policy_runtime *policies[ATC_MAX_WORKERS]; /* copies (policy/status.h); none without a policy */
    size_t npolicies;
    struct atc_admission *admissions[ATC_MAX_WORKERS]; /* copies of the workers' that have a queue */
    size_t nadmissions;
    const struct atc_health *health;           /* NULL without health checks */
    uint64_t worker_requests[ATC_MAX_WORKERS]; /* client requests accepted, by worker */
    unsigned active;                           /* client requests in progress, all workers */
    uint64_t worker_parks;                     /* times every worker was parked (atc_workers_pause) */
    size_t endpoints_removed;                  /* removed, not freed yet (proxy/table_swap.h) */
    struct atc_cluster *cluster;               /* NULL without cluster: */
    struct atc_limits *limits;                 /* NULL without limits: */
    const struct atc_kv_events *kv;            /* NULL without kv_events: */
};

/* What one finished request contributes. */
struct atc_request_metrics {
    const char *model;
    const char *endpoint; /* NULL when it never reached one */
    int status;           /* as the client saw it; 499 when the client left first */
    int priority;
    double ttft_s; /* < 0 when no answer started */
    double total_s;
    unsigned retries;
    uint64_t bytes; /* relayed to the client */
    uint64_t sse_events;
    bool broken; /* the answer broke after it started (status sent, then an error event or a cut) */
};

struct atc_metrics *atc_metrics_create(void);
void atc_metrics_destroy(struct atc_metrics *m);

void atc_metrics_request(struct atc_metrics *m, const struct atc_request_metrics *r);
/** One policy decision: its latency and, when the C balancer had to step in, why (else NULL). */
void atc_metrics_decision(struct atc_metrics *m, double seconds, const char *fallback_reason);

/** The disaggregated models' stage figures (ops/stage_metrics.h), which the request path feeds. */
struct atc_stage_metrics *atc_metrics_stages(struct atc_metrics *m);

/** Renders every metric into @p out: this file's counters, then the gauges and counters of @p src's
 * subsystems (borrowed), read now. Takes m's lock only while its own series are written. */
void atc_metrics_render(struct atc_metrics *m, const struct atc_metrics_sources *src, struct evbuffer *out);

#endif
