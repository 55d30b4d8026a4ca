/* The upstream HTTP/1.1 response parser (engine/http/upstream.c, included for its statics): status line,
 * headers, content-length / chunked / until-close bodies, and so the framing of an SSE stream, as far as
 * atc parses it (atc relays SSE events as bytes and never splits them; it only dechunks).
 *
 * Input: byte 0 picks the mode, byte 1 seeds how the bytes are cut into reads, the rest is the data.
 *   mode 0-1  the data is a server's response, fed read by read through the real read and event
 *             callbacks, then the server closes. The outcome (status, body, done or which error) must not
 *             depend on how the bytes were cut: it is compared with one read of everything.
 *   mode 2    the data is an SSE body, sent by a well-formed server as a chunked text/event-stream with
 *             chunk sizes drawn from the data: the client must receive exactly the data, then done.
 *   mode 3    like 0, and the caller cancels the request from inside a callback (as relay.c does on a
 *             5xx retry or a client that left): no callback may follow, nothing may leak.
 * No byte goes through a socket: each read is handed to conn_took, as on_conn_readable hands it what a
 * recv brought (so one read of everything takes the paths a whole head or body takes in one recv). */

#include "../../engine/http/upstream.c"

#include <stdint.h>

#include "fuzz.h"

static struct event_base *base;
static struct atc_upstream_pool *pool;

struct outcome {
    int headers; /* on_headers calls */
    int status;
    bool event_stream;
    int64_t content_length;
    struct evbuffer *body;
    int done, errors; /* on_done / on_error calls */
    enum atc_upstream_error err;
    bool ended;    /* after on_done / on_error the request is gone */
    int cancel_at; /* mode 3: cancel in the n-th callback (1-based); 0 = never */
    int calls;
    struct atc_upstream_req *req;
};

static void maybe_cancel(struct outcome *o)
{
    if (o->cancel_at > 0 && ++o->calls == o->cancel_at) {
        atc_upstream_cancel(o->req);
        o->ended = true; /* cancelled: no callback may follow */
    }
}

static void on_headers(void *arg, const struct atc_upstream_response *resp)
{
    struct outcome *o = arg;
    CHECK(!o->ended && o->headers == 0);
    CHECK(resp->status >= 200 && resp->status <= 599);
    o->headers++;
    o->status = resp->status;
    o->event_stream = resp->event_stream;
    o->content_length = resp->content_length;
    maybe_cancel(o);
}

static void on_body(void *arg, const char *data, size_t len)
{
    struct outcome *o = arg;
    CHECK(!o->ended && o->headers == 1 && len > 0);
    evbuffer_add(o->body, data, len);
    maybe_cancel(o);
}

static void on_done(void *arg)
{
    struct outcome *o = arg;
    CHECK(!o->ended && o->headers == 1);
    if (o->content_length >= 0 && o->status != 204 && o->status != 304)
        CHECK((uint64_t)evbuffer_get_length(o->body) <= (uint64_t)o->content_length);
    o->done++;
    o->ended = true;
}

static void on_error(void *arg, enum atc_upstream_error err, bool got_response)
{
    struct outcome *o = arg;
    CHECK(!o->ended);
    o->errors++;
    o->err = err;
    o->ended = true;
}

static const struct atc_upstream_callbacks callbacks = {on_headers, on_body, on_done, on_error};

/* A request as atc_upstream_send leaves it once the connection is up and the request written. */
static struct atc_upstream_req *start(struct outcome *o)
{
    struct atc_upstream_req *req = calloc(1, sizeof(*req));
    CHECK(req != NULL);
    req->pool = pool;
    req->cb = &callbacks;
    req->arg = o;
    struct upstream_conn *c = conn_new(pool); /* its socket is never connected: we are its reads */
    CHECK(c != NULL);
    c->connecting = false;
    c->req = req;
    req->conn = c;
    o->req = req;
    return req;
}

static uint32_t next(uint32_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return *s;
}

