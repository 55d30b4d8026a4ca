#ifndef ATC_POLICY_H
#define ATC_POLICY_H

/* The policy runtime: the operator's Lua policy, sandboxed, run within a time budget per decision,
 * hot-reloaded in versions.
 *
 * The contract, as seen from Lua: stdlib/atc/contract.lua lists every field and function (type, unit,
 * when nil), policy_api.c implements them, tests/policy/contract_test.lua checks them on these views.
 *
 *   policy.entry returns  function route(req, fleet)  or  { route = fn, init = fn(fleet) }.
 *
 *   route returns an endpoint (or its id), or a verdict. An error, a budget overrun, running out of
 *   memory, or any other return value never fails the request: the engine routes it with the built-in
 *   C balancer, counts it against the policy version, and logs it (rate-limited) with file:line.
 */

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "request/request_features.h"

struct atc_endpoint;
struct atc_endpoint_table;
struct atc_affinity;
struct atc_prefix_index;
struct atc_explain;

/* Shared by the runtimes of every worker (each worker has its own, loaded from the same files): a new
 * version's run of failed decisions counts process-wide, and a rollback on one worker rolls back the
 * others at their next decision. Zeroed by the owner; atomic. */
struct atc_policy_group {
    atomic_uint streak;                /* failed decisions in a row, on any worker */
    atomic_uint_least64_t rolled_back; /* the latest version rolled back (0: none) */
    atomic_uint_least64_t served;      /* the latest version that made a good decision on any worker */
};

struct atc_policy_settings {
    const char *entry;       /* the entry file */
    const char *const *path; /* extra module directories */
    size_t npath;
    const char *stdlib_dir;  /* stdlib/ */
    uint64_t budget_us;      /* wall-clock time per decision (the watchdog stops it after 1-2x) */
    size_t memory;           /* bytes per Lua state */
    bool jit;                /* trusted: JIT on, budget checked only after the call */
    unsigned rollback_after; /* consecutive failures of a new version before rolling back (0 = never) */
    struct atc_policy_group *group; /* NULL: this runtime alone (replay, tests, one worker) */
    /* Replay: the clock atc.now() reads (milliseconds; NULL: the monotonic clock) and the seed of
     * atc.random() (0: random), in force from the first load on, its smoke test included. */
    double (*now_ms)(void *ctx);
    void *now_ctx;
    uint64_t seed;
    struct atc_affinity *shadow_affinity; /* the shadow's own pins (borrowed; NULL: it keeps none) */
    /* A runtime that repeats the leader's work (every worker but the first): its successful loads and
     * its init()'s atc.log lines are not logged, so one reload is one log line, not one per worker. */
    bool quiet;
    /* atc test: each atc.log line ("file:line: text") goes here instead of the log, so the runner
     * prints it under the test that produced it. NULL: the log. */
    void (*log)(void *ctx, const char *line);
    void *log_ctx;
};

/* What a decision asks for. */
enum atc_decision_kind {
    ATC_DECISION_ENDPOINT, /* route to .endpoint */
    ATC_DECISION_QUEUE,    /* wait in the admission queue for capacity (a retry: give up) */
    ATC_DECISION_REJECT,   /* answer .status with .message */
    ATC_DECISION_FALLBACK, /* the policy failed or gave nonsense: use the C balancer (.reason says why) */
};

/* Why a decision fell back to the C balancer: interned strings, compared by pointer
 * (d.reason == atc_policy_fallback_budget), printable as they are ("overrun"). */
extern const char atc_policy_fallback_error[];   /* the policy raised an error */
extern const char atc_policy_fallback_budget[];  /* it ran past its time budget and was stopped */
extern const char atc_policy_fallback_memory[];  /* it ran out of its memory cap */
extern const char atc_policy_fallback_invalid[]; /* it returned something that is not a decision */

