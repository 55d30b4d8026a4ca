#ifndef ATC_KV_ROUTE_H
#define ATC_KV_ROUTE_H

/* ep:cached_tokens for a live request (policy/policy.h's atc_route_request.cached_tokens): the leading
 * prefix blocks of the request that the endpoint's KV-cache events say it holds (fleet/kv_index.h).
 *
 * For an endpoint with kv_events.tokenize on, when the /tokenize step before the decision (tokenize.h)
 * gave the request's keys (the engine's token ids chained as the engine chains them), those are looked
 * up, block_size tokens a block. Otherwise (tokenize off, a small prompt, the step slow or failing: the
 * guess) the keys are the request's prefix hashes from atc's feature scan (request/request_features.h,
 * ATC_PREFIX_BLOCK_BYTES of prompt text a block, about 64 tokens): what atc sim publishes without
 * --kv-events-hash (sim/sim_kv_publish.h). */

#include <stdint.h>

#include "fleet/endpoint.h"
#include "fleet/kv_events.h"
#include "proxy/tokenize.h"
#include "request/request_features.h"

struct atc_kv_route {
    const struct atc_kv_events *kv; /* borrowed; NULL: no endpoint publishes */
    const struct atc_features *f;   /* borrowed: the request's features */
    const struct atc_tokenize *tk;  /* borrowed: its /tokenize step once over; NULL: none (the guess) */
};

/** Fills @p k with @p kv and @p f (both borrowed) and returns it: atc_route_request.cached_ctx. */
void *atc_kv_route_init(struct atc_kv_route *k, const struct atc_kv_events *kv, const struct atc_features *f);

/** The callback for atc_route_request.cached_tokens, @p ctx a struct atc_kv_route: the prompt tokens
 * of the request @p ep holds on its GPU, at most the prompt; -1 when @p ep publishes no events. Any
 * thread (the index is read without locks). */
int64_t atc_kv_route_cached(void *ctx, const struct atc_endpoint *ep);

#endif
