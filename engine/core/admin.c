#include "core/admin.h"
#include <arpa/inet.h>
#include <netinet/in.h>

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <event2/buffer.h>

#include "fleet/admission.h"
#include "base/clock.h"
#include "config/config.h"
#include "config/roles.h"
#include "config/engine_profile.h"
#include "base/log.h"
#include "fleet/endpoint.h"
#include "fleet/health.h"
#include "fleet/health_report.h"
#include "fleet/kv_events.h"
#include "fleet/recent.h"
#include "http/http_server.h"
#include "ops/metrics.h"
#include "ops/status_page.h"
#include "policy/policy.h"
#include "policy/status.h"
#include "trace/recorder.h"
#include "cluster/cluster.h"
#include "cluster/limits.h"
#include "base/config_value.h"
#include "base/json.h"
#include "config/config_endpoint.h"
#include "core/discovery.h"
#include "core/rollout.h"
#include "core/server.h"
#include "http/upstream.h"
#include "proxy/table_swap.h"
#include "proxy/worker.h"

static void admin_error(struct atc_http_req *req, int status, const char *type, const char *code,
                        const char *message, int retry_after_s)
{
    atc_http_reply_error(req, status, type, code, message, retry_after_s, NULL);
}

/* %XX-decodes @p in into @p out (@p size bytes); its length, or -1 when cut, malformed or too long. */
static long percent_decode(const char *in, char *out, size_t size)
{
    size_t n = 0;
    for (const char *p = in; *p; p++) {
        int c = (unsigned char)*p;
        if (c == '%') {
            int hi = p[1], lo = hi ? p[2] : 0;
            char hex[3] = {(char)hi, (char)lo, 0};
            char *end;
            if (!hi || !lo || !strchr("0123456789abcdefABCDEF", hi) || !strchr("0123456789abcdefABCDEF", lo))
                return -1;
            c = (int)strtol(hex, &end, 16);
            p += 2;
        }
        if (n + 1 >= size)
            return -1;
        out[n++] = (char)c;
    }
    out[n] = '\0';
    return (long)n;
}

/* What the admin reads and /metrics show of the workers, copied by each worker on its own thread
 * (atc_workers_visit): no worker is parked to be read, and none waits for the rendering. Each worker
 * writes only its own slot; the main thread reads them once the visit returns, renders, then frees. */
struct worker_figures {
    struct atc_worker_stats stats;
    unsigned active;
    uint64_t policy_version;           /* 0 without a policy */
    struct atc_policy_runtime *policy; /* a copy (atc_policy_status_copy); NULL without, or out of memory */
    struct atc_admission *admission;   /* a copy (atc_admission_copy); NULL without a queue */
    size_t *idle;                      /* [table->nendpoints]: the worker's idle connections by endpoint */
};

struct figures {
    const struct atc_endpoint_table *table;
    bool policy; /* copy the policies too (the endpoints page does not show them) */
    struct worker_figures w[ATC_MAX_WORKERS];
    size_t *idle; /* [table->nendpoints]: summed over the workers */
};

/* On worker @p w's thread. */
static void copy_figures(struct atc_worker *w, void *arg)
{
    struct figures *f = arg;
    struct worker_figures *wf = &f->w[w->id];
    wf->stats = w->stats;
    wf->active = w->active;
    if (w->policy != NULL) {
        if (f->policy)
            wf->policy = atc_policy_status_copy(w->policy);
        wf->policy_version = atc_policy_version(w->policy);
    }
    if (w->admission != NULL)
        wf->admission = atc_admission_copy(w->admission);
    wf->idle = calloc(f->table->nendpoints + 1, sizeof(size_t));
    for (size_t i = 0; wf->idle != NULL && i < f->table->nendpoints; i++) {
        const struct atc_endpoint *ep = f->table->endpoints[i];
        wf->idle[i] = ep->pools[w->id] != NULL ? atc_upstream_pool_idle(ep->pools[w->id]) : 0;
    }
}

/* Main thread: every worker's figures, copied on its own thread. */
static void figures_take(struct atc_server *srv, struct figures *f, bool policy)
{
    *f = (struct figures){.table = srv->table, .policy = policy};
    atc_workers_visit(&srv->group, copy_figures, f);
    f->idle = calloc(f->table->nendpoints + 1, sizeof(size_t));
    for (unsigned i = 0; f->idle != NULL && i < srv->group.nworkers; i++)
        for (size_t e = 0; f->w[i].idle != NULL && e < f->table->nendpoints; e++)
            f->idle[e] += f->w[i].idle[e];
}

static void figures_free(struct figures *f)
{
    for (size_t i = 0; i < ATC_MAX_WORKERS; i++) {
        atc_policy_status_copy_free(f->w[i].policy);
        atc_admission_copy_free(f->w[i].admission);
        free(f->w[i].idle);
    }
    free(f->idle);
}

/* The workers' policy copies into @p out; how many (0 without a policy). */
static size_t figures_policies(const struct figures *f, unsigned nworkers, struct atc_policy_runtime **out)
{
    size_t n = 0;
    for (unsigned i = 0; i < nworkers; i++)
        if (f->w[i].policy != NULL)
            out[n++] = f->w[i].policy;
    return n;
}

/* The workers' admission copies into @p out (none when admission.queue is 0). */
static size_t figures_admissions(const struct figures *f, unsigned nworkers, struct atc_admission **out)
{
    size_t n = 0;
    for (unsigned i = 0; i < nworkers; i++)
        if (f->w[i].admission != NULL)
            out[n++] = f->w[i].admission;
    return n;
}

static void figures_totals(const struct figures *f, unsigned nworkers, struct atc_worker_stats *st,
                           unsigned *active)
{
    *st = (struct atc_worker_stats){0};
    *active = 0;
    for (unsigned i = 0; i < nworkers; i++) {
        const struct atc_worker_stats *w = &f->w[i].stats;
        st->requests_total += w->requests_total;
        st->responses_total += w->responses_total;
        st->client_gone_total += w->client_gone_total;
        st->retries_total += w->retries_total;
        st->upstream_errors_total += w->upstream_errors_total;
        *active += f->w[i].active;
    }
}

