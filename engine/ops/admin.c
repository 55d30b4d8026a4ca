#include "ops/admin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <event2/buffer.h>
#include <event2/http.h>

#include "fleet/admission.h"
#include "core/config.h"
#include "core/log.h"
#include "fleet/endpoint.h"
#include "fleet/health.h"
#include "fleet/health_report.h"
#include "http/request_vet.h"
#include "http/http_util.h"
#include "ops/metrics.h"
#include "policy/policy.h"
#include "trace/recorder.h"
#include "core/server.h"
#include "http/upstream.h"
#include "core/worker.h"

static void json_str(struct evbuffer *out, const char *key, const char *value)
{
    evbuffer_add_printf(out, "\"%s\":", key);
    if (value == NULL) {
        evbuffer_add(out, "null", 4);
        return;
    }
    evbuffer_add(out, "\"", 1);
    atc_json_escape(out, value, strlen(value));
    evbuffer_add(out, "\"", 1);
}

static size_t idle_connections(const struct atc_server *srv, const struct atc_endpoint *ep)
{
    size_t n = 0;
    for (unsigned i = 0; i < srv->group.nworkers; i++)
        n += ep->pools[i] != NULL ? atc_upstream_pool_idle(ep->pools[i]) : 0;
    return n;
}

/* Every worker's admission queue (none when admission.queue is 0). */
static size_t admissions(const struct atc_server *srv, struct atc_admission **out)
{
    size_t n = 0;
    for (unsigned i = 0; i < srv->group.nworkers; i++)
        if (srv->group.workers[i].admission != NULL)
            out[n++] = srv->group.workers[i].admission;
    return n;
}

/* Called with the workers paused: their counters and queues hold still. */
static void send_endpoints(struct atc_server *srv, struct evhttp_request *req)
{
    struct evbuffer *b = evbuffer_new();
    evbuffer_add_printf(b, "{\"endpoints\":[");
    for (size_t i = 0; i < srv->table->nendpoints; i++) {
        const struct atc_endpoint *ep = srv->table->endpoints[i];
        evbuffer_add_printf(b, "%s{", i ? "," : "");
        json_str(b, "id", ep->id);
        evbuffer_add(b, ",", 1);
        json_str(b, "model", ep->model);
        evbuffer_add(b, ",", 1);
        json_str(b, "url", ep->url);
        evbuffer_add(b, ",", 1);
        json_str(b, "version", ep->version);
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
                            idle_connections(srv, ep));
        atc_health_endpoint_json(ep, b); /* state, checks, last error, scraped load */
        evbuffer_add(b, "}", 1);
    }
    struct atc_worker_stats totals;
    const struct atc_worker_stats *s = &totals;
    unsigned active;
    atc_server_totals(srv, &totals, &active);
    struct atc_admission *adms[ATC_MAX_WORKERS];
    size_t nadm = admissions(srv, adms);
    evbuffer_add_printf(b, "],\"queues\":");
    if (nadm > 0)
        atc_admission_status_json(adms, nadm, b);
    else
        evbuffer_add(b, "null", 4);
    evbuffer_add_printf(b, ",\"workers\":[");
    for (unsigned i = 0; i < srv->group.nworkers; i++) {
        const struct atc_worker *w = &srv->group.workers[i];
        evbuffer_add_printf(b, "%s{\"id\":%u,\"requests_total\":%llu,\"active\":%u,\"policy_version\":%llu}",
                            i ? "," : "", i, (unsigned long long)w->stats.requests_total, w->active,
                            (unsigned long long)(w->policy != NULL ? atc_policy_version(w->policy) : 0));
    }
    evbuffer_add(b, "]", 1);
    evbuffer_add_printf(b,
                        ",\"requests_total\":%llu,\"responses_total\":%llu,\"client_gone_total\":%llu,"
                        "\"retries_total\":%llu,\"upstream_errors_total\":%llu,\"active\":%u,\"health\":",
                        (unsigned long long)s->requests_total, (unsigned long long)s->responses_total,
                        (unsigned long long)s->client_gone_total, (unsigned long long)s->retries_total,
                        (unsigned long long)s->upstream_errors_total, active);
    atc_health_status_json(srv->health, b);
    evbuffer_add(b, "}\n", 2);
    atc_http_send_json(req, 200, b);
    evbuffer_free(b);
}

