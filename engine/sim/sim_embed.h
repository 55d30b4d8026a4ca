#ifndef ATC_SIM_EMBED_H
#define ATC_SIM_EMBED_H

/* atc sim's /v1/embeddings answer: vLLM's shape, one small vector per input (vllm/entrypoints/openai/
 * serving_embedding.py _build_response: an item per prompt, index in order), drawn from the input's text
 * so that equal inputs get equal vectors. */

#include <stddef.h>
#include <stdint.h>

struct evbuffer;

/** Appends the answer to the embeddings request @p body (@p len bytes, already scanned as a request) to
 * @p out: one embedding per input ("input" a string or one token list: one; a list of strings or of
 * token lists: one each, in order), as float lists or, with encoding_format "base64", base64 of
 * little-endian float32s; @p model and @p prompt_tokens go in its model and usage. Returns 0, or -1 with
 * a message for a 400 in *err (nothing appended). */
int atc_sim_embeddings(struct evbuffer *out, uint64_t seed, const char *model, const char *body, size_t len,
                       unsigned prompt_tokens, const char **err);

#endif
