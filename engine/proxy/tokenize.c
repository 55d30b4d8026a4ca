/* The /tokenize step before a decision (tokenize.h). */

#include "proxy/tokenize.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "base/json.h"
#include "base/log.h"
#include "fleet/endpoint.h"
#include "http/upstream.h"

#define TOKENIZE_MAX_ANSWER (16u << 20) /* bytes: a larger answer is a failure (about 2M token ids) */

struct atc_tokenize {
    const struct atc_kv_tokenize *settings; /* the asked endpoint's (kv_events.h: fixed) */
    struct atc_kv_token_cache *cache;
    uint64_t id[2]; /* the request's cache key */
    struct atc_upstream_req *up;
    struct atc_endpoint *ep; /* the one asked: its side_requests counts t while up is not NULL */
    struct event *timer;
    struct evbuffer *body; /* the request sent, then the answer read */
    struct evbuffer *answer;
    int status;
    void (*done)(void *arg);
    void *arg;
    uint64_t *keys; /* NULL until known */
    size_t nkeys;
};

static struct atc_kv_token_counters *counters(const struct atc_tokenize *t)
{
    return atc_kv_token_cache_counters(t->cache);
}

static void count(_Atomic uint64_t *c)
{
    atomic_fetch_add_explicit(c, 1, memory_order_relaxed);
}

/* The request to the endpoint has ended and let go of its pool: the endpoint may be freed from now on. */
static void up_ended(struct atc_tokenize *t)
{
    t->up = NULL;
    atomic_fetch_sub_explicit(&t->ep->side_requests, 1, memory_order_release);
}

/* The step is over (keys or not): stop everything, then tell the relay, last (it may free t). */
static void finish(struct atc_tokenize *t)
{
    atc_tokenize_cancel(t);
    t->done(t->arg);
}

/* The answer's "tokens" into keys (and the cache). Returns 0, or -1 on an answer without them. */
static int take_answer(struct atc_tokenize *t)
{
    size_t len = evbuffer_get_length(t->answer);
    const char *js = (const char *)evbuffer_pullup(t->answer, -1);
    struct atc_json j = {0};
    const char *err;
    if (js == NULL || atc_json_parse(&j, js, len, &err) < 0) {
        atc_json_dispose(&j);
        return -1;
    }
    int arr = atc_json_type(&j, 0) == ATC_JSON_OBJECT ? atc_json_get(&j, 0, "tokens") : -1;
    int n = arr >= 0 && atc_json_type(&j, arr) == ATC_JSON_ARRAY ? atc_json_count(&j, arr) : -1;
    uint32_t *tokens = n >= 0 ? malloc(((size_t)n + 1) * sizeof *tokens) : NULL;
    int rc = tokens != NULL ? 0 : -1;
    for (int i = 0, at = arr + 1; rc == 0 && i < n; i++, at = atc_json_next(&j, at)) {
        uint64_t v;
        if (!atc_json_uint(&j, at, UINT32_MAX, &v))
            rc = -1;
        tokens[i] = (uint32_t)v;
    }
    atc_json_dispose(&j);
    size_t max = ATC_KV_TOKEN_KEYS_MAX;
    if (rc == 0 && (t->keys = malloc(max * sizeof *t->keys)) != NULL) {
        t->nkeys = atc_kv_keys(&t->settings->keyer, tokens, (size_t)n, t->keys, max);
        atc_kv_token_cache_put(t->cache, t->id, t->keys, t->nkeys);
    } else {
        rc = -1;
    }
    free(tokens);
    return rc;
}

static void on_headers(void *arg, const struct atc_upstream_response *resp)
{
    struct atc_tokenize *t = arg;
    t->status = resp->status;
}

static void on_body(void *arg, const char *data, size_t len)
{
    struct atc_tokenize *t = arg;
    if (evbuffer_get_length(t->answer) + len <= TOKENIZE_MAX_ANSWER)
        evbuffer_add(t->answer, data, len);
    else
        t->status = -1; /* too long: a failure at the end */
}

static void on_done(void *arg)
{
    struct atc_tokenize *t = arg;
    up_ended(t); /* gone after this callback (its connection is back in the pool already) */
    if (t->status != 200 || take_answer(t) < 0) {
        count(&counters(t)->failures);
        atc_debug("tokenize: status %d, or an answer without token ids: the decision guesses", t->status);
    }
    finish(t);
}

static void on_error(void *arg, enum atc_upstream_error err, bool got_response)
{
    (void)got_response;
    struct atc_tokenize *t = arg;
    up_ended(t); /* (its connection closed already) */
    count(&counters(t)->failures);
    atc_debug("tokenize: %s: the decision guesses", atc_upstream_strerror(err));
    finish(t);
}

static void on_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct atc_tokenize *t = arg;
    count(&counters(t)->timeouts);
    finish(t);
}

static const struct atc_upstream_callbacks tokenize_cb = {
    .on_headers = on_headers,
    .on_body = on_body,
    .on_done = on_done,
    .on_error = on_error,
};

