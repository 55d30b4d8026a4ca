#ifndef ATC_TABLE_SWAP_H
#define ATC_TABLE_SWAP_H

/* Endpoint set changes that reach the workers without parking them (an endpoint added or removed through
 * the admin API or DNS discovery): the new table (atc_endpoint_table_with, which keeps every other
 * endpoint's slot) goes to each worker's mailbox, as policy versions do (core/reloader.h), and each worker
 * takes it between two callbacks on its own thread: w->table, and its policy's endpoint views
 * (atc_policy_update_table). What the change leaves behind is freed once no worker can reach it:
 *
 * - the table it replaced, once every worker has taken this one (or a later one), and nothing else reads
 *   it (the caller says so: a policy build in progress reads the table it began with);
 * - an endpoint removed, once it has nothing in flight (requests, and side requests such as /tokenize),
 *   every worker has taken a table without it, and no policy build reads a table with it:
 *   each worker frees its own connection pool to it on its own loop (a task in its mailbox), then
 *   on_free (the server's: its health husk, then the endpoint) runs on the main thread.
 *
 * A config reload still parks the workers (it swaps w->table itself, atc_workers_pause) and tells this
 * module with atc_table_swap_taken_by_all; the endpoints it removed are retired here the same way.
 *
 * Threads: every function here is the main thread's (worker 0's); the swaps and the pool frees run on
 * each worker's own thread, and their answers come back through worker 0's mailbox. */

#include <stdbool.h>
#include <stddef.h>

struct atc_worker_group;
struct atc_endpoint;
struct atc_endpoint_table;
struct atc_table_swap;

/** Swaps for the workers of @p g (borrowed; its workers and their policy runtimes set up). @p on_free(@p
 * ctx, ep) frees an endpoint retired here once no worker reaches it (any pool still in ep->pools is the
 * callee's to free: a worker whose loop had stopped). NULL when out of memory. */
struct atc_table_swap *atc_table_swap_create(struct atc_worker_group *g,
                                             void (*on_free)(void *ctx, struct atc_endpoint *ep), void *ctx);

/** Frees every old table and every retired endpoint (pools, then on_free), once the worker threads have
 * joined. NULL: nothing. */
void atc_table_swap_destroy(struct atc_table_swap *s);

/** Hands @p t (owned by the caller from now on, as its current table) to every worker in place of @p old
 * (taken: freed here later). Worker 0 takes it at once, the others from their mailboxes; a worker whose
 * loop has stopped counts as having taken it (one whose mailbox had no memory gets it from a later
 * atc_table_swap_collect, unless a newer table reached it first). 0, or -1 when out of memory (nothing was
 * posted; @p old is still the caller's and the workers keep it). */
int atc_table_swap_publish(struct atc_table_swap *s, struct atc_endpoint_table *old,
                           struct atc_endpoint_table *t);

/** Every worker took the current table while parked (a config reload set w->table itself): what was
 * published before needs no more answers. */
void atc_table_swap_taken_by_all(struct atc_table_swap *s);

/** @p ep left the table with the last publish (or a config reload): freed here once it has nothing in
 * flight and no worker can reach it. 0, or -1 when out of memory (then it is never freed). */
int atc_table_swap_retire(struct atc_table_swap *s, struct atc_endpoint *ep);

/** Frees what no worker can reach any more (call it now and then: endpoints drain). Only when @p idle (no
 * policy build in progress: a build reads the table it began with, its endpoints and their health) does
 * it free old tables or begin to free retired endpoints; otherwise they wait for a later call. */
void atc_table_swap_collect(struct atc_table_swap *s, bool idle);

/** Endpoints retired and not freed yet (draining, or their pools being freed). */
size_t atc_table_swap_retired(const struct atc_table_swap *s);

#endif
