#include "core/discovery.h"

#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <event2/dns.h>
#include <event2/event.h>
#include <event2/buffer.h>
#include <event2/util.h>

#include "base/clock.h"
#include "base/histogram.h"
#include "base/json.h"
#include "base/log.h"
#include "config/config.h"
#include "config/config_endpoint.h"
#include "core/server.h"

#define DISCOVER_DEFAULT_INTERVAL_MS 5000
#define DISCOVER_MISSES_TO_LEAVE 2 /* good resolutions in a row without an address before it drains */
#define DISCOVER_ADDRESSES_MAX 256 /* a name with more records: the first ones (the answer's order) */

struct address {
    char ip[INET6_ADDRSTRLEN];
    char *id;        /* its endpoint's id */
    unsigned missed; /* good resolutions in a row that did not name it */
};

/* One model's discover: while the config in force has it. */
struct watch {
    struct atc_discovery *d;
    char *model, *dns, *resolver; /* copies: a reload frees the config they came from */
    unsigned port;
    uint16_t rport;
    uint64_t interval_ms;
    struct evdns_base *evdns;
    struct evdns_getaddrinfo_request *req; /* the resolution in flight, or NULL */
    struct event *timer;
    struct address *addrs;
    size_t naddrs;
    uint64_t resolutions, failures;
    uint64_t last_ok_ms, last_attempt_ms; /* atc_mono_ms(); 0: never */
    bool failing;                         /* since the last good resolution: logged once per episode */
    char last_error[128];
};

struct atc_discovery {
    struct atc_server *srv;
    struct watch **watches;
    size_t nwatches;
    struct event *sync; /* a config reload: made active, runs from the loop */
};

static void on_timer(evutil_socket_t fd, short what, void *arg);

static bool same_settings(const struct watch *w, const struct atc_model_config *m)
{
    const struct atc_discover_config *c = &m->discover;
    uint64_t interval = c->interval_ms ? c->interval_ms : DISCOVER_DEFAULT_INTERVAL_MS;
    return strcmp(w->dns, c->dns) == 0 && w->port == c->port && w->interval_ms == interval &&
           (w->resolver == NULL ? c->resolver == NULL
                                : c->resolver != NULL && strcmp(w->resolver, c->resolver) == 0) &&
           w->rport == c->rport;
}

/* Drains every endpoint @p w found (they leave the config and the table, their requests finish). */
static void drain_all(struct watch *w)
{
    for (size_t i = 0; i < w->naddrs; i++) {
        const char *why = NULL;
        if (atc_server_remove_endpoint(w->d->srv, w->addrs[i].id, &why) < 0 && why != atc_server_no_endpoint)
            atc_warn("discover: model %s: endpoint %s: %s", w->model, w->addrs[i].id, why);
        free(w->addrs[i].id);
    }
    w->naddrs = 0;
}

static void watch_free(struct watch *w)
{
    if (w == NULL)
        return;
    if (w->req != NULL) /* calls on_resolved with EVUTIL_EAI_CANCEL, at once */
        evdns_getaddrinfo_cancel(w->req);
    if (w->evdns != NULL)
        evdns_base_free(w->evdns, 0);
    if (w->timer != NULL)
        event_free(w->timer);
    for (size_t i = 0; i < w->naddrs; i++)
        free(w->addrs[i].id);
    free(w->addrs);
    free(w->model);
    free(w->dns);
    free(w->resolver);
    free(w);
}

