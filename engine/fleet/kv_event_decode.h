#ifndef ATC_KV_EVENT_DECODE_H
#define ATC_KV_EVENT_DECODE_H

/* vLLM's KV-cache event batches (vllm/distributed/kv_events.py, vllm-project/vllm), decoded from msgpack.
 *
 * A batch is the msgpack payload of one ZMQ message (the third frame, after the topic and the 8-byte
 * big-endian sequence number): an EventBatch [ts, events, data_parallel_rank] (msgspec array_like) or
 * {"ts": .., "events": [..], "data_parallel_rank": ..} (a msgspec map). Each event is a tagged struct:
 * ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name,
 * extra_keys, group_idx, ...] or {"type": "BlockStored", "block_hashes": [..], "medium": .., ...};
 * ["BlockRemoved", block_hashes, medium, group_idx] and ["AllBlocksCleared"] likewise. msgspec omits
 * trailing fields left at their default (omit_defaults), and older builds have fewer fields: a field
 * that is absent reads as its default (medium: "GPU"). A block hash is an integer (uint64, or int64 as
 * SGLang sends) or bytes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0), of which the key is the low 64 bits of
 * the big-endian value, as vLLM's maybe_convert_block_hash computes its integers.
 *
 * Pure: no I/O, no globals; memory bounded by the payload's size (atc_kv_batch_decode checks every
 * array and map length against the bytes left before msgpack-c allocates for it). */

#include <stddef.h>
#include <stdint.h>

enum atc_kv_tier { ATC_KV_GPU = 0, ATC_KV_CPU = 1 }; /* medium "GPU" (or none) / any other medium */

enum atc_kv_event_type { ATC_KV_STORED, ATC_KV_REMOVED, ATC_KV_CLEARED, ATC_KV_UNKNOWN };

struct atc_kv_event {
    enum atc_kv_event_type type; /* ATC_KV_UNKNOWN: a tag this decoder does not know (skipped, counted) */
    enum atc_kv_tier tier;
    uint64_t *keys; /* STORED / REMOVED: the block keys, in the batch's order (owned by the batch) */
    size_t nkeys;
    int64_t block_size; /* STORED: as sent; -1 when absent */
};

struct atc_kv_batch {
    double ts;       /* the engine's wall clock when it published the batch, seconds */
    int64_t dp_rank; /* data_parallel_rank; -1 when absent or nil */
    struct atc_kv_event *events;
    size_t nevents;
    size_t unknown; /* events of an unknown type */
};

/* The reasons a payload is refused, compared by pointer. */
extern const char atc_kv_err_msgpack[];  /* "malformed msgpack" (or truncated, or trailing bytes) */
extern const char atc_kv_err_shape[];    /* "not an EventBatch" */
extern const char atc_kv_err_event[];    /* "malformed event" */
extern const char atc_kv_err_hash[];     /* "block hash neither an integer nor bytes" */
extern const char atc_kv_err_too_deep[]; /* "nested too deep" */

/** Decodes the @p len bytes at @p data (borrowed) into @p out. Returns 0, or -1 with a reason above in
 * *err and @p out empty. Either way @p out is released with atc_kv_batch_dispose. */
int atc_kv_batch_decode(const void *data, size_t len, struct atc_kv_batch *out, const char **err);

/** Frees what atc_kv_batch_decode put in @p b (not @p b itself) and empties it. */
void atc_kv_batch_dispose(struct atc_kv_batch *b);

#endif
