#ifndef ATC_AFFINITY_H
#define ATC_AFFINITY_H

/* Two engine-owned tables that policies read and write and that survive policy reloads:
 *
 *  - the session affinity table (atc.affinity.get/set/del): key -> endpoint id with an expiry, bounded,
 *    least recently used entries evicted when full;
 *  - the prefix index (ep:prefix_overlap(req)): which endpoints recently got requests starting with a
 *    given chain of prefix blocks (see request_features.h), bounded, exact for every endpoint index below
 *    ATC_PREFIX_INDEX_ENDPOINTS_MAX (approximate only in what it forgets: old blocks, evicted caches).
 *
 * Both are shared by the policy runtimes of every worker thread: each has a mutex of its own, held by
 * every public function (but create and destroy) for the length of the call, and nothing they return
 * points into them. Both hash with a random seed chosen at create, so clients cannot aim keys or
 * prompts at one bucket. */

#include <stddef.h>
#include <stdint.h>

#define ATC_AFFINITY_KEY_MAX 256            /* longer keys are rejected, never truncated */
#define ATC_AFFINITY_ID_MAX 128             /* longer endpoint ids are rejected */
#define ATC_AFFINITY_DEFAULT_ENTRIES 100000 /* max_entries when 0 is passed to create */

struct atc_affinity;

/** Creates an empty table holding at most @p max_entries entries (0: ATC_AFFINITY_DEFAULT_ENTRIES).
 * Memory: a bucket array of 8 bytes x the next power of two >= max_entries (1 MiB at the default),
 * plus one allocation per entry of 48 bytes + key + id + 1 (and malloc's overhead): about 14 MB for
 * 100,000 entries with 40-byte keys and 20-byte ids, at most about 46 MB when every key and id is at
 * its maximum length. Returns an owned table, or NULL on allocation failure. */
struct atc_affinity *atc_affinity_create(size_t max_entries);

/** Frees @p t and every entry. NULL is a no-op. */
void atc_affinity_destroy(struct atc_affinity *t);

/** Copies the endpoint id stored under @p key (@p keylen bytes, any bytes) into @p out (@p outsize
 * bytes, NUL-terminated; a buffer of ATC_AFFINITY_ID_MAX + 1 bytes always holds it) and returns its
 * length; like snprintf, a longer id is cut to outsize - 1 bytes and its full length returned. Returns
 * 0 (and writes an empty string when @p outsize > 0) when the key is absent, expired
 * (expires_at_ms <= @p now_ms: the entry is then dropped) or @p keylen > ATC_AFFINITY_KEY_MAX.
 * A hit makes the entry the most recently used. */
size_t atc_affinity_get(struct atc_affinity *t, const char *key, size_t keylen, uint64_t now_ms, char *out,
                        size_t outsize);

/** Maps @p key (@p keylen bytes) to @p endpoint_id (NUL-terminated, copied) until @p expires_at_ms,
 * replacing any previous value and making it the most recently used. When the table is full, one entry
 * is evicted first: an expired one if one of the 8 least recently used has expired (by the latest
 * now_ms seen by atc_affinity_get), otherwise the least recently used. Returns 0, or -1 with the table
 * unchanged when @p keylen > ATC_AFFINITY_KEY_MAX, @p endpoint_id is NULL, empty or longer than
 * ATC_AFFINITY_ID_MAX, or on allocation failure. */
int atc_affinity_set(struct atc_affinity *t, const char *key, size_t keylen, const char *endpoint_id,
                     uint64_t expires_at_ms);

/** The same without telling the observer: a pin learnt from elsewhere (another replica, through the
 * cluster), which must not be written back. */
int atc_affinity_put(struct atc_affinity *t, const char *key, size_t keylen, const char *endpoint_id,
                     uint64_t expires_at_ms);

/* What a table tells its observer (the cluster's write-through to Redis), on the caller's thread, after
 * the table's lock is released: a set, a delete, a get that found nothing (so a pin another replica
 * holds can be fetched for the next request). */
enum atc_affinity_event { ATC_AFFINITY_SET, ATC_AFFINITY_DEL, ATC_AFFINITY_MISS };
typedef void (*atc_affinity_observer)(void *ctx, enum atc_affinity_event ev, const char *key, size_t keylen,
                                      const char *endpoint_id, uint64_t expires_at_ms);

/** Calls @p fn(@p ctx, ...) for every set, delete and miss from now on; set before any worker uses the
 * table (it is read without the lock). NULL stops it. */
void atc_affinity_observe(struct atc_affinity *t, atc_affinity_observer fn, void *ctx);

/** Removes @p key if present. */
void atc_affinity_del(struct atc_affinity *t, const char *key, size_t keylen);
/** The same without telling the observer (a delete learnt from another replica). */
void atc_affinity_forget(struct atc_affinity *t, const char *key, size_t keylen);

/** Removes every entry that names endpoint @p endpoint_id (one that left the fleet), without telling the
 * observer; returns how many. O(entries held). */
size_t atc_affinity_forget_endpoint(struct atc_affinity *t, const char *endpoint_id);