struct atc_decision {
    enum atc_decision_kind kind;
    struct atc_endpoint *endpoint; /* ENDPOINT: the server that answers (a disaggregated model's decode
                                    * server); NULL when the policy named only the prefill server: the C
                                    * balancer picks it */
    struct atc_endpoint *prefill;  /* ENDPOINT of a disaggregated model: the prefill server the policy
                                    * chose (available when decided); NULL: the C balancer picks it */
    int status;
    char message[256];
    const char *reason; /* fallbacks: one of atc_policy_fallback_* (compare by pointer; _error also when
                         * no version matches the table yet), else NULL */
    uint64_t version;   /* the policy version that decided */
    bool canary;        /* that version is a canary (atc_policy_canary) */
};

/* What the engine knows about a request, for the decision. */
struct atc_route_request {
    const char *id;
    const char *path;
    enum atc_request_kind kind;
    const struct atc_features *features;
    int priority;
    const char *tenant;
    const char *session;
    unsigned attempt;
    uint64_t tokens;                   /* prompt estimate + max_tokens (or a default): for token budgets */
    struct atc_endpoint *const *tried; /* endpoints already tried (not available) */
    size_t ntried;
    /* For req:header(name): returns the header's value or NULL. */
    const char *(*header)(void *ctx, const char *name);
    void *header_ctx;
    uint32_t block_tokens; /* tokens per prefix block; 0: ATC_PREFIX_BLOCK_TOKENS (live requests) */
    /* ep:cached_tokens: the prompt tokens of this request endpoint @p ep holds, exactly, from its KV-cache
     * events (fleet/kv_index.h); < 0 when that endpoint publishes none or the request's keys are not
     * known. NULL: no endpoint does (every answer nil). Called on the deciding thread. */
    int64_t (*cached_tokens)(void *ctx, const struct atc_endpoint *ep);
    void *cached_ctx;
    /* Where atc.explain's scores go (policy/decision.h), reset by each decision; NULL: nobody reads
     * them, and atc.explain does nothing. */
    struct atc_explain *explain;
};

struct event_base;
struct lua_State;
struct evbuffer;
struct atc_policy_runtime;

/** Loads the first version of the policy described by @p s (strings are copied). @p table, @p affinity
 * and @p prefix are borrowed and must outlive the runtime (affinity and prefix may be NULL). Each call
 * into the policy runs under the runtime's budget watchdog (a count hook, policy/watchdog.h). Returns
 * the runtime, or NULL with an owned message in *err (file:line). */
struct atc_policy_runtime *atc_policy_runtime_create(const struct atc_policy_settings *s,
                                                     struct atc_endpoint_table *table,
                                                     struct atc_affinity *affinity,
                                                     struct atc_prefix_index *prefix, char **err);
void atc_policy_runtime_destroy(struct atc_policy_runtime *rt);

/** Decides where @p req goes. Always fills @p out (ATC_DECISION_FALLBACK when the policy failed; the
 * failure is counted and logged). Never calls back into the engine. */
void atc_policy_route(struct atc_policy_runtime *rt, const struct atc_route_request *req,
                      struct atc_decision *out);

/** Tells the runtime which endpoint a request finally went to (feeds the prefix index). Returns how many of
 * the request's leading prefix blocks the index had recorded for that endpoint before: what it likely has
 * cached, which the caller counts out of the request's prefill work (fleet/signals.h). */
size_t atc_policy_routed(struct atc_policy_runtime *rt, const struct atc_route_request *req,
                         const struct atc_endpoint *ep);

/** Tells the runtime that a request (@p f, @p block_tokens as in its route request) routed to @p ep finished
 * there after @p output_tokens tokens (< 0: unknown): what it held in that server's KV cache, its prompt
 * and its output, is the most recently used there now (feeds the prefix index). */
void atc_policy_released(struct atc_policy_runtime *rt, const struct atc_features *f, uint32_t block_tokens,
                         const struct atc_endpoint *ep, int64_t output_tokens);

/** Compiles a new version in a fresh state, checks the contract, runs it on synthetic requests within
 * budget, and swaps it in. Returns the new version number, or 0 with an owned message in *err (the
 * version serving traffic is unchanged). */
uint64_t atc_policy_reload(struct atc_policy_runtime *rt, char **err);

