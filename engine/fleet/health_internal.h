#ifndef ATC_HEALTH_INTERNAL_H
#define ATC_HEALTH_INTERNAL_H

/* The health checker's state, private to fleet/health.c (which writes it, on the main thread) and
 * fleet/health_report.c (which copies it into the views of health.h, on the main thread too). */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "fleet/endpoint.h"
#include "fleet/health_state.h"
#include "fleet/load_scrape.h"

struct event;
struct evbuffer;
struct atc_upstream_req;
struct atc_upstream_pool;
struct atc_engine_profile;

enum probe_kind { PROBE_LIVE, PROBE_READY, PROBE_DEEP, PROBE_SCRAPE, NPROBES };

struct hep;

struct probe {
    struct hep *e;
    enum probe_kind kind;
    const struct atc_check_config *cfg;
    bool enabled;
    struct event *timer;          /* starts the next probe */
    struct event *deadline;       /* ends the running probe */
    struct atc_upstream_req *req; /* the running probe, NULL between probes */
    struct evbuffer *body;
    size_t body_max;
    int status;
    uint64_t started_ms;
    enum atc_check_verdict verdict;
    unsigned oks, fails; /* consecutive raw results */
    bool loading;        /* its last failure was a sign of start-up within the grace (refused, loading
                            503), and it has not passed recovery_threshold times in a row since */
    bool refused;        /* its last answer was 401/403: the server refused atc's credentials */
    bool first_pending;  /* counts towards the first round */
};

struct hmodel {
    struct atc_health *h;
    char *name;                          /* its own copy: the table's goes with the table */
    const struct atc_health_config *cfg; /* model-wide settings: panic, eject.max_share */
    struct hep **eps;
    size_t neps;
    bool panic;
    uint64_t panics_total;
};

/* One endpoint's health. `pub` is what ep->health points to, the part workers read (health.h); every
 * other field is the main thread's alone. state and last_error are kept here too, and copied to pub
 * when they change (publish_state, set_last_error): the main thread reads its own copies. */
struct hep {
    struct atc_endpoint_health pub;
    enum atc_health_state state;
    enum atc_check_verdict live, ready, deep;   /* deep starts OK: it can only take an endpoint out */
    char last_error[ATC_HEALTH_TEXT_WORDS * 8]; /* the last failed probe or ejection, with why; "" if none */
    uint64_t state_changes;
    uint64_t ejections_total;
    double slow_start; /* share of its capacity offered now: 1 unless ramping up */
    struct atc_server_load load;
    struct atc_health *h;
    struct atc_endpoint *ep;
    struct hmodel *model;
    const struct atc_health_config *cfg;
    const struct atc_engine_profile *engine; /* engine: of the endpoint (its model's for simulated ones) */
    unsigned engine_id;                      /* the same, as an enum atc_engine */
    uint64_t started_ms;                     /* when checks began: the start-up grace runs from it */
    struct atc_upstream_pool *pool;
    struct probe probes[NPROBES];
    char *deep_body;
    size_t deep_len;
    const char *deep_method;
    bool removed; /* a husk (atc_health_remove): cfg and model are stale, nothing may change it */
    bool drained;
    bool ejected;
    bool ever_healthy;
    bool joined_live; /* added at run time (atc_health_add), not with the table */
    bool cap_logged;  /* the ejection cap stopped an ejection; logged once per streak */
    unsigned passive_fails;
    unsigned ejections; /* the current streak, for the growing ejection time */
    uint64_t eject_ms;  /* length of the current ejection */
    uint64_t returned_ms;
    uint64_t last_kick_ms;
    uint64_t deep_started_ms;
    struct event *eject_timer;
    uint64_t ramp_start_ms; /* 0 = not ramping */
    struct atc_load_counters prefix_counters;
    bool scrape_failing;
    bool ready_unanswered; /* the last ready probe got no HTTP answer at all (refused, timed out) */
    bool down_seen;        /* since (or just before) its ejection, the probes found it unreachable */
};

struct atc_health {
    struct event_base *base;
    struct hep **eps; /* each its own allocation: ep->health points into it */
    size_t neps;
    /* Endpoints removed at run time (atc_health_remove): their checks are stopped, but ep->health still
     * points to their `pub`, which workers may read until the server frees the endpoint
     * (atc_health_forget). */
    struct hep **husks;
    size_t nhusks;
    struct hmodel *models;
    size_t nmodels;
    struct event *ramp_timer;
    struct event *first_ev;
    void (*first_cb)(void *arg);
    void *first_arg;
    size_t first_pending;
    bool first_done;
    struct event *capacity_ev; /* tells on_capacity, from the loop, that there is more room */
    void (*on_capacity)(void *arg);
    void *on_capacity_arg;
    uint64_t rng;
    struct atc_health_stats stats;
};

static inline struct hep *atc_health_hep_of(const struct atc_endpoint *ep)
{
    /* ep->health is the first member of its struct hep */
    return ep->health != NULL ? (struct hep *)(void *)ep->health : NULL;
}

#endif
