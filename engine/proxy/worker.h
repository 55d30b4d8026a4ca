#ifndef ATC_WORKER_H
#define ATC_WORKER_H

/* A worker: one thread's event loop with its own front listener (SO_REUSEPORT), Lua policy runtime,
 * admission queue, access log buffer and upstream pools (ep->pools[id]). Worker 0 runs on the main
 * thread, which also owns health checks, the admin API, signals and reloads. The endpoint table, its
 * atomic counters, the metrics and the affinity tables are shared.
 *
 * Another thread reaches a worker in one of two ways only: a task posted to its mailbox (runs on the
 * worker's thread, later), or while every worker is parked (atc_workers_pause: the main thread may then
 * read and change any worker's state; used for reloads, drains and rollouts, never per request nor to read:
 * the admin API's and /metrics' figures are copied by each worker on its own thread, atc_workers_visit). */

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/time.h>

struct event_base;
struct event;
struct atc_http_server;
struct atc_config;
struct atc_endpoint;
struct atc_endpoint_table;
struct atc_policy_runtime;
struct atc_admission;
struct atc_access_log;
struct atc_metrics;
struct atc_recorder;
struct atc_limits;
struct atc_kv_events;
struct atc_worker;
struct worker_task;

/* One worker's counters: written on its own thread; the admin API and /metrics copy them there
 * (atc_workers_visit) and sum the copies. */
struct atc_worker_stats {
    uint64_t requests_total;    /* client requests accepted on the front routes */
    uint64_t responses_total;   /* client requests answered (any status) */
    uint64_t client_gone_total; /* clients that disconnected before their answer ended */
    uint64_t retries_total;     /* attempts after the first */
    uint64_t upstream_errors_total;
};

/* What the request path (http_front.c, relay.c) tells whoever runs the workers: core/server.c fills it
 * in before any worker serves, and implements each hook (so the fronts and relays do not include the
 * server). Called on @p w's own thread, through the atc_worker_* wrappers below, with @p ctx. Every
 * hook is set. */
struct atc_worker_hooks {
    void *ctx;
    /** A client request was accepted on @p w / has ended (answered, or its client went away). */
    void (*request_started)(void *ctx, struct atc_worker *w);
    void (*request_finished)(void *ctx, struct atc_worker *w);
    /** A request's outcome on @p ep, for passive health checks (which run on the main thread). */
    void (*observe)(void *ctx, struct atc_worker *w, struct atc_endpoint *ep, bool ok, bool had_errors);
    /** @p ep answered a request 401/403 (@p status): it refused atc's own key, a configuration error. */
    void (*key_refused)(void *ctx, struct atc_worker *w, struct atc_endpoint *ep, int status);
    /** A slot on some endpoint freed: the worker with the most urgent waiting request tries to place it. */
    void (*capacity_freed)(void *ctx, struct atc_worker *w);
    /** @p w's admission queue changed: other workers read its top priority. */
    void (*queue_changed)(void *ctx, struct atc_worker *w);
};

/* Every worker of a process and what parks them (atc_workers_pause). The server embeds it. */
struct atc_worker_group {
    /* [nworkers]; worker 0 runs on the main thread. Set up by the main thread before any worker thread
     * starts and never changed while they run: any thread reads the array and the count plainly. */
    struct atc_worker *workers;
    unsigned nworkers;
    struct atc_worker_hooks hooks; /* set before any worker serves, then immutable: read plainly */

    /* The pause. pause_mu covers parked, paused and every worker's `running`; pause_cv is signalled when
     * one of them changes. pause_depth: the main thread's only (atc_workers_pause nests). */
    pthread_mutex_t pause_mu;
    pthread_cond_t pause_cv;
    unsigned parked; /* (pause_mu) workers waiting in park */
    bool paused;     /* (pause_mu) */
    unsigned pause_depth;
    uint64_t parks; /* outermost atc_workers_pause calls: every worker stopped once (main thread only) */
};

/* An object that must outlive the callback that ended it (STYLE: never free an object while a callback
 * further up the stack still uses it; defer to the loop) embeds one of these and is handed to
 * atc_worker_defer. */
struct atc_deferred {
    struct atc_deferred *next;
    void (*fn)(struct atc_deferred *d);
};

/* Threads: unless a field says otherwise, it is the worker's own: touched on its thread, or by the main
 * thread while the worker is parked (atc_workers_pause) or before its thread starts / after it joined. */
struct atc_worker {
    struct atc_worker_group *group; /* the one it belongs to (set once by atc_worker_init) */
    unsigned id;
    struct event_base *base;
    struct atc_config *cfg;            /* the config it serves with (swapped by reloads while parked) */
    struct atc_endpoint_table *table;  /* likewise */
    struct atc_policy_runtime *policy; /* NULL without a policy: section */
    struct atc_admission *admission;   /* NULL when admission.queue is 0 */
    struct atc_access_log *access_log; /* this worker's buffer on the shared file; NULL without one */
    struct atc_http_server *front; /* this worker's listener and client connections */
    /* Shared by every worker, lent by the server when it starts the worker and never changed (a reload
     * keeps them: record: takes effect at the next restart): read plainly. */
    struct atc_metrics *metrics;   /* its own lock (ops/metrics.h) */
    struct atc_recorder *recorder; /* record: traffic (trace/recorder.h's threads); NULL without it */
    struct atc_limits *limits;     /* limits: tenant budgets (cluster/limits.h's threads); NULL without */
    const struct atc_kv_events *kv; /* kv_events: the exact index (read without locks); NULL without */
    struct atc_worker_stats stats;
    unsigned active; /* client requests in progress on this worker */
    bool draining;
    bool idle_reported; /* draining, and told the main thread it has nothing left in flight */
    uint64_t rng;
    uint64_t next_id;
    struct atc_deferred *deferred; /* atc_worker_defer's list, run by defer_ev */
    struct event *defer_ev;

