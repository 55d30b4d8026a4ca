#ifndef ATC_POLICY_STATE_H
#define ATC_POLICY_STATE_H

/* The structs the files of the policy runtime share (runtime.c: versions, decisions, reload; version.c:
 * one version's state; sandbox.c; status.c; watch.c; policy_api.c and policy_pick.c: what a policy
 * sees; policy_test.c: `atc test`), and nothing else: each function is declared in the header of the
 * file that defines it, so that no two of them include each other. Not for other subsystems. Every
 * field here is touched only by the thread that owns the runtime (its worker; the main thread for
 * atc check, atc test and replay), or by another thread while that worker is parked (admin, reload). */

#include <lua.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "policy/policy.h"

struct policy_counters {
    uint64_t decisions; /* calls of route */
    uint64_t errors;    /* runtime errors */
    uint64_t overruns;  /* budget exceeded */
    uint64_t oom;       /* memory cap hit */
    uint64_t invalid;   /* returned something that is not a usable endpoint or verdict */
    uint64_t gc_steps;  /* incremental collector steps after calls (version.c collect_some) */
    uint64_t gc_cycles; /* collection cycles those steps finished */
};

/* One loaded version of the policy: its own Lua state. */
struct policy_version {
    struct atc_policy_runtime *rt;
    lua_State *L;
    uint64_t version;
    double loaded_at;    /* unix seconds */
    uint64_t files_hash; /* of the sources it was built from (policy_files_hash) */
    size_t mem_used, mem_limit;
    size_t mem_allocated; /* bytes ever grown by (wraps): what a call allocated paces the collector */
    bool mem_refused; /* the allocator said no during the current call */
    int route_ref;    /* registry ref of route(req, fleet) */
    int req_ref;      /* the one req userdata, pointed at the current request during a decision */
    int fleet_ref;
    int endpoints_ref; /* registry table: endpoint index + 1 -> its view (stable identity) */
    struct {
        const void *view; /* a view table's address */
        unsigned index;
    } * view_slots; /* view -> endpoint index, open addressing */
    size_t view_mask;
    /* Engine lists (policy_fleet.c) by table address, open addressing; reset with the views. */
    struct policy_list **lists;
    size_t lists_mask, nlists, npools; /* npools: those atc.pool made (bounded) */
    int lists_ref;                     /* registry table: model name -> its list, all_key -> fleet:all's */
    unsigned *ids;                     /* endpoint slot + 1 by a hash of its id (0: empty); NULL: not built */
    size_t ids_mask;
    struct policy_counters c;
    unsigned consecutive_failures;
    uint64_t successes;

    /* The decision in progress (NULL between decisions: a req kept by the script is then dead). */
    const struct atc_route_request *req;
    uint16_t *overlaps; /* per endpoint, computed on the first ep:prefix_overlap of a decision */
    bool overlaps_ready;
    uint64_t serial; /* decisions ever begun on this version (never reset, unlike c.decisions) */
    double log_window_start; /* atc.log rate limit */
    unsigned log_count;
};

struct atc_policy_runtime {
    struct atc_policy_settings s; /* strings owned */
    struct atc_endpoint_table *table;
    struct atc_affinity *affinity;
    struct atc_prefix_index *prefix;
    struct policy_version *current;
    struct policy_version *last_good; /* kept while current is on probation; may equal NULL */
    uint64_t next_version;
    char *last_error;
    double last_reload_at;
    uint64_t reloads_ok, reloads_failed, rollbacks, fallbacks;
    uint64_t rng;
    double (*now_ms)(void *ctx);
    void *now_ctx;
    struct watchdog *watchdog;
    struct event *watch_event; /* inotify */
    struct event *watch_debounce;
    void (*on_change)(void *arg); /* what a change of the files does (atc_policy_watch) */
    void *on_change_arg;
    int inotify_fd;
    bool test_mode; /* atc test: no endpoint table */
    /* The directories watched, by inotify watch descriptor, to name the file that changed. */
    int watch_wd[16];
    char *watch_dir[16];
    size_t nwatch;
    char changed[512];         /* the first .lua file of the burst that changed, "" when none yet */
    unsigned nchanged;         /* events in the burst */
    bool stale;                /* the table changed and no version matches it yet: the C balancer routes */
    uint64_t table_changes;    /* atc_policy_set_table calls: a build begun before one is stale */
    uint64_t table_updates;    /* atc_policy_update_table calls: a build begun before one updates its views */
    lua_CFunction test_replay; /* atc test: installed as atc.replay (upvalue 1: the version) */
    lua_CFunction test_route;  /* atc test: installed as atc.test_route (upvalue 1: the version) */

    /* Owned, from policy_runtime_create to atc_policy_runtime_destroy; opaque outside their files. */
    struct atc_policy_shadow *shadow; /* shadow.c: a second policy beside this one, only recorded */
    struct atc_policy_canary *canary; /* canary.c: a new version on a share of the requests */
};

/* Status copies (status.c): a runtime's or a version's record without its Lua state or timers, for a
 * reader on another thread; every pointer a renderer follows is copied, every other one NULL. On out of
 * memory they return NULL (or leave *failed true); a runtime's copy is freed by
 * policy_runtime_status_copy_free. */
struct atc_policy_runtime *policy_runtime_status_copy(const struct atc_policy_runtime *rt);
struct policy_version *policy_version_status_copy(const struct policy_version *v, struct atc_policy_runtime *rt,
                                                  bool *failed);
void policy_runtime_status_copy_free(struct atc_policy_runtime *copy);

/* A verdict returned by atc.queue() / atc.reject(). */
struct policy_verdict {
    enum atc_decision_kind kind;
    int status;
    char message[256];
};

#define POLICY_MT_VERDICT "atc.verdict"
#define POLICY_MT_REQ "atc.req"
#define POLICY_MT_FLEET "atc.fleet"

/** Milliseconds of the runtime's clock (virtual time under replay). */
static inline double policy_now_ms(const struct atc_policy_runtime *rt)
{
    return rt->now_ms(rt->now_ctx);
}

#endif
