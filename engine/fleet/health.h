#ifndef ATC_HEALTH_H
#define ATC_HEALTH_H

/* Endpoint health: what decides whether an endpoint gets traffic, and the server load it reports.
 *
 * - Active checks per endpoint, each on its own jittered libevent timer: live (GET /health: the process
 *   answers), ready (GET /v1/models lists the model: it can serve it now), deep (a real request with
 *   max_tokens 1: it can generate). Each check's verdict flips only after failure_threshold failures
 *   or recovery_threshold successes in a row (HAProxy's fall/rise), except its very first result,
 *   which counts at once (start-up grace). Probes run at fast_interval while a verdict is changing.
 * - Passive outlier ejection from real traffic (atc_health_observe, called on the main thread with
 *   each attempt's outcome; relay.c reports through atc_server_observe):
 *   consecutive failed requests eject an endpoint for a time that grows with each ejection, never more
 *   than eject.max_share of a model's endpoints at once.
 * - Per model, panic mode when every endpoint is out; slow start for an endpoint back in rotation;
 *   drain and enable from the admin API.
 * - A scrape of each server's /metrics (Prometheus text; vLLM, SGLang, TGI and llama.cpp names) into
 *   the endpoint's load.
 *
 * It owns each endpoint's `routable` and `slow_start_limit` and keeps its state in ep->health. Single
 * threaded: everything runs on the event loop that routes. Every state change is logged, one line
 * with the reason. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct event_base;
struct evbuffer;
struct atc_config;
struct atc_endpoint;
struct atc_endpoint_table;
struct atc_health;

enum atc_health_state {
    ATC_HEALTH_STARTING,  /* answering (or not checked yet) but not ready: loading its model */
    ATC_HEALTH_HEALTHY,   /* in rotation */
    ATC_HEALTH_UNHEALTHY, /* its live or deep check has failed */
    ATC_HEALTH_EJECTED,   /* taken out for a while by failures of real traffic */
    ATC_HEALTH_DRAINING,  /* taken out by the admin API; in-flight requests finish */
};

/* A check's verdict. */
enum atc_check_verdict { ATC_CHECK_UNKNOWN = -1, ATC_CHECK_FAILED = 0, ATC_CHECK_OK = 1 };

/* The load a server reports on its /metrics page. Unknown values are NaN. */
struct atc_server_load {
    double running;  /* requests being generated */
    double waiting;  /* requests queued in the server */
    double kv_usage; /* share of the KV cache in use, 0..1 */
    double
        prefix_hit_rate; /* share of prompt tokens found in the prefix cache, between the last two scrapes */
    double scraped_ms;   /* monotonic ms of the last good scrape; 0 = none yet */
    uint64_t scrapes_total;
    uint64_t scrape_errors_total; /* failed requests and malformed pages */
    char last_error[160];         /* "" if none */
};

/* What everyone may read about an endpoint's health (ep->health). */
struct atc_endpoint_health {
    enum atc_health_state state;
    enum atc_check_verdict live, ready, deep; /* deep starts OK: it can only take an endpoint out */
    unsigned consecutive_failures;            /* the longest current run of failed probes of one check */
    char last_error[192];                     /* the last failed probe or ejection, with why; "" if none */
    double last_check_ms; /* monotonic ms (atc.now()'s clock) of the last probe; 0 = none */
    uint64_t state_changes;
    uint64_t ejections_total;
    double slow_start; /* share of its capacity offered now: 1 unless ramping up */
    struct atc_server_load load;
};

struct atc_health_stats {
    uint64_t probes_total;
    uint64_t probe_failures_total;
    uint64_t state_changes_total;
    uint64_t ejections_total;
    uint64_t panics_total;  /* times a model entered panic mode */
    size_t models_in_panic; /* now */
    uint64_t scrapes_total;
    uint64_t scrape_errors_total;
};

/** Starts checking every endpoint of @p table as @p cfg says (each endpoint's health: settings, else its
 * model's, else the top level's; @p cfg must outlive the scheduler). The first probes start at once;
 * until an endpoint's first results arrive it is "starting" and gets no traffic. Sets ep->health and
 * ep->routable of every endpoint. Returns the scheduler, or NULL and *err (static) on failure. */
struct atc_health *atc_health_create(struct event_base *base, struct atc_endpoint_table *table,
                                     const struct atc_config *cfg, const struct atc_health *previous,
                                     const char **err);

/** Stops every probe and timer and clears ep->health (before the table and its pools go). NULL is fine. */
void atc_health_destroy(struct atc_health *h);

/** Calls @p cb(@p arg) once, from the loop, when every endpoint's first live and ready probes have
 * ended (at most one probe timeout after start), so that a caller can say "ready" only once the
 * endpoints that are up take traffic. Called at once (from the loop) without active checks. */
void atc_health_on_first_round(struct atc_health *h, void (*cb)(void *arg), void *arg);

/** Calls @p cb(@p arg) from the loop soon after an endpoint became routable or offers more capacity
 * (back in rotation, enabled, slow start ramping up), so that requests waiting for room can be placed. */
void atc_health_on_capacity(struct atc_health *h, void (*cb)(void *arg), void *arg);

/** Drains (@p drain true) or re-enables @p ep: a drained endpoint gets no new requests; those in flight
 * finish. Logs the change. */
void atc_health_set_drained(struct atc_health *h, struct atc_endpoint *ep, bool drain);

/** Passive check: the outcome of one real request to @p ep (ok false for connection failures, timeouts
 * and 5xx only). May eject the endpoint. No-op for an endpoint without health. */
void atc_health_observe(struct atc_endpoint *ep, bool ok);

/** "healthy", "unhealthy", "ejected", "draining" or "starting". */
const char *atc_health_state_name(enum atc_health_state state);

/** Appends the health fields of @p ep as JSON object members, each preceded by a comma
 * (,"state":"healthy",...,"load":{...}); nothing for an endpoint without health. */
void atc_health_endpoint_json(const struct atc_endpoint *ep, struct evbuffer *out);

/** Appends {"models":[{"name","panic","panics_total"}...],"state_changes_total",...} for @p h. */
void atc_health_status_json(const struct atc_health *h, struct evbuffer *out);

/** Appends the Prometheus metrics of health: each endpoint's state, check failures, ejections and
 * scraped load, each model's panic mode, and the probe and scrape counters. */
void atc_health_metrics(const struct atc_health *h, struct evbuffer *out);

/** Counters for a metrics page. */
void atc_health_stats(const struct atc_health *h, struct atc_health_stats *out);

#endif
