#ifndef ATC_REPLAY_GRID_H
#define ATC_REPLAY_GRID_H

/* `atc replay --speed LIST --servers LIST`: the same policies replayed over a grid of loads (the trace's
 * arrivals compressed in virtual time: speed 2 = twice the traffic) and fleet sizes (every simulate:
 * entry of the config given that many servers), printed as one table with each cell's offered prefill
 * load and the ideal fleet on that cell (replay_ideal.h), and written as JSON and HTML. */

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "trace/replay.h"
#include "trace/replay_ideal.h"

struct atc_config;
struct atc_trace;

struct atc_replay_grid_policy {
    const char *name;
    const char *path; /* NULL: the built-in C balancer */
};

struct atc_replay_grid_cell {
    double speed;
    unsigned servers;     /* per simulate: entry; 0 = as the config says */
    double offered_load;  /* prompt tokens a second over the fleet's prefill tokens a second */
    struct atc_replay_ideal ideal; /* the ideal fleet of this cell's servers on this cell's traffic */
    struct atc_replay_result *results; /* one per policy */
};

struct atc_replay_grid {
    const char *trace_path, *fleet_path;
    uint64_t seed;
    const struct atc_replay_grid_policy *policies;
    size_t npolicies;
    struct atc_replay_grid_cell *cells; /* speeds x servers, speed-major */
    size_t ncells;
};

/** Time-compresses @p trace by each of @p speeds (it is restored before returning) and sizes @p cfg's
 * simulated fleet to each of @p servers (0 entries: as configured), replaying every policy of @p g in
 * each cell with options @p o. Fills g->cells (free with atc_replay_grid_dispose). Returns 0, or -1 with
 * an owned message in *err. */
int atc_replay_grid_run(struct atc_config *cfg, struct atc_trace *trace, struct atc_replay_grid *g,
                        const double *speeds, size_t nspeeds, const unsigned *servers, size_t nservers,
                        const struct atc_replay_options *o, char **err);

/** The grid as a terminal table: per cell the ideal fleet's TTFT p90 (ms) and cache hit rate, each policy's
 * with its ratio to the ideal's, and the ratio of the first policy to the best of the others. */
void atc_replay_grid_table(FILE *out, const struct atc_replay_grid *g);
/** As JSON: {"trace", "fleet", "seed", "cells": [{"speed", "servers", "offered_load", "ideal": {...},
 * "policies": [as atc replay --json]}]}. */
void atc_replay_grid_json(FILE *out, const struct atc_replay_grid *g);
/** As a self-contained HTML page (the table, with ratios coloured). 0, or -1 with *err. */
int atc_replay_grid_html(const char *path, const struct atc_replay_grid *g, char **err);

void atc_replay_grid_dispose(struct atc_replay_grid *g);

#endif