static void send_policy(struct atc_server *srv, struct evhttp_request *req)
{
    struct evbuffer *b = evbuffer_new();
    struct atc_policy_runtime *rts[ATC_MAX_WORKERS];
    atc_workers_pause(&srv->group);
    size_t n = atc_server_policies(srv, rts);
    if (n > 0)
        atc_policy_status_json(rts, n, b);
    else
        evbuffer_add_printf(b, "{\"version\":0,\"enabled\":false}\n");
    atc_workers_resume(&srv->group);
    atc_http_send_json(req, 200, b);
    evbuffer_free(b);
}

/* The answer to POST /admin/policy/reload, once every worker decides with the new version (the reload
 * builds it off the serving threads: the request waits, the workers do not). */
static void on_policy_reloaded(void *arg, uint64_t version, const char *err)
{
    struct evhttp_request *req = arg;
    if (version == 0) {
        atc_http_send_error(req, 422, "invalid_request_error", "policy_reload_failed", err ? err : "failed", 0);
        return;
    }
    struct evbuffer *b = evbuffer_new();
    evbuffer_add_printf(b, "{\"version\":%llu}\n", (unsigned long long)version);
    atc_http_send_json(req, 200, b);
    evbuffer_free(b);
}

/* 200 with the new version when the reload took; 422 with the error (file:line) when it did not, and
 * the old version keeps routing. */
static void reload_policy(struct atc_server *srv, struct evhttp_request *req)
{
    if (evhttp_request_get_command(req) != EVHTTP_REQ_POST) {
        atc_http_send_error(req, 405, "invalid_request_error", "method_not_allowed", "use POST", 0);
        return;
    }
    if (srv->group.workers[0].policy == NULL) {
        atc_http_send_error(req, 422, "invalid_request_error", "no_policy",
                            "the config has no policy: section", 0);
        return;
    }
    atc_server_reload_policy(srv, on_policy_reloaded, req);
}

/* POST /admin/endpoints/<id>/drain or /enable: drain stops new traffic to the endpoint and lets its
 * in-flight requests finish; enable undoes it. Answers the endpoint's id, state and in-flight count. */
static void drain_endpoint(struct atc_server *srv, struct evhttp_request *req, const char *rest)
{
    const char *slash = strrchr(rest, '/');
    bool drain = slash != NULL && strcmp(slash, "/drain") == 0;
    if (slash == NULL || slash == rest || (!drain && strcmp(slash, "/enable") != 0)) {
        atc_http_send_error(req, 404, "invalid_request_error", "not_found", "no such admin route", 0);
        return;
    }
    char raw[256];
    snprintf(raw, sizeof(raw), "%.*s", (int)(slash - rest), rest);
    size_t idlen = 0;
    char *id = evhttp_uridecode(raw, 0, &idlen); /* ids are percent-encoded in paths */
    /* an id that decodes to a NUL or a '/' names nothing: "ID%00x" must not drain ID */
    bool bad = id == NULL || strlen(id) != idlen || strchr(id, '/') != NULL;
    struct atc_endpoint *ep = !bad ? atc_endpoint_table_find(srv->table, id) : NULL;
    free(id);
    if (ep == NULL) {
        atc_http_send_error(req, 404, "invalid_request_error", "endpoint_not_found",
                            "no endpoint with this id", 0);
        return;
    }
    if (evhttp_request_get_command(req) != EVHTTP_REQ_POST) {
        atc_http_send_error(req, 405, "invalid_request_error", "method_not_allowed", "use POST", 0);
        return;
    }
    atc_health_set_drained(srv->health, ep, drain);
    struct evbuffer *b = evbuffer_new();
    evbuffer_add_printf(b, "{\"id\":\"");
    atc_json_escape(b, ep->id, strlen(ep->id));
    evbuffer_add_printf(b, "\",\"state\":\"%s\",\"inflight\":%u}\n",
                        ep->health != NULL ? atc_health_state_name(ep->health->state) : "unknown",
                        ep->inflight);
    atc_http_send_json(req, 200, b);
    evbuffer_free(b);
}

/* GET /admin/record: the trace recorder's counters (record:). */
static void send_record(struct atc_server *srv, struct evhttp_request *req)
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
    atc_http_send_json(req, 200, b);
    evbuffer_free(b);
}

/* POST /admin/config/reload: 200 with a summary, or 422 with every error (nothing changed). */
static void reload_config(struct atc_server *srv, struct evhttp_request *req)
{
    if (evhttp_request_get_command(req) != EVHTTP_REQ_POST) {
        atc_http_send_error(req, 405, "invalid_request_error", "method_not_allowed", "use POST", 0);
        return;
    }
    char *msg = NULL;
    if (atc_server_reload_config(srv, &msg) < 0) {
        atc_http_send_error(req, 422, "invalid_request_error", "config_reload_failed", msg ? msg : "failed",
                            0);
        free(msg);
        return;
    }
    struct evbuffer *b = evbuffer_new();
    evbuffer_add_printf(b, "{\"reloaded\":true,\"summary\":\"");
    if (msg != NULL)
        atc_json_escape(b, msg, strlen(msg));
    evbuffer_add_printf(b, "\"}\n");
    atc_http_send_json(req, 200, b);
    evbuffer_free(b);
    free(msg);
}

