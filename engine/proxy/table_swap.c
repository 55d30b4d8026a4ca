/* Endpoint set changes without parking (table_swap.h). */

#include "proxy/table_swap.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "base/log.h"
#include "fleet/endpoint.h"
#include "http/upstream.h"
#include "policy/policy.h"
#include "proxy/worker.h"

/* A table some worker may still read: freed once every worker has taken generation `until`. */
struct old_table {
    struct atc_endpoint_table *table;
    uint64_t until;
};

/* An endpoint that left: freed once it has nothing in flight and every worker has taken generation
 * `until`; `pools_left` counts the workers that have yet to free their pool to it (while freeing). */
struct retired {
    struct atc_endpoint *ep;
    uint64_t until;
    unsigned pools_left;
    bool freeing;
};

struct atc_table_swap {
    struct atc_worker_group *g;
    void (*on_free)(void *ctx, struct atc_endpoint *ep);
    void *ctx;
    uint64_t generation;             /* tables published (and config reloads) */
    uint64_t taken[ATC_MAX_WORKERS]; /* the latest generation each worker has answered for */
    struct old_table *old;
    size_t nold;
    struct retired *retired;
    size_t nretired;
    bool collecting; /* in atc_table_swap_collect's walk of retired[] */
    /* Out of memory in atc_worker_post (-2): tasks not posted yet (main thread), and answers not posted
     * back (pushed by any worker, taken by the main thread); atc_table_swap_collect tries again. */
    struct swap_task *unposted;
    _Atomic(struct swap_task *) unanswered;
    uint64_t posted[ATC_MAX_WORKERS]; /* the latest table generation posted to each worker (main thread) */
};

/* One task in a worker's mailbox, and its answer in worker 0's. */
struct swap_task {
    struct atc_table_swap *s;
    struct atc_worker *w;
    struct atc_endpoint_table *table; /* a swap; NULL: free w's pool to ep */
    struct atc_endpoint *ep;
    uint64_t generation;
    struct swap_task *next; /* in unposted or unanswered */
};

struct atc_table_swap *atc_table_swap_create(struct atc_worker_group *g,
                                             void (*on_free)(void *ctx, struct atc_endpoint *ep), void *ctx)
{
    struct atc_table_swap *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    s->g = g;
    s->on_free = on_free;
    s->ctx = ctx;
    return s;
}

static uint64_t all_taken(const struct atc_table_swap *s)
{
    uint64_t least = s->generation;
    for (unsigned i = 0; i < s->g->nworkers; i++)
        if (s->taken[i] < least)
            least = s->taken[i];
    return least;
}

/* Main thread: the endpoints whose pools every worker has freed. */
static void sweep(struct atc_table_swap *s)
{
    size_t kept = 0;
    for (size_t i = 0; i < s->nretired; i++) {
        struct retired *r = &s->retired[i];
        if (r->freeing && r->pools_left == 0)
            s->on_free(s->ctx, r->ep);
        else
            s->retired[kept++] = *r;
    }
    s->nretired = kept;
}

/* Main thread (posted back by a worker, or called inline for worker 0). */
static void answered(void *arg)
{
    struct swap_task *t = arg;
    struct atc_table_swap *s = t->s;
    if (t->table != NULL) {
        if (s->taken[t->w->id] < t->generation)
            s->taken[t->w->id] = t->generation;
    } else {
        for (size_t i = 0; i < s->nretired; i++)
            if (s->retired[i].ep == t->ep && s->retired[i].pools_left > 0)
                s->retired[i].pools_left--;
        if (!s->collecting)
            sweep(s);
    }
    free(t);
}

static void answer(struct swap_task *t)
{
    struct atc_table_swap *s = t->s;
    struct atc_worker *main = &s->g->workers[0];
    int rc = t->w == main ? -1 : atc_worker_post(main, answered, t);
    if (rc == -1) {
        answered(t);       /* (worker 0's own, or its loop has stopped: the process is exiting) */
    } else if (rc == -2) { /* out of memory: the main thread takes it from the next collect */
        t->next = atomic_load(&s->unanswered);
        while (!atomic_compare_exchange_weak(&s->unanswered, &t->next, t))
            ;
    }
}

/* On the worker's own thread, between two callbacks: nothing of the request path runs meanwhile. */
static void on_task(void *arg)
{
    struct swap_task *t = arg;
    struct atc_worker *w = t->w;
    if (t->table != NULL) {
        w->table = t->table;
        char *err = NULL;
        if (w->policy != NULL && atc_policy_update_table(w->policy, t->table, &err) == 0)
            atc_error("endpoint set change: the policy did not take it on worker %u (%s); the C balancer "
                      "routes there until it reloads",
                      w->id, err != NULL ? err : "out of memory");
        free(err);
    } else {
        atc_upstream_pool_destroy(t->ep->pools[w->id]); /* its connections are this loop's */
        t->ep->pools[w->id] = NULL;
    }
    answer(t);
}

/* Posts @p t to its worker; a worker that cannot take it (its loop has stopped) counts as done; out of
 * memory, it waits in unposted for the next collect (not counted: the worker has not taken it). A table
 * older than one posted to the worker since is not posted (mailboxes keep their order: never backwards). */
