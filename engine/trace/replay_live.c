/* `atc replay --speed X` (replay.h): a trace sent to a running atc in wall time, X times faster than it
 * was recorded, and what its clients would have seen. Also the load generator of the benchmarks.
 *
 * Each request streams (so its first token can be timed) a chat completion whose prompt is synthesized
 * from the record's block hashes: block k becomes block_tokens * 4 bytes of words drawn from a PRNG
 * seeded with its hash, so requests that share leading blocks share leading bytes, and atc's own prefix
 * hashing (256-byte blocks) sees the same sharing the trace had. A record carrying prompt text (recorded
 * with record.text) is sent with its own messages. Headers carry its session, tenant and priority. */

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "base/json.h"
#include "base/log.h"
#include "trace/recorder.h"
#include "trace/replay.h"
#include "trace/replay_live.h"
#include "trace/trace.h"
#include "base/clock.h"

#define DEFAULT_MAX_INFLIGHT 1024
#define DEFAULT_TIMEOUT_MS (300 * 1000)
#define BYTES_PER_TOKEN 4 /* atc's own estimate (request_features.c) */

struct live;

struct live_req {
    struct live *lv;
    size_t index;
    uint64_t due_us, sent_us;
    struct evhttp_connection *conn;
    struct atc_record_marks marks;
};

struct live {
    const struct atc_trace *trace;
    const struct atc_replay_live_options *o;
    struct atc_replay_result *res;
    struct event_base *base;
    struct event *timer;
    size_t n, next, inflight, done;
    uint64_t start_us;
    struct live_req *reqs;
    int shown;
    uint64_t last_done_us;
};

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* @p bytes of lowercase words and spaces, the same for the same seed. */
static void add_words(struct evbuffer *b, uint64_t seed, size_t bytes)
{
    char chunk[512];
    size_t n = 0;
    while (bytes > 0) {
        uint64_t r = splitmix(&seed);
        for (int k = 0; k < 8 && bytes > 0; k++, bytes--) {
            unsigned c = (unsigned)(r >> (k * 8)) & 0xff;
            chunk[n++] = c % 7 == 0 ? ' ' : (char)('a' + c % 26);
            if (n == sizeof(chunk)) {
                evbuffer_add(b, chunk, n);
                n = 0;
            }
        }
    }
    evbuffer_add(b, chunk, n);
}

static void build_body(const struct live *lv, size_t i, struct evbuffer *b)
{
    const struct atc_trace_record *r = &lv->trace->records[i];
    const char *model = lv->o->model != NULL ? lv->o->model : r->model;
    int64_t out = r->output_tokens > 0 ? r->output_tokens : r->max_tokens > 0 ? r->max_tokens : 16;
    evbuffer_add_printf(b, "{\"model\":\"");
    atc_json_escape(b, model, strlen(model));
    evbuffer_add_printf(b, "\",\"stream\":true,\"max_tokens\":%lld,\"messages\":", (long long)out);
    if (r->prompt != NULL && r->prompt_len > 0 && r->prompt[0] == '[') {
        evbuffer_add(b, r->prompt, r->prompt_len); /* recorded with text: the client's own messages */
    } else {
        evbuffer_add_printf(b, "[{\"role\":\"user\",\"content\":\"");
        uint64_t covered = 0;
        for (size_t k = 0; k < r->nblocks; k++) {
            add_words(b, r->blocks[k], (size_t)r->block_tokens * BYTES_PER_TOKEN);
            covered += r->block_tokens;
        }
        if (r->prompt_tokens > covered) /* the prompt's own tail: unique to this request */
            add_words(b, 0x5eed0000ull + i, (size_t)(r->prompt_tokens - covered) * BYTES_PER_TOKEN);
        evbuffer_add_printf(b, "\"}]");
    }
    evbuffer_add_printf(b, "}");
}

