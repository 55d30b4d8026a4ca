/* atc sim's /tokenize and its engine-style block keys (sim_tokenize.h). */

#include "sim/sim_tokenize.h"

#include <stdbool.h>
#include <stdlib.h>

#include <event2/buffer.h>

#include "request/kv_keys.h"

#define SIM_MAX_MODEL_LEN 131072

struct held {
    struct atc_sim_tokenizer *t;
    struct atc_http_req *req;
    struct evbuffer *answer;
    struct event *timer;
    struct held *prev, *next;
};

struct atc_sim_tokenizer {
    struct event_base *base;
    bool keyed;
    struct atc_kv_keyer keyer;
    uint64_t delay_ms;
    struct held *held; /* answers waiting for their delay */
};

struct atc_sim_tokenizer *atc_sim_tokenizer_create(struct event_base *base, const char *hash,
                                                   uint32_t block_tokens, uint64_t delay_ms, const char **err)
{
    enum atc_kv_hash h = ATC_KV_HASH_SHA256_CBOR;
    if (hash != NULL && atc_kv_hash_parse(hash, &h) < 0) {
        *err = "--kv-events-hash: one of sha256_cbor, xxhash_cbor, sglang";
        return NULL;
    }
    struct atc_sim_tokenizer *t = calloc(1, sizeof *t);
    if (t == NULL || (hash != NULL && atc_kv_keyer_init(&t->keyer, h, block_tokens, 0) < 0)) {
        free(t);
        *err = "out of memory";
        return NULL;
    }
    t->base = base;
    t->keyed = hash != NULL;
    t->delay_ms = delay_ms;
    return t;
}

static void held_free(struct held *h)
{
    if (h->prev)
        h->prev->next = h->next;
    else
        h->t->held = h->next;
    if (h->next)
        h->next->prev = h->prev;
    if (h->req)
        atc_http_req_set_callbacks(h->req, NULL, NULL);
    event_free(h->timer);
    evbuffer_free(h->answer);
    free(h);
}

void atc_sim_tokenizer_destroy(struct atc_sim_tokenizer *t)
{
    if (t == NULL)
        return;
    while (t->held)
        held_free(t->held);
    free(t);
}

static void on_held_gone(void *arg)
{
    struct held *h = arg;
    h->req = NULL; /* gone with its connection */
    held_free(h);
}

static const struct atc_http_req_callbacks held_cb = {.on_gone = on_held_gone};

static void on_delay(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct held *h = arg;
    struct atc_http_req *req = h->req;
    atc_http_req_set_callbacks(req, NULL, NULL);
    h->req = NULL;
    atc_http_reply(req, 200, "application/json", NULL, evbuffer_pullup(h->answer, -1),
                   evbuffer_get_length(h->answer));
    held_free(h);
}

/* The messages (or else the prompt) of @p body, scanned as atc serve scans a request. */
static int scan(const char *body, size_t len, struct atc_features *f, const char **err)
{
    if (atc_features_scan(ATC_KIND_CHAT, body, len, f, err) == 0 && f->prompt != NULL)
        return 0;
    if (atc_features_scan(ATC_KIND_COMPLETION, body, len, f, err) < 0)
        return -1;
    if (f->prompt == NULL || f->prompt[0] != '"') {
        *err = "'messages' (a list) or 'prompt' (a string) is required";
        return -1;
    }
    return 0;
}

void atc_sim_tokenizer_handle(struct atc_sim_tokenizer *t, struct atc_http_req *req)
{
    size_t len = 0;
    const char *body = atc_http_req_body(req, &len);
    const char *err = NULL;
    struct atc_features *f = malloc(sizeof *f);
    struct evbuffer *b = evbuffer_new();
    uint32_t *tokens = NULL;
    if (f == NULL || b == NULL)
        goto oom;
    if (scan(body ? body : "", body ? len : 0, f, &err) < 0) {
        evbuffer_add_printf(
            b, "{\"object\":\"error\",\"message\":\"%s\",\"type\":\"BadRequestError\",\"code\":400}", err);
        atc_http_reply(req, 400, "application/json", NULL, evbuffer_pullup(b, -1), evbuffer_get_length(b));
        goto done;
    }
    size_t n = atc_kv_sim_tokenize(f->prompt, f->prompt_len, NULL, 0);
    if ((tokens = malloc((n + 1) * sizeof *tokens)) == NULL)
        goto oom;
    atc_kv_sim_tokenize(f->prompt, f->prompt_len, tokens, n);
    evbuffer_add_printf(b, "{\"count\":%zu,\"max_model_len\":%d,\"tokens\":[", n, SIM_MAX_MODEL_LEN);
    for (size_t i = 0; i < n; i++)
        evbuffer_add_printf(b, i ? ",%u" : "%u", tokens[i]);
    evbuffer_add(b, "]}", 2);
    if (t->delay_ms == 0) {
        atc_http_reply(req, 200, "application/json", NULL, evbuffer_pullup(b, -1), evbuffer_get_length(b));
        goto done;
    }
    struct held *h = calloc(1, sizeof *h);
    if (h == NULL || !(h->timer = evtimer_new(t->base, on_delay, h))) {
        free(h);
        goto oom;
    }
    *h = (struct held){.t = t, .req = req, .answer = b, .timer = h->timer, .next = t->held};
    if (t->held)
        t->held->prev = h;
    t->held = h;
    b = NULL; /* the held answer's */
    struct timeval tv = {.tv_sec = (time_t)(t->delay_ms / 1000),
                         .tv_usec = (suseconds_t)(t->delay_ms % 1000) * 1000};
    evtimer_add(h->timer, &tv);
    atc_http_req_set_callbacks(req, &held_cb, h);
    goto done;
oom:
    atc_http_reply(req, 500, NULL, NULL, "", 0);
done:
    free(tokens);
    free(f);
    if (b != NULL)
        evbuffer_free(b);
}

size_t atc_sim_tokenizer_keys(const struct atc_sim_tokenizer *t, const struct atc_features *f, uint64_t *out,
                              size_t max)
{
    if (!t->keyed || f->prompt == NULL)
        return 0;
    size_t n = atc_kv_sim_tokenize(f->prompt, f->prompt_len, NULL, 0);
    uint32_t *tokens = malloc((n + 1) * sizeof *tokens);
    if (tokens == NULL)
        return 0;
    atc_kv_sim_tokenize(f->prompt, f->prompt_len, tokens, n);
    size_t k = atc_kv_keys(&t->keyer, tokens, n, out, max);
    free(tokens);
    return k;
}
