/* ep:cached_tokens for a live request, from the exact index (kv_route.h). */
#include "proxy/kv_route.h"

int64_t atc_kv_route_cached(void *ctx, const struct atc_endpoint *ep)
{
    const struct atc_kv_route *k = ctx;
    int slot = k->kv != NULL ? atc_kv_events_slot(k->kv, ep->id) : -1;
    if (slot < 0)
        return -1;
    const struct atc_kv_tokenize *tok = atc_kv_events_tokenize(k->kv, (unsigned)slot);
    size_t nkeys;
    uint32_t block_tokens;
    const uint64_t *keys = tok != NULL ? atc_tokenize_keys(k->tk, &nkeys, &block_tokens) : NULL;
    if (keys != NULL && atc_tokenize_matches(k->tk, tok)) {
        size_t held = atc_kv_index_held_prefix(atc_kv_events_index(k->kv), (unsigned)slot, keys, nkeys,
                                               1u << ATC_KV_GPU);
        return (int64_t)held * block_tokens; /* full blocks of the engine's own tokens: within the prompt */
    }
    size_t held = atc_kv_index_held_prefix(atc_kv_events_index(k->kv), (unsigned)slot, k->f->blocks,
                                           k->f->nblocks, 1u << ATC_KV_GPU);
    uint64_t tokens = (uint64_t)held * ATC_PREFIX_BLOCK_TOKENS;
    return (int64_t)(tokens < k->f->prompt_tokens ? tokens : k->f->prompt_tokens);
}

void *atc_kv_route_init(struct atc_kv_route *k, const struct atc_kv_events *kv, const struct atc_features *f)
{
    *k = (struct atc_kv_route){.kv = kv, .f = f};
    return k;
}
