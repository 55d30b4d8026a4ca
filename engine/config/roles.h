#ifndef ATC_ROLES_H
#define ATC_ROLES_H

/* Prefill/decode disaggregation in the settings: an endpoint's role: and a model's disaggregation:, and
 * the check that a disaggregated model has a server for each stage. Apart from config.c, which holds the
 * YAML walk, so that the simulator and the relay read the names without it. The check that a
 * disaggregated model has a server for each stage is atc_roles_missing (config.h). */

/* role: of an endpoint (or of a simulate: entry's servers, or of `atc sim --role`). */
enum atc_role {
    ATC_ROLE_BOTH = 0, /* the default: prefills and decodes its own requests (a colocated server) */
    ATC_ROLE_PREFILL,  /* computes a prompt's KV and hands it to a decode server */
    ATC_ROLE_DECODE,   /* receives the KV from a prefill server and generates */
};
/* "both", "prefill", "decode", indexed by enum atc_role; NULL-ended. */
extern const char *const atc_role_names[];

/* disaggregation: of a model: how atc runs its two-stage request (proxy/disagg.c says what is sent). */
enum atc_disaggregation {
    ATC_DISAGG_NONE = 0, /* the default: one server answers the whole request */
    ATC_DISAGG_VLLM,   /* vLLM's NixlConnector: prefill first (max_tokens 1), its kv_transfer_params to decode
                        */
    ATC_DISAGG_SGLANG, /* SGLang's bootstrap room: the same body to both servers at once */
};
/* "none", "vllm", "sglang", indexed by enum atc_disaggregation; NULL-ended. */
extern const char *const atc_disagg_names[];

/* SGLang's --disaggregation-bootstrap-port default (python/sglang/srt/server_args.py): a prefill endpoint's
 * bootstrap_port: when the file does not set one. */
#define ATC_SGLANG_BOOTSTRAP_PORT 8998

/** Whether an endpoint of role @p role may take stage @p stage (ATC_ROLE_PREFILL or ATC_ROLE_DECODE) of a
 * request of a model with disaggregation @p disagg; in a model that is not disaggregated every endpoint
 * takes whole requests (stage ATC_ROLE_BOTH). */
static inline int atc_role_serves(unsigned role, unsigned disagg, unsigned stage)
{
    if (disagg == ATC_DISAGG_NONE)
        return stage == ATC_ROLE_BOTH;
    return role == ATC_ROLE_BOTH || role == stage;
}

#endif
