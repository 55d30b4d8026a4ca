#include "server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>

#include "access_log.h"
#include "admin.h"
#include "admission.h"
#include "affinity.h"
#include "client_deadline.h"
#include "config.h"
#include "endpoint.h"
#include "health.h"
#include "http_front.h"
#include "log.h"
#include "metrics.h"
#include "policy.h"
#include "recorder.h"
#include "relay.h"
#include "sim_server.h"
#include "upstream.h"

/* Bodies between max_body and this get a proper OpenAI-style 413 from atc; beyond it evhttp stops
 * reading at once (a bare 413 and a closed connection), so a hostile upload cannot fill memory. */
#define HARD_BODY_FACTOR 4

static void stop_sims(struct atc_server *srv)
{
    for (size_t i = 0; i < srv->nsims; i++)
        atc_sim_server_stop(srv->sims[i]);
    free(srv->sims);
    srv->sims = NULL;
    srv->nsims = 0;
}

/* Starts the simulated servers of simulate: on free loopback ports and adds each as an endpoint. */
static void on_more_capacity(void *arg);

static int start_sims(struct atc_server *srv, const char **err)
{
    size_t total = 0;
    for (size_t i = 0; i < srv->cfg->nsimulate; i++)
        total += srv->cfg->simulate[i].count;
    if (total == 0)
        return 0;
    if ((srv->sims = calloc(total, sizeof(*srv->sims))) == NULL) {
        *err = "out of memory";
        return -1;
    }
    for (size_t i = 0; i < srv->cfg->nsimulate; i++) {
        const struct atc_simulate_config *sc = &srv->cfg->simulate[i];
        for (unsigned k = 0; k < sc->count; k++) {
            struct atc_sim_params p = sc->params;
            p.seed = sc->params.seed + srv->nsims; /* each server draws differently, reproducibly */
            struct atc_sim_server *sim = atc_sim_server_start(srv->base, &p, "127.0.0.1", 0, err);
            if (sim == NULL)
                return -1;
            srv->sims[srv->nsims++] = sim;
            char id[300];
            struct atc_model *m = atc_endpoint_table_model(srv->table, p.model, strlen(p.model));
            snprintf(id, sizeof(id), "%s-sim-%zu", p.model, m != NULL ? m->nendpoints + 1 : 1);
            uint16_t port = atc_sim_server_port(sim);
            struct atc_endpoint *sep = atc_endpoint_table_add(srv->table, p.model, id, "127.0.0.1", port,
                                                              sc->capacity ? sc->capacity : p.max_seqs);
            if (sep == NULL) {
                *err = "cannot add a simulated endpoint";
                return -1;
            }
            sep->simulated = true;
            atc_info("simulated %s server %s on 127.0.0.1:%u", p.model, id, (unsigned)port);
        }
    }
    return 0;
}