/* Feeds @p len bytes in reads of 1..max bytes (seeded by @p seed; max 0 = one read), then EOF. */
static void feed(struct outcome *o, const uint8_t *data, size_t len, uint8_t seed, size_t max)
{
    struct atc_upstream_req *req = start(o);
    struct upstream_conn *c = req->conn;
    uint32_t s = 0x9e3779b9u ^ seed;
    size_t i = 0;
    while (i < len && !o->ended) {
        size_t n = max ? 1 + next(&s) % max : len;
        if (n > len - i)
            n = len - i;
        if (n > READ_MAX)
            n = READ_MAX; /* no recv brings more */
        char buf[READ_MAX];
        memcpy(buf, data + i, n);
        i += n;
        conn_took(c, buf, n);
    }
    if (!o->ended) /* the server closes */
        conn_broken(c, true);
    CHECK(o->ended);
    CHECK(o->cancel_at > 0 || o->done + o->errors == 1);
}

static void outcome_init(struct outcome *o)
{
    memset(o, 0, sizeof(*o));
    o->body = evbuffer_new();
}

static bool same_body(struct evbuffer *a, struct evbuffer *b)
{
    size_t n = evbuffer_get_length(a);
    if (n != evbuffer_get_length(b))
        return false;
    return n == 0 || memcmp(evbuffer_pullup(a, -1), evbuffer_pullup(b, -1), n) == 0;
}

/* A well-formed chunked SSE response carrying @p data, chunk sizes drawn from @p seed. */
static struct evbuffer *sse_response(const uint8_t *data, size_t len, uint8_t seed)
{
    struct evbuffer *r = evbuffer_new();
    evbuffer_add_printf(r, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
                           "Transfer-Encoding: chunked\r\n\r\n");
    uint32_t s = 0x85ebca6bu ^ seed;
    for (size_t i = 0; i < len;) {
        size_t n = 1 + next(&s) % 300;
        if (n > len - i)
            n = len - i;
        evbuffer_add_printf(r, "%zx%s\r\n", n, next(&s) % 4 == 0 ? ";ext=1" : "");
        evbuffer_add(r, data + i, n);
        evbuffer_add(r, "\r\n", 2);
        i += n;
    }
    evbuffer_add_printf(r, "0\r\n\r\n");
    return r;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    struct atc_upstream_settings settings = {
        .connect_timeout_ms = 1000, .first_byte_timeout_ms = 1000, .idle_timeout_ms = 1000, .keepalive = 0};
    const char *err;
    base = event_base_new();
    pool = atc_upstream_pool_create(base, "127.0.0.1", 9, &settings, &err);
    CHECK(base != NULL && pool != NULL);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    uint8_t mode = data[0] % 4, seed = data[1];
    data += 2;
    size -= 2;
    struct outcome whole, split;
    outcome_init(&whole);
    outcome_init(&split);

    if (mode == 2) {
        struct evbuffer *resp = sse_response(data, size, seed);
        size_t n = evbuffer_get_length(resp);
        feed(&split, evbuffer_pullup(resp, -1), n, seed, 64);
        evbuffer_free(resp);
        CHECK(split.done == 1 && split.status == 200 && split.event_stream && split.content_length == -1);
        CHECK(evbuffer_get_length(split.body) == size);
        CHECK(size == 0 || memcmp(evbuffer_pullup(split.body, -1), data, size) == 0);
    } else if (mode == 3) {
        split.cancel_at = 1 + seed % 4;
        feed(&split, data, size, seed, 32);
    } else {
        feed(&whole, data, size, 0, 0);
        feed(&split, data, size, seed, mode == 0 ? 8 : 512);
        CHECK(whole.done == split.done && whole.errors == split.errors && whole.headers == split.headers);
        if (whole.errors)
            CHECK(whole.err == split.err);
        if (whole.headers) {
            CHECK(whole.status == split.status && whole.event_stream == split.event_stream);
            CHECK(whole.content_length == split.content_length);
            /* also when the answer fails: what came before the fault is relayed however the reads cut it */
            CHECK(same_body(whole.body, split.body));
        }
    }
    evbuffer_free(whole.body);
    evbuffer_free(split.body);
    return 0;
}
