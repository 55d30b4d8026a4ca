#include "relay.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>

#include "balancer.h"
#include "config.h"
#include "endpoint.h"
#include "http_util.h"
#include "log.h"
#include "policy.h"
#include "recorder.h"
#include "server.h"
#include "trace.h"
#include "upstream.h"

/* Above this many bytes waiting for a slow client, stop reading from the server until they drain. */
#define CLIENT_HIGH_WATERMARK (256 * 1024)
/* A non-streamed answer larger than this is a server fault, not something to hold in memory. */
#define MAX_BUFFERED_RESPONSE (64u * 1024 * 1024)
/* Output tokens assumed for accounting when a request sets no max_tokens. */
#define DEFAULT_OUTPUT_TOKENS 256
#define MAX_TRIES 8

struct relay {
    struct atc_server *srv;
    struct evhttp_request *client;
    struct evhttp_connection *client_conn;
    struct event *watch; /* notices a client that hangs up while we wait for the server */
    struct atc_features *f;
    struct atc_model *model;
    const char *path;
    const char *body;
    size_t bodylen;
    int priority;
    char tenant[64];
    char session[256];
    char id[80];
    char extra_headers[160];

    struct atc_route_request rreq; /* what the policy sees */
    uint64_t policy_version;
    char *rewritten; /* the body with "model" set to the endpoint's, when a policy mapped an alias */
    size_t rewritten_len;

    struct atc_endpoint *ep; /* holds one in-flight slot while set */
    uint64_t tokens;
    struct atc_endpoint *tried[MAX_TRIES];
    unsigned ntried;
    struct atc_upstream_req *up;
    enum atc_upstream_error last_error;
    bool had_error;

    int status;
    bool streaming;     /* relaying the body as it arrives */
    bool event_stream;  /* and it is SSE */
    bool reply_started; /* the status line went to the client: no more retries */
    bool paused;
    bool flushing; /* answered; held until the client has the last byte (only while draining) */
    struct evbuffer *buffered;
    uint64_t t_attempt_us;
    uint64_t t_start_us;           /* when the request arrived (trace recording) */
    struct atc_record_marks marks; /* what recording notes about the answer (record:) */
};

static void attempt(struct relay *r, struct atc_endpoint *ep);
static struct atc_endpoint *next_endpoint(struct relay *r);
static void record_finished(struct relay *r, int client_status);

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static void release_endpoint(struct relay *r)
{
    if (r->ep == NULL)
        return;
    atc_endpoint_release(r->ep, r->tokens);
    r->ep = NULL;
}

/* The relay is over: the client has its answer (or is gone). Frees the relay, not the client request. */
static void relay_free(struct relay *r)
{
    release_endpoint(r);
    if (r->watch != NULL)
        event_free(r->watch);
    if (r->client_conn != NULL)
        evhttp_connection_set_closecb(r->client_conn, NULL, NULL);
    if (r->buffered != NULL)
        evbuffer_free(r->buffered);
    free(r->f);
    free(r->rewritten);
    atc_server_request_finished(r->srv);
    free(r);
}

static struct evbuffer *client_output(const struct relay *r)
{
    return bufferevent_get_output(evhttp_connection_get_bufferevent(r->client_conn));
}

static void on_client_flushed(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
    struct relay *r = arg;
    if (evbuffer_get_length(buf) > 0)
        return;
    evbuffer_remove_cb(buf, on_client_flushed, r);
    relay_free(r);
}

/* The answer is handed to evhttp. While draining, the process must not exit before the client has it,
 * so the relay (and the server's count of active requests) lives until the bytes are written. */
static void relay_done(struct relay *r)
{
    record_finished(r, 0);
    release_endpoint(r);
    if (r->watch != NULL) {
        event_free(r->watch);
        r->watch = NULL;
    }
    if (r->srv->draining && r->client_conn != NULL && evbuffer_get_length(client_output(r)) > 0) {
        r->flushing = true;
        evbuffer_add_cb(client_output(r), on_client_flushed, r);
        return;
    }
    relay_free(r);
}

static void add_reply_headers(struct relay *r)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers(r->client);
    if (r->ntried > 0)
        evhttp_add_header(h, "x-atc-endpoint", r->tried[r->ntried - 1]->id);
    evhttp_add_header(h, "x-request-id", r->id);
    if (r->srv->policy != NULL) {
        char v[24];
        snprintf(v, sizeof(v), "%llu", (unsigned long long)r->policy_version);
        evhttp_add_header(h, "x-atc-policy-version", v);
    }
    if (r->srv->draining)
        evhttp_add_header(h, "Connection", "close");
}

