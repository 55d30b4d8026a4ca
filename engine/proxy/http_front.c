#include "proxy/http_front.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <event2/buffer.h>

#include "base/strbuf.h"
#include "config/config.h"
#include "base/config_value.h"
#include "ops/access_log.h"
#include "proxy/answer.h"
#include "fleet/endpoint.h"
#include "http/http_server.h"
#include "base/json.h"
#include "base/log.h"
#include "ops/metrics.h"
#include "proxy/relay.h"
#include "request/request_features.h"
#include "proxy/worker.h"

static void send_models(struct atc_worker *w, struct atc_http_req *req)
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
    atc_http_reply_json(req, 200, body);
    evbuffer_free(body);
}

static int header_priority(struct atc_http_req *req, const char **err)
{
    const char *v = atc_http_req_header(req, "x-atc-priority");
    if (v == NULL)
        return 0;
    if (v[0] < '0' || v[0] > '9' || v[1] != '\0') {
        *err = "x-atc-priority must be a digit from 0 to 9";
        return -1;
    }
    return v[0] - '0';
}

/* The client's x-request-id (kept to a safe charset: it is passed on to servers and logs), or a new one. */
static void request_id(struct atc_worker *w, struct atc_http_req *req, char *id, size_t size)
{
    const char *given = atc_http_req_header(req, "x-request-id");
    if (given != NULL && given[0] != '\0') {
        atc_strlcpy(id, size, given);
    } else {
        struct atc_strbuf b = atc_strbuf_init(id, size);
        atc_strbuf_add(&b, "atc-");
        atc_strbuf_hex(&b, ++w->next_id, 16);
    }
    for (char *p = id; *p; p++)
        if (*p < 0x21 || *p > 0x7e)
            *p = '_';
}

/* A request answered before it could be routed: the answer, its metrics and its access log line. */
static void front_error(struct atc_worker *w, struct atc_http_req *req, const char *id,
                        const struct atc_features *f, int status, const char *type, const char *code,
                        const char *message)
{
    const char *model = f != NULL ? f->model : "";
    char h[128];
    snprintf(h, sizeof(h), "x-request-id: %s\r\n", id);
    atc_http_reply_error(req, status, type, code, message, 0, h);
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

void atc_http_front_refused(void *arg, int status, const char *code, const char *message)
{
    struct atc_worker *w = arg;
    w->stats.requests_total++;
    w->stats.responses_total++;
    struct atc_request_metrics m = {.model = atc_endpoint_table_model_label(w->table, ""), .status = status,
                                    .ttft_s = -1};
    atc_metrics_request(w->metrics, &m);
    if (w->access_log == NULL)
        return;
    struct atc_access_record rec = {
        .id = "", .model = "", .status = status, .error = message, .ttft_ms = -1, .max_tokens = -1}; /* no head: no id */
    atc_access_log_request(w->access_log, &rec);
}

static void handle_inference(struct atc_worker *w, struct atc_http_req *req, enum atc_request_kind kind,
                             const char *path)
{
    char id[80];
    request_id(w, req, id, sizeof(id));
    w->stats.requests_total++;
    if (atc_http_req_method(req) != ATC_HTTP_POST) {
        front_error(w, req, id, NULL, 405, "invalid_request_error", "method_not_allowed", "use POST");
        return;
    }
    size_t len;
    const char *body = atc_http_req_body(req, &len);
    if (len > w->cfg->max_body) {
        char msg[128];
        snprintf(msg, sizeof(msg), "request body of %zu bytes is over the limit of %zu bytes", len,
                 w->cfg->max_body);
        front_error(w, req, id, NULL, 413, "invalid_request_error", "request_too_large", msg);
        return;
    }
    /* contiguous in the connection's buffer, also when it came chunked: jsmn reads it there */
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
        char msg[ATC_ANSWER_UNKNOWN_MODEL_MAX];
        front_error(w, req, id, f, 404, "invalid_request_error", "model_not_found",
                    atc_answer_unknown_model(msg, sizeof(msg), f->model));
        free(f);
        return;
    }
    int priority = header_priority(req, &err);
    if (priority < 0) {
        front_error(w, req, id, f, 400, "invalid_request_error", "invalid_priority", err);
        free(f);
        return;
    }
    uint64_t deadline_ms = 0;
    const char *deadline = atc_http_req_header(req, "x-atc-deadline");
    if (deadline != NULL && (atc_parse_duration_ms(deadline, &deadline_ms) < 0 || deadline_ms == 0)) {
        front_error(w, req, id, f, 400, "invalid_request_error", "invalid_deadline",
                    "x-atc-deadline must be a duration such as 500ms or 5s");
        free(f);
        return;
    }
    const char *session = atc_http_req_header(req, "x-atc-session");
    struct atc_request_info info = {
        .kind = kind,
        .path = path,
        .body = body,
        .bodylen = len,
        .features = f,
        .priority = priority,
        .tenant = atc_http_req_header(req, "x-atc-tenant"),
        .session = session != NULL ? session : f->user,
        .request_id = id,
        .deadline_ms = deadline_ms,
    };
    atc_relay_start(w, req, &info);
}

void atc_http_front_handle(struct atc_http_req *req, void *arg)
{
    struct atc_worker *w = arg;
    const char *path = atc_http_req_path(req);
    if (w->draining) {
        atc_http_req_close_after(req);
        atc_http_reply_error(req, 503, "server_error", "shutting_down", "atc is shutting down; retry", 1, NULL);
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
        static const char ok[] = "{\"status\":\"ok\"}\n";
        atc_http_reply(req, 200, "application/json", NULL, ok, sizeof(ok) - 1);
    } else {
        atc_http_reply_error(req, 404, "invalid_request_error", "not_found",
                             "no such route; atc serves POST /v1/chat/completions, /v1/completions and "
                             "/v1/embeddings, GET /v1/models and /health",
                             0, NULL);
    }
}