/* The endpoint's last minute (recent.h): the rates the status page shows beside the totals. */
static void recent_json(const struct atc_endpoint *ep, uint64_t now_ms, struct evbuffer *out)
{
    struct atc_recent_sum s;
    atc_recent_sum(ep->recent, now_ms, &s);
    evbuffer_add_printf(out,
                        ",\"recent\":{\"window_s\":%d,\"attempts\":%llu,\"errors\":%llu,\"error_ratio\":",
                        ATC_RECENT_SECONDS, (unsigned long long)s.attempts, (unsigned long long)s.errors);
    if (s.attempts > 0)
        evbuffer_add_printf(out, "%.4f", (double)s.errors / (double)s.attempts);
    else
        evbuffer_add(out, "null", 4);
    if (s.ttft_n > 0)
        evbuffer_add_printf(out, ",\"ttft_ms\":%.3f", s.ttft_ms);
    else
        evbuffer_add_printf(out, ",\"ttft_ms\":null");
    struct atc_recent_change ch[ATC_RECENT_CHANGES];
    size_t n = atc_recent_changes(ep->recent, ch);
    evbuffer_add_printf(out, ",\"tracked_ms\":%llu,\"changes\":[",
                        (unsigned long long)(now_ms - ep->recent->since_ms)); /* how long atc has known it */
    for (size_t i = 0; i < n; i++)
        evbuffer_add_printf(out, "%s{\"age_ms\":%llu,\"from\":\"%s\",\"to\":\"%s\"}", i ? "," : "",
                            (unsigned long long)(now_ms - ch[i].at_ms),
                            atc_health_state_name((enum atc_health_state)ch[i].from),
                            atc_health_state_name((enum atc_health_state)ch[i].to));
    evbuffer_add(out, "]}", 2);
}

/* The fleet-wide load (cluster:): the other replicas' in-flight requests on the endpoint, summed over the
 * fresh ones, with the age of the oldest figure (null without one), and this replica's plus theirs. */
static void remote_json(const struct atc_endpoint *ep, uint64_t now_ms, struct evbuffer *out)
{
    unsigned remote = atomic_load_explicit(&ep->remote.inflight, memory_order_relaxed);
    uint64_t at = atomic_load_explicit(&ep->remote.at_ms, memory_order_relaxed);
    evbuffer_add_printf(out, ",\"remote_inflight\":%u,\"fleet_inflight\":%u,\"remote_age_ms\":", remote,
                        atc_endpoint_fleet_inflight(ep));
    if (at != 0)
        evbuffer_add_printf(out, "%llu", (unsigned long long)(now_ms > at ? now_ms - at : 0));
    else
        evbuffer_add(out, "null", 4);
}

/* The workers' counters and queues as each copied them (figures_take); the endpoints' atomics as they are. */
static void send_endpoints(struct atc_server *srv, struct atc_http_req *req)
{
    struct figures f;
    figures_take(srv, &f, false);
    struct evbuffer *b = evbuffer_new();
    uint64_t now_ms = atc_mono_ms();
    evbuffer_add_printf(b, "{\"endpoints\":[");
    for (size_t i = 0; i < srv->table->nendpoints; i++) {
        const struct atc_endpoint *ep = srv->table->endpoints[i];
        evbuffer_add_printf(b, "%s{", i ? "," : "");
        atc_json_key_string(b, "id", ep->id);
        evbuffer_add(b, ",", 1);
        atc_json_key_string(b, "model", ep->model);
        evbuffer_add(b, ",", 1);
        atc_json_key_string(b, "url", ep->url);
        evbuffer_add(b, ",", 1);
        const struct atc_endpoint_config *ec = atc_config_endpoint(srv->cfg, ep->id, NULL);
        atc_json_key_string(b, "origin",
                            ep->simulated ? "simulate" : atc_endpoint_origin_name(ec ? ec->origin : 0));
        evbuffer_add(b, ",", 1);
        atc_json_key_string(b, "version", ep->version);
        evbuffer_add_printf(b, ",\"tags\":[");
        for (size_t t = 0; t < ep->ntags; t++) {
            evbuffer_add_printf(b, "%s\"", t ? "," : "");
            atc_json_escape(b, ep->tags[t], strlen(ep->tags[t]));
            evbuffer_add(b, "\"", 1);
        }
        evbuffer_add_printf(b,
                            "],\"capacity\":%u,\"weight\":%u,\"routable\":%s,\"inflight\":%u,"
                            "\"inflight_tokens\":%llu,\"ttft_ewma_ms\":%.3f,\"requests_total\":%llu,"
                            "\"errors_total\":%llu,\"idle_connections\":%zu",
                            ep->capacity, ep->weight, ep->routable ? "true" : "false", ep->inflight,
                            (unsigned long long)ep->inflight_tokens, ep->ttft_ewma_ms,
                            (unsigned long long)ep->requests_total, (unsigned long long)ep->errors_total,
                            f.idle != NULL ? f.idle[i] : 0);
        /* how atc speaks to it: its engine, and whether it has a key (never the key) */
        evbuffer_add_printf(b, ",\"engine\":\"%s\",\"role\":\"%s\",\"api_key\":\"%s\",",
                            atc_engine_profile(ep->engine)->name, atc_role_names[ep->role],
                            ep->authorization != NULL ? "set" : "not set");
        atc_json_key_string(b, "api_key_source", ep->api_key_source);
        evbuffer_add_printf(b, ",\"forward_authorization\":%s", ep->forward_authorization ? "true" : "false");
        uint64_t kv = atomic_load_explicit(&ep->kv_tokens, memory_order_relaxed);
        if (kv > 0)
            evbuffer_add_printf(b, ",\"kv_tokens\":%llu", (unsigned long long)kv);
        else
            evbuffer_add_printf(b, ",\"kv_tokens\":null");
        /* the routing signals atc observed (fleet/signals.h): the rate and ITL with their samples (0: the
         * priors), the engine-reported cached share (null: never reported) */
        const struct atc_signals *sig = &ep->sig;
        double cached = atc_signals_cached_share(sig);
        evbuffer_add_printf(b,
                            ",\"signals\":{\"prefill_rate\":%.1f,\"prefill_samples\":%llu,\"itl_ms\":%.3f,"
                            "\"itl_samples\":%llu,\"prefill_tokens\":%llu,\"cached_token_share\":",
                            atc_signals_prefill_tps(sig, &srv->table->signals),
                            (unsigned long long)atomic_load(&sig->prefill_samples),
                            atc_signals_itl_ms(sig, &srv->table->signals),
                            (unsigned long long)atomic_load(&sig->itl_samples),
                            (unsigned long long)atomic_load(&sig->prefill_tokens));
        if (cached >= 0)
            evbuffer_add_printf(b, "%.4f}", cached);
        else
            evbuffer_add_printf(b, "null}");
        atc_health_endpoint_json(ep, b); /* state, checks, last error, scraped load */
        recent_json(ep, now_ms, b);
        atc_kv_events_endpoint_json(srv->kv, ep->id, b); /* its KV events' counters, when it publishes */
        remote_json(ep, now_ms, b);
        evbuffer_add(b, "}", 1);
    }
    struct atc_worker_stats totals;
    const struct atc_worker_stats *s = &totals;
    unsigned active;
    figures_totals(&f, srv->group.nworkers, &totals, &active);
    struct atc_admission *adms[ATC_MAX_WORKERS];
    size_t nadm = figures_admissions(&f, srv->group.nworkers, adms);
    evbuffer_add_printf(b, "],\"queues\":");
    if (nadm > 0)
        atc_admission_status_json(adms, nadm, b);
    else
        evbuffer_add(b, "null", 4);
    evbuffer_add_printf(b, ",\"workers\":[");
    for (unsigned i = 0; i < srv->group.nworkers; i++) {
        const struct worker_figures *w = &f.w[i];
        evbuffer_add_printf(b, "%s{\"id\":%u,\"requests_total\":%llu,\"active\":%u,\"policy_version\":%llu}",
                            i ? "," : "", i, (unsigned long long)w->stats.requests_total, w->active,
                            (unsigned long long)w->policy_version);
    }
    evbuffer_add(b, "]", 1);
    atc_discovery_json(srv, b); /* ,"discovery":[...] */
    evbuffer_add_printf(b,
                        ",\"requests_total\":%llu,\"responses_total\":%llu,\"client_gone_total\":%llu,"
                        "\"retries_total\":%llu,\"upstream_errors_total\":%llu,\"active\":%u,\"health\":",
                        (unsigned long long)s->requests_total, (unsigned long long)s->responses_total,
                        (unsigned long long)s->client_gone_total, (unsigned long long)s->retries_total,
                        (unsigned long long)s->upstream_errors_total, active);
    atc_health_status_json(srv->health, b);
    /* which atc this is: its version, how long it has run, the machine (the status page's header) */
    char host[256] = "";
    if (gethostname(host, sizeof(host) - 1) < 0)
        host[0] = '\0';
    evbuffer_add_printf(b, ",\"atc\":{\"version\":\"%s\",\"uptime_s\":%llu,", ATC_VERSION,
                        (unsigned long long)((now_ms - srv->started_ms) / 1000));
    atc_json_key_string(b, "host", host);
    evbuffer_add(b, "}}\n", 3);
    figures_free(&f);
    atc_http_reply_json(req, 200, b);
    evbuffer_free(b);
}