/* A reload built off the serving threads: the new version is compiled, initialised and smoke-tested
 * once per runtime by a loader of its own (watchdog, clock, random numbers) on any thread, while the
 * runtimes keep deciding; each runtime then swaps its version in on its own thread, between two
 * decisions. So no worker waits for a reload (core/reloader.c runs it). */
struct atc_policy_build;

/** Starts a build for the runtimes @p rts[@p n] (every worker's, loaded from the same files), on the thread
 * that may read them unparked (the main thread: it reads their settings and tables, which only it changes,
 * while the workers are parked). Returns it (owned: atc_policy_build_destroy), or NULL when out of memory. */
struct atc_policy_build *atc_policy_build_create(struct atc_policy_runtime *const *rts, size_t n);
/** Builds the versions, on any thread (one at a time per build). 0, or -1 with atc_policy_build_error. */
int atc_policy_build_run(struct atc_policy_build *b);
/** Why the build failed (file:line, as atc_policy_reload's *err; borrowed from @p b), or NULL when it
 * did not. */
const char *atc_policy_build_error(const struct atc_policy_build *b);
/** On runtime @p rt's thread, between decisions, once atc_policy_build_run has returned: makes the build's
 * version @p i (the one for rts[i]) the one that decides, and returns its number; or records the failed
 * build on @p rt (logged when @p i is 0) and returns 0; or, when a config reload rebuilt @p rt since the
 * build began (its version would index the old table), drops it and returns 0. */
uint64_t atc_policy_adopt(struct atc_policy_runtime *rt, struct atc_policy_build *b, size_t i);
/* What a build becomes: the version that decides (a reload), a canary deciding a share of the requests,
 * a shadow beside the live policy (built from .entry), or nothing (clears the shadow). */
enum atc_policy_target { ATC_POLICY_LIVE, ATC_POLICY_CANARY, ATC_POLICY_SHADOW, ATC_POLICY_SHADOW_CLEAR };
struct atc_policy_target_spec {
    enum atc_policy_target target;
    double share;      /* canary: share of the requests (0-1], sticky per session */
    const char *entry; /* shadow: its entry file (copied) */
    double sample;     /* shadow: share of decisions it sees */
};
/** Makes @p b build for @p spec (before atc_policy_build_run). 0, or -1 when out of memory. A shadow's
 * entry must be a regular file of at most 1 MiB inside the live entry's folder or a policy.path directory:
 * any other path fails the build at once (atc_policy_build_error says which and why; nothing is read). */
int atc_policy_build_target(struct atc_policy_build *b, const struct atc_policy_target_spec *spec);
/** The version number the build's versions take (shadows count apart). */
uint64_t atc_policy_build_version(const struct atc_policy_build *b);

/** Frees @p b and any version not adopted (NULL: nothing); on any thread once no call on @p b runs. */
void atc_policy_build_destroy(struct atc_policy_build *b);

/** The endpoint table changed (a config reload): every Lua state is rebuilt against @p table (views
 * know endpoints by their place in the table). Returns the new version, or 0 with *err: until a reload
 * succeeds, the C balancer routes (the old states no longer match the table). */
uint64_t atc_policy_set_table(struct atc_policy_runtime *rt, struct atc_endpoint_table *table, char **err);

/** An endpoint was added to or removed from the table (atc_endpoint_table_with, which keeps every other
 * endpoint's slot): @p table replaces rt->table, and the live version (and the one a rollback would go back
 * to) only update their endpoint views, with no Lua code run: views the policy holds of endpoints that
 * stay go on working, those of endpoints that left read nil (module state and affinity pins are kept).
 * A canary running ends; a shadow updates its views too and keeps its record (by slot). On the thread
 * that owns @p rt (a worker takes it from its mailbox: proxy/table_swap.h). Returns the version deciding, or
 * 0 with *err (owned) when the views could not be updated nor a state rebuilt (the C balancer routes, as
 * after atc_policy_set_table). */
uint64_t atc_policy_update_table(struct atc_policy_runtime *rt, struct atc_endpoint_table *table, char **err);

/** Applies a rollback another worker of its group made (the admin API calls it before reporting). */
void atc_policy_sync(struct atc_policy_runtime *rt);

/** The version currently deciding. */
uint64_t atc_policy_version(const struct atc_policy_runtime *rt);

