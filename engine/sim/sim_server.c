/* The simulated inference server: sim.c's model behind atc's HTTP server (http/http_server.h); see
 * sim_server.h for the routes.
 *
 * Lifetimes: every inference request we hold (being generated, or hanging) is a struct sim_req on the
 * server's list, with callbacks on its HTTP request. When the client goes away the server tells us
 * (on_client_gone, from the loop); we cancel the sequence and free our record. Before the last piece of
 * an answer we clear the callbacks: the request is the server's again once answered. */

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
#include <strings.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "config/config.h"
#include "base/json.h"
#include "base/log.h"
#include "sim/sim_disagg.h"
#include "sim/sim_embed.h"
#include "http/http_server.h"
#include "request/request_features.h"
#include "base/clock.h"
#include "sim/sim_kv_publish.h"
#include "sim/sim_metrics.h"
#include "sim/sim_tokenize.h"

#define MAX_BODY (32u << 20)
#define MAX_PENDING_OUTPUT (4u << 20) /* a client this far behind is dropped rather than buffered for */
#define SGLANG_HEALTH_MS 1000         /* SGLang's /health: a one-token generation, then asyncio.sleep(1) */

/* How each engine's HTTP face differs, read from its source (sim_server.h has the citations). */
struct engine_face {
    bool headers_first;  /* a stream's headers go out at once, its first event after prefill */
    bool refuse_loading; /* while loading, the port is bound but not listening: connections are refused */
    bool usage_details;  /* usage carries prompt_tokens_details.cached_tokens */
};

static const struct engine_face faces[] = {
    [ATC_SIM_VLLM] = {.headers_first = true, .refuse_loading = true, .usage_details = true},
    [ATC_SIM_SGLANG] = {.headers_first = true, .refuse_loading = true, .usage_details = true},
    [ATC_SIM_LLAMACPP] = {.headers_first = false, .refuse_loading = false, .usage_details = false},
    [ATC_SIM_TGI] = {.headers_first = true, .refuse_loading = true, .usage_details = false},
};

/* What went wrong, each engine's status and body for it chosen by send_error. */
enum err_kind {
    ERR_INVALID,      /* a request the engine refuses (vLLM 400; TGI 422 "validation") */
    ERR_MODEL,        /* another model's name (404) */
    ERR_ROUTE,        /* no such path (404) */
    ERR_METHOD,       /* a known path with another method (405) */
    ERR_OOM,          /* the sim itself failed (500) */
    ERR_FAILURE,      /* error_rate (500; TGI 424 "generation") */
    ERR_OVERLOADED,   /* max_concurrent reached (429, TGI's "overloaded") */
    ERR_LOADING,      /* llama.cpp while loading (503 "Loading model") */
    ERR_UNAUTHORIZED, /* api_key (401) */
};

/* One of a request's n choices, a sequence of its own in the model: vLLM V1 fans a request with n > 1
 * out into n child requests (vllm/v1/engine/parallel_sampling.py, ParentRequest), each scheduled, and
 * holding KV, as any request; the children after the first find the prompt's blocks cached. */
struct sim_choice {
    uint64_t seq; /* sequence in the model; 0 = none (hanging, finished or cancelled) */
    uint32_t output_tokens;
    bool role_sent;        /* stream: the chat's role chunk for this choice is out */
    struct evbuffer *text; /* non-streaming: the answer so far */
};

struct sim_req {
    struct sim_req *prev, *next;
    struct atc_sim_server *srv;
    struct atc_http_req *req;
    uint64_t num; /* accept order: seeds the id and the words */
    enum atc_request_kind kind;
    bool stream;
    bool started;           /* stream: the headers are out */
    bool include_usage;     /* stream: stream_options.include_usage, a usage chunk after the last token */
    uint32_t cached_tokens; /* prompt tokens found in the prefix cache as it arrived */
    bool length;            /* finish_reason "length": the output length was max_tokens */
    uint32_t prompt_tokens;
    uint32_t cut_at; /* die after sending this many tokens of a choice; 0 = never */
    int64_t created;
    uint32_t n, finished;        /* choices, and those whose last token is out */
    struct sim_choice choices[]; /* n of them */
};