/* /metrics: this process's counters, and what the workers copied of theirs. */
static void send_metrics(struct atc_server *srv, struct evbuffer *b)
{
    struct figures f;
    figures_take(srv, &f, true);
    struct atc_metrics_sources src = {.table = srv->table,
                                      .nworkers = srv->group.nworkers,
                                      .worker_parks = srv->group.parks,
                                      .endpoints_removed = atc_table_swap_retired(srv->swap),
                                      .idle = f.idle,
                                      .health = srv->health,
                                      .cluster = srv->cluster,
                                      .limits = srv->limits,
                                      .kv = srv->kv};
    src.npolicies = figures_policies(&f, srv->group.nworkers, src.policies);
    src.nadmissions = figures_admissions(&f, srv->group.nworkers, src.admissions);
    struct atc_worker_stats totals;
    figures_totals(&f, srv->group.nworkers, &totals, &src.active);
    for (unsigned i = 0; i < srv->group.nworkers; i++)
        src.worker_requests[i] = f.w[i].stats.requests_total;
    atc_metrics_render(srv->metrics, &src, b);
    atc_discovery_metrics(srv, b);
    figures_free(&f);
}

static void send_policy(struct atc_server *srv, struct atc_http_req *req)
{
    struct evbuffer *b = evbuffer_new();
    struct atc_policy_runtime *rts[ATC_MAX_WORKERS];
    struct figures f;
    figures_take(srv, &f, true);
    size_t n = figures_policies(&f, srv->group.nworkers, rts);
    if (n > 0) {
        /* The runtime's object, and what only the server knows: whether the files are watched, and a
         * canary waiting for them to change. */
        struct evbuffer *pb = evbuffer_new();
        atc_policy_status_json(rts, n, pb);
        size_t len = evbuffer_get_length(pb);
        const char *s = (const char *)evbuffer_pullup(pb, -1);
        while (len > 0 && s[len - 1] != '}')
            len--;
        double share;
        uint64_t window_ms;
        if (len > 0) {
            evbuffer_add(b, s, len - 1);
            evbuffer_add_printf(b, ",\"watch\":%s,\"canary_armed\":",
                                atc_policy_watching(srv->group.workers[0].policy) ? "true" : "false");
            if (atc_rollout_canary_armed(srv, &share, &window_ms))
                evbuffer_add_printf(b, "{\"share\":%g,\"window_ms\":%llu}}\n", share,
                                    (unsigned long long)window_ms);
            else
                evbuffer_add_printf(b, "null}\n");
        }
        evbuffer_free(pb);
    } else {
        evbuffer_add_printf(b, "{\"version\":0,\"enabled\":false}\n");
    }
    figures_free(&f);
    atc_http_reply_json(req, 200, b);
    evbuffer_free(b);
}

/* An admin request answered once a reload, canary or shadow is built (off the serving threads: the request
 * waits, the workers do not); forgotten if its client leaves. */
struct pending_reload {
    struct atc_http_req *req; /* NULL once the client left */
    const char *what;         /* more of the answer's JSON, after the version */
};

static void on_reload_client_gone(void *arg)
{
    struct pending_reload *p = arg;
    p->req = NULL;
}

static const struct atc_http_req_callbacks reload_client_cb = {.on_gone = on_reload_client_gone};

static struct pending_reload *pending(struct atc_http_req *req, const char *what)
{
    struct pending_reload *p = malloc(sizeof(*p));
    if (p == NULL) {
        admin_error(req, 500, "server_error", "out_of_memory", "out of memory", 0);
        return NULL;
    }
    p->req = req;
    p->what = what;
    atc_http_req_set_callbacks(req, &reload_client_cb, p);
    return p;
}

