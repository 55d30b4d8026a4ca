/* The simulated inference server: sim.c's model behind evhttp; see sim_server.h for the routes.
 *
 * Lifetimes: every inference request we hold (being generated, or hanging) is a struct sim_req on the
 * server's list, with a close callback on its connection. When the client goes away, libevent detaches
 * the request from the connection and calls that callback; we cancel the sequence and free both the
 * request and our record. Before answering a request we clear the callback, because answering may free
 * the connection at once (Connection: close). */

#include "sim/sim_server.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "core/config.h"
#include "core/json.h"
#include "core/log.h"
#include "http/request_features.h"
#include "core/clock.h"

#define BLOCK_TOKENS (ATC_PREFIX_BLOCK_BYTES / 4) /* request_features estimates 4 bytes per token */
#define MAX_BODY (32u << 20)
#define MAX_PENDING_OUTPUT (4u << 20) /* a client this far behind is dropped rather than buffered for */
#define EMBEDDING_DIM 8

struct sim_req {
    struct sim_req *prev, *next;
    struct atc_sim_server *srv;
    struct evhttp_request *req;
    uint64_t seq; /* sequence in the model; 0 = none (hanging) */
    uint64_t num; /* accept order: seeds the id and the words */
    enum atc_request_kind kind;
    bool stream;
    bool started; /* stream: the headers are out */
    bool length;  /* finish_reason "length": the output length was max_tokens */
    uint32_t prompt_tokens, output_tokens;
    uint32_t cut_at; /* die after sending this many tokens; 0 = never */
    int64_t created;
    struct evbuffer *text; /* non-streaming: the answer so far */
    struct event *watch;   /* the client's socket, to see it leave before we write to it */
};

struct atc_sim_server {
    struct event_base *base;
    struct evhttp *http; /* NULL once dead */
    struct atc_sim_params p;
    struct atc_sim *sim;
    struct event *timer;  /* the model's next event */
    struct event *die_ev; /* deferred death: never free evhttp from inside its own callbacks */
    uint64_t t0;          /* CLOCK_MONOTONIC at start, us: model time is relative to it */
    uint64_t rng;         /* fault draws */
    uint64_t accepted;    /* inference requests accepted, for die_after */
    uint16_t port;
    bool dying;
    struct sim_req *reqs;
    void (*on_death)(void *arg);
    void *on_death_arg;
};

static const char *const words[] = {
    "the",    "quick",  "brown", "fox",   "jumps", "over",   "lazy",   "dog",    "and",    "then",  "some",
    "model",  "tokens", "flow",  "like",  "water", "under",  "a",      "bridge", "while",  "GPUs",  "hum",
    "softly", "in",     "racks", "of",    "light", "every",  "prompt", "finds",  "its",    "cache", "warm",
    "or",     "cold",   "as",    "fate",  "and",   "policy", "decide", "which",  "way",    "it",    "goes",
    "to",     "answer", "with",  "words", "that",  "mean",   "little", "but",    "arrive", "on",    "time",
};

static uint64_t now_us(const struct atc_sim_server *srv)
{
    return atc_mono_us() - srv->t0;
}

static bool is_ready(const struct atc_sim_server *srv)
{
    return now_us(srv) >= srv->p.not_ready_for_ms * 1000u;
}

/* A uniform draw in [0, 1). */
static double draw_from(uint64_t *state)
{
    return (double)(atc_sim_rand(state) >> 11) / 9007199254740992.0;
}

static const char *word(const struct atc_sim_server *srv, uint64_t num, uint32_t index)
{
    uint64_t st = srv->p.seed ^ (num * 0x9e3779b97f4a7c15ULL) ^ ((uint64_t)index << 32);
    return words[atc_sim_rand(&st) % (sizeof(words) / sizeof(words[0]))];
}

static void add_json_string(struct evbuffer *b, const char *s)
{
    evbuffer_add(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            evbuffer_add_printf(b, "\\%c", c);
        else if (c < 0x20)
            evbuffer_add_printf(b, "\\u%04x", c);
        else
            evbuffer_add(b, s, 1);
    }
    evbuffer_add(b, "\"", 1);
}

static void set_content_type(struct evhttp_request *req, const char *type)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Content-Type", type);
}

