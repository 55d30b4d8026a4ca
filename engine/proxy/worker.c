#include "proxy/worker.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <event2/event.h>

#include "base/log.h"
#include "request/request_features.h"

struct worker_task {
    void (*fn)(void *arg);
    void *arg;
    struct worker_task *next;
};

/* The worker whose loop runs on this thread, NULL on threads of no worker: set by worker_main, and for
 * worker 0 by atc_worker_init on the main thread. Asking it reads no field another thread writes (a
 * worker's `thread` is stored by pthread_create in the main thread, possibly after other workers run). */
static _Thread_local const struct atc_worker *this_worker;

struct event_base *atc_event_base_new(void)
{
    /* The changelist folds the add/remove pairs of read and write interest that a proxy makes on every
     * request into one epoll_ctl per loop pass (measured: about 13% of atc's CPU went to epoll_ctl). */
    struct event_config *ec = event_config_new();
    if (ec == NULL)
        return NULL;
    event_config_set_flag(ec, EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST);
    struct event_base *base = event_base_new_with_config(ec);
    event_config_free(ec);
    return base;
}

/* Runs what other threads posted, in order. */
static void on_wake(evutil_socket_t fd, short what, void *arg)
{
    struct atc_worker *w = arg;
    uint64_t n;
    while (read(fd, &n, sizeof(n)) < 0 && errno == EINTR)
        ;
    pthread_mutex_lock(&w->mu);
    struct worker_task *t = w->tasks;
    w->tasks = NULL;
    w->tail = &w->tasks;
    pthread_mutex_unlock(&w->mu);
    while (t != NULL) {
        struct worker_task *next = t->next;
        t->fn(t->arg);
        free(t);
        t = next;
    }
}

static void run_deferred(struct atc_worker *w)
{
    struct atc_deferred *d = w->deferred;
    w->deferred = NULL;
    while (d != NULL) {
        struct atc_deferred *next = d->next;
        d->fn(d);
        d = next;
    }
}

static void on_deferred(evutil_socket_t fd, short what, void *arg)
{
    run_deferred(arg);
}

void atc_worker_defer(struct atc_worker *w, struct atc_deferred *d, void (*fn)(struct atc_deferred *d))
{
    d->fn = fn;
    d->next = w->deferred;
    if (w->deferred == NULL)
        event_active(w->defer_ev, EV_TIMEOUT, 1); /* runs after the callbacks of this loop turn */
    w->deferred = d;
}

void atc_worker_group_init(struct atc_worker_group *g)
{
    pthread_mutex_init(&g->pause_mu, NULL);
    pthread_cond_init(&g->pause_cv, NULL);
}

void atc_worker_group_dispose(struct atc_worker_group *g)
{
    pthread_mutex_destroy(&g->pause_mu);
    pthread_cond_destroy(&g->pause_cv);
}

int atc_worker_init(struct atc_worker *w, struct atc_worker_group *g, unsigned id, struct event_base *base,
                    uint64_t seed)
{
    w->group = g;
    w->id = id;
    w->base = base;
    w->tail = &w->tasks;
    /* Nothing waits yet. Set here once, and afterwards only by the queue_changed hook on this worker's
     * thread: a mailbox wake (a park, an observation, a kick) says nothing about the queue. */
    atomic_init(&w->top_priority, -1);
    atomic_init(&w->kick_posted, false);
    w->next_id = (uint64_t)id << 48; /* request ids stay unique across workers */
    w->rng = seed ^ ((uint64_t)id * 0x9e3779b97f4a7c15ull);
    pthread_mutex_init(&w->mu, NULL);
    if (id == 0)
        this_worker = w; /* worker 0 runs on the thread that sets the workers up */
    w->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (w->wake_fd < 0)
        return -1;
    if ((w->defer_ev = event_new(base, -1, 0, on_deferred, w)) == NULL)
        return -1;
    w->wake = event_new(base, w->wake_fd, EV_READ | EV_PERSIST, on_wake, w);
    return w->wake != NULL && event_add(w->wake, NULL) == 0 ? 0 : -1;
}

static void *worker_main(void *arg)
{
    struct atc_worker *w = arg;
    this_worker = w;
    event_base_loop(w->base, EVLOOP_NO_EXIT_ON_EMPTY);
    pthread_mutex_lock(&w->mu);
    w->closed = true;
    pthread_mutex_unlock(&w->mu);
    on_wake(w->wake_fd, EV_READ, w); /* tasks posted before it closed still run */
    atc_features_release();          /* the scanner's per-thread token buffer */
    struct atc_worker_group *g = w->group;
    pthread_mutex_lock(&g->pause_mu);
    w->running = false;
    pthread_cond_broadcast(&g->pause_cv); /* a pause does not wait for a worker that stopped */
    pthread_mutex_unlock(&g->pause_mu);
    return NULL;
}

int atc_worker_start(struct atc_worker *w)
{
    w->threaded = true;
    w->running = true;
    if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
        w->threaded = w->running = false;
        return -1;
    }
    return 0;
}

static void stop_loop(void *arg)
{
    struct atc_worker *w = arg;
    event_base_loopexit(w->base, NULL);
}

void atc_worker_exit_loop(struct atc_worker *w)
{
    atc_worker_post(w, stop_loop, w);
}

void atc_worker_join(struct atc_worker *w)
{
    if (!w->threaded || w->joined)
        return;
    atc_worker_exit_loop(w);
    pthread_join(w->thread, NULL);
    w->joined = true; /* threaded stays: other threads may still read it */
}

