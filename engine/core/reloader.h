#ifndef ATC_RELOADER_H
#define ATC_RELOADER_H

/* Policy reloads that park no worker: a loader thread builds the new version for every worker
 * (atc_policy_build_*: compiled, init() run, smoke-tested, each step within its budget), then each
 * worker swaps its version in from its mailbox, between two decisions. Loading, however slow (up to
 * the limits: 100 budgets for the chunk, for init() and for each synthetic request), costs the
 * workers nothing but the CPU it shares with them. One reload runs at a time; those asked for while one
 * runs are answered by one more after it (the files may have changed again).
 *
 * Threads: everything here runs on the main thread (worker 0's), except the build itself (the loader
 * thread, between its start and the task it posts back) and each worker's swap (on its own thread, a
 * task posted to its mailbox, which counts down `pending`). */

#include <stdbool.h>
#include <stdint.h>

struct atc_worker_group;
struct atc_reloader;

/** What a reload tells whoever asked: the version every worker now decides with, or 0 and why not
 * (borrowed for the call). On the main thread. */
typedef void (*atc_reload_done)(void *arg, uint64_t version, const char *err);

/** A reloader for the policies of @p g's workers (borrowed; every worker has a policy runtime). NULL when
 * out of memory. */
struct atc_reloader *atc_reloader_create(struct atc_worker_group *g);

/** Waits for a build in progress (its thread), then frees @p r; call once the worker threads have joined
 * and worker 0's loop has stopped. Whoever still waits for an answer is not called. NULL: nothing. */
void atc_reloader_destroy(struct atc_reloader *r);

/** Reloads every worker's policy from its files; calls @p done(@p arg, ...) when every worker decides
 * with the new version, or when it failed to build (nothing changed). @p done may be NULL. Main thread. */
void atc_reloader_start(struct atc_reloader *r, atc_reload_done done, void *arg);

struct atc_policy_target_spec;
/** Likewise, building for @p spec (a canary, a shadow, clearing the shadow; copied): @p done gets the
 * build's version. Refused (done with an error) while another reload runs. Main thread. */
void atc_reloader_start_as(struct atc_reloader *r, const struct atc_policy_target_spec *spec, atc_reload_done done,
                           void *arg);

/** Waits until no build is in progress, so that the caller may change what builds read (the endpoint
 * table: a config reload). A build that finished this way is dropped when the workers' runtimes have
 * been rebuilt since (atc_policy_adopt). Main thread. */
void atc_reloader_wait(struct atc_reloader *r);

/** True when no round is in progress (no build reads the endpoint table it began with). NULL: true. Main
 * thread. */
bool atc_reloader_idle(const struct atc_reloader *r);

#endif