static void reply_error(struct relay *r, int status, const char *type, const char *code, const char *message,
                        int retry_after)
{
    add_reply_headers(r);
    r->marks.status = status;
    atc_http_send_error(r->client, status, type, code, message, retry_after);
    r->srv->stats.responses_total++;
    relay_done(r);
}

/* The client hung up: stop the server's work at once and free its slot. */
static void client_gone(struct relay *r)
{
    record_finished(r, 499); /* nginx's "client closed request" */
    r->srv->stats.client_gone_total++;
    if (r->up != NULL) {
        atc_upstream_cancel(r->up);
        r->up = NULL;
    }
    atc_debug("request %s: client disconnected", r->id);
    relay_free(r);
}

/* evhttp noticed the hang-up while writing. The request is detached from its (dying) connection when
 * we had not finished it, and then it is ours to free. */
static void on_client_close(struct evhttp_connection *conn, void *arg)
{
    struct relay *r = arg;
    struct evhttp_request *client = r->client;
    if (r->flushing) { /* answered already: the request is evhttp's, only the relay is left */
        evbuffer_remove_cb(client_output(r), on_client_flushed, r);
        r->client_conn = NULL;
        relay_free(r);
        return;
    }
    r->client_conn = NULL; /* being freed by evhttp */
    client_gone(r);
    if (evhttp_request_get_connection(client) == NULL)
        evhttp_request_free(client);
}

/* evhttp does not read from a client while its request is being handled, so a hang-up before we write
 * would go unnoticed until the server answers. Peek at the socket instead. */
static void on_client_readable(evutil_socket_t fd, short what, void *arg)
{
    struct relay *r = arg;
    char byte;
    ssize_t n = recv(fd, &byte, 1, MSG_PEEK);
    if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EINTR))) {
        /* A pipelined request (or junk): evhttp reads it after this answer; stop watching. */
        event_del(r->watch);
        return;
    }
    struct evhttp_connection *conn = r->client_conn;
    evhttp_connection_set_closecb(conn, NULL, NULL);
    r->client_conn = NULL;
    client_gone(r);
    evhttp_connection_free(conn); /* frees the client request too */
}

static int error_status(enum atc_upstream_error err)
{
    return atc_upstream_is_timeout(err) ? 504 : 502;
}

/* No attempt can go on: answer with what the last failure was. */
static void give_up(struct relay *r)
{
    char msg[256];
    if (!r->had_error) {
        reply_error(r, 503, "server_error", "no_endpoint_available",
                    "no endpoint of this model can take the request now; retry later", 1);
        return;
    }
    struct atc_endpoint *last = r->tried[r->ntried - 1];
    snprintf(msg, sizeof(msg), "upstream %s: %s", last->id, atc_upstream_strerror(r->last_error));
    int status = error_status(r->last_error);
    reply_error(r, status, status == 504 ? "timeout" : "upstream_error", NULL, msg, 0);
}

/* The endpoint for the next attempt: the policy's choice, else the C balancer's. NULL when there is
 * none; *answered when the policy's verdict (queue, reject) or an unknown model was answered. Endpoints
 * already tried are never chosen again; a verdict on a retry means the last failure stands. */
static struct atc_endpoint *choose(struct relay *r, bool *answered)
{
    struct atc_server *srv = r->srv;
    *answered = false;
    r->rreq.attempt = r->ntried + 1;
    r->rreq.tried = r->tried;
    r->rreq.ntried = r->ntried;
    if (srv->policy != NULL) {
        struct atc_decision d;
        atc_policy_route(srv->policy, &r->rreq, &d);
        r->policy_version = d.version;
        if (r->marks.decision < 0)
            r->marks.decision = (int)d.kind;
        switch (d.kind) {
        case ATC_DECISION_ENDPOINT:
            return d.endpoint;
        case ATC_DECISION_QUEUE:
            if (r->ntried == 0) {
                char msg[320];
                snprintf(msg, sizeof(msg), "no capacity for this request now (%s); retry later", d.message);
                reply_error(r, 503, "server_error", "no_capacity", msg, 1);
                *answered = true;
            }
            return NULL;
        case ATC_DECISION_REJECT:
            if (r->ntried == 0) {
                reply_error(r, d.status, d.status < 500 ? "invalid_request_error" : "server_error",
                            "rejected_by_policy", d.message, d.status == 429 || d.status == 503 ? 1 : 0);
                *answered = true;
            }
            return NULL;
        case ATC_DECISION_FALLBACK:
            break;
        }
    }
    if (r->model == NULL) {
        if (r->ntried == 0) {
            char msg[400];
            snprintf(msg, sizeof(msg),
                     "The model '%s' does not exist; GET /v1/models lists the models served", r->f->model);
            reply_error(r, 404, "invalid_request_error", "model_not_found", msg, 0);
            *answered = true;
        }
        return NULL;
    }
    return atc_balancer_pick(r->model, &srv->rng, r->tried, r->ntried);
}

