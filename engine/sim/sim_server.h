#ifndef ATC_SIM_SERVER_H
#define ATC_SIM_SERVER_H

/* A simulated OpenAI-compatible inference server: the model of sim.h behind atc's HTTP server, on wall-clock
 * timers. Used by `atc sim`, by `simulate:` in atc's config (in-process, on atc's own loop) and by
 * tests. The simulator stands in for vLLM; where the two differ, vLLM is right. Routes:
 *
 *   POST /v1/chat/completions, /v1/completions   streaming (SSE) or not; one deterministic word per token
 *   POST /v1/embeddings                          a small deterministic vector, at once
 *   GET  /v1/models                              {"object":"list","data":[{"id":model,...}]}
 *   GET  /health                                 200
 *   GET  /metrics                                the engine's load metrics
 *
 * vLLM (the default; vllm/entrypoints/openai/serving_chat.py, serving_completion.py, api_server.py,
 * server_utils.py, vllm/v1/metrics/loggers.py):
 *   - a stream's headers go out as the request is accepted; its first event (the chat's role chunk, then
 *     the first content chunk) once prefill is done; finish_reason on the last content chunk; a last
 *     chunk with "choices":[] and the usage only with stream_options.include_usage; then [DONE];
 *   - usage.prompt_tokens_details.cached_tokens: the prefix cache's hits as the request arrived (vLLM
 *     sends it only with --enable-prompt-tokens-details: the sim always does);
 *   - while loading (not_ready_for_ms) the port is bound but not listening: connections are refused;
 *   - errors {"error":{"message","type","param","code"}}: 400 malformed, 404 another model's name,
 *     500 error_rate; api_key: 401 {"error":"Unauthorized"} on paths under /v1, /v2 and /inference;
 *   - metrics vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc,
 *     vllm:prefix_cache_queries_total, vllm:prefix_cache_hits_total, vllm:num_preemptions_total,
 *     vllm:generation_tokens_total {engine="0",model_name="..."}, vllm:cache_config_info.
 * SGLang (python/sglang/srt/entrypoints/http_server.py, metrics/collector.py, utils.py): as vLLM but
 *   /health answers after about 1 s (it runs a one-token generation), errors {"object":"error",...},
 *   401 on every path but /health* and /metrics*, metrics sglang:num_running_reqs, sglang:num_queue_reqs,
 *   sglang:num_used_tokens, sglang:token_usage, sglang:max_total_num_tokens, sglang:cache_hit_rate,
 *   sglang:generation_tokens_total.
 * llama.cpp (tools/server/server.cpp, server-http.cpp): a stream's headers go with its first token;
 *   while loading every path answers 503 {"error":{"code":503,"message":"Loading model","type":
 *   "unavailable_error"}} but "/" (a 503 page) and /models, /v1/models, /api/tags (which name the model,
 *   "meta" null); errors {"error":{"code","message","type"}}; 401 "Invalid API Key" on all but /,
 *   /health, /v1/health, /models, /v1/models, /api/tags; metrics llamacpp:prompt_tokens_total,
 *   llamacpp:tokens_predicted_total, llamacpp:n_decode_total, llamacpp:requests_processing,
 *   llamacpp:requests_deferred (no KV metric: the current server has none).
 * TGI (router/src/server.rs, router/src/infer): errors {"error":"...","error_type":"..."}: 422
 *   validation, 424 generation (error_rate), 429 overloaded once max_concurrent requests are held
 *   (128, its --max-concurrent-requests); in a stream these are a 200 whose one event is the error;
 *   the request's model name is not checked; 401 without a body on its inference routes; refuses
 *   connections while loading; metrics tgi_queue_size, tgi_batch_current_size, tgi_request_count.
 *
 * Faults (struct atc_sim_params): error_rate and hang_rate are drawn per inference request from the
 * seed (a hanging request gets no byte, headers neither); die_after N: the N+1th inference request is
 * cut (a stream after about half its tokens, any other left unanswered), then the listener and every
 * connection are closed for good. max_concurrent (any engine): 429 once that many are held.
 * A client that goes away cancels its sequence in the model, also while it waits for the first byte.
 * The process must ignore SIGPIPE (atc_sim_main does), as for any server writing to sockets. */

#include <stdint.h>

#include "sim/sim.h"

struct event_base;
struct atc_sim_server;
struct atc_sim_kv_pub;

/** Starts a server on @p base bound to @p host : @p port (0 = a free port, see atc_sim_server_port),
 * listening at once or, for an engine that refuses connections while loading, after not_ready_for_ms. @p p is copied (the model name too). Returns the server, or NULL with *err a
 * static reason. Never calls back. */
struct atc_sim_server *atc_sim_server_start(struct event_base *base, const struct atc_sim_params *p,
                                            const char *host, uint16_t port, const char **err);

/** The port it listens on, or will once loaded (still answers after it died). */
uint16_t atc_sim_server_port(const struct atc_sim_server *s);
/** Its KV-cache events' publisher (sim/sim_kv_publish.h), or NULL without --kv-events. */
const struct atc_sim_kv_pub *atc_sim_server_kv_pub(const struct atc_sim_server *s);

/** @p on_death(@p arg) is called from the loop once the server has died (die_after), after it closed
 * its listener and connections. The server must still be stopped with atc_sim_server_stop, which
 * on_death itself may do. */
void atc_sim_server_set_on_death(struct atc_sim_server *s, void (*on_death)(void *arg), void *arg);

/** Closes the listener and every connection, drops the requests in flight without answering them and
 * frees the server. NULL is fine. Not from within a request handled by this server. */
void atc_sim_server_stop(struct atc_sim_server *s);

#endif