struct atc_sim_server {
    struct event_base *base;
    struct atc_http_server *http; /* NULL once dead */
    struct atc_sim_params p;
    struct atc_sim *sim;
    struct atc_sim_kv_pub *kv_pub; /* --kv-events: its KV-cache events over ZMQ; NULL without */
    struct atc_sim_tokenizer *tok; /* POST /tokenize, and --kv-events-hash's keys (sim_tokenize.h) */
    struct event *timer;           /* the model's next event */
    struct event *die_ev;          /* deferred death: never free the server from inside its own callbacks */
    uint64_t t0;                   /* CLOCK_MONOTONIC at start, us: model time is relative to it */
    uint64_t rng;                  /* fault draws */
    uint64_t accepted;             /* inference requests accepted, for die_after */
    uint16_t port;
    bool dying;
    struct sim_req *reqs;
    size_t nreqs;                     /* on reqs: the requests held, for max_concurrent */
    struct health_wait *health_waits; /* SGLang /health probes being answered */
    evutil_socket_t loading_fd;       /* bound, not listening yet (refuse_loading); -1 once listening */
    struct event *loaded_ev;          /* starts listening once not_ready_for has passed */
    const struct engine_face *face;
    struct atc_sim_disagg *disagg; /* its role in a disaggregated fleet (sim_disagg.h) */
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

/* An engine that refuses connections while loading is ready once it answers at all. */
static bool is_ready(const struct atc_sim_server *srv)
{
    return srv->face->refuse_loading || now_us(srv) >= srv->p.not_ready_for_ms * 1000u;
}

static const char *word(const struct atc_sim_server *srv, uint64_t num, uint32_t index)
{
    uint64_t st = srv->p.seed ^ (num * 0x9e3779b97f4a7c15ULL) ^ ((uint64_t)index << 32);
    return words[atc_sim_rand(&st) % (sizeof(words) / sizeof(words[0]))];
}

static void reply_buffer(struct atc_http_req *req, int code, const char *type, struct evbuffer *b)
{
    size_t len = evbuffer_get_length(b);
    atc_http_reply(req, code, type, NULL, evbuffer_pullup(b, -1), len);
}

static int err_status(const struct atc_sim_server *srv, enum err_kind k)
{
    static const int status[] = {[ERR_INVALID] = 400,    [ERR_MODEL] = 404,   [ERR_ROUTE] = 404,
                                 [ERR_METHOD] = 405,     [ERR_OOM] = 500,     [ERR_FAILURE] = 500,
                                 [ERR_OVERLOADED] = 429, [ERR_LOADING] = 503, [ERR_UNAUTHORIZED] = 401};
    if (srv->p.engine == ATC_SIM_TGI && k == ERR_INVALID)
        return 422; /* router/src/server.rs: InferError::ValidationError -> UNPROCESSABLE_ENTITY */
    if (srv->p.engine == ATC_SIM_TGI && k == ERR_FAILURE)
        return 424; /* InferError::GenerationError -> FAILED_DEPENDENCY */
    return status[k];
}

/* The body of an error in the engine's shape:
 *   vLLM (vllm/entrypoints/openai/protocol.py ErrorResponse)  {"error":{"message","type","param","code"}}
 *   SGLang (python/sglang/srt/entrypoints/openai/protocol.py)
 * {"object":"error","message","type","param","code"} llama.cpp (tools/server/utils.hpp format_error_response)
 * {"error":{"code","message","type"}} TGI (router/src/server.rs, ErrorResponse)
 * {"error":"...","error_type":"..."} A 401 is the engine's auth middleware's: {"error":"Unauthorized"} for
 * vLLM (server_utils.py AuthenticationMiddleware) and SGLang (add_api_key_middleware), llama.cpp's "Invalid
 * API Key" authentication_error, and TGI's bare StatusCode::UNAUTHORIZED (no body). */
static void add_error_body(struct evbuffer *b, const struct atc_sim_server *srv, enum err_kind k,
                           const char *msg)
{
    static const char *const openai_type[] = {[ERR_INVALID] = "BadRequestError",
                                              [ERR_MODEL] = "NotFoundError",
                                              [ERR_ROUTE] = "NotFoundError",
                                              [ERR_METHOD] = "MethodNotAllowed",
                                              [ERR_OOM] = "InternalServerError",
                                              [ERR_FAILURE] = "InternalServerError",
                                              [ERR_OVERLOADED] = "TooManyRequestsError",
                                              [ERR_LOADING] = "ServiceUnavailableError",
                                              [ERR_UNAUTHORIZED] = "Unauthorized"};
    static const char *const llamacpp_type[] = {[ERR_INVALID] = "invalid_request_error",
                                                [ERR_MODEL] = "not_found_error",
                                                [ERR_ROUTE] = "not_found_error",
                                                [ERR_METHOD] = "not_found_error",
                                                [ERR_OOM] = "server_error",
                                                [ERR_FAILURE] = "server_error",
                                                [ERR_OVERLOADED] = "unavailable_error",
                                                [ERR_LOADING] = "unavailable_error",
                                                [ERR_UNAUTHORIZED] = "authentication_error"};
    static const char *const tgi_type[] = {
        [ERR_INVALID] = "validation",    [ERR_MODEL] = "validation",   [ERR_ROUTE] = "not_found",
        [ERR_METHOD] = "not_found",      [ERR_OOM] = "generation",     [ERR_FAILURE] = "generation",
        [ERR_OVERLOADED] = "overloaded", [ERR_LOADING] = "overloaded", [ERR_UNAUTHORIZED] = ""};
    int code = err_status(srv, k);
    switch (srv->p.engine) {
    case ATC_SIM_LLAMACPP:
        evbuffer_add_printf(b, "{\"error\":{\"code\":%d,\"message\":", code);
        atc_json_write_string(b, k == ERR_UNAUTHORIZED ? "Invalid API Key" : msg);
        evbuffer_add_printf(b, ",\"type\":\"%s\"}}", llamacpp_type[k]);
        return;
    case ATC_SIM_TGI:
        evbuffer_add_printf(b, "{\"error\":");
        atc_json_write_string(b, msg);
        evbuffer_add_printf(b, ",\"error_type\":\"%s\"}", tgi_type[k]);
        return;
    default:
        if (k == ERR_UNAUTHORIZED) {
            evbuffer_add_printf(b, "{\"error\":\"Unauthorized\"}");
            return;
        }
        evbuffer_add_printf(b, srv->p.engine == ATC_SIM_SGLANG ? "{\"object\":\"error\",\"message\":"
                                                               : "{\"error\":{\"message\":");
        atc_json_write_string(b, msg);
        evbuffer_add_printf(b, ",\"type\":\"%s\",\"param\":null,\"code\":%d}%s", openai_type[k], code,
                            srv->p.engine == ATC_SIM_SGLANG ? "" : "}");
    }
}

static void send_error(const struct atc_sim_server *srv, struct atc_http_req *req, enum err_kind k,
                       const char *msg)
{
    if (srv->p.engine == ATC_SIM_TGI && (k == ERR_UNAUTHORIZED || k == ERR_ROUTE || k == ERR_METHOD)) {
        atc_http_reply(req, err_status(srv, k), NULL, NULL, "", 0); /* axum's bare status codes */
        return;
    }
    struct evbuffer *b = evbuffer_new();
    if (!b) {
        atc_http_req_abort(req);
        return;
    }
    add_error_body(b, srv, k, msg);
    reply_buffer(req, err_status(srv, k), "application/json", b);
    evbuffer_free(b);
}

/* TGI checks and queues a streamed request inside its SSE stream (generate_stream_internal): a
 * validation error, an overload or a failure is a 200 whose one event is the error. */
static void send_stream_error(const struct atc_sim_server *srv, struct atc_http_req *req, enum err_kind k,
                              const char *msg)
{
    struct evbuffer *b = evbuffer_new();
    if (!b) {
        atc_http_req_abort(req);
        return;
    }
    evbuffer_add(b, "data: ", 6); /* axum's Event::json_data */
    add_error_body(b, srv, k, msg);
    evbuffer_add(b, "\n\n", 2);
    atc_http_reply_start(req, 200, "text/event-stream", "Cache-Control: no-cache\r\n");
    atc_http_reply_chunk_buffer(req, b);
    atc_http_reply_end(req);
    evbuffer_free(b);
}

/* ---- requests we hold ---- */

static void schedule(struct atc_sim_server *srv);
static void health_unlink(struct health_wait *h);

static void req_unlink(struct sim_req *r)
{
    struct atc_sim_server *srv = r->srv;
    if (r->prev)
        r->prev->next = r->next;
    else
        srv->reqs = r->next;
    if (r->next)
        r->next->prev = r->prev;
    srv->nreqs--;
    for (uint32_t i = 0; i < r->n; i++)
        if (r->choices[i].text)
            evbuffer_free(r->choices[i].text);
    free(r);
}

/* Stops every choice's sequence in the model. */
static void cancel_all(struct sim_req *r)
{
    for (uint32_t i = 0; i < r->n; i++) {
        if (r->choices[i].seq)
            atc_sim_cancel(r->srv->sim, r->choices[i].seq);
        r->choices[i].seq = 0;
    }
}

/* Stops hearing of @p r's connection: the request is the HTTP server's again. */
static void req_release(struct sim_req *r)
{
    atc_http_req_set_callbacks(r->req, NULL, NULL);
}

static void on_client_gone(void *arg)
{
    struct sim_req *r = arg;
    struct atc_sim_server *srv = r->srv;
    cancel_all(r);
    atc_sim_disagg_gone(srv->disagg);
    req_unlink(r);
    schedule(srv);
}

static const struct atc_http_req_callbacks client_cb = {.on_gone = on_client_gone};

static struct sim_req *req_track(struct atc_sim_server *srv, struct atc_http_req *req, uint32_t n)
{
    struct sim_req *r = calloc(1, sizeof(*r) + n * sizeof(r->choices[0]));
    if (!r)
        return NULL;
    r->n = n;
    r->srv = srv;
    r->req = req;
    r->created = (int64_t)time(NULL);
    r->next = srv->reqs;
    if (srv->reqs)
        srv->reqs->prev = r;
    srv->reqs = r;
    srv->nreqs++;
    atc_http_req_set_callbacks(req, &client_cb, r);
    return r;
}

/* Forgets every request without answering; their connections are closed by the caller. */
static void drop_all(struct atc_sim_server *srv)
{
    while (srv->health_waits)
        health_unlink(srv->health_waits);
    while (srv->reqs) {
        struct sim_req *r = srv->reqs;
        req_release(r);
        cancel_all(r);
        req_unlink(r);
    }
}

/* ---- SGLang's /health: it runs a one-token generation and answers after about a second ---- */

struct health_wait {
    struct health_wait *prev, *next;
    struct atc_sim_server *srv;
    struct atc_http_req *req;
    struct event *ev;
};

static void health_unlink(struct health_wait *h)
{
    atc_http_req_set_callbacks(h->req, NULL, NULL);
    if (h->prev)
        h->prev->next = h->next;
    else
        h->srv->health_waits = h->next;
    if (h->next)
        h->next->prev = h->prev;
    event_free(h->ev);
    free(h);
}

static void on_health_gone(void *arg)
{
    health_unlink(arg);
}

static const struct atc_http_req_callbacks health_cb = {.on_gone = on_health_gone};

static void on_health_due(evutil_socket_t fd, short what, void *arg)
{
    struct health_wait *h = arg;
    struct atc_http_req *req = h->req;
    health_unlink(h);
    atc_http_reply(req, 200, NULL, NULL, "", 0);
}

static void health_later(struct atc_sim_server *srv, struct atc_http_req *req)
{
    const struct timeval tv = atc_timeval_ms(SGLANG_HEALTH_MS);
    struct health_wait *h = calloc(1, sizeof(*h));
    if (!h || !(h->ev = evtimer_new(srv->base, on_health_due, h))) {
        free(h);
        send_error(srv, req, ERR_OOM, "out of memory");
        return;
    }
    h->srv = srv;
    h->req = req;
    h->next = srv->health_waits;
    if (srv->health_waits)
        srv->health_waits->prev = h;
    srv->health_waits = h;
    atc_http_req_set_callbacks(req, &health_cb, h);
    evtimer_add(h->ev, &tv);
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
    struct timeval tv = atc_timeval_us(d);
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
    atc_http_server_destroy(srv->http); /* the listener and every connection, idle ones too */
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
    atc_json_write_string(b, r->srv->p.model);
}

/* vLLM's UsageInfo. prompt_tokens_details is sent only with --enable-prompt-tokens-details by vLLM
 * (serving_chat.py, serving_completion.py); the sim always sends it for vLLM and SGLang, so a client or
 * atc can read the prefix cache's hits per request. */
static void add_usage(struct evbuffer *b, const struct sim_req *r)
{
    uint32_t out = 0; /* every choice's tokens (serving_chat.py sums them) */
    for (uint32_t i = 0; i < r->n; i++)
        out += r->choices[i].output_tokens;
    evbuffer_add_printf(b, ",\"usage\":{\"prompt_tokens\":%u,\"completion_tokens\":%u,\"total_tokens\":%u",
                        r->prompt_tokens, out, r->prompt_tokens + out);
    if (r->srv->face->usage_details)
        evbuffer_add_printf(b, ",\"prompt_tokens_details\":{\"cached_tokens\":%u}", r->cached_tokens);
    evbuffer_add(b, "}", 1);
}

/* One SSE event: choice @p index's chunk carrying @p text (NULL = an empty delta) and @p finish (NULL =
 * null). */
static void add_event(struct evbuffer *b, const struct sim_req *r, uint32_t index, const char *role,
                      const char *text, const char *finish)
{
    evbuffer_add(b, "data: ", 6);
    add_head(b, r, true);
    evbuffer_add_printf(b, ",\"choices\":[{\"index\":%u,", index);
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
    evbuffer_add(b, "}\n\n", 3);
}

/* The last chunk with stream_options.include_usage: no choices, the usage (serving_chat.py). */
static void add_usage_event(struct evbuffer *b, const struct sim_req *r)
{
    evbuffer_add(b, "data: ", 6);
    add_head(b, r, true);
    evbuffer_add_printf(b, ",\"choices\":[]");
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
    evbuffer_add_printf(b, ",\"choices\":[");
    for (uint32_t i = 0; i < r->n; i++) {
        if (r->kind == ATC_KIND_CHAT)
            evbuffer_add_printf(b, "%s{\"index\":%u,\"message\":{\"role\":\"assistant\",\"content\":\"",
                                i ? "," : "", i);
        else
            evbuffer_add_printf(b, "%s{\"index\":%u,\"text\":\"", i ? "," : "", i);
        evbuffer_add_buffer(b, r->choices[i].text);
        evbuffer_add_printf(b, "\"%s,\"logprobs\":null,\"finish_reason\":\"%s\"}",
                            r->kind == ATC_KIND_CHAT ? "}" : "", finish);
    }
    evbuffer_add(b, "]", 1);
    add_usage(b, r);
    atc_sim_disagg_answer(r->srv->disagg, b, r->srv->port, r->num, r->prompt_tokens);
    evbuffer_add(b, "}", 1);
    reply_buffer(r->req, 200, "application/json", b);
    evbuffer_free(b);
}

static void on_token(void *ctx, const struct atc_sim_token *tok)
{
    struct atc_sim_server *srv = ctx;
    struct sim_req *r = tok->user;
    uint32_t i = 0;
    while (i + 1 < r->n && r->choices[i].seq != tok->id)
        i++;
    struct sim_choice *c = &r->choices[i];
    char text[64];
    snprintf(text, sizeof(text), "%s ", word(srv, r->num + ((uint64_t)i << 40), tok->index));
    if (tok->last) {
        c->seq = 0; /* forgotten by the model after this call */
        r->finished++;
    }
    bool done = r->finished == r->n;

    if (!r->stream) {
        evbuffer_add(c->text, text, strlen(text));
        if (done) {
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
        /* llama.cpp reads the first result before it answers (tools/server/server.cpp,
         * handle_completions_impl), so its headers go out with the first token. */
        atc_http_reply_start(r->req, 200, "text/event-stream; charset=utf-8", "Cache-Control: no-cache\r\n");
        r->started = true;
    }
    if (!c->role_sent && r->kind == ATC_KIND_CHAT)
        add_event(b, r, i, "assistant", "", NULL); /* vLLM's first chunk: the role, on the first output */
    c->role_sent = true;
    /* The finish_reason rides on the last content chunk, as vLLM's. */
    add_event(b, r, i, NULL, text, tok->last ? (r->length ? "length" : "stop") : NULL);
    if (done) {
        if (r->include_usage)
            add_usage_event(b, r);
        evbuffer_add_printf(b, "data: [DONE]\n\n");
        req_release(r); /* before the last bytes: the request is the server's once they are out */
    }
    atc_http_reply_chunk_buffer(r->req, b);
    evbuffer_free(b);
    if (done) {
        atc_http_reply_end(r->req);
        req_unlink(r);
    } else if (r->cut_at && tok->index + 1 >= r->cut_at) {
        cancel_all(r);
        die_soon(srv);
    } else if (atc_http_req_backlog(r->req) > MAX_PENDING_OUTPUT) {
        /* The client does not read: drop it instead of buffering the rest of its answer. */
        struct atc_http_req *req = r->req;
        cancel_all(r);
        req_release(r);
        req_unlink(r);
        atc_http_req_abort(req);
    }
}

/* ---- routes ---- */

/* vLLM's /v1/embeddings answer (sim_embed.h). */
static void send_embedding(struct atc_sim_server *srv, struct atc_http_req *req, const struct atc_features *f,
                           const char *body, size_t len)
{
    struct evbuffer *b = evbuffer_new();
    const char *err = "out of memory";
    if (b != NULL && atc_sim_embeddings(b, srv->p.seed, srv->p.model, body, len, f->prompt_tokens, &err) == 0)
        reply_buffer(req, 200, "application/json", b);
    else
        send_error(srv, req, b != NULL ? ERR_INVALID : ERR_OOM, err);
    if (b != NULL)
        evbuffer_free(b);
}

/* stream_options.include_usage of the body (vLLM, SGLang, llama.cpp and TGI all read it). */
static bool wants_usage(const char *body, size_t len)
{
    struct atc_json j = {0};
    bool yes = false;
    if (atc_json_parse(&j, body, len, NULL) == 0) {
        int o = atc_json_get(&j, 0, "stream_options");
        if (o >= 0 && atc_json_type(&j, o) == ATC_JSON_OBJECT) {
            int u = atc_json_get(&j, o, "include_usage");
            if (u >= 0 && !atc_json_bool(&j, u, &yes))
                yes = false;
        }
    }
    atc_json_dispose(&j);
    return yes;
}

#define MAX_CHOICES 1024 /* the sim's own bound on n (vLLM has none) */

/* The body's n: how many choices (1 when absent or null). vLLM refuses n < 1 ("n must be at least 1,
 * got 0.": vllm/sampling_params.py _verify_args); llama.cpp's chat any n but 1 (tools/server/utils.hpp,
 * oaicompat_chat_params_parse). Returns 0, or -1 with the 400's message in @p msg. */
static int choices_of(const struct atc_sim_server *srv, enum atc_request_kind kind, const char *body,
                      size_t len, uint32_t *n, char *msg, size_t cap)
{
    struct atc_json j = {0};
    double d = 1;
    int rc = 0;
    if (atc_json_parse(&j, body, len, NULL) == 0) {
        int t = atc_json_get(&j, 0, "n");
        size_t raw_len;
        const char *raw = t >= 0 ? atc_json_raw(&j, t, &raw_len) : NULL;
        bool null = raw != NULL && atc_json_type(&j, t) == ATC_JSON_PRIMITIVE && raw_len == 4 &&
                    memcmp(raw, "null", 4) == 0;
        if (t >= 0 && !null && (!atc_json_number(&j, t, &d) || d != floor(d) || fabs(d) > 1e15)) {
            snprintf(msg, cap, "n must be an integer.");
            rc = -1;
        }
    }
    atc_json_dispose(&j);
    long long v = (long long)d;
    if (rc == 0 && v < 1) {
        snprintf(msg, cap, "n must be at least 1, got %lld.", v);
        rc = -1;
    } else if (rc == 0 && v != 1 && srv->p.engine == ATC_SIM_LLAMACPP && kind == ATC_KIND_CHAT) {
        snprintf(msg, cap, "Only one completion choice is allowed");
        rc = -1;
    } else if (rc == 0 && v > MAX_CHOICES) {
        snprintf(msg, cap, "atc sim answers at most %d choices, got n = %lld.", MAX_CHOICES, v);
        rc = -1;
    }
    *n = rc == 0 && kind != ATC_KIND_EMBEDDING ? (uint32_t)v : 1;
    return rc;
}

/* vLLM refuses a prompt plus max_tokens (unset: the prompt alone, which must leave a token) past its
 * max_model_len before the request is queued, in three wordings (vllm/entrypoints/openai/
 * serving_engine.py _validate_input; an embedding's input alone: serving_embedding.py _validate_input).
 * True when it answered so. */
static bool too_long(struct atc_sim_server *srv, struct atc_http_req *req, enum atc_request_kind kind,
                     const struct atc_features *f)
{
    unsigned long long ctx = srv->p.max_model_len ? srv->p.max_model_len : ATC_SIM_DEFAULT_MAX_MODEL_LEN;
    unsigned long long prompt = f->prompt_tokens,
                       out = f->max_tokens < 0 ? 0 : (unsigned long long)f->max_tokens;
    if (kind == ATC_KIND_EMBEDDING ? prompt <= ctx : f->max_tokens < 0 ? prompt < ctx : prompt + out <= ctx)
        return false;
    char msg[256];
    int n = snprintf(msg, sizeof(msg),
                     "This model's maximum context length is %llu tokens. However, you requested ", ctx);
    if (kind == ATC_KIND_EMBEDDING)
        snprintf(msg + n, sizeof(msg) - (size_t)n,
                 "%llu tokens in the input for embedding generation. Please reduce the length of the input.",
                 prompt);
    else if (f->max_tokens < 0)
        snprintf(msg + n, sizeof(msg) - (size_t)n,
                 "%llu tokens in the messages, Please reduce the length of the messages.", prompt);
    else
        snprintf(
            msg + n, sizeof(msg) - (size_t)n,
            "%llu tokens (%llu in the messages, %llu in the completion). Please reduce the length of the "
            "messages or completion.",
            prompt + out, prompt, out);
    (srv->p.engine == ATC_SIM_TGI && f->stream ? send_stream_error : send_error)(srv, req, ERR_INVALID, msg);
    return true;
}

static void handle_inference(struct atc_sim_server *srv, struct atc_http_req *req, enum atc_request_kind kind)
{
    struct atc_features f;
    const char *err = NULL;
    size_t len;
    const char *body = atc_http_req_body(req, &len);
    if (atc_features_scan(kind, body ? body : "", body ? len : 0, &f, &err) < 0) {
        send_error(srv, req, ERR_INVALID, err);
        return;
    }
    uint64_t keys[ATC_PREFIX_BLOCKS_MAX];
    if (srv->kv_pub != NULL) /* --kv-events-hash: its blocks go out under the engine-style keys */
        atc_sim_kv_pub_alias(srv->kv_pub, f.blocks, keys,
                             atc_sim_tokenizer_keys(srv->tok, &f, keys, f.nblocks));
    bool stream = f.stream && kind != ATC_KIND_EMBEDDING;
    bool tgi = srv->p.engine == ATC_SIM_TGI;
    /* TGI serves one model and does not read the request's model name. */
    if (!tgi && f.has_model && strcmp(f.model, srv->p.model) != 0) {
        char msg[ATC_FEATURES_NAME_MAX + 64];
        snprintf(msg, sizeof(msg), "The model `%s` does not exist.", f.model);
        send_error(srv, req, ERR_MODEL, msg);
        return;
    }
    struct atc_sim_disagg_req dg = {.max_tokens = f.max_tokens, .compute_prompt = true};
    if (kind != ATC_KIND_EMBEDDING &&
        atc_sim_disagg_check(srv->disagg, body ? body : "", body ? len : 0, f.max_tokens, f.prompt_tokens,
                             stream, &dg, &err) < 0) {
        send_error(srv, req, ERR_INVALID, err);
        return;
    }
    if (f.max_tokens == 0) {
        const char *msg = "max_tokens must be at least 1, got 0.";
        (tgi && stream ? send_stream_error : send_error)(srv, req, ERR_INVALID, msg);
        return;
    }
    uint32_t n;
    char msg[128];
    if (choices_of(srv, kind, body ? body : "", body ? len : 0, &n, msg, sizeof(msg)) < 0) {
        (tgi && stream ? send_stream_error : send_error)(srv, req, ERR_INVALID, msg);
        return;
    }
    if (too_long(srv, req, kind, &f))
        return;
    unsigned limit = srv->p.max_concurrent ? srv->p.max_concurrent : tgi ? ATC_SIM_TGI_MAX_CONCURRENT : 0;
    if (limit && srv->nreqs >= limit) {
        /* TGI's router: no permit of limit_concurrent_requests left (router/src/infer/mod.rs). */
        (tgi && stream ? send_stream_error : send_error)(srv, req, ERR_OVERLOADED, "Model is overloaded");
        return;
    }

    /* Accepted. Both fault draws are made for every request so that one outcome does not shift the
     * next request's draws. */
    uint64_t num = ++srv->accepted;
    bool fail = atc_sim_uniform(&srv->rng) < srv->p.error_rate,
         hang = atc_sim_uniform(&srv->rng) < srv->p.hang_rate;
    bool cut = srv->p.die_after && num == (uint64_t)srv->p.die_after + 1;
    if (srv->dying || (cut && !stream))
        hang = true; /* the last request of a dying server, or one arriving while it dies */
    if (cut && hang)
        die_soon(srv);
    if (fail && !hang && !cut) {
        (tgi && stream ? send_stream_error : send_error)(srv, req, ERR_FAILURE,
                                                         "Simulated failure (error_rate).");
        return;
    }
    if (kind == ATC_KIND_EMBEDDING && !hang) {
        send_embedding(srv, req, &f, body ? body : "", body ? len : 0);
        return;
    }
    struct sim_req *r = req_track(srv, req, n);
    if (!r) {
        send_error(srv, req, ERR_OOM, "out of memory");
        return;
    }
    r->num = num;
    r->kind = kind;
    r->stream = stream;
    r->include_usage = stream && wants_usage(body ? body : "", body ? len : 0);
    r->prompt_tokens = f.prompt_tokens > 0 ? f.prompt_tokens : 1;
    r->length = f.max_tokens > 0;
    if (hang)
        return; /* kept until the client or the server goes away, without a byte */
    /* The prefix cache's hits as the request arrives, in tokens; the last prompt token is always
     * computed (vLLM's num_cached_tokens). */
    uint64_t cached =
        (uint64_t)atc_sim_prefix_cached(srv->sim, f.blocks, f.nblocks) * ATC_PREFIX_BLOCK_TOKENS;
    r->cached_tokens = (uint32_t)(cached < r->prompt_tokens ? cached : r->prompt_tokens - 1);

    struct atc_sim_request mreq = {
        .prompt_tokens = r->prompt_tokens,
        .max_tokens = dg.max_tokens,
        .blocks = f.blocks,
        .nblocks = f.nblocks,
        .block_tokens = ATC_PREFIX_BLOCK_TOKENS,
        .kv_arrives = !dg.compute_prompt, /* a decode server reads the KV: it takes room, not prefill */
    };
    for (uint32_t i = 0; i < n; i++) {
        struct sim_choice *c = &r->choices[i];
        if (!r->stream && !(c->text = evbuffer_new()))
            goto oom;
        c->seq = atc_sim_submit(srv->sim, now_us(srv) + dg.transfer_us, &mreq, r, &c->output_tokens);
        if (!c->seq)
            goto oom;
    }
    if (cut)
        r->cut_at = r->choices[0].output_tokens / 2 > 0 ? r->choices[0].output_tokens / 2 : 1;
    if (stream && srv->face->headers_first) {
        /* vLLM, SGLang and TGI answer with a streaming response at once (FastAPI's StreamingResponse,
         * axum's Sse) and its first event comes with the first token, after prefill. */
        atc_http_reply_start(req, 200, "text/event-stream; charset=utf-8", "Cache-Control: no-cache\r\n");
        r->started = true;
    }
    schedule(srv);
    return;
oom:
    cancel_all(r);
    req_release(r);
    req_unlink(r);
    send_error(srv, req, ERR_OOM, "out of memory");
}

static void handle_models(struct atc_sim_server *srv, struct atc_http_req *req)
{
    struct evbuffer *b = evbuffer_new();
    if (!b) {
        send_error(srv, req, ERR_OOM, "out of memory");
        return;
    }
    evbuffer_add_printf(b, "{\"object\":\"list\",\"data\":[{\"id\":");
    atc_json_write_string(b, srv->p.model);
    evbuffer_add_printf(b, ",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"atc-sim\",\"root\":",
                        (long long)time(NULL));
    atc_json_write_string(b, srv->p.model);
    /* llama.cpp lets /v1/models through while it loads and names the model, its "meta" null until
     * loaded (tools/server/server.cpp get_models): the list alone does not tell it is ready. */
    if (srv->p.engine == ATC_SIM_LLAMACPP)
        evbuffer_add_printf(b, ",\"parent\":null,\"meta\":%s}]}", is_ready(srv) ? "{}" : "null");
    else
        evbuffer_add_printf(b, ",\"parent\":null}]}");
    reply_buffer(req, 200, "application/json", b);
    evbuffer_free(b);
}

static void handle_metrics(struct atc_sim_server *srv, struct atc_http_req *req)
{
    struct atc_sim_stats st;
    struct evbuffer *b = evbuffer_new();
    if (!b) {
        send_error(srv, req, ERR_OOM, "out of memory");
        return;
    }
    /* Bring the model up to now, so a scrape right after a token sees it. */
    atc_sim_advance(srv->sim, now_us(srv));
    schedule(srv);
    atc_sim_stats(srv->sim, &st);
    atc_sim_metrics_write(b, &srv->p, &st, srv->accepted);
    reply_buffer(req, 200, "text/plain; version=0.0.4; charset=utf-8", b);
    evbuffer_free(b);
}

/* ---- api_key ---- */

static bool has_prefix_segment(const char *path, const char *prefix)
{
    size_t n = strlen(prefix);
    return strncmp(path, prefix, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

/* The paths each engine's --api-key guards:
 *   vLLM: GUARDED_PREFIX ("/v1", "/v2", "/inference") of AuthenticationMiddleware
 *         (vllm/entrypoints/openai/server_utils.py); /health, /metrics, /ping are open.
 *   SGLang: everything but /health* and /metrics* (python/sglang/srt/utils.py add_api_key_middleware).
 *   llama.cpp: everything but public_endpoints /health, /v1/health, /models, /v1/models, /api/tags and
 *         "/" (tools/server/server-http.cpp middleware_validate_api_key).
 *   TGI: base_routes only: POST /, /generate, /generate_stream, /v1/chat/completions, /v1/completions,
 *         /vertex, /tokenize (router/src/server.rs); /health, /info, /metrics, /v1/models are open. */
static bool guarded(const struct atc_sim_server *srv, const char *path, bool post)
{
    switch (srv->p.engine) {
    case ATC_SIM_SGLANG:
        return strncmp(path, "/health", 7) != 0 && strncmp(path, "/metrics", 8) != 0;
    case ATC_SIM_LLAMACPP:
        return strcmp(path, "/") != 0 && strcmp(path, "/health") != 0 && strcmp(path, "/v1/health") != 0 &&
               strcmp(path, "/models") != 0 && strcmp(path, "/v1/models") != 0 &&
               strcmp(path, "/api/tags") != 0;
    case ATC_SIM_TGI:
        return post && (strcmp(path, "/") == 0 || strcmp(path, "/generate") == 0 ||
                        strcmp(path, "/generate_stream") == 0 || strcmp(path, "/v1/chat/completions") == 0 ||
                        strcmp(path, "/v1/completions") == 0 || strcmp(path, "/vertex") == 0 ||
                        strcmp(path, "/tokenize") == 0);
    default:
        return has_prefix_segment(path, "/v1") || has_prefix_segment(path, "/v2") ||
               has_prefix_segment(path, "/inference");
    }
}

/* Whether the Authorization header carries the key, as the engine compares it: vLLM a "bearer" scheme
 * in any case and the token exactly; SGLang the header exactly "Bearer KEY"; llama.cpp the token with or
 * without "Bearer " (or X-Api-Key); TGI "Bearer KEY" in any case. */
static bool key_ok(const struct atc_sim_server *srv, struct atc_http_req *req)
{
    const char *h = atc_http_req_header(req, "Authorization");
    const char *key = srv->p.api_key;
    switch (srv->p.engine) {
    case ATC_SIM_SGLANG:
        return h && strncmp(h, "Bearer ", 7) == 0 && strcmp(h + 7, key) == 0;
    case ATC_SIM_LLAMACPP:
        if (!h || !*h)
            h = atc_http_req_header(req, "X-Api-Key");
        if (h && strncmp(h, "Bearer ", 7) == 0)
            h += 7;
        return h && strcmp(h, key) == 0;
    case ATC_SIM_TGI:
        return h && strncasecmp(h, "Bearer ", 7) == 0 && strcasecmp(h + 7, key) == 0;
    default:
        return h && strncasecmp(h, "bearer ", 7) == 0 && strcmp(h + 7, key) == 0;
    }
}

/* llama.cpp while loading (middleware_server_state): "/" and *.html get the loading page, the model
 * lists go through, anything else is 503 "Loading model". Returns true when answered. */
static bool llamacpp_loading(struct atc_sim_server *srv, struct atc_http_req *req, const char *path)
{
    if (srv->p.engine != ATC_SIM_LLAMACPP || is_ready(srv))
        return false;
    size_t n = strlen(path);
    if (strcmp(path, "/") == 0 || (n >= 5 && strcmp(path + n - 5, ".html") == 0)) {
        static const char page[] = "<html><body>Loading model</body></html>\n";
        atc_http_reply(req, 503, "text/html; charset=utf-8", NULL, page, sizeof(page) - 1);
        return true;
    }
    if (strcmp(path, "/models") == 0 || strcmp(path, "/v1/models") == 0 || strcmp(path, "/api/tags") == 0)
        return false;
    send_error(srv, req, ERR_LOADING, "Loading model");
    return true;
}

static void handle_health(struct atc_sim_server *srv, struct atc_http_req *req)
{
    if (srv->p.engine == ATC_SIM_SGLANG)
        health_later(srv, req);
    else if (srv->p.engine == ATC_SIM_LLAMACPP)
        atc_http_reply(req, 200, "application/json; charset=utf-8", NULL, "{\"status\":\"ok\"}", 15);
    else
        atc_http_reply(req, 200, NULL, NULL, "", 0);
}

static void on_request(struct atc_http_req *req, void *arg)
{
    struct atc_sim_server *srv = arg;
    const char *path = atc_http_req_path(req);
    enum atc_http_method cmd = atc_http_req_method(req);
    bool get = cmd == ATC_HTTP_GET || cmd == ATC_HTTP_HEAD, post = cmd == ATC_HTTP_POST;

    if (llamacpp_loading(srv, req, path) || (get && atc_sim_disagg_route(srv->disagg, req, path)))
        return;
    if (srv->p.api_key && cmd != ATC_HTTP_OPTIONS && guarded(srv, path, post) && !key_ok(srv, req)) {
        send_error(srv, req, ERR_UNAUTHORIZED, "Unauthorized");
        return;
    }
    if (strcmp(path, "/v1/chat/completions") == 0 && post)
        handle_inference(srv, req, ATC_KIND_CHAT);
    else if (strcmp(path, "/v1/completions") == 0 && post)
        handle_inference(srv, req, ATC_KIND_COMPLETION);
    else if (strcmp(path, "/v1/embeddings") == 0 && post)
        handle_inference(srv, req, ATC_KIND_EMBEDDING);
    else if (strcmp(path, "/tokenize") == 0 && post)
        atc_sim_tokenizer_handle(srv->tok, req);
    else if (strcmp(path, "/v1/models") == 0 && get)
        handle_models(srv, req);
    else if (strcmp(path, "/health") == 0 && get)
        handle_health(srv, req);
    else if (strcmp(path, "/metrics") == 0 && get)
        handle_metrics(srv, req);
    else if (strcmp(path, "/v1/chat/completions") == 0 || strcmp(path, "/v1/completions") == 0 ||
             strcmp(path, "/v1/embeddings") == 0 || strcmp(path, "/v1/models") == 0 ||
             strcmp(path, "/health") == 0 || strcmp(path, "/metrics") == 0)
        send_error(srv, req, ERR_METHOD, "Method Not Allowed");
    else
        send_error(srv, req, ERR_ROUTE, "Not Found");
}

/* ---- start / stop ---- */

/* A socket bound to @p host : @p port, not listening yet; -1 with *err. */
static evutil_socket_t bind_socket(const char *host, uint16_t port, const char **err)
{
    struct evutil_addrinfo hints = {.ai_family = AF_UNSPEC,
                                    .ai_socktype = SOCK_STREAM,
                                    .ai_flags = EVUTIL_AI_PASSIVE | EVUTIL_AI_NUMERICHOST};
    struct evutil_addrinfo *ai = NULL;
    char ps[8];
    int one = 1;
    snprintf(ps, sizeof(ps), "%u", (unsigned)port);
    if (evutil_getaddrinfo(host, ps, &hints, &ai) != 0 || ai == NULL) {
        *err = "cannot resolve the listen address";
        return -1;
    }
    evutil_socket_t fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
        bind(fd, ai->ai_addr, (socklen_t)ai->ai_addrlen) < 0) {
        *err = "cannot listen (address in use or invalid)";
        if (fd >= 0)
            evutil_closesocket(fd);
        fd = -1;
    }
    evutil_freeaddrinfo(ai);
    return fd;
}

static uint16_t socket_port(evutil_socket_t fd)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0)
        return 0;
    if (ss.ss_family == AF_INET)
        return ntohs(((struct sockaddr_in *)&ss)->sin_port);
    if (ss.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    return 0;
}

/* Listens on the bound socket: from now on connections are accepted. */
static int start_listening(struct atc_sim_server *srv)
{
    evutil_socket_t fd = srv->loading_fd;
    srv->loading_fd = -1;
    if (listen(fd, 4096) < 0) {
        evutil_closesocket(fd);
        return -1;
    }
    return atc_http_server_listen(srv->http, fd); /* closes fd when it fails */
}

static void on_loaded(evutil_socket_t fd, short what, void *arg)
{
    struct atc_sim_server *srv = arg;
    if (srv->http && srv->loading_fd >= 0 && start_listening(srv) < 0)
        atc_warn("sim %s:%u: cannot listen once loaded", srv->p.model, srv->port);
}

struct atc_sim_server *atc_sim_server_start(struct event_base *base, const struct atc_sim_params *p,
                                            const char *host, uint16_t port, const char **err)
{
    struct atc_sim_server *srv = calloc(1, sizeof(*srv));
    const struct atc_http_server_config http_cfg = {
        .max_body = MAX_BODY,
        .timeout_ms = 60000, /* an idle keep-alive connection (atc keeps its own 30 s), a stalled request */
        .methods = ATC_HTTP_GET | ATC_HTTP_HEAD | ATC_HTTP_POST | ATC_HTTP_PUT | ATC_HTTP_DELETE |
                   ATC_HTTP_OPTIONS | ATC_HTTP_PATCH,
    };
    *err = "out of memory";
    if (!srv)
        return NULL;
    srv->base = base;
    srv->p = *p;
    srv->loading_fd = -1;
    srv->p.engine = p->engine < sizeof(faces) / sizeof(faces[0]) ? p->engine : ATC_SIM_VLLM;
    srv->face = &faces[srv->p.engine];
    srv->p.model = strdup(p->model ? p->model : "llama-3-8b");
    srv->p.api_key = NULL;
    srv->rng = p->seed ^ 0x5eed5eed5eed5eedULL; /* a stream apart from the model's */
    srv->t0 = atc_mono_us();
    if (!srv->p.model || (p->api_key && !(srv->p.api_key = strdup(p->api_key))) ||
        !(srv->sim = atc_sim_create(&srv->p, on_token, srv)) ||
        !(srv->disagg = atc_sim_disagg_create(&srv->p)) || !(srv->timer = evtimer_new(base, on_timer, srv)) ||
        !(srv->die_ev = evtimer_new(base, on_die, srv)) ||
        !(srv->loaded_ev = evtimer_new(base, on_loaded, srv)) ||
        !(srv->http = atc_http_server_create(base, &http_cfg, on_request, srv)))
        goto error;
    if (!(srv->tok = atc_sim_tokenizer_create(base, p->kv_events_hash, ATC_PREFIX_BLOCK_TOKENS,
                                              p->tokenize_delay_ms, err)))
        goto error;
    if (p->kv_events != NULL) {
        if (!(srv->kv_pub = atc_sim_kv_pub_create(base, p->kv_events, p->kv_events_replay,
                                                  ATC_PREFIX_BLOCK_TOKENS, p->kv_events_drop, err)))
            goto error; /* *err says why */
        atc_sim_set_kv_listener(srv->sim, atc_sim_kv_pub_on_kv, srv->kv_pub);
    }
    if ((srv->loading_fd = bind_socket(host, port, err)) < 0)
        goto error;
    srv->port = socket_port(srv->loading_fd);
    if (srv->face->refuse_loading && srv->p.not_ready_for_ms > 0) {
        /* vLLM binds its port before it builds the engine and serves (listens) only once it is up
         * (vllm/entrypoints/openai/api_server.py run_server: create_server_socket binds, serve_http
         * listens); SGLang and TGI start their HTTP server after loading too. */
        const struct timeval tv = atc_timeval_ms(srv->p.not_ready_for_ms);
        evtimer_add(srv->loaded_ev, &tv);
    } else if (start_listening(srv) < 0) {
        *err = "cannot listen (address in use or invalid)";
        goto error;
    }
    *err = NULL;
    return srv;
error:
    atc_sim_server_stop(srv);
    return NULL;
}

const struct atc_sim_kv_pub *atc_sim_server_kv_pub(const struct atc_sim_server *s)
{
    return s->kv_pub;
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
    atc_http_server_destroy(s->http);
    if (s->loading_fd >= 0)
        evutil_closesocket(s->loading_fd);
    if (s->timer)
        event_free(s->timer);
    if (s->die_ev)
        event_free(s->die_ev);
    if (s->loaded_ev)
        event_free(s->loaded_ev);
    atc_sim_destroy(s->sim);
    atc_sim_kv_pub_destroy(s->kv_pub);
    atc_sim_tokenizer_destroy(s->tok);
    atc_sim_disagg_free(s->disagg);
    free(s->p.model);
    free(s->p.api_key);
    free(s);
}
