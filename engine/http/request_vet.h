#ifndef ATC_REQUEST_VET_H
#define ATC_REQUEST_VET_H

/* What a client sends, vetted before evhttp parses it, for what evhttp 2.1 gets wrong:
 *   - a header line that starts with a space or tab (obs-fold) is joined to the previous header, and a
 *     NUL cuts a header value short where the next hop may not: both are refused (RFC 9112 5.2 allows a
 *     server to reject obs-fold with 400; a NUL is never valid). The request is replaced by a bodiless
 *     one that carries the reason (atc_request_vet_refusal) and the rest of the connection is dropped, so
 *     the handler answers 400 in the OpenAI shape and closes;
 *   - a chunk extension ("5;name=value") makes evhttp fail the request with 413: extensions are dropped
 *     (RFC 9112 7.1.1: a recipient ignores those it does not understand), and so are trailer fields,
 *     which evhttp would merge into the headers the request was routed by (RFC 9110 6.5.1 lets a
 *     recipient that removes the chunked coding discard them).
 * A head is held back until it is complete (up to ATC_VET_HEAD_MAX; a longer one passes, and evhttp
 * refuses it), so evhttp never sees part of a refused one. Bodies pass without a copy.
 *
 * One vet per connection, on its event loop's thread; it follows the bytes from the start of a request
 * on, across the requests of the connection while it lives. */

#include <stddef.h>

struct bufferevent;
struct evhttp_request;
struct atc_request_vet;

#define ATC_VET_HEAD_MAX (64 * 1024)

/** Starts vetting what arrives on @p bev (a server connection's bufferevent, borrowed: it must outlive
 * the vet), whose input buffer holds nothing yet or starts at the start of a request. NULL when out of
 * memory (the bytes then pass unvetted). */
struct atc_request_vet *atc_request_vet_start(struct bufferevent *bev);

/** Stops vetting and frees @p vet (NULL: nothing); held bytes are given to evhttp first. */
void atc_request_vet_stop(struct atc_request_vet *vet);

/** Why the vet refused @p req ("obs_fold", "nul_in_header"; a static string), or NULL when it did not. */
const char *atc_request_vet_refusal(struct evhttp_request *req);

/** The message a client is answered with for @p refusal (from atc_request_vet_refusal). */
const char *atc_request_vet_message(const char *refusal);

#endif
