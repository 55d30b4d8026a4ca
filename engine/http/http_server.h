#ifndef ATC_HTTP_SERVER_H
#define ATC_HTTP_SERVER_H

/* atc's HTTP/1.1 server on a libevent loop: the front door, the admin port and `atc sim` all serve
 * through it (there is no other HTTP server stack in atc).
 *
 * One connection is a socket, three events embedded in its struct, and one input buffer: read interest
 * stays registered for the connection's life (a client hanging up is noticed at once, also while its
 * request is being answered), reads go straight into the buffer (no FIONREAD), and the request line and
 * headers are NUL-terminated slices of it (http_parse.h). An answer is written when it is given: the
 * socket is watched for writability only when it did not take everything. Keep-alive and HTTP/1.0,
 * pipelined requests (answered in order, one at a time), Expect: 100-continue, chunked request bodies,
 * limits (head size: 400; header count: 431; body over max_body: 413; a method not served: 501), a
 * deadline on each request (client_timeout: from the moment the server is ready for it until it is
 * whole) and on a stalled answer (no byte taken by the client for client_timeout: the connection is
 * dropped). Every error the server answers itself has an OpenAI-style JSON body.
 *
 * Threads: a server and its requests belong to the thread running its event base. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/util.h>

#include "http/http_parse.h"

struct event_base;
struct evbuffer;
struct atc_http_server;
struct atc_http_req;

struct atc_http_server_config {
    size_t max_head;     /* request line and headers, bytes (0: 64 KiB) */
    uint64_t max_body;   /* a larger request body is answered 413 (0: 1 MiB) */
    uint64_t timeout_ms; /* client_timeout (0: 60 s) */
    unsigned methods;    /* enum atc_http_method bits served; any other method is answered 501 */
    /* Most connections open at once (0: no cap). At the cap the listener is not watched: the next
     * clients wait in the kernel's backlog until a connection closes, instead of taking descriptors the
     * process needs (and an accept that fails for want of one is retried on a timer, not spun on). */
    size_t max_connections;
    /* Called (with the handler's arg) when the server answers a request itself, before any handler saw
     * it: a malformed or oversized head, a body over max_body, a bad chunk, a method not served. For the
     * access log; NULL: nothing. */
    void (*on_refused)(void *arg, int status, const char *code, const char *message);
};

/** Called once per complete request, on the loop. The handler (now or later) answers it with exactly one
 * of atc_http_reply, atc_http_reply_start ... _end, or atc_http_req_abort. */
typedef void (*atc_http_handler)(struct atc_http_req *req, void *arg);

/** A server on @p base; it serves no socket until atc_http_server_listen. Returns NULL without memory. */
struct atc_http_server *atc_http_server_create(struct event_base *base, const struct atc_http_server_config *cfg,
                                               atc_http_handler handler, void *arg);

/** Accepts connections on listening socket @p fd (taken: closed with the server, non-blocking here). */
int atc_http_server_listen(struct atc_http_server *s, evutil_socket_t fd);

/** Makes a listening socket on @p host : @p port (0: any free port) and serves it. 0, or -1 with *err. */
int atc_http_server_bind(struct atc_http_server *s, const char *host, uint16_t port, const char **err);

/** The port it listens on (0 when none). */
uint16_t atc_http_server_port(const struct atc_http_server *s);

/** Stops accepting (closes the listening socket); connections go on. */
void atc_http_server_stop_listening(struct atc_http_server *s);

/** Open connections. */
size_t atc_http_server_connections(const struct atc_http_server *s);

/** Closes the listener and every connection (requests in flight get their on_gone) and frees the server.
 * NULL is fine. Not from within one of its callbacks. */
void atc_http_server_destroy(struct atc_http_server *s);

/* ---- one request ----
 *
 * A request lives in its connection's struct, and is valid from the handler's call:
 *  - with no callbacks set, until its answer is complete (atc_http_reply, _reply_end, or _req_abort);
 *  - with callbacks set (atc_http_req_set_callbacks), until the owner clears them (NULL), which it may do
 *    after the answer ended (on_drained can still come then), or until on_gone returns.
 * The connection may close before that (the client left, a write failed): from then on every call on the
 * request does nothing, and on_gone follows from the loop, never from inside one of those calls. The next
 * request of the connection is not read into this struct before the owner has let go. */

enum atc_http_method atc_http_req_method(const struct atc_http_req *r);
/** The path without the query, NUL-terminated (percent-encoding left as sent). */
const char *atc_http_req_path(const struct atc_http_req *r);
/** The query after '?', or NULL. */
const char *atc_http_req_query(const struct atc_http_req *r);
/** The value of header @p name (case-insensitive; the first when repeated), or NULL. */
const char *atc_http_req_header(const struct atc_http_req *r, const char *name);
/** The parsed head: every header, the framing. */
const struct atc_http_head *atc_http_req_head(const struct atc_http_req *r);
/** The body (dechunked), contiguous; "" when none. Valid while the request is. */
const char *atc_http_req_body(const struct atc_http_req *r, size_t *len);

struct atc_http_req_callbacks {
    /* The connection went (the client hung up, reset, or stopped reading for client_timeout) before the
     * answer was all written. The request is gone when it returns. */
    void (*on_gone)(void *arg);
    /* Everything written so far has been taken by the client (output backlog back to 0). May come after
     * the answer ended, while callbacks are still set (draining waits for the last byte this way). */
    void (*on_drained)(void *arg);
};

/** Sets (or with NULL clears) who hears of the connection going and of its output draining. */
void atc_http_req_set_callbacks(struct atc_http_req *r, const struct atc_http_req_callbacks *cb, void *arg);

/** The answer says Connection: close, and the connection closes after it. */
void atc_http_req_close_after(struct atc_http_req *r);

/** A whole answer: @p status, Content-Type @p content_type (NULL: none), @p headers (NULL, or lines
 * "Name: value\r\n" written as they are), and @p len bytes of @p body (borrowed; copied only if the
 * socket does not take them at once). */
void atc_http_reply(struct atc_http_req *r, int status, const char *content_type, const char *headers,
                    const void *body, size_t len);

/** An answer whose body follows in pieces: chunked to HTTP/1.1 clients, until close to HTTP/1.0 ones. */
void atc_http_reply_start(struct atc_http_req *r, int status, const char *content_type, const char *headers);
/** A piece of the body (@p len bytes, borrowed). Empty pieces are skipped. */
void atc_http_reply_chunk(struct atc_http_req *r, const void *data, size_t len);
/** A piece of the body taken from @p b (drained). */
void atc_http_reply_chunk_buffer(struct atc_http_req *r, struct evbuffer *b);
/** The body is complete. */
void atc_http_reply_end(struct atc_http_req *r);

/** Drops the connection now, without (the rest of) an answer: no callback follows. */
void atc_http_req_abort(struct atc_http_req *r);

/** Bytes of the answer not yet taken by the client. */
size_t atc_http_req_backlog(const struct atc_http_req *r);

/** Answers @p r with @p status and the JSON in @p body (drained), as application/json. */
void atc_http_reply_json(struct atc_http_req *r, int status, struct evbuffer *body);

/** An OpenAI-style error answer {"error":{"message","type","param":null,"code"}}; @p code NULL: "error";
 * @p retry_after_s > 0 adds Retry-After; @p headers as for atc_http_reply. */
void atc_http_reply_error(struct atc_http_req *r, int status, const char *type, const char *code,
                          const char *message, int retry_after_s, const char *headers);

#endif
