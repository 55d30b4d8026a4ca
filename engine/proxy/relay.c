#include "proxy/relay.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "cluster/limits.h"
#include "fleet/admission.h"
#include "fleet/balancer.h"
#include "config/config.h"
#include "fleet/endpoint.h"
#include "http/http_server.h"
#include "base/json.h"
#include "ops/access_log.h"
#include "base/log.h"
#include "base/strbuf.h"
#include "ops/metrics.h"
#include "policy/decision.h"
#include "proxy/answer.h"
#include "proxy/disagg.h"
#include "proxy/kv_route.h"
#include "proxy/sse_line.h"
#include "proxy/tokenize.h"
#include "policy/policy.h"
#include "trace/recorder.h"
#include "trace/trace.h"
#include "http/upstream.h"
#include "proxy/worker.h"
#include "base/clock.h"

/* Above this many bytes waiting for a slow client, stop reading from the server until they drain. */
#define CLIENT_HIGH_WATERMARK (256 * 1024)
/* An event stream that sends this much before its first data event (comments, empty events) is not
 * held any longer: it is a broken server. */
#define MAX_HELD_BEFORE_FIRST_EVENT (64 * 1024)
/* A non-streamed answer larger than this is a server fault, not something to hold in memory. */
#define MAX_BUFFERED_RESPONSE (64u * 1024 * 1024)
#define MAX_TRIES 8

/* Where a relay is in its life, in the style of HAProxy's CHK_ST_* flags: every move goes through
 * relay_set_state, which checks it against relay_moves, and every callback checks that it is expected
 * in the state the relay is in (debug and sanitizer builds: assert). The end is a state of its own:
 * relay_end releases everything but the struct, whose memory relay_free (the one function that frees
 * it) returns from the loop afterwards, so a second end, or a callback that runs after the end, meets
 * RELAY_ENDED and asserts instead of using freed memory.
 *
 *   ROUTING --> ATTEMPT --> STREAMING      ATTEMPT --> ATTEMPT: a retry on another endpoint
 *      |          ^
 *      +-> QUEUED-+
 *   every state but ENDED --> FLUSHING --> ENDED, or --> ENDED at once (answered, failed, client gone) */
enum relay_state {
    RELAY_ROUTING,   /* choosing the first attempt's endpoint (within atc_relay_start) */
    RELAY_QUEUED,    /* waiting in the admission queue for capacity */
    RELAY_ATTEMPT,   /* an attempt is in flight (r->up), nothing of the answer sent yet */
    RELAY_STREAMING, /* the answer's head went to the client; its body follows as it comes: no retry */
    RELAY_FLUSHING,  /* answered; held until the client has the last byte (only while draining) */
    RELAY_ENDED,     /* over: everything released but the struct, which the loop frees soon */
};

#define RELAY_IN(s) (1u << (s))
static const unsigned relay_moves[] = {
    [RELAY_ROUTING] =
        RELAY_IN(RELAY_ATTEMPT) | RELAY_IN(RELAY_QUEUED) | RELAY_IN(RELAY_FLUSHING) | RELAY_IN(RELAY_ENDED),
    [RELAY_QUEUED] = RELAY_IN(RELAY_ATTEMPT) | RELAY_IN(RELAY_FLUSHING) | RELAY_IN(RELAY_ENDED),
    [RELAY_ATTEMPT] = RELAY_IN(RELAY_ATTEMPT) | RELAY_IN(RELAY_STREAMING) | RELAY_IN(RELAY_FLUSHING) |
                      RELAY_IN(RELAY_ENDED),
    [RELAY_STREAMING] = RELAY_IN(RELAY_FLUSHING) | RELAY_IN(RELAY_ENDED),
    [RELAY_FLUSHING] = RELAY_IN(RELAY_ENDED),
    [RELAY_ENDED] = 0,
};

struct relay {
    struct atc_worker *w; /* the worker (thread) it runs on */
    enum relay_state state;
    struct atc_deferred deferred; /* the free after the end */
    struct atc_http_req *client; /* NULL once it went, or once the relay ended */
    struct atc_features *f;
    const char *path, *body;
    size_t bodylen;
    int priority;
    char tenant[64];
    char session[256];
    char id[80];
    char extra_headers[160];
    char *recorded_headers; /* record.headers the request had (atc_recorder_capture), taken at its start */
    size_t nrecorded_headers;
    char content_type[128]; /* the server's, for the answer */

    struct atc_route_request rreq; /* what the policy sees */
    struct atc_kv_route kvr;       /* its ep:cached_tokens */
    struct atc_tokenize *tk;       /* its /tokenize step before the decision (tokenize.h); NULL: none */
    uint64_t deadline_ms;          /* x-atc-deadline, for the wait after the step */
    struct atc_queue_item qi;      /* while waiting for capacity */
    uint64_t policy_version;
    struct atc_decision_record rec; /* the decision that routed it (its last one) */
    struct atc_explain *scores; /* atc.explain's, allocated when someone reads it (1.5 KiB a stream) */
    bool explain_reply;             /* the client asked for the record and policy.explain allows it */
    bool shadowed;                  /* the shadow policy has seen it */
    char *rewritten; /* the body with "model" set to the endpoint's, when a policy mapped an alias */
    size_t rewritten_len;

    struct atc_endpoint *ep; /* holds one in-flight slot while set */
    uint64_t tokens;
    struct atc_signal_ticket sig; /* its part in ep's routing signals while ep is set */
    struct atc_endpoint *tried[MAX_TRIES];
    unsigned ntried;
    struct atc_upstream_req *up;
    struct atc_disagg *dg;           /* a disaggregated model's prefill stage (disagg.h); NULL: none */
    struct atc_disagg_request dgreq; /* what it is given */
    enum atc_upstream_error last_error;
    bool had_error;

    int status;
    bool streaming;    /* relaying the body as it arrives */
    bool broken;       /* the answer broke after it started: counted apart in the metrics */
    bool event_stream; /* and it is SSE */
    bool paused;
    /* An event stream whose first data event (its first token) has not come: its head and the bytes so
     * far wait in buffered, the client has nothing yet, so a failure now is retried elsewhere, as
     * llama.cpp holds its head until the first token (vLLM, SGLang and TGI send theirs before prefill). */
    bool holding;
    char *up_headers; /* the server's headers passed on (atc_answer_pass_headers), malloc'd; NULL: none */
    struct evbuffer *buffered;
    uint64_t t_attempt_us;