/* 200 {"version": N, ...what} or 422 with the error; @p arg is a pending_reload. */
static void answer_version(void *arg, uint64_t version, const char *err)
{
    struct pending_reload *p = arg;
    struct atc_http_req *req = p->req;
    const char *what = p->what;
    free(p);
    if (req == NULL)
        return; /* nobody is waiting for the answer any more; the reload happened all the same */
    atc_http_req_set_callbacks(req, NULL, NULL);
    if (err != NULL || version == 0) {
        admin_error(req, 422, "invalid_request_error", "policy_reload_failed", err ? err : "failed", 0);
        return;
    }
    struct evbuffer *b = evbuffer_new();
    evbuffer_add_printf(b, "{\"version\":%llu%s}\n", (unsigned long long)version, what);
    atc_http_reply_json(req, 200, b);
    evbuffer_free(b);
}

/* The request's JSON body into @p j: 0; 1 when it has none; -1 when it was answered with a 400. */
static int json_body(struct atc_http_req *req, struct atc_json *j)
{
    size_t len = 0;
    const char *body = atc_http_req_body(req, &len);
    *j = (struct atc_json){0};
    if (body == NULL || len == 0)
        return 1;
    const char *err = NULL;
    if (len > 65536 || atc_json_parse(j, body, len, &err) < 0 || atc_json_type(j, 0) != ATC_JSON_OBJECT) {
        char msg[160];
        snprintf(msg, sizeof(msg), "the body must be a JSON object%s%s", err ? ": " : "", err ? err : "");
        admin_error(req, 400, "invalid_request_error", "invalid_json", msg, 0);
        atc_json_dispose(j);
        return -1;
    }
    return 0;
}

/* 200 with the new version when the reload took; 422 with the error (file:line) when it did not, and
 * the old version keeps routing. With {"canary": SHARE, "window": DURATION} the new version decides
 * that share of the requests until its window ends and it is judged (core/rollout.h). */
static void reload_policy(struct atc_server *srv, struct atc_http_req *req)
{
    if (atc_http_req_method(req) != ATC_HTTP_POST) {
        admin_error(req, 405, "invalid_request_error", "method_not_allowed", "use POST", 0);
        return;
    }
    if (srv->group.workers[0].policy == NULL) {
        admin_error(req, 422, "invalid_request_error", "no_policy", "the config has no policy: section", 0);
        return;
    }
    struct atc_json j;
    int rc = json_body(req, &j);
    if (rc < 0)
        return;
    int at = rc == 0 ? atc_json_get(&j, 0, "canary") : -1;
    if (at < 0) {
        atc_json_dispose(&j);
        struct pending_reload *p = pending(req, "");
        if (p != NULL)
            atc_server_reload_policy(srv, answer_version, p);
        return;
    }
    double share = 0;
    uint64_t window_ms = 300000;
    char window[32] = "";
    int w = atc_json_get(&j, 0, "window");
    bool ok = atc_json_number(&j, at, &share) && share > 0 && share <= 1 &&
              (w < 0 || (atc_json_string(&j, w, window, sizeof(window), NULL) == 0 &&
                         atc_parse_duration_ms(window, &window_ms) == 0 && window_ms > 0));
    atc_json_dispose(&j);
    if (!ok) {
        admin_error(req, 400, "invalid_request_error", "invalid_canary",
                    "canary must be a share in (0, 1] and window a duration such as \"5m\"", 0);
        return;
    }
    struct pending_reload *p = pending(req, ",\"canary\":true");
    if (p == NULL || atc_rollout_canary(srv, share, window_ms, answer_version, p) == 0)
        return;
    /* Armed (policy.watch is on): the next change of the files loads as the canary. */
    atc_http_req_set_callbacks(req, NULL, NULL);
    free(p);
    struct evbuffer *b = evbuffer_new();
    evbuffer_add_printf(b,
                        "{\"armed\":true,\"share\":%g,\"window_ms\":%llu,\"note\":\"the next change of the "
                        "policy's files loads as the canary; the current version keeps routing the rest\"}\n",
                        share, (unsigned long long)window_ms);
    atc_http_reply_json(req, 202, b);
    evbuffer_free(b);
}

/* POST /admin/policy/promote, /admin/policy/rollback: ends the canary now. */
static void end_canary(struct atc_server *srv, struct atc_http_req *req, enum atc_rollout_end how)
{
    if (atc_http_req_method(req) != ATC_HTTP_POST) {
        admin_error(req, 405, "invalid_request_error", "method_not_allowed", "use POST", 0);
        return;
    }
    char why[640];
    double share;
    uint64_t window_ms;
    if (how == ATC_ROLLOUT_ROLLBACK && atc_rollout_canary_armed(srv, &share, &window_ms) &&
        atc_policy_canary_version(srv->group.workers[0].policy) == 0) {
        srv->canary_armed_share = 0;
        atc_info("policy canary disarmed: a change of the policy's files reloads it again");
        static const char body[] = "{\"disarmed\":true}\n";
        atc_http_reply(req, 200, "application/json", NULL, body, sizeof(body) - 1);
        return;
    }
    uint64_t version = atc_rollout_canary_end(srv, how, why, sizeof(why));
    if (version == 0) {
        admin_error(req, 409, "invalid_request_error", "no_canary", why, 0);
        return;
    }
    struct evbuffer *b = evbuffer_new();
    evbuffer_add_printf(b, "{\"canary\":%llu,\"promoted\":%s,\"why\":\"", (unsigned long long)version,
                        how == ATC_ROLLOUT_PROMOTE ? "true" : "false");
    atc_json_escape(b, why, strlen(why));
    evbuffer_add_printf(b, "\"}\n");
    atc_http_reply_json(req, 200, b);
    evbuffer_free(b);
}

static void on_shadow_cleared(void *arg, uint64_t version, const char *err)
{
    answer_version(arg, err != NULL ? 0 : 1, err);
}

/* POST /admin/policy/shadow {"entry": FILE, "sample": 0-1} loads a shadow; POST /admin/policy/shadow/clear
 * removes it (POST both: the admin port takes GET, HEAD and POST only). */
