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
#include "base/dns_message.h"
#include "base/histogram.h"
#include "base/json.h"
#include "base/log.h"
#include "config/config.h"
#include "config/config_endpoint.h"
#include "core/dns_query.h"
#include "core/server.h"

#define DISCOVER_DEFAULT_INTERVAL_MS 5000
#define DISCOVER_MISSES_TO_LEAVE 2 /* good resolutions in a row without an address before it drains */
#define DISCOVER_ADDRESSES_MAX 256 /* a name with more records: the first ones (the answer's order) */

/* An address and port that one resolution named: the servers of an endpoint. */
struct found {
    char ip[INET6_ADDRSTRLEN];
    uint16_t port;
};

struct address {
    char ip[INET6_ADDRSTRLEN];
    uint16_t port;
    char *id;        /* its endpoint's id */
    unsigned missed; /* good resolutions in a row that did not name it */
};

/* An SRV target without addresses in the answer's additional section, resolved with evdns. */
struct target {
    struct watch *w;
    struct evdns_getaddrinfo_request *req; /* in flight, or NULL */
    char name[ATC_DNS_NAME_MAX];
    uint16_t port;
};

/* One model's discover: while the config in force has it: the A/AAAA records of dns:, or the SRV
 * records of srv: (each target's addresses with the record's port). */
struct watch {
    struct atc_discovery *d;
    char *model, *dns, *srv, *resolver; /* copies: a reload frees the config they came from */
    const char *name;                   /* dns or srv: the name asked */
    unsigned port;                      /* dns: the servers' port */
    uint16_t rport;
    uint64_t interval_ms, timeout_ms;
    struct evdns_base *evdns; /* dns: the name; srv: the targets, and the SRV question's nameserver */
    struct evdns_getaddrinfo_request *req; /* dns: the resolution in flight, or NULL */
    struct atc_dns_query *query;           /* srv: the SRV question in flight, or NULL */
    unsigned nameserver;                   /* srv: which of evdns's nameservers it goes to */
    struct target *targets;                /* srv: the lookups of this round's targets */
    size_t ntargets, pending;              /* and how many have not answered */
    bool starting;                         /* the lookups are being started (some may answer at once) */
    char round_error[320];                 /* srv: the first target that did not resolve ("": none) */
    struct found *found;                   /* what this resolution named: [DISCOVER_ADDRESSES_MAX] */
    size_t nfound;
    struct event *timer;
    struct address *addrs;
    size_t naddrs;
    uint64_t resolutions, failures;
    uint64_t last_ok_ms, last_attempt_ms; /* atc_mono_ms(); 0: never */
    bool failing;                         /* since the last good resolution: logged once per episode */
    char last_error[320];
};

struct atc_discovery {
    struct atc_server *srv;
    struct watch **watches;
    size_t nwatches;
    struct event *sync; /* a config reload: made active, runs from the loop */
};

static void on_timer(evutil_socket_t fd, short what, void *arg);

static bool same_text(const char *a, const char *b)
{
    return a == NULL ? b == NULL : b != NULL && strcmp(a, b) == 0;
}

static bool same_settings(const struct watch *w, const struct atc_model_config *m)
{
    const struct atc_discover_config *c = &m->discover;
    uint64_t interval = c->interval_ms ? c->interval_ms : DISCOVER_DEFAULT_INTERVAL_MS;
    return same_text(w->dns, c->dns) && same_text(w->srv, c->srv) && w->port == c->port &&
           w->interval_ms == interval && same_text(w->resolver, c->resolver) && w->rport == c->rport;
}

