#ifndef ATC_RELAY_H
#define ATC_RELAY_H

/* One proxied request, from the routing decision to the last byte relayed to the client: endpoint
 * choice, upstream attempts and retries, the response relayed (SSE chunk by chunk with backpressure,
 * or whole), client disconnects, and the endpoint's counters. */

#include <stdbool.h>
#include <stdint.h>

#include "request/request_features.h"

struct atc_worker;
struct atc_http_req;

struct atc_request_info {
    enum atc_request_kind kind;
    const char *path; /* upstream path, e.g. "/v1/chat/completions" */
    const char *body; /* the client's body, contiguous, owned by the client's request */
    size_t bodylen;
    struct atc_features *features; /* taken: freed with the request (cut after blocks[nblocks]) */
    int priority;                  /* x-atc-priority, 0-9 */
    const char *tenant;            /* x-atc-tenant or "" (copied) */
    const char *session;           /* x-atc-session, else the body's user, or "" (copied) */
    const char *request_id;        /* x-request-id (sanitized) or one atc made */
    uint64_t deadline_ms;          /* x-atc-deadline: how long it may wait for capacity (0: the default) */
};

/* What the admission queue calls back (see admission.h). */
extern const struct atc_admission_callbacks atc_relay_admission;

/** Routes @p client (whose model exists and whose body has been scanned) and relays the answer.
 * Always answers the client, also on failure. */
void atc_relay_start(struct atc_worker *w, struct atc_http_req *client,
                     const struct atc_request_info *info);

#endif
