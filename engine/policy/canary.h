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
struct atc_policy_canary;
struct atc_route_request;
struct policy_version;
struct evbuffer;

/** The canary slot of a runtime (no canary yet), owned by the runtime (atc_policy_runtime's `canary`,
 * from policy_runtime_create to atc_policy_runtime_destroy). NULL when out of memory. */
struct atc_policy_canary *policy_canary_create(void);
/** Frees @p c and the canary version it holds (NULL: nothing). */
void policy_canary_destroy(struct atc_policy_canary *c);
/** The running canary's version (borrowed), or NULL when none runs. */
struct policy_version *policy_canary_running(const struct atc_policy_canary *c);
/** The canary's version (borrowed) when one runs and it decides @p req; NULL otherwise. */
struct policy_version *policy_canary_takes(const struct atc_policy_canary *c,
                                           const struct atc_route_request *req);
/** Counts a decision made while a canary runs (none: nothing), to the canary's side or the current
 * version's: good (@p ok) or failed because of @p why (atc_policy_fallback_*). */
void policy_canary_count(struct atc_policy_canary *c, bool canary, bool ok, const char *why);
/** A status copy of @p c for @p copy (a runtime's status copy): its record and its version's, no Lua
 * state; NULL for NULL. Sets *failed when out of memory. Freed by policy_canary_status_copy_free. */
struct atc_policy_canary *policy_canary_status_copy(const struct atc_policy_canary *c,
                                                    struct atc_policy_runtime *copy, bool *failed);
void policy_canary_status_copy_free(struct atc_policy_canary *copy);
/** Makes @p v (built, numbered) @p rt's canary for @p share of the requests; replaces any canary. */
void policy_canary_adopt(struct atc_policy_runtime *rt, struct policy_version *v, double share, bool log);
/** Appends ,"canary":{...} or ,"canary":null, and the counts of canaries promoted and rolled back. */
void policy_canary_status_json(struct atc_policy_runtime *const *rts, size_t n, struct evbuffer *out);
/** Appends the canary's Prometheus metrics. */
void policy_canary_metrics(struct atc_policy_runtime *const *rts, size_t n, struct evbuffer *out);

#endif