static void shadow_policy(struct atc_server *srv, struct atc_http_req *req, bool clear)
{
    if (atc_http_req_method(req) != ATC_HTTP_POST) {
        admin_error(req, 405, "invalid_request_error", "method_not_allowed", "use POST", 0);
        return;
    }
    if (clear) {
        struct pending_reload *p = pending(req, ",\"shadow\":false");
        if (p != NULL)
            atc_rollout_shadow(srv, NULL, 0, on_shadow_cleared, p);
        return;
    }
    struct atc_json j;
    int rc = json_body(req, &j);
    if (rc < 0)
        return;
    char entry[1024] = "";
    double sample = 1;
    int e = rc == 0 ? atc_json_get(&j, 0, "entry") : -1, s = rc == 0 ? atc_json_get(&j, 0, "sample") : -1;
    bool ok = e >= 0 && atc_json_string(&j, e, entry, sizeof(entry), NULL) == 0 && entry[0] != '\0' &&
              (s < 0 || (atc_json_number(&j, s, &sample) && sample >= 0 && sample <= 1));
    atc_json_dispose(&j);
    if (!ok) {
        admin_error(req, 400, "invalid_request_error", "invalid_shadow",
                    "the body must be {\"entry\": \"FILE.lua\", \"sample\": 0-1}", 0);
        return;
    }
    struct pending_reload *p = pending(req, ",\"shadow\":true");
    if (p != NULL)
        atc_rollout_shadow(srv, entry, sample, answer_version, p);
}

/* POST /admin/endpoints: {"model", "id", "url", and optionally "capacity", "weight", "version", "tags",
 * "token_budget", "max_server_queue", "kv_tokens"} adds an endpoint to a model with the model's settings
 * (config/config_endpoint.h). 201 with the endpoint, or 400 (the body), 404 (no such model), 409 (the id
 * is taken), 422 (the address), each with the reason. */
static void add_endpoint(struct atc_server *srv, struct atc_http_req *req)
{
    struct atc_json j;
    int got = json_body(req, &j);
    if (got != 0) {
        if (got > 0)
            admin_error(req, 400, "invalid_request_error", "invalid_json", "a JSON object is required", 0);
        return;
    }
    char model[256], id[256], url[512], version[256];
    const char *bad = NULL, *why = NULL;
    static const char *const known[] = {"model",   "id",   "url",          "capacity",         "weight",
                                        "version", "tags", "token_budget", "max_server_queue", "kv_tokens"};
    for (int k = 1, n = atc_json_count(&j, 0); n > 0 && bad == NULL; n--, k = atc_json_next(&j, k)) {
        bool ok = false;
        for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
            ok |= atc_json_is(&j, k, known[i]);
        if (!ok)
            bad = "unknown field (known: model, id, url, capacity, weight, version, tags, token_budget, "
                  "max_server_queue, kv_tokens)";
    }
    int fm = atc_json_get(&j, 0, "model"), fi = atc_json_get(&j, 0, "id"), fu = atc_json_get(&j, 0, "url");
    if (bad == NULL &&
        (fm < 0 || atc_json_string(&j, fm, model, sizeof(model), NULL) < 0 || model[0] == '\0'))
        bad = "'model' must be a non-empty string";
    if (bad == NULL && (fi < 0 || atc_json_string(&j, fi, id, sizeof(id), NULL) < 0 || id[0] == '\0' ||
                        strchr(id, '/') != NULL))
        bad = "'id' must be a non-empty string without '/'";
    if (bad == NULL && (fu < 0 || atc_json_string(&j, fu, url, sizeof(url), NULL) < 0))
        bad = "'url' must be a string: http://host:port";
    struct atc_model_config *m = bad == NULL ? atc_config_model(srv->cfg, model) : NULL;
    if (bad == NULL && m == NULL) {
        atc_json_dispose(&j);
        admin_error(req, 404, "invalid_request_error", "model_not_found", "no model with this name", 0);
        return;
    }
    struct atc_endpoint_config ec = {0};
    if (bad == NULL && atc_config_endpoint_init(&ec, srv->cfg, m, id, url, ATC_ORIGIN_API, &why) < 0)
        bad = why;
    static const struct {
        const char *key;
        uint64_t max;
        size_t at;
    } nums[] = {
        {"capacity", 1000000, offsetof(struct atc_endpoint_config, capacity)},
        {"weight", 1000000, offsetof(struct atc_endpoint_config, weight)},
        {"max_server_queue", 1000000, offsetof(struct atc_endpoint_config, max_server_queue)},
    };
    for (size_t i = 0; bad == NULL && i < sizeof(nums) / sizeof(nums[0]); i++) {
        int f = atc_json_get(&j, 0, nums[i].key);
        uint64_t v;
        if (f >= 0 && (!atc_json_uint(&j, f, nums[i].max, &v) || (v == 0 && i < 2)))
            bad = i < 2 ? "'capacity' and 'weight' must be whole numbers from 1"
                        : "'max_server_queue' must be a whole number";
        else if (f >= 0)
            *(unsigned *)((char *)&ec + nums[i].at) = (unsigned)v;
    }
    int f;
    if (bad == NULL && (f = atc_json_get(&j, 0, "token_budget")) >= 0 &&
        !atc_json_uint(&j, f, UINT64_MAX / 2, &ec.token_budget))
        bad = "'token_budget' must be a whole number";
    if (bad == NULL && (f = atc_json_get(&j, 0, "kv_tokens")) >= 0 &&
        !atc_json_uint(&j, f, UINT64_MAX / 2, &ec.kv_tokens))
        bad = "'kv_tokens' must be a whole number";
    if (bad == NULL && (f = atc_json_get(&j, 0, "version")) >= 0 &&
        (atc_json_string(&j, f, version, sizeof(version), NULL) < 0 ||
         (ec.version = strdup(version)) == NULL))
        bad = "'version' must be a string";
    if (bad == NULL && (f = atc_json_get(&j, 0, "tags")) >= 0) {
        int n = atc_json_type(&j, f) == ATC_JSON_ARRAY ? atc_json_count(&j, f) : -1;
        if (n < 0 || (n > 0 && (ec.tags = calloc((size_t)n, sizeof(char *))) == NULL))
            bad = "'tags' must be an array of strings";
        for (int k = f + 1; bad == NULL && n > 0; n--, k = atc_json_next(&j, k)) {
            char tag[256];
            if (atc_json_string(&j, k, tag, sizeof(tag), NULL) < 0 ||
                (ec.tags[ec.ntags] = strdup(tag)) == NULL)
                bad = "'tags' must be an array of strings";
            else
                ec.ntags++;
        }
    }
    atc_json_dispose(&j);
    if (bad != NULL) {
        atc_endpoint_config_dispose(&ec);
        admin_error(req, 400, "invalid_request_error", "invalid_endpoint", bad, 0);
        return;
    }
    if (atc_server_add_endpoint(srv, &ec, &why) < 0) {
        atc_endpoint_config_dispose(&ec);
        if (why == atc_server_duplicate)
            admin_error(req, 409, "invalid_request_error", "duplicate_endpoint", why, 0);
        else
            admin_error(req, 422, "invalid_request_error", "endpoint_not_added", why, 0);
        return;
    }
    struct atc_endpoint *ep = atc_endpoint_table_find(srv->table, id);
    struct evbuffer *b = evbuffer_new();
    evbuffer_add_printf(b, "{");
    atc_json_key_string(b, "id", ep->id);
    evbuffer_add(b, ",", 1);
    atc_json_key_string(b, "model", ep->model);
    evbuffer_add(b, ",", 1);
    atc_json_key_string(b, "url", ep->url);
    evbuffer_add_printf(b, ",\"origin\":\"api\",\"capacity\":%u,\"state\":\"%s\"}\n", ep->capacity,
                        ep->health != NULL ? atc_health_state_name(ep->health->state) : "unknown");
    atc_http_reply_json(req, 201, b);
    evbuffer_free(b);
}

