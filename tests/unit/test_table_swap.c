/* Endpoint set changes through the workers' mailboxes (proxy/table_swap.h) when a mailbox runs out of
 * memory: the worker has not taken the table, so what it still reads is not freed, and the swap reaches
 * it from a later collect, never after a newer one. The mailboxes are fakes run by hand (worker 0, the
 * main thread, runs its own posts at once, as atc_worker_post does on its own thread). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define atc_worker_post fake_post
#include "../../engine/proxy/table_swap.c"
#undef atc_worker_post

#define NWORKERS 2
#define MAXQ 16

static struct {
    struct {
        void (*fn)(void *arg);
        void *arg;
    } q[NWORKERS][MAXQ];
    size_t nq[NWORKERS];
    unsigned fail[NWORKERS]; /* posts to refuse for want of memory */
} mb;

int fake_post(struct atc_worker *w, void (*fn)(void *arg), void *arg)
{
    if (mb.fail[w->id] > 0) {
        mb.fail[w->id]--;
        return -2;
    }
    if (w->id == 0 && fn != answered) { /* worker 0's own post: at once (answers come back queued) */
        fn(arg);
        return 0;
    }
    assert_true(mb.nq[w->id] < MAXQ);
    mb.q[w->id][mb.nq[w->id]].fn = fn;
    mb.q[w->id][mb.nq[w->id]++].arg = arg;
    return 0;
}

/* Runs worker @p id's mailbox (answers to worker 0 land in its own). */
static void run(unsigned id)
{
    for (size_t i = 0; i < mb.nq[id]; i++)
        mb.q[id][i].fn(mb.q[id][i].arg);
    mb.nq[id] = 0;
}

static void never_freed(void *ctx, struct atc_endpoint *ep)
{
    (void)ctx;
    (void)ep;
    fail_msg("no endpoint is retired here");
}

struct fixture {
    struct atc_worker workers[NWORKERS];
    struct atc_worker_group g;
    struct atc_table_swap *s;
};

static struct fixture *setup(struct atc_endpoint_table *first)
{
    static struct fixture f;
    memset(&f, 0, sizeof(f));
    memset(&mb, 0, sizeof(mb));
    for (unsigned i = 0; i < NWORKERS; i++) {
        f.workers[i].id = i;
        f.workers[i].table = first;
    }
    f.g.workers = f.workers;
    f.g.nworkers = NWORKERS;
    f.s = atc_table_swap_create(&f.g, never_freed, NULL);
    assert_non_null(f.s);
    return &f;
}

static struct atc_endpoint_table *table(void)
{
    struct atc_endpoint_table *t = calloc(1, sizeof(*t));
    assert_non_null(t);
    return t;
}

static void test_a_swap_its_mailbox_refused_is_posted_again_and_the_old_table_waits(void **state)
{
    (void)state;
    struct atc_endpoint_table *t0 = table(), *t1 = table();
    struct fixture *f = setup(t0);
    mb.fail[1] = 1;
    assert_int_equal(atc_table_swap_publish(f->s, t0, t1), 0);
    assert_ptr_equal(f->workers[0].table, t1);
    assert_ptr_equal(f->workers[1].table, t0); /* not posted */
    run(0);
    atc_table_swap_collect(f->s, true); /* posts it again; t0 stays: worker 1 reads it still */
    assert_int_equal(f->s->nold, 1);
    assert_ptr_equal(f->workers[1].table, t0);
    mb.fail[0] = 1; /* its answer is refused too: it comes back from the next collect */
    run(1);
    assert_ptr_equal(f->workers[1].table, t1);
    assert_int_equal(mb.nq[0], 0);
    assert_int_equal(f->s->nold, 1);
    atc_table_swap_collect(f->s, true); /* the answer that waited: t0 is freed */
    assert_int_equal(f->s->nold, 0);
    atc_table_swap_destroy(f->s);
    free(t1);
}

static void test_a_swap_posted_again_never_replaces_a_newer_one(void **state)
{
    (void)state;
    struct atc_endpoint_table *t0 = table(), *t1 = table(), *t2 = table();
    struct fixture *f = setup(t0);
    mb.fail[1] = 1;
    assert_int_equal(atc_table_swap_publish(f->s, t0, t1), 0);
    assert_int_equal(atc_table_swap_publish(f->s, t1, t2), 0);
    run(1);
    assert_ptr_equal(f->workers[1].table, t2);
    run(0);
    atc_table_swap_collect(f->s, true); /* t1's swap is dropped, not posted after t2's */
    assert_int_equal(mb.nq[1], 0);
    assert_ptr_equal(f->workers[1].table, t2);
    assert_int_equal(f->s->nold, 0);
    atc_table_swap_destroy(f->s);
    free(t2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_swap_its_mailbox_refused_is_posted_again_and_the_old_table_waits),
        cmocka_unit_test(test_a_swap_posted_again_never_replaces_a_newer_one),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