/* Stops the resolution in flight, if any (its callbacks then do nothing). */
static void cancel_round(struct watch *w)
{
    if (w->req != NULL) /* calls on_resolved with EVUTIL_EAI_CANCEL, at once */
        evdns_getaddrinfo_cancel(w->req);
    w->req = NULL;
    atc_dns_query_cancel(w->query);
    w->query = NULL;
    for (size_t i = 0; i < w->ntargets; i++)
        if (w->targets[i].req != NULL) /* likewise, on_target */
            evdns_getaddrinfo_cancel(w->targets[i].req);
    free(w->targets);
    w->targets = NULL;
    w->ntargets = w->pending = 0;
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
    cancel_round(w);
    if (w->evdns != NULL)
        evdns_base_free(w->evdns, 0);
    if (w->timer != NULL)
        event_free(w->timer);
    for (size_t i = 0; i < w->naddrs; i++)
        free(w->addrs[i].id);
    free(w->addrs);
    free(w->found);
    free(w->model);
    free(w->dns);
    free(w->srv);
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
    if ((w->model = strdup(m->name)) == NULL || (c->dns != NULL && (w->dns = strdup(c->dns)) == NULL) ||
        (c->srv != NULL && (w->srv = strdup(c->srv)) == NULL) ||
        (c->resolver != NULL && (w->resolver = strdup(c->resolver)) == NULL) ||
        (w->found = calloc(DISCOVER_ADDRESSES_MAX, sizeof(*w->found))) == NULL)
        goto error;
    w->name = w->srv != NULL ? w->srv : w->dns;
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
    w->timeout_ms = w->interval_ms < 100 ? 100 : w->interval_ms > 5000 ? 5000 : w->interval_ms;
    snprintf(timeout, sizeof(timeout), "%.3f", (double)w->timeout_ms / 1000.0);
    if (evdns_base_set_option(w->evdns, "timeout", timeout) != 0 ||
        evdns_base_set_option(w->evdns, "attempts", "2") != 0)
        goto error;
    return w;
error:
    watch_free(w);
    return NULL;
}

/* An address as logs and /admin/endpoints show it: with its port for srv: (each record has its own). */
static const char *address_text(const struct watch *w, const char *ip, uint16_t port, char *buf, size_t size)
{
    if (w->srv == NULL)
        return ip;
    snprintf(buf, size, strchr(ip, ':') != NULL ? "[%s]:%u" : "%s:%u", ip, (unsigned)port);
    return buf;
}

static struct address *find_address(struct watch *w, const char *ip, uint16_t port)
{
    for (size_t i = 0; i < w->naddrs; i++)
        if (strcmp(w->addrs[i].ip, ip) == 0 && w->addrs[i].port == port)
            return &w->addrs[i];
    return NULL;
}

/* A new address: its endpoint joins the model through `starting`. */
static void join(struct watch *w, const struct found *f)
{
    struct atc_server *srv = w->d->srv;
    struct atc_model_config *m = atc_config_model(srv->cfg, w->model);
    char id[300], url[320];
    bool v6 = strchr(f->ip, ':') != NULL;
    int n = snprintf(id, sizeof(id), "%s-%s-%u", w->model, f->ip, (unsigned)f->port);
    int u = snprintf(url, sizeof(url), v6 ? "http://[%s]:%u" : "http://%s:%u", f->ip, (unsigned)f->port);
    if (n < 0 || (size_t)n >= sizeof(id) || u < 0 || (size_t)u >= sizeof(url))
        return;
    struct address *a = realloc(w->addrs, (w->naddrs + 1) * sizeof(*a));
    if (m == NULL || a == NULL) {
        if (a != NULL)
            w->addrs = a;
        return;
    }
    w->addrs = a;
    a = &w->addrs[w->naddrs];
    *a = (struct address){.port = f->port};
    memcpy(a->ip, f->ip, sizeof(a->ip));
    if ((a->id = strdup(id)) == NULL)
        return;
    struct atc_endpoint_config ec = {0};
    const char *why = NULL;
    if (atc_config_endpoint_init(&ec, srv->cfg, m, id, url, ATC_ORIGIN_DNS, &why) < 0 ||
        (atc_server_add_endpoint(srv, &ec, &why) < 0 && why != atc_server_duplicate)) {
        char text[INET6_ADDRSTRLEN + 8];
        atc_warn("discover: model %s: address %s not added: %s", w->model,
                 address_text(w, f->ip, f->port, text, sizeof(text)), why ? why : "?");
        atc_endpoint_config_dispose(&ec);
        free(a->id);
        return;
    }
    atc_endpoint_config_dispose(&ec); /* emptied when taken; the duplicate's copy otherwise */
    w->naddrs++;
}

