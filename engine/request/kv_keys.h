#ifndef ATC_KV_KEYS_H
#define ATC_KV_KEYS_H

/* Block keys computed as the engines compute them, from a prompt's token ids, so that the exact index
 * (fleet/kv_index.h, fed by the engines' KV events) can be asked about a request before it is sent.
 *
 * vLLM (vllm/v1/core/kv_cache_utils.py, hash_block_tokens; vllm/utils/hashing.py): a prompt is cut
 * into full blocks of block_size tokens (a partial last block has no key); block i's digest is
 * hash_fn((parent, tuple(tokens of block i), extra_keys)) where parent is block i-1's whole digest
 * (bytes) and, for block 0, NONE_HASH = hash_fn(PYTHONHASHSEED as a Python str) (init_none_hash).
 * hash_fn is sha256_cbor (SHA-256 of cbor2.dumps(obj, canonical=True)) or xxhash_cbor (XXH3-128 of
 * the same bytes, xxhash.xxh3_128_digest: the canonical, big-endian form). The key an event carries
 * is int.from_bytes(digest, "big") & (2^64 - 1) (maybe_convert_block_hash): the digest's LAST 8
 * bytes, big-endian. extra_keys is None here (no LoRA, no multimodal input, no cache_salt): requests
 * with those get keys the engine does not, which only costs a miss.
 *
 * SGLang (python/sglang/srt/mem_cache/hicache_storage.py, get_hash_str / hash_str_to_int64): page i's
 * digest is SHA-256 over page i-1's digest (none for page 0) then each token as 4 bytes
 * little-endian; the key is the digest's FIRST 8 bytes, big-endian (published as a signed int64,
 * the same 64 bits). It has no seed.
 *
 * CBOR: the one value vLLM encodes per block is (bytes, (uint, ...), None) and the seed is a str;
 * canonical CBOR of those is a few fixed heads (RFC 8949 3.1: major type 4 array, 2 bytes, 0 uint,
 * 3 text, 0xf6 null, each with the shortest length form), so it is written here by hand rather than
 * linking a general CBOR library for four byte patterns.
 *
 * SHA-256 is nettle's (Debian's nettle-dev), XXH3-128 libxxhash's. Pure, any thread. */

#include <stddef.h>
#include <stdint.h>

/* How an engine chains block keys. config/config.h's kv_events.hash holds one of these. */
enum atc_kv_hash { ATC_KV_HASH_SHA256_CBOR, ATC_KV_HASH_XXHASH_CBOR, ATC_KV_HASH_SGLANG };

#define ATC_KV_DIGEST_MAX 32

struct atc_kv_keyer {
    enum atc_kv_hash hash;
    uint32_t block_size;
    uint8_t none_hash[ATC_KV_DIGEST_MAX]; /* vLLM's NONE_HASH for this seed (unused by sglang) */
    size_t digest_len;                    /* 32 (SHA-256) or 16 (XXH3-128) */
};

/** The hash named @p name ("sha256_cbor", "xxhash_cbor", "sglang") into *out. Returns 0, or -1. */
int atc_kv_hash_parse(const char *name, enum atc_kv_hash *out);

/** Prepares @p k for @p hash, @p block_size tokens a block (> 0) and the engine's PYTHONHASHSEED
 * @p seed (its decimal text, as the engine's environment holds it). Returns 0, or -1 for a bad
 * argument. */
int atc_kv_keyer_init(struct atc_kv_keyer *k, enum atc_kv_hash hash, uint32_t block_size, uint64_t seed);

/** The keys of the full blocks of @p tokens[0..n) into @p out (at most @p max, from the first block);
 * returns how many. Allocates nothing. */
size_t atc_kv_keys(const struct atc_kv_keyer *k, const uint32_t *tokens, size_t n, uint64_t *out, size_t max);

/** The simulator's tokenizer (atc sim's /tokenize, and what it counts as prompt tokens): one token per
 * 4 bytes of @p text (a last partial group is a token too), each the XXH3 of those bytes folded to 17
 * bits (a vocabulary of 131072, like Llama-3's 128256). Writes at most @p max into @p out; returns how
 * many tokens @p text has (which may be more than @p max). */
size_t atc_kv_sim_tokenize(const char *text, size_t len, uint32_t *out, size_t max);

#endif