/* An OpenAI error answer, as vLLM gives it. */
static void send_error(struct evhttp_request *req, int code, const char *type, const char *msg)
{
    struct evbuffer *b = evbuffer_new();
    if (!b) {
        evhttp_send_error(req, HTTP_INTERNAL, NULL);
        return;
    }
    evbuffer_add_printf(b, "{\"error\":{\"message\":");
    add_json_string(b, msg);
    evbuffer_add_printf(b, ",\"type\":\"%s\",\"param\":null,\"code\":%d}}", type, code);
    set_content_type(req, "application/json");
    evhttp_send_reply(req, code, NULL, b);
    evbuffer_free(b);
}

/* ---- requests we hold ---- */

static void schedule(struct atc_sim_server *srv);

static void req_unlink(struct sim_req *r)
{
    struct atc_sim_server *srv = r->srv;
    if (r->prev)
        r->prev->next = r->next;
    else
        srv->reqs = r->next;
    if (r->next)
        r->next->prev = r->prev;
    if (r->text)
        evbuffer_free(r->text);
    if (r->watch)
        event_free(r->watch);
    free(r);
}

/* Stops watching @p r's connection, so that libevent may free it without telling us. */
static void req_release(struct sim_req *r)
{
    struct evhttp_connection *conn = evhttp_request_get_connection(r->req);
    if (conn)
        evhttp_connection_set_closecb(conn, NULL, NULL);
}

static void on_client_close(struct evhttp_connection *conn, void *arg)
{
    struct sim_req *r = arg;
    struct atc_sim_server *srv = r->srv;
    if (r->seq)
        atc_sim_cancel(srv->sim, r->seq);
    evhttp_connection_set_closecb(conn, NULL, NULL);
    /* A request we still hold was detached from its connection and is ours to free; an attached one
     * is freed by libevent with the connection. */
    if (!evhttp_request_get_connection(r->req))
        evhttp_request_free(r->req);
    req_unlink(r);
    schedule(srv);
}

/* evhttp 2.1 stops reading a connection while its request is being answered, so a client leaving
 * before the first byte of the answer goes unnoticed until we write. We peek at the socket instead. */
static void on_client_readable(evutil_socket_t fd, short what, void *arg)
{
    struct sim_req *r = arg;
    struct atc_sim_server *srv = r->srv;
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0) {
        event_del(r->watch); /* a pipelined request: evhttp reads it after our answer */
        return;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    struct evhttp_connection *conn = evhttp_request_get_connection(r->req);
    if (r->seq)
        atc_sim_cancel(srv->sim, r->seq);
    req_release(r);
    req_unlink(r);
    evhttp_connection_free(conn); /* with the request */
    schedule(srv);
}

static struct sim_req *req_track(struct atc_sim_server *srv, struct evhttp_request *req)
{
    struct evhttp_connection *conn = evhttp_request_get_connection(req);
    struct bufferevent *bev = conn ? evhttp_connection_get_bufferevent(conn) : NULL;
    struct sim_req *r = calloc(1, sizeof(*r));
    if (!r || !bev)
        goto error;
    r->watch = event_new(srv->base, bufferevent_getfd(bev), EV_READ | EV_PERSIST, on_client_readable, r);
    if (!r->watch || event_add(r->watch, NULL) < 0)
        goto error;
    r->srv = srv;
    r->req = req;
    r->created = (int64_t)time(NULL);
    r->next = srv->reqs;
    if (srv->reqs)
        srv->reqs->prev = r;
    srv->reqs = r;
    evhttp_connection_set_closecb(conn, on_client_close, r);
    return r;
error:
    if (r && r->watch)
        event_free(r->watch);
    free(r);
    return NULL;
}

/* Forgets every request without answering; their connections are closed by the caller. */
static void drop_all(struct atc_sim_server *srv)
{
    while (srv->reqs) {
        struct sim_req *r = srv->reqs;
        req_release(r);
        if (r->seq)
            atc_sim_cancel(srv->sim, r->seq);
        req_unlink(r);
    }
}

/* ---- the model's clock ---- */

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    struct atc_sim_server *srv = arg;
    atc_sim_advance(srv->sim, now_us(srv));
    schedule(srv);
}