/* Adds an address of family @p family (@p in: its bytes) with @p port to this resolution's, once. */
static void add_found(struct watch *w, int family, const void *in, uint16_t port)
{
    char ip[INET6_ADDRSTRLEN];
    if (w->nfound == DISCOVER_ADDRESSES_MAX || evutil_inet_ntop(family, in, ip, sizeof(ip)) == NULL)
        return;
    for (size_t i = 0; i < w->nfound; i++)
        if (w->found[i].port == port && strcmp(w->found[i].ip, ip) == 0)
            return;
    memcpy(w->found[w->nfound].ip, ip, sizeof(ip));
    w->found[w->nfound++].port = port;
}

/* Each address of @p res (a getaddrinfo answer), with @p port. */
static void add_found_ai(struct watch *w, const struct evutil_addrinfo *res, uint16_t port)
{
    for (const struct evutil_addrinfo *ai = res; ai != NULL; ai = ai->ai_next)
        if (ai->ai_family == AF_INET)
            add_found(w, AF_INET, &((const struct sockaddr_in *)ai->ai_addr)->sin_addr, port);
        else if (ai->ai_family == AF_INET6)
            add_found(w, AF_INET6, &((const struct sockaddr_in6 *)ai->ai_addr)->sin6_addr, port);
}

static void set_failing(struct watch *w, const char *why)
{
    w->failures++;
    snprintf(w->last_error, sizeof(w->last_error), "%s", why);
    if (!w->failing)
        atc_warn("discover: model %s: resolving %s failed (%s): keeping its %zu endpoint(s) until it "
                 "resolves again",
                 w->model, w->name, why, w->naddrs);
    w->failing = true;
}

/* The end of a resolution (@p err NULL: w->found holds what it named): the set follows a good one and
 * stays as it was after a failed or empty one; the next is asked an interval later. */
static void resolved(struct watch *w, const char *err)
{
    w->resolutions++;
    if (err == NULL && w->nfound == 0)
        err = "no addresses";
    if (err != NULL) {
        set_failing(w, err);
    } else {
        if (w->failing)
            atc_info("discover: model %s: %s resolves again (%zu address(es))", w->model, w->name, w->nfound);
        w->failing = false;
        w->last_ok_ms = atc_mono_ms();
        for (size_t i = 0; i < w->nfound; i++)
            if (find_address(w, w->found[i].ip, w->found[i].port) == NULL)
                join(w, &w->found[i]);
        for (size_t i = 0; i < w->naddrs;) {
            struct address *a = &w->addrs[i];
            bool named = false;
            for (size_t j = 0; j < w->nfound && !named; j++)
                named = strcmp(w->found[j].ip, a->ip) == 0 && w->found[j].port == a->port;
            a->missed = named ? 0 : a->missed + 1;
            if (a->missed < DISCOVER_MISSES_TO_LEAVE) {
                i++;
                continue;
            }
            const char *why = NULL;
            char text[INET6_ADDRSTRLEN + 8];
            atc_info("discover: model %s: %s is gone from %s: endpoint %s drains", w->model,
                     address_text(w, a->ip, a->port, text, sizeof(text)), w->name, a->id);
            if (atc_server_remove_endpoint(w->d->srv, a->id, &why) < 0)
                atc_warn("discover: model %s: endpoint %s: %s", w->model, a->id, why);
            free(a->id);
            w->addrs[i] = w->addrs[--w->naddrs];
        }
    }
    struct timeval tv = atc_timeval_ms(w->interval_ms);
    evtimer_add(w->timer, &tv);
}

