#ifndef ATC_SERVER_H
#define ATC_SERVER_H

/* One running router: its event loop, config, endpoint table, front and admin HTTP servers, and the
 * simulated servers it started. Passed explicitly to every handler: there is no global server. */

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/sim_fleet.h"
#include "core/reloader.h"
#include "proxy/worker.h"
#include "policy/policy.h"

struct event_base;
struct event;
struct atc_http_req;
struct atc_endpoint_config;
struct atc_http_server;
struct atc_config;
struct atc_endpoint_table;
struct atc_sim_server;
struct atc_policy_runtime;
struct atc_affinity;
struct atc_prefix_index;
struct atc_health;
struct atc_recorder;
struct atc_admission;
struct atc_metrics;
struct atc_admission_shared;
struct atc_access_log;
struct atc_limits;
struct atc_cluster;
struct atc_discovery;
struct atc_table_swap;

struct atc_server {
    struct event_base *base; /* the main thread's loop: worker 0, health, admin, signals, simulated servers */
    pthread_t main_thread;
    struct atc_config *cfg;           /* owned; workers hold the same pointer in w->cfg */
    struct atc_endpoint_table *table; /* shared by every worker (w->table); its counters are atomic */
    struct atc_affinity *affinity;    /* engine-owned tables policies use; they survive reloads */
    struct atc_prefix_index *prefix;  /* (shared by every worker's policy, each with its own lock) */
    struct atc_health *health;        /* checks, ejection, drain, load scrape (health.c): main thread only */
    struct atc_recorder *recorder;    /* record: traffic to trace files; NULL without the section */
    struct atc_metrics *metrics;      /* shared, locked */
    struct atc_admission_shared *admission_shared; /* admission.queue for the whole process (locked) */
    struct atc_limits *limits;   /* limits: per-tenant budgets (cluster/limits.h's threads); NULL without */
    struct atc_cluster *cluster; /* cluster: replicas through Redis, main thread only; NULL without */
    struct atc_kv_events *kv;    /* kv_events: subscribers and the exact index (kv_events.h); NULL without */
    struct atc_policy_group policy_group; /* ties the workers' policy runtimes: one record, one rollback */
    struct atc_reloader *reloader;        /* policy reloads (made at the first); main thread */
    struct atc_affinity *shadow_affinity; /* the shadow policy's pins, apart from the live ones */
    struct event *canary_timer;           /* the canary's window (core/rollout.c); main thread */
    /* A canary asked for while policy.watch is on waits for the files to change (core/rollout.c):
     * its share (0: none armed) and window. Main thread. */
    double canary_armed_share;
    uint64_t canary_armed_window_ms;
    /* What a change of the policy's files does (core/rollout.c sets it: a canary armed or running
     * comes first); NULL: reload. Main thread. */
    void (*on_policy_files)(struct atc_server *srv);
    /* discover: (core/discovery.c, started by main.c): its state, and what follows a config reload that
     * succeeded (called at its end; NULL: nothing). Main thread. */
    struct atc_discovery *discovery;
    void (*on_config_reloaded)(struct atc_server *srv);
    /* The workers ([group.nworkers], worker 0 on the main thread), their pause and the request path's
     * hooks into this file: see proxy/worker.h for who touches what. */
    struct atc_worker_group group;
    struct event *sig_usr1;
    struct atc_http_server *admin;
    uint16_t front_port; /* as bound (config port 0 picks a free one) */
    uint16_t admin_port;
    /* Endpoint set changes that reach the workers through their mailboxes, and what they leave behind:
     * old tables, endpoints removed (proxy/table_swap.h). Main thread. */
    struct atc_table_swap *swap;
    struct event *retire_timer; /* collects it every second */
    uint64_t config_reloads_ok, config_reloads_failed;
    struct atc_sim_fleet sims; /* simulate:'s servers (sim_fleet.h) */
    struct event *sig_term, *sig_int, *sig_hup, *drain_timer;
    bool draining;
    unsigned idle_workers; /* while draining: workers with nothing left in flight */
    uint64_t rng;          /* seeds the workers' */
    uint64_t started_ms;   /* atc_mono_ms() at start: the uptime the admin API reports */
};

/** Starts everything @p cfg describes on @p base (simulated servers first, so their endpoints exist).
 * The admin listener's requests go to @p admin_handle(req, the server): core/admin.c's atc_admin_handle,
 * passed in by the caller so that the server does not include the admin API, which reads the server.
 * Takes ownership of @p cfg. Returns the server, or NULL with an owned message in *err (NULL when out of
 * memory). */
struct atc_server *atc_server_create(struct event_base *base, struct atc_config *cfg,
                                     void (*admin_handle)(struct atc_http_req *req, void *srv), char **err);

/** Calls @p cb(@p arg) once from the loop when the first round of health checks has ended, so that
 * endpoints that are up take traffic (at most one check timeout after start). */
void atc_server_when_ready(struct atc_server *srv, void (*cb)(void *arg), void *arg);

/** Writes {"listen": "...", "admin": "...", "pid": N} to @p path (atomically, via rename). */
int atc_server_write_ready_file(const struct atc_server *srv, const char *path);

/** Stops accepting and lets in-flight requests finish for up to the drain timeout, then exits the loop. */
void atc_server_drain(struct atc_server *srv);

/** Re-reads the config file: endpoints added, removed (they drain: in-flight requests finish) or changed
 * without a restart. An invalid file changes nothing: returns -1 with every error in *errors (owned).
 * Settings that need a restart (listen, admin, simulate, admission, access_log, record) are logged.
 * Returns 0 and a summary in *errors ("+2 -1 endpoints"; owned) on success. */
int atc_server_reload_config(struct atc_server *srv, char **errors);

/** Adds endpoint @p ec (its model, id and url set; config/config_endpoint.h) to the config in force and
 * the table: it joins through `starting` (health checks, then slow start). Takes what @p ec owns on
 * success; on failure @p ec is still the caller's and *why says why: atc_server_no_model,
 * atc_server_duplicate (compared by pointer) or another static reason (the address). Main thread. */
int atc_server_add_endpoint(struct atc_server *srv, struct atc_endpoint_config *ec, const char **why);

/** Removes endpoint @p id (any the config in force has, YAML or joined): it is no longer routable, its
 * requests in flight finish, then it is freed. -1 with *why atc_server_no_endpoint or
 * atc_server_simulated. Main thread. */
int atc_server_remove_endpoint(struct atc_server *srv, const char *id, const char **why);

extern const char atc_server_no_model[], atc_server_duplicate[], atc_server_no_endpoint[],
    atc_server_simulated[];

/** Frees the server (after its loop has stopped). */
void atc_server_destroy(struct atc_server *srv);

/* For the admin API (main thread). */
/** Reloads the policy on every worker without parking any (core/reloader.h): @p done(@p arg, version,
 * err) is called on the main thread once every worker decides with the new version, or with why it
 * failed (nothing changed). -1 when there is no policy (@p done is not called). */
int atc_server_reload_policy(struct atc_server *srv, atc_reload_done done, void *arg);
/** Every worker's policy runtime into @p out (room for ATC_MAX_WORKERS); 0 without a policy. Each is
 * brought up to date with a rollback made elsewhere. Call with the workers paused (a rollout: it changes
 * them; the admin API's reads copy them instead, atc_workers_visit). */
size_t atc_server_policies(const struct atc_server *srv, struct atc_policy_runtime **out);

#endif