    /* Arrival; the first token: a stream's first data event (0: none, or not an event stream) */
    uint64_t t_start_us, t_first_us;
    uint64_t bytes, sse_events;
    uint64_t data_events;  /* events with a data field; comments and empty events are not tokens */
    bool event_has_data;   /* the event being scanned has had a data line (sse_scan) */
    bool after_newline;    /* the stream so far ends with a '\n' that did not end an event (sse_scan) */
    unsigned sse_line_len; /* bytes of the current SSE line seen so far, counted up to sizeof(sse_head) */
    char sse_head[8];      /* its first bytes: enough to tell a field from garbage */
    int client_status;     /* as the client saw it; 499 when it left first */
    char error[512];
    struct atc_record_marks marks; /* what trace recording notes about the answer (record:, limits:) */
    struct atc_limit_ticket limit; /* its share of its tenant's budget (limits:); slot -1: none */
};

static void attempt(struct relay *r, struct atc_endpoint *ep);
static void end_broken_stream(struct relay *r, enum atc_upstream_error err);
static struct atc_endpoint *next_endpoint(struct relay *r);
static void record_finished(struct relay *r, bool flushed);
static void on_tokenized(void *arg);
static void reply_error(struct relay *r, int status, const char *type, const char *code, const char *message,
                        int retry_after);

/* Checks that a callback runs in a state it expects (@p states: RELAY_IN(...) | ...). */
static inline void relay_expect(const struct relay *r, unsigned states)
{
    assert(r->state <= RELAY_ENDED && (RELAY_IN(r->state) & states) != 0);
    (void)r, (void)states;
}

static void relay_set_state(struct relay *r, enum relay_state to)
{
    assert(r->state <= RELAY_ENDED && (relay_moves[r->state] & RELAY_IN(to)) != 0);
    (void)relay_moves; /* (NDEBUG) */
    r->state = to;
}

static void release_endpoint(struct relay *r)
{
    if (r->ep == NULL)
        return;
    if (r->w->policy != NULL && r->f != NULL) /* what it held in the KV cache is the newest there now */
        atc_policy_released(r->w->policy, r->f, r->rreq.block_tokens, r->ep,
                            atc_record_marks_output_tokens(&r->marks, r->rreq.kind == ATC_KIND_CHAT));
    atc_signals_done(&r->ep->sig, &r->sig, atc_mono_us(), r->data_events); /* (0 unless a stream) */
    atc_endpoint_release(r->ep, r->tokens);
    r->ep = NULL;
    atc_worker_capacity_freed(r->w); /* a slot freed: the most urgent waiting request may take it */
}

/* The outcome of the attempt on r->ep: its counters, and passive health checks (on the main thread). */
static void record_outcome(struct relay *r, bool ok, double ttft_ms)
{
    bool had_errors = r->ep->consecutive_errors > 0;
    atc_endpoint_record(r->ep, ok, ttft_ms);
    atc_worker_observe(r->w, r->ep, ok, had_errors);
}

/* One request's line in the access log and its share of the metrics. */
static void account(struct relay *r)
{
    struct atc_worker *w = r->w;
    const char *endpoint = r->ntried > 0 ? r->tried[r->ntried - 1]->id : NULL;
    double ttft_ms = r->t_first_us ? (double)(r->t_first_us - r->t_start_us) / 1000.0 : -1;
    double total_ms = (double)(atc_mono_us() - r->t_start_us) / 1000.0;
    unsigned retries = r->ntried > 1 ? r->ntried - 1 : 0;
    struct atc_request_metrics m = {
        /* a label from the configured models only: the client picks the name it sends */
        .model = r->ntried > 0 ? r->tried[r->ntried - 1]->model
                               : atc_endpoint_table_model_label(w->table, r->f->model),
        .endpoint = endpoint,
        .status = r->client_status,
        .priority = r->priority,
        .ttft_s = ttft_ms >= 0 ? ttft_ms / 1000.0 : -1,
        .total_s = total_ms / 1000.0,
        .retries = retries,
        .bytes = r->bytes,
        .sse_events = r->sse_events,
        .broken = r->broken,
    };
    atc_metrics_request(w->metrics, &m);
    if (w->policy != NULL && r->policy_version != 0)
        atc_policy_observe(w->policy, r->policy_version, r->rec.canary, ttft_ms);
    if (w->access_log == NULL)
        return;
    struct atc_access_record rec = {
        .id = r->id,
        .model = r->f->model,
        .tenant = r->tenant,
        .session = r->session,
        .endpoint = endpoint,
        .error = r->error,
        .priority = r->priority,
        .status = r->client_status,
        .policy_version = r->policy_version,
        .stream = r->f->stream,
        .ttft_ms = ttft_ms,
        .total_ms = total_ms,
        .prompt_tokens = r->f->prompt_tokens,
        .max_tokens = r->f->max_tokens,
        .retries = retries,
        .bytes = r->bytes,
        .sse_events = r->sse_events,
        .usage = r->marks.prompt_tokens >= 0 || r->marks.completion_tokens >= 0,
        .usage_prompt_tokens = r->marks.prompt_tokens,
        .usage_completion_tokens = r->marks.completion_tokens,
        .usage_cached_tokens = r->marks.cached_tokens,
        .decision = w->policy != NULL ? &r->rec : NULL,
    };
    r->rec.endpoint = endpoint;
    atc_disagg_log(r->dg, &rec, r->t_first_us);
    atc_access_log_request(w->access_log, &rec);
}

/* The tenant's tokens as the answer's usage counted them (its prompt_tokens, else the estimate); an
 * answer that said nothing keeps the estimate made at admission. A stream without usage (the client did
 * not ask for stream_options.include_usage) is counted by its content events: vLLM, SGLang and TGI send
 * one event per token, so the count is exact but for servers that pack several (speculative decoding),
 * where it undercounts. atc does not add include_usage to the client's request: that would change the
 * stream the client gets (an extra chunk) or make atc rewrite it. */
static void settle_limit(struct relay *r)
{
    int64_t out = atc_record_marks_output_tokens(&r->marks, r->rreq.kind == ATC_KIND_CHAT);
    uint64_t prompt = r->marks.prompt_tokens >= 0 ? (uint64_t)r->marks.prompt_tokens : r->f->prompt_tokens;
    if (r->limit.slot >= 0 && out >= 0)
        atc_limits_settle(r->w->limits, &r->limit, prompt + (uint64_t)out);
}

