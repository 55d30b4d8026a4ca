/* The names of role: and disaggregation: (roles.h). */

#include "config/roles.h"

#include <stddef.h>

const char *const atc_role_names[] = {
    [ATC_ROLE_BOTH] = "both",
    [ATC_ROLE_PREFILL] = "prefill",
    [ATC_ROLE_DECODE] = "decode",
    NULL,
};

const char *const atc_disagg_names[] = {
    [ATC_DISAGG_NONE] = "none",
    [ATC_DISAGG_VLLM] = "vllm",
    [ATC_DISAGG_SGLANG] = "sglang",
    NULL,
};
