#ifndef ATC_ENDPOINT_H
#define ATC_ENDPOINT_H

/* The endpoint table: every configured (or simulated) server, grouped by model, with the live counters
 * that routing reads.
 *
 * Threads: the table is shared by every worker thread, and health checks run on the main thread. Each
 * field below says who writes it and how the others read it, in one of three ways:
 * - "config": set in atc_endpoint_table_create/_add/_rebuild (or by the server right after, like
 *   `simulated` and `pools`), which run before the worker threads start or with every worker parked
 *   (atc_workers_pause), or in atc_endpoint_create for an endpoint that joins at run time, before any
 *   other thread can see it (the table that holds it reaches the workers through their mailboxes, whose
 *   lock orders those writes before their reads); read plainly by any thread afterwards.
 * - "workers": C11 atomics that every worker updates (fetch-add, compare-and-swap) and any thread reads.
 * - "health": C11 atomics that health.c stores on the main thread and workers load.
 * Atomics are relaxed, each consistent on its own but not with the others (a reader may see inflight
 * already counted and inflight_tokens not yet): good enough for routing, a heuristic over values that
 * change all the time anyway; no other memory is published through them. ep->health points to what
 * health.c publishes (health.h says how each of its fields is read). */

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "fleet/recent.h"
#include "fleet/signals.h"

struct atc_config;
struct atc_upstream_pool;
struct atc_endpoint_health;

/* What the other replicas of a cluster (cluster: in the config) have in flight on an endpoint, summed over
 * the replicas whose figures are fresh. cluster: cluster/load_share.c stores them on the main thread at
 * each sync, workers load them (relaxed, each consistent on its own). All 0 without a cluster, in local
 * mode, or when no other replica publishes. */
struct atc_remote_load {
    _Atomic unsigned inflight, prefilling, decoding;
    _Atomic uint64_t tokens, prefill_tokens;
    _Atomic double recent_tokens;
    _Atomic uint64_t at_ms; /* monotonic ms when the oldest of the figures summed was new; 0: none */
};

struct atc_endpoint {
    /* First, what a decision reads of every endpoint of its pool (policy_pick.c's loops, the C balancer),
     * so that it sits in the struct's first three cache lines; then the rest. */
    /* config */
    unsigned index; /* its slot: the table's slots[index] (see struct atc_endpoint_table) */
    unsigned capacity;
    unsigned weight;
    uint64_t token_budget;     /* 0 = none */
    unsigned max_server_queue; /* full while the server reports this many waiting (scraped); 0 = ignore */
    /* workers: live counters */
    _Atomic unsigned inflight;        /* requests routed here and not finished */
    _Atomic uint64_t inflight_tokens; /* their prompt estimate + max_tokens */
    _Atomic unsigned side_requests;   /* atc's own requests on its pools not finished (a /tokenize): the
                                       * worker that sends one writes; table_swap.c waits for 0 to free it */
    /* health: health.c writes on the main thread (replay, single-threaded, sets them too), workers read */
    _Atomic bool routable;             /* false while drained, unhealthy, ejected or retired by a reload */
    _Atomic unsigned server_queue;     /* server-reported: requests waiting (0 until reported) */
    _Atomic unsigned slow_start_limit; /* while > 0 (ramping up after a return): at most this many */
    struct atc_remote_load remote;     /* cluster: the other replicas' share of its load */
    struct atc_signals sig;            /* what the engine observes of its work (signals.h says who writes) */

    /* config */
    char *id;
    char *url;
    char *host;
    uint16_t port;
    char *model;
    char *version; /* NULL if none */
    char **tags;
    size_t ntags;
    uint64_t kv_tokens_config; /* kv_tokens as configured; 0 = learn it from the server's /metrics */
    unsigned engine;           /* engine: an enum atc_engine (config/engine_profile.h) */
    char *authorization;  /* "Bearer <key>" atc sends it (api_key_env / api_key_file), NULL = none. A secret:
                             never logged nor reported (reports say whether it is set, and api_key_source) */
    char *api_key_source; /* "env NAME" or "file PATH", NULL = none */
    bool forward_authorization; /* without a key of atc's own, the client's Authorization header goes to it */
    unsigned role;              /* role: an enum atc_role (config/roles.h); a simulated one's: its entry's */
    uint16_t bootstrap_port;    /* bootstrap_port: SGLang's bootstrap server (a prefill endpoint) */

    /* workers: live counters */
    _Atomic double ttft_ewma_ms;     /* exponentially weighted time to first byte of the answer; 0 = none */
    _Atomic uint64_t requests_total; /* attempts sent */
    _Atomic uint64_t errors_total;   /* connection failures, timeouts, 5xx */
    _Atomic uint64_t consecutive_errors;