/* Over its tenant's budget (limits:): 429 with the seconds left in the window, as OpenAI answers. */
static bool over_limit(struct relay *r)
{
    r->limit.slot = -1;
    if (r->w->limits == NULL)
        return false;
    enum atc_limit_kind kind;
    int retry = atc_limits_admit(r->w->limits, r->tenant, r->tokens, atc_wall_us() / 1000, &r->limit, &kind);
    if (retry == 0)
        return false;
    const char *what = kind == ATC_LIMIT_REQUESTS ? "requests" : "tokens";
    char msg[200];
    snprintf(msg, sizeof(msg), "Rate limit reached for tenant '%s' on %s per minute. Please try again in %ds.",
             r->tenant, what, retry);
    /* refused by the tenant's limit, before any decision */
    r->rec.kind = atc_decision_kind_name(ATC_DECISION_REJECT);
    snprintf(r->rec.reason, sizeof(r->rec.reason), "rate_limit_%s", what);
    reply_error(r, 429, what, "rate_limit_exceeded", msg, retry);
    return true;
}

/* The one function that frees a relay: from the loop, after relay_end. */
static void relay_free(struct atc_deferred *d)
{
    struct relay *r = (struct relay *)(void *)((char *)d - offsetof(struct relay, deferred));
    relay_expect(r, RELAY_IN(RELAY_ENDED));
    atc_tokenize_free(r->tk);
    free(r->recorded_headers);
    free(r->up_headers);
    free(r->scores);
    free(r);
}

/* The relay is over: the client has its answer (or is gone). Releases everything the relay holds (not
 * the client request) and hands the struct to the loop to free. */
static void relay_end(struct relay *r)
{
    bool flushed = r->state == RELAY_FLUSHING;
    relay_set_state(r, RELAY_ENDED); /* asserts that it had not ended */
    account(r);
    record_finished(r, flushed);
    settle_limit(r);
    if (r->qi.queued)
        atc_admission_remove(r->w->admission, &r->qi);
    atc_worker_queue_changed(r->w); /* it left the queue now, or earlier (placed, expired) */
    release_endpoint(r);
    atc_disagg_free(r->dg); /* a prefill in flight is cancelled: the client left, or decode answered */
    atc_tokenize_cancel(r->tk); /* freed with the relay: its callback may be up the stack */
    if (r->client != NULL)
        atc_http_req_set_callbacks(r->client, NULL, NULL); /* the request is the HTTP server's again */
    r->client = NULL;
    if (r->buffered != NULL)
        evbuffer_free(r->buffered);
    r->buffered = NULL;
    free(r->f);
    r->f = NULL;
    free(r->rewritten);
    r->rewritten = NULL;
    atc_worker_request_finished(r->w);
    atc_worker_defer(r->w, &r->deferred, relay_free);
}

/* The answer is handed to the HTTP server. While draining, the process must not exit before the client
 * has it, so the relay (and the server's count of active requests) lives until the bytes are written
 * (on_client_drained). */
static void relay_done(struct relay *r)
{
    release_endpoint(r);
    if (r->w->draining && r->client != NULL && atc_http_req_backlog(r->client) > 0) {
        relay_set_state(r, RELAY_FLUSHING);
        return;
    }
    relay_end(r);
}

/* The headers atc adds to an answer, as "Name: value\r\n" lines. They fit in line[] but for an
 * x-atc-explain record, which goes to the heap (heap; reply_head_free). */
struct reply_head {
    char line[512];
    char *heap;
};

static void reply_head_free(struct reply_head *h)
{
    free(h->heap);
    h->heap = NULL;
}

static const char *reply_headers(struct relay *r, struct reply_head *h, bool event_stream)
{
    struct atc_strbuf hb = atc_strbuf_init(h->line, sizeof(h->line));
    h->heap = NULL;
    if (event_stream)
        atc_strbuf_header(&hb, "Cache-Control", "no-cache", "");
    if (r->ntried > 0)
        atc_strbuf_header(&hb, "x-atc-endpoint", r->tried[r->ntried - 1]->id, "");
    atc_strbuf_header(&hb, "x-request-id", r->id, "");
    if (r->w->policy != NULL) {
        /* The version is named only on what it decided: a client must be able to tell that the C
         * balancer routed a request because the policy failed. */
        if (r->rec.kind == atc_decision_kind_name(ATC_DECISION_FALLBACK)) {
            atc_strbuf_header(&hb, "x-atc-decision", "fallback; reason=", r->rec.reason);
        } else {
            if (r->policy_version != 0) { /* 0: refused before any decision (a tenant's limit) */
                char version[24];
                struct atc_strbuf vb = atc_strbuf_init(version, sizeof(version));
                atc_strbuf_u64(&vb, r->policy_version);
                atc_strbuf_header(&hb, "x-atc-policy-version", version, "");
            }
            atc_strbuf_header(&hb, "x-atc-decision", r->rec.kind, r->rec.canary ? "; canary" : "");
        }
    }
    char *out = hb.p;
    size_t n = hb.len;
    if (r->explain_reply || r->up_headers != NULL) {
        r->rec.endpoint = r->ntried > 0 ? r->tried[r->ntried - 1]->id : NULL;
        struct evbuffer *b = evbuffer_new();
        if (b != NULL) {
            evbuffer_add(b, out, n);
            if (r->up_headers != NULL) /* the server's own (x-engine, ...), passed on */
                evbuffer_add(b, r->up_headers, strlen(r->up_headers));
            if (r->explain_reply) {
                evbuffer_add(b, "x-atc-explain: ", 15);
                atc_decision_record_json(&r->rec, b);
                evbuffer_add(b, "\r\n", 2);
            }
            evbuffer_add(b, "", 1); /* its NUL */
            size_t len = evbuffer_get_length(b);
            if ((h->heap = malloc(len)) != NULL)
                evbuffer_remove(b, h->heap, len);
            evbuffer_free(b);
        }
    }
    if (r->w->draining)
        atc_http_req_close_after(r->client);
    return h->heap != NULL ? h->heap : out;
}

static void reply_error(struct relay *r, int status, const char *type, const char *code, const char *message,
                        int retry_after)
{
    struct reply_head h;
    atc_http_reply_error(r->client, status, type, code, message, retry_after, reply_headers(r, &h, false));
    reply_head_free(&h);
    r->w->stats.responses_total++;
    r->client_status = status;
    snprintf(r->error, sizeof(r->error), "%s", message);
    relay_done(r);
}

/* The client hung up: stop the server's work at once and free its slot. */
static void client_gone(struct relay *r)
{
    r->w->stats.client_gone_total++;
    r->client_status = 499;
    snprintf(r->error, sizeof(r->error), "client disconnected");
    if (r->up != NULL) {
        atc_upstream_cancel(r->up);
        r->up = NULL;
    }
    atc_debug("request %s: client disconnected", r->id);
    relay_end(r);
}

