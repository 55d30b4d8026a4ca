/* Policy reloads off the serving threads (see reloader.h). */

#include "core/reloader.h"

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "base/log.h"
#include "proxy/worker.h"
#include "policy/policy.h"

struct waiter {
    atc_reload_done done;
    void *arg;
    struct waiter *next;
};

/* A worker's swap: the task posted to its mailbox. */
struct adopt_task {
    struct atc_reloader *r;
    unsigned worker;
};

/* Where the round of reloading is (main thread only: the loader thread never reads it). Every move goes
 * through set_state, checked against `moves` (debug and sanitizer builds: assert), as proxy/relay.c does.
 *
 *   IDLE --> LOADING --> BUILT --> ADOPTING --> IDLE (or at once LOADING again for the reloads asked
 *     |                             ^            during the round)
 *     +----> BUILDING --------------+   (no thread could start: built on the main thread, this once) */
enum reloader_state {
    RELOADER_IDLE,     /* no round: a start begins one (no build) */
    RELOADER_LOADING,  /* the loader thread builds; it must be joined */
    RELOADER_BUILDING, /* the main thread builds, inline */
    RELOADER_BUILT,    /* the loader thread has been joined; on_built, posted, has yet to run */
    RELOADER_ADOPTING, /* the workers swap the build in; `pending` counts those left */
};

#define RELOADER_IN(s) (1u << (s))
static const unsigned moves[] = {
    [RELOADER_IDLE] = RELOADER_IN(RELOADER_LOADING) | RELOADER_IN(RELOADER_BUILDING),
    [RELOADER_LOADING] = RELOADER_IN(RELOADER_BUILT),
    [RELOADER_BUILDING] = RELOADER_IN(RELOADER_ADOPTING),
    [RELOADER_BUILT] = RELOADER_IN(RELOADER_ADOPTING),
    [RELOADER_ADOPTING] = RELOADER_IN(RELOADER_IDLE),
};

struct atc_reloader {
    struct atc_worker_group *g;
    pthread_t thread;
    enum reloader_state state;
    struct atc_policy_build *build; /* NULL exactly when IDLE */
    struct waiter *waiters; /* answered by the round in progress */
    struct waiter *queued;  /* asked during it: one more round after */
    struct atc_policy_target_spec spec; /* of the round in progress (its entry owned) */
    atomic_uint pending;    /* workers that have not swapped yet */
    struct adopt_task tasks[]; /* [g->nworkers] */
};

static void set_state(struct atc_reloader *r, enum reloader_state to)
{
    assert(r->state <= RELOADER_ADOPTING && (moves[r->state] & RELOADER_IN(to)) != 0);
    (void)moves; /* (NDEBUG) */
    r->state = to;
}

static void runtimes(const struct atc_reloader *r, struct atc_policy_runtime **out)
{
    for (unsigned i = 0; i < r->g->nworkers; i++)
        out[i] = r->g->workers[i].policy;
}

static void answer(struct waiter *w, uint64_t version, const char *err)
{
    while (w != NULL) {
        struct waiter *next = w->next;
        if (w->done != NULL)
            w->done(w->arg, version, err);
        free(w);
        w = next;
    }
}

/* Frees a list of waiters without calling them (their requests go with the admin server). */
static void drop(struct waiter *w)
{
    while (w != NULL) {
        struct waiter *next = w->next;
        free(w);
        w = next;
    }
}

static void begin_round(struct atc_reloader *r);

/* Main thread: every worker swapped (or could not: its loop had stopped). */
static void on_all_adopted(void *arg)
{
    struct atc_reloader *r = arg;
    struct atc_policy_runtime *rt0 = r->g->workers[0].policy;
    uint64_t version = r->spec.target == ATC_POLICY_LIVE ? atc_policy_version(rt0) : atc_policy_build_version(r->build);
    const char *err = atc_policy_build_error(r->build);
    if (err != NULL)
        version = 0;
    struct waiter *w = r->waiters;
    r->waiters = NULL;
    answer(w, version, err);
    atc_policy_build_destroy(r->build);
    r->build = NULL;
    set_state(r, RELOADER_IDLE);
    free((char *)r->spec.entry);
    r->spec = (struct atc_policy_target_spec){.target = ATC_POLICY_LIVE};
    if (r->queued != NULL) {
        r->waiters = r->queued;
        r->queued = NULL;
        begin_round(r);
    }
}