/* The effective configuration (no secrets). */
static void send_config(struct atc_server *srv, struct evhttp_request *req)
{
    const struct atc_config *c = srv->cfg;
    struct evbuffer *b = evbuffer_new();
    evbuffer_add(b, "{", 1);
    json_str(b, "path", c->path);
    evbuffer_add_printf(b, ",\"listen\":\"%s:%u\",\"admin\":\"%s:%u\",\"admin_token\":%s,", c->listen_host,
                        (unsigned)srv->front_port, c->admin_host, (unsigned)srv->admin_port,
                        c->admin_token != NULL ? "\"(set)\"" : "null");
    json_str(b, "access_log", c->access_log);
    evbuffer_add_printf(
        b,
        ",\"workers\":%u,\"max_body\":%zu,\"drain_timeout_ms\":%llu,\"client_timeout_ms\":%llu,"
        "\"upstream\":{\"connect_timeout_ms\":%llu,\"first_byte_timeout_ms\":%llu,"
        "\"idle_timeout_ms\":%llu,\"tries\":%u,\"keepalive\":%u},"
        "\"admission\":{\"queue\":%u,\"deadline_ms\":%llu,\"max_deadline_ms\":%llu,\"aging_ms\":%llu},"
        "\"policy\":",
        srv->group.nworkers, c->max_body, (unsigned long long)c->drain_timeout_ms,
        (unsigned long long)c->client_timeout_ms, (unsigned long long)c->upstream.connect_timeout_ms,
        (unsigned long long)c->upstream.first_byte_timeout_ms,
        (unsigned long long)c->upstream.idle_timeout_ms, c->upstream.tries, c->upstream.keepalive,
        c->admission.queue, (unsigned long long)c->admission.deadline_ms,
        (unsigned long long)c->admission.max_deadline_ms, (unsigned long long)c->admission.aging_ms);
    if (c->policy.enabled) {
        evbuffer_add(b, "{", 1);
        json_str(b, "entry", c->policy.entry);
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
        json_str(b, "name", m->name);
        evbuffer_add_printf(b, ",\"endpoints\":[");
        for (size_t j = 0; j < m->nendpoints; j++) {
            evbuffer_add_printf(b, "%s\"", j ? "," : "");
            atc_json_escape(b, m->endpoints[j]->id, strlen(m->endpoints[j]->id));
            evbuffer_add(b, "\"", 1);
        }
        evbuffer_add(b, "]}", 2);
    }
    evbuffer_add(b, "]}\n", 3);
    atc_http_send_json(req, 200, b);
    evbuffer_free(b);
}

/* With admin_token set, every route but /health needs "Authorization: Bearer <token>". The comparison
 * takes the same time wherever the first difference is, so timing does not reveal the token. */
static bool authorized(const struct atc_server *srv, struct evhttp_request *req)
{
    const char *token = srv->cfg->admin_token;
    if (token == NULL)
        return true;
    const char *auth = evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
    if (auth == NULL || strncasecmp(auth, "Bearer ", 7) != 0) /* the scheme is case-insensitive (RFC 7235) */
        return false;
    const char *given = auth + 7;
    size_t n = strlen(token), m = strlen(given);
    unsigned char diff = (unsigned char)(n != m);
    for (size_t i = 0; i < n; i++)
        diff |= (unsigned char)(token[i] ^ given[i < m ? i : 0]);
    return diff == 0;
}

/* The host part of a Host or Origin authority ("[::1]:8081" -> "::1"), into @p out. */
static void host_part(const char *authority, char *out, size_t size)
{
    const char *end;
    if (*authority == '[') {
        authority++;
        end = strchr(authority, ']');
    } else {
        end = strrchr(authority, ':');
    }
    size_t n = end != NULL ? (size_t)(end - authority) : strlen(authority);
    snprintf(out, size, "%.*s", (int)(n < size ? n : size - 1), authority);
}

static bool is_loopback_name(const char *host)
{
    return strcasecmp(host, "localhost") == 0 || strncmp(host, "127.", 4) == 0 || strcmp(host, "::1") == 0;
}