static void schedule(struct atc_sim_server *srv)
{
    uint64_t next = atc_sim_next_event_us(srv->sim);
    if (next == UINT64_MAX) {
        evtimer_del(srv->timer);
        return;
    }
    uint64_t now = now_us(srv), d = next > now ? next - now : 0;
    struct timeval tv = {.tv_sec = (time_t)(d / 1000000u), .tv_usec = (suseconds_t)(d % 1000000u)};
    evtimer_add(srv->timer, &tv);
}

static void die_soon(struct atc_sim_server *srv)
{
    static const struct timeval zero = {0, 0};
    srv->dying = true;
    evtimer_add(srv->die_ev, &zero);
}

static void on_die(evutil_socket_t fd, short what, void *arg)
{
    struct atc_sim_server *srv = arg;
    atc_warn("sim %s:%u: dying after %llu requests (die_after)", srv->p.model, srv->port,
             (unsigned long long)srv->p.die_after);
    drop_all(srv);
    evhttp_free(srv->http); /* the listener and every connection, idle ones too */
    srv->http = NULL;
    schedule(srv);
    if (srv->on_death)
        srv->on_death(srv->on_death_arg); /* last: it may stop the server */
}

/* ---- answers ---- */

static const char *object_name(const struct sim_req *r, bool chunk)
{
    if (r->kind == ATC_KIND_CHAT)
        return chunk ? "chat.completion.chunk" : "chat.completion";
    return "text_completion";
}

/* {"id":..,"object":..,"created":..,"model":.., (without the closing brace) */
static void add_head(struct evbuffer *b, const struct sim_req *r, bool chunk)
{
    evbuffer_add_printf(b, "{\"id\":\"%s-%016llx\",\"object\":\"%s\",\"created\":%lld,\"model\":",
                        r->kind == ATC_KIND_CHAT ? "chatcmpl" : "cmpl", (unsigned long long)r->num,
                        object_name(r, chunk), (long long)r->created);
    add_json_string(b, r->srv->p.model);
}

static void add_usage(struct evbuffer *b, const struct sim_req *r)
{
    evbuffer_add_printf(b, ",\"usage\":{\"prompt_tokens\":%u,\"completion_tokens\":%u,\"total_tokens\":%u}",
                        r->prompt_tokens, r->output_tokens, r->prompt_tokens + r->output_tokens);
}

/* One SSE event: a chunk carrying @p text (NULL = an empty delta) and @p finish (NULL = null). */
static void add_event(struct evbuffer *b, const struct sim_req *r, const char *role, const char *text,
                      const char *finish)
{
    evbuffer_add(b, "data: ", 6);
    add_head(b, r, true);
    evbuffer_add_printf(b, ",\"choices\":[{\"index\":0,");
    if (r->kind == ATC_KIND_CHAT) {
        evbuffer_add_printf(b, "\"delta\":{");
        if (role)
            evbuffer_add_printf(b, "\"role\":\"%s\"%s", role, text ? "," : "");
        if (text)
            evbuffer_add_printf(b, "\"content\":\"%s\"", text);
        evbuffer_add_printf(b, "}");
    } else {
        evbuffer_add_printf(b, "\"text\":\"%s\"", text ? text : "");
    }
    evbuffer_add_printf(b, ",\"logprobs\":null,\"finish_reason\":");
    if (finish)
        evbuffer_add_printf(b, "\"%s\"}]", finish);
    else
        evbuffer_add_printf(b, "null}]");
    if (finish)
        add_usage(b, r);
    evbuffer_add(b, "}\n\n", 3);
}