/* The HTTP server saw the client go (hung up, reset, or took nothing of its answer for client_timeout). */
static void on_client_gone(void *arg)
{
    struct relay *r = arg;
    relay_expect(r, ~RELAY_IN(RELAY_ENDED));
    r->client = NULL; /* gone with its connection */
    if (r->state == RELAY_FLUSHING) { /* answered already: only the relay is left */
        relay_end(r);
        return;
    }
    client_gone(r);
}

/* Everything written to the client so far is out: a paused server may send again, a drain may end. */
static void on_client_drained(void *arg)
{
    struct relay *r = arg;
    relay_expect(r, RELAY_IN(RELAY_STREAMING) | RELAY_IN(RELAY_FLUSHING) | RELAY_IN(RELAY_ATTEMPT) |
                        RELAY_IN(RELAY_QUEUED));
    if (r->state == RELAY_FLUSHING) {
        relay_end(r);
        return;
    }
    if (r->paused && r->up != NULL) {
        r->paused = false;
        atc_upstream_resume(r->up);
    }
}

static const struct atc_http_req_callbacks client_cb = {.on_gone = on_client_gone, .on_drained = on_client_drained};

static const char *error_code(enum atc_upstream_error err)
{
    return atc_upstream_is_timeout(err) ? "upstream_timeout" : "upstream_error";
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
    bool timeout = atc_upstream_is_timeout(r->last_error);
    reply_error(r, timeout ? 504 : 502, timeout ? "timeout" : "upstream_error", error_code(r->last_error), msg, 0);
}

static bool model_served(struct atc_worker *w, const struct atc_features *f)
{
    return atc_endpoint_table_model(w->table, f->model, strlen(f->model)) != NULL;
}

enum choice {
    CHOSEN,   /* an endpoint */
    ANSWERED, /* the client got its answer (a policy's reject, an unknown model) */
    WAIT,     /* no room now: the first attempt waits in the admission queue */
    NONE,     /* no endpoint for a retry */
};

/* The endpoint for the next attempt: the policy's choice, else the C balancer's. Endpoints already
 * tried are never chosen again; on a retry, a verdict or a full fleet means the last failure stands. */
static enum choice decide(struct relay *r, struct atc_endpoint **ep)
{
    struct atc_worker *w = r->w;
    bool first = r->ntried == 0;
    r->rreq.attempt = r->ntried + 1;
    r->rreq.tried = r->tried;
    r->rreq.ntried = r->ntried;
    r->dgreq.prefill = NULL;
    if (w->policy != NULL) {
        struct atc_decision d;
        uint64_t t0 = atc_mono_us();
        atc_policy_route(w->policy, &r->rreq, &d);
        atc_metrics_decision(w->metrics, (double)(atc_mono_us() - t0) / 1e6,
                             d.kind == ATC_DECISION_FALLBACK ? d.reason : NULL);
        r->policy_version = d.version;
        atc_decision_record_set(&r->rec, &d, r->rreq.explain);
        if (!r->shadowed) { /* the same request, once, on the same fleet: then agreement means the code */
            r->shadowed = true;
            atc_policy_shadow_route(w->policy, &r->rreq, &d, &r->rec);
        }
        switch (d.kind) {
        case ATC_DECISION_ENDPOINT:
            r->dgreq.prefill = d.prefill; /* a prefill server it chose: disagg.c tries it first */
            if ((*ep = d.endpoint) == NULL)
                break; /* it named the prefill server only: the C balancer picks the decode server */
            return CHOSEN;
        case ATC_DECISION_QUEUE:
            return first ? WAIT : NONE;
        case ATC_DECISION_REJECT:
            if (!first)
                return NONE;
            /* A 404 for a model nothing serves is the same answer with or without a policy, so
             * clients that switch on the code ("model_not_found", as OpenAI's) see one thing. */
            reply_error(r, d.status, d.status < 500 ? "invalid_request_error" : "server_error",
                        d.status == 404 && !model_served(w, r->f) ? "model_not_found" : "rejected_by_policy",
                        d.message, d.status == 429 || d.status == 503 ? 1 : 0);
            return ANSWERED;
        case ATC_DECISION_FALLBACK:
            break;
        }
    }
    /* Looked up now rather than kept: a config reload may change the table while a request waits. */
    const struct atc_model *model = atc_endpoint_table_model(w->table, r->f->model, strlen(r->f->model));
    if (model == NULL) {
        if (!first)
            return NONE;
        char msg[ATC_ANSWER_UNKNOWN_MODEL_MAX];
        reply_error(r, 404, "invalid_request_error", "model_not_found",
                    atc_answer_unknown_model(msg, sizeof(msg), r->f->model), 0);
        return ANSWERED;
    }
    *ep = atc_balancer_pick(model, &w->rng, r->tried, r->ntried, r->tokens);
    if (*ep != NULL)
        return CHOSEN;
    return first ? WAIT : NONE;
}

/* The decision, with the chosen endpoint's slot taken (r->tokens counted). Another worker can take the
 * last slot between the decision and this: then the fleet changed, and it is decided again. */
static enum choice choose(struct relay *r, struct atc_endpoint **ep)
{
    for (int round = 0; round < 3; round++) {
        enum choice c = decide(r, ep);
        if (c == CHOSEN && r->ntried == 0 && !atc_disagg_prefill_room(r->w, *ep, r->tokens))
            return WAIT; /* a disaggregated model's prefill servers are full */
        if (c != CHOSEN || atc_endpoint_try_acquire(*ep, r->tokens))
            return c;
    }
    return r->ntried == 0 ? WAIT : NONE;
}

