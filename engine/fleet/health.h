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
 *   each attempt's outcome; relay.c reports through atc_worker_observe):
 *   consecutive failed requests eject an endpoint for a time that grows with each ejection, never more
 *   than eject.max_share of a model's endpoints at once.
 * - Per model, panic mode when every endpoint is out; slow start for an endpoint back in rotation;
 *   drain and enable from the admin API.
 * - A scrape of each server's /metrics (Prometheus text; vLLM, SGLang, TGI and llama.cpp names) into
 *   the endpoint's load (load_scrape.h reads the page).
 * - Reports for the admin API and the metrics page in health_report.h, through the views below.
 *
 * It owns each endpoint's `routable` and `slow_start_limit` and keeps its state in ep->health. Every
 * probe, timer and admin call runs on the main thread's event loop; every state change is logged, one
 * line with the reason.
 *
 * Threads: health.c runs on the main thread only, and is the only writer of everything here. Workers
 * read struct atc_endpoint_health (the policy API, while health writes it) and ep->routable and
 * ep->slow_start_limit (the balancer; endpoint.h): each of those fields is an atomic, read and written
 * relaxed (each value is consistent on its own, not with the others: routing is a heuristic over values
 * that change all the time), and the one text, last_error, is a seqlock (struct atc_health_text). The
 * pointer ep->health itself is set by atc_health_create (before the worker threads start, or with every
 * worker parked: a config reload, atc_workers_pause) and atc_health_add (before the endpoint is in any
 * table a worker sees), and cleared by _destroy (parked or stopped) and atc_health_forget (once no worker
 * sees the endpoint); an endpoint removed at run time keeps it meanwhile, reading "draining".
 * Everything else (verdicts, counters, the scraped load: workers read its values in ep->sig,
 * signals.h) stays in health.c, where only the main thread touches it. */

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fleet/health_state.h"
#include "fleet/load_scrape.h"

struct event_base;
struct evbuffer;
struct atc_config;
struct atc_endpoint;
struct atc_endpoint_table;
struct atc_health;

/** Starts checking every endpoint of @p table as @p cfg says (each endpoint's health: settings, else its
 * model's, else the top level's; @p cfg must outlive the scheduler). The first probes start at once;
 * until an endpoint's first results arrive it is "starting" and gets no traffic. Sets ep->health and
 * ep->routable of every endpoint. Returns the scheduler, or NULL and *err (static) on failure. */
struct atc_health *atc_health_create(struct event_base *base, struct atc_endpoint_table *table,
                                     const struct atc_config *cfg, const struct atc_health *previous,
                                     const char **err);

/** An endpoint that joins at run time (the admin API, discovery): its checks start as at start-up (it is
 * "starting", not routable, until they pass), with its settings from @p cfg, the config in force that
 * now holds it (@p cfg must outlive the scheduler, as atc_health_create's). Sets ep->health: call it
 * before any worker can see @p ep. 0, or -1 and *err (static): its model is unknown, out of memory. */
int atc_health_add(struct atc_health *h, struct atc_endpoint *ep, const struct atc_config *cfg,
                   const char **err);

/** An endpoint removed at run time: its checks stop, it is no longer routable, and its model's panic mode
 * and ejection cap count without it. ep->health stays (workers may still read it) and reads "draining"
 * until atc_health_forget. @p cfg: the config in force, which no longer holds it (the others' settings
 * are read there from now on). @p h NULL (no checks): it is only made unroutable. */
void atc_health_remove(struct atc_health *h, struct atc_endpoint *ep, const struct atc_config *cfg);

/** Frees what atc_health_remove kept of @p ep and clears ep->health: call it once no worker can reach @p ep
 * (before freeing it). Nothing when @p h (may be NULL) does not hold it. */
void atc_health_forget(struct atc_health *h, struct atc_endpoint *ep);

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
/** On the main thread: @p ep answered a request @p status (401/403) for atc's own key. Its last_error
 * says so (as a probe's refusal does), logged once while the text stays the same; without health checks
 * only the log line. */
void atc_health_key_refused(struct atc_endpoint *ep, int status);

/** "healthy", "unhealthy", "ejected", "draining" or "starting". */
const char *atc_health_state_name(enum atc_health_state state);

/* What the reports show of an endpoint's health: a copy (atc_health_view_endpoint). */
struct atc_health_view {
    const char *id, *model; /* borrowed from the endpoint */
    enum atc_health_state state;
    enum atc_check_verdict live, ready, deep;
    bool deep_enabled; /* else deep is OK without a probe (it can only take an endpoint out) */
    unsigned consecutive_failures;
    char last_error[ATC_HEALTH_TEXT_WORDS * 8]; /* "" if none */
    double last_check_ms;                       /* 0 = none */
    uint64_t state_changes, ejections_total;
    double slow_start; /* share of its capacity offered now: 1 unless ramping up */
    bool drained;      /* by the admin API, whatever its checks say */
    bool ejected;      /* by failures of real traffic (the state says draining if both) */
    struct atc_server_load load;
};

/* And of a model's (atc_health_view_model). */
struct atc_health_model_view {
    const char *name; /* borrowed */
    bool panic;       /* now */
    bool panic_fails; /* health.panic: fail (else route_all) */
    uint64_t panics_total;
};

/** Copies @p ep's health into @p v; false (and @p v untouched) for an endpoint without health. Main
 * thread. */
bool atc_health_view_endpoint(const struct atc_endpoint *ep, struct atc_health_view *v);

/** The endpoints @p h checks, by index 0 .. atc_health_nendpoints - 1 (borrowed). */
size_t atc_health_nendpoints(const struct atc_health *h);
const struct atc_endpoint *atc_health_endpoint_at(const struct atc_health *h, size_t i);

/** Its models, by index 0 .. atc_health_nmodels - 1, into @p v. Main thread. */
size_t atc_health_nmodels(const struct atc_health *h);
void atc_health_view_model(const struct atc_health *h, size_t i, struct atc_health_model_view *v);

/** Counters for a metrics page. */
void atc_health_stats(const struct atc_health *h, struct atc_health_stats *out);

#endif
