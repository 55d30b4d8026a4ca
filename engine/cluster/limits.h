#ifndef ATC_LIMITS_H
#define ATC_LIMITS_H

/* Per-tenant limits (config `limits:`): requests and tokens per minute, in fixed windows of one minute of
 * wall-clock time (so that replicas on several machines agree on when a window starts).
 *
 * A request is admitted while its tenant's budget of each kind is not spent: it counts 1 request and its
 * token estimate (prompt + max_tokens) at admission; atc_limits_settle corrects the tokens by what the
 * answer's usage said. A request that finds a budget spent is refused (429, Retry-After: the seconds
 * left in the window).
 *
 * Alone (or while the cluster is in local mode) each tenant's whole budget is this replica's. Shared
 * (cluster.c says so with atc_limits_set_shared), the budget lives in Redis and each replica spends
 * leases of it: it admits only against what Redis granted it (and, before its first lease of a
 * window, against a credit of one chunk, so that the first request of a window never waits); when its
 * lease runs low it asks for more (atc_limits_refills, sent by cluster.c as INCRBY on the window's
 * counter; atc_limits_refilled applies the answer). Admission itself never waits for Redis. The chunk
 * is budget / (4 x replicas seen), at least 1: small enough that a replica holds little of the budget
 * idle, large enough that Redis sees a few increments per replica per window. What a replica spent
 * beyond what was reported (credit, token corrections, spending in local mode) is added to its next
 * increment, so the counter in Redis learns every request.
 *
 * Tenants: the configured ones each have a slot; any other tenant gets the default budget in a bounded
 * table of DYNAMIC_SLOTS, where a name may take one of PROBES slots by its hash. A new name takes a
 * free slot, or one of an older window, or else the slot of the tenant there that spent least this
 * window (then the one admitted longest ago), which starts again from nothing spent. No two tenants
 * ever share a budget, so a client rotating names evicts mostly its own names and cannot spend anyone
 * else's budget; what it can do is what any new name does: get the default budget. (An evicted tenant
 * gets more, never less: locally it starts again from nothing; shared, Redis's counter still holds
 * what the fleet spent.) Requests without a tenant are the tenant "" under the default. /metrics shows
 * configured tenants by name and every other under tenant="other".
 *
 * Threads: any worker calls atc_limits_admit and atc_limits_settle; the main thread (cluster.c, the
 * admin API, /metrics) calls the rest. One mutex, beside the struct in limits.c, covers everything and
 * is held for the length of each call; on_low is called after it is released. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct evbuffer;
struct atc_config;
struct atc_limits;

enum atc_limit_kind { ATC_LIMIT_REQUESTS, ATC_LIMIT_TOKENS };

#define ATC_LIMITS_WINDOW_MS 60000
#define ATC_LIMITS_TENANT_MAX 63 /* longer tenant names are cut to this (x-atc-tenant is kept at 63) */

/* What one admitted request holds until it is settled. */
struct atc_limit_ticket {
    int slot; /* -1: not counted (no limit applied) */
    uint32_t gen; /* the slot's generation: settling misses a slot given to another tenant since */
    uint64_t window;
    uint64_t tokens; /* counted at admission */
};

/** The limits of @p cfg's limits: section (copied). Returns an owned object, or NULL when out of memory. */
struct atc_limits *atc_limits_create(const struct atc_config *cfg);
void atc_limits_destroy(struct atc_limits *l);

/** Admits a request of @p tenant (NULL or "": anonymous) with @p tokens estimated, at wall-clock
 * @p now_ms: returns 0 and fills @p t, or refuses it: returns the seconds until its window ends (>= 1)
 * and sets *@p kind to the budget that is spent. Any thread. */
int atc_limits_admit(struct atc_limits *l, const char *tenant, uint64_t tokens, uint64_t now_ms,
                     struct atc_limit_ticket *t, enum atc_limit_kind *kind);

/** The request of @p t ended having used @p actual_tokens (as its usage said): corrects the tokens
 * counted at admission, if its window is still the current one. Any thread. */
void atc_limits_settle(struct atc_limits *l, const struct atc_limit_ticket *t, uint64_t actual_tokens);

/* ---- what the cluster (main thread) calls ---- */

/** Spends leases from Redis (@p shared) or each tenant's whole budget locally; @p replicas (>= 1) sizes
 * the chunks. */
void atc_limits_set_shared(struct atc_limits *l, bool shared, unsigned replicas);

/** @p fn(@p ctx) is called (from the admitting worker, without the lock) when a lease runs low and no
 * refill is pending, so the cluster can send one before its next sync. Set before any worker admits. */
void atc_limits_on_low(struct atc_limits *l, void (*fn)(void *ctx), void *ctx);

/* One increment to send: INCRBY the counter of (tenant, kind, window) by amount. */
struct atc_limit_refill {
    char tenant[ATC_LIMITS_TENANT_MAX + 1];
    enum atc_limit_kind kind;
    uint64_t window; /* minutes since the epoch */
    uint64_t amount;
};

/** Fills @p out (room for @p max) with the refills due at wall-clock @p now_ms (shared mode only) and
 * marks them pending. Returns how many. */
size_t atc_limits_refills(struct atc_limits *l, uint64_t now_ms, struct atc_limit_refill *out, size_t max);

/** The answer to refill @p r: the counter's value after the increment, or @p total < 0 when it failed
 * (not sent, or Redis went away: the increment is assumed lost and is sent again later). */
void atc_limits_refilled(struct atc_limits *l, const struct atc_limit_refill *r, int64_t total);

/** The tenants' counters and remaining budgets in Prometheus text (atc_tenant_*), as of @p now_ms. */
void atc_limits_metrics(struct atc_limits *l, struct evbuffer *out, uint64_t now_ms);

/** The same as a JSON object: {"mode": "shared"|"local", "window_ends_in_s": N, "tenants": [...]}. */
void atc_limits_json(struct atc_limits *l, struct evbuffer *out, uint64_t now_ms);

#endif
