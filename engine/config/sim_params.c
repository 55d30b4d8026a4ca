/* Defaults of the simulated server's knobs (sim_params.h). Kept apart from sim.c so the config parser can
 * build simulate: entries without pulling in the simulator itself. */

#include "config/sim_params.h"

#include <stdlib.h>
#include <string.h>

const char *const atc_sim_engine_names[] = {
    [ATC_SIM_VLLM] = "vllm",
    [ATC_SIM_SGLANG] = "sglang",
    [ATC_SIM_LLAMACPP] = "llamacpp",
    [ATC_SIM_TGI] = "tgi",
    NULL,
};

int atc_sim_engine_parse(const char *name)
{
    for (int i = 0; atc_sim_engine_names[i]; i++)
        if (strcmp(name, atc_sim_engine_names[i]) == 0)
            return i;
    return -1;
}

void atc_sim_params_init(struct atc_sim_params *p)
{
    /* One Llama-3-8B-class model on one H100 under vLLM: sim.h, "Defaults, and why", says where each
     * number comes from. */
    *p = (struct atc_sim_params){
        .model = strdup("llama-3-8b"),
        .max_seqs = ATC_SIM_DEFAULT_MAX_SEQS,
        .prefill_tps = 15000,
        .decode_ms = 12,
        .kv_blocks = ATC_SIM_DEFAULT_KV_BLOCKS,
        .error_rate = 0,
        .hang_rate = 0,
        .not_ready_for_ms = 0,
        .die_after = 0,
        .seed = 1,
    };
}

uint64_t atc_sim_params_kv_tokens(const struct atc_sim_params *p)
{
    return (uint64_t)(p->kv_blocks > 0 ? p->kv_blocks : ATC_SIM_DEFAULT_KV_BLOCKS) * ATC_SIM_KV_BLOCK_TOKENS;
}

void atc_sim_params_dispose(struct atc_sim_params *p)
{
    free(p->model);
    p->model = NULL;
    free(p->api_key);
    p->api_key = NULL;
    free(p->kv_events);
    p->kv_events = NULL;
    free(p->kv_events_replay);
    p->kv_events_replay = NULL;
    free(p->kv_events_hash);
    p->kv_events_hash = NULL;
}