static void send_whole(struct sim_req *r)
{
    struct evbuffer *b = evbuffer_new();
    if (!b)
        return;
    const char *finish = r->length ? "length" : "stop";
    add_head(b, r, false);
    if (r->kind == ATC_KIND_CHAT)
        evbuffer_add_printf(b,
                            ",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"");
    else
        evbuffer_add_printf(b, ",\"choices\":[{\"index\":0,\"text\":\"");
    evbuffer_add_buffer(b, r->text);
    evbuffer_add_printf(b, "\"%s,\"logprobs\":null,\"finish_reason\":\"%s\"}]",
                        r->kind == ATC_KIND_CHAT ? "}" : "", finish);
    add_usage(b, r);
    evbuffer_add(b, "}", 1);
    set_content_type(r->req, "application/json");
    evhttp_send_reply(r->req, HTTP_OK, "OK", b);
    evbuffer_free(b);
}

static size_t pending_output(struct evhttp_request *req)
{
    struct evhttp_connection *conn = evhttp_request_get_connection(req);
    struct bufferevent *bev = conn ? evhttp_connection_get_bufferevent(conn) : NULL;
    return bev ? evbuffer_get_length(bufferevent_get_output(bev)) : 0;
}

static void on_token(void *ctx, const struct atc_sim_token *tok)
{
    struct atc_sim_server *srv = ctx;
    struct sim_req *r = tok->user;
    char text[64];
    snprintf(text, sizeof(text), "%s ", word(srv, r->num, tok->index));

    if (!r->stream) {
        evbuffer_add(r->text, text, strlen(text));
        if (tok->last) {
            req_release(r);
            send_whole(r);
            req_unlink(r);
        }
        return;
    }
    struct evbuffer *b = evbuffer_new();
    if (!b)
        return;
    if (!r->started) {
        /* Like vLLM, the headers and the role go out with the first token. */
        struct evkeyvalq *h = evhttp_request_get_output_headers(r->req);
        evhttp_add_header(h, "Content-Type", "text/event-stream; charset=utf-8");
        evhttp_add_header(h, "Cache-Control", "no-cache");
        evhttp_send_reply_start(r->req, HTTP_OK, "OK");
        r->started = true;
        if (r->kind == ATC_KIND_CHAT)
            add_event(b, r, "assistant", "", NULL);
    }
    add_event(b, r, NULL, text, NULL);
    if (tok->last) {
        add_event(b, r, NULL, NULL, r->length ? "length" : "stop");
        evbuffer_add_printf(b, "data: [DONE]\n\n");
    }
    evhttp_send_reply_chunk(r->req, b);
    evbuffer_free(b);
    if (tok->last) {
        req_release(r);
        evhttp_send_reply_end(r->req);
        req_unlink(r);
    } else if (r->cut_at && tok->index + 1 >= r->cut_at) {
        atc_sim_cancel(srv->sim, r->seq);
        r->seq = 0;
        die_soon(srv);
    } else if (pending_output(r->req) > MAX_PENDING_OUTPUT) {
        /* The client does not read: drop it instead of buffering the rest of its answer. */
        struct evhttp_connection *conn = evhttp_request_get_connection(r->req);
        atc_sim_cancel(srv->sim, r->seq);
        req_release(r);
        req_unlink(r);
        evhttp_connection_free(conn);
    }
}

/* ---- routes ---- */

/* Appends @p n bytes of @p in as base64 (RFC 4648, padded). */
static void add_base64(struct evbuffer *b, const unsigned char *in, size_t n)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t i = 0; i < n; i += 3) {
        unsigned v =
            (unsigned)in[i] << 16 | (i + 1 < n ? (unsigned)in[i + 1] << 8 : 0) | (i + 2 < n ? in[i + 2] : 0);
        char q[4] = {tab[v >> 18 & 63], tab[v >> 12 & 63], i + 1 < n ? tab[v >> 6 & 63] : '=',
                     i + 2 < n ? tab[v & 63] : '='};
        evbuffer_add(b, q, 4);
    }
}

/* The body's encoding_format: 0 "float" (or absent), 1 "base64", -1 anything else. */
static int encoding_format(const char *body, size_t len)
{
    struct atc_json j = {0};
    char fmt[16];
    int rc = 0;
    if (atc_json_parse(&j, body, len, NULL) == 0) {
        int i = atc_json_get(&j, 0, "encoding_format");
        if (i >= 0 && !atc_json_is(&j, i, "null"))
            rc = atc_json_string(&j, i, fmt, sizeof(fmt), NULL) < 0 ? -1
                 : strcmp(fmt, "base64") == 0                       ? 1
                 : strcmp(fmt, "float") == 0                        ? 0
                                                                    : -1;
    }
    atc_json_dispose(&j);
    return rc;
}

/* A small vector drawn from the prompt's first block: equal prompts get equal vectors. With
 * encoding_format "base64" (what the official OpenAI SDK asks for by default) the same vector goes as
 * base64 of little-endian float32s, as OpenAI and vLLM send it. */
