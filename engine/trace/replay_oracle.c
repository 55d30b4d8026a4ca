/* The oracle router (replay_oracle.h): each available endpoint's simulated server asked directly. */

#include "trace/replay_oracle.h"

#include "config/roles.h"
#include "fleet/endpoint.h"
#include "sim/sim.h"
#include "trace/trace.h"

struct atc_endpoint *atc_replay_oracle_pick(const struct atc_model *m, const struct atc_trace_record *r,
                                            uint64_t tokens, uint64_t now_us, unsigned stage,
                                            struct atc_sim *(*sim_of)(void *ctx, const struct atc_endpoint *ep),
                                            void *ctx)
{
    struct atc_endpoint *best = NULL;
    double best_ms = 0;
    struct atc_sim_stats best_st = {0};
    uint64_t bt = r->block_tokens ? r->block_tokens : ATC_SIM_KV_BLOCK_TOKENS;
    for (size_t k = 0; k < m->nendpoints; k++) {
        struct atc_endpoint *ep = m->endpoints[k];
        if (!atc_role_serves(ep->role, m->disaggregation, stage) || !atc_endpoint_available(ep, tokens))
            continue;
        const struct atc_sim *sim = sim_of(ctx, ep);
        uint64_t cached = (uint64_t)atc_sim_prefix_cached(sim, r->blocks, r->nblocks) * bt;
        uint64_t uncached = cached < r->prompt_tokens ? r->prompt_tokens - cached : 1;
        double ms = atc_sim_backlog_ms(sim, now_us) + 2 * atc_sim_prefill_ms(sim, uncached);
        struct atc_sim_stats st;
        atc_sim_stats(sim, &st);
        /* ties (idle servers, a prompt nobody holds): the smaller decode batch, then the emptier cache */
        if (best == NULL || ms < best_ms ||
            (ms == best_ms && (st.running < best_st.running ||
                               (st.running == best_st.running && st.kv_cached < best_st.kv_cached)))) {
            best = ep;
            best_ms = ms;
            best_st = st;
        }
    }
    return best;
}
