#ifndef ATC_KV_EVENTS_H
#define ATC_KV_EVENTS_H

/* The engines' KV-cache events, read into the exact index (fleet/kv_index.h): one ZMQ SUB socket per
 * endpoint whose config has kv_events.endpoint, on the main loop through the socket's file descriptor.
 *
 * The wire format is vLLM's (vllm/distributed/kv_events.py, ZmqEventPublisher): each message is three
 * frames, the topic, the sequence number (8 bytes, big-endian, from 0, +1 per message) and an msgpack
 * EventBatch (fleet/kv_event_decode.h). Its ROUTER replay socket answers a DEALER's [empty, start_seq
 * as 8 bytes big-endian] with [empty, seq, payload] for every batch it still buffers from start_seq
 * on, then [empty, -1 as 8 bytes, empty]. Here:
 * - the next sequence number is applied; a jump forward is a gap: with a replay_endpoint the missing
 *   batches are asked for (live batches meanwhile wait, at most KV_PENDING_MAX of them) and applied in
 *   order, within KV_REPLAY_TIMEOUT_MS; a gap the replay cannot fill (no replay socket, no answer in
 *   time, batches no longer buffered) clears the endpoint's entries and goes on from the live batch;
 * - a number at or below the last one applied is an engine restart: its entries are cleared;
 * - AllBlocksCleared clears them too; a payload that does not decode is counted and skipped;
 * - each problem is counted, and logged once per endpoint and kind;
 * - memory is bounded: at most KV_HWM messages queue in libzmq per socket, messages over KV_MAX_MESSAGE
 *   bytes are refused by libzmq, the decoder allocates in proportion to one payload, and one wakeup
 *   reads at most KV_BURST messages before letting the loop run (a flood cannot starve it).
 *
 * Threads: everything here runs on the main thread (the loop @p base of atc_kv_events_create), and
 * the counters are plain fields it alone writes and reads (the admin API and /metrics run there too).
 * Worker threads read only the index, through atc_kv_events_index and atc_kv_events_slot (both fixed
 * from creation to destruction), as kv_index.h says. */

#include <stdint.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "config/config.h"
#include "fleet/kv_index.h"
#include "fleet/kv_token_cache.h"

struct atc_kv_events;

/** Starts a subscriber for every endpoint of @p cfg with kv_events.endpoint set, on @p base. Returns
 * the owned set; NULL with *err NULL when no endpoint publishes events; NULL with an owned message in
 * *err when one cannot start (more than ATC_KV_INDEX_MAX_ENDPOINTS of them, a bad ZMQ address).
 * Borrows nothing of @p cfg after it returns. */
struct atc_kv_events *atc_kv_events_create(struct event_base *base, const struct atc_config *cfg, char **err);

/** Closes the sockets and frees the set and its index (no reader may use the index any more). NULL is
 * fine. */
void atc_kv_events_destroy(struct atc_kv_events *kv);

/** The exact index (any thread; fixed for the set's life). */
const struct atc_kv_index *atc_kv_events_index(const struct atc_kv_events *kv);

/** The index's endpoint number of the endpoint @p id, or -1 when it publishes no events. Any thread. */
int atc_kv_events_slot(const struct atc_kv_events *kv, const char *id);

/** Appends ,"kv_events":{...} (its counters) to @p out for endpoint @p id; nothing when @p kv is NULL or
 * the endpoint publishes no events. Main thread. */
void atc_kv_events_endpoint_json(const struct atc_kv_events *kv, const char *id, struct evbuffer *out);

/** The counters in the Prometheus text format, labelled by endpoint. Main thread. */
void atc_kv_events_metrics(const struct atc_kv_events *kv, struct evbuffer *out);

/** Endpoint @p slot's kv_events.tokenize settings, or NULL when it has tokenize off. Any thread (fixed
 * for the set's life). */
const struct atc_kv_tokenize *atc_kv_events_tokenize(const struct atc_kv_events *kv, unsigned slot);

/** The /tokenize step's cache and counters, shared by the workers (kv_token_cache.h: its own lock).
 * Any thread; fixed for the set's life. */
struct atc_kv_token_cache *atc_kv_events_token_cache(const struct atc_kv_events *kv);

#endif
