#ifndef ATC_POLICY_STATUS_H
#define ATC_POLICY_STATUS_H

/* The state of the policy runtimes, rendered: atc_policy_status_json (GET /admin/policy) and
 * atc_policy_metrics (/metrics), declared in policy/policy.h. Both take every worker's runtime and sum
 * per-version counters over them. They read those runtimes without a lock, so they are given copies:
 * each worker makes one of its runtime on its own thread (atc_policy_status_copy, from
 * atc_workers_visit), and the main thread renders the copies while the workers go on deciding. (Rollouts
 * still hand them the live runtimes, with every worker parked: they change them too.) */

#include "policy/policy.h"

/** Brings @p rt up to date (a rollback another worker began, atc_policy_sync) and copies what the two
 * renderers read of it: settings, counters, versions' records (no Lua state), the shadow's and the
 * canary's figures, the strings they show. On @p rt's own thread. Returns the copy (owned:
 * atc_policy_status_copy_free; any thread), or NULL when out of memory. The copy borrows rt's endpoint
 * table, which only the main thread replaces. */
struct atc_policy_runtime *atc_policy_status_copy(struct atc_policy_runtime *rt);
void atc_policy_status_copy_free(struct atc_policy_runtime *copy);

#endif
