#ifndef ATC_SIM_METRICS_H
#define ATC_SIM_METRICS_H

/* atc sim's GET /metrics: the model's state under each engine's own metric names, as atc's scraper
 * reads them from the real servers (each writer cites its engine's source). */

#include <stdint.h>

struct evbuffer;
struct atc_sim_params;
struct atc_sim_stats;

/** Appends the Prometheus text of @p st to @p b, in the names of @p p's engine; @p accepted is the
 * inference requests accepted so far (TGI's request count). */
void atc_sim_metrics_write(struct evbuffer *b, const struct atc_sim_params *p, const struct atc_sim_stats *st,
                           uint64_t accepted);

#endif