static void progress(struct live *lv)
{
    if (!lv->o->progress)
        return;
    int pct = lv->n ? (int)(100 * lv->done / lv->n) : 100;
    if (pct == lv->shown)
        return;
    lv->shown = pct;
    fprintf(stderr, "\r  live replay [%-40.*s] %3d%% (%zu in flight)  ", pct * 40 / 100,
            "========================================", pct, lv->inflight);
    if (pct == 100)
        fputs("\r\033[K", stderr);
    fflush(stderr);
}

static void schedule(struct live *lv);

static void free_conn(evutil_socket_t fd, short what, void *arg)
{
    evhttp_connection_free(arg);
}

static void on_chunk(struct evhttp_request *req, void *arg)
{
    struct live_req *q = arg;
    atc_record_marks_observe(&q->marks, evhttp_request_get_input_buffer(req), true, atc_mono_us());
    evbuffer_drain(evhttp_request_get_input_buffer(req),
                   evbuffer_get_length(evhttp_request_get_input_buffer(req)));
}

static void on_done(struct evhttp_request *req, void *arg)
{
    struct live_req *q = arg;
    struct live *lv = q->lv;
    struct atc_replay_result *res = lv->res;
    uint64_t now = atc_mono_us();
    int status = req != NULL ? evhttp_request_get_response_code(req) : 0;
    if (req != NULL && evbuffer_get_length(evhttp_request_get_input_buffer(req)) > 0)
        on_chunk(req, q);
    if (status == 200 && q->marks.first_byte_us != 0) {
        res->completed++;
        res->ttft_ms[q->index] = (double)(q->marks.first_byte_us - q->due_us) / 1000.0;
        res->e2e_ms[q->index] = (double)(now - q->due_us) / 1000.0;
        int64_t out = atc_record_marks_output_tokens(&q->marks, true);
        res->output_tokens += out > 0 ? (uint64_t)out : 0;
        lv->last_done_us = now;
    } else {
        res->rejected++; /* any other answer, a timeout or a refused connection */
    }
    /* The connection cannot be freed from inside its own callback. The loop ends by itself once the
     * last one is freed and no request is left to send. */
    if (q->conn != NULL)
        event_base_once(lv->base, -1, EV_TIMEOUT, free_conn, q->conn, NULL);
    q->conn = NULL;
    lv->inflight--;
    lv->done++;
    progress(lv);
    schedule(lv);
}

static void send_one(struct live *lv, size_t i)
{
    struct live_req *q = &lv->reqs[i];
    q->lv = lv;
    q->index = i;
    q->sent_us = atc_mono_us();
    atc_record_marks_init(&q->marks);
    const struct atc_trace_record *r = &lv->trace->records[i];
    q->conn = evhttp_connection_base_new(lv->base, NULL, lv->o->host, lv->o->port);
    struct evhttp_request *req = q->conn != NULL ? evhttp_request_new(on_done, q) : NULL;
    if (req == NULL) {
        lv->inflight++;
        on_done(NULL, q);
        return;
    }
    uint64_t timeout_ms = lv->o->timeout_ms ? lv->o->timeout_ms : DEFAULT_TIMEOUT_MS;
    evhttp_connection_set_timeout(q->conn, (int)((timeout_ms + 999) / 1000));
    evhttp_request_set_chunked_cb(req, on_chunk);
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    char v[64];
    snprintf(v, sizeof(v), "%s:%u", lv->o->host, (unsigned)lv->o->port);
    evhttp_add_header(h, "Host", v);
    evhttp_add_header(h, "Content-Type", "application/json");
    if (r->session[0] != '\0')
        evhttp_add_header(h, "x-atc-session", r->session);
    if (r->tenant[0] != '\0')
        evhttp_add_header(h, "x-atc-tenant", r->tenant);
    if (r->priority != 0) {
        snprintf(v, sizeof(v), "%d", r->priority);
        evhttp_add_header(h, "x-atc-priority", v);
    }
    snprintf(v, sizeof(v), "replay-%zu", i + 1);
    evhttp_add_header(h, "x-request-id", r->id != NULL ? r->id : v);
    for (size_t k = 0; k < r->nheaders; k++) /* the recorded ones (record.headers), as the client sent them */
        if (evhttp_find_header(h, r->headers[k].name) == NULL)
            evhttp_add_header(h, r->headers[k].name, r->headers[k].value);
    build_body(lv, i, evhttp_request_get_output_buffer(req));
    lv->inflight++;
    if (evhttp_make_request(q->conn, req, EVHTTP_REQ_POST, "/v1/chat/completions") != 0)
        on_done(NULL, q); /* evhttp freed req: the request counts as failed */
}