static uint16_t bound_port(struct evhttp_bound_socket *bound)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    if (getsockname(evhttp_bound_socket_get_fd(bound), (struct sockaddr *)&ss, &len) < 0)
        return 0;
    if (ss.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    return ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

/* A listening socket with the kernel's largest accept queue: evhttp's own listens with 128, and a burst
 * of thousands of clients (streams opening at once) overflows that, so some wait seconds to retry. */
static evutil_socket_t listen_socket(const char *host, uint16_t port)
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
        bind(fd, res->ai_addr, res->ai_addrlen) < 0 || listen(fd, SOMAXCONN) < 0) {
        if (fd >= 0)
            evutil_closesocket(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd;
}

static struct evhttp *http_listen(struct atc_server *srv, const char *host, uint16_t port,
                                  void (*handler)(struct evhttp_request *, void *), uint16_t *bound,
                                  struct evhttp_bound_socket **listener,
                                  struct atc_client_deadline **deadline, const char **err)
{
    struct evhttp *http = evhttp_new(srv->base);
    /* client_timeout bounds each request as a whole, not only the silence between two reads */
    if (http == NULL || (*deadline = atc_client_deadline_attach(http, srv->base, srv->cfg->client_timeout_ms,
                                                                handler, srv)) == NULL) {
        if (http != NULL)
            evhttp_free(http);
        *err = "out of memory";
        return NULL;
    }
    evhttp_set_allowed_methods(http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD);
    evhttp_set_max_headers_size(http, 64 * 1024);
    uint64_t hard = (uint64_t)srv->cfg->max_body * HARD_BODY_FACTOR;
    evhttp_set_max_body_size(http, (ev_ssize_t)(hard < (1ull << 40) ? hard : (1ull << 40)));
    struct timeval tv = {.tv_sec = (time_t)(srv->cfg->client_timeout_ms / 1000),
                         .tv_usec = (suseconds_t)(srv->cfg->client_timeout_ms % 1000) * 1000};
    evhttp_set_timeout_tv(http, &tv);
    evutil_socket_t fd = listen_socket(host, port);
    struct evhttp_bound_socket *b = fd >= 0 ? evhttp_accept_socket_with_handle(http, fd) : NULL;
    if (b == NULL) {
        if (fd >= 0)
            evutil_closesocket(fd);
        static char msg[300];
        snprintf(msg, sizeof(msg), "cannot listen on %s:%u: address in use or not available", host,
                 (unsigned)port);
        *err = msg;
        evhttp_free(http);
        return NULL;
    }
    *bound = bound_port(b);
    if (listener != NULL)
        *listener = b;
    return http;
}

static void on_sigusr1(evutil_socket_t sig, short what, void *arg)
{
    struct atc_server *srv = arg;
    if (srv->access_log != NULL)
        atc_access_log_reopen(srv->access_log);
}

static void on_drain_timeout(evutil_socket_t fd, short what, void *arg)
{
    struct atc_server *srv = arg;
    atc_warn("drain timeout: exiting with %u request(s) still in flight", srv->active);
    event_base_loopexit(srv->base, NULL);
}

static void on_sighup(evutil_socket_t sig, short what, void *arg)
{
    struct atc_server *srv = arg;
    char *msg = NULL;
    atc_info("SIGHUP: reloading the config%s", srv->policy != NULL ? " and the policy" : "");
    atc_server_reload_config(srv, &msg); /* it reloads the policy too */
    free(msg);
}

static bool str_differs(const char *a, const char *b)
{
    return (a == NULL) != (b == NULL) || (a != NULL && strcmp(a, b) != 0);
}

/* Settings read once at start: say so when a reload changes them. */
static void warn_restart_only(const struct atc_config *o, const struct atc_config *n)
{
    const char *what = NULL;
    if (str_differs(o->listen_host, n->listen_host) || o->listen_port != n->listen_port)
        what = "listen";
    else if (str_differs(o->admin_host, n->admin_host) || o->admin_port != n->admin_port)
        what = "admin";
    else if (o->nsimulate != n->nsimulate)
        what = "simulate";
    else if (o->admission.queue != n->admission.queue ||
             o->admission.deadline_ms != n->admission.deadline_ms ||
             o->admission.aging_ms != n->admission.aging_ms)
        what = "admission";
    else if (str_differs(o->access_log, n->access_log))
        what = "access_log";
    else if (o->policy.enabled != n->policy.enabled)
        what = "policy (added or removed)";
    if (what != NULL)
        atc_warn("config reload: the change to '%s' takes effect at the next restart", what);
}

static bool same_server(const struct atc_endpoint *ep, const struct atc_endpoint_config *ec,
                        const char *model)
{
    return ep != NULL && !ep->simulated && ep->port == ec->port && strcmp(ep->host, ec->host) == 0 &&
           strcmp(ep->model, model) == 0;
}

static void free_retired(struct atc_server *srv, bool all)
{
    size_t kept = 0;
    for (size_t i = 0; i < srv->nretired; i++) {
        struct atc_endpoint *ep = srv->retired[i];
        if (all || ep->inflight == 0) {
            atc_upstream_pool_destroy(ep->pool);
            atc_endpoint_free(ep);
        } else {
            srv->retired[kept++] = ep;
        }
    }
    srv->nretired = kept;
}

static void on_retire_tick(evutil_socket_t fd, short what, void *arg)
{
    free_retired(arg, false);
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
    warn_restart_only(srv->cfg, ncfg);

    /* Pools for new servers first: an address that does not resolve fails the reload before anything
     * changed. */
    struct atc_upstream_settings us = {
        .connect_timeout_ms = ncfg->upstream.connect_timeout_ms,
        .first_byte_timeout_ms = ncfg->upstream.first_byte_timeout_ms,
        .idle_timeout_ms = ncfg->upstream.idle_timeout_ms,
        .keepalive = ncfg->upstream.keepalive,
    };
    size_t total = 0, added = 0;
    for (size_t i = 0; i < ncfg->nmodels; i++)
        total += ncfg->models[i].nendpoints;
    struct atc_upstream_pool **pools = calloc(total ? total : 1, sizeof(*pools));
    if (pools == NULL) {
        atc_config_free(ncfg);
        *errors = strdup("out of memory");
        return -1;
    }
    for (size_t i = 0, k = 0; i < ncfg->nmodels; i++)
        for (size_t j = 0; j < ncfg->models[i].nendpoints; j++, k++) {
            const struct atc_endpoint_config *ec = &ncfg->models[i].endpoints[j];
            if (same_server(atc_endpoint_table_find(srv->table, ec->id), ec, ncfg->models[i].name))
                continue;
            const char *err = NULL;
            if ((pools[k] = atc_upstream_pool_create(srv->base, ec->host, ec->port, &us, &err)) == NULL) {
                if (asprintf(errors, "%s: endpoint %s (%s): %s", ncfg->path, ec->id, ec->url, err) < 0)
                    *errors = NULL;
                for (size_t p = 0; p < total; p++)
                    atc_upstream_pool_destroy(pools[p]);
                free(pools);
                atc_config_free(ncfg);
                srv->config_reloads_failed++;
                atc_error("config reload failed, nothing changed: %s", *errors != NULL ? *errors : "");
                return -1;
            }
            added++;
        }

    /* Commit: the new table keeps the servers that stayed (counters, connections, health). */
    struct atc_endpoint **gone = NULL;
    size_t ngone = 0, before = srv->table->nendpoints;
    struct atc_endpoint_table *t = atc_endpoint_table_rebuild(srv->table, ncfg, &gone, &ngone);
    srv->table = t;
    for (size_t i = 0, k = 0; i < ncfg->nmodels; i++)
        for (size_t j = 0; j < ncfg->models[i].nendpoints; j++, k++)
            if (pools[k] != NULL)
                atc_endpoint_table_find(t, ncfg->models[i].endpoints[j].id)->pool = pools[k];
    free(pools);
    struct atc_endpoint **r = realloc(srv->retired, (srv->nretired + ngone + 1) * sizeof(*r));
    if (r != NULL) {
        srv->retired = r;
        for (size_t i = 0; i < ngone; i++)
            r[srv->nretired++] = gone[i];
    }
    free(gone);

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
        atc_prefix_index_clear(srv->prefix); /* it knows endpoints by their place in the table */
    if (srv->policy != NULL) {
        char *perr = NULL;
        if (atc_policy_set_table(srv->policy, t, &perr) == 0)
            atc_error("config reload: the policy did not reload (%s); the C balancer routes until it does",
                      perr != NULL ? perr : "?");
        free(perr);
    }
    struct atc_config *old = srv->cfg;
    srv->cfg = ncfg;
    atc_config_free(old);
    srv->config_reloads_ok++;
    if (asprintf(errors, "%zu endpoint(s): %zu added, %zu removed (draining), %zu kept", t->nendpoints, added,
                 ngone, before - ngone) < 0)
        *errors = NULL;
    atc_info("config reloaded from %s: %s", ncfg->path, *errors != NULL ? *errors : "");
    free_retired(srv, false);
    return 0;
}

/* An endpoint came back (or offers more room): requests waiting in the admission queue may fit now. */
static void on_more_capacity(void *arg)
{
    struct atc_server *srv = arg;
    if (srv->admission != NULL)
        atc_admission_kick(srv->admission);
}

/* The engine-owned tables and the policy runtime, when the config has a policy: section. */
static int start_policy(struct atc_server *srv, const char **err)
{
    const struct atc_config *cfg = srv->cfg;
    if (!cfg->policy.enabled)
        return 0;
    srv->affinity = atc_affinity_create(0);
    srv->prefix = atc_prefix_index_create(0);
    if (srv->affinity == NULL || srv->prefix == NULL) {
        *err = "out of memory";
        return -1;
    }
    struct atc_policy_settings ps = {
        .entry = cfg->policy.entry,
        .path = (const char *const *)cfg->policy.path,
        .npath = cfg->policy.npath,
        .stdlib_dir = atc_policy_stdlib_dir(),
        .budget_us = cfg->policy.budget_us,
        .memory = cfg->policy.memory,
        .jit = cfg->policy.jit,
        .rollback_after = cfg->policy.rollback_after,
    };
    char *msg = NULL;
    srv->policy = atc_policy_runtime_create(&ps, srv->table, srv->affinity, srv->prefix, &msg);
    if (srv->policy == NULL) {
        static char buf[1024];
        snprintf(buf, sizeof(buf), "policy: %s", msg != NULL ? msg : "cannot load");
        free(msg);
        *err = buf;
        return -1;
    }
    if (cfg->policy.watch && atc_policy_watch(srv->policy, srv->base) < 0)
        atc_warn("cannot watch the policy's files; reload with SIGHUP or POST /admin/policy/reload");
    return 0;
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    struct atc_server *srv = arg;
    if (srv->draining) {
        atc_warn("second signal: exiting now");
        event_base_loopexit(srv->base, NULL);
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
    /* Stop accepting; connections already open get 503 + Connection: close for new requests. */
    if (srv->front_listener != NULL) {
        evhttp_del_accept_socket(srv->front, srv->front_listener);
        srv->front_listener = NULL;
    }
    if (srv->active == 0) {
        event_base_loopexit(srv->base, NULL);
        return;
    }
    struct timeval tv = {.tv_sec = (time_t)(srv->cfg->drain_timeout_ms / 1000),
                         .tv_usec = (suseconds_t)(srv->cfg->drain_timeout_ms % 1000) * 1000};
    srv->drain_timer = evtimer_new(srv->base, on_drain_timeout, srv);
    event_add(srv->drain_timer, &tv);
}

void atc_server_request_started(struct atc_server *srv)
{
    srv->active++;
}

void atc_server_request_finished(struct atc_server *srv)
{
    srv->active--;
    if (srv->draining && srv->active == 0)
        event_base_loopexit(srv->base, NULL);
}

struct atc_server *atc_server_create(struct event_base *base, struct atc_config *cfg, const char **err)
{
    struct atc_server *srv = calloc(1, sizeof(*srv));
    if (srv == NULL) {
        atc_config_free(cfg);
        *err = "out of memory";
        return NULL;
    }
    srv->base = base;
    srv->cfg = cfg;
    srv->rng = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    if ((srv->table = atc_endpoint_table_create(cfg)) == NULL) {
        *err = "out of memory";
        goto error;
    }
    if (start_sims(srv, err) < 0)
        goto error;
    struct atc_upstream_settings us = {
        .connect_timeout_ms = cfg->upstream.connect_timeout_ms,
        .first_byte_timeout_ms = cfg->upstream.first_byte_timeout_ms,
        .idle_timeout_ms = cfg->upstream.idle_timeout_ms,
        .keepalive = cfg->upstream.keepalive,
    };
    for (size_t i = 0; i < srv->table->nendpoints; i++) {
        struct atc_endpoint *ep = srv->table->endpoints[i];
        if ((ep->pool = atc_upstream_pool_create(base, ep->host, ep->port, &us, err)) == NULL) {
            static char msg[400];
            snprintf(msg, sizeof(msg), "endpoint %s (%s): %s", ep->id, ep->url, *err);
            *err = msg;
            goto error;
        }
    }
    if ((srv->health = atc_health_create(base, srv->table, cfg, NULL, err)) == NULL)
        goto error;
    atc_health_on_capacity(srv->health, on_more_capacity, srv);
    if ((srv->metrics = atc_metrics_create()) == NULL) {
        *err = "out of memory";
        goto error;
    }
    char log_path[4096];
    if (cfg->access_log != NULL) /* "stderr", or a file relative to the config's directory */
        snprintf(log_path, sizeof(log_path), "%s%s%s",
                 cfg->access_log[0] == '/' || strcmp(cfg->access_log, "stderr") == 0 ? "" : cfg->dir,
                 cfg->access_log[0] == '/' || strcmp(cfg->access_log, "stderr") == 0 ? "" : "/",
                 cfg->access_log);
    if (cfg->access_log != NULL && (srv->access_log = atc_access_log_open(base, log_path)) == NULL) {
        static char msg[600];
        snprintf(msg, sizeof(msg), "access_log %s: %s", cfg->access_log, strerror(errno));
        *err = msg;
        goto error;
    }
    if (start_policy(srv, err) < 0)
        goto error;
    if (cfg->record.enabled) { /* trace recording: see recorder.h */
        struct atc_recorder_settings rs = {
            .dir = cfg->record.dir,
            .prefix = cfg->record.prefix,
            .rotate_size = cfg->record.rotate_size,
            .rotate_interval_ms = cfg->record.rotate_interval_ms,
            .text = cfg->record.text,
            .buffer = cfg->record.buffer,
            .sample = cfg->record.sample,
        };
        if ((srv->recorder = atc_recorder_create(&rs)) == NULL) {
            *err = "cannot start the trace recorder";
            goto error;
        }
    }
    if (cfg->admission.queue > 0) {
        struct atc_admission_settings as = {
            .max_queue = cfg->admission.queue,
            .deadline_ms = cfg->admission.deadline_ms,
            .max_deadline_ms = cfg->admission.max_deadline_ms,
            .aging_ms = cfg->admission.aging_ms,
            .tenants = (const char *const *)cfg->admission.tenant_weights.names,
            .weights = cfg->admission.tenant_weights.weights,
            .ntenants = cfg->admission.tenant_weights.n,
        };
        if ((srv->admission = atc_admission_create(base, &as, &atc_relay_admission)) == NULL) {
            *err = "out of memory";
            goto error;
        }
    }
    if ((srv->front = http_listen(srv, cfg->listen_host, cfg->listen_port, atc_http_front_handle,
                                  &srv->front_port, &srv->front_listener, &srv->front_deadline, err)) == NULL)
        goto error;
    if ((srv->admin = http_listen(srv, cfg->admin_host, cfg->admin_port, atc_admin_handle, &srv->admin_port,
                                  NULL, &srv->admin_deadline, err)) == NULL)
        goto error;
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
    atc_info("atc %s: %zu model(s), %zu endpoint(s); listening on %s:%u, admin on %s:%u", ATC_VERSION,
             srv->table->nmodels, srv->table->nendpoints, cfg->listen_host, (unsigned)srv->front_port,
             cfg->admin_host, (unsigned)srv->admin_port);
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
    fprintf(f, "{\"listen\": \"%s:%u\", \"admin\": \"%s:%u\", \"pid\": %d}\n", srv->cfg->listen_host,
            (unsigned)srv->front_port, srv->cfg->admin_host, (unsigned)srv->admin_port, (int)getpid());
    if (fclose(f) != 0)
        return -1;
    return rename(tmp, path);
}

void atc_server_destroy(struct atc_server *srv)
{
    if (srv == NULL)
        return;
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
    if (srv->front != NULL)
        evhttp_free(srv->front);
    if (srv->admin != NULL)
        evhttp_free(srv->admin);
    atc_client_deadline_destroy(srv->front_deadline); /* after evhttp_free: its connections are gone */
    atc_client_deadline_destroy(srv->admin_deadline);
    atc_recorder_destroy(srv->recorder); /* writes what is still buffered */
    atc_admission_destroy(srv->admission);
    atc_access_log_close(srv->access_log);
    atc_metrics_destroy(srv->metrics);
    atc_policy_runtime_destroy(srv->policy);
    atc_affinity_destroy(srv->affinity);
    atc_prefix_index_destroy(srv->prefix);
    atc_health_destroy(srv->health); /* its probes use the table's endpoints */
    if (srv->table != NULL) {
        for (size_t i = 0; i < srv->table->nendpoints; i++)
            atc_upstream_pool_destroy(srv->table->endpoints[i]->pool);
        atc_endpoint_table_destroy(srv->table);
    }
    free_retired(srv, true);
    free(srv->retired);
    stop_sims(srv);
    atc_config_free(srv->cfg);
    free(srv);
}