/* Without admin_token the admin API is only as safe as who can reach it, and it listens on loopback
 * (atc check refuses another address then). A web page open on the operator's machine can still reach
 * loopback: DNS rebinding (a page of evil.example whose name now resolves to 127.0.0.1) sends a Host
 * that is not ours, and a cross-site "simple" request (a form POST, or fetch with a text/plain body)
 * carries a foreign Origin or one of the three content types a browser sends without asking. Either is
 * refused; curl, atc's CLI and scripts send neither. With a token, the token decides. */
static const char *cross_site(const struct atc_server *srv, struct evhttp_request *req)
{
    if (srv->cfg->admin_token != NULL)
        return NULL;
    struct evkeyvalq *h = evhttp_request_get_input_headers(req);
    const char *host = evhttp_find_header(h, "Host");
    char name[256];
    if (host != NULL) {
        host_part(host, name, sizeof(name));
        if (!is_loopback_name(name) && strcasecmp(name, srv->cfg->admin_host) != 0)
            return "the Host header names another site (DNS rebinding?)";
    }
    const char *origin = evhttp_find_header(h, "Origin");
    if (origin != NULL) {
        const char *sep = strstr(origin, "://");
        if (host == NULL || sep == NULL || strcasecmp(sep + 3, host) != 0)
            return "a request from another origin";
    }
    const char *type = evhttp_find_header(h, "Content-Type");
    if (evhttp_request_get_command(req) == EVHTTP_REQ_POST && type != NULL &&
        (strncasecmp(type, "text/plain", 10) == 0 || strncasecmp(type, "application/x-www-form-urlencoded", 33) == 0 ||
         strncasecmp(type, "multipart/form-data", 19) == 0))
        return "a POST a web page could send (text/plain or form data)";
    return NULL;
}

void atc_admin_handle(struct evhttp_request *req, void *arg)
{
    struct atc_server *srv = arg;
    const char *path = evhttp_uri_get_path(evhttp_request_get_evhttp_uri(req));
    if (path == NULL)
        path = "/";
    const char *refusal = atc_request_vet_refusal(req);
    if (refusal != NULL) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "Connection", "close");
        atc_http_send_error(req, 400, "invalid_request_error", refusal, atc_request_vet_message(refusal), 0);
        return;
    }
    const char *why = cross_site(srv, req);
    if (why != NULL) {
        atc_warn("admin API: refused %s %s: %s", evhttp_request_get_command(req) == EVHTTP_REQ_POST ? "POST" : "GET",
                 path, why);
        atc_http_send_error(req, 403, "permission_error", "cross_site_request", why, 0);
        return;
    }
    if (strcmp(path, "/health") != 0 && !authorized(srv, req)) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "WWW-Authenticate", "Bearer");
        atc_http_send_error(req, 401, "authentication_error", "invalid_admin_token",
                            "the admin API needs Authorization: Bearer <admin_token>", 0);
        return;
    }
    if (strcmp(path, "/admin/config") == 0) {
        send_config(srv, req);
    } else if (strcmp(path, "/admin/endpoints") == 0) {
        atc_workers_pause(&srv->group);
        send_endpoints(srv, req);
        atc_workers_resume(&srv->group);
    } else if (strncmp(path, "/admin/endpoints/", 17) == 0) {
        drain_endpoint(srv, req, path + 17);
    } else if (strcmp(path, "/metrics") == 0) {
        struct evbuffer *b = evbuffer_new();
        atc_workers_pause(&srv->group); /* a consistent view of every worker, for the few ms it takes */
        struct atc_metrics_sources src;
        atc_server_metrics_sources(srv, &src);
        atc_metrics_render(srv->metrics, &src, b);
        atc_workers_resume(&srv->group);
        evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                          "text/plain; version=0.0.4");
        evhttp_send_reply(req, 200, "OK", b);
        evbuffer_free(b);
    } else if (strcmp(path, "/admin/policy") == 0) {
        send_policy(srv, req);
    } else if (strcmp(path, "/admin/config/reload") == 0) {
        reload_config(srv, req);
    } else if (strcmp(path, "/admin/policy/reload") == 0) {
        reload_policy(srv, req);
    } else if (strcmp(path, "/admin/record") == 0) {
        send_record(srv, req);
    } else if (strcmp(path, "/health") == 0) {
        struct evbuffer *b = evbuffer_new();
        evbuffer_add_printf(b, "{\"status\":\"%s\"}\n", srv->draining ? "draining" : "ok");
        atc_http_send_json(req, 200, b);
        evbuffer_free(b);
    } else {
        atc_http_send_error(req, 404, "invalid_request_error", "not_found", "no such admin route", 0);
    }
}
