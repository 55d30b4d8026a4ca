#ifndef ATC_HEALTH_REPORT_H
#define ATC_HEALTH_REPORT_H

/* What health shows the admin API and the metrics page (main thread). */

struct evbuffer;
struct atc_endpoint;
struct atc_health;

/** Appends the health fields of @p ep as JSON object members, each preceded by a comma
 * (,"state":"healthy",...,"load":{...}); nothing for an endpoint without health. */
void atc_health_endpoint_json(const struct atc_endpoint *ep, struct evbuffer *out);

/** Appends {"models":[{"name","panic","panics_total"}...],"state_changes_total",...} for @p h. */
void atc_health_status_json(const struct atc_health *h, struct evbuffer *out);

/** Appends the Prometheus metrics of health: each endpoint's state, check failures, ejections and
 * scraped load, each model's panic mode, and the probe and scrape counters. */
void atc_health_metrics(const struct atc_health *h, struct evbuffer *out);

#endif
