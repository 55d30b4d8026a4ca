#ifndef ATC_ROLLOUT_H
#define ATC_ROLLOUT_H

/* Changing a policy safely, on the server: a shadow loaded or cleared on every worker, a canary loaded,
 * judged when its window ends (policy/canary.h) and promoted or rolled back on every worker at once.
 * Loads go through the reloader (no worker parked); judging and ending park the workers for the time
 * it takes to read their counters. Main thread only. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/reloader.h"

struct atc_server;

/** Loads @p entry as the shadow of every worker's policy, seeing @p sample of the decisions, or clears it
 * (@p entry NULL). @p done as a reload's: the shadow's version (1 for a clear), or 0 and why. */
void atc_rollout_shadow(struct atc_server *srv, const char *entry, double sample, atc_reload_done done,
                        void *arg);

/** Reloads the policy's files as a canary deciding @p share of the requests, judged after @p window_ms
 * against policy.canary's guards, and returns 0; @p done as a reload's. When the policy's files are
 * watched (policy.watch) it is armed instead and returns 1 without calling @p done: the next change of
 * the files loads as the canary, so that editing them does not put the edit live for everyone. */
int atc_rollout_canary(struct atc_server *srv, double share, uint64_t window_ms, atc_reload_done done,
                       void *arg);

/** Whether a canary is armed (waiting for the files to change), with its share and window. */
bool atc_rollout_canary_armed(const struct atc_server *srv, double *share, uint64_t *window_ms);

enum atc_rollout_end { ATC_ROLLOUT_JUDGE, ATC_ROLLOUT_PROMOTE, ATC_ROLLOUT_ROLLBACK };
/** Ends the canary now, as @p how says (JUDGE: by the guards). Returns its version and says what happened
 * in @p why, or 0 when there is no canary. */
uint64_t atc_rollout_canary_end(struct atc_server *srv, enum atc_rollout_end how, char *why, size_t size);

/** At start-up: the config's policy.shadow, if any; from now on a change of the policy's files goes
 * through the rollout (an armed canary loads from it, a running one holds it back). */
void atc_rollout_start(struct atc_server *srv);

#endif