static struct watch *watch_new(struct atc_discovery *d, const struct atc_model_config *m)
{
    const struct atc_discover_config *c = &m->discover;
    struct event_base *base = d->srv->base;
    struct watch *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return NULL;
    w->d = d;
    w->port = c->port;
    w->rport = c->rport;
    w->interval_ms = c->interval_ms ? c->interval_ms : DISCOVER_DEFAULT_INTERVAL_MS;
    if ((w->model = strdup(m->name)) == NULL || (w->dns = strdup(c->dns)) == NULL ||
        (c->resolver != NULL && (w->resolver = strdup(c->resolver)) == NULL))
        goto error;
    if ((w->timer = evtimer_new(base, on_timer, w)) == NULL)
        goto error;
    /* The system's resolvers (/etc/resolv.conf), or the one resolver: names. */
    int flags = EVDNS_BASE_DISABLE_WHEN_INACTIVE | (w->resolver ? 0 : EVDNS_BASE_INITIALIZE_NAMESERVERS);
    if ((w->evdns = evdns_base_new(base, flags)) == NULL)
        goto error;
    if (w->resolver != NULL) {
        char ns[300];
        bool v6 = strchr(w->resolver, ':') != NULL;
        snprintf(ns, sizeof(ns), v6 ? "[%s]:%u" : "%s:%u", w->resolver, (unsigned)w->rport);
        if (evdns_base_nameserver_ip_add(w->evdns, ns) != 0) {
            atc_error("discover: model %s: resolver %s: not an IP address and port", w->model, ns);
            goto error;
        }
    }
    /* A resolution fails within about one interval (at most 5s a try), so a silent server is seen. */
    char timeout[32];
    double t = (double)w->interval_ms / 1000.0;
    snprintf(timeout, sizeof(timeout), "%.3f", t < 0.1 ? 0.1 : t > 5 ? 5 : t);
    if (evdns_base_set_option(w->evdns, "timeout", timeout) != 0 ||
        evdns_base_set_option(w->evdns, "attempts", "2") != 0)
        goto error;
    return w;
error:
    watch_free(w);
    return NULL;
}

static struct address *find_address(struct watch *w, const char *ip)
{
    for (size_t i = 0; i < w->naddrs; i++)
        if (strcmp(w->addrs[i].ip, ip) == 0)
            return &w->addrs[i];
    return NULL;
}

/* A new address: its endpoint joins the model through `starting`. */
static void join(struct watch *w, const char *ip)
{
    struct atc_server *srv = w->d->srv;
    struct atc_model_config *m = atc_config_model(srv->cfg, w->model);
    char id[300], url[320];
    bool v6 = strchr(ip, ':') != NULL;
    int n = snprintf(id, sizeof(id), "%s-%s-%u", w->model, ip, w->port);
    int u = snprintf(url, sizeof(url), v6 ? "http://[%s]:%u" : "http://%s:%u", ip, w->port);
    if (n < 0 || (size_t)n >= sizeof(id) || u < 0 || (size_t)u >= sizeof(url) ||
        strlen(ip) >= INET6_ADDRSTRLEN)
        return;
    struct address *a = realloc(w->addrs, (w->naddrs + 1) * sizeof(*a));
    if (m == NULL || a == NULL) {
        if (a != NULL)
            w->addrs = a;
        return;
    }
    w->addrs = a;
    a = &w->addrs[w->naddrs];
    *a = (struct address){0};
    memcpy(a->ip, ip, strlen(ip) + 1);
    if ((a->id = strdup(id)) == NULL)
        return;
    struct atc_endpoint_config ec = {0};
    const char *why = NULL;
    if (atc_config_endpoint_init(&ec, srv->cfg, m, id, url, ATC_ORIGIN_DNS, &why) < 0 ||
        (atc_server_add_endpoint(srv, &ec, &why) < 0 && why != atc_server_duplicate)) {
        atc_warn("discover: model %s: address %s not added: %s", w->model, ip, why ? why : "?");
        atc_endpoint_config_dispose(&ec);
        free(a->id);
        return;
    }
    atc_endpoint_config_dispose(&ec); /* emptied when taken; the duplicate's copy otherwise */
    w->naddrs++;
}

static void set_failing(struct watch *w, const char *why)
{
    w->failures++;
    snprintf(w->last_error, sizeof(w->last_error), "%s", why);
    if (!w->failing)
        atc_warn("discover: model %s: resolving %s failed (%s): keeping its %zu endpoint(s) until it "
                 "resolves again",
                 w->model, w->dns, why, w->naddrs);
    w->failing = true;
}

