#ifndef ATC_POLICY_SHADOW_H
#define ATC_POLICY_SHADOW_H

/* The shadow policy: a candidate that decides the same live requests as the policy, in a runtime of
 * its own (its Lua state, budget watchdog, clock and affinity table), right after the live decision and
 * on the same fleet state, so that agreement measures the code and not the moment. Its picks are
 * counted (decisions, agreement with the live pick, picks per endpoint, failures) and recorded, never
 * acted on: nothing it returns reaches the relay, and it never feeds the prefix index. Everything here
 * runs on the thread that owns the live runtime, or while it is parked (status). */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct atc_policy_runtime;
struct atc_policy_shadow;
struct atc_endpoint_table;
struct policy_version;
struct evbuffer;

/** The shadow slot of a live runtime (none loaded yet), owned by the runtime (atc_policy_runtime's
 * `shadow`, from policy_runtime_create to atc_policy_runtime_destroy). NULL when out of memory. */
struct atc_policy_shadow *policy_shadow_create(void);
/** Frees @p ss and the shadow it holds (NULL: nothing). */
void policy_shadow_destroy(struct atc_policy_shadow *ss);
/** Shadow versions loaded so far (the last one's number; shadows count apart from the live policy). */
uint64_t policy_shadow_versions(const struct atc_policy_shadow *ss);
/** Makes @p v (built from @p entry by a shadow build) @p rt's shadow, numbered @p version, seeing
 * @p sample of the decisions; replaces any shadow. Returns @p version, or 0 when out of memory (v freed).
 * @p log: say so (once per load, not per worker). */
uint64_t policy_shadow_adopt(struct atc_policy_runtime *rt, struct policy_version *v, uint64_t version,
                             const char *entry, double sample, bool log);
/** Removes @p rt's shadow (none: nothing). */
void policy_shadow_clear(struct atc_policy_runtime *rt, bool log);
/** The endpoint table changed (a config reload, which renumbers it): the shadow is rebuilt against it and
 * its record starts again (dropped, logged, if it cannot be rebuilt). */
void policy_shadow_set_table(struct atc_policy_runtime *rt, struct atc_endpoint_table *table);
/** An endpoint was added or removed (atc_policy_update_table: every other endpoint keeps its slot): the
 * shadow's views are updated as the live version's are, and its record goes on (decisions, agreement,
 * picks by slot). Dropped, logged, if its views cannot be updated. */
void policy_shadow_update_table(struct atc_policy_runtime *rt, struct atc_endpoint_table *table);
/** A status copy of @p ss for @p copy (a runtime's status copy): its record and its runtime's, no Lua
 * state; NULL for NULL. Sets *failed when out of memory. Freed by policy_shadow_status_copy_free. */
struct atc_policy_shadow *policy_shadow_status_copy(const struct atc_policy_shadow *ss, bool *failed);
void policy_shadow_status_copy_free(struct atc_policy_shadow *copy);
/** Appends ,"shadow":{...} (or ,"shadow":null) for the runtimes @p rts (summed). */
void policy_shadow_status_json(struct atc_policy_runtime *const *rts, size_t n, struct evbuffer *out);
/** Appends the shadow's Prometheus metrics, labelled live="N",shadow="M". */
void policy_shadow_metrics(struct atc_policy_runtime *const *rts, size_t n, struct evbuffer *out);

#endif