static void send_embedding(struct atc_sim_server *srv, struct evhttp_request *req,
                           const struct atc_features *f, int base64)
{
    struct evbuffer *b = evbuffer_new();
    if (!b) {
        send_error(req, 500, "InternalServerError", "out of memory");
        return;
    }
    evbuffer_add_printf(
        b, "{\"object\":\"list\",\"data\":[{\"object\":\"embedding\",\"index\":0,\"embedding\":%s",
        base64 ? "\"" : "[");
    uint64_t st = srv->p.seed ^ (f->nblocks ? f->blocks[0] : f->prompt_len);
    unsigned char raw[EMBEDDING_DIM * 4];
    for (int i = 0; i < EMBEDDING_DIM; i++) {
        /* rounded as the float list prints it, so both encodings carry the same numbers */
        float x = (float)(round((2 * draw_from(&st) - 1) * 1e6) / 1e6);
        if (!base64) {
            evbuffer_add_printf(b, "%s%.6f", i ? "," : "", (double)x);
            continue;
        }
        uint32_t u;
        memcpy(&u, &x, 4);
        for (int k = 0; k < 4; k++)
            raw[i * 4 + k] = (unsigned char)(u >> (8 * k)); /* little-endian whatever the host */
    }
    if (base64) {
        add_base64(b, raw, sizeof(raw));
        evbuffer_add(b, "\"", 1);
    } else {
        evbuffer_add(b, "]", 1);
    }
    evbuffer_add_printf(b, "}],\"model\":");
    add_json_string(b, srv->p.model);
    evbuffer_add_printf(b, ",\"usage\":{\"prompt_tokens\":%u,\"total_tokens\":%u}}", f->prompt_tokens,
                        f->prompt_tokens);
    set_content_type(req, "application/json");
    evhttp_send_reply(req, HTTP_OK, "OK", b);
    evbuffer_free(b);
}

static void handle_inference(struct atc_sim_server *srv, struct evhttp_request *req,
                             enum atc_request_kind kind)
{
    struct atc_features f;
    const char *err = NULL;
    if (!is_ready(srv)) {
        send_error(req, 503, "ServiceUnavailableError", "The server is starting up.");
        return;
    }
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t len = evbuffer_get_length(in);
    const char *body = (const char *)evbuffer_pullup(in, -1);
    if (atc_features_scan(kind, body ? body : "", body ? len : 0, &f, &err) < 0) {
        send_error(req, 400, "BadRequestError", err);
        return;
    }
    if (f.has_model && strcmp(f.model, srv->p.model) != 0) {
        char msg[ATC_FEATURES_NAME_MAX + 64];
        snprintf(msg, sizeof(msg), "The model `%s` does not exist.", f.model);
        send_error(req, 404, "NotFoundError", msg);
        return;
    }
    if (f.max_tokens == 0) {
        send_error(req, 400, "BadRequestError", "max_tokens must be at least 1, got 0.");
        return;
    }

    /* Accepted. Both fault draws are made for every request so that one outcome does not shift the
     * next request's draws. */
    uint64_t num = ++srv->accepted;
    bool fail = draw_from(&srv->rng) < srv->p.error_rate, hang = draw_from(&srv->rng) < srv->p.hang_rate;
    bool cut = srv->p.die_after && num == (uint64_t)srv->p.die_after + 1;
    if (srv->dying || (cut && !(f.stream && kind != ATC_KIND_EMBEDDING)))
        hang = true; /* the last request of a dying server, or one arriving while it dies */
    if (cut && hang)
        die_soon(srv);
    if (fail && !hang && !cut) {
        send_error(req, 500, "InternalServerError", "Simulated failure (error_rate).");
        return;
    }
    if (kind == ATC_KIND_EMBEDDING && !hang) {
        int base64 = encoding_format(body ? body : "", body ? len : 0);
        if (base64 < 0)
            send_error(req, 400, "BadRequestError", "encoding_format must be 'float' or 'base64'.");
        else
            send_embedding(srv, req, &f, base64);
        return;
    }
    struct sim_req *r = req_track(srv, req);
    if (!r) {
        send_error(req, 500, "InternalServerError", "out of memory");
        return;
    }
    r->num = num;
    r->kind = kind;
    r->stream = f.stream && kind != ATC_KIND_EMBEDDING;
    r->prompt_tokens = f.prompt_tokens > 0 ? f.prompt_tokens : 1;
    r->length = f.max_tokens > 0;
    if (hang)
        return; /* kept until the client or the server goes away */

