#include "http/http_front.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/queue.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "core/config.h"
#include "core/config_value.h"
#include "ops/access_log.h"
#include "fleet/endpoint.h"
#include "http/http_util.h"
#include "core/log.h"
#include "ops/metrics.h"
#include "http/relay.h"
#include "http/request_features.h"
#include "http/request_vet.h"
#include "core/worker.h"

static void send_models(struct atc_worker *w, struct evhttp_request *req)
{
    struct evbuffer *body = evbuffer_new();
    evbuffer_add_printf(body, "{\"object\":\"list\",\"data\":[");
    for (size_t i = 0; i < w->table->nmodels; i++) {
        const char *name = w->table->models[i].name;
        evbuffer_add_printf(body, "%s{\"id\":\"", i ? "," : "");
        atc_json_escape(body, name, strlen(name));
        evbuffer_add_printf(body, "\",\"object\":\"model\",\"created\":0,\"owned_by\":\"atc\"}");
    }
    evbuffer_add_printf(body, "]}\n");
    atc_http_send_json(req, 200, body);
    evbuffer_free(body);
}

static int header_priority(struct evkeyvalq *h, const char **err)
{
    const char *v = evhttp_find_header(h, "x-atc-priority");
    if (v == NULL)
        return 0;
    if (v[0] < '0' || v[0] > '9' || v[1] != '\0') {
        *err = "x-atc-priority must be a digit from 0 to 9";
        return -1;
    }
    return v[0] - '0';
}

/* The client's x-request-id (kept to a safe charset: it is passed on to servers and logs), or a new one. */
static void request_id(struct atc_worker *w, struct evhttp_request *req, char *id, size_t size)
{
    const char *given = evhttp_find_header(evhttp_request_get_input_headers(req), "x-request-id");
    if (given != NULL && given[0] != '\0')
        snprintf(id, size, "%s", given);
    else
        snprintf(id, size, "atc-%016llx", (unsigned long long)++w->next_id);
    for (char *p = id; *p; p++)
        if (*p < 0x21 || *p > 0x7e)
            *p = '_';
}

/* A request answered before it could be routed: the answer, its metrics and its access log line. */
static void front_error(struct atc_worker *w, struct evhttp_request *req, const char *id,
                        const struct atc_features *f, int status, const char *type, const char *code,
                        const char *message)
{
    const char *model = f != NULL ? f->model : "";
    evhttp_add_header(evhttp_request_get_output_headers(req), "x-request-id", id);
    atc_http_send_error(req, status, type, code, message, 0);
    w->stats.responses_total++;
    struct atc_request_metrics m = {
        .model = atc_endpoint_table_model_label(w->table, model), .status = status, .ttft_s = -1};
    atc_metrics_request(w->metrics, &m);
    if (w->access_log == NULL)
        return;
    struct atc_access_record rec = {
        .id = id,
        .model = model,
        .status = status,
        .error = message,
        .ttft_ms = -1,
        .max_tokens = -1,
        .stream = f != NULL && f->stream,
    };
    atc_access_log_request(w->access_log, &rec);
}

