#ifndef ATC_LOAD_SHARE_H
#define ATC_LOAD_SHARE_H

/* Shared load: what each replica of a cluster has in flight on each endpoint, in a text every replica
 * publishes (cluster.c puts it in one Redis hash, a field per replica) and every other replica merges
 * into its endpoints' `remote` figures (fleet/endpoint.h), which the policy views add to their own.
 *
 * The text: a line "atc1 <seq>", then per endpoint "<inflight> <tokens> <prefill_tokens> <prefilling>
 * <decoding> <recent_tokens> <id>" (the id last: it is the rest of the line). A figure is as old as the
 * time since its replica's seq last changed, measured on the reader's own monotonic clock (so clocks of
 * different machines need not agree); a replica whose seq has not changed for stale_ms is left out of
 * the sum (it stopped publishing: crashed, partitioned, or gone).
 *
 * Threads: main thread only (cluster.c), but atc_load_share_apply stores into the endpoints' atomics,
 * which workers read. */

#include <stddef.h>
#include <stdint.h>

struct atc_endpoint_table;
struct atc_load_share;

#define ATC_LOAD_SHARE_REPLICAS 64 /* replicas tracked; more are ignored (and logged by the caller) */
/* The longest text read from another replica: ~80 bytes an endpoint, so some 3,000 endpoints. A longer
 * value (anyone with write access to Redis can write one) is not read at all: cluster.c asks Redis for
 * the lengths first and counts it. */
#define ATC_LOAD_SHARE_TEXT_MAX (256 * 1024)

/** An empty view of the other replicas; @p self is this replica's name (its own field is skipped).
 * NULL when out of memory. */
struct atc_load_share *atc_load_share_create(const char *self);
void atc_load_share_destroy(struct atc_load_share *s);

/** This replica's figures of every endpoint of @p t as the text above (owned, NUL-terminated; *len set),
 * with sequence number @p seq. NULL when out of memory. */
char *atc_load_share_encode(const struct atc_endpoint_table *t, uint64_t seq, uint64_t now_us, size_t *len);

/** Replica @p name published @p text (@p len bytes) as read at monotonic @p now_ms. Returns 0, or -1
 * when the text is not of the format above or there is no room for another replica. */
int atc_load_share_update(struct atc_load_share *s, const char *name, size_t namelen, const char *text,
                          size_t len, uint64_t now_ms);

/** Sums the fresh figures of every other replica into @p t's endpoints' remote figures (endpoints no
 * replica mentions get 0); a replica not updated for @p stale_ms is left out. Returns how many
 * replicas were summed. */
unsigned atc_load_share_apply(struct atc_load_share *s, struct atc_endpoint_table *t, uint64_t now_ms,
                              uint64_t stale_ms);

/** Zeroes @p t's remote figures (local mode). */
void atc_load_share_clear(struct atc_endpoint_table *t);

/** The replicas seen, for status: calls @p fn for each other replica with its name and the ms since its
 * figures last changed; also forgets replicas silent for @p forget_ms. */
void atc_load_share_each(struct atc_load_share *s, uint64_t now_ms, uint64_t forget_ms,
                         void (*fn)(void *ctx, const char *name, uint64_t age_ms), void *ctx);

#endif
