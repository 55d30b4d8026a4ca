"""The engines' block keys, written from their description (not from atc's code), for test_kv_keys.py.

vLLM (vllm/v1/core/kv_cache_utils.py, vllm/utils/hashing.py): NONE_HASH = hash_fn(PYTHONHASHSEED as a
str); block i = hash_fn((parent digest, tuple(tokens), None)) where hash_fn is SHA-256 (sha256_cbor) or
XXH3-128 (xxhash_cbor) of cbor2.dumps(obj, canonical=True); the published key is
int.from_bytes(digest, "big") & (2**64 - 1). SGLang (hicache_storage.py get_hash_str /
hash_str_to_int64): SHA-256 over the previous digest and each token as 4 little-endian bytes; the key is
int(hexdigest[:16], 16), signed.

Runs under Debian's /usr/bin/python3 (python3-cbor2, python3-xxhash). Reads one JSON object a line on
stdin, {"hash", "block_size", "seed", "tokens"}, and answers each with a JSON list of unsigned keys."""

import hashlib
import json
import sys

import cbor2
import xxhash


def vllm_keys(fn, block_size, seed, tokens):
    def h(obj):
        data = cbor2.dumps(obj, canonical=True)
        return hashlib.sha256(data).digest() if fn == "sha256_cbor" else xxhash.xxh3_128_digest(data)

    parent = h(str(seed))
    keys = []
    for i in range(0, len(tokens) - block_size + 1, block_size):
        parent = h((parent, tuple(tokens[i:i + block_size]), None))
        keys.append(int.from_bytes(parent, "big") & ((1 << 64) - 1))
    return keys


def sglang_keys(block_size, tokens):
    prior = None
    keys = []
    for i in range(0, len(tokens) - block_size + 1, block_size):
        hasher = hashlib.sha256()
        if prior:
            hasher.update(bytes.fromhex(prior))
        for t in tokens[i:i + block_size]:
            hasher.update(t.to_bytes(4, byteorder="little", signed=False))
        prior = hasher.hexdigest()
        signed = int(prior[:16], 16)
        signed = signed - (1 << 64) if signed >= 1 << 63 else signed
        keys.append(signed & ((1 << 64) - 1))
    return keys


for line in sys.stdin:
    q = json.loads(line)
    if q["hash"] == "sglang":
        out = sglang_keys(q["block_size"], q["tokens"])
    else:
        out = vllm_keys(q["hash"], q["block_size"], q["seed"], q["tokens"])
    print(json.dumps(out), flush=True)
