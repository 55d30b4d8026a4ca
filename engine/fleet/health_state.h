#ifndef ATC_HEALTH_STATE_H
#define ATC_HEALTH_STATE_H

/* What health (fleet/health.h) says of an endpoint: its state, its checks' verdicts, the part other
 * threads read (ep->health), and the checker's counters. A header of its own so that health's private
 * state (health_internal.h) can embed them without including health.h. */

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "fleet/health_text.h"

enum atc_health_state {
    ATC_HEALTH_STARTING,  /* answering (or not checked yet) but not ready: loading its model */
    ATC_HEALTH_HEALTHY,   /* in rotation */
    ATC_HEALTH_UNHEALTHY, /* its live or deep check has failed */
    ATC_HEALTH_EJECTED,   /* taken out for a while by failures of real traffic */
    ATC_HEALTH_DRAINING,  /* taken out by the admin API; in-flight requests finish */
};

/* A check's verdict. */
enum atc_check_verdict { ATC_CHECK_UNKNOWN = -1, ATC_CHECK_FAILED = 0, ATC_CHECK_OK = 1 };

/* What other threads may read about an endpoint's health (ep->health): written by the main thread
 * (health.c), read by any thread, every field on its own (see the top of health.h). */
struct atc_endpoint_health {
    _Atomic int state;                     /* enum atc_health_state: atc_health_state_of */
    _Atomic unsigned consecutive_failures; /* the longest current run of failed probes of one check */
    _Atomic double last_check_ms;          /* monotonic ms (atc.now()'s clock) of the last probe; 0 = none */
    struct atc_health_text
        last_error; /* the last failed probe or ejection, with why: atc_health_last_error */
};

/** The state of @p h (relaxed: it may change at once after). Any thread. */
static inline enum atc_health_state atc_health_state_of(const struct atc_endpoint_health *h)
{
    return (enum atc_health_state)atomic_load_explicit(&h->state, memory_order_relaxed);
}

/** @p h's last error, as atc_health_text_get. Any thread. */
static inline size_t atc_health_last_error(const struct atc_endpoint_health *h, char *out, size_t size)
{
    return atc_health_text_get(&h->last_error, out, size);
}

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

#endif