    /* health: as routable above */
    _Atomic double server_kv_usage; /* server-reported: share of KV cache in use, 0..1 (likewise) */
    _Atomic uint64_t kv_tokens;     /* its KV cache in tokens: configured, the simulated server's or
                                       scraped; 0 = unknown (the prefix index then models no eviction) */

    /* config */
    bool simulated;                     /* started by atc for simulate: (kept across config reloads) */
    struct atc_endpoint_health *health; /* state, last error, scraped load (health.h); NULL without checks */
    struct atc_upstream_pool *pools[ATC_MAX_WORKERS]; /* each worker's keep-alive connections (upstream.c);
                                                         pools[i] is used on worker i's thread only */

    /* Its last minute, for the status page (recent.h says who writes): 2 KiB that only the status page
     * reads, allocated apart, so that the endpoints (and the fields a decision reads of each) are closer
     * in memory: fewer pages to walk in a loop over a pool of hundreds. Config: set by the constructor. */
    struct atc_recent *recent;
};

struct atc_model {
    char *name;
    unsigned disaggregation; /* config: disaggregation:, an enum atc_disaggregation (config/roles.h) */
    struct atc_endpoint **endpoints; /* borrowed from the table */
    size_t nendpoints;
};

/* endpoints[] lists the endpoints (nendpoints, dense: iterate it). slots[] keys them by ep->index, the
 * number that policy views, the prefix index and per-endpoint arrays of other subsystems (nslots long)
 * know an endpoint by: an endpoint added or removed at run time (atc_endpoint_table_with) moves no other
 * endpoint, and a removed one leaves its slot NULL, never reused by that table or its successors (only a
 * config reload, atc_endpoint_table_rebuild, renumbers from 0).
 *
 * Threads: a table (this shell: its arrays and models) does not change once the workers see it. An
 * endpoint set change makes a new one (atc_endpoint_table_with) that each worker takes in place of its
 * own (w->table) from its mailbox; the server frees the old shell once every worker has (core/server.c). */
struct atc_endpoint_table {
    struct atc_endpoint **endpoints;
    size_t nendpoints;
    struct atc_endpoint **slots; /* slot -> endpoint, NULL for one removed */
    size_t nslots;
    struct atc_model *models;
    size_t nmodels;
    struct atc_signal_params signals; /* priors and time constants of every endpoint's signals */
};

/** Builds the table from @p cfg's models (simulated endpoints are added with
 * atc_endpoint_table_add). Returns an owned table or NULL on allocation failure. */
struct atc_endpoint_table *atc_endpoint_table_create(const struct atc_config *cfg);

/** Adds an endpoint to model @p model (which must exist). Copies every string. Returns it or NULL. */
struct atc_endpoint *atc_endpoint_table_add(struct atc_endpoint_table *t, const char *model, const char *id,
                                            const char *host, uint16_t port, unsigned capacity);

/** A config reload: a new table from @p cfg that keeps the endpoint structs of @p old whose id, model
 * and address are unchanged (their counters, pools and health go on; capacity, weight, token budget,
 * version and tags are updated) and its simulated endpoints; frees @p old's shell. Endpoints of @p old
 * that are not in the new table are returned in *retired (owned array; they are no longer routable and
 * still belong to the caller, who frees them with atc_endpoint_free once nothing uses them). Endpoints
 * new to the table have no pool yet. Aborts on allocation failure. */
struct atc_endpoint_table *atc_endpoint_table_rebuild(struct atc_endpoint_table *old,
                                                      const struct atc_config *cfg,
                                                      struct atc_endpoint ***retired, size_t *nretired);

/** A new endpoint of model @p model as @p ec describes it (strings copied), in no table yet, or NULL when
 * out of memory. */
struct atc_endpoint *atc_endpoint_create(const char *model, const struct atc_endpoint_config *ec);

/** An endpoint set change at run time (the admin API, discovery, a replay's servers that come and go): a
 * new table, owned, with @p old's endpoints but @p remove (may be NULL; it is not freed) and with @p add
 * (may be NULL; the table borrows it, like every endpoint) in a slot never used before (add->index set).
 * Every endpoint that stays keeps its slot and is not written to, and @p old is left as it was: workers
 * may go on reading it until they take the new one. NULL when out of memory or @p add's model is not in
 * @p old. */
struct atc_endpoint_table *atc_endpoint_table_with(const struct atc_endpoint_table *old,
                                                   struct atc_endpoint *add,
                                                   const struct atc_endpoint *remove);

/** The endpoints of @p all whose slot @p in[] (by ep->index, all->nslots of them) says, each in the slot it
 * has in @p all, the others' slots empty: a replay's fleet at one moment, when servers join and leave
 * (from: / until:). An owned shell (atc_endpoint_table_free_shell) that borrows @p all's endpoints, or
 * NULL when out of memory. */
struct atc_endpoint_table *atc_endpoint_table_only(const struct atc_endpoint_table *all, const bool *in);

/** Frees a table's shell (its arrays and models), not its endpoints: one atc_endpoint_table_with replaced.
 * NULL is fine. */
