#ifndef ATC_CLUSTER_H
#define ATC_CLUSTER_H

/* Several replicas of atc as one router (config `cluster:`), through one Redis server, by hiredis on the
 * main thread's event loop. Every sync_interval the cluster
 *   - publishes this replica's in-flight figures per endpoint and reads every other replica's
 *     (load_share.h), which the endpoints' `remote` figures then hold for the policy views;
 *   - sends what the workers queued since: session pins set or deleted (SET with the pin's TTL, and a
 *     PUBLISH that every other replica's subscription writes into its own table at once), lookups of
 *     pins this replica did not have (the answer lands in the local table, for the session's next
 *     request), and the tenant budgets' lease refills (limits.h).
 * Workers never wait for Redis: they queue (atc_cluster_observer, the limits' on_low) and the main
 * thread sends; a queue that waits is sent at once through @p wake rather than at the next tick.
 *
 * Redis down, or an answer missing for more than one sync_interval: the cluster goes to local mode
 * (logged once): remote figures are zeroed, limits are spent per replica, pins stay local. It keeps
 * reconnecting (and drops a connection that hangs); the first full sync after Redis answers again
 * returns it to shared mode.
 *
 * Threads: everything here runs on the main thread, except atc_cluster_observer and the wake it may call,
 * which run on any worker (a queue under its own mutex, in cluster.c). */

#include <stdint.h>

struct event_base;
struct evbuffer;
struct atc_endpoint_table;
struct atc_affinity;
struct atc_limits;
struct atc_cluster;

struct atc_cluster_settings {
    const char *host; /* Redis: a name is resolved once, here, so reconnecting never blocks the loop */
    uint16_t port;
    unsigned db;
    const char *name;          /* this replica's (NULL: hostname:pid) */
    uint64_t sync_interval_ms; /* > 0 */
};

/** Starts the cluster on @p base (the main thread's) over @p table, @p aff (may be NULL: no pins) and
 * @p limits (may be NULL). @p wake(@p wake_ctx) is called from any thread when the queue needs sending;
 * it must get atc_cluster_flush called on the main thread soon. All borrowed. Registers itself as
 * @p aff's observer and @p limits' on_low. Returns NULL with a static reason in *err. */
struct atc_cluster *atc_cluster_create(struct event_base *base, const struct atc_cluster_settings *s,
                                       struct atc_endpoint_table *table, struct atc_affinity *aff,
                                       struct atc_limits *limits, void (*wake)(void *ctx), void *wake_ctx,
                                       const char **err);

/** Closes the connections (pending answers are dropped) and frees @p c. NULL is fine. */
void atc_cluster_destroy(struct atc_cluster *c);

/** A config reload swapped the endpoint table (main thread, workers parked). */
void atc_cluster_set_table(struct atc_cluster *c, struct atc_endpoint_table *table);

/** Sends what is queued now (main thread): what @p wake asks for. */
void atc_cluster_flush(struct atc_cluster *c);

/** The cluster's state as a JSON object (name, redis, state, mode, last_sync_ms_ago, replicas, ...). */
void atc_cluster_json(struct atc_cluster *c, struct evbuffer *out);

/** The same in Prometheus text (atc_cluster_*). */
void atc_cluster_metrics(struct atc_cluster *c, struct evbuffer *out);

#endif