/* Another endpoint to try, if the request may be tried again: nothing reached the client yet, and
 * tries are left. */
static struct atc_endpoint *next_endpoint(struct relay *r)
{
    bool answered;
    if (r->reply_started || r->ntried >= r->srv->cfg->upstream.tries || r->ntried >= MAX_TRIES)
        return NULL;
    return choose(r, &answered);
}

/* The body to send to @p ep: the client's, or a copy with "model" replaced when the policy routed an
 * alias (say "auto") to an endpoint of another model. */
static int body_for(struct relay *r, const struct atc_endpoint *ep, const char **body, size_t *len)
{
    const struct atc_features *f = r->f;
    if (!f->has_model || strcmp(ep->model, f->model) == 0) {
        *body = r->body;
        *len = r->bodylen;
        return 0;
    }
    struct evbuffer *b = evbuffer_new();
    if (b == NULL)
        return -1;
    evbuffer_add(b, r->body, f->model_start);
    atc_json_escape(b, ep->model, strlen(ep->model));
    evbuffer_add(b, r->body + f->model_end, r->bodylen - f->model_end);
    free(r->rewritten);
    r->rewritten_len = evbuffer_get_length(b);
    r->rewritten = malloc(r->rewritten_len ? r->rewritten_len : 1);
    if (r->rewritten != NULL)
        evbuffer_remove(b, r->rewritten, r->rewritten_len);
    evbuffer_free(b);
    *body = r->rewritten;
    *len = r->rewritten_len;
    return r->rewritten != NULL ? 0 : -1;
}

static void on_chunk_sent(struct evhttp_connection *conn, void *arg)
{
    struct relay *r = arg;
    if (r->paused && r->up != NULL) {
        r->paused = false;
        atc_upstream_resume(r->up);
    }
}

static size_t client_backlog(const struct relay *r)
{
    return r->client_conn != NULL ? evbuffer_get_length(client_output(r)) : 0;
}

static void on_up_headers(void *arg, const struct atc_upstream_response *resp)
{
    struct relay *r = arg;
    double ttft_ms = (double)(now_us() - r->t_attempt_us) / 1000.0;
    struct atc_endpoint *next;
    if (resp->status >= 500 && (next = next_endpoint(r)) != NULL) {
        /* The server failed before anything reached the client: another endpoint may do better. */
        atc_endpoint_record(r->ep, false, -1);
        atc_warn("request %s: upstream %s answered %d, retrying on %s", r->id, r->ep->id, resp->status,
                 next->id);
        atc_upstream_cancel(r->up);
        r->up = NULL;
        release_endpoint(r);
        r->srv->stats.retries_total++;
        attempt(r, next);
        return;
    }
    atc_endpoint_record(r->ep, resp->status < 500, resp->status < 500 ? ttft_ms : -1);
    r->status = resp->status;
    r->event_stream = resp->event_stream;
    r->streaming = resp->event_stream || resp->content_length < 0 ||
                   (uint64_t)resp->content_length > MAX_BUFFERED_RESPONSE;
    struct evkeyvalq *h = evhttp_request_get_output_headers(r->client);
    evhttp_add_header(h, "Content-Type",
                      resp->content_type != NULL ? resp->content_type : "application/json");
    if (r->streaming) {
        if (r->event_stream)
            evhttp_add_header(h, "Cache-Control", "no-cache");
        add_reply_headers(r);
        r->reply_started = true;
        evhttp_send_reply_start(r->client, r->status, atc_http_reason(r->status));
    } else if (r->buffered == NULL) {
        r->buffered = evbuffer_new();
    } else {
        evbuffer_drain(r->buffered, evbuffer_get_length(r->buffered));
    }
}