    /* Cross-worker handoff of freed slots (the hooks in server.c). top_priority: the highest priority waiting
     * in its admission queue, -1 when none; written only on its own thread (the queue_changed hook, after
     * every change to the queue), read by any worker with a plain atomic load when a slot frees. A
     * mailbox wake does not touch it. kick_posted: set by the worker that posts a kick, cleared by the
     * kick on this worker's thread (an atomic exchange, so only one kick is in the mailbox at a time). */
    atomic_int top_priority;
    atomic_bool kick_posted;

    /* the mailbox */
    pthread_t thread; /* main thread only (pthread_create, pthread_join) */
    bool threaded;    /* a thread of its own (every worker but 0); set before it starts, never cleared */
    bool running;     /* its thread's loop has not returned (group->pause_mu) */
    bool joined;      /* its thread is gone (main thread only) */
    int wake_fd;      /* eventfd the mailbox event reads; any thread writes to it (atc_worker_post) */
    struct event *wake;
    pthread_mutex_t mu;
    struct worker_task *tasks, **tail; /* (mu) */
    bool closed;                       /* no more tasks: the loop has stopped (mu) */
};

/** A new event base tuned for a proxy (the epoll changelist). NULL on failure. */
struct event_base *atc_event_base_new(void);

/** Sets up the pause of @p g (its workers array and count are the caller's to fill in). */
void atc_worker_group_init(struct atc_worker_group *g);
/** Frees what atc_worker_group_init made (not the workers), once no worker thread runs. */
void atc_worker_group_dispose(struct atc_worker_group *g);

/** Sets up worker @p id of @p g on @p base (its mailbox); its random numbers start from @p seed (mixed
 * with @p id). 0, or -1 on failure. */
int atc_worker_init(struct atc_worker *w, struct atc_worker_group *g, unsigned id, struct event_base *base,
                    uint64_t seed);

/** Starts the worker's own thread running its loop. 0, or -1. */
int atc_worker_start(struct atc_worker *w);

/** Makes the worker's loop return soon (safe from any thread). */
void atc_worker_exit_loop(struct atc_worker *w);

/** Stops a threaded worker's loop and waits for its thread (nothing runs on its loop afterwards). */
void atc_worker_join(struct atc_worker *w);

/** Calls @p fn(@p d) from @p w's loop once the current callback has returned (or from atc_worker_free,
 * if the loop does not run again). On @p w's own thread; costs no system call. */
void atc_worker_defer(struct atc_worker *w, struct atc_deferred *d, void (*fn)(struct atc_deferred *d));

/** Runs what is still deferred, then frees the worker's mailbox (not its base, nor what start_worker
 * made). */
void atc_worker_free(struct atc_worker *w);

/** Runs @p fn(@p arg) on @p w's thread soon (at once when called on it). Returns 0; -1 when the worker
 * has stopped (for good), -2 when memory ran out (a later post may succeed): @p fn is then not called.
 * Safe from any thread. */
int atc_worker_post(struct atc_worker *w, void (*fn)(void *arg), void *arg);

/** Parks every running threaded worker between two callbacks and returns once all are parked: the
 * caller (the main thread) may then touch their state. Nests; the outermost atc_workers_resume ends it.
 * For writes (reloads, drains, rollouts) only: a read goes through atc_workers_visit. */
void atc_workers_pause(struct atc_worker_group *g);
void atc_workers_resume(struct atc_worker_group *g);

/** Calls @p fn(w, @p arg) once for every worker, on that worker's own thread (worker 0, and a worker whose
 * loop has stopped, on the caller's), and returns once every call has returned. Main thread only. No
 * worker waits for another, nor for the caller: each runs one task between two callbacks and goes on
 * serving, so @p fn should copy what it reads (the admin API and /metrics read this way) and not block.
 * The calls for different workers run at the same time: @p fn writes only into @p w's slot of @p arg.
 * The caller sees everything @p fn wrote once this returns (a mutex orders them). Within a pause it calls
 * @p fn for every worker on the caller's thread. */
void atc_workers_visit(struct atc_worker_group *g, void (*fn)(struct atc_worker *w, void *arg), void *arg);

/* The hooks, called on @p w's thread by the request path. */
static inline void atc_worker_request_started(struct atc_worker *w)
{
    w->group->hooks.request_started(w->group->hooks.ctx, w);
}
static inline void atc_worker_request_finished(struct atc_worker *w)
{
    w->group->hooks.request_finished(w->group->hooks.ctx, w);
}
static inline void atc_worker_observe(struct atc_worker *w, struct atc_endpoint *ep, bool ok, bool had_errors)
{
    w->group->hooks.observe(w->group->hooks.ctx, w, ep, ok, had_errors);
}
static inline void atc_worker_key_refused(struct atc_worker *w, struct atc_endpoint *ep, int status)
{
    w->group->hooks.key_refused(w->group->hooks.ctx, w, ep, status);
}
static inline void atc_worker_capacity_freed(struct atc_worker *w)
{
    w->group->hooks.capacity_freed(w->group->hooks.ctx, w);
}
static inline void atc_worker_queue_changed(struct atc_worker *w)
{
    w->group->hooks.queue_changed(w->group->hooks.ctx, w);
}

#endif