static void post(struct swap_task *t)
{
    struct atc_table_swap *s = t->s;
    unsigned i = t->w->id;
    if (t->table != NULL && t->generation <= s->posted[i]) {
        free(t);
        return;
    }
    bool swap = t->table != NULL;
    uint64_t generation = t->generation; /* (t is the worker's once posted: it may be freed already) */
    int rc = atc_worker_post(t->w, on_task, t);
    if (rc == -2) {
        t->next = s->unposted;
        s->unposted = t;
        return;
    }
    if (swap)
        s->posted[i] = generation;
    if (rc < 0)
        answered(t);
}

int atc_table_swap_publish(struct atc_table_swap *s, struct atc_endpoint_table *old,
                           struct atc_endpoint_table *t)
{
    unsigned n = s->g->nworkers;
    struct swap_task *tasks[ATC_MAX_WORKERS] = {0};
    struct old_table *o = realloc(s->old, (s->nold + 1) * sizeof(*o));
    if (o == NULL)
        return -1;
    s->old = o;
    for (unsigned i = 0; i < n; i++)
        if ((tasks[i] = malloc(sizeof(*tasks[i]))) == NULL) {
            for (unsigned k = 0; k < i; k++)
                free(tasks[k]);
            return -1;
        }
    uint64_t generation = ++s->generation;
    s->old[s->nold++] = (struct old_table){.table = old, .until = generation};
    for (unsigned i = 0; i < n; i++) {
        *tasks[i] = (struct swap_task){.s = s, .w = &s->g->workers[i], .table = t, .generation = generation};
        post(tasks[i]); /* worker 0's at once */
    }
    return 0;
}

void atc_table_swap_taken_by_all(struct atc_table_swap *s)
{
    s->generation++;
    for (unsigned i = 0; i < s->g->nworkers; i++)
        s->taken[i] = s->posted[i] = s->generation; /* (a swap not posted yet is older: dropped) */
}

/* Main thread: what atc_worker_post could not take for want of memory, again. */
static void retry(struct atc_table_swap *s)
{
    struct swap_task *t = atomic_exchange(&s->unanswered, NULL);
    while (t != NULL) {
        struct swap_task *next = t->next;
        answered(t);
        t = next;
    }
    t = s->unposted;
    s->unposted = NULL;
    while (t != NULL) { /* (post may put it back) */
        struct swap_task *next = t->next;
        post(t);
        t = next;
    }
}

int atc_table_swap_retire(struct atc_table_swap *s, struct atc_endpoint *ep)
{
    struct retired *r = realloc(s->retired, (s->nretired + 1) * sizeof(*r));
    if (r == NULL)
        return -1;
    s->retired = r;
    s->retired[s->nretired++] = (struct retired){.ep = ep, .until = s->generation};
    return 0;
}

void atc_table_swap_collect(struct atc_table_swap *s, bool idle)
{
    s->collecting = true; /* (answered does not sweep: this does, below) */
    retry(s);
    uint64_t taken = all_taken(s);
    size_t kept = 0;
    for (size_t i = 0; i < s->nold; i++) {
        if (idle && s->old[i].until <= taken)
            atc_endpoint_table_free_shell(s->old[i].table);
        else
            s->old[kept++] = s->old[i];
    }
    s->nold = kept;

    /* An endpoint's tasks are made first (all, or none: it waits for the next call). Worker 0's answer
     * runs inline: it does not sweep the list while this walks it. None while a policy build runs: it
     * reads the endpoints (and their health) of the table it began with. Once the tasks are posted, a
     * build that begins takes a table without the endpoint: freeing it (sweep) no longer waits. */
    unsigned n = s->g->nworkers;
    for (size_t i = 0; idle && i < s->nretired; i++) {
        struct retired *r = &s->retired[i];
        struct swap_task *tasks[ATC_MAX_WORKERS];
        if (r->freeing || r->until > taken || atomic_load(&r->ep->inflight) > 0 ||
            atomic_load(&r->ep->side_requests) > 0)
            continue;
        unsigned made = 0;
        while (made < n && (tasks[made] = malloc(sizeof(*tasks[made]))) != NULL)
            made++;
        if (made < n) {
            while (made > 0)
                free(tasks[--made]);
            continue;
        }
        r->freeing = true;
        r->pools_left = n;
        for (unsigned k = 0; k < n; k++)
            *tasks[k] = (struct swap_task){.s = s, .w = &s->g->workers[k], .ep = r->ep};
        for (unsigned k = 0; k < n; k++)
            post(tasks[k]);
    }
    s->collecting = false;
    sweep(s);
}

size_t atc_table_swap_retired(const struct atc_table_swap *s)
{
    return s->nretired;
}

void atc_table_swap_destroy(struct atc_table_swap *s)
{
    if (s == NULL)
        return;
    for (size_t i = 0; i < s->nold; i++)
        atc_endpoint_table_free_shell(s->old[i].table);
    for (size_t i = 0; i < s->nretired; i++)
        s->on_free(s->ctx, s->retired[i].ep); /* (the workers have joined: on_free frees the pools too) */
    for (struct swap_task *t = s->unposted, *next; t != NULL; t = next) {
        next = t->next;
        free(t);
    }
    for (struct swap_task *t = atomic_load(&s->unanswered), *next; t != NULL; t = next) {
        next = t->next;
        free(t);
    }
    free(s->old);
    free(s->retired);
    free(s);
}
