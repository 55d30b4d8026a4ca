#ifndef ATC_POLICY_STATUS_H
#define ATC_POLICY_STATUS_H

/* The state of the policy runtimes, rendered: atc_policy_status_json (GET /admin/policy) and
 * atc_policy_metrics (/metrics), declared in policy/policy.h. Both take every worker's runtime and sum
 * per-version counters over them; they read those runtimes without a lock, so the caller must be a
 * thread that may (the main thread while workers are parked, or a runtime's own worker). */

#include "policy/policy.h"

#endif