static void on_resolved(int result, struct evutil_addrinfo *res, void *arg)
{
    if (result == EVUTIL_EAI_CANCEL) /* watch_free: @p arg is being freed */
        return;
    struct watch *w = arg;
    w->req = NULL;
    w->resolutions++;
    char seen[DISCOVER_ADDRESSES_MAX][INET6_ADDRSTRLEN];
    size_t nseen = 0;
    for (const struct evutil_addrinfo *ai = res; result == 0 && ai != NULL; ai = ai->ai_next) {
        const void *in =
            ai->ai_family == AF_INET    ? (const void *)&((struct sockaddr_in *)ai->ai_addr)->sin_addr
            : ai->ai_family == AF_INET6 ? (const void *)&((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr
                                        : NULL;
        char ip[INET6_ADDRSTRLEN];
        if (in == NULL || nseen == DISCOVER_ADDRESSES_MAX ||
            evutil_inet_ntop(ai->ai_family, in, ip, sizeof(ip)) == NULL)
            continue;
        bool dup = false;
        for (size_t i = 0; i < nseen && !dup; i++)
            dup = strcmp(seen[i], ip) == 0;
        if (!dup)
            memcpy(seen[nseen++], ip, sizeof(ip));
    }
    if (res != NULL)
        evutil_freeaddrinfo(res);
    if (result != 0 || nseen == 0) {
        set_failing(w, result != 0 ? evutil_gai_strerror(result) : "no addresses");
    } else {
        if (w->failing)
            atc_info("discover: model %s: %s resolves again (%zu address(es))", w->model, w->dns, nseen);
        w->failing = false;
        w->last_ok_ms = atc_mono_ms();
        for (size_t i = 0; i < nseen; i++)
            if (find_address(w, seen[i]) == NULL)
                join(w, seen[i]);
        for (size_t i = 0; i < w->naddrs;) {
            struct address *a = &w->addrs[i];
            bool named = false;
            for (size_t j = 0; j < nseen && !named; j++)
                named = strcmp(seen[j], a->ip) == 0;
            a->missed = named ? 0 : a->missed + 1;
            if (a->missed < DISCOVER_MISSES_TO_LEAVE) {
                i++;
                continue;
            }
            const char *why = NULL;
            atc_info("discover: model %s: %s is gone from %s: endpoint %s drains", w->model, a->ip, w->dns,
                     a->id);
            if (atc_server_remove_endpoint(w->d->srv, a->id, &why) < 0)
                atc_warn("discover: model %s: endpoint %s: %s", w->model, a->id, why);
            free(a->id);
            w->addrs[i] = w->addrs[--w->naddrs];
        }
    }
    struct timeval tv = atc_timeval_ms(w->interval_ms);
    evtimer_add(w->timer, &tv);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct watch *w = arg;
    struct evutil_addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    w->last_attempt_ms = atc_mono_ms();
    struct evdns_getaddrinfo_request *req = evdns_getaddrinfo(w->evdns, w->dns, NULL, &hints, on_resolved, w);
    if (req != NULL && w->timer != NULL) /* (NULL: it answered already, from the call) */
        w->req = req;
}

/* The watches follow the config in force: a model's discover: added starts one, removed or changed
 * drains what it found (a changed one then starts again). */
static void sync_config(struct atc_discovery *d)
{
    const struct atc_config *cfg = d->srv->cfg;
    for (size_t i = 0; i < d->nwatches;) {
        struct watch *w = d->watches[i];
        const struct atc_model_config *m = atc_config_model(cfg, w->model);
        if (m != NULL && m->discover.dns != NULL && same_settings(w, m)) {
            i++;
            continue;
        }
        atc_info("discover: model %s: discover: %s, its %zu endpoint(s) drain", w->model,
                 m != NULL && m->discover.dns != NULL ? "changed" : "removed", w->naddrs);
        if (w->req != NULL) {
            evdns_getaddrinfo_cancel(w->req);
            w->req = NULL;
        }
        drain_all(w);
        watch_free(w);
        d->watches[i] = d->watches[--d->nwatches];
    }
    for (size_t i = 0; i < cfg->nmodels; i++) {
        const struct atc_model_config *m = &cfg->models[i];
        bool have = false;
        for (size_t j = 0; j < d->nwatches && !have; j++)
            have = strcmp(d->watches[j]->model, m->name) == 0;
        if (m->discover.dns == NULL || have)
            continue;
        struct watch **ws = realloc(d->watches, (d->nwatches + 1) * sizeof(*ws));
        struct watch *w = ws != NULL ? watch_new(d, m) : NULL;
        if (ws != NULL)
            d->watches = ws;
        if (w == NULL) {
            atc_error("discover: model %s: cannot start resolving %s", m->name, m->discover.dns);
            continue;
        }
        d->watches[d->nwatches++] = w;
        atc_info("discover: model %s: resolving %s every %llums", w->model, w->dns,
                 (unsigned long long)w->interval_ms);
        on_timer(-1, 0, w); /* the first resolution now */
    }
}

static void on_sync(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    sync_config(arg);
}

/* Called at the end of a config reload, inside it: the watches follow from the loop. */
static void on_config_reloaded(struct atc_server *srv)
{
    event_active(srv->discovery->sync, 0, 0);
}

int atc_discovery_start(struct atc_server *srv)
{
    struct atc_discovery *d = calloc(1, sizeof(*d));
    if (d == NULL || (d->sync = event_new(srv->base, -1, 0, on_sync, d)) == NULL) {
        free(d);
        return -1;
    }
    d->srv = srv;
    srv->discovery = d;
    srv->on_config_reloaded = on_config_reloaded;
    sync_config(d);
    return 0;
}

void atc_discovery_stop(struct atc_server *srv)
{
    struct atc_discovery *d = srv->discovery;
    if (d == NULL)
        return;
    for (size_t i = 0; i < d->nwatches; i++)
        watch_free(d->watches[i]);
    free(d->watches);
    event_free(d->sync);
    free(d);
    srv->discovery = NULL;
    srv->on_config_reloaded = NULL;
}

static void age_json(struct evbuffer *out, const char *key, uint64_t at, uint64_t now)
{
    if (at == 0)
        evbuffer_add_printf(out, ",\"%s\":null", key);
    else
        evbuffer_add_printf(out, ",\"%s\":%llu", key, (unsigned long long)(now > at ? now - at : 0));
}

void atc_discovery_json(const struct atc_server *srv, struct evbuffer *out)
{
    const struct atc_discovery *d = srv->discovery;
    uint64_t now = atc_mono_ms();
    evbuffer_add_printf(out, ",\"discovery\":[");
    for (size_t i = 0; d != NULL && i < d->nwatches; i++) {
        const struct watch *w = d->watches[i];
        evbuffer_add_printf(out, "%s{", i ? "," : "");
        atc_json_key_string(out, "model", w->model);
        evbuffer_add(out, ",", 1);
        atc_json_key_string(out, "dns", w->dns);
        evbuffer_add_printf(out, ",\"port\":%u,\"interval_ms\":%llu,\"resolver\":", w->port,
                            (unsigned long long)w->interval_ms);
        if (w->resolver != NULL)
            evbuffer_add_printf(out, strchr(w->resolver, ':') ? "\"[%s]:%u\"" : "\"%s:%u\"", w->resolver,
                                (unsigned)w->rport);
        else
            evbuffer_add_printf(out, "\"system\"");
        evbuffer_add_printf(out, ",\"addresses\":[");
        for (size_t j = 0; j < w->naddrs; j++)
            evbuffer_add_printf(out, "%s\"%s\"", j ? "," : "", w->addrs[j].ip);
        evbuffer_add_printf(out, "],\"resolutions_total\":%llu,\"failures_total\":%llu,\"failing\":%s,",
                            (unsigned long long)w->resolutions, (unsigned long long)w->failures,
                            w->failing ? "true" : "false");
        atc_json_key_string(out, "last_error", w->last_error[0] ? w->last_error : NULL);
        age_json(out, "last_ok_age_ms", w->last_ok_ms, now);
        age_json(out, "last_attempt_age_ms", w->last_attempt_ms, now);
        evbuffer_add(out, "}", 1);
    }
    evbuffer_add(out, "]", 1);
}

static void metric(struct evbuffer *out, const struct atc_discovery *d, const char *name, const char *type,
                   const char *help, int which)
{
    evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
    for (size_t i = 0; i < d->nwatches; i++) {
        const struct watch *w = d->watches[i];
        uint64_t v = which == 0 ? w->resolutions : which == 1 ? w->failures : w->naddrs;
        evbuffer_add_printf(out, "%s{model=\"", name);
        atc_histogram_label(out, w->model);
        evbuffer_add_printf(out, "\"} %llu\n", (unsigned long long)v);
    }
}

void atc_discovery_metrics(const struct atc_server *srv, struct evbuffer *out)
{
    const struct atc_discovery *d = srv->discovery;
    if (d == NULL || d->nwatches == 0)
        return;
    metric(out, d, "atc_discovery_resolutions_total", "counter", "DNS resolutions of a model's discover:", 0);
    metric(out, d, "atc_discovery_failures_total", "counter",
           "failed or empty resolutions (the last good set was kept)", 1);
    metric(out, d, "atc_discovery_addresses", "gauge", "addresses the model's endpoints come from", 2);
}
