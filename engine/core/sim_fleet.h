#ifndef ATC_SIM_FLEET_H
#define ATC_SIM_FLEET_H

/* The simulated servers of a config's simulate: entries, started on free loopback ports inside the atc
 * process and added to its endpoint table (the quick start, tests, demos). On the main loop. */

#include <stddef.h>

#include <event2/event.h>

#include "config/config.h"
#include "fleet/endpoint.h"

struct atc_sim_server;

struct atc_sim_fleet {
    struct atc_sim_server **sims; /* owned */
    size_t n;
};

/** Starts every server of @p cfg's simulate: entries on @p base and adds each to @p table as an
 * endpoint named MODEL-sim-N (with the entry's capacity, engine, role, key and KV size). Returns 0, or -1
 * with a static reason in *err (those started so far stay in @p f: atc_sim_fleet_stop them). */
int atc_sim_fleet_start(struct atc_sim_fleet *f, struct event_base *base, const struct atc_config *cfg,
                        struct atc_endpoint_table *table, const char **err);
/** Stops and frees @p f's servers (none: nothing). */
void atc_sim_fleet_stop(struct atc_sim_fleet *f);

#endif