/* DELETE /admin/endpoints/<id>: the endpoint leaves the table at once (no new requests) and its
 * requests in flight finish before it is freed. 200 with what is still in flight, 404, or 409 for a
 * simulated one. */
static void remove_endpoint(struct atc_server *srv, struct atc_http_req *req, const char *id)
{
    struct atc_endpoint *ep = atc_endpoint_table_find(srv->table, id);
    unsigned inflight = ep != NULL ? atomic_load(&ep->inflight) : 0;
    const char *why = NULL;
    if (atc_server_remove_endpoint(srv, id, &why) < 0) {
        if (why == atc_server_simulated)
            admin_error(req, 409, "invalid_request_error", "endpoint_not_removable", why, 0);
        else
            admin_error(req, 404, "invalid_request_error", "endpoint_not_found", why, 0);
        return;
    }
    struct evbuffer *b = evbuffer_new();
    evbuffer_add_printf(b, "{");
    atc_json_key_string(b, "id", id);
    evbuffer_add_printf(b, ",\"removed\":true,\"draining_inflight\":%u}\n", inflight);
    atc_http_reply_json(req, 200, b);
    evbuffer_free(b);
}

/* POST /admin/endpoints/<id>/drain or /enable: drain stops new traffic to the endpoint and lets its
 * in-flight requests finish; enable undoes it. Answers the endpoint's id, state and in-flight count. */
static void drain_endpoint(struct atc_server *srv, struct atc_http_req *req, const char *rest)
{
    const char *slash = strrchr(rest, '/');
    if (slash == NULL && atc_http_req_method(req) == ATC_HTTP_DELETE) {
        char id[256];
        long idlen = percent_decode(rest, id, sizeof(id));
        if (idlen < 0 || strlen(id) != (size_t)idlen || strchr(id, '/') != NULL) {
            admin_error(req, 404, "invalid_request_error", "endpoint_not_found", "no endpoint with this id",
                        0);
            return;
        }
        remove_endpoint(srv, req, id);
        return;
    }
    bool drain = slash != NULL && strcmp(slash, "/drain") == 0;
    if (slash == NULL || slash == rest || (!drain && strcmp(slash, "/enable") != 0)) {
        admin_error(req, 404, "invalid_request_error", "not_found", "no such admin route", 0);
        return;
    }
    char raw[256], id[256];
    snprintf(raw, sizeof(raw), "%.*s", (int)(slash - rest), rest);
    long idlen = percent_decode(raw, id, sizeof(id)); /* ids are percent-encoded in paths */
    /* an id that decodes to a NUL or a '/' names nothing: "ID%00x" must not drain ID */
    bool bad = idlen < 0 || strlen(id) != (size_t)idlen || strchr(id, '/') != NULL;
    struct atc_endpoint *ep = !bad ? atc_endpoint_table_find(srv->table, id) : NULL;
    if (ep == NULL) {
        admin_error(req, 404, "invalid_request_error", "endpoint_not_found", "no endpoint with this id", 0);
        return;
    }
    if (atc_http_req_method(req) != ATC_HTTP_POST) {
        admin_error(req, 405, "invalid_request_error", "method_not_allowed", "use POST", 0);
        return;
    }
    atc_health_set_drained(srv->health, ep, drain);
    struct evbuffer *b = evbuffer_new();
    evbuffer_add_printf(b, "{\"id\":\"");
    atc_json_escape(b, ep->id, strlen(ep->id));
    evbuffer_add_printf(b, "\",\"state\":\"%s\",\"inflight\":%u}\n",
                        ep->health != NULL ? atc_health_state_name(ep->health->state) : "unknown",
                        ep->inflight);
    atc_http_reply_json(req, 200, b);
    evbuffer_free(b);
}

/* GET /admin/record: the trace recorder's counters (record:). */
static void send_record(struct atc_server *srv, struct atc_http_req *req)
{
    struct evbuffer *b = evbuffer_new();
    if (srv->recorder == NULL) {
        evbuffer_add_printf(b, "{\"enabled\":false}\n");
    } else {
        struct atc_recorder_stats st;
        atc_recorder_stats(srv->recorder, &st);
        evbuffer_add_printf(b,
                            "{\"enabled\":true,\"recorded\":%llu,\"written\":%llu,\"dropped\":%llu,"
                            "\"sampled_out\":%llu,\"write_errors\":%llu,\"files\":%llu,\"bytes\":%llu}\n",
                            (unsigned long long)st.recorded, (unsigned long long)st.written,
                            (unsigned long long)st.dropped, (unsigned long long)st.sampled_out,
                            (unsigned long long)st.write_errors, (unsigned long long)st.files,
                            (unsigned long long)st.bytes);
    }
    atc_http_reply_json(req, 200, b);
    evbuffer_free(b);
}