    if (!r->stream && !(r->text = evbuffer_new()))
        goto oom;
    struct atc_sim_request mreq = {
        .prompt_tokens = r->prompt_tokens,
        .max_tokens = f.max_tokens,
        .blocks = f.blocks,
        .nblocks = f.nblocks,
        .block_tokens = BLOCK_TOKENS,
    };
    r->seq = atc_sim_submit(srv->sim, now_us(srv), &mreq, r, &r->output_tokens);
    if (!r->seq)
        goto oom;
    if (cut)
        r->cut_at = r->output_tokens / 2 > 0 ? r->output_tokens / 2 : 1;
    schedule(srv);
    return;
oom:
    req_release(r);
    req_unlink(r);
    send_error(req, 500, "InternalServerError", "out of memory");
}

static void handle_models(struct atc_sim_server *srv, struct evhttp_request *req)
{
    struct evbuffer *b = evbuffer_new();
    if (!b) {
        send_error(req, 500, "InternalServerError", "out of memory");
        return;
    }
    evbuffer_add_printf(b, "{\"object\":\"list\",\"data\":[");
    if (is_ready(srv)) {
        evbuffer_add_printf(b, "{\"id\":");
        add_json_string(b, srv->p.model);
        evbuffer_add_printf(b, ",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"atc-sim\",\"root\":",
                            (long long)time(NULL));
        add_json_string(b, srv->p.model);
        evbuffer_add_printf(b, ",\"parent\":null}");
    }
    evbuffer_add_printf(b, "]}");
    set_content_type(req, "application/json");
    evhttp_send_reply(req, HTTP_OK, "OK", b);
    evbuffer_free(b);
}

