#ifndef ATC_KV_INDEX_H
#define ATC_KV_INDEX_H

/* The exact prefix index: block key (uint64, as the engines publish it) -> which endpoints hold that
 * block, on which tier (GPU, or CPU / any other medium: kept apart). Fed only from the engines' KV
 * events (fleet/kv_events.c); nothing here guesses.
 *
 * Endpoints are numbered 0..n-1 (at most ATC_KV_INDEX_MAX_ENDPOINTS) when the index is made, each with
 * its cap on the blocks it may hold (both tiers counted). Overflow rule: a store that takes an endpoint
 * past its cap evicts that endpoint's oldest stores first (in the order they were stored; a block
 * removed and stored again keeps its first place), so the index keeps the newest blocks an engine
 * reported, which are the ones most likely still cached. The table is sized at creation for every cap
 * at once (twice the sum of caps, a power of two, 32 bytes a slot) and never grows.
 *
 * Threads: one writer, the main thread (kv_events.c, on the main loop), calls every function marked
 * "writer". Readers (worker threads, the admin API) call atc_kv_index_held_prefix and
 * atc_kv_index_blocks from any thread without a lock: each slot is a seqlock (the writer makes its
 * `seq` odd, stores key and masks, makes it even with release; a reader copies them and tries again
 * while `seq` was odd or moved), so a reader sees a slot before or after a write, never half of one.
 * Removal shifts later entries of a probe chain back one slot (no tombstones), under a second,
 * table-wide seqlock (`moving`) that only a reader who did not find a key consults: it looks again if
 * the writer moved entries meanwhile (at most 64 times, so a reader never waits on a busy writer; past
 * that it answers "not held", one block short, which routing tolerates). Counts are relaxed atomics. The
 * index is destroyed only when no reader can use it (the server's shutdown). */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fleet/kv_event_decode.h"

#define ATC_KV_INDEX_MAX_ENDPOINTS 64 /* one bit each in a slot's masks */

struct atc_kv_index;

/** An index for @p n endpoints (1..ATC_KV_INDEX_MAX_ENDPOINTS), endpoint i holding at most @p caps[i]
 * blocks (> 0). Returns an owned index, or NULL (bad arguments, out of memory). */
struct atc_kv_index *atc_kv_index_create(const size_t *caps, unsigned n);

/** Frees it; no reader may use it any more. NULL is fine. */
void atc_kv_index_destroy(struct atc_kv_index *ix);

/** Writer. Endpoint @p ep now holds block @p key on @p tier. Returns 1 when that is new, 0 when it was
 * already known, -1 for a bad @p ep. May evict @p ep's oldest blocks (the overflow rule above). */
int atc_kv_index_store(struct atc_kv_index *ix, unsigned ep, uint64_t key, enum atc_kv_tier tier);

/** Writer. Endpoint @p ep no longer holds @p key on @p tier. Returns 1 when it did, else 0. */
int atc_kv_index_remove(struct atc_kv_index *ix, unsigned ep, uint64_t key, enum atc_kv_tier tier);

/** Writer. Endpoint @p ep holds nothing (AllBlocksCleared, an engine restart, a gap not filled). */
void atc_kv_index_clear(struct atc_kv_index *ix, unsigned ep);

/** Any thread: how many of @p keys[0..n) endpoint @p ep holds, counted from the first and stopping at
 * the first it does not hold, on the tiers in @p tiers (a bit per enum atc_kv_tier: 1 << ATC_KV_GPU,
 * 1 << ATC_KV_CPU, or both). Multiply by the block size for tokens. 0 for a bad @p ep. */
size_t atc_kv_index_held_prefix(const struct atc_kv_index *ix, unsigned ep, const uint64_t *keys, size_t n,
                                unsigned tiers);

/** Any thread: the blocks endpoint @p ep holds on @p tier now. */
size_t atc_kv_index_blocks(const struct atc_kv_index *ix, unsigned ep, enum atc_kv_tier tier);

/** Any thread: the blocks of endpoint @p ep evicted by its cap so far. */
uint64_t atc_kv_index_evicted(const struct atc_kv_index *ix, unsigned ep);

#endif