/* POST /admin/config/reload: 200 with a summary, or 422 with every error (nothing changed). */
static void reload_config(struct atc_server *srv, struct atc_http_req *req)
{
    if (atc_http_req_method(req) != ATC_HTTP_POST) {
        admin_error(req, 405, "invalid_request_error", "method_not_allowed", "use POST", 0);
        return;
    }
    char *msg = NULL;
    if (atc_server_reload_config(srv, &msg) < 0) {
        admin_error(req, 422, "invalid_request_error", "config_reload_failed", msg ? msg : "failed", 0);
        free(msg);
        return;
    }
    struct evbuffer *b = evbuffer_new();
    evbuffer_add_printf(b, "{\"reloaded\":true,\"summary\":\"");
    if (msg != NULL)
        atc_json_escape(b, msg, strlen(msg));
    evbuffer_add_printf(b, "\"}\n");
    atc_http_reply_json(req, 200, b);
    evbuffer_free(b);
    free(msg);
}

/* The effective configuration (no secrets). */
static void send_config(struct atc_server *srv, struct atc_http_req *req)
{
    const struct atc_config *c = srv->cfg;
    struct evbuffer *b = evbuffer_new();
    evbuffer_add(b, "{", 1);
    atc_json_key_string(b, "path", c->path);
    evbuffer_add_printf(b, ",\"listen\":\"%s:%u\",\"admin\":\"%s:%u\",\"admin_token\":%s,", c->listen_host,
                        (unsigned)srv->front_port, c->admin_host, (unsigned)srv->admin_port,
                        c->admin_token != NULL ? "\"(set)\"" : "null");
    atc_json_key_string(b, "access_log", c->access_log);
    evbuffer_add_printf(
        b,
        ",\"workers\":%u,\"max_body\":%zu,\"drain_timeout_ms\":%llu,\"client_timeout_ms\":%llu,"
        "\"upstream\":{\"connect_timeout_ms\":%llu,\"first_byte_timeout_ms\":%llu,"
        "\"idle_timeout_ms\":%llu,\"token_timeout_ms\":%llu,\"tries\":%u,\"keepalive\":%u},"
        "\"admission\":{\"queue\":%u,\"deadline_ms\":%llu,\"max_deadline_ms\":%llu,\"aging_ms\":%llu},"
        "\"policy\":",
        srv->group.nworkers, c->max_body, (unsigned long long)c->drain_timeout_ms,
        (unsigned long long)c->client_timeout_ms, (unsigned long long)c->upstream.connect_timeout_ms,
        (unsigned long long)c->upstream.first_byte_timeout_ms,
        (unsigned long long)c->upstream.idle_timeout_ms, (unsigned long long)c->upstream.token_timeout_ms,
        c->upstream.tries, c->upstream.keepalive,
        c->admission.queue, (unsigned long long)c->admission.deadline_ms,
        (unsigned long long)c->admission.max_deadline_ms, (unsigned long long)c->admission.aging_ms);
    if (c->policy.enabled) {
        evbuffer_add(b, "{", 1);
        atc_json_key_string(b, "entry", c->policy.entry);
        evbuffer_add_printf(
            b, ",\"budget_us\":%llu,\"memory\":%zu,\"jit\":%s,\"watch\":%s,\"rollback_after\":%u}",
            (unsigned long long)c->policy.budget_us, c->policy.memory, c->policy.jit ? "true" : "false",
            c->policy.watch ? "true" : "false", c->policy.rollback_after);
    } else {
        evbuffer_add(b, "null", 4);
    }
    evbuffer_add_printf(b, ",\"models\":[");
    for (size_t i = 0; i < srv->table->nmodels; i++) {
        const struct atc_model *m = &srv->table->models[i];
        evbuffer_add_printf(b, "%s{", i ? "," : "");
        atc_json_key_string(b, "name", m->name);
        evbuffer_add_printf(b, ",\"endpoints\":[");
        for (size_t j = 0; j < m->nendpoints; j++) {
            evbuffer_add_printf(b, "%s\"", j ? "," : "");
            atc_json_escape(b, m->endpoints[j]->id, strlen(m->endpoints[j]->id));
            evbuffer_add(b, "\"", 1);
        }
        evbuffer_add(b, "]}", 2);
    }
    evbuffer_add(b, "]}\n", 3);
    atc_http_reply_json(req, 200, b);
    evbuffer_free(b);
}

/* GET /: the status page. It holds no data (its script reads the admin API with the token), so it needs
 * no token itself; the rules of cross_site still apply to it. Framing is refused, so another site cannot
 * lay the page's drain buttons under a click of its own, and the page may fetch from this port only. */
static void send_status_page(struct atc_http_req *req)
{
    enum atc_http_method cmd = atc_http_req_method(req);
    if (cmd != ATC_HTTP_GET && cmd != ATC_HTTP_HEAD) {
        admin_error(req, 405, "invalid_request_error", "method_not_allowed", "use GET", 0);
        return;
    }
    atc_http_reply(req, 200, "text/html; charset=utf-8",
                   "Cache-Control: no-store\r\n"
                   "X-Frame-Options: DENY\r\n"
                   "Content-Security-Policy: default-src 'none'; script-src 'unsafe-inline'; "
                   "style-src 'unsafe-inline'; connect-src 'self'; img-src data:; base-uri 'none'; "
                   "form-action 'none'; frame-ancestors 'none'\r\n"
                   "Referrer-Policy: no-referrer\r\n",
                   atc_status_page_html, atc_status_page_html_len);
}

/* With admin_token set, every route but /health and / needs "Authorization: Bearer <token>". The
 * comparison takes the same time wherever the first difference is, so timing does not reveal the token. */
static bool authorized(const struct atc_server *srv, struct atc_http_req *req)
{
    const char *token = srv->cfg->admin_token;
    if (token == NULL)
        return true;
    const char *auth = atc_http_req_header(req, "Authorization");
    if (auth == NULL || strncasecmp(auth, "Bearer ", 7) != 0) /* the scheme is case-insensitive (RFC 7235) */
        return false;
    const char *given = auth + 7;
    size_t n = strlen(token), m = strlen(given);
    unsigned char diff = (unsigned char)(n != m);
    for (size_t i = 0; i < n; i++)
        diff |= (unsigned char)(token[i] ^ given[i < m ? i : 0]);
    return diff == 0;
}

/* The host part of a Host authority ("[::1]:8081" -> "::1") into @p out; -1 when it is not a host with
 * an optional ":port" ("[::1].rebind.example", "a:b:c", a name too long for @p out). */