/** Appends the state of the runtimes @p rts (one per worker; the first one's version, entry and
 * reloads; decision counters summed) as a JSON object: version, loaded_at, last_error, per-version
 * counters. */
void atc_policy_status_json(struct atc_policy_runtime *const *rts, size_t n, struct evbuffer *out);

/** Appends their Prometheus metrics (version, reloads, per-version failure counters), likewise. */
void atc_policy_metrics(struct atc_policy_runtime *const *rts, size_t n, struct evbuffer *out);

/** Reloads when a .lua file in the policy's directories changes (inotify, debounced), or calls
 * @p on_change(@p arg) instead when it is set (the server reloads every worker's runtime). 0 or -1. */
int atc_policy_watch(struct atc_policy_runtime *rt, struct event_base *base, void (*on_change)(void *arg),
                     void *arg);
/** Whether @p rt watches its files (atc_policy_watch took and was not undone). */
bool atc_policy_watching(const struct atc_policy_runtime *rt);
/** Stops the watch of @p rt (policy.watch turned off by a config reload); nothing when it has none. */
void atc_policy_unwatch(struct atc_policy_runtime *rt);

/** Where stdlib/ is: $ATC_STDLIB, else the source tree atc was built from, else the install prefix. */
const char *atc_policy_stdlib_dir(void);

/** `atc test [-c FILE] [--budget DURATION] TEST.lua...`: runs policy unit tests in the sandbox. */
int atc_policy_test_main(int argc, char **argv, int (*replay)(struct lua_State *L));

/** The settings of the policy whose Lua state runs the current C function: for a host function registered
 * through the policy API (upvalue 1 is its version), such as t.replay. */
const struct atc_policy_settings *atc_policy_settings_of(struct lua_State *L);

/* ---- shadow (shadow.c) ---- */

/** After the live decision @p live on @p req (first attempts only), the shadow decides the same request
 * (when one is loaded and the sample draws it), within its own budget; its pick is counted against
 * @p live and written into @p rec's shadow fields (may be NULL), never acted on. */
struct atc_decision_record;
void atc_policy_shadow_route(struct atc_policy_runtime *rt, const struct atc_route_request *req,
                             const struct atc_decision *live, struct atc_decision_record *rec);

/* ---- canary (canary.c) ---- */

/* How far a canary may be from the current version and be promoted (policy.canary). */
struct atc_canary_guards {
    double error_rate, fallback_rate, overrun_rate; /* added to the current version's rate */
    double ttft_p90;                                /* times the current version's TTFT p90 */
    unsigned min_requests;                          /* fewer canary requests: rolled back */
};

/** A request decided by @p version ended with TTFT @p ttft_ms (< 0: none): counted to its canary side. */
void atc_policy_observe(struct atc_policy_runtime *rt, uint64_t version, bool canary, double ttft_ms);
/** The canary's version, or 0 when none. */
uint64_t atc_policy_canary_version(const struct atc_policy_runtime *rt);
/** Judges the canary of the runtimes @p rts (every worker's; parked) against @p g: 1 promote, 0 roll back
 * (why in @p why), -1 no canary. */
int atc_policy_canary_judge(struct atc_policy_runtime *const *rts, size_t n,
                            const struct atc_canary_guards *g, char *why, size_t size);
/** Ends @p rt's canary: promoted (it decides everything from now on) or rolled back (freed); @p why is
 * kept for status. Parked, or on @p rt's thread. */
void atc_policy_canary_end(struct atc_policy_runtime *rt, bool promote, const char *why);

/** Makes @p v (built, numbered) the version that decides; the runtime's files only (canary.c). */
struct policy_version;
void policy_swap_in(struct atc_policy_runtime *rt, struct policy_version *v);

/** A runtime with no version loaded yet (strings of @p s copied), with its watchdog and its empty shadow
 * and canary slots; NULL: no memory. Freed by atc_policy_runtime_destroy. For the runtime's own files and
 * the `atc test` runner (atc_policy_runtime_create loads a version too). */
struct atc_policy_runtime *policy_runtime_create(const struct atc_policy_settings *s);

#endif