/* dns: evdns's answer for the name. */
static void on_resolved(int result, struct evutil_addrinfo *res, void *arg)
{
    if (result == EVUTIL_EAI_CANCEL) /* cancel_round: @p arg may be being freed */
        return;
    struct watch *w = arg;
    w->req = NULL;
    w->nfound = 0;
    if (result == 0)
        add_found_ai(w, res, (uint16_t)w->port);
    if (res != NULL)
        evutil_freeaddrinfo(res);
    resolved(w, result != 0 ? evutil_gai_strerror(result) : NULL);
}

/* srv: the round ends once the SRV answer and every target's lookup are in. A target that does not
 * resolve fails the round (the set stays as it was): its servers may still be there. */
static void srv_round_end(struct watch *w)
{
    free(w->targets);
    w->targets = NULL;
    w->ntargets = 0;
    resolved(w, w->round_error[0] ? w->round_error : NULL);
}

static void on_target(int result, struct evutil_addrinfo *res, void *arg)
{
    if (result == EVUTIL_EAI_CANCEL) /* cancel_round */
        return;
    struct target *t = arg;
    struct watch *w = t->w;
    t->req = NULL;
    if (result == 0)
        add_found_ai(w, res, t->port);
    if (res != NULL)
        evutil_freeaddrinfo(res);
    if (result != 0 && w->round_error[0] == '\0')
        snprintf(w->round_error, sizeof(w->round_error), "SRV target %s: %s", t->name,
                 evutil_gai_strerror(result));
    if (--w->pending == 0 && !w->starting)
        srv_round_end(w);
}

/* srv: the SRV records' targets, with their addresses from the additional section where it has them
 * (Kubernetes' DNS puts them there), else asked with evdns. Priority and weight are not used: every
 * target serves, as the endpoints of one model. */
static void on_srv_answer(const char *err, const struct atc_dns_answer *a, void *arg)
{
    struct watch *w = arg;
    w->query = NULL;
    w->nfound = 0;
    w->round_error[0] = '\0';
    if (err != NULL) {
        w->nameserver++; /* the next round asks the next one of /etc/resolv.conf's, if it has several */
        resolved(w, err);
        return;
    }
    if (a->nsrv > 0 && (w->targets = calloc(a->nsrv, sizeof(*w->targets))) == NULL) {
        resolved(w, "out of memory");
        return;
    }
    for (size_t i = 0; i < a->nsrv; i++) {
        const struct atc_dns_srv *s = &a->srv[i];
        bool glue = false, dup = false;
        if (s->target[0] == '\0' || s->port == 0) /* "." : the service is not offered there */
            continue;
        for (size_t j = 0; j < a->naddrs; j++)
            if (strcmp(a->addrs[j].name, s->target) == 0) {
                add_found(w, a->addrs[j].len == 4 ? AF_INET : AF_INET6, a->addrs[j].addr, s->port);
                glue = true;
            }
        for (size_t j = 0; j < w->ntargets && !dup; j++)
            dup = w->targets[j].port == s->port && strcmp(w->targets[j].name, s->target) == 0;
        if (glue || dup)
            continue;
        struct target *t = &w->targets[w->ntargets++];
        t->w = w;
        t->port = s->port;
        memcpy(t->name, s->target, sizeof(t->name));
    }
    /* A lookup may answer from within evdns_getaddrinfo (an address written as a name, an error): the
     * round ends after the last one is started, not inside it. */
    struct evutil_addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    w->pending = w->ntargets;
    w->starting = true;
    for (size_t i = 0; i < w->ntargets; i++) {
        struct target *t = &w->targets[i];
        struct evdns_getaddrinfo_request *req =
            evdns_getaddrinfo(w->evdns, t->name, NULL, &hints, on_target, t);
        if (req != NULL)
            t->req = req;
    }
    w->starting = false;
    if (w->pending == 0)
        srv_round_end(w);
}