/** Entries held, including expired ones not yet dropped (they go when looked up or evicted). */
size_t atc_affinity_count(struct atc_affinity *t);

#define ATC_PREFIX_INDEX_DEFAULT_BLOCKS 500000 /* max_blocks when 0 is passed to create */
#define ATC_PREFIX_INDEX_ENDPOINTS_MAX 1024      /* endpoint indices from this on are not recorded */

struct atc_prefix_index;

/** Creates an empty index holding at most @p max_blocks (block hash -> endpoints) entries
 * (0: ATC_PREFIX_INDEX_DEFAULT_BLOCKS). All its memory is allocated here and never grows
 * (atc_prefix_index_bytes): 1.1 MB (the KV clocks of 1,024 endpoints) + 2 x ceil(max_blocks / 2 / 0.7) x
 * 32 bytes (the slots: a block and up to 4 endpoints that hold it) + 2 x max_blocks / 16 x 128 bytes (the
 * wide sets: a bitmap of every endpoint, for blocks held by more than 4), about 62 bytes per block; 31 MB
 * at the default, which covers about 125 MB of distinct prompt text in 256-byte blocks: 32M tokens, the KV
 * caches of 80 servers of 400k tokens each. Returns an owned index, or NULL on allocation failure. */
struct atc_prefix_index *atc_prefix_index_create(size_t max_blocks);

/** Frees @p idx. NULL is a no-op. */
void atc_prefix_index_destroy(struct atc_prefix_index *idx);

/** Records that the request whose chained prefix blocks are @p blocks[0..n) (@p block_tokens tokens
 * each) went to the endpoint of index @p endpoint_index, whose KV cache holds @p kv_tokens (0: unknown).
 * An index >= ATC_PREFIX_INDEX_ENDPOINTS_MAX is not recorded (returns 0). Never allocates. A block held by
 * more than 4 endpoints takes one of the generation's wide sets (max_blocks / 16 of them); when they are
 * all taken, a new holder of such a block replaces an older one (counted by atc_prefix_index_dropped).
 * Each time max_blocks / 2 new blocks have come in, the older half of the index is dropped: that call
 * also clears 11.4 MB at the default size (0.3-1 ms measured here), holding the lock, so every worker's
 * atc_prefix_index_overlaps waits that long too. A block inserted again at least that often is
 * never dropped, so a hot prefix stays.
 *
 * With kv_tokens known, the index also forgets what that server must have evicted, as an LRU cache of
 * that size (vLLM's and SGLang's evict least recently used blocks first): once the distinct tokens sent
 * there since it last got a block (cached or not: a hit moves its blocks to the front too) fill its cache,
 * that block no longer counts there (an estimate, in buckets of 1/16 of kv_tokens; a block not sent there
 * for 8 x kv_tokens of its traffic counts as gone). A server that has seen a block more recently than the
 * others is timed exactly; the others are timed as of the latest of them. Returns how many of the leading
 * blocks were recorded for that endpoint already (what it likely has cached). */
size_t atc_prefix_index_insert(struct atc_prefix_index *idx, const uint64_t *blocks, size_t n,
                               unsigned endpoint_index, uint32_t block_tokens, uint64_t kv_tokens);

/** A request that held blocks[0..n) on endpoint @p endpoint_index finished there: its blocks, which no
 * eviction could take while it ran, are the most recently used there now, and @p extra_tokens more (its
 * output and its prompt's last partial block) took their place in that cache too. */
void atc_prefix_index_released(struct atc_prefix_index *idx, const uint64_t *blocks, size_t n,
                               unsigned endpoint_index, uint32_t block_tokens, uint64_t kv_tokens,
                               uint64_t extra_tokens);

/** Fills @p out[i], for each endpoint index i < @p nendpoints, with the number of leading blocks of
 * @p blocks[0..n) recorded for endpoint i (counting stops at its first missing block; capped at
 * UINT16_MAX). One pass over the blocks, stopping as soon as no endpoint matches. Never allocates. */
void atc_prefix_index_overlaps(struct atc_prefix_index *idx, const uint64_t *blocks, size_t n, uint16_t *out,
                               size_t nendpoints);

/** Forgets everything, e.g. on a config reload that renumbers endpoints. O(size of the index). */
void atc_prefix_index_clear(struct atc_prefix_index *idx);

/** Forgets endpoint @p endpoint_index (one that left the fleet): it holds no block any more, and its KV
 * clock starts again. O(size of the index), as atc_prefix_index_clear. */
void atc_prefix_index_forget(struct atc_prefix_index *idx, unsigned endpoint_index);

/** Entries held, at most max_blocks (a block re-inserted since the last rotation counts twice until
 * its older copy is dropped). */
size_t atc_prefix_index_count(struct atc_prefix_index *idx);

/** Holders forgotten because the wide sets ran out (see atc_prefix_index_insert), since create. */
uint64_t atc_prefix_index_dropped(struct atc_prefix_index *idx);

/** Bytes allocated by @p idx (fixed at create, so read without the lock). */
size_t atc_prefix_index_bytes(const struct atc_prefix_index *idx);

#endif
