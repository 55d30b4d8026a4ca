/* Block keys as the engines compute them (kv_keys.h). */

#include "request/kv_keys.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <nettle/sha2.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

int atc_kv_hash_parse(const char *name, enum atc_kv_hash *out)
{
    static const char *const names[] = {"sha256_cbor", "xxhash_cbor", "sglang"};
    for (unsigned i = 0; i < sizeof names / sizeof names[0]; i++)
        if (name != NULL && strcmp(name, names[i]) == 0) {
            *out = (enum atc_kv_hash)i;
            return 0;
        }
    return -1;
}

/* ---- canonical CBOR, the few shapes vLLM hashes ---- */

/* A head: major type @p major with argument @p v in its shortest form (RFC 8949 4.2.1). */
static size_t cbor_head(uint8_t *p, unsigned major, uint64_t v)
{
    uint8_t m = (uint8_t)(major << 5);
    if (v < 24) {
        p[0] = m | (uint8_t)v;
        return 1;
    }
    unsigned bytes = v <= 0xff ? 1 : v <= 0xffff ? 2 : v <= 0xffffffffu ? 4 : 8;
    p[0] = m | (uint8_t)(bytes == 1 ? 24 : bytes == 2 ? 25 : bytes == 4 ? 26 : 27);
    for (unsigned i = 0; i < bytes; i++)
        p[1 + i] = (uint8_t)(v >> (8 * (bytes - 1 - i)));
    return 1 + bytes;
}

/* The hasher behind sha256_cbor and xxhash_cbor: fed the CBOR bytes in pieces. */
struct cbor_hasher {
    enum atc_kv_hash hash;
    struct sha256_ctx sha;
    XXH3_state_t xx;
};

static void ch_begin(struct cbor_hasher *h, enum atc_kv_hash hash)
{
    h->hash = hash;
    if (hash == ATC_KV_HASH_XXHASH_CBOR)
        XXH3_128bits_reset(&h->xx);
    else
        sha256_init(&h->sha);
}

static void ch_update(struct cbor_hasher *h, const uint8_t *p, size_t n)
{
    if (h->hash == ATC_KV_HASH_XXHASH_CBOR)
        XXH3_128bits_update(&h->xx, p, n);
    else
        sha256_update(&h->sha, n, p);
}

/* Writes the digest (32 or 16 bytes) to @p out; returns its length. */
static size_t ch_end(struct cbor_hasher *h, uint8_t *out)
{
    if (h->hash == ATC_KV_HASH_XXHASH_CBOR) {
        XXH128_canonical_t c;
        XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&h->xx));
        memcpy(out, c.digest, 16);
        return 16;
    }
    sha256_digest(&h->sha, SHA256_DIGEST_SIZE, out);
    return SHA256_DIGEST_SIZE;
}

int atc_kv_keyer_init(struct atc_kv_keyer *k, enum atc_kv_hash hash, uint32_t block_size, uint64_t seed)
{
    if (block_size == 0 || (unsigned)hash > ATC_KV_HASH_SGLANG)
        return -1;
    memset(k, 0, sizeof *k);
    k->hash = hash;
    k->block_size = block_size;
    k->digest_len = hash == ATC_KV_HASH_XXHASH_CBOR ? 16 : 32;
    if (hash == ATC_KV_HASH_SGLANG)
        return 0;
    /* NONE_HASH = hash_fn(str(seed)): CBOR text string (major type 3). */
    char text[24];
    int n = snprintf(text, sizeof text, "%llu", (unsigned long long)seed);
    uint8_t head[9];
    struct cbor_hasher h;
    ch_begin(&h, hash);
    ch_update(&h, head, cbor_head(head, 3, (uint64_t)n));
    ch_update(&h, (const uint8_t *)text, (size_t)n);
    ch_end(&h, k->none_hash);
    return 0;
}

static uint64_t be64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

size_t atc_kv_keys(const struct atc_kv_keyer *k, const uint32_t *tokens, size_t n, uint64_t *out, size_t max)
{
    size_t nblocks = n / k->block_size;
    if (nblocks > max)
        nblocks = max;
    uint8_t parent[ATC_KV_DIGEST_MAX];
    size_t plen = k->digest_len;
    memcpy(parent, k->none_hash, sizeof parent);
    for (size_t b = 0; b < nblocks; b++) {
        const uint32_t *t = tokens + b * k->block_size;
        if (k->hash == ATC_KV_HASH_SGLANG) {
            struct sha256_ctx sha;
            sha256_init(&sha);
            if (b > 0)
                sha256_update(&sha, SHA256_DIGEST_SIZE, parent);
            for (uint32_t i = 0; i < k->block_size; i++) {
                uint8_t le[4] = {(uint8_t)t[i], (uint8_t)(t[i] >> 8), (uint8_t)(t[i] >> 16),
                                 (uint8_t)(t[i] >> 24)};
                sha256_update(&sha, 4, le);
            }
            sha256_digest(&sha, SHA256_DIGEST_SIZE, parent);
            out[b] = be64(parent); /* the first 8 bytes */
            continue;
        }
        /* (parent: bytes, tokens: tuple of uint, None), gathered in @p buf and hashed a bufferful at a
         * time (each token is 1 to 5 bytes of CBOR). */
        uint8_t buf[512];
        struct cbor_hasher h;
        ch_begin(&h, k->hash);
        size_t o = cbor_head(buf, 4, 3);
        o += cbor_head(buf + o, 2, plen);
        memcpy(buf + o, parent, plen);
        o += plen;
        o += cbor_head(buf + o, 4, k->block_size);
        for (uint32_t i = 0; i < k->block_size; i++) {
            if (o > sizeof buf - 9) {
                ch_update(&h, buf, o);
                o = 0;
            }
            o += cbor_head(buf + o, 0, t[i]);
        }
        buf[o++] = 0xf6;
        ch_update(&h, buf, o);
        plen = ch_end(&h, parent);
        out[b] = be64(parent + plen - 8); /* & (2^64 - 1) of the big-endian integer: the last 8 bytes */
    }
    return nblocks;
}

size_t atc_kv_sim_tokenize(const char *text, size_t len, uint32_t *out, size_t max)
{
    size_t n = (len + 3) / 4;
    for (size_t i = 0; i < n && i < max; i++) {
        size_t at = i * 4, w = len - at < 4 ? len - at : 4;
        out[i] = (uint32_t)(XXH3_64bits(text + at, w) & 0x1ffff);
    }
    return n;
}
