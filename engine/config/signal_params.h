#ifndef ATC_SIGNAL_PARAMS_H
#define ATC_SIGNAL_PARAMS_H

/* The routing signals' settings (config `signals:`), apart from fleet/signals.h so that the config
 * can hold them without including the fleet. */

#include <stdint.h>

/* Priors and time constants; every endpoint of a table shares them (config `signals:`). The defaults
 * are the simulated server's (sim.h): one Llama-3-8B-class model on one H100 under vLLM. */
struct atc_signal_params {
    double prefill_tps; /* signals.prefill_rate: prior prompt tokens/s until samples exist (15000) */
    uint64_t itl_us;    /* signals.itl: prior time per output token (12ms) */
    uint64_t recent_half_life_ms; /* signals.recent_half_life: of recent_tokens (2s) */
};

/** Fills @p p with the defaults (config_defaults.c). */
void atc_signal_params_init(struct atc_signal_params *p);

#endif
