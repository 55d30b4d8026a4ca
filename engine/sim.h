#ifndef ATC_SIM_H
#define ATC_SIM_H

/* The simulated inference server's model: continuous batching, prefill/decode timing and a prefix KV
 * cache, with no I/O. Time is passed in by the caller (microseconds), so the same model runs behind
 * real sockets (sim_server.c, wall-clock timers) and in virtual-time replay. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Knobs, the same names on the command line (--max-seqs) and in YAML under simulate: (max_seqs). */
struct atc_sim_params {
    char *model;           /* model name served; owned (strdup'd), freed by atc_sim_params_dispose */
    unsigned max_seqs;     /* sequences decoded at once; more wait in the queue (default 64) */
    double prefill_tps;    /* prompt tokens per second of prefill (default 15000) */
    double decode_ms;      /* ms per output token at batch size 1 (default 12) */
    unsigned kv_blocks;    /* KV cache room in prefix blocks (default 25000 blocks of 16 tokens = 400k tokens) */
    double error_rate;     /* share of requests answered 500 (default 0) */
    double hang_rate;      /* share of requests accepted and never answered (default 0) */
    uint64_t not_ready_for_ms; /* not ready for the first N ms: /health 503, /v1/models empty (default 0) */
    unsigned die_after;    /* die after this many requests, 0 = never; see sim_server.c */
    uint64_t seed;         /* deterministic draws (default 1) */
};

/** Fills @p p with the defaults above; p->model = strdup("llama-3-8b"). */
void atc_sim_params_init(struct atc_sim_params *p);
/** Frees what @p p owns. */
void atc_sim_params_dispose(struct atc_sim_params *p);

#endif