void atc_worker_free(struct atc_worker *w)
{
    run_deferred(w); /* ended after its loop's last turn (connections closed at exit) */
    /* Posted after worker 0's loop stopped (its mailbox never closes): too late to run. */
    while (w->tasks != NULL) {
        struct worker_task *next = w->tasks->next;
        free(w->tasks);
        w->tasks = next;
    }
    if (w->defer_ev != NULL)
        event_free(w->defer_ev);
    w->defer_ev = NULL;
    if (w->wake != NULL)
        event_free(w->wake);
    w->wake = NULL;
    if (w->wake_fd >= 0)
        close(w->wake_fd);
    w->wake_fd = -1;
    pthread_mutex_destroy(&w->mu);
}

static bool on_own_thread(const struct atc_worker *w)
{
    return this_worker == w;
}

int atc_worker_post(struct atc_worker *w, void (*fn)(void *arg), void *arg)
{
    if (on_own_thread(w)) {
        fn(arg);
        return 0;
    }
    struct worker_task *t = malloc(sizeof(*t));
    if (t == NULL)
        return -2;
    *t = (struct worker_task){.fn = fn, .arg = arg};
    pthread_mutex_lock(&w->mu);
    if (w->closed) {
        pthread_mutex_unlock(&w->mu);
        free(t);
        return -1;
    }
    bool was_empty = w->tasks == NULL;
    *w->tail = t;
    w->tail = &t->next;
    pthread_mutex_unlock(&w->mu);
    if (was_empty) {
        uint64_t one = 1;
        while (write(w->wake_fd, &one, sizeof(one)) < 0 && errno == EINTR)
            ;
    }
    return 0;
}

/* Runs on a worker's thread: waits there until the main thread resumes. */
static void park(void *arg)
{
    struct atc_worker *w = arg;
    struct atc_worker_group *g = w->group;
    pthread_mutex_lock(&g->pause_mu);
    g->parked++;
    pthread_cond_broadcast(&g->pause_cv);
    while (g->paused)
        pthread_cond_wait(&g->pause_cv, &g->pause_mu);
    g->parked--;
    pthread_mutex_unlock(&g->pause_mu);
}

static unsigned running_threads(const struct atc_worker_group *g)
{
    unsigned n = 0;
    for (unsigned i = 0; i < g->nworkers; i++)
        n += g->workers[i].threaded && g->workers[i].running;
    return n;
}

void atc_workers_pause(struct atc_worker_group *g)
{
    if (g->pause_depth++ > 0)
        return; /* already paused (an admin request that reloads) */
    g->parks++;
    pthread_mutex_lock(&g->pause_mu);
    g->paused = true;
    pthread_mutex_unlock(&g->pause_mu);
    for (unsigned i = 0; i < g->nworkers; i++)
        if (g->workers[i].threaded)
            atc_worker_post(&g->workers[i], park, &g->workers[i]);
    pthread_mutex_lock(&g->pause_mu);
    while (g->parked < running_threads(g))
        pthread_cond_wait(&g->pause_cv, &g->pause_mu);
    pthread_mutex_unlock(&g->pause_mu);
}

void atc_workers_resume(struct atc_worker_group *g)
{
    if (--g->pause_depth > 0)
        return;
    pthread_mutex_lock(&g->pause_mu);
    g->paused = false;
    pthread_cond_broadcast(&g->pause_cv);
    pthread_mutex_unlock(&g->pause_mu);
}

/* One atc_workers_visit: the calls still out, under its own lock (not pause_mu: a visit never waits for
 * a pause, nor a pause for it). */
struct visit {
    void (*fn)(struct atc_worker *w, void *arg);
    void *arg;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned pending; /* (mu) */
};

struct visit_task {
    struct visit *v;
    struct atc_worker *w;
};

/* Runs on the visited worker's thread, or on the caller's for a worker that is not running. */
static void visit_one(void *arg)
{
    struct visit_task *t = arg;
    struct visit *v = t->v;
    v->fn(t->w, v->arg);
    pthread_mutex_lock(&v->mu);
    if (--v->pending == 0)
        pthread_cond_signal(&v->cv);
    pthread_mutex_unlock(&v->mu);
}

void atc_workers_visit(struct atc_worker_group *g, void (*fn)(struct atc_worker *w, void *arg), void *arg)
{
    struct visit v = {.fn = fn, .arg = arg};
    struct visit_task tasks[g->nworkers > 0 ? g->nworkers : 1];
    pthread_mutex_init(&v.mu, NULL);
    pthread_cond_init(&v.cv, NULL);
    for (unsigned i = 0; i < g->nworkers; i++) {
        struct atc_worker *w = &g->workers[i];
        tasks[i] = (struct visit_task){&v, w};
        pthread_mutex_lock(&v.mu);
        v.pending++;
        pthread_mutex_unlock(&v.mu);
        /* Posted: it runs there, even if the loop stops first (worker_main runs what is left). Not
         * posted (worker 0, a pause in force, a stopped loop): it runs here, once that thread has run its
         * last task (running cleared under pause_mu, which orders its writes before these reads). */
        if (w->threaded && g->pause_depth == 0 && atc_worker_post(w, visit_one, &tasks[i]) == 0)
            continue;
        if (w->threaded && g->pause_depth == 0) {
            pthread_mutex_lock(&g->pause_mu);
            while (w->running)
                pthread_cond_wait(&g->pause_cv, &g->pause_mu);
            pthread_mutex_unlock(&g->pause_mu);
        }
        visit_one(&tasks[i]);
    }
    pthread_mutex_lock(&v.mu);
    while (v.pending > 0)
        pthread_cond_wait(&v.cv, &v.mu);
    pthread_mutex_unlock(&v.mu);
    pthread_mutex_destroy(&v.mu);
    pthread_cond_destroy(&v.cv);
}
