#ifndef ATC_POLICY_STATUS_H
#define ATC_POLICY_STATUS_H

/* The state of the policy runtimes, rendered: atc_policy_status_json (GET /admin/policy) and
 * atc_policy_metrics (/metrics), declared in policy/policy.h. Both take every worker's runtime and sum
 * per-version counters over them. They read those runtimes without a lock: the caller is the main
 * thread with every worker parked (atc_workers_pause), as admin.c does for both. */

#include "policy/policy.h"

#endif