static void on_up_body(void *arg, struct evbuffer *data)
{
    struct relay *r = arg;
    if (r->srv->recorder != NULL)
        atc_record_marks_observe(&r->marks, data, r->streaming, now_us());
    if (!r->streaming) {
        evbuffer_add_buffer(r->buffered, data);
        return;
    }
    evhttp_send_reply_chunk_with_cb(r->client, data, on_chunk_sent, r);
    if (!r->paused && client_backlog(r) > CLIENT_HIGH_WATERMARK) {
        r->paused = true;
        atc_upstream_pause(r->up);
    }
}

static void on_up_done(void *arg)
{
    struct relay *r = arg;
    r->up = NULL;
    r->srv->stats.responses_total++;
    if (r->streaming) {
        evhttp_send_reply_end(r->client);
    } else {
        add_reply_headers(r);
        evhttp_send_reply(r->client, r->status, atc_http_reason(r->status), r->buffered);
    }
    relay_done(r);
}

/* An SSE stream that breaks after it started still ends with a well-formed event, so that a client
 * sees an error rather than a stream that merely stops. */
static void end_broken_stream(struct relay *r, enum atc_upstream_error err)
{
    if (r->event_stream) {
        struct evbuffer *ev = evbuffer_new();
        if (ev != NULL) {
            evbuffer_add_printf(ev,
                                "data: {\"error\":{\"message\":\"upstream %s: %s\",\"type\":\"%s\","
                                "\"param\":null,\"code\":%d}}\n\n",
                                r->tried[r->ntried - 1]->id, atc_upstream_strerror(err),
                                atc_upstream_is_timeout(err) ? "timeout" : "upstream_error",
                                error_status(err));
            evhttp_send_reply_chunk(r->client, ev);
            evbuffer_free(ev);
        }
    }
    evhttp_send_reply_end(r->client);
    r->srv->stats.responses_total++;
    relay_done(r);
}

static void on_up_error(void *arg, enum atc_upstream_error err, bool got_response)
{
    struct relay *r = arg;
    r->up = NULL;
    r->srv->stats.upstream_errors_total++;
    atc_endpoint_record(r->ep, false, -1);
    atc_warn("request %s: upstream %s: %s", r->id, r->ep->id, atc_upstream_strerror(err));
    release_endpoint(r);
    r->last_error = err;
    r->had_error = true;
    if (r->reply_started) {
        end_broken_stream(r, err);
        return;
    }
    struct atc_endpoint *next = next_endpoint(r);
    if (next == NULL) {
        give_up(r);
        return;
    }
    r->srv->stats.retries_total++;
    attempt(r, next);
}

static const struct atc_upstream_callbacks upstream_cb = {
    .on_headers = on_up_headers,
    .on_body = on_up_body,
    .on_done = on_up_done,
    .on_error = on_up_error,
};

/* Sends the request to @p ep. */
static void attempt(struct relay *r, struct atc_endpoint *ep)
{
    const char *body;
    size_t len;
    r->ep = ep;
    r->tried[r->ntried++] = ep;
    atc_endpoint_acquire(ep, r->tokens);
    if (r->srv->policy != NULL)
        atc_policy_routed(r->srv->policy, &r->rreq, ep);
    r->t_attempt_us = now_us();
    r->up = body_for(r, ep, &body, &len) == 0
                ? atc_upstream_send(ep->pool, "POST", r->path, r->extra_headers, body, len, &upstream_cb, r)
                : NULL;
    if (r->up == NULL) {
        release_endpoint(r);
        reply_error(r, 500, "server_error", NULL, "out of memory", 0);
    }
}

static const char *client_header(void *ctx, const char *name)
{
    struct relay *r = ctx;
    return evhttp_find_header(evhttp_request_get_input_headers(r->client), name);
}

static void copy_str(char *dst, size_t size, const char *src)
{
    snprintf(dst, size, "%s", src != NULL ? src : "");
}

