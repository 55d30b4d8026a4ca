#include "core/server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <netdb.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "cluster/cluster.h"
#include "cluster/limits.h"
#include "fleet/kv_events.h"
#include "ops/access_log.h"
#include "fleet/admission.h"
#include "fleet/affinity.h"
#include "config/config.h"
#include "config/config_endpoint.h"
#include "fleet/endpoint.h"
#include "fleet/health.h"
#include "proxy/http_front.h"
#include "http/http_server.h"
#include "base/clock.h"
#include "base/log.h"
#include "ops/metrics.h"
#include "policy/policy.h"
#include "trace/recorder.h"
#include "proxy/relay.h"
#include "proxy/table_swap.h"
#include "http/upstream.h"
#include "core/reloader.h"
#include "core/sim_fleet.h"
#include "proxy/worker.h"

/* Connections open at once on the admin port, beyond the front's max_connections: operators' tools and
 * scrapers, a handful; more wait in the backlog. */
#define ADMIN_MAX_CONNECTIONS 64

/* Bodies between max_body and this get the front's OpenAI-style 413 (with the request's id and its
 * metrics); beyond it the HTTP server refuses at the head, before reading the body (413 and a closed
 * connection), so a hostile upload cannot fill memory. */
#define HARD_BODY_FACTOR 4

static void on_more_capacity(void *arg);

