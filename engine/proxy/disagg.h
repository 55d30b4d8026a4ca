#ifndef ATC_DISAGG_H
#define ATC_DISAGG_H

/* The two-stage request of a disaggregated model (disaggregation: on a model, config/roles.h): before the
 * relay (relay.c) sends a request to its decode server, this picks the prefill server and runs the
 * protocol's first stage, on the relay's worker thread.
 *
 * - vLLM (NixlConnector), as vLLM's disaggregated proxy does it (tests/v1/kv_connector/nixl_integration/
 *   toy_proxy_server.py, send_request_to_service and _handle_completions): the prefill server gets the
 *   client's body with kv_transfer_params {do_remote_decode: true, do_remote_prefill: false,
 *   remote_engine_id, remote_block_ids, remote_host, remote_port: null}, stream false, max_tokens 1 (and
 *   max_completion_tokens 1 when the body has it), without stream_options, min_tokens and
 *   min_completion_tokens, under the same x-request-id; its JSON answer's top-level kv_transfer_params
 *   go into the client's body for the decode server, whose answer the client gets. A prefill server that
 *   fails before it answers (connection, 5xx, an answer without kv_transfer_params) is replaced by
 *   another within upstream.tries; a decode server that fails before its first byte is replaced with the
 *   same transfer params (the prefill server holds the blocks until they are read or time out).
 * - SGLang (sgl-model-gateway/src/routers/http/pd_router.rs, inject_bootstrap_into_value and
 *   execute_dual_dispatch): bootstrap_host (the prefill server's host), bootstrap_port (its
 *   bootstrap_port:) and a random bootstrap_room below 2^63 (arrays of n for a batch: a completion's
 *   prompt array, or a chat's n > 1) go into the body, which goes to both servers at once; decode's
 *   answer is relayed, prefill's read and dropped. A decode retry runs both again, with a new room.
 *
 * One struct atc_disagg per request, owned by the relay; freeing it cancels a prefill in flight and frees
 * the prefill server's slot. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "http/upstream.h" /* enum atc_upstream_error */

struct atc_route_request;

struct atc_worker;
struct atc_endpoint;
struct atc_model;
struct atc_disagg;
struct atc_endpoint_table;
struct atc_access_record;

/* What the relay hands to a request's stages. */
struct atc_disagg_request {
    struct atc_worker *w;
    const struct atc_model *model; /* disaggregated; in w->table now: read during atc_disagg_attempt only */
    const char *path;              /* upstream path */
    const char *body;              /* the client's body as the decode server gets it (a model alias mapped) */
    size_t len;
    const char *headers; /* the relay's extra headers (x-request-id) */
    const char *auth;    /* an Authorization value, or NULL */
    uint64_t tokens;     /* prompt estimate + max_tokens, for the prefill server's slot */
    struct atc_endpoint *prefill; /* the policy's prefill server (runtime.c checked it takes the stage), tried
                                   * first; NULL, tried, full or failed: the C balancer picks */
    const struct atc_route_request *rreq; /* its prompt's blocks: the prefill server will hold them too */
};

/** Called once the first stage is over: @p err NULL and the decode body ready (atc_disagg_body), or the
 * reason no prefill server could do it. SGLang (whose attempt was ready at once): called with the reason
 * when the pair's prefill failed while the relay held the decode attempt, which then goes again with a new
 * pair, or goes on if its answer started. Never called from within atc_disagg_attempt. */
typedef void (*atc_disagg_on_ready)(void *arg, const char *err);

/** Makes ready the attempt on decode server @p decode (its slot held by the relay) of request @p rq
 * (borrowed until *dg is freed). *dg is created on the first attempt. Returns 0 when the decode body is
 * ready now (SGLang: the prefill request is on its way; vLLM: a retry with the transfer params kept), 1
 * when @p on_ready will be called (vLLM: the prefill server works), -1 when nothing can be done (out of
 * memory, no prefill server can take it: *err says which). */
int atc_disagg_attempt(struct atc_disagg **dg, const struct atc_disagg_request *rq,
                       struct atc_endpoint *decode, atc_disagg_on_ready on_ready, void *arg,
                       const char **err);

/** The decode server's body of the last ready attempt (borrowed from @p dg). */
void atc_disagg_body(const struct atc_disagg *dg, const char **body, size_t *len);

/** Counts a failure of the decode attempt in /metrics (ops/stage_metrics.h): an answer of @p status (a 5xx,
 * a 429, a refused key), or with @p status 0 the upstream error @p err. NULL @p dg: not disaggregated. */
void atc_disagg_decode_failed(struct atc_disagg *dg, int status, enum atc_upstream_error err);
/** Fills the stages' fields of the access log's @p rec (NULL @p dg: none): the prefill server of the last
 * attempt, the prefill's time (from the first prefill send to the answer used; vLLM) and the time from
 * that answer to the client's first token at @p first_us (0: none); the same times go to /metrics. The
 * relay ends: a prefill failure after this is not reported to it. */
void atc_disagg_log(struct atc_disagg *dg, struct atc_access_record *rec, uint64_t first_us);

/** The disaggregated model endpoint @p ep serves, or NULL when its model is not disaggregated. */
const struct atc_model *atc_disagg_model(const struct atc_endpoint_table *t, const struct atc_endpoint *ep);
/** Whether a request whose decode server is @p decode can start its prefill now: true but for a
 * disaggregated model whose prefill servers are all full (the request then waits in the admission queue,
 * as it would for a full fleet, and a prefill slot freed wakes it). */
bool atc_disagg_prefill_room(struct atc_worker *w, const struct atc_endpoint *decode, uint64_t tokens);
/** Cancels a prefill in flight, frees its slot and @p dg; NULL is fine. */
void atc_disagg_free(struct atc_disagg *dg);

#endif