void atc_relay_start(struct atc_server *srv, struct evhttp_request *client,
                     const struct atc_request_info *info)
{
    struct relay *r = calloc(1, sizeof(*r));
    if (r == NULL) {
        free(info->features);
        atc_http_send_error(client, 500, "server_error", NULL, "out of memory", 0);
        return;
    }
    atc_server_request_started(srv);
    r->srv = srv;
    r->t_start_us = now_us();
    atc_record_marks_init(&r->marks);
    r->client = client;
    r->client_conn = evhttp_request_get_connection(client);
    r->f = info->features;
    r->path = info->path;
    r->body = info->body;
    r->bodylen = info->bodylen;
    r->priority = info->priority;
    copy_str(r->tenant, sizeof(r->tenant), info->tenant);
    copy_str(r->session, sizeof(r->session), info->session);
    if (info->request_id != NULL && info->request_id[0] != '\0')
        copy_str(r->id, sizeof(r->id), info->request_id);
    else
        snprintf(r->id, sizeof(r->id), "atc-%016llx", (unsigned long long)++srv->next_id);
    /* The id is passed on so that server logs can be joined with ours; keep it to a safe charset. */
    for (char *p = r->id; *p; p++)
        if (*p < 0x21 || *p > 0x7e)
            *p = '_';
    snprintf(r->extra_headers, sizeof(r->extra_headers), "x-request-id: %s\r\n", r->id);
    r->model = atc_endpoint_table_model(srv->table, r->f->model, strlen(r->f->model));
    r->tokens =
        r->f->prompt_tokens + (uint64_t)(r->f->max_tokens >= 0 ? r->f->max_tokens : DEFAULT_OUTPUT_TOKENS);

    evhttp_connection_set_closecb(r->client_conn, on_client_close, r);
    struct bufferevent *bev = evhttp_connection_get_bufferevent(r->client_conn);
    r->watch = event_new(srv->base, bufferevent_getfd(bev), EV_READ | EV_PERSIST, on_client_readable, r);
    if (r->watch != NULL)
        event_add(r->watch, NULL);
    r->rreq = (struct atc_route_request){
        .id = r->id,
        .path = r->path,
        .kind = info->kind,
        .features = r->f,
        .priority = r->priority,
        .tenant = r->tenant,
        .session = r->session,
        .header = client_header,
        .header_ctx = r,
    };
    bool answered;
    struct atc_endpoint *ep = choose(r, &answered);
    if (answered)
        return;
    if (ep == NULL)
        give_up(r);
    else
        attempt(r, ep);
}

/* ---- trace recording (record:) ----
 * Called once per request, at its end (answered: relay_done; abandoned by the client: client_gone),
 * while the client's request and its body are still alive. Hands a small record to the recorder,
 * which never blocks the loop. */
static void record_finished(struct relay *r, int client_status)
{
    struct atc_recorder *rec = r->srv->recorder;
    if (rec == NULL)
        return;
    static const char *const decisions[] = {"endpoint", "queue", "reject", "fallback"};
    const struct atc_features *f = r->f;
    uint64_t now = now_us();
    struct atc_trace_record t;
    atc_trace_record_init(&t);
    t.id = r->id;
    t.model = f->model;
    t.kind = r->rreq.kind;
    t.prompt_tokens = f->prompt_tokens;
    t.max_tokens = f->max_tokens;
    t.output_tokens = atc_record_marks_output_tokens(&r->marks, r->rreq.kind == ATC_KIND_CHAT);
    t.priority = r->priority;
    t.tenant = r->tenant;
    t.session = r->session;
    t.stream = f->stream;
    t.blocks = f->blocks;
    t.nblocks = f->nblocks;
    t.block_tokens = f->nblocks > 0 ? ATC_PREFIX_BLOCK_BYTES / 4 : 0;
    if (atc_recorder_text(rec) && f->prompt != NULL) {
        t.prompt = f->prompt;
        t.prompt_len = f->prompt_len;
    }
    t.endpoint = r->ntried > 0 ? r->tried[r->ntried - 1]->id : NULL;
    t.policy_version = r->policy_version;
    t.decision = r->marks.decision >= 0 && r->marks.decision <= 3 ? decisions[r->marks.decision] : "balancer";
    t.attempts = r->ntried;
    t.status = client_status != 0 ? client_status : r->marks.status != 0 ? r->marks.status : r->status;
    if (r->marks.first_byte_us != 0)
        t.ttft_ms = (double)(r->marks.first_byte_us - r->t_start_us) / 1000.0;
    t.total_ms = (double)(now - r->t_start_us) / 1000.0;
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    uint64_t wall_us = (uint64_t)wall.tv_sec * 1000000u + (uint64_t)wall.tv_nsec / 1000u;
    atc_recorder_add(rec, &t, wall_us - (now - r->t_start_us));
}
