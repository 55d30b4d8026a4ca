#ifndef ATC_UPSTREAM_H
#define ATC_UPSTREAM_H

/* HTTP/1.1 client to inference servers: a pool of keep-alive connections per endpoint, connect /
 * first-byte / idle timeouts, chunked and content-length bodies delivered as they arrive, pause and
 * resume for backpressure, and cancel. Written on plain sockets and libevent events rather than evhttp's
 * client (or bufferevents) so that each timeout is its own, reads can be paused per stream, a stale
 * keep-alive connection is retried transparently, and a small request costs one sendmsg and one recv. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct event_base;
struct evbuffer;
struct atc_upstream_pool;
struct atc_upstream_req;

struct atc_upstream_settings {
    uint64_t connect_timeout_ms;
    /* from the request written to the answer's head, or for an event stream to its first event
     * (atc_upstream_first_event): vLLM, SGLang and TGI send a stream's head before prefill */
    uint64_t first_byte_timeout_ms;
    uint64_t idle_timeout_ms;       /* longest gap between two reads of the body, after the above */
    uint64_t token_timeout_ms;      /* a whole answer's head may come this much later per output token
                                     * (atc_upstream_whole_answer) */
    unsigned keepalive;             /* idle connections kept per endpoint */
};

enum atc_upstream_error {
    ATC_UPSTREAM_ERR_CONNECT, /* refused, unreachable, reset while connecting */
    ATC_UPSTREAM_ERR_CONNECT_TIMEOUT,
    ATC_UPSTREAM_ERR_FIRST_BYTE_TIMEOUT,
    ATC_UPSTREAM_ERR_IDLE_TIMEOUT,
    ATC_UPSTREAM_ERR_CLOSED,     /* the server closed or reset the connection early */
    ATC_UPSTREAM_ERR_PROTOCOL,   /* not HTTP, or a malformed response */
    ATC_UPSTREAM_ERR_BAD_STREAM, /* a text/event-stream answer that is not server-sent events */
};

/** A short, stable name of @p err for logs and error messages ("connect failed", ...). */
const char *atc_upstream_strerror(enum atc_upstream_error err);
/** True for the timeouts (the client gets 504 rather than 502). */
bool atc_upstream_is_timeout(enum atc_upstream_error err);

struct atc_upstream_response {
    int status;
    const char *content_type; /* NULL if absent; valid during on_headers only */
    bool event_stream;        /* content-type text/event-stream */
    int64_t content_length;   /* -1 if absent (chunked or until close) */
    /* The end-to-end headers to pass on, as "Name: value\r\n" lines (@p headers_len bytes, NUL-terminated;
     * valid during on_headers only): all but the hop-by-hop ones (Connection and those it names,
     * Keep-Alive, Transfer-Encoding, TE, Trailer, Upgrade, Proxy-*) and the framing the reader makes
     * again (Content-Length; Content-Type, which is content_type above). At most
     * ATC_UPSTREAM_HEADERS_MAX bytes: the headers past it are dropped. */
    const char *headers;
    size_t headers_len;
};

#define ATC_UPSTREAM_HEADERS_MAX 8192

/* Callbacks of one request. Each may call atc_upstream_cancel() on the request. After on_done or
 * on_error the request is gone: the caller must forget its handle. */
struct atc_upstream_callbacks {
    void (*on_headers)(void *arg, const struct atc_upstream_response *resp);
    /* The next @p len bytes of the body (dechunked), all that one read brought: borrowed for the call only
     * (they are on the reading function's stack), so a caller that keeps them copies them. */
    void (*on_body)(void *arg, const char *data, size_t len);
    void (*on_done)(void *arg);
    /* @p got_response: whether any byte of the response had arrived. */
    void (*on_error)(void *arg, enum atc_upstream_error err, bool got_response);
};

/** A pool for the server at @p host:@p port (resolved now). Returns NULL and *err on failure. */
struct atc_upstream_pool *atc_upstream_pool_create(struct event_base *base, const char *host, uint16_t port,
                                                   const struct atc_upstream_settings *settings,
                                                   const char **err);
/** Closes idle connections and frees the pool. No request may be outstanding. */
void atc_upstream_pool_destroy(struct atc_upstream_pool *pool);
/** Idle connections currently kept. */
size_t atc_upstream_pool_idle(const struct atc_upstream_pool *pool);

/** Sends "@p method @p path" with @p extra_headers (complete "Name: value\r\n" lines, or NULL) and the
 * @p len bytes of @p body (borrowed until the request ends: not copied). Never calls back before it
 * returns. Returns the request, or NULL on allocation failure. */
struct atc_upstream_req *atc_upstream_send(struct atc_upstream_pool *pool, const char *method,
                                           const char *path, const char *extra_headers, const char *body,
                                           size_t len, const struct atc_upstream_callbacks *cb, void *arg);

/** The first event of an event-stream answer arrived. Until then the first-byte timeout, which an
 * event stream's head does not stop, bounds the wait; from then on the idle timeout bounds each gap.
 * Does nothing for an answer that is not an event stream (its head stopped the first-byte timeout). */
void atc_upstream_first_event(struct atc_upstream_req *req);

/** The answer will come whole once generated (not streamed): the engines send its head once the last
 * of up to @p max_tokens is decoded (vLLM's chat_completion_full_generator,
 * vllm/entrypoints/openai/serving_chat.py, returns after the whole generation), so it may take
 * first_byte_timeout_ms + max_tokens x token_timeout_ms (@p max_tokens < 0: not set, taken as
 * ATC_UPSTREAM_WHOLE_ANSWER_TOKENS). Called right after the send, before the loop runs again. */
void atc_upstream_whole_answer(struct atc_upstream_req *req, int64_t max_tokens);

/* Without max_tokens vLLM may generate to the context's end (max_tokens = max_model_len - prompt,
 * vllm/entrypoints/openai/serving_engine.py): the wait for such an answer allows this many. */
#define ATC_UPSTREAM_WHOLE_ANSWER_TOKENS 4096
/* More than this is no engine's context (vLLM answers it 400): a larger max_tokens counts as this. */
#define ATC_UPSTREAM_CONTEXT_MAX 131072

/** The same, with an "Authorization: @p authorization" header line when @p authorization is not NULL
 * (a value without CR or LF: the caller checked it; it is copied into the request's head). */
struct atc_upstream_req *atc_upstream_send_as(struct atc_upstream_pool *pool, const char *method,
                                              const char *path, const char *extra_headers,
                                              const char *authorization, const char *body, size_t len,
                                              const struct atc_upstream_callbacks *cb, void *arg);

/** Stops reading the response (the client is slow); the idle timeout is suspended meanwhile. */
void atc_upstream_pause(struct atc_upstream_req *req);
/** Resumes reading after atc_upstream_pause. */
void atc_upstream_resume(struct atc_upstream_req *req);
/** Abandons the request: no more callbacks; its connection is closed (which tells the server to stop). */
void atc_upstream_cancel(struct atc_upstream_req *req);

#endif
