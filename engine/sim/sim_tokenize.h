#ifndef ATC_SIM_TOKENIZE_H
#define ATC_SIM_TOKENIZE_H

/* atc sim's POST /tokenize, in vLLM's shape (vllm/entrypoints/openai/protocol.py: TokenizeChatRequest
 * {model, messages, add_generation_prompt} or TokenizeCompletionRequest {model, prompt} →
 * TokenizeResponse {"count", "max_model_len", "tokens"}), with the simulator's own deterministic
 * tokenizer (request/kv_keys.h, atc_kv_sim_tokenize) over the raw JSON of the messages or the prompt,
 * the bytes atc's feature scan reads (add_generation_prompt changes nothing: the sim has no template).
 *
 * With --kv-events-hash (sha256_cbor, xxhash_cbor, sglang) a request's blocks are also chained into
 * that hash's keys from those token ids (BLOCK_TOKENS a block, seed 0: 64 tokens are exactly one
 * 256-byte block of prompt text), which the KV publisher then sends in place of the text hashes
 * (sim_kv_publish.h), so that atc's tokenize path is tested end to end. --tokenize-delay-ms holds each
 * answer that long (a slow or hanging tokenizer, for tests of atc's budget).
 *
 * Everything runs on the loop given at creation. */

#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>

#include "http/http_server.h"
#include "request/request_features.h"

struct atc_sim_tokenizer;

/** A tokenizer chaining keys with @p hash (NULL: none) in blocks of @p block_tokens, answering after
 * @p delay_ms. NULL with a static message in *err (an unknown hash, out of memory). */
struct atc_sim_tokenizer *atc_sim_tokenizer_create(struct event_base *base, const char *hash,
                                                   uint32_t block_tokens, uint64_t delay_ms,
                                                   const char **err);
/** Frees it and the answers it still holds (their requests get nothing). NULL is fine. */
void atc_sim_tokenizer_destroy(struct atc_sim_tokenizer *t);

/** Answers POST /tokenize @p req (now, or after the delay). */
void atc_sim_tokenizer_handle(struct atc_sim_tokenizer *t, struct atc_http_req *req);

/** The keys of @p f's prompt blocks (at most @p max) into @p out; returns how many (0 without a hash). */
size_t atc_sim_tokenizer_keys(const struct atc_sim_tokenizer *t, const struct atc_features *f, uint64_t *out,
                              size_t max);

#endif
