#ifndef ATC_SIM_PARAMS_H
#define ATC_SIM_PARAMS_H

/* The simulated server's knobs and their defaults (sim.h says what each does and where the default
 * numbers come from). Apart from sim.h so that the config (config/config.h) can hold simulate: entries
 * without the simulator's interface. */

#include <stdint.h>

#define ATC_SIM_KV_BLOCK_TOKENS 16 /* tokens per KV block, as vLLM's default block size */
#define ATC_SIM_DEFAULT_KV_BLOCKS 25000
#define ATC_SIM_DEFAULT_BATCHED_TOKENS 8192 /* max_batched_tokens: vLLM V1's default */
/* max_seqs: vLLM's max_num_seqs for its OpenAI server on a GPU of 70 GiB or more that is not an A100
 * (H100, MI300x): vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults (256 on smaller GPUs). */
#define ATC_SIM_DEFAULT_MAX_SEQS 1024
/* max_concurrent of a TGI sim: text-generation-inference's --max-concurrent-requests default
 * (launcher/src/main.rs, router/src/main.rs), past which its router answers 429 "Model is overloaded". */
#define ATC_SIM_TGI_MAX_CONCURRENT 128
/* max_model_len: Llama 3.1 8B's context, 128k tokens. */
#define ATC_SIM_DEFAULT_MAX_MODEL_LEN 131072

/* Which engine's HTTP face the simulated server wears (sim_server.h says what differs). The model of
 * sim.h is the same for all. */
enum atc_sim_engine {
    ATC_SIM_VLLM = 0, /* the default */
    ATC_SIM_SGLANG,
    ATC_SIM_LLAMACPP,
    ATC_SIM_TGI,
};
/* Their names, as --engine and simulate: engine: take them, indexed by enum atc_sim_engine; NULL-ended. */
extern const char *const atc_sim_engine_names[];

/* Knobs, the same names on the command line (--max-seqs) and in YAML under simulate: (max_seqs).
 * For the fields after `seed`, 0 means "the default", so atc_sim_params_init need not know them. */
struct atc_sim_params {
    char *model;        /* model name served; owned (strdup'd), freed by atc_sim_params_dispose */
    unsigned max_seqs;  /* sequences decoded at once; more wait in the queue (default 1024) */
    double prefill_tps; /* prompt tokens per second of prefill (default 15000) */
    double decode_ms;   /* ms per output token at batch size 1 (default 12) */
    unsigned kv_blocks; /* KV cache room in 16-token blocks (default 25000 = 400k tokens) */
    double error_rate;  /* share of requests answered 500 (default 0) */
    double hang_rate;   /* share of requests accepted and never answered (default 0) */
    uint64_t
        not_ready_for_ms; /* loading for the first N ms, as the engine shows it (sim_server.h) (default 0) */
    unsigned die_after;   /* die after this many requests, 0 = never; see sim_server.c */
    uint64_t seed;        /* deterministic draws (default 1) */

    /* The HTTP face; 0 / NULL = the default. */
    unsigned engine;         /* enum atc_sim_engine (vLLM) */
    char *api_key;           /* --api-key: requests without "Authorization: Bearer KEY" get 401 on the paths
                                the engine protects; owned, freed by atc_sim_params_dispose (none) */
    char *kv_events;         /* --kv-events / simulate: kv_events: where it publishes its KV-cache events
                                (vLLM's ZMQ wire format, sim_kv_events.h; the replay feeds the exact index
                                directly); owned, freed by atc_sim_params_dispose (none) */
    char *kv_events_replay;  /* --kv-events-replay: its replay (ROUTER) socket; owned, likewise (none) */
    uint64_t kv_events_drop; /* --kv-events-drop N: batch N is left out of the live socket, kept for
                                replays (a sequence gap on purpose, for tests); 0 = none */
    char *kv_events_hash;    /* --kv-events-hash: publish keys chained from /tokenize's token ids with this
                                hash (sim_tokenize.h) instead of the prompt-text stand-in; owned (NULL) */
    uint64_t tokenize_delay_ms; /* --tokenize-delay-ms: /tokenize answers this late (0: at once) */
    unsigned max_concurrent; /* requests held (queued or running) past which a new one gets 429, as TGI's
                                router (0 = ATC_SIM_TGI_MAX_CONCURRENT for TGI, no limit for the others) */

    /* Finer model knobs; 0 = default. */
    double decode_batch_factor;  /* decode step at batch >= decode_batch_sat, in decode_ms (2.2) */
    unsigned decode_batch_sat;   /* batch size where the decode step stops growing (64) */
    unsigned max_batched_tokens; /* tokens per iteration, prefill is chunked to fit (8192, as vLLM) */
    unsigned output_min;         /* output length drawn when a request has no max_tokens ... (16) */
    unsigned output_max;         /* ... up to this many tokens (512) */
    unsigned max_model_len;      /* a prompt plus max_tokens past this is refused, as vLLM does (131072) */

    /* Prefill/decode disaggregation (sim/sim_disagg.c); 0 = default. */
    unsigned role;             /* an enum atc_role (config/roles.h): both (default), prefill, decode */
    double kv_bytes_per_token; /* KV bytes a decode server reads per prompt token (131072: Llama-3-8B) */
    double transfer_gbps;      /* the KV transfer's bandwidth, GB/s (25: one 200 Gb/s RDMA NIC) */
};

/** Fills @p p with the defaults (sim.h); p->model = strdup("llama-3-8b"), no api_key. */
void atc_sim_params_init(struct atc_sim_params *p);
/** The KV cache of a server of @p p, in tokens (kv_blocks, or its default, x ATC_SIM_KV_BLOCK_TOKENS). */
uint64_t atc_sim_params_kv_tokens(const struct atc_sim_params *p);
/** The engine named @p name (atc_sim_engine_names), or -1. */
int atc_sim_engine_parse(const char *name);
/** Frees what @p p owns (model, api_key, kv_events, kv_events_replay). */
void atc_sim_params_dispose(struct atc_sim_params *p);

#endif