/* The endpoint to ask: the first routable one of the request's model with tokenize on. */
static struct atc_endpoint *pick(struct atc_worker *w, const struct atc_features *f,
                                 const struct atc_kv_tokenize **settings)
{
    const struct atc_model *m = atc_endpoint_table_model(w->table, f->model, strlen(f->model));
    for (size_t i = 0; m != NULL && i < m->nendpoints; i++) {
        struct atc_endpoint *ep = m->endpoints[i];
        int slot = atc_kv_events_slot(w->kv, ep->id);
        if (slot >= 0 && (*settings = atc_kv_events_tokenize(w->kv, (unsigned)slot)) != NULL &&
            atomic_load_explicit(&ep->routable, memory_order_relaxed))
            return ep;
    }
    return NULL;
}

/* What is sent: vLLM's TokenizeChatRequest or TokenizeCompletionRequest. */
static int write_body(struct evbuffer *b, const struct atc_features *f, enum atc_request_kind kind)
{
    int rc = evbuffer_add_printf(b, "{\"model\":");
    atc_json_write_string(b, f->model);
    rc |= evbuffer_add_printf(b, kind == ATC_KIND_CHAT ? ",\"messages\":" : ",\"prompt\":");
    rc |= evbuffer_add(b, f->prompt, f->prompt_len);
    rc |= evbuffer_add_printf(b, kind == ATC_KIND_CHAT ? ",\"add_generation_prompt\":true}" : "}");
    return rc < 0 ? -1 : 0;
}

int atc_tokenize_start(struct atc_tokenize **out, struct atc_worker *w, const struct atc_features *f,
                       enum atc_request_kind kind, void (*done)(void *arg), void *arg)
{
    *out = NULL;
    const struct atc_kv_tokenize *s = NULL;
    struct atc_endpoint *ep;
    if (w->kv == NULL || f->prompt == NULL || f->has_tools || kind == ATC_KIND_EMBEDDING ||
        (kind == ATC_KIND_COMPLETION && f->prompt[0] != '"') || (ep = pick(w, f, &s)) == NULL ||
        f->prompt_len < s->min_bytes)
        return 0;
    struct atc_tokenize *t = calloc(1, sizeof *t);
    if (t == NULL)
        return 0;
    *out = t;
    t->settings = s;
    t->cache = atc_kv_events_token_cache(w->kv);
    t->done = done;
    t->arg = arg;
    atc_kv_token_cache_id(f->model, (int)kind, f->prompt, f->prompt_len, t->id);
    if ((t->keys = malloc(ATC_KV_TOKEN_KEYS_MAX * sizeof *t->keys)) == NULL)
        return 0;
    long hit = atc_kv_token_cache_get(t->cache, t->id, t->keys, ATC_KV_TOKEN_KEYS_MAX);
    if (hit >= 0) {
        t->nkeys = (size_t)hit;
        return 0;
    }
    free(t->keys);
    t->keys = NULL;
    struct timeval tv = {.tv_sec = (time_t)(s->timeout_ms / 1000),
                         .tv_usec = (suseconds_t)(s->timeout_ms % 1000) * 1000};
    if (!(t->body = evbuffer_new()) || !(t->answer = evbuffer_new()) || write_body(t->body, f, kind) < 0 ||
        !(t->timer = evtimer_new(w->base, on_timeout, t)) || evtimer_add(t->timer, &tv) < 0)
        return 0;
    size_t len = evbuffer_get_length(t->body);
    const char *body = (const char *)evbuffer_pullup(t->body, -1);
    /* Counted while this worker is still on a table with ep: a removal waits for it (proxy/table_swap.h). */
    t->ep = ep;
    atomic_fetch_add_explicit(&ep->side_requests, 1, memory_order_relaxed);
    t->up = body != NULL ? atc_upstream_send_as(ep->pools[w->id], "POST", "/tokenize", NULL,
                                                ep->authorization, body, len, &tokenize_cb, t)
                         : NULL;
    if (t->up == NULL) {
        atomic_fetch_sub_explicit(&ep->side_requests, 1, memory_order_release);
        atc_tokenize_cancel(t);
        return 0;
    }
    count(&counters(t)->calls);
    return 1;
}

const uint64_t *atc_tokenize_keys(const struct atc_tokenize *t, size_t *n, uint32_t *block_tokens)
{
    if (t == NULL || t->keys == NULL)
        return NULL;
    *n = t->nkeys;
    *block_tokens = t->settings->keyer.block_size;
    return t->keys;
}

int atc_tokenize_matches(const struct atc_tokenize *t, const struct atc_kv_tokenize *s)
{
    const struct atc_kv_keyer *a = &t->settings->keyer, *b = &s->keyer;
    return s == t->settings ||
           (a->hash == b->hash && a->block_size == b->block_size && a->digest_len == b->digest_len &&
            memcmp(a->none_hash, b->none_hash, a->digest_len) == 0);
}

void atc_tokenize_cancel(struct atc_tokenize *t)
{
    if (t == NULL)
        return;
    if (t->up != NULL) {
        atc_upstream_cancel(t->up); /* (not from its own callbacks: it ends here, its connection closed) */
        up_ended(t);
    }
    if (t->timer != NULL)
        event_free(t->timer);
    t->timer = NULL;
}

void atc_tokenize_free(struct atc_tokenize *t)
{
    if (t == NULL)
        return;
    atc_tokenize_cancel(t);
    if (t->body != NULL)
        evbuffer_free(t->body);
    if (t->answer != NULL)
        evbuffer_free(t->answer);
    free(t->keys);
    free(t);
}
