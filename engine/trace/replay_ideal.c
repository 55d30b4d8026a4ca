/* The ideal fleet (replay_ideal.h): the pooled LRU's hits (trace_lru.c), then one FIFO queue over the
 * lanes, a binary min-heap of the lanes by the moment each comes free. */

#include "trace/replay_ideal.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "sim/sim.h"
#include "trace/replay.h"
#include "trace/trace.h"
#include "trace/trace_lru.h"

struct lane_free {
    double at_ms; /* when the lane comes free, from the trace's start */
    size_t lane;
};

static bool earlier(const struct lane_free *a, const struct lane_free *b)
{
    return a->at_ms < b->at_ms || (a->at_ms == b->at_ms && a->lane < b->lane);
}

/* Restores the heap after its top's time moved later. */
static void sift_down(struct lane_free *h, size_t n)
{
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && earlier(&h[l], &h[m]))
            m = l;
        if (r < n && earlier(&h[r], &h[m]))
            m = r;
        if (m == i)
            return;
        struct lane_free x = h[i];
        h[i] = h[m];
        h[m] = x;
        i = m;
    }
}

int atc_replay_ideal_run(const struct atc_trace *t, size_t limit, const struct atc_replay_lane *lanes,
                         size_t nlanes, uint64_t kv_tokens, struct atc_replay_ideal *out)
{
    size_t n = limit > 0 && limit < t->n ? limit : t->n;
    memset(out, 0, sizeof(*out));
    uint32_t *hit = malloc((n ? n : 1) * sizeof(*hit));
    double *sorted = malloc((n ? n : 1) * sizeof(*sorted));
    struct lane_free *heap = malloc((nlanes ? nlanes : 1) * sizeof(*heap));
    out->ttft_ms = malloc((n ? n : 1) * sizeof(double));
    double rate = hit != NULL ? atc_trace_pooled_lru_hits(t, n, kv_tokens, hit) : -1;
    if (nlanes == 0 || sorted == NULL || heap == NULL || out->ttft_ms == NULL || rate < 0) {
        free(hit);
        free(sorted);
        free(heap);
        atc_replay_ideal_dispose(out);
        return -1;
    }
    /* All lanes free at the start: in index order, which is already a heap. */
    for (size_t k = 0; k < nlanes; k++)
        heap[k] = (struct lane_free){.at_ms = 0, .lane = k};
    for (size_t i = 0; i < n; i++) {
        const struct atc_trace_record *r = &t->records[i];
        uint64_t bt = r->block_tokens ? r->block_tokens : ATC_SIM_KV_BLOCK_TOKENS;
        uint64_t cached = (uint64_t)hit[i] * bt;
        /* as the simulated server: the last prompt token is always computed */
        uint64_t uncached = cached < r->prompt_tokens ? r->prompt_tokens - cached : 1;
        double arrival = (double)r->at_us / 1000.0;
        const struct atc_replay_lane *lane = &lanes[heap[0].lane];
        double start = heap[0].at_ms > arrival ? heap[0].at_ms : arrival;
        double prefill = (double)uncached * 1000.0 / lane->prefill_tps;
        heap[0].at_ms = start + prefill;
        sift_down(heap, nlanes);
        out->ttft_ms[i] = start - arrival + prefill + lane->first_token_ms;
    }
    memcpy(sorted, out->ttft_ms, n * sizeof(double));
    atc_replay_sort(sorted, n);
    out->requests = n;
    out->ttft_p50_ms = atc_replay_percentile(sorted, n, 50);
    out->ttft_p90_ms = atc_replay_percentile(sorted, n, 90);
    out->ttft_p99_ms = atc_replay_percentile(sorted, n, 99);
    out->cache_hit_rate = rate;
    free(hit);
    free(sorted);
    free(heap);
    return 0;
}

/* A server of @p p as a lane, with the simulated server's own reading of its knobs (sim.c: a prefill rate
 * not > 0 and a negative decode_ms are the defaults; a decode_ms of 0 is allowed). */
static struct atc_replay_lane lane_of(const struct atc_sim_params *p, const struct atc_sim_params *dflt)
{
    return (struct atc_replay_lane){
        .prefill_tps = p->prefill_tps > 0 ? p->prefill_tps : dflt->prefill_tps,
        .first_token_ms = p->decode_ms >= 0 ? p->decode_ms : dflt->decode_ms,
    };
}

int atc_replay_ideal_of_fleet(const struct atc_config *cfg, const struct atc_trace *t, size_t limit,
                              struct atc_replay_ideal *out)
{
    size_t nlanes = 0;
    for (size_t i = 0; i < cfg->nmodels; i++)
        nlanes += cfg->models[i].nendpoints;
    for (size_t i = 0; i < cfg->nsimulate; i++)
        nlanes += cfg->simulate[i].count;
    struct atc_replay_lane *lanes = malloc((nlanes ? nlanes : 1) * sizeof(*lanes));
    if (lanes == NULL)
        return -1;
    struct atc_sim_params dflt;
    atc_sim_params_init(&dflt);
    uint64_t kv = 0;
    size_t k = 0;
    /* in the replay's order: configured endpoints first, then the simulate: entries */
    for (size_t i = 0; i < cfg->nmodels; i++)
        for (size_t e = 0; e < cfg->models[i].nendpoints; e++) {
            lanes[k++] = lane_of(&dflt, &dflt);
            kv += atc_sim_params_kv_tokens(&dflt);
        }
    for (size_t i = 0; i < cfg->nsimulate; i++)
        for (unsigned c = 0; c < cfg->simulate[i].count; c++) {
            lanes[k++] = lane_of(&cfg->simulate[i].params, &dflt);
            kv += atc_sim_params_kv_tokens(&cfg->simulate[i].params);
        }
    atc_sim_params_dispose(&dflt);
    int rc = atc_replay_ideal_run(t, limit, lanes, nlanes, kv, out);
    free(lanes);
    return rc;
}

void atc_replay_ideal_dispose(struct atc_replay_ideal *ideal)
{
    free(ideal->ttft_ms);
    memset(ideal, 0, sizeof(*ideal));
}