void atc_endpoint_table_free_shell(struct atc_endpoint_table *t);

/** The endpoint in slot @p slot of @p t (may be NULL), or NULL: none, or removed. */
struct atc_endpoint *atc_endpoint_table_slot(const struct atc_endpoint_table *t, size_t slot);

/** Frees an endpoint that is in no table (not its pool). */
void atc_endpoint_free(struct atc_endpoint *ep);

/** Frees the table and its endpoints (not their pools: upstream.c frees those first). */
void atc_endpoint_table_destroy(struct atc_endpoint_table *t);

/** The model called @p name (length @p len), or NULL. */
struct atc_model *atc_endpoint_table_model(const struct atc_endpoint_table *t, const char *name, size_t len);

/** What a metric or a report may call the model a client asked for: the configured model's own name,
 * or "other" for every name the table does not serve (a client picks the names: one label for all of
 * them keeps the series bounded). */
const char *atc_endpoint_table_model_label(const struct atc_endpoint_table *t, const char *name);

/** The endpoint with id @p id, or NULL. */
struct atc_endpoint *atc_endpoint_table_find(const struct atc_endpoint_table *t, const char *id);

/** True when @p ep (may be NULL) is the server @p ec of model @p model describes: a configured (not
 * simulated) endpoint with the same address and model. A reload keeps such an endpoint as it is (its
 * counters, pools and health); anything else is a new endpoint. */
bool atc_endpoint_same_server(const struct atc_endpoint *ep, const struct atc_endpoint_config *ec,
                              const char *model);

/** The capacity offered now: the configured one, or less while slow-starting. Loads compare against it. */
static inline unsigned atc_endpoint_capacity_now(const struct atc_endpoint *ep)
{
    /* One load: health.c may change the limit between two reads. */
    unsigned limit = atomic_load_explicit(&ep->slow_start_limit, memory_order_relaxed);
    return limit > 0 && limit < ep->capacity ? limit : ep->capacity;
}

/** True when @p ep, with @p inflight requests, may take one more of @p tokens (prompt estimate +
 * max_tokens): it is routable, under the capacity it offers now, and under its token budget (an idle
 * endpoint takes any request). */
static inline bool atc_endpoint_available_at(const struct atc_endpoint *ep, unsigned inflight,
                                             uint64_t tokens)
{
    return atomic_load_explicit(&ep->routable, memory_order_relaxed) &&
           inflight < atc_endpoint_capacity_now(ep) &&
           (ep->token_budget == 0 || inflight == 0 ||
            atomic_load_explicit(&ep->inflight_tokens, memory_order_relaxed) + tokens <= ep->token_budget) &&
           (ep->max_server_queue == 0 ||
            atomic_load_explicit(&ep->server_queue, memory_order_relaxed) < ep->max_server_queue);
}

/** The same, with its in-flight count now. */
static inline bool atc_endpoint_available(const struct atc_endpoint *ep, uint64_t tokens)
{
    return atc_endpoint_available_at(ep, atomic_load_explicit(&ep->inflight, memory_order_relaxed), tokens);
}

/** The fleet-wide figures a policy sees: this replica's own plus the other replicas' (ep->remote). */
static inline unsigned atc_endpoint_fleet_inflight(const struct atc_endpoint *ep)
{
    return atomic_load_explicit(&ep->inflight, memory_order_relaxed) +
           atomic_load_explicit(&ep->remote.inflight, memory_order_relaxed);
}
static inline uint64_t atc_endpoint_fleet_tokens(const struct atc_endpoint *ep)
{
    return atomic_load_explicit(&ep->inflight_tokens, memory_order_relaxed) +
           atomic_load_explicit(&ep->remote.tokens, memory_order_relaxed);
}

/** Counts a request of @p tokens routed to @p ep. Any thread. */
void atc_endpoint_acquire(struct atc_endpoint *ep, uint64_t tokens);
/** Counts it only if @p ep is still available for it (atc_endpoint_available), as one atomic step on the
 * in-flight count: two workers cannot both take an endpoint's last slot. False when it is full now. */
bool atc_endpoint_try_acquire(struct atc_endpoint *ep, uint64_t tokens);
/** Undoes atc_endpoint_acquire once the request is finished (any outcome). Any thread; both counters
 * saturate at 0 rather than wrap. */
void atc_endpoint_release(struct atc_endpoint *ep, uint64_t tokens);
/** Records the outcome of one attempt in @p ep's counters and its last minute: @p ok false for connection
 * failures, timeouts and 5xx only; @p ttft_ms the time to the answer's first byte when ok (< 0 if
 * unknown). Any thread.
 * It does not tell health: the caller reports the same outcome to atc_health_observe (passive
 * ejection), on the thread that runs health checks. */
void atc_endpoint_record(struct atc_endpoint *ep, bool ok, double ttft_ms);

#endif