static void adopted_one(struct atc_reloader *r)
{
    if (atomic_fetch_sub(&r->pending, 1) == 1 && atc_worker_post(&r->g->workers[0], on_all_adopted, r) < 0)
        atc_error("policy reload: the main loop has stopped; the reload is not answered");
}

/* On worker t->worker's thread, between two of its callbacks: between decisions. */
static void on_adopt(void *arg)
{
    struct adopt_task *t = arg;
    atc_policy_adopt(t->r->g->workers[t->worker].policy, t->r->build, t->worker);
    adopted_one(t->r);
}

static void join_loader(struct atc_reloader *r)
{
    if (r->state != RELOADER_LOADING)
        return;
    pthread_join(r->thread, NULL);
    set_state(r, RELOADER_BUILT);
}

/* Main thread: the loader has finished; every worker swaps at its next turn. */
static void on_built(void *arg)
{
    struct atc_reloader *r = arg;
    join_loader(r);
    set_state(r, RELOADER_ADOPTING);
    atomic_store(&r->pending, r->g->nworkers);
    for (unsigned i = 1; i < r->g->nworkers; i++)
        if (atc_worker_post(&r->g->workers[i], on_adopt, &r->tasks[i]) < 0)
            adopted_one(r); /* its loop has stopped: its version is freed with the build */
    on_adopt(&r->tasks[0]);
}

static void *loader_main(void *arg)
{
    struct atc_reloader *r = arg;
    atc_policy_build_run(r->build);
    if (atc_worker_post(&r->g->workers[0], on_built, r) < 0)
        atc_error("policy reload: the main loop has stopped; the build is dropped");
    return NULL;
}

static void begin_round(struct atc_reloader *r)
{
    struct atc_policy_runtime *rts[ATC_MAX_WORKERS];
    runtimes(r, rts);
    r->build = atc_policy_build_create(rts, r->g->nworkers);
    if (r->build != NULL && atc_policy_build_target(r->build, &r->spec) < 0) {
        atc_policy_build_destroy(r->build);
        r->build = NULL;
    }
    if (r->build == NULL) {
        struct waiter *w = r->waiters;
        r->waiters = NULL;
        answer(w, 0, "out of memory");
        return;
    }
    /* on_built runs on this thread's loop, after this returns: the state may follow the thread's start. */
    if (pthread_create(&r->thread, NULL, loader_main, r) == 0) {
        set_state(r, RELOADER_LOADING);
        return;
    }
    set_state(r, RELOADER_BUILDING); /* no thread: build here, and let the workers wait this once */
    atc_policy_build_run(r->build);
    on_built(r);
}

struct atc_reloader *atc_reloader_create(struct atc_worker_group *g)
{
    struct atc_reloader *r = calloc(1, sizeof(*r) + g->nworkers * sizeof(r->tasks[0]));
    if (r == NULL)
        return NULL;
    r->g = g;
    for (unsigned i = 0; i < g->nworkers; i++)
        r->tasks[i] = (struct adopt_task){.r = r, .worker = i};
    return r;
}

void atc_reloader_destroy(struct atc_reloader *r)
{
    if (r == NULL)
        return;
    join_loader(r);
    atc_policy_build_destroy(r->build);
    free((char *)r->spec.entry);
    drop(r->waiters);
    drop(r->queued);
    free(r);
}

void atc_reloader_start(struct atc_reloader *r, atc_reload_done done, void *arg)
{
    struct waiter *w = malloc(sizeof(*w));
    if (w == NULL) {
        if (done != NULL)
            done(arg, 0, "out of memory");
        return;
    }
    *w = (struct waiter){.done = done, .arg = arg};
    bool busy = r->state != RELOADER_IDLE;
    struct waiter **list = busy ? &r->queued : &r->waiters;
    w->next = *list;
    *list = w;
    if (!busy)
        begin_round(r);
}

void atc_reloader_start_as(struct atc_reloader *r, const struct atc_policy_target_spec *spec, atc_reload_done done,
                           void *arg)
{
    if (r->state != RELOADER_IDLE) {
        if (done != NULL)
            done(arg, 0, "a policy reload is in progress; retry when it is answered");
        return;
    }
    r->spec = *spec;
    r->spec.entry = spec->entry != NULL ? strdup(spec->entry) : NULL;
    atc_reloader_start(r, done, arg);
}

void atc_reloader_wait(struct atc_reloader *r)
{
    join_loader(r);
}

bool atc_reloader_idle(const struct atc_reloader *r)
{
    return r == NULL || r->state == RELOADER_IDLE;
}
