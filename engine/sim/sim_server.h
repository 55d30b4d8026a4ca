#ifndef ATC_SIM_SERVER_H
#define ATC_SIM_SERVER_H

/* A simulated OpenAI-compatible inference server: the model of sim.h behind atc's HTTP server, on wall-clock
 * timers. Used by `atc sim`, by `simulate:` in atc's config (in-process, on atc's own loop) and by
 * tests. It answers like vLLM:
 *
 *   POST /v1/chat/completions, /v1/completions   streaming (SSE) or not; one deterministic word per token
 *   POST /v1/embeddings                          a small deterministic vector, at once
 *   GET  /v1/models                              {"object":"list","data":[{"id":model,...}]}
 *   GET  /health                                 200 when ready, 503 before
 *   GET  /metrics                                vllm:num_requests_running, vllm:num_requests_waiting,
 *                                                vllm:kv_cache_usage_perc, vllm:prefix_cache_queries_total,
 *                                                vllm:prefix_cache_hits_total, vllm:num_preemptions_total,
 *                                                vllm:generation_tokens_total {model_name="..."}
 *
 * Errors carry OpenAI's body {"error":{"message","type","param","code"}}: 400 for a malformed request,
 * 404 for another model's name, 500 (error_rate), 503 while not ready (not_ready_for_ms).
 * Faults (struct atc_sim_params): error_rate and hang_rate are drawn per inference request from the
 * seed; die_after N: the N+1th inference request is cut (a stream after about half its tokens, any
 * other left unanswered), then the listener and every connection are closed for good.
 * A client that goes away cancels its sequence in the model, also while it waits for the first byte.
 * The process must ignore SIGPIPE (atc_sim_main does), as for any server writing to sockets. */

#include <stdint.h>

#include "sim/sim.h"

struct event_base;
struct atc_sim_server;

/** Starts a server on @p base listening on @p host : @p port (0 = a free port, see
 * atc_sim_server_port). @p p is copied (the model name too). Returns the server, or NULL with *err a
 * static reason. Never calls back. */
struct atc_sim_server *atc_sim_server_start(struct event_base *base, const struct atc_sim_params *p,
                                            const char *host, uint16_t port, const char **err);

/** The port it listens on (still answers after it died). */
uint16_t atc_sim_server_port(const struct atc_sim_server *s);

/** @p on_death(@p arg) is called from the loop once the server has died (die_after), after it closed
 * its listener and connections. The server must still be stopped with atc_sim_server_stop, which
 * on_death itself may do. */
void atc_sim_server_set_on_death(struct atc_sim_server *s, void (*on_death)(void *arg), void *arg);

/** Closes the listener and every connection, drops the requests in flight without answering them and
 * frees the server. NULL is fine. Not from within a request handled by this server. */
void atc_sim_server_stop(struct atc_sim_server *s);

#endif