static void ask_srv(struct watch *w)
{
    struct sockaddr_storage ns;
    const char *err = NULL;
    int count = evdns_base_count_nameservers(w->evdns);
    int len = count <= 0 ? -1
                         : evdns_base_get_nameserver_addr(w->evdns, (int)(w->nameserver % (unsigned)count),
                                                          (struct sockaddr *)&ns, sizeof(ns));
    if (len <= 0 || (size_t)len > sizeof(ns))
        err = "no nameserver (none in /etc/resolv.conf, and no resolver:)";
    else
        w->query = atc_dns_query_start(w->d->srv->base, (struct sockaddr *)&ns, (socklen_t)len, w->srv,
                                       ATC_DNS_TYPE_SRV, w->timeout_ms, 2, on_srv_answer, w, &err);
    if (w->query == NULL) {
        w->nfound = 0;
        resolved(w, err);
    }
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct watch *w = arg;
    w->last_attempt_ms = atc_mono_ms();
    if (w->srv != NULL) {
        ask_srv(w);
        return;
    }
    struct evutil_addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
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
        bool still = m != NULL && (m->discover.dns != NULL || m->discover.srv != NULL);
        if (still && same_settings(w, m)) {
            i++;
            continue;
        }
        atc_info("discover: model %s: discover: %s, its %zu endpoint(s) drain", w->model,
                 still ? "changed" : "removed", w->naddrs);
        cancel_round(w);
        drain_all(w);
        watch_free(w);
        d->watches[i] = d->watches[--d->nwatches];
    }
    for (size_t i = 0; i < cfg->nmodels; i++) {
        const struct atc_model_config *m = &cfg->models[i];
        bool have = false;
        for (size_t j = 0; j < d->nwatches && !have; j++)
            have = strcmp(d->watches[j]->model, m->name) == 0;
        if ((m->discover.dns == NULL && m->discover.srv == NULL) || have)
            continue;
        struct watch **ws = realloc(d->watches, (d->nwatches + 1) * sizeof(*ws));
        struct watch *w = ws != NULL ? watch_new(d, m) : NULL;
        if (ws != NULL)
            d->watches = ws;
        if (w == NULL) {
            atc_error("discover: model %s: cannot start resolving %s", m->name,
                      m->discover.srv != NULL ? m->discover.srv : m->discover.dns);
            continue;
        }
        d->watches[d->nwatches++] = w;
        atc_info("discover: model %s: resolving %s%s every %llums", w->model,
                 w->srv ? "the SRV records of " : "", w->name, (unsigned long long)w->interval_ms);
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
        evbuffer_add(out, ",", 1);
        atc_json_key_string(out, "srv", w->srv);
        if (w->srv != NULL) /* the port comes with each record */
            evbuffer_add_printf(out, ",\"port\":null");
        else
            evbuffer_add_printf(out, ",\"port\":%u", w->port);
        evbuffer_add_printf(out, ",\"interval_ms\":%llu,\"resolver\":", (unsigned long long)w->interval_ms);
        if (w->resolver != NULL)
            evbuffer_add_printf(out, strchr(w->resolver, ':') ? "\"[%s]:%u\"" : "\"%s:%u\"", w->resolver,
                                (unsigned)w->rport);
        else
            evbuffer_add_printf(out, "\"system\"");
        evbuffer_add_printf(out, ",\"addresses\":[");
        for (size_t j = 0; j < w->naddrs; j++) {
            char text[INET6_ADDRSTRLEN + 8];
            evbuffer_add_printf(out, "%s\"%s\"", j ? "," : "",
                                address_text(w, w->addrs[j].ip, w->addrs[j].port, text, sizeof(text)));
        }
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