/* Another endpoint to try, if the request may be tried: nothing reached the client yet, tries are left. */
static struct atc_endpoint *next_endpoint(struct relay *r)
{
    struct atc_endpoint *ep = NULL;
    if (r->state == RELAY_STREAMING || r->ntried >= r->w->cfg->upstream.tries || r->ntried >= MAX_TRIES)
        return NULL;
    return choose(r, &ep) == CHOSEN ? ep : NULL;
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

static size_t client_backlog(const struct relay *r)
{
    return r->client != NULL ? atc_http_req_backlog(r->client) : 0;
}

static void attempt_failed(struct relay *r, enum atc_upstream_error err);

/* The server's head. An event stream is held (r->holding) until its first data event, its first token
 * (first_event); any other answer is a whole one whose first token atc cannot see. */
static void on_up_headers(void *arg, const struct atc_upstream_response *resp)
{
    struct relay *r = arg;
    relay_expect(r, RELAY_IN(RELAY_ATTEMPT));
    struct atc_endpoint *next;
    /* It refused atc's own credentials (api_key_env / api_key_file): not the client's doing. */
    bool refused_key = (resp->status == 401 || resp->status == 403) && !r->ep->forward_authorization;
    if (refused_key) /* logged, and made its last_error, on the main thread */
        atc_worker_key_refused(r->w, r->ep, resp->status);
    /* A 5xx, or a 429 (the server's own queue is full: TGI answers 429 "overloaded"), is the server's
     * failure, not the client's: it counts against the server and, before anything reached the client,
     * another endpoint may do better. So does a refused key (another endpoint may hold a good one). */
    bool server_failed = resp->status >= 500 || resp->status == 429 || refused_key;
    if (server_failed) /* a disaggregated model's decode stage: counted per stage */
        atc_disagg_decode_failed(r->dg, resp->status, ATC_UPSTREAM_ERR_PROTOCOL);
    if (server_failed && (next = next_endpoint(r)) != NULL) {
        record_outcome(r, false, -1);
        atc_warn("request %s: upstream %s answered %d, retrying on %s", r->id, r->ep->id, resp->status,
                 next->id);
        atc_upstream_cancel(r->up);
        r->up = NULL;
        release_endpoint(r);
        r->w->stats.retries_total++;
        attempt(r, next);
        return;
    }
    if (refused_key) {
        atc_upstream_cancel(r->up);
        r->up = NULL;
        record_outcome(r, false, -1);
        release_endpoint(r);
        reply_error(r, 502, "upstream_error", "upstream_credentials",
                    "the inference server refused the router's credentials", 0);
        return;
    }
    r->status = resp->status;
    r->event_stream = resp->event_stream;
    atc_strlcpy(r->content_type, sizeof(r->content_type),
                resp->content_type != NULL ? resp->content_type : "application/json");
    free(r->up_headers);
    r->up_headers = resp->headers != NULL ? malloc(resp->headers_len + 1) : NULL;
    if (r->up_headers != NULL)
        atc_answer_pass_headers(r->up_headers, resp->headers, resp->headers_len, resp->event_stream);
    if (r->buffered == NULL)
        r->buffered = evbuffer_new();
    else
        evbuffer_drain(r->buffered, evbuffer_get_length(r->buffered));
    if (resp->event_stream) {
        r->holding = true; /* the first-byte timeout runs on (upstream.c) until first_event */
        return;
    }
    /* Not an event stream: no TTFT sample (its first token is not visible) and no prefill sample. Its
     * prompt leaves the prefill backlog when it ends (release_endpoint: atc_signals_done), which for an
     * answer sent whole after its generation, as vLLM's is, is when its head came anyway. */
    record_outcome(r, !server_failed, -1);
    r->streaming = resp->content_length < 0 || (uint64_t)resp->content_length > MAX_BUFFERED_RESPONSE;
    if (r->streaming) {
        struct reply_head h;
        relay_set_state(r, RELAY_STREAMING);
        atc_http_reply_start(r->client, r->status, r->content_type, reply_headers(r, &h, false));
        reply_head_free(&h);
    }
}

/* The held stream's first data event came: its first token. Everything fed from the first token is fed now
 * (the endpoint's TTFT and outcome, the prefill sample, the trace's mark, the access log's ttft_ms), and the
 * client gets the head and the held bytes. A first event that is an error (TGI's validation error in a
 * stream) counts against the server, reaches the client in OpenAI's shape, and is no token. */
static void first_event(struct relay *r)
{
    uint64_t now = atc_mono_us();
    size_t held = evbuffer_get_length(r->buffered);
    const char *p = (const char *)evbuffer_pullup(r->buffered, -1);
    struct evbuffer *shaped = evbuffer_new();
    bool rewrote = false;
    bool error = shaped != NULL && atc_answer_first_event_error(p, held, shaped, &rewrote);
    bool ok = r->status < 500 && r->status != 429 && !error;
    r->holding = false;
    r->t_first_us = error ? 0 : now;
    r->marks.first_byte_us = r->t_first_us;
    record_outcome(r, ok, ok ? (double)(now - r->t_attempt_us) / 1000.0 : -1);
    atc_signals_first_byte(&r->ep->sig, &r->w->table->signals, &r->sig, now, ok && r->status < 400);
    atc_upstream_first_event(r->up);
    r->streaming = true;
    relay_set_state(r, RELAY_STREAMING);
    struct reply_head h;
    atc_http_reply_start(r->client, r->status, r->content_type, reply_headers(r, &h, true));
    reply_head_free(&h);
    atc_http_reply_chunk_buffer(r->client, rewrote ? shaped : r->buffered);
    evbuffer_drain(r->buffered, evbuffer_get_length(r->buffered));
    if (shaped != NULL)
        evbuffer_free(shaped);
    if (!r->paused && client_backlog(r) > CLIENT_HIGH_WATERMARK) {
        r->paused = true;
        atc_upstream_pause(r->up);
    }
    /* Its prefill is done, so the endpoint's prefill queue shrank: a request a policy holds until some
     * endpoint can start its prefill soon (late binding) is decided again now, not at the next tick. */
    atc_worker_capacity_freed(r->w);
}

/* One pass over the next bytes of an event stream, left to right, that checks its framing and counts its
 * events. Every line must be a field or a comment (sse_line_ok on its first bytes: only those are
 * looked at one by one, memchr finds the line's end). An event ends with an empty line: each "\n\n"
 * counts, each '\n' ending at most one, also when a read splits one (after_newline: the stream so far
 * ends with a '\n' that did not end an event, so "\n\n" | "\n" is one event, as "\n\n\n" in one piece
 * is). The events are counted once the whole piece has passed: a piece that fails is not relayed.
 * Returns false on a line that cannot be server-sent events. */
static bool sse_scan(struct relay *r, const char *p, size_t len)
{
    const char *end = p + len;
    unsigned line_len = r->sse_line_len; /* at most sizeof(sse_head): past it the length is not needed */
    bool after_newline = r->after_newline;
    bool has_data = r->event_has_data;
    uint64_t events = 0, data_events = 0;
    while (p < end) {
        if (line_len == sizeof(r->sse_head)) { /* the line's head passed: skip to its end */
            const char *nl = memchr(p, '\n', (size_t)(end - p));
            if (nl == NULL)
                break; /* (after_newline is false: the line has bytes) */
            p = nl;
        }
        char c = *p++;
        if (c == '\n') {
            if (!atc_sse_line_ok(r->sse_head, line_len, true))
                return false;
            if (line_len >= 4 && memcmp(r->sse_head, "data", 4) == 0 &&
                (line_len == 4 || r->sse_head[4] == ':'))
                has_data = true;
            if (after_newline) { /* an empty line: the event ends */
                events++;
                data_events += has_data;
                has_data = false;
            }
            line_len = 0;
            after_newline = !after_newline;
            continue;
        }
        after_newline = false;
        if (c == '\r')
            continue;
        r->sse_head[line_len] = c;
        if (++line_len == sizeof(r->sse_head) && !atc_sse_line_ok(r->sse_head, line_len, false))
            return false;
    }
    r->sse_line_len = line_len;
    r->after_newline = after_newline;
    r->event_has_data = has_data;
    r->sse_events += events;
    r->data_events += data_events;
    return true;
}

/* The body bytes of one read from the server (borrowed for the call). */
static void on_up_body(void *arg, const char *data, size_t len)
{
    struct relay *r = arg;
    relay_expect(r, RELAY_IN(RELAY_ATTEMPT) | RELAY_IN(RELAY_STREAMING));
    r->bytes += len;
    /* the usage: the tenant's tokens, the access log, the trace, the endpoint's cached share */
    atc_record_marks_observe_bytes(&r->marks, data, len, r->event_stream, atc_mono_us());
    if (!r->streaming && !r->holding) {
        evbuffer_add(r->buffered, data, len);
        return;
    }
    if (r->event_stream &&
        (!sse_scan(r, data, len) || (r->holding && r->data_events == 0 &&
                                     evbuffer_get_length(r->buffered) + len > MAX_HELD_BEFORE_FIRST_EVENT))) {
        /* Not server-sent events: the server is broken. It counts against it; before the first event
         * another endpoint is tried, after it the client's stream ends with an error event rather than
         * with garbage. */
        atc_upstream_cancel(r->up);
        r->up = NULL;
        attempt_failed(r, ATC_UPSTREAM_ERR_BAD_STREAM);
        return;
    }
    if (r->holding) {
        evbuffer_add(r->buffered, data, len);
        if (r->data_events > 0)
            first_event(r);
        return;
    }
    /* At once, in one writev with its chunk framing: no copy unless the client's socket is full. */
    atc_http_reply_chunk(r->client, data, len);
    if (!r->paused && client_backlog(r) > CLIENT_HIGH_WATERMARK) {
        r->paused = true;
        atc_upstream_pause(r->up);
    }
}

static void on_up_done(void *arg)
{
    struct relay *r = arg;
    relay_expect(r, RELAY_IN(RELAY_ATTEMPT) | RELAY_IN(RELAY_STREAMING));
    r->up = NULL;
    r->w->stats.responses_total++;
    r->client_status = r->status;
    if (r->holding) { /* an event stream that ended without a data event: no token, a whole answer */
        r->holding = false;
        record_outcome(r, r->status < 500 && r->status != 429, -1);
    }
    if (r->marks.prompt_tokens > 0 && r->marks.cached_tokens >= 0) /* the engine's own: its real cache hits */
        atc_signals_cached(&r->ep->sig, &r->sig, (uint64_t)r->marks.prompt_tokens,
                           (uint64_t)r->marks.cached_tokens); /* and the guess's error (signals.h) */
    if (r->streaming) {
        atc_http_reply_end(r->client);
    } else {
        struct reply_head h;
        struct evbuffer *body = r->buffered;
        struct evbuffer *shaped = r->status >= 400 ? evbuffer_new() : NULL;
        const char *type = r->content_type;
        size_t len = evbuffer_get_length(body);
        if (shaped != NULL &&
            atc_answer_error_body(shaped, r->status, (const char *)evbuffer_pullup(body, -1), len)) {
            body = shaped; /* an error that is not in OpenAI's shape (TGI's, a plain text page) */
            type = "application/json";
            len = evbuffer_get_length(body);
        }
        atc_http_reply(r->client, r->status, type, reply_headers(r, &h, false), evbuffer_pullup(body, -1),
                       len);
        reply_head_free(&h);
        if (shaped != NULL)
            evbuffer_free(shaped);
    }
    relay_done(r);
}

/* An SSE stream that breaks after it started still ends with a well-formed event, so that a client
 * sees an error rather than a stream that merely stops. */
static void end_broken_stream(struct relay *r, enum atc_upstream_error err)
{
    r->w->stats.responses_total++;
    r->client_status = r->status;
    r->broken = true;
    snprintf(r->error, sizeof(r->error), "upstream %s: %s after the answer started",
             r->tried[r->ntried - 1]->id, atc_upstream_strerror(err));
    if (!r->event_stream) {
        /* No in-band way to say so: cut the connection, so the client sees a truncated answer rather
         * than a short one that looks complete. */
        struct atc_http_req *client = r->client;
        relay_end(r);
        atc_http_req_abort(client);
        return;
    }
    struct evbuffer *ev = evbuffer_new();
    if (ev != NULL) {
        evbuffer_add_printf(ev,
                            "data: {\"error\":{\"message\":\"upstream %s: %s\",\"type\":\"%s\","
                            "\"param\":null,\"code\":\"%s\"}}\n\n",
                            r->tried[r->ntried - 1]->id, atc_upstream_strerror(err),
                            atc_upstream_is_timeout(err) ? "timeout" : "upstream_error", error_code(err));
        atc_http_reply_chunk_buffer(r->client, ev);
        evbuffer_free(ev);
    }
    atc_http_reply_end(r->client);
    relay_done(r);
}

static void on_up_error(void *arg, enum atc_upstream_error err, bool got_response)
{
    struct relay *r = arg;
    relay_expect(r, RELAY_IN(RELAY_ATTEMPT) | RELAY_IN(RELAY_STREAMING));
    r->up = NULL;
    attempt_failed(r, err);
}

/* The attempt on r->ep failed (r->up is gone): it counts against the server. Another endpoint is tried
 * while nothing reached the client (a held stream included); a stream the client has gets an end. */
static void attempt_failed(struct relay *r, enum atc_upstream_error err)
{
    r->w->stats.upstream_errors_total++;
    record_outcome(r, false, -1);
    atc_disagg_decode_failed(r->dg, 0, err);
    atc_warn("request %s: upstream %s: %s", r->id, r->ep->id, atc_upstream_strerror(err));
    release_endpoint(r);
    r->last_error = err;
    r->had_error = true;
    r->holding = false;
    free(r->up_headers); /* the failed server's: not for the error atc answers with */
    r->up_headers = NULL;
    if (r->state == RELAY_STREAMING) {
        end_broken_stream(r, err);
        return;
    }
    struct atc_endpoint *next = next_endpoint(r);
    if (next == NULL) {
        give_up(r);
        return;
    }
    r->w->stats.retries_total++;
    attempt(r, next);
}

static const struct atc_upstream_callbacks upstream_cb = {
    .on_headers = on_up_headers,
    .on_body = on_up_body,
    .on_done = on_up_done,
    .on_error = on_up_error,
};

/* Sends the attempt's body (a disaggregated model's decode body, once its prefill stage is done) to r->ep. */
static void send_up(struct relay *r)
{
    const char *body;
    size_t len;
    const struct atc_endpoint *ep = r->ep;
    /* atc's own key for the server; the client's Authorization only where forward_authorization says so. */
    const char *auth = ep->authorization != NULL ? ep->authorization
                       : ep->forward_authorization && r->client != NULL
                           ? atc_http_req_header(r->client, "Authorization")
                           : NULL;
    int rc = r->dg != NULL ? (atc_disagg_body(r->dg, &body, &len), body != NULL ? 0 : -1)
                           : body_for(r, ep, &body, &len);
    r->up = rc == 0 ? atc_upstream_send_as(ep->pools[r->w->id], "POST", r->path, r->extra_headers, auth, body,
                                           len, &upstream_cb, r)
                    : NULL;
    if (r->up != NULL && !r->f->stream && r->rreq.kind != ATC_KIND_EMBEDDING) /* its head comes at the end */
        atc_upstream_whole_answer(r->up, r->f->max_tokens);
    if (r->up == NULL) {
        release_endpoint(r);
        reply_error(r, 500, "server_error", "out_of_memory", "out of memory", 0);
    }
}

/* The prefill stage is over (disagg.c): the decode server gets its body, or the client the reason. */
static void on_prefilled(void *arg, const char *err)
{
    struct relay *r = arg;
    if (err != NULL && r->up != NULL) { /* SGLang: the pair's prefill failed while decode runs */
        if (r->state != RELAY_ATTEMPT || r->t_first_us != 0)
            return; /* decode's answer started: it goes on */
        atc_upstream_cancel(r->up); /* before its first byte: the pair again, with a new room */
        r->up = NULL;
        atc_signals_done(&r->ep->sig, &r->sig, atc_mono_us(), 0); /* attempt() sends it again */
        if (r->ntried < r->w->cfg->upstream.tries && r->ntried < MAX_TRIES) {
            r->w->stats.retries_total++;
            attempt(r, r->ep);
            return;
        }
    }
    relay_expect(r, RELAY_IN(RELAY_ATTEMPT));
    if (err == NULL) {
        send_up(r);
        return;
    }
    r->w->stats.upstream_errors_total++;
    release_endpoint(r);
    reply_error(r, 502, "upstream_error", "prefill_failed", err, 0);
}

/* Sends the request to @p ep. */
static void attempt(struct relay *r, struct atc_endpoint *ep)
{
    relay_set_state(r, RELAY_ATTEMPT);
    r->ep = ep;
    r->tried[r->ntried++] = ep;
    r->sig.streamed = r->f->stream; /* (an answer sent whole shows no first token: never late) */
    /* what an earlier attempt's answer left (a stream held until its first event, then failed) */
    free(r->up_headers);
    r->up_headers = NULL;
    r->bytes = r->sse_events = r->data_events = 0;
    r->event_has_data = r->after_newline = false;
    r->sse_line_len = 0;
    atc_record_marks_init(&r->marks); /* its slot was taken by choose() */
    size_t cached = r->w->policy != NULL ? atc_policy_routed(r->w->policy, &r->rreq, ep) : 0;
    r->t_attempt_us = atc_mono_us();
    uint32_t bt = atc_block_tokens(r->rreq.block_tokens);
    atc_signals_sent_guessed(&ep->sig, &r->w->table->signals, &r->sig, r->f->prompt_tokens, cached, bt,
                             r->t_attempt_us);
    struct atc_disagg_request *q = &r->dgreq;
    const char *why = "out of memory";
    *q = (struct atc_disagg_request){r->w, atc_disagg_model(r->w->table, ep), r->path, NULL, 0, r->extra_headers,
                                     ep->authorization, r->tokens, q->prefill, &r->rreq};
    int pd = body_for(r, ep, &q->body, &q->len);
    if (pd == 0 && q->model != NULL) /* a disaggregated model: its prefill stage first */
        pd = atc_disagg_attempt(&r->dg, q, ep, on_prefilled, r, &why);
    if (pd == 0)
        send_up(r);
    else if (pd < 0) {
        release_endpoint(r);
        reply_error(r, 503, "server_error", "no_endpoint_available", why, 1);
    }
}

/* ---- waiting for capacity (admission.c calls these) ---- */

/* The fleet has no room for the first attempt: wait in the admission queue, or be told at once. */
static void wait_for_capacity(struct relay *r, uint64_t deadline_ms)
{
    struct atc_admission *adm = r->w->admission;
    if (adm == NULL) {
        give_up(r); /* 503 + Retry-After */
        return;
    }
    /* Queued under the configured model's name, or "other" for a name none serves (an alias the policy
     * queues): a client picks the names, and each would be a queue kept for good, a metrics series and
     * a row in atc status. */
    snprintf(r->qi.model, sizeof(r->qi.model), "%s",
             atc_endpoint_table_model_label(r->w->table, r->f->model));
    snprintf(r->qi.tenant, sizeof(r->qi.tenant), "%s", r->tenant);
    r->qi.priority = r->priority;
    r->qi.owner = r;
    int rc = atc_admission_enqueue(adm, &r->qi, deadline_ms);
    if (rc == 0)
        relay_set_state(r, RELAY_QUEUED);
    atc_worker_queue_changed(r->w);
    if (rc < 0)
        reply_error(r, 429, "rate_limit_error", "queue_full",
                    "too many requests are waiting for this model; retry later",
                    atc_admission_retry_after(adm));
}

static bool on_queue_try_place(void *owner)
{
    struct relay *r = owner;
    relay_expect(r, RELAY_IN(RELAY_QUEUED));
    struct atc_endpoint *ep = NULL;
    switch (choose(r, &ep)) {
    case CHOSEN:
        attempt(r, ep);
        return true;
    case ANSWERED:
        return true;
    case WAIT:
    case NONE:
        break;
    }
    return false;
}

static void on_queue_expired(void *owner, uint64_t waited_ms)
{
    struct relay *r = owner;
    relay_expect(r, RELAY_IN(RELAY_QUEUED));
    char msg[160];
    snprintf(msg, sizeof(msg),
             "no capacity for this request within its deadline (waited %llu ms); retry later",
             (unsigned long long)waited_ms);
    reply_error(r, 503, "server_error", "queue_timeout", msg, atc_admission_retry_after(r->w->admission));
}

const struct atc_admission_callbacks atc_relay_admission = {
    .try_place = on_queue_try_place,
    .expired = on_queue_expired,
};

static const char *client_header(void *ctx, const char *name)
{
    struct relay *r = ctx;
    return r->client != NULL ? atc_http_req_header(r->client, name) : NULL;
}

void atc_relay_start(struct atc_worker *w, struct atc_http_req *client, const struct atc_request_info *info)
{
    struct relay *r = calloc(1, sizeof(*r));
    if (r == NULL) {
        free(info->features);
        atc_http_reply_error(client, 500, "server_error", "out_of_memory", "out of memory", 0, NULL);
        return;
    }
    atc_worker_request_started(w);
    r->w = w;
    r->t_start_us = atc_mono_us();
    atc_record_marks_init(&r->marks);
    r->client = client;
    r->f = info->features;
    r->path = info->path;
    r->body = info->body;
    r->bodylen = info->bodylen;
    r->priority = info->priority;
    atc_strlcpy(r->tenant, sizeof(r->tenant), info->tenant);
    atc_strlcpy(r->session, sizeof(r->session), info->session);
    atc_strlcpy(r->id, sizeof(r->id), info->request_id);
    /* Most of a features struct is room for prefix hashes (4 KiB); a stream, which may be held for
     * minutes, keeps only those it has (8,000 held streams: half a KiB each instead of 4.6; a short
     * answer is not worth the allocator call). After the copies above: info->session may point into it. */
    struct atc_features *kept =
        r->f->stream ? realloc(r->f, offsetof(struct atc_features, blocks) + r->f->nblocks * sizeof(uint64_t))
                     : NULL;
    if (kept != NULL)
        r->f = kept;
    struct atc_strbuf xh = atc_strbuf_init(r->extra_headers, sizeof(r->extra_headers));
    atc_strbuf_header(&xh, "x-request-id", r->id, "");
    r->tokens = atc_request_tokens(r->f->prompt_tokens, r->f->max_tokens, r->f->choices);
    if (w->recorder != NULL) /* now: the client's request may be gone when the record is made */
        r->recorded_headers = atc_recorder_capture(w->recorder, client_header, r, &r->nrecorded_headers);

    atc_http_req_set_callbacks(client, &client_cb, r);
    r->rreq = (struct atc_route_request){
        .id = r->id,
        .path = r->path,
        .kind = info->kind,
        .features = r->f,
        .priority = r->priority,
        .tenant = r->tenant,
        .session = r->session,
        .header = client_header,
        .tokens = r->tokens,
        .header_ctx = r,
        .cached_tokens = w->kv != NULL ? atc_kv_route_cached : NULL,
        .cached_ctx = atc_kv_route_init(&r->kvr, w->kv, r->f),
    };
    if (over_limit(r))
        return;
    r->deadline_ms = info->deadline_ms;
    if (atc_tokenize_start(&r->tk, w, r->f, info->kind, on_tokenized, r) == 0)
        on_tokenized(r);
}

/* The /tokenize step is over (or was not needed): the decision, on the keys it gave or on the guess. */
static void on_tokenized(void *arg)
{
    struct relay *r = arg;
    struct atc_worker *w = r->w;
    relay_expect(r, RELAY_IN(RELAY_ROUTING));
    r->kvr.tk = r->tk;
    r->rec.kind = atc_decision_balancer;
    const char *ask = client_header(r, "x-atc-explain");
    r->explain_reply = w->cfg->policy.explain && ask != NULL && strcmp(ask, "1") == 0;
    if ((r->explain_reply || w->access_log != NULL || w->recorder != NULL) && r->scores == NULL)
        r->scores = calloc(1, sizeof(*r->scores)); /* out of memory: no scores, the record goes on */
    r->rreq.explain = r->scores;
    struct atc_endpoint *ep = NULL;
    switch (choose(r, &ep)) {
    case CHOSEN:
        if (w->admission != NULL)
            atc_admission_count_direct(w->admission);
        attempt(r, ep);
        break;
    case WAIT:
        wait_for_capacity(r, r->deadline_ms);
        break;
    case ANSWERED:
        break;
    case NONE:
        give_up(r);
        break;
    }
}

/* ---- trace recording (record:) ----
 * Called once per request, at its end (relay_end, beside the access log's account), answered or
 * abandoned. Hands a small record to the recorder, which never blocks the loop. */
static void record_finished(struct relay *r, bool flushed)
{
    struct atc_recorder *rec = r->w->recorder;
    if (rec == NULL)
        return;
    const struct atc_features *f = r->f;
    uint64_t now = atc_mono_us();
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
    t.block_tokens = f->nblocks > 0 ? ATC_PREFIX_BLOCK_TOKENS : 0;
    /* The prompt points into the client's body, which is gone once a drain's last bytes are flushed. */
    if (atc_recorder_text(rec) && f->prompt != NULL && !flushed) {
        t.prompt = f->prompt;
        t.prompt_len = f->prompt_len;
    }
    struct atc_trace_field headers[ATC_TRACE_HEADERS_MAX];
    if (r->recorded_headers != NULL) {
        atc_recorder_fields(r->recorded_headers, r->nrecorded_headers, headers);
        t.headers = headers;
        t.nheaders = r->nrecorded_headers;
    }
    t.endpoint = r->ntried > 0 ? r->tried[r->ntried - 1]->id : NULL;
    t.policy_version = r->policy_version;
    t.decision = r->rec.kind; /* the access log's: the last decision, the one that routed it */
    if (r->rec.reason[0] != '\0')
        t.reason = r->rec.reason;
    t.shadow_version = r->rec.shadow_version;
    t.shadow_decision = r->rec.shadow_kind;
    t.shadow_endpoint = r->rec.shadow_endpoint[0] != '\0' ? r->rec.shadow_endpoint : NULL;
    struct evbuffer *scores = NULL;
    if (r->rec.scores != NULL && (scores = evbuffer_new()) != NULL) {
        atc_explain_json(r->rec.scores, scores);
        evbuffer_add(scores, "", 1);
        t.scores = (const char *)evbuffer_pullup(scores, -1);
    }
    t.attempts = r->ntried;
    t.status = r->client_status != 0 ? r->client_status : r->status;
    if (r->marks.first_byte_us != 0)
        t.ttft_ms = (double)(r->marks.first_byte_us - r->t_start_us) / 1000.0;
    t.total_ms = (double)(now - r->t_start_us) / 1000.0;
    atc_recorder_add(rec, &t, atc_wall_us() - (now - r->t_start_us));
    if (scores != NULL)
        evbuffer_free(scores);
}
