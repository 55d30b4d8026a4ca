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
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "config/config.h"
#include "base/json.h"
#include "base/log.h"
#include "http/http_server.h"
#include "request/request_features.h"
#include "base/clock.h"

#define BLOCK_TOKENS (ATC_PREFIX_BLOCK_BYTES / 4) /* request_features estimates 4 bytes per token */
#define MAX_BODY (32u << 20)
#define MAX_PENDING_OUTPUT (4u << 20) /* a client this far behind is dropped rather than buffered for */
#define EMBEDDING_DIM 8

struct sim_req {
    struct sim_req *prev, *next;
    struct atc_sim_server *srv;
    struct atc_http_req *req;
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
};

struct atc_sim_server {
    struct event_base *base;
    struct atc_http_server *http; /* NULL once dead */
    struct atc_sim_params p;
    struct atc_sim *sim;
    struct event *timer;  /* the model's next event */
    struct event *die_ev; /* deferred death: never free the server from inside its own callbacks */
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

static void reply_buffer(struct atc_http_req *req, int code, const char *type, struct evbuffer *b)
{
    size_t len = evbuffer_get_length(b);
    atc_http_reply(req, code, type, NULL, evbuffer_pullup(b, -1), len);
}

/* An OpenAI error answer, as vLLM gives it (its code a number, as vLLM's). */
static void send_error(struct atc_http_req *req, int code, const char *type, const char *msg)
{
    struct evbuffer *b = evbuffer_new();
    if (!b) {
        atc_http_req_abort(req);
        return;
    }
    evbuffer_add_printf(b, "{\"error\":{\"message\":");
    add_json_string(b, msg);
    evbuffer_add_printf(b, ",\"type\":\"%s\",\"param\":null,\"code\":%d}}", type, code);
    reply_buffer(req, code, "application/json", b);
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
    free(r);
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
    if (r->seq)
        atc_sim_cancel(srv->sim, r->seq);
    req_unlink(r);
    schedule(srv);
}

static const struct atc_http_req_callbacks client_cb = {.on_gone = on_client_gone};

static struct sim_req *req_track(struct atc_sim_server *srv, struct atc_http_req *req)
{
    struct sim_req *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    r->srv = srv;
    r->req = req;
    r->created = (int64_t)time(NULL);
    r->next = srv->reqs;
    if (srv->reqs)
        srv->reqs->prev = r;
    srv->reqs = r;
    atc_http_req_set_callbacks(req, &client_cb, r);
    return r;
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
    reply_buffer(r->req, 200, "application/json", b);
    evbuffer_free(b);
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
        atc_http_reply_start(r->req, 200, "text/event-stream; charset=utf-8", "Cache-Control: no-cache\r\n");
        r->started = true;
        if (r->kind == ATC_KIND_CHAT)
            add_event(b, r, "assistant", "", NULL);
    }
    add_event(b, r, NULL, text, NULL);
    if (tok->last) {
        add_event(b, r, NULL, NULL, r->length ? "length" : "stop");
        evbuffer_add_printf(b, "data: [DONE]\n\n");
    }
    if (tok->last)
        req_release(r); /* before the last bytes: the request is the server's once they are out */
    atc_http_reply_chunk_buffer(r->req, b);
    evbuffer_free(b);
    if (tok->last) {
        atc_http_reply_end(r->req);
        req_unlink(r);
    } else if (r->cut_at && tok->index + 1 >= r->cut_at) {
        atc_sim_cancel(srv->sim, r->seq);
        r->seq = 0;
        die_soon(srv);
    } else if (atc_http_req_backlog(r->req) > MAX_PENDING_OUTPUT) {
        /* The client does not read: drop it instead of buffering the rest of its answer. */
        struct atc_http_req *req = r->req;
        atc_sim_cancel(srv->sim, r->seq);
        req_release(r);
        req_unlink(r);
        atc_http_req_abort(req);
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
static void send_embedding(struct atc_sim_server *srv, struct atc_http_req *req,
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
    reply_buffer(req, 200, "application/json", b);
    evbuffer_free(b);
}

static void handle_inference(struct atc_sim_server *srv, struct atc_http_req *req,
                             enum atc_request_kind kind)
{
    struct atc_features f;
    const char *err = NULL;
    if (!is_ready(srv)) {
        send_error(req, 503, "ServiceUnavailableError", "The server is starting up.");
        return;
    }
    size_t len;
    const char *body = atc_http_req_body(req, &len);
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

static void handle_models(struct atc_sim_server *srv, struct atc_http_req *req)
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
    reply_buffer(req, 200, "application/json", b);
    evbuffer_free(b);
}

static void add_metric(struct evbuffer *b, const struct atc_sim_server *srv, const char *name,
                       const char *type, const char *help, double v)
{
    evbuffer_add_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s{model_name=", name, help, name, type, name);
    add_json_string(b, srv->p.model); /* Prometheus label escaping is JSON's for \ and " */
    evbuffer_add_printf(b, "} %.17g\n", v);
}

static void handle_metrics(struct atc_sim_server *srv, struct atc_http_req *req)
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
    reply_buffer(req, 200, "text/plain; version=0.0.4; charset=utf-8", b);
    evbuffer_free(b);
}

static void on_request(struct atc_http_req *req, void *arg)
{
    struct atc_sim_server *srv = arg;
    const char *path = atc_http_req_path(req);
    enum atc_http_method cmd = atc_http_req_method(req);
    bool get = cmd == ATC_HTTP_GET || cmd == ATC_HTTP_HEAD, post = cmd == ATC_HTTP_POST;

    if (strcmp(path, "/v1/chat/completions") == 0 && post)
        handle_inference(srv, req, ATC_KIND_CHAT);
    else if (strcmp(path, "/v1/completions") == 0 && post)
        handle_inference(srv, req, ATC_KIND_COMPLETION);
    else if (strcmp(path, "/v1/embeddings") == 0 && post)
        handle_inference(srv, req, ATC_KIND_EMBEDDING);
    else if (strcmp(path, "/v1/models") == 0 && get)
        handle_models(srv, req);
    else if (strcmp(path, "/health") == 0 && get)
        atc_http_reply(req, is_ready(srv) ? 200 : 503, NULL, NULL, "", 0);
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
    srv->p.model = strdup(p->model ? p->model : "llama-3-8b");
    srv->rng = p->seed ^ 0x5eed5eed5eed5eedULL; /* a stream apart from the model's */
    srv->t0 = atc_mono_us();
    if (!srv->p.model || !(srv->sim = atc_sim_create(&srv->p, on_token, srv)) ||
        !(srv->timer = evtimer_new(base, on_timer, srv)) || !(srv->die_ev = evtimer_new(base, on_die, srv)) ||
        !(srv->http = atc_http_server_create(base, &http_cfg, on_request, srv)))
        goto error;
    if (atc_http_server_bind(srv->http, host, port, err) < 0) {
        *err = "cannot listen (address in use or invalid)";
        goto error;
    }
    srv->port = atc_http_server_port(srv->http);
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
    atc_http_server_destroy(s->http);
    if (s->timer)
        event_free(s->timer);
    if (s->die_ev)
        event_free(s->die_ev);
    atc_sim_destroy(s->sim);
    free(s->p.model);
    free(s);
}