static void handle_inference(struct atc_worker *w, struct evhttp_request *req, enum atc_request_kind kind,
                             const char *path)
{
    char id[80];
    request_id(w, req, id, sizeof(id));
    w->stats.requests_total++;
    if (evhttp_request_get_command(req) != EVHTTP_REQ_POST) {
        front_error(w, req, id, NULL, 405, "invalid_request_error", "method_not_allowed", "use POST");
        return;
    }
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t len = evbuffer_get_length(in);
    if (len > w->cfg->max_body) {
        char msg[128];
        snprintf(msg, sizeof(msg), "request body of %zu bytes is over the limit of %zu bytes", len,
                 w->cfg->max_body);
        front_error(w, req, id, NULL, 413, "invalid_request_error", "request_too_large", msg);
        return;
    }
    /* jsmn needs contiguous bytes; this is the only copy of the body, and only when evhttp's is chunked. */
    const char *body = len > 0 ? (const char *)evbuffer_pullup(in, -1) : "";
    struct atc_features *f = malloc(sizeof(*f));
    if (f == NULL) {
        front_error(w, req, id, NULL, 500, "server_error", "out_of_memory", "out of memory");
        return;
    }
    const char *err = NULL;
    if (atc_features_scan(kind, body, len, f, &err) < 0) {
        free(f);
        front_error(w, req, id, NULL, 400, "invalid_request_error", "invalid_body", err);
        return;
    }
    if (!f->has_model || f->model[0] == '\0') {
        front_error(w, req, id, f, 400, "invalid_request_error", "missing_model", "'model' is required");
        free(f);
        return;
    }
    /* Without a policy an unknown model is answered here; a policy may map it (an alias like "auto"). */
    if (w->policy == NULL && atc_endpoint_table_model(w->table, f->model, strlen(f->model)) == NULL) {
        struct evbuffer *msg = evbuffer_new();
        evbuffer_add_printf(msg, "The model '%s' does not exist; GET /v1/models lists the models served",
                            f->model);
        evbuffer_add(msg, "", 1);
        front_error(w, req, id, f, 404, "invalid_request_error", "model_not_found",
                    (const char *)evbuffer_pullup(msg, -1));
        evbuffer_free(msg);
        free(f);
        return;
    }
    struct evkeyvalq *h = evhttp_request_get_input_headers(req);
    int priority = header_priority(h, &err);
    if (priority < 0) {
        front_error(w, req, id, f, 400, "invalid_request_error", "invalid_priority", err);
        free(f);
        return;
    }
    uint64_t deadline_ms = 0;
    const char *deadline = evhttp_find_header(h, "x-atc-deadline");
    if (deadline != NULL && (atc_parse_duration_ms(deadline, &deadline_ms) < 0 || deadline_ms == 0)) {
        front_error(w, req, id, f, 400, "invalid_request_error", "invalid_deadline",
                    "x-atc-deadline must be a duration such as 500ms or 5s");
        free(f);
        return;
    }
    const char *session = evhttp_find_header(h, "x-atc-session");
    struct atc_request_info info = {
        .kind = kind,
        .path = path,
        .body = body,
        .bodylen = len,
        .features = f,
        .priority = priority,
        .tenant = evhttp_find_header(h, "x-atc-tenant"),
        .session = session != NULL ? session : f->user,
        .request_id = id,
        .deadline_ms = deadline_ms,
    };
    atc_relay_start(w, req, &info);
}

/* Two Content-Length headers that disagree: where this request's body ends is a matter of opinion, and
 * a proxy that takes one while the next hop takes the other is how requests are smuggled. */
static bool conflicting_lengths(struct evhttp_request *req)
{
    const char *first = NULL;
    struct evkeyval *kv;
    TAILQ_FOREACH(kv, evhttp_request_get_input_headers(req), next)
    {
        if (strcasecmp(kv->key, "Content-Length") != 0)
            continue;
        if (first == NULL)
            first = kv->value;
        else if (strcmp(first, kv->value) != 0)
            return true;
    }
    return false;
}

void atc_http_front_handle(struct evhttp_request *req, void *arg)
{
    struct atc_worker *w = arg;
    const char *path = evhttp_uri_get_path(evhttp_request_get_evhttp_uri(req));
    if (path == NULL)
        path = "/";
    const char *refusal = atc_request_vet_refusal(req);
    if (refusal != NULL) { /* the request that stands for one the vet refused: answer, and close */
        char id[80];
        request_id(w, req, id, sizeof(id));
        w->stats.requests_total++;
        evhttp_add_header(evhttp_request_get_output_headers(req), "Connection", "close");
        front_error(w, req, id, NULL, 400, "invalid_request_error", refusal, atc_request_vet_message(refusal));
        return;
    }
    if (conflicting_lengths(req)) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "Connection", "close");
        atc_http_send_error(req, 400, "invalid_request_error", "conflicting_content_length",
                            "two Content-Length headers that differ", 0);
        return;
    }
    if (w->draining) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "Connection", "close");
        atc_http_send_error(req, 503, "server_error", "shutting_down", "atc is shutting down; retry", 1);
        return;
    }
    if (strcmp(path, "/v1/chat/completions") == 0) {
        handle_inference(w, req, ATC_KIND_CHAT, "/v1/chat/completions");
    } else if (strcmp(path, "/v1/completions") == 0) {
        handle_inference(w, req, ATC_KIND_COMPLETION, "/v1/completions");
    } else if (strcmp(path, "/v1/embeddings") == 0) {
        handle_inference(w, req, ATC_KIND_EMBEDDING, "/v1/embeddings");
    } else if (strcmp(path, "/v1/models") == 0) {
        send_models(w, req);
    } else if (strcmp(path, "/health") == 0) {
        struct evbuffer *body = evbuffer_new();
        evbuffer_add_printf(body, "{\"status\":\"ok\"}\n");
        atc_http_send_json(req, 200, body);
        evbuffer_free(body);
    } else {
        atc_http_send_error(req, 404, "invalid_request_error", "not_found", "no such route", 0);
    }
}
