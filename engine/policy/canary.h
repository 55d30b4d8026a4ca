#ifndef ATC_POLICY_CANARY_H
#define ATC_POLICY_CANARY_H

/* The canary: a new version that decides a share of the requests, sticky per session (by a hash of the
 * session, or of the request id when it has none: the same on every worker and every replica), while the
 * current version decides the rest. Its failures fall back to the C balancer as any version's do, but
 * count toward no rollback streak: at the end of its window (core/server.c keeps the timer) its error,
 * fallback and overrun rates and its requests' TTFT p90 are judged against the current version's over
 * the same window (atc_policy_canary_judge), and it is promoted or rolled back on every worker.
 * Everything here runs on the thread that owns the runtime, or while it is parked. */

#include <stdbool.h>
#include <stddef.h>

struct atc_policy_runtime;
struct atc_route_request;
struct policy_version;
struct evbuffer;

/** Whether the canary decides @p req. */
bool policy_canary_takes(const struct atc_policy_runtime *rt, const struct atc_route_request *req);
/** Counts a decision made while a canary runs, to the canary's side or the current version's: good
 * (@p ok) or failed because of @p why (atc_policy_fallback_*). */
void policy_canary_count(struct atc_policy_runtime *rt, bool canary, bool ok, const char *why);
/** Makes @p v (built, numbered) @p rt's canary for @p share of the requests; replaces any canary. */
void policy_canary_adopt(struct atc_policy_runtime *rt, struct policy_version *v, double share, bool log);
/** Appends ,"canary":{...} or ,"canary":null, and the counts of canaries promoted and rolled back. */
void policy_canary_status_json(struct atc_policy_runtime *const *rts, size_t n, struct evbuffer *out);
/** Appends the canary's Prometheus metrics. */
void policy_canary_metrics(struct atc_policy_runtime *const *rts, size_t n, struct evbuffer *out);

#endif
