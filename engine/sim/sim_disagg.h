#ifndef ATC_SIM_DISAGG_H
#define ATC_SIM_DISAGG_H

/* The simulated server's side of prefill/decode disaggregation (`atc sim --role prefill|decode`,
 * simulate: role:), for the protocol of its engine face:
 *
 * - vLLM (NixlConnector; vLLM's tests/v1/kv_connector/nixl_integration/toy_proxy_server.py is the proxy
 *   it answers). A prefill server takes only requests with kv_transfer_params.do_remote_decode true,
 *   stream false and max_tokens 1, and its answer carries a top-level kv_transfer_params (do_remote_prefill
 *   true, remote_engine_id, remote_request_id, remote_block_ids, remote_host, remote_port, tp_size), as
 *   NixlConnector's request_finished returns it. A decode server takes only requests whose
 *   kv_transfer_params has do_remote_prefill true and names a remote engine and its blocks.
 * - SGLang (--disaggregation-mode; sgl-model-gateway/src/routers/http/pd_router.rs is the router it
 *   answers): both servers take only requests with bootstrap_host, bootstrap_port and bootstrap_room
 *   (numbers, or arrays of them for a batch); the prefill server generates one token.
 *
 * A decode server waits for the KV's transfer before its sequence joins the model: kv_bytes_per_token x
 * prompt tokens / transfer_gbps. Both refuse what does not fit their role with a 400, so an answer through
 * atc proves what each server saw; GET /sim/disagg lists what the last requests carried (the tests read
 * it), and "aborted": the requests whose client left before the answer ended. Single-threaded: the server's
 * loop. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/sim_params.h"

struct atc_http_req;
struct evbuffer;
struct atc_sim_disagg;

/* The KV transfer's defaults (kv_bytes_per_token:, transfer_gbps:; --kv-bytes-per-token, --transfer-gbps).
 * Llama-3-8B's KV per token, from its config.json: 32 layers x 8 KV heads x 128 (4096 / 32 heads) x 2 (K
 * and V) x 2 bytes (bf16) = 131072 bytes. 25 GB/s: one 200 Gb/s RDMA NIC per GPU (ConnectX-7 at 200G, as
 * H100 nodes pair them), the link NIXL reads the blocks over. */
#define ATC_SIM_KV_BYTES_PER_TOKEN 131072.0
#define ATC_SIM_TRANSFER_GBPS 25.0

/** The KV transfer's time to a decode server of parameters @p p for a prompt of @p prompt_tokens:
 * kv_bytes_per_token x prompt_tokens / transfer_gbps (the defaults above for 0), in us. The replay uses
 * it too (trace/replay.c). */
uint64_t atc_sim_transfer_us(const struct atc_sim_params *p, uint32_t prompt_tokens);

/* What the check found in one request. */
struct atc_sim_disagg_req {
    uint64_t transfer_us; /* decode: the KV's transfer time, before the sequence may start */
    int64_t max_tokens;   /* what the model generates: the request's, 1 on an SGLang prefill server */
    bool compute_prompt;  /* false on a decode server: the prompt's KV arrives, it is not computed */
};

/** The state of one server of parameters @p p (borrowed: they outlive it); NULL when out of memory. */
struct atc_sim_disagg *atc_sim_disagg_create(const struct atc_sim_params *p);
void atc_sim_disagg_free(struct atc_sim_disagg *d);

/** Checks request @p body (@p len bytes; @p max_tokens and @p prompt_tokens as scanned) against the
 * server's role and records what it carried. Returns 0 and fills @p out, or -1 with a static message for
 * a 400 in *err. A server of role both takes anything (out: the request as it is). */
int atc_sim_disagg_check(struct atc_sim_disagg *d, const char *body, size_t len, int64_t max_tokens,
                         uint32_t prompt_tokens, bool stream, struct atc_sim_disagg_req *out,
                         const char **err);

/** Appends the fields a prefill server (vLLM) adds to a whole answer, starting with a comma: its
 * kv_transfer_params for the @p num-th request of @p prompt_tokens. Nothing for other roles. */
void atc_sim_disagg_answer(struct atc_sim_disagg *d, struct evbuffer *b, uint16_t port, uint64_t num,
                           uint32_t prompt_tokens);

/** Counts a request of a prefill or decode server whose client left before its answer ended (on_gone):
 * GET /sim/disagg's "aborted", so a test sees that the router cancelled the stage. */
void atc_sim_disagg_gone(struct atc_sim_disagg *d);

/** Answers GET /sim/disagg on @p req when @p path is it; false (nothing done) otherwise. */
bool atc_sim_disagg_route(struct atc_sim_disagg *d, struct atc_http_req *req, const char *path);

#endif