static int host_part(const char *authority, char *out, size_t size)
{
    const char *start = authority, *end;
    if (*authority == '[') {
        start++;
        end = strchr(start, ']');
        if (end == NULL)
            return -1;
    } else {
        end = strchr(start, ':');
        if (end == NULL)
            end = start + strlen(start);
    }
    const char *port = end + (*authority == '[');
    if (*port == ':')
        port += 1 + strspn(port + 1, "0123456789");
    if (*port != '\0' || (size_t)(end - start) >= size)
        return -1;
    memcpy(out, start, (size_t)(end - start));
    out[end - start] = '\0';
    return 0;
}

/* The name is loopback if it is "localhost" or an address literal in 127.0.0.0/8 or ::1, parsed as an
 * address: a prefix test let "127.0.0.1.rebind.example", a name anyone can point at 127.0.0.1, pass. */
static bool is_loopback_name(const char *host)
{
    struct in_addr a4;
    struct in6_addr a6;
    if (strcasecmp(host, "localhost") == 0)
        return true;
    if (inet_pton(AF_INET, host, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    return inet_pton(AF_INET6, host, &a6) == 1 && IN6_IS_ADDR_LOOPBACK(&a6);
}

/* Without admin_token the admin API is only as safe as who can reach it, and it listens on loopback
 * (atc check refuses another address then). A web page open on the operator's machine can still reach
 * loopback: DNS rebinding (a page of evil.example whose name now resolves to 127.0.0.1) sends a Host
 * that is not ours, and a cross-site "simple" request (a form POST, or fetch with a text/plain body)
 * carries a foreign Origin or one of the three content types a browser sends without asking. Either is
 * refused; curl, atc's CLI and scripts send neither. With a token, the token decides. */
static const char *cross_site(const struct atc_server *srv, struct atc_http_req *req)
{
    if (srv->cfg->admin_token != NULL)
        return NULL;
    const char *host = atc_http_req_header(req, "Host");
    char name[256];
    if (host != NULL) {
        if (host_part(host, name, sizeof(name)) < 0 ||
            (!is_loopback_name(name) && strcasecmp(name, srv->cfg->admin_host) != 0))
            return "the Host header names another site (DNS rebinding?)";
    }
    const char *origin = atc_http_req_header(req, "Origin");
    if (origin != NULL) {
        const char *sep = strstr(origin, "://");
        if (host == NULL || sep == NULL || strcasecmp(sep + 3, host) != 0)
            return "a request from another origin";
    }
    const char *type = atc_http_req_header(req, "Content-Type");
    if (atc_http_req_method(req) == ATC_HTTP_POST && type != NULL &&
        (strncasecmp(type, "text/plain", 10) == 0 ||
         strncasecmp(type, "application/x-www-form-urlencoded", 33) == 0 ||
         strncasecmp(type, "multipart/form-data", 19) == 0))
        return "a POST a web page could send (text/plain or form data)";
    return NULL;
}

void atc_admin_handle(struct atc_http_req *req, void *arg)
{
    struct atc_server *srv = arg;
    const char *path = atc_http_req_path(req);
    const char *why = cross_site(srv, req);
    if (why != NULL) {
        atc_warn("admin API: refused %s %s: %s", atc_http_req_method(req) == ATC_HTTP_POST ? "POST" : "GET",
                 path, why);
        admin_error(req, 403, "permission_error", "cross_site_request", why, 0);
        return;
    }
    if (strcmp(path, "/") == 0) {
        send_status_page(req);
        return;
    }
    if (strcmp(path, "/health") != 0 && !authorized(srv, req)) {
        atc_http_reply_error(req, 401, "authentication_error", "invalid_admin_token",
                             "the admin API needs Authorization: Bearer <admin_token>", 0,
                             "WWW-Authenticate: Bearer\r\n");
        return;
    }
    if (strcmp(path, "/admin/config") == 0) {
        send_config(srv, req);
    } else if (strcmp(path, "/admin/endpoints") == 0) {
        if (atc_http_req_method(req) == ATC_HTTP_POST)
            add_endpoint(srv, req);
        else
            send_endpoints(srv, req);
    } else if (strncmp(path, "/admin/endpoints/", 17) == 0) {
        drain_endpoint(srv, req, path + 17);
    } else if (strcmp(path, "/metrics") == 0) {
        struct evbuffer *b = evbuffer_new();
        send_metrics(srv, b);
        size_t len = evbuffer_get_length(b);
        atc_http_reply(req, 200, "text/plain; version=0.0.4", NULL, evbuffer_pullup(b, -1), len);
        evbuffer_free(b);
    } else if (strcmp(path, "/admin/policy") == 0) {
        send_policy(srv, req);
    } else if (strcmp(path, "/admin/config/reload") == 0) {
        reload_config(srv, req);
    } else if (strcmp(path, "/admin/policy/reload") == 0) {
        reload_policy(srv, req);
    } else if (strcmp(path, "/admin/cluster") == 0 || strcmp(path, "/admin/limits") == 0) {
        /* main thread: the cluster is its own; the limits have their lock */
        struct evbuffer *b = evbuffer_new();
        bool cluster = path[7] == 'c';
        if (cluster && srv->cluster != NULL)
            atc_cluster_json(srv->cluster, b);
        else if (!cluster && srv->limits != NULL)
            atc_limits_json(srv->limits, b, atc_wall_us() / 1000);
        else
            evbuffer_add_printf(b, cluster ? "{\"mode\": \"off\"}" : "{\"mode\": \"off\", \"tenants\": []}");
        evbuffer_add_printf(b, "\n");
        atc_http_reply_json(req, 200, b);
        evbuffer_free(b);
    } else if (strcmp(path, "/admin/policy/promote") == 0) {
        end_canary(srv, req, ATC_ROLLOUT_PROMOTE);
    } else if (strcmp(path, "/admin/policy/rollback") == 0) {
        end_canary(srv, req, ATC_ROLLOUT_ROLLBACK);
    } else if (strcmp(path, "/admin/policy/shadow") == 0) {
        shadow_policy(srv, req, false);
    } else if (strcmp(path, "/admin/policy/shadow/clear") == 0) {
        shadow_policy(srv, req, true);
    } else if (strcmp(path, "/admin/record") == 0) {
        send_record(srv, req);
    } else if (strcmp(path, "/health") == 0) {
        struct evbuffer *b = evbuffer_new();
        evbuffer_add_printf(b, "{\"status\":\"%s\"}\n", srv->draining ? "draining" : "ok");
        atc_http_reply_json(req, 200, b);
        evbuffer_free(b);
    } else {
        admin_error(req, 404, "invalid_request_error", "not_found", "no such admin route", 0);
    }
}
