#ifndef ATC_REQUEST_FEATURES_H
#define ATC_REQUEST_FEATURES_H

/* Request features: a zero-copy JSON scan (jsmn) of an OpenAI request body into what routing needs.
 * Spans point into the body. The only allocation is a per-thread token array, reused across requests
 * and grown when a body needs more tokens (see atc_features_release). */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ATC_FEATURES_NAME_MAX 256  /* model / user are copied (unescaped) up to this length */
#define ATC_PREFIX_BLOCK_BYTES 256 /* bytes of prompt per prefix block (about 64 tokens) */
#define ATC_PREFIX_BLOCKS_MAX 512  /* blocks hashed per request: the first 128 KiB of prompt */
#define ATC_FEATURES_DEPTH_MAX 64  /* deeper JSON nesting is refused (a hostile-input guard) */
#define ATC_PREFIX_BLOCK_TOKENS (ATC_PREFIX_BLOCK_BYTES / 4) /* the prompt-token estimate is 4 bytes a token */

/* Output tokens a request that sets no max_tokens is counted for (endpoint token counters, tenants'
 * budgets, policies' req.tokens), in serving, replay and t.route alike. */
#define ATC_DEFAULT_OUTPUT_TOKENS 256

enum atc_request_kind { ATC_KIND_CHAT, ATC_KIND_COMPLETION, ATC_KIND_EMBEDDING };

/** "chat", "completion" or "embedding": the one spelling of a kind (traces, the policy's req.kind). */
const char *atc_request_kind_name(enum atc_request_kind kind);

/** Sets *@p kind from its name (@p len bytes, not NUL-terminated); returns 0, or -1 when @p s names none. */
int atc_request_kind_parse(const char *s, size_t len, enum atc_request_kind *kind);

/* The most choices ("n") a request counts for: far above any sampling use, and a bound on the product
 * below. */
#define ATC_FEATURES_CHOICES_MAX 4096

/** The tokens a request may hold on a server: its prompt-token estimate plus @p max_tokens, or plus
 * ATC_DEFAULT_OUTPUT_TOKENS when it sets none (@p max_tokens < 0), for each of its @p choices (n: the
 * engine runs one sequence per choice, the prompt's blocks shared). */
static inline uint64_t atc_request_tokens(uint32_t prompt_tokens, int64_t max_tokens, uint32_t choices)
{
    return prompt_tokens +
           (uint64_t)choices * (uint64_t)(max_tokens >= 0 ? max_tokens : ATC_DEFAULT_OUTPUT_TOKENS);
}

/** Tokens per prefix block: @p block_tokens (a trace's or an engine's), or ATC_PREFIX_BLOCK_TOKENS
 * when it is 0 (live requests hash prompt text). */
static inline uint32_t atc_block_tokens(uint32_t block_tokens)
{
    return block_tokens ? block_tokens : ATC_PREFIX_BLOCK_TOKENS;
}

struct atc_features {
    char model[ATC_FEATURES_NAME_MAX]; /* unescaped; "" if absent */
    bool has_model;
    size_t model_start, model_end;    /* the model string's characters in the body (between the quotes) */
    bool stream;                      /* "stream": true */
    bool has_tools;                   /* a non-empty "tools" array: the request may call functions */
    int64_t max_tokens;               /* max_tokens or max_completion_tokens; -1 if absent */
    uint32_t choices;                 /* "n", 1 if absent, at most ATC_FEATURES_CHOICES_MAX */
    char user[ATC_FEATURES_NAME_MAX]; /* the body's "user", unescaped; "" if absent */
    const char *prompt;               /* raw JSON bytes of "messages" (chat) / "prompt" / "input" */
    size_t prompt_len;
    uint32_t prompt_tokens;                 /* estimate: about 4 bytes of text per token */
    size_t nblocks;                         /* full blocks only */
    /* last: a holder may cut the struct after blocks[nblocks] (relay.c does, for a stream) */
    uint64_t blocks[ATC_PREFIX_BLOCKS_MAX]; /* chained XXH3: blocks[k] covers prompt bytes 0..(k+1)*BLOCK */
};

/** Scans @p body (@p len bytes, not NUL-terminated) of a request of @p kind. The body must be exactly
 * one JSON object (strict RFC 8259 syntax, at most ATC_FEATURES_DEPTH_MAX deep); only its top-level
 * keys are read; a repeated key counts by its last value; a null value counts as absent.
 * Returns 0, or -1 with *err a static message fit for a 400 answer ("invalid JSON body", "'messages'
 * must be an array", ...); on error the contents of @p f are unspecified. A missing model is not an
 * error here (has_model = false): the caller decides. An over-long "user" is cut at a character
 * boundary; an over-long "model" is an error. @p f->prompt borrows from @p body. */
int atc_features_scan(enum atc_request_kind kind, const char *body, size_t len, struct atc_features *f,
                      const char **err);

/** Chained prefix hashes of @p len bytes: fills up to @p max hashes, returns how many (full blocks). */
size_t atc_prefix_hash(const char *data, size_t len, uint64_t *out, size_t max);

/** Frees the calling thread's token array (a worker calls it as it exits); the next scan on this
 * thread allocates a new one. */
void atc_features_release(void);

#endif
