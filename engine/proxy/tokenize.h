#ifndef ATC_TOKENIZE_H
#define ATC_TOKENIZE_H

/* The /tokenize step before a decision (issue 29, part 3): for a model whose endpoints have
 * kv_events.tokenize on, the request's token ids come from the engine, are chained into block keys as
 * the engine chains them (request/kv_keys.h, with that endpoint's hash, block_size and seed), and
 * ep:cached_tokens answers from those keys (proxy/kv_route.h).
 *
 * One endpoint of the model is asked (the first routable one with tokenize on: a model's servers share
 * its tokenizer), with vLLM's POST /tokenize (vllm/entrypoints/openai/protocol.py,
 * TokenizeChatRequest: model, messages, add_generation_prompt (true, as a chat completion renders it);
 * TokenizeCompletionRequest: model, prompt; TokenizeResponse: {"count", "max_model_len", "tokens"}),
 * the messages or prompt passed on byte for byte. It is not asked, and the decision runs at once on
 * atc's guess (the prompt-text keys), for a prompt below kv_events.tokenize_min_bytes, a request with
 * tools (the engine's template renders them; atc does not send them), a completion whose prompt is not
 * one string, or a model without such an endpoint. Past kv_events.tokenize_timeout, or on any failure,
 * the decision guesses too. A repeat of a request takes its keys from the shared cache
 * (fleet/kv_token_cache.h) without asking. Counted in /metrics (atc_kv_tokenize_*).
 *
 * Runs on the worker's thread. */

#include <stddef.h>
#include <stdint.h>

#include "fleet/kv_events.h"
#include "proxy/worker.h"
#include "request/request_features.h"

struct atc_tokenize;

/** Starts the step for the request @p f (borrowed until the step is freed: f->prompt is sent) of
 * @p kind on worker @p w. Returns 1 when a call is in flight: @p done(@p arg) is called once on this
 * thread, later (answered, failed or past its budget). Returns 0 when the result is known now (no
 * call: @p done is never called). In both cases *out is the step (NULL when there is nothing to
 * free), which atc_tokenize_keys reads and atc_tokenize_free frees. */
int atc_tokenize_start(struct atc_tokenize **out, struct atc_worker *w, const struct atc_features *f,
                       enum atc_request_kind kind, void (*done)(void *arg), void *arg);

/** The request's block keys (borrowed from @p t) and how many, each block @p *block_tokens tokens;
 * NULL when there are none (no step, a call in flight or failed: the guess). */
const uint64_t *atc_tokenize_keys(const struct atc_tokenize *t, size_t *n, uint32_t *block_tokens);

/** Whether endpoint slot @p slot's keys are chained like the step's (an endpoint of the model with
 * the same tokenize settings), so that its entries can be asked about them. */
int atc_tokenize_matches(const struct atc_tokenize *t, const struct atc_kv_tokenize *s);

/** Cancels a call in flight (no callback after this). NULL is fine. */
void atc_tokenize_cancel(struct atc_tokenize *t);
/** Cancels and frees. NULL is fine. */
void atc_tokenize_free(struct atc_tokenize *t);

#endif