static uint16_t bound_port(evutil_socket_t fd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    if (getsockname(fd, (struct sockaddr *)&ss, &len) < 0)
        return 0;
    if (ss.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    return ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

/* A listening socket with the kernel's largest accept queue: a backlog of 128 is too short, a burst of
 * thousands of clients (streams opening at once) overflows it, so some wait seconds to retry.
 * With @p reuseport, every worker binds its own socket to the same port and the kernel spreads new
 * connections over them. */
static evutil_socket_t listen_socket(const char *host, uint16_t port, bool reuseport)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE},
                    *res = NULL;
    char service[8];
    snprintf(service, sizeof(service), "%u", (unsigned)port);
    if (getaddrinfo(host, service, &hints, &res) != 0 || res == NULL)
        return -1;
    evutil_socket_t fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
        (reuseport && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) < 0) ||
        bind(fd, res->ai_addr, res->ai_addrlen) < 0 || listen(fd, SOMAXCONN) < 0) {
        if (fd >= 0)
            evutil_closesocket(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd;
}

/* Sets *err to an owned message (NULL when out of memory) and returns -1. */
static int fail(char **err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(char **err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(err, fmt, ap) < 0)
        *err = NULL;
    va_end(ap);
    return -1;
}

static int cannot_listen(char **err, const char *host, uint16_t port)
{
    return fail(err, "cannot listen on %s:%u: address in use or not available", host, (unsigned)port);
}

/* ---- workers ---- */

static struct atc_worker *main_worker(struct atc_server *srv)
{
    return &srv->group.workers[0];
}

/* The server worker @p w belongs to: the context of the hooks it set in its workers' group. */
static struct atc_server *server_of(const struct atc_worker *w)
{
    return w->group->hooks.ctx;
}

static struct atc_upstream_settings upstream_settings(const struct atc_config *cfg)
{
    return (struct atc_upstream_settings){
        .connect_timeout_ms = cfg->upstream.connect_timeout_ms,
        .first_byte_timeout_ms = cfg->upstream.first_byte_timeout_ms,
        .idle_timeout_ms = cfg->upstream.idle_timeout_ms,
        .token_timeout_ms = cfg->upstream.token_timeout_ms,
        .keepalive = cfg->upstream.keepalive,
    };
}

/* One pool per worker for the server at @p host:@p port (each worker keeps its own keep-alive
 * connections), into @p pools[ATC_MAX_WORKERS]. */
typedef struct atc_upstream_pool *worker_pools[ATC_MAX_WORKERS];

static int create_pools(struct atc_server *srv, const char *host, uint16_t port, const struct atc_config *cfg,
                        worker_pools pools, const char **err)
{
    struct atc_upstream_settings us = upstream_settings(cfg);
    for (unsigned i = 0; i < srv->group.nworkers; i++)
        if ((pools[i] = atc_upstream_pool_create(srv->group.workers[i].base, host, port, &us, err)) == NULL)
            return -1;
    return 0;
}

static void destroy_pools(worker_pools pools)
{
    for (unsigned i = 0; i < ATC_MAX_WORKERS; i++) {
        atc_upstream_pool_destroy(pools[i]);
        pools[i] = NULL;
    }
}

/* Worker @p w's admission queue changed (on its thread): other workers read its top priority. */
static void queue_changed(struct atc_worker *w)
{
    if (w->admission != NULL)
        atomic_store(&w->top_priority, atc_admission_top_priority(w->admission));
}

static void kick_admission(void *arg)
{
    struct atc_worker *w = arg;
    atomic_store(&w->kick_posted, false);
    atc_admission_kick(w->admission);
    queue_changed(w);
}

static void post_kick(struct atc_worker *w)
{
    if (!atomic_exchange(&w->kick_posted, true) && atc_worker_post(w, kick_admission, w) < 0)
        atomic_store(&w->kick_posted, false);
}

/* Each worker has its own queue: the one holding the most urgent request gets the freed slot first (this
 * one on a tie, at once; another through its mailbox), so priorities hold across workers. */
static void on_capacity_freed(void *ctx, struct atc_worker *w)
{
    struct atc_server *srv = ctx;
    struct atc_worker *best = w;
    int top = atomic_load(&w->top_priority);
    for (unsigned i = 0; i < srv->group.nworkers; i++) {
        int p = atomic_load(&srv->group.workers[i].top_priority);
        if (p > top) {
            best = &srv->group.workers[i];
            top = p;
        }
    }
    if (top < 0)
        return; /* nobody waits */
    if (best == w)
        kick_admission(w);
    else
        post_kick(best);
}

/* An endpoint came back (or offers more room): requests waiting in admission queues may fit now. */
static void on_more_capacity(void *arg)
{
    struct atc_server *srv = arg;
    for (unsigned i = 0; i < srv->group.nworkers; i++)
        post_kick(&srv->group.workers[i]); /* at once on the main thread's own worker */
}

struct observation {
    struct atc_server *srv;
    struct atc_endpoint *ep;
    bool ok;
};

/* On the main thread. The endpoint may have left the table since (a reload) and even be freed: it is
 * looked up by address, never read, unless it is still in the table. */
static void observe_on_main(void *arg)
{
    struct observation *o = arg;
    const struct atc_endpoint_table *t = o->srv->table;
    for (size_t i = 0; i < t->nendpoints; i++)
        if (t->endpoints[i] == o->ep && o->ep->health != NULL)
            atc_health_observe(o->ep, o->ok);
    free(o);
}

/* Passes a request's outcome on @p ep to passive health checks (on the main thread). */
static void on_observe(void *ctx, struct atc_worker *w, struct atc_endpoint *ep, bool ok, bool had_errors)
{
    struct atc_server *srv = ctx;
    if (ep->health == NULL || (ok && !had_errors))
        return; /* the common case costs nothing: only failures and the first success after them travel */
    if (!w->threaded) {
        atc_health_observe(ep, ok);
        return;
    }
    struct observation *o = malloc(sizeof(*o));
    if (o == NULL)
        return;
    *o = (struct observation){.srv = srv, .ep = ep, .ok = ok};
    if (atc_worker_post(main_worker(srv), observe_on_main, o) < 0)
        free(o);
}

struct key_refusal {
    struct atc_server *srv;
    struct atc_endpoint *ep;
    int status;
};

static void key_refused_on_main(void *arg)
{
    struct key_refusal *k = arg;
    const struct atc_endpoint_table *t = k->srv->table;
    for (size_t i = 0; i < t->nendpoints; i++) /* (as observe_on_main: looked up, never read, if gone) */
        if (t->endpoints[i] == k->ep)
            atc_health_key_refused(k->ep, k->status);
    free(k);
}

/* An engine refused atc's key on a request: health says so in the endpoint's last_error. */
static void on_key_refused(void *ctx, struct atc_worker *w, struct atc_endpoint *ep, int status)
{
    struct atc_server *srv = ctx;
    struct key_refusal *k = malloc(sizeof(*k));
    if (k == NULL)
        return;
    *k = (struct key_refusal){.srv = srv, .ep = ep, .status = status};
    if (!w->threaded)
        key_refused_on_main(k);
    else if (atc_worker_post(main_worker(srv), key_refused_on_main, k) < 0)
        free(k);
}

size_t atc_server_policies(const struct atc_server *srv, struct atc_policy_runtime **out)
{
    size_t n = 0;
    for (unsigned i = 0; i < srv->group.nworkers; i++)
        if (srv->group.workers[i].policy != NULL) {
            atc_policy_sync(srv->group.workers[i].policy);
            out[n++] = srv->group.workers[i].policy;
        }
    return n;
}

/* ---- signals, drain ---- */

static void on_sigusr1(evutil_socket_t sig, short what, void *arg)
{
    struct atc_server *srv = arg;
    atc_info("SIGUSR1: reopening the access log");
    atc_workers_pause(&srv->group);
    for (unsigned i = 0; i < srv->group.nworkers; i++)
        if (srv->group.workers[i].access_log != NULL)
            atc_access_log_reopen(srv->group.workers[i].access_log);
    atc_workers_resume(&srv->group);
}

static void stop_all_loops(struct atc_server *srv)
{
    for (unsigned i = 1; i < srv->group.nworkers; i++)
        atc_worker_exit_loop(&srv->group.workers[i]);
    event_base_loopexit(srv->base, NULL);
}

static void on_drain_timeout(evutil_socket_t fd, short what, void *arg)
{
    struct atc_server *srv = arg;
    atc_warn("drain timeout: exiting with %u worker(s) still busy", srv->group.nworkers - srv->idle_workers);
    stop_all_loops(srv);
}

/* On the main thread: one more worker has nothing in flight. */
static void worker_idle(void *arg)
{
    struct atc_server *srv = server_of(arg);
    if (++srv->idle_workers == srv->group.nworkers)
        stop_all_loops(srv);
}

static void check_idle(struct atc_worker *w)
{
    if (!w->draining || w->active > 0 || w->idle_reported)
        return;
    w->idle_reported = true;
    atc_worker_post(main_worker(server_of(w)), worker_idle, w);
}

/* On each worker's thread: stop accepting; connections already open get 503 + Connection: close. */
static void drain_worker(void *arg)
{
    struct atc_worker *w = arg;
    w->draining = true;
    if (w->front != NULL)
        atc_http_server_stop_listening(w->front);
    check_idle(w);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    struct atc_server *srv = arg;
    if (srv->draining) {
        atc_warn("second signal: exiting now");
        stop_all_loops(srv);
        return;
    }
    atc_info("signal %d: draining", (int)sig);
    atc_server_drain(srv);
}

void atc_server_drain(struct atc_server *srv)
{
    if (srv->draining)
        return;
    srv->draining = true;
    struct timeval tv = atc_timeval_ms(srv->cfg->drain_timeout_ms);
    srv->drain_timer = evtimer_new(srv->base, on_drain_timeout, srv);
    event_add(srv->drain_timer, &tv);
    for (unsigned i = 0; i < srv->group.nworkers; i++)
        if (atc_worker_post(&srv->group.workers[i], drain_worker, &srv->group.workers[i]) < 0)
            worker_idle(&srv->group.workers[i]); /* its loop has stopped already */
}

/* The request path's hooks (struct atc_worker_hooks), on the worker's thread. */
static void on_request_started(void *ctx, struct atc_worker *w)
{
    w->active++;
}

static void on_request_finished(void *ctx, struct atc_worker *w)
{
    w->active--;
    check_idle(w);
}

static void on_queue_changed(void *ctx, struct atc_worker *w)
{
    queue_changed(w);
}

/* ---- reloads ---- */

static void on_sighup(evutil_socket_t sig, short what, void *arg)
{
    struct atc_server *srv = arg;
    char *msg = NULL;
    atc_info("SIGHUP: reloading the config%s", srv->cfg->policy.enabled ? " and the policy" : "");
    atc_server_reload_config(srv, &msg); /* it reloads the policy too */
    free(msg);
}

int atc_server_reload_policy(struct atc_server *srv, atc_reload_done done, void *arg)
{
    if (main_worker(srv)->policy == NULL)
        return -1;
    if (srv->reloader == NULL && (srv->reloader = atc_reloader_create(&srv->group)) == NULL) {
        if (done != NULL)
            done(arg, 0, "out of memory");
        return 0;
    }
    atc_reloader_start(srv->reloader, done, arg);
    return 0;
}

/* The policy files changed (inotify): every worker reloads. */
static void on_policy_files_changed(void *arg)
{
    struct atc_server *srv = arg;
    if (srv->on_policy_files != NULL)
        srv->on_policy_files(srv);
    else
        atc_server_reload_policy(srv, NULL, NULL);
}

/* policy.watch changed by a config reload: the watch starts or stops (it lives on worker 0's runtime). */
static void apply_watch(struct atc_server *srv, bool was, bool now)
{
    struct atc_policy_runtime *rt = main_worker(srv)->policy;
    if (rt == NULL || was == now)
        return;
    if (!now) {
        atc_policy_unwatch(rt);
        srv->canary_armed_share = 0; /* nothing would load it now */
        atc_info("policy.watch is off: the policy's files are read again only on atc reload");
    } else if (atc_policy_watch(rt, srv->base, on_policy_files_changed, srv) == 0) {
        atc_info("policy.watch is on: a change of the policy's files reloads it");
    } else {
        atc_policy_unwatch(rt);
        atc_warn("cannot watch the policy's files; reload with SIGHUP or POST /admin/policy/reload");
    }
}

static bool str_differs(const char *a, const char *b)
{
    return (a == NULL) != (b == NULL) || (a != NULL && strcmp(a, b) != 0);
}

static bool sim_differs(const struct atc_simulate_config *a, const struct atc_simulate_config *b)
{
    const struct atc_sim_params *p = &a->params, *q = &b->params;
    return a->count != b->count || a->capacity != b->capacity || str_differs(p->model, q->model) ||
           p->max_seqs != q->max_seqs || p->prefill_tps != q->prefill_tps || p->decode_ms != q->decode_ms ||
           p->kv_blocks != q->kv_blocks || p->error_rate != q->error_rate || p->hang_rate != q->hang_rate ||
           p->not_ready_for_ms != q->not_ready_for_ms || p->die_after != q->die_after || p->seed != q->seed ||
           p->decode_batch_factor != q->decode_batch_factor || p->decode_batch_sat != q->decode_batch_sat ||
           p->max_batched_tokens != q->max_batched_tokens || p->output_min != q->output_min ||
           p->output_max != q->output_max;
}

/* kv_events: subscribers are made once, at start (their index is sized for them then). The @p k-th
 * endpoint of @p c that publishes events, or NULL. */
static const struct atc_endpoint_config *kv_endpoint(const struct atc_config *c, size_t k)
{
    for (size_t i = 0; i < c->nmodels; i++)
        for (size_t j = 0; j < c->models[i].nendpoints; j++)
            if (c->models[i].endpoints[j].kv_events.endpoint && k-- == 0)
                return &c->models[i].endpoints[j];
    return NULL;
}

static bool kv_events_differ(const struct atc_config *o, const struct atc_config *n)
{
    for (size_t k = 0;; k++) {
        const struct atc_endpoint_config *a = kv_endpoint(o, k), *b = kv_endpoint(n, k);
        if (!a || !b)
            return a != b;
        const struct atc_kv_events_config *x = &a->kv_events, *y = &b->kv_events;
        if (str_differs(a->id, b->id) || str_differs(x->endpoint, y->endpoint) ||
            str_differs(x->replay_endpoint, y->replay_endpoint) || str_differs(x->topic, y->topic) ||
            x->max_blocks != y->max_blocks)
            return true;
    }
}

/* The first setting that is read once at start and that @p n changes, or NULL. A reload that changes
 * one is refused whole: applying the rest would leave a config that is neither the old nor the file. */
static const char *restart_only_change(const struct atc_config *o, const struct atc_config *n)
{
    if (str_differs(o->listen_host, n->listen_host) || o->listen_port != n->listen_port)
        return "listen";
    if (str_differs(o->admin_host, n->admin_host) || o->admin_port != n->admin_port)
        return "admin";
    if (o->workers != n->workers)
        return "workers";
    bool sim = o->nsimulate != n->nsimulate;
    for (size_t i = 0; !sim && i < o->nsimulate; i++)
        sim = sim_differs(&o->simulate[i], &n->simulate[i]);
    if (sim)
        return "simulate";
    if (o->admission.queue != n->admission.queue || o->admission.deadline_ms != n->admission.deadline_ms ||
        o->admission.aging_ms != n->admission.aging_ms)
        return "admission";
    if (str_differs(o->access_log, n->access_log))
        return "access_log";
    if (o->policy.enabled != n->policy.enabled)
        return "policy (added or removed)";
    if (o->cluster.enabled != n->cluster.enabled || str_differs(o->cluster.redis, n->cluster.redis) ||
        str_differs(o->cluster.name, n->cluster.name) ||
        o->cluster.sync_interval_ms != n->cluster.sync_interval_ms)
        return "cluster";
    bool limits = o->limits.enabled != n->limits.enabled || o->limits.ntenants != n->limits.ntenants ||
                  memcmp(&o->limits.dflt, &n->limits.dflt, sizeof(o->limits.dflt)) != 0;
    for (size_t i = 0; !limits && i < o->limits.ntenants; i++)
        limits = strcmp(o->limits.tenants[i], n->limits.tenants[i]) != 0 ||
                 memcmp(&o->limits.rules[i], &n->limits.rules[i], sizeof(o->limits.rules[i])) != 0;
    if (limits)
        return "limits";
    if (kv_events_differ(o, n))
        return "kv_events";
    /* The recorder is made once, at start, and lent to every worker: a change to record: is refused,
     * not accepted and ignored. */
    bool rec = o->record.enabled != n->record.enabled;
    if (!rec && o->record.enabled) {
        rec = str_differs(o->record.dir, n->record.dir) || str_differs(o->record.prefix, n->record.prefix) ||
              o->record.rotate_size != n->record.rotate_size ||
              o->record.rotate_interval_ms != n->record.rotate_interval_ms ||
              o->record.text != n->record.text || o->record.buffer != n->record.buffer ||
              o->record.sample != n->record.sample || o->record.nheaders != n->record.nheaders;
        for (size_t i = 0; !rec && i < o->record.nheaders; i++)
            rec = strcmp(o->record.headers[i], n->record.headers[i]) != 0;
    }
    if (rec)
        return o->record.enabled != n->record.enabled ? "record (added or removed)" : "record";
    return NULL;
}

/* Frees what the endpoint set changes left behind once no worker reaches it (proxy/table_swap.h): old
 * tables once no policy build reads them either, removed endpoints once their requests have finished. */
static void on_retire_tick(evutil_socket_t fd, short what, void *arg)
{
    struct atc_server *srv = arg;
    atc_table_swap_collect(srv->swap, atc_reloader_idle(srv->reloader));
}

/* An endpoint that left, once no worker reaches it: the pools of workers whose loop had stopped, its
 * health, itself. */
static void free_endpoint(void *ctx, struct atc_endpoint *ep)
{
    struct atc_server *srv = ctx;
    destroy_pools(ep->pools);
    atc_health_forget(srv->health, ep);
    atc_endpoint_free(ep);
}

static void reload_failed(struct atc_server *srv, struct atc_config *ncfg, worker_pools *fresh, size_t nfresh)
{
    for (size_t i = 0; i < nfresh; i++)
        destroy_pools(fresh[i]);
    free(fresh);
    atc_config_free(ncfg);
    srv->config_reloads_failed++;
}

/* Puts @p ncfg (owned) in force: with every worker parked, the table is rebuilt from @p ncfg (the servers
 * that stayed keep counters, connections, health; fresh[k] holds the pools of the config's k-th endpoint
 * when it is new), health restarts and each worker's policy is rebuilt against the new table. The
 * endpoints that left drain (retired to srv->swap). The caller frees the config it replaced. */
static void commit_config(struct atc_server *srv, struct atc_config *ncfg, worker_pools *fresh,
                          size_t *ngone_out)
{
    /* A policy build in progress reads the old table: it finishes first (and is then dropped). */
    if (srv->reloader != NULL)
        atc_reloader_wait(srv->reloader);
    atc_workers_pause(&srv->group);
    struct atc_endpoint **gone = NULL;
    size_t ngone = 0;
    struct atc_endpoint_table *t = atc_endpoint_table_rebuild(srv->table, ncfg, &gone, &ngone);
    srv->table = t;
    if (srv->cluster != NULL)
        atc_cluster_set_table(srv->cluster, t);
    for (size_t i = 0, k = 0; fresh != NULL && i < ncfg->nmodels; i++)
        for (size_t j = 0; j < ncfg->models[i].nendpoints; j++, k++)
            if (fresh[k][0] != NULL)
                memcpy(atc_endpoint_table_find(t, ncfg->models[i].endpoints[j].id)->pools, fresh[k],
                       sizeof(fresh[k]));

    const char *herr = NULL;
    struct atc_health *h = atc_health_create(srv->base, t, ncfg, srv->health, &herr);
    atc_health_destroy(srv->health);
    srv->health = h;
    if (h != NULL) {
        atc_health_on_capacity(h, on_more_capacity, srv);
    } else { /* should not happen with a valid config: route to everything rather than nothing */
        atc_error("config reload: health checks could not restart (%s); every endpoint is routable", herr);
        for (size_t i = 0; i < t->nendpoints; i++)
            t->endpoints[i]->routable = true;
    }
    if (srv->prefix != NULL)
        atc_prefix_index_clear(srv->prefix); /* the table was renumbered */
    srv->cfg = ncfg;
    for (unsigned i = 0; i < srv->group.nworkers; i++) {
        struct atc_worker *w = &srv->group.workers[i];
        w->table = t;
        w->cfg = ncfg;
        char *perr = NULL;
        if (w->policy != NULL && atc_policy_set_table(w->policy, t, &perr) == 0)
            atc_error("config reload: the policy did not reload on worker %u (%s); the C balancer routes "
                      "there until it does",
                      i, perr != NULL ? perr : "?");
        free(perr);
    }
    atc_table_swap_taken_by_all(srv->swap);
    for (size_t i = 0; i < ngone; i++)
        if (atc_table_swap_retire(srv->swap, gone[i]) < 0)
            atc_error("config reload: out of memory: endpoint %s is never freed", gone[i]->id);
    free(gone);
    atc_workers_resume(&srv->group);
    *ngone_out = ngone;
}

int atc_server_reload_config(struct atc_server *srv, char **errors)
{
    struct atc_config *ncfg = NULL;
    *errors = NULL;
    if (atc_config_load(srv->cfg->path, &ncfg, errors) < 0) {
        atc_error("config reload failed, nothing changed:\n%s", *errors != NULL ? *errors : "");
        srv->config_reloads_failed++;
        return -1;
    }
    if (atc_config_keep_joined(ncfg, srv->cfg) < 0) { /* what joined at run time stays (config_endpoint.h) */
        *errors = strdup("out of memory");
        reload_failed(srv, ncfg, NULL, 0);
        return -1;
    }
    const char *restart = restart_only_change(srv->cfg, ncfg);
    if (restart != NULL) {
        if (asprintf(errors,
                     "%s: '%s' changed, which takes a restart (atc reads it once, at start); nothing was "
                     "reloaded: restart atc, or undo that change and reload",
                     ncfg->path, restart) < 0)
            *errors = NULL;
        atc_error("config reload refused: %s", *errors != NULL ? *errors : restart);
        reload_failed(srv, ncfg, NULL, 0);
        return -1;
    }

    /* Pools for new servers first: an address that does not resolve fails the reload before anything
     * changed. fresh[k]: the pools of the config's k-th endpoint when it is new (else all NULL). */
    size_t total = 0, added = 0;
    for (size_t i = 0; i < ncfg->nmodels; i++)
        total += ncfg->models[i].nendpoints;
    worker_pools *fresh = calloc(total ? total : 1, sizeof(*fresh));
    if (fresh == NULL) {
        reload_failed(srv, ncfg, NULL, 0);
        *errors = strdup("out of memory");
        return -1;
    }
    for (size_t i = 0, k = 0; i < ncfg->nmodels; i++)
        for (size_t j = 0; j < ncfg->models[i].nendpoints; j++, k++) {
            const struct atc_endpoint_config *ec = &ncfg->models[i].endpoints[j];
            if (atc_endpoint_same_server(atc_endpoint_table_find(srv->table, ec->id), ec,
                                         ncfg->models[i].name))
                continue;
            const char *err = NULL;
            if (create_pools(srv, ec->host, ec->port, ncfg, fresh[k], &err) < 0) {
                if (asprintf(errors, "%s: endpoint %s (%s): %s", ncfg->path, ec->id, ec->url, err) < 0)
                    *errors = NULL;
                reload_failed(srv, ncfg, fresh, total);
                atc_error("config reload failed, nothing changed: %s", *errors != NULL ? *errors : "");
                return -1;
            }
            added++;
        }

    size_t ngone = 0, before = srv->table->nendpoints;
    struct atc_config *old = srv->cfg;
    bool watch = old->policy.watch;
    commit_config(srv, ncfg, fresh, &ngone);
    free(fresh);
    apply_watch(srv, watch, ncfg->policy.watch);
    atc_config_free(old);
    srv->config_reloads_ok++;
    struct atc_endpoint_table *t = srv->table;
    if (asprintf(errors, "%zu endpoint(s): %zu added, %zu removed (draining), %zu kept", t->nendpoints, added,
                 ngone, before - ngone) < 0)
        *errors = NULL;
    atc_info("config reloaded from %s: %s", ncfg->path, *errors != NULL ? *errors : "");
    atc_table_swap_collect(srv->swap, atc_reloader_idle(srv->reloader));
    if (srv->on_config_reloaded != NULL)
        srv->on_config_reloaded(srv);
    return 0;
}

/* The new table @p t (made from srv->table) to every worker without parking them (proxy/table_swap.h).
 * -1 when out of memory (then nothing changed: @p t is freed). */
static int publish_table(struct atc_server *srv, struct atc_endpoint_table *t)
{
    if (atc_table_swap_publish(srv->swap, srv->table, t) < 0) {
        atc_endpoint_table_free_shell(t);
        return -1;
    }
    srv->table = t;
    if (srv->cluster != NULL)
        atc_cluster_set_table(srv->cluster, t);
    return 0;
}

int atc_server_add_endpoint(struct atc_server *srv, struct atc_endpoint_config *ec, const char **why)
{
    *why = NULL;
    struct atc_model_config *m = atc_config_model(srv->cfg, ec->model);
    if (m == NULL) {
        *why = atc_server_no_model;
        return -1;
    }
    if (atc_endpoint_table_find(srv->table, ec->id) != NULL || atc_config_endpoint(srv->cfg, ec->id, NULL)) {
        *why = atc_server_duplicate;
        return -1;
    }
    /* Everything it needs made first (a failure changes nothing), then it joins: the config, health
     * (ep->health set before any worker sees it), the workers' tables. */
    struct atc_endpoint *ep = atc_endpoint_create(m->name, ec);
    const struct atc_endpoint_table *old = srv->table;
    struct atc_endpoint_table *t = ep != NULL ? atc_endpoint_table_with(old, ep, NULL) : NULL;
    if (t == NULL || create_pools(srv, ec->host, ec->port, srv->cfg, ep->pools, why) < 0 ||
        atc_config_append_endpoint(m, ec) < 0) {
        if (*why == NULL)
            *why = "out of memory";
        atc_endpoint_table_free_shell(t);
        if (ep != NULL)
            destroy_pools(ep->pools);
        if (ep != NULL)
            atc_endpoint_free(ep);
        return -1;
    }
    const char *herr = NULL;
    if (srv->health == NULL || atc_health_add(srv->health, ep, srv->cfg, &herr) < 0) {
        if (srv->health != NULL) /* should not happen: it routes, unchecked, rather than not at all */
            atc_error("endpoint %s: health checks could not start (%s); it is routable", ep->id, herr);
        atomic_store(&ep->routable, true);
    }
    if (publish_table(srv, t) < 0) {
        atc_health_remove(srv->health, ep, srv->cfg);
        atc_health_forget(srv->health, ep);
        atc_config_remove_endpoint(srv->cfg, ep->id);
        destroy_pools(ep->pools);
        atc_endpoint_free(ep);
        *why = "out of memory";
        return -1;
    }
    atc_info("endpoint %s (%s) added to model %s: it joins once its health checks pass", ep->id, ep->url,
             ep->model);
    return 0;
}

int atc_server_remove_endpoint(struct atc_server *srv, const char *id, const char **why)
{
    *why = NULL;
    if (atc_config_endpoint(srv->cfg, id, NULL) == NULL) {
        *why =
            atc_endpoint_table_find(srv->table, id) != NULL ? atc_server_simulated : atc_server_no_endpoint;
        return -1;
    }
    struct atc_endpoint *ep = atc_endpoint_table_find(srv->table, id);
    struct atc_endpoint_table *t = ep != NULL ? atc_endpoint_table_with(srv->table, NULL, ep) : NULL;
    if (ep != NULL && t == NULL) {
        *why = "out of memory";
        return -1;
    }
    atc_config_remove_endpoint(srv->cfg, id);
    /* Retired once published, not before: its wait for every worker to take a table without it counts
     * from this publish's generation (a worker still on the one before may yet acquire it). */
    if (ep != NULL) {
        atc_health_remove(srv->health, ep, srv->cfg); /* no longer routable from here on */
        if (publish_table(srv, t) < 0) /* the workers keep the table with it, unroutable, until a reload */
            atc_error("endpoint %s: out of memory: it stays in the table, unroutable", id);
        else if (atc_table_swap_retire(srv->swap, ep) < 0)
            atc_error("endpoint %s: out of memory: it is never freed", id);
    }
    atc_info("endpoint %s removed: it drains (%zu endpoint(s) draining)", id,
             atc_table_swap_retired(srv->swap));
    atc_table_swap_collect(srv->swap, atc_reloader_idle(srv->reloader));
    return 0;
}

const char atc_server_no_model[] = "no model with this name";
const char atc_server_duplicate[] = "an endpoint with this id exists";
const char atc_server_no_endpoint[] = "no endpoint with this id";
const char atc_server_simulated[] = "a simulated endpoint (simulate:) cannot be removed";

/* ---- start and stop ---- */

/* Worker @p w's policy runtime, when the config has a policy: section. */
static int start_policy(struct atc_server *srv, struct atc_worker *w, char **err)
{
    const struct atc_config *cfg = srv->cfg;
    if (!cfg->policy.enabled)
        return 0;
    struct atc_policy_settings ps = {
        .entry = cfg->policy.entry,
        .path = (const char *const *)cfg->policy.path,
        .npath = cfg->policy.npath,
        .stdlib_dir = atc_policy_stdlib_dir(),
        .budget_us = cfg->policy.budget_us,
        .memory = cfg->policy.memory,
        .jit = cfg->policy.jit,
        .rollback_after = cfg->policy.rollback_after,
        .group = srv->group.nworkers > 1 ? &srv->policy_group : NULL,
        .shadow_affinity = srv->shadow_affinity,
        .quiet = w != main_worker(srv), /* worker 0 says it once for all */
    };
    char *msg = NULL;
    w->policy = atc_policy_runtime_create(&ps, srv->table, srv->affinity, srv->prefix, &msg);
    if (w->policy == NULL) {
        fail(err, "policy: %s", msg != NULL ? msg : "cannot load");
        free(msg);
        return -1;
    }
    /* One watch, on the main thread, reloads every worker's runtime. */
    if (w->id == 0 && cfg->policy.watch &&
        atc_policy_watch(w->policy, srv->base, on_policy_files_changed, srv) < 0)
        atc_warn("cannot watch the policy's files; reload with SIGHUP or POST /admin/policy/reload");
    return 0;
}

/* Everything of worker @p w but its thread: loop, policy, admission queue, access log, listener. */
static int start_worker(struct atc_server *srv, struct atc_worker *w, const char *log_path,
                        evutil_socket_t listen_fd, char **err)
{
    const struct atc_config *cfg = srv->cfg;
    w->cfg = srv->cfg;
    w->table = srv->table;
    w->metrics = srv->metrics;
    w->recorder = srv->recorder;
    w->limits = srv->limits;
    w->kv = srv->kv;
    if (start_policy(srv, w, err) < 0)
        return -1;
    if (cfg->admission.queue > 0) {
        struct atc_admission_settings as = {
            .max_queue = cfg->admission.queue,
            .shared = srv->admission_shared, /* queue: N is the process's limit, not each worker's */
            .deadline_ms = cfg->admission.deadline_ms,
            .max_deadline_ms = cfg->admission.max_deadline_ms,
            .aging_ms = cfg->admission.aging_ms,
            .tenants = (const char *const *)cfg->admission.tenant_weights.names,
            .weights = cfg->admission.tenant_weights.weights,
            .ntenants = cfg->admission.tenant_weights.n,
        };
        if ((w->admission = atc_admission_create(w->base, &as, &atc_relay_admission)) == NULL) {
            evutil_closesocket(listen_fd);
            return fail(err, "out of memory");
        }
    }
    if (log_path != NULL && (w->access_log = atc_access_log_open(w->base, log_path)) == NULL) {
        fail(err, "access_log %s: %s", cfg->access_log, strerror(errno));
        evutil_closesocket(listen_fd);
        return -1;
    }
    uint64_t hard = (uint64_t)cfg->max_body * HARD_BODY_FACTOR;
    const struct atc_http_server_config http_cfg = {
        .max_head = 64 * 1024,
        .max_body = hard < (1ull << 40) ? hard : (1ull << 40),
        .timeout_ms = cfg->client_timeout_ms,
        .methods = ATC_HTTP_GET | ATC_HTTP_POST | ATC_HTTP_HEAD,
        .on_refused = atc_http_front_refused,
        /* each worker has its own listener (SO_REUSEPORT): the process's cap, shared out */
        .max_connections =
            cfg->max_connections / srv->group.nworkers > 0 ? cfg->max_connections / srv->group.nworkers : 1,
    };
    if ((w->front = atc_http_server_create(w->base, &http_cfg, atc_http_front_handle, w)) == NULL) {
        evutil_closesocket(listen_fd);
        return fail(err, "out of memory");
    }
    return atc_http_server_listen(w->front, listen_fd) == 0 ? 0 : fail(err, "out of memory");
}

/* The front port, checked free without SO_REUSEPORT first: another process listening there with it
 * would otherwise share our port silently. Port 0 picks a free one. Returns it, or 0. */
static uint16_t claim_front_port(const struct atc_config *cfg)
{
    evutil_socket_t probe = listen_socket(cfg->listen_host, cfg->listen_port, false);
    if (probe < 0)
        return 0;
    uint16_t port = bound_port(probe);
    evutil_closesocket(probe);
    return port;
}

static void free_worker(struct atc_worker *w)
{
    atc_http_server_destroy(w->front);
    atc_admission_destroy(w->admission);
    atc_access_log_close(w->access_log);
    atc_policy_runtime_destroy(w->policy);
}

/* The cluster's queue (pins, lease refills) waits: send it from the main thread's loop. */
static void cluster_flush(void *arg)
{
    struct atc_server *srv = arg;
    if (srv->cluster != NULL) /* (gone once the server is being destroyed) */
        atc_cluster_flush(srv->cluster);
}

static void cluster_wake(void *ctx)
{
    struct atc_server *srv = ctx;
    atc_worker_post(main_worker(srv), cluster_flush, srv);
}

struct atc_server *atc_server_create(struct event_base *base, struct atc_config *cfg,
                                     void (*admin_handle)(struct atc_http_req *req, void *srv), char **err)
{
    const char *why = NULL; /* the static reason of a step that failed */
    char *kverr = NULL;
    *err = NULL;
    struct atc_server *srv = calloc(1, sizeof(*srv));
    if (srv == NULL) {
        atc_config_free(cfg);
        fail(err, "out of memory");
        return NULL;
    }
    srv->base = base;
    srv->started_ms = atc_mono_ms();
    srv->main_thread = pthread_self();
    atc_worker_group_init(&srv->group);
    srv->group.hooks = (struct atc_worker_hooks){
        .ctx = srv,
        .request_started = on_request_started,
        .request_finished = on_request_finished,
        .observe = on_observe,
        .key_refused = on_key_refused,
        .capacity_freed = on_capacity_freed,
        .queue_changed = on_queue_changed,
    };
    srv->cfg = cfg;
    srv->rng = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    if ((srv->group.workers = calloc(cfg->workers, sizeof(*srv->group.workers))) == NULL) {
        fail(err, "out of memory");
        goto error;
    }
    for (unsigned i = 0; i < cfg->workers; i++, srv->group.nworkers++) {
        struct event_base *b = i == 0 ? base : atc_event_base_new();
        srv->group.workers[i].wake_fd = -1;
        if (b == NULL || atc_worker_init(&srv->group.workers[i], &srv->group, i, b, srv->rng) < 0) {
            if (b != NULL && b != base)
                event_base_free(b);
            fail(err, "cannot create a worker's event loop");
            goto error;
        }
    }
    if ((srv->swap = atc_table_swap_create(&srv->group, free_endpoint, srv)) == NULL ||
        (srv->table = atc_endpoint_table_create(cfg)) == NULL) {
        fail(err, "out of memory");
        goto error;
    }
    if (atc_sim_fleet_start(&srv->sims, srv->base, srv->cfg, srv->table, &why) < 0) {
        fail(err, "%s", why);
        goto error;
    }
    for (size_t i = 0; i < srv->table->nendpoints; i++) {
        struct atc_endpoint *ep = srv->table->endpoints[i];
        if (create_pools(srv, ep->host, ep->port, cfg, ep->pools, &why) < 0) {
            fail(err, "endpoint %s (%s): %s", ep->id, ep->url, why);
            goto error;
        }
    }
    if ((srv->health = atc_health_create(base, srv->table, cfg, NULL, &why)) == NULL) {
        fail(err, "%s", why);
        goto error;
    }
    atc_health_on_capacity(srv->health, on_more_capacity, srv);
    if ((srv->metrics = atc_metrics_create()) == NULL ||
        (srv->admission_shared = atc_admission_shared_create()) == NULL) {
        fail(err, "out of memory");
        goto error;
    }
    if (cfg->policy.enabled && ((srv->affinity = atc_affinity_create(0)) == NULL ||
                                (srv->shadow_affinity = atc_affinity_create(0)) == NULL ||
                                (srv->prefix = atc_prefix_index_create(0)) == NULL)) {
        fail(err, "out of memory");
        goto error;
    }
    if (cfg->limits.enabled && (srv->limits = atc_limits_create(cfg)) == NULL) {
        fail(err, "out of memory");
        goto error;
    }
    if (cfg->cluster.enabled) {
        struct atc_cluster_settings cs = {.host = cfg->cluster.host,
                                          .port = cfg->cluster.port,
                                          .db = cfg->cluster.db,
                                          .name = cfg->cluster.name,
                                          .sync_interval_ms = cfg->cluster.sync_interval_ms};
        if ((srv->cluster = atc_cluster_create(base, &cs, srv->table, srv->affinity, srv->limits,
                                               cluster_wake, srv, &why)) == NULL) {
            fail(err, "%s", why);
            goto error;
        }
    }
    if ((srv->kv = atc_kv_events_create(base, cfg, &kverr)) == NULL && kverr != NULL) {
        fail(err, "%s", kverr);
        free(kverr);
        goto error;
    }
    if (cfg->record.enabled) { /* trace recording: see recorder.h */
        struct atc_recorder_settings rs = {
            .dir = cfg->record.dir,
            .prefix = cfg->record.prefix,
            .rotate_size = cfg->record.rotate_size,
            .rotate_interval_ms = cfg->record.rotate_interval_ms,
            .text = cfg->record.text,
            .buffer = cfg->record.buffer,
            .sample = cfg->record.sample,
            .headers = (const char *const *)cfg->record.headers,
            .nheaders = cfg->record.nheaders,
        };
        if ((srv->recorder = atc_recorder_create(&rs)) == NULL) {
            fail(err, "cannot start the trace recorder");
            goto error;
        }
    }
    char log_path[4096];
    if (cfg->access_log != NULL) /* "stderr", or a file relative to the config's directory */
        snprintf(log_path, sizeof(log_path), "%s%s%s",
                 cfg->access_log[0] == '/' || strcmp(cfg->access_log, "stderr") == 0 ? "" : cfg->dir,
                 cfg->access_log[0] == '/' || strcmp(cfg->access_log, "stderr") == 0 ? "" : "/",
                 cfg->access_log);
    if ((srv->front_port = claim_front_port(cfg)) == 0) {
        cannot_listen(err, cfg->listen_host, cfg->listen_port);
        goto error;
    }
    for (unsigned i = 0; i < srv->group.nworkers; i++) {
        evutil_socket_t fd = listen_socket(cfg->listen_host, srv->front_port, srv->group.nworkers > 1);
        if (fd < 0) {
            cannot_listen(err, cfg->listen_host, srv->front_port);
            goto error;
        }
        if (start_worker(srv, &srv->group.workers[i], cfg->access_log != NULL ? log_path : NULL, fd, err) < 0)
            goto error;
    }
    evutil_socket_t admin_fd = listen_socket(cfg->admin_host, cfg->admin_port, false);
    if (admin_fd < 0) {
        cannot_listen(err, cfg->admin_host, cfg->admin_port);
        goto error;
    }
    srv->admin_port = bound_port(admin_fd);
    const struct atc_http_server_config admin_cfg = {
        .max_body = cfg->max_body,
        .timeout_ms = cfg->client_timeout_ms,
        .methods = ATC_HTTP_GET | ATC_HTTP_POST | ATC_HTTP_DELETE | ATC_HTTP_HEAD,
        .max_connections = ADMIN_MAX_CONNECTIONS,
    };
    if ((srv->admin = atc_http_server_create(base, &admin_cfg, admin_handle, srv)) == NULL ||
        atc_http_server_listen(srv->admin, admin_fd) < 0) {
        if (srv->admin == NULL)
            evutil_closesocket(admin_fd);
        fail(err, "admin port: out of memory");
        goto error;
    }
    signal(SIGPIPE, SIG_IGN);
    srv->sig_term = evsignal_new(base, SIGTERM, on_signal, srv);
    srv->sig_int = evsignal_new(base, SIGINT, on_signal, srv);
    srv->sig_hup = evsignal_new(base, SIGHUP, on_sighup, srv);
    srv->retire_timer = event_new(base, -1, EV_PERSIST, on_retire_tick, srv);
    struct timeval second = {1, 0};
    event_add(srv->retire_timer, &second);
    srv->sig_usr1 = evsignal_new(base, SIGUSR1, on_sigusr1, srv);
    event_add(srv->sig_usr1, NULL);
    event_add(srv->sig_term, NULL);
    event_add(srv->sig_int, NULL);
    event_add(srv->sig_hup, NULL);
    atc_info("atc %s: %zu model(s), %zu endpoint(s); %u worker(s) listening on %s:%u, admin on %s:%u",
             ATC_VERSION, srv->table->nmodels, srv->table->nendpoints, srv->group.nworkers, cfg->listen_host,
             (unsigned)srv->front_port, cfg->admin_host, (unsigned)srv->admin_port);
    /* Threads last, once the log has read its settings: signals are handled by the main thread's loop
     * (libevent's signal pipe), and a thread started now inherits a mask without them. */
    sigset_t handled, old;
    sigemptyset(&handled);
    sigaddset(&handled, SIGTERM);
    sigaddset(&handled, SIGINT);
    sigaddset(&handled, SIGHUP);
    sigaddset(&handled, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &handled, &old);
    for (unsigned i = 1; i < srv->group.nworkers; i++)
        if (atc_worker_start(&srv->group.workers[i]) < 0) {
            pthread_sigmask(SIG_SETMASK, &old, NULL);
            fail(err, "cannot start a worker thread");
            goto error;
        }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return srv;
error:
    atc_server_destroy(srv);
    return NULL;
}

void atc_server_when_ready(struct atc_server *srv, void (*cb)(void *arg), void *arg)
{
    atc_health_on_first_round(srv->health, cb, arg);
}

int atc_server_write_ready_file(const struct atc_server *srv, const char *path)
{
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (f == NULL)
        return -1;
    fprintf(f, "{\"listen\": \"%s:%u\", \"admin\": \"%s:%u\", \"pid\": %d, \"workers\": %u}\n",
            srv->cfg->listen_host, (unsigned)srv->front_port, srv->cfg->admin_host, (unsigned)srv->admin_port,
            (int)getpid(), srv->group.nworkers);
    if (fclose(f) != 0)
        return -1;
    return rename(tmp, path);
}

void atc_server_destroy(struct atc_server *srv)
{
    if (srv == NULL)
        return;
    for (unsigned i = 1; i < srv->group.nworkers; i++) /* threads first: nothing runs on their loops after */
        atc_worker_join(&srv->group.workers[i]);
    atc_reloader_destroy(srv->reloader); /* after them: a swap left in a mailbox runs as a loop ends */
    if (srv->sig_term != NULL)
        event_free(srv->sig_term);
    if (srv->sig_int != NULL)
        event_free(srv->sig_int);
    if (srv->sig_hup != NULL)
        event_free(srv->sig_hup);
    if (srv->retire_timer != NULL)
        event_free(srv->retire_timer);
    if (srv->sig_usr1 != NULL)
        event_free(srv->sig_usr1);
    if (srv->drain_timer != NULL)
        event_free(srv->drain_timer);
    for (unsigned i = 0; i < srv->group.nworkers; i++)
        free_worker(&srv->group.workers[i]);
    atc_http_server_destroy(srv->admin);
    atc_recorder_destroy(srv->recorder); /* writes what is still buffered */
    atc_cluster_destroy(srv->cluster);   /* before the tables it writes to */
    srv->cluster = NULL;
    atc_kv_events_destroy(srv->kv); /* after the workers, which may read its index */
    atc_limits_destroy(srv->limits);
    atc_metrics_destroy(srv->metrics);
    atc_admission_shared_destroy(srv->admission_shared); /* after the workers' admissions */
    atc_affinity_destroy(srv->affinity);
    atc_affinity_destroy(srv->shadow_affinity);
    if (srv->canary_timer != NULL)
        event_free(srv->canary_timer);
    atc_prefix_index_destroy(srv->prefix);
    atc_health_destroy(srv->health); /* its probes use the table's endpoints */
    srv->health = NULL;
    if (srv->table != NULL) {
        for (size_t i = 0; i < srv->table->nendpoints; i++)
            destroy_pools(srv->table->endpoints[i]->pools);
        atc_endpoint_table_destroy(srv->table);
    }
    atc_table_swap_destroy(srv->swap); /* old tables, endpoints removed and not freed yet */
    atc_sim_fleet_stop(&srv->sims);
    for (unsigned i = 0; i < srv->group.nworkers; i++) {
        struct atc_worker *w = &srv->group.workers[i];
        atc_worker_free(w);
        if (i > 0)
            event_base_free(w->base);
    }
    free(srv->group.workers);
    atc_worker_group_dispose(&srv->group);
    atc_config_free(srv->cfg);
    free(srv);
}