static void add_metric(struct evbuffer *b, const struct atc_sim_server *srv, const char *name,
                       const char *type, const char *help, double v)
{
    evbuffer_add_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s{model_name=", name, help, name, type, name);
    add_json_string(b, srv->p.model); /* Prometheus label escaping is JSON's for \ and " */
    evbuffer_add_printf(b, "} %.17g\n", v);
}

static void handle_metrics(struct atc_sim_server *srv, struct evhttp_request *req)
{
    struct atc_sim_stats st;
    struct evbuffer *b = evbuffer_new();
    if (!b) {
        send_error(req, 500, "InternalServerError", "out of memory");
        return;
    }
    /* Bring the model up to now, so a scrape right after a token sees it. */
    atc_sim_advance(srv->sim, now_us(srv));
    schedule(srv);
    atc_sim_stats(srv->sim, &st);
    add_metric(b, srv, "vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
               st.running);
    add_metric(b, srv, "vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
               st.waiting);
    add_metric(b, srv, "vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
               st.kv_usage);
    add_metric(b, srv, "vllm:prefix_cache_queries_total", "counter",
               "Prefix cache queries, in terms of number of queried tokens.", (double)st.prefix_queries);
    add_metric(b, srv, "vllm:prefix_cache_hits_total", "counter",
               "Prefix cache hits, in terms of number of cached tokens.", (double)st.prefix_hits);
    add_metric(b, srv, "vllm:num_preemptions_total", "counter",
               "Cumulative number of preemption from the engine.", (double)st.preemptions);
    add_metric(b, srv, "vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
               (double)st.tokens);
    /* vLLM's info metric: the cache's size is in its labels (atc's scrape learns ep.kv_tokens from it). */
    evbuffer_add_printf(b,
                        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
                        "# TYPE vllm:cache_config_info gauge\n"
                        "vllm:cache_config_info{block_size=\"%u\",num_gpu_blocks=\"%llu\"} 1.0\n",
                        (unsigned)ATC_SIM_KV_BLOCK_TOKENS,
                        (unsigned long long)(atc_sim_params_kv_tokens(&srv->p) / ATC_SIM_KV_BLOCK_TOKENS));
    set_content_type(req, "text/plain; version=0.0.4; charset=utf-8");
    evhttp_send_reply(req, HTTP_OK, "OK", b);
    evbuffer_free(b);
}

static void on_request(struct evhttp_request *req, void *arg)
{
    struct atc_sim_server *srv = arg;
    const char *path = evhttp_uri_get_path(evhttp_request_get_evhttp_uri(req));
    enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
    bool get = cmd == EVHTTP_REQ_GET || cmd == EVHTTP_REQ_HEAD, post = cmd == EVHTTP_REQ_POST;
    if (!path)
        path = "";

    if (strcmp(path, "/v1/chat/completions") == 0 && post)
        handle_inference(srv, req, ATC_KIND_CHAT);
    else if (strcmp(path, "/v1/completions") == 0 && post)
        handle_inference(srv, req, ATC_KIND_COMPLETION);
    else if (strcmp(path, "/v1/embeddings") == 0 && post)
        handle_inference(srv, req, ATC_KIND_EMBEDDING);
    else if (strcmp(path, "/v1/models") == 0 && get)
        handle_models(srv, req);
    else if (strcmp(path, "/health") == 0 && get)
        evhttp_send_reply(req, is_ready(srv) ? HTTP_OK : 503, is_ready(srv) ? "OK" : "Service Unavailable",
                          NULL);
    else if (strcmp(path, "/metrics") == 0 && get)
        handle_metrics(srv, req);
    else if (strcmp(path, "/v1/chat/completions") == 0 || strcmp(path, "/v1/completions") == 0 ||
             strcmp(path, "/v1/embeddings") == 0 || strcmp(path, "/v1/models") == 0 ||
             strcmp(path, "/health") == 0 || strcmp(path, "/metrics") == 0)
        send_error(req, 405, "MethodNotAllowed", "Method Not Allowed");
    else
        send_error(req, 404, "NotFoundError", "Not Found");
}

/* ---- start / stop ---- */

struct atc_sim_server *atc_sim_server_start(struct event_base *base, const struct atc_sim_params *p,
                                            const char *host, uint16_t port, const char **err)
{
    struct atc_sim_server *srv = calloc(1, sizeof(*srv));
    *err = "out of memory";
    if (!srv)
        return NULL;
    srv->base = base;
    srv->p = *p;
    srv->p.model = strdup(p->model ? p->model : "llama-3-8b");
    srv->rng = p->seed ^ 0x5eed5eed5eed5eedULL; /* a stream apart from the model's */
    srv->t0 = atc_mono_us();
    if (!srv->p.model || !(srv->sim = atc_sim_create(&srv->p, on_token, srv)) ||
        !(srv->timer = evtimer_new(base, on_timer, srv)) || !(srv->die_ev = evtimer_new(base, on_die, srv)) ||
        !(srv->http = evhttp_new(base)))
        goto error;
    evhttp_set_max_body_size(srv->http, MAX_BODY);
    evhttp_set_allowed_methods(srv->http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD | EVHTTP_REQ_POST |
                                              EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE | EVHTTP_REQ_OPTIONS |
                                              EVHTTP_REQ_PATCH);
    evhttp_set_gencb(srv->http, on_request, srv);
    struct evhttp_bound_socket *bound = evhttp_bind_socket_with_handle(srv->http, host, port);
    if (!bound) {
        *err = "cannot listen (address in use or invalid)";
        goto error;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getsockname(evhttp_bound_socket_get_fd(bound), (struct sockaddr *)&ss, &sl) < 0) {
        *err = "getsockname failed";
        goto error;
    }
    srv->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
    *err = NULL;
    return srv;
error:
    atc_sim_server_stop(srv);
    return NULL;
}

uint16_t atc_sim_server_port(const struct atc_sim_server *s)
{
    return s->port;
}

void atc_sim_server_set_on_death(struct atc_sim_server *s, void (*on_death)(void *arg), void *arg)
{
    s->on_death = on_death;
    s->on_death_arg = arg;
}

void atc_sim_server_stop(struct atc_sim_server *s)
{
    if (!s)
        return;
    drop_all(s);
    if (s->http)
        evhttp_free(s->http);
    if (s->timer)
        event_free(s->timer);
    if (s->die_ev)
        event_free(s->die_ev);
    atc_sim_destroy(s->sim);
    free(s->p.model);
    free(s);
}
