#ifndef ATC_SIM_KV_PUBLISH_H
#define ATC_SIM_KV_PUBLISH_H

/* atc sim's KV-cache events, published live as vLLM publishes them (vllm/distributed/kv_events.py,
 * ZmqEventPublisher), so that atc serve's subscriber (fleet/kv_events.c) reads a simulated fleet as it
 * reads real engines:
 * - a PUB socket sends one message per turn of the loop in which the cache changed (vLLM: one per
 *   scheduler step) of three frames: the topic (empty, vLLM's default), the sequence number (8 bytes,
 *   big-endian, from 0) and an msgpack EventBatch [ts, [events], data_parallel_rank 0], each event a
 *   msgspec tagged array: ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
 *   lora_id, medium "GPU", lora_name], ["BlockRemoved", block_hashes, "GPU"], ["AllBlocksCleared"];
 * - a ROUTER replay socket (optional) answers a DEALER's [empty, start_seq] with [empty, seq, payload]
 *   for every batch it still holds from start_seq on (the last ATC_SIM_KV_REPLAY_BATCHES), then
 *   [empty, -1, empty];
 * - the first batch (seq 0) is AllBlocksCleared: a restarted server starts empty and its sequence
 *   starts again, both of which tell a subscriber to forget it.
 *
 * The block keys are the simulator's own: the prefix hashes atc's feature scan computes from the
 * prompt text (request/request_features.h, 256 bytes a block, reported as block_size 64 tokens), the
 * same keys atc serve looks up for a live request. They stand in for the engine's token-level keys
 * (request/kv_keys.h), which atc computes only from the engine's token ids; token_ids is sent empty.
 * With --kv-events-hash, the server tells the publisher each block's engine-style key (the sim's own
 * token ids, sim/sim_tokenize.h, chained with that hash: atc_sim_kv_pub_alias) and those are published
 * instead, as a real engine's would be.
 *
 * Everything runs on the loop given at creation. */

#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>

#include "sim/sim.h"

#define ATC_SIM_KV_REPLAY_BATCHES 1024

struct atc_sim_kv_pub;

/** Binds the PUB socket to @p endpoint and, when @p replay_endpoint is not NULL, the ROUTER socket
 * (ZMQ addresses; "tcp://127.0.0.1:*" picks a free port) on @p base, and publishes the first batch
 * (AllBlocksCleared). Blocks are @p block_size tokens. Batch number @p drop (0: none) is left out of
 * the live socket but kept for replays: a sequence gap on purpose, for tests. Returns the publisher,
 * or NULL with a static message in *err. */
struct atc_sim_kv_pub *atc_sim_kv_pub_create(struct event_base *base, const char *endpoint,
                                             const char *replay_endpoint, uint32_t block_size, uint64_t drop,
                                             const char **err);

/** Closes the sockets (pending messages are dropped) and frees it. NULL is fine. */
void atc_sim_kv_pub_destroy(struct atc_sim_kv_pub *pub);

/** An atc_sim_on_kv listener (ctx: the publisher): queues the change into the batch the loop's next
 * turn sends. */
void atc_sim_kv_pub_on_kv(void *ctx, enum atc_sim_kv_op op, const uint64_t *hashes, size_t n);

/** From now on, the block of prompt-text hash @p hashes[i] is published as @p keys[i] (@p n of each). */
void atc_sim_kv_pub_alias(struct atc_sim_kv_pub *p, const uint64_t *hashes, const uint64_t *keys, size_t n);

/** The address the PUB socket (@p replay false) or the ROUTER socket is bound to (the port chosen
 * for "*"), into @p out (@p len bytes). Returns 0, or -1 (none, or too long). */
int atc_sim_kv_pub_endpoint(const struct atc_sim_kv_pub *pub, int replay, char *out, size_t len);

/** Batches published, and replay requests answered, so far. */
uint64_t atc_sim_kv_pub_batches(const struct atc_sim_kv_pub *pub);
uint64_t atc_sim_kv_pub_replays(const struct atc_sim_kv_pub *pub);

#endif