/* Sends every request that is due and fits under max_inflight, then waits for the next one. */
static void schedule(struct live *lv)
{
    unsigned max = lv->o->max_inflight ? lv->o->max_inflight : DEFAULT_MAX_INFLIGHT;
    uint64_t now = atc_mono_us();
    while (lv->next < lv->n && lv->inflight < max) {
        struct live_req *q = &lv->reqs[lv->next];
        if (q->due_us > now)
            break;
        send_one(lv, lv->next++);
    }
    if (lv->next < lv->n && lv->inflight < max) {
        uint64_t wait = lv->reqs[lv->next].due_us - now;
        struct timeval tv = atc_timeval_us(wait);
        evtimer_add(lv->timer, &tv);
    }
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    schedule(arg);
}

int atc_replay_live(const struct atc_trace *t, const struct atc_replay_live_options *o,
                    struct atc_replay_result *out, char **err)
{
    struct live lv = {.trace = t, .o = o, .res = out, .shown = -1};
    memset(out, 0, sizeof(*out));
    lv.n = o->limit && o->limit < t->n ? o->limit : t->n;
    char name[300];
    snprintf(name, sizeof(name), "live %s:%u", o->host, (unsigned)o->port);
    out->name = strdup(name);
    out->entry = strdup("(the running atc's policy)");
    out->requests = lv.n;
    out->ttft_ms = malloc((lv.n ? lv.n : 1) * sizeof(double));
    out->e2e_ms = malloc((lv.n ? lv.n : 1) * sizeof(double));
    out->endpoint = malloc((lv.n ? lv.n : 1) * sizeof(int));
    lv.reqs = calloc(lv.n ? lv.n : 1, sizeof(*lv.reqs));
    lv.base = event_base_new();
    lv.timer = lv.base != NULL ? evtimer_new(lv.base, on_timer, &lv) : NULL;
    if (out->name == NULL || out->entry == NULL || out->ttft_ms == NULL || out->e2e_ms == NULL ||
        out->endpoint == NULL || lv.reqs == NULL || lv.timer == NULL) {
        *err = strdup("out of memory");
        goto error;
    }
    lv.start_us = atc_mono_us() + 10000;
    for (size_t i = 0; i < lv.n; i++) {
        out->ttft_ms[i] = out->e2e_ms[i] = NAN;
        out->endpoint[i] = -1;
        lv.reqs[i].due_us = lv.start_us + (uint64_t)((double)t->records[i].at_us / o->speed);
    }
    if (lv.n > 0) {
        schedule(&lv);
        event_base_dispatch(lv.base);
    }
    /* The report: what clients saw. */
    atc_replay_latencies(out, lv.n);
    if (atc_replay_groups(out, lv.trace, lv.n) < 0)
        atc_warn("replay: out of memory for the per-tenant and per-priority figures");
    out->duration_s = lv.last_done_us > lv.start_us ? (double)(lv.last_done_us - lv.start_us) / 1e6 : 0;
    out->throughput_rps = out->duration_s > 0 ? (double)out->completed / out->duration_s : 0;
    out->output_tps = out->duration_s > 0 ? (double)out->output_tokens / out->duration_s : 0;
    out->live = true;
    out->wall_s = (double)(atc_mono_us() - lv.start_us) / 1e6;
    event_free(lv.timer);
    event_base_free(lv.base);
    free(lv.reqs);
    return 0;
error:
    if (lv.timer != NULL)
        event_free(lv.timer);
    if (lv.base != NULL)
        event_base_free(lv.base);
    free(lv.reqs);
    atc_replay_result_dispose(out);
    return -1;
}
