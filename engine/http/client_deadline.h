#ifndef ATC_CLIENT_DEADLINE_H
#define ATC_CLIENT_DEADLINE_H

/* A deadline on reading each request from a client (client_timeout).
 *
 * evhttp's own timeout (evhttp_set_timeout) bounds the silence between two reads, which a slowloris
 * client sending a byte a second never reaches: it would hold its connection, and its request buffers,
 * for ever. With a deadline attached, a client must send each request whole (request line, headers and
 * body) within the timeout of the moment atc is ready for it: the connection accepted, or the answer to
 * its previous request written. Otherwise the connection is closed without an answer, as nginx does for
 * client_header_timeout. Once a request is complete the deadline stops: how long the answer takes is
 * the upstream timeouts' business, and a client that stops reading it meets evhttp's write timeout. */

#include <stdint.h>

struct event_base;
struct evhttp;
struct evhttp_request;
struct atc_client_deadline;

/** Serves @p http's requests with @p handler(req, @p arg) under a deadline of @p timeout_ms per request.
 * Sets the evhttp's generic callback and bufferevent callback (the caller sets neither). Returns NULL
 * on allocation failure. Never calls back before it returns. */
struct atc_client_deadline *atc_client_deadline_attach(struct evhttp *http, struct event_base *base,
                                                       uint64_t timeout_ms,
                                                       void (*handler)(struct evhttp_request *, void *),
                                                       void *arg);

/** Frees the deadlines' state. Call after evhttp_free() of the server it was attached to. NULL is fine. */
void atc_client_deadline_destroy(struct atc_client_deadline *d);

#endif
