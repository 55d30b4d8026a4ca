/* The simulated server's model: timing, batching, prefix cache, cancel, determinism.
 * sim.c is included so that its allocations go through cmocka's leak-checking allocator. */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define malloc(n) test_malloc(n)
#define calloc(n, m) test_calloc(n, m)
#define realloc(p, n) test_realloc(p, n)
#define free(p) test_free(p)
#include "../../engine/sim/sim.c"
#undef malloc
#undef calloc
#undef realloc
#undef free

#define MAXSEQ 256
#define MAXLOG 32768

struct run {
    struct atc_sim *sim;
    uint64_t first_us[MAXSEQ]; /* first token time per user index, UINT64_MAX = none yet */
    uint64_t last_us[MAXSEQ];  /* latest token time */
    uint64_t prev_us[MAXSEQ];  /* the token before the latest */
    unsigned ntok[MAXSEQ];
    bool done[MAXSEQ];
    uint64_t ids[MAXSEQ];
    int cancel_at[MAXSEQ]; /* cancel from the callback after this many tokens; 0 = never */
    struct atc_sim_token log[MAXLOG];
    size_t nlog;
};

static void on_token(void *ctx, const struct atc_sim_token *tok)
{
    struct run *r = ctx;
    size_t u = (size_t)(uintptr_t)tok->user;
    assert_true(u < MAXSEQ);
    assert_false(r->done[u]);
    assert_int_equal(tok->index, r->ntok[u]);
    if (r->ntok[u] == 0)
        r->first_us[u] = tok->at_us;
    r->prev_us[u] = r->last_us[u];
    r->last_us[u] = tok->at_us;
    r->ntok[u]++;
    r->done[u] = tok->last;
    if (r->nlog < MAXLOG)
        r->log[r->nlog++] = *tok;
    if (r->cancel_at[u] && r->ntok[u] == (unsigned)r->cancel_at[u]) {
        atc_sim_cancel(r->sim, tok->id);
        r->done[u] = true;
    }
}

static void params(struct atc_sim_params *p)
{
    /* The documented defaults, spelled out so that the expected timings below are readable. */
    *p = (struct atc_sim_params){
        .max_seqs = 64, .prefill_tps = 15000, .decode_ms = 12, .kv_blocks = 25000, .seed = 1};
}

static struct run *run_new(const struct atc_sim_params *p)
{
    struct run *r = test_calloc(1, sizeof(*r));
    for (size_t i = 0; i < MAXSEQ; i++)
        r->first_us[i] = UINT64_MAX;
    r->sim = atc_sim_create(p, on_token, r);
    assert_non_null(r->sim);
    return r;
}

static void run_free(struct run *r)
{
    atc_sim_destroy(r->sim);
    test_free(r);
}

static void submit(struct run *r, uint64_t now, size_t user, uint32_t prompt, int64_t max_tokens,
                   const uint64_t *blocks, size_t nblocks, uint32_t block_tokens)
{
    struct atc_sim_request req = {.prompt_tokens = prompt,
                                  .max_tokens = max_tokens,
                                  .blocks = blocks,
                                  .nblocks = nblocks,
                                  .block_tokens = block_tokens};
    r->ids[user] = atc_sim_submit(r->sim, now, &req, (void *)(uintptr_t)user, NULL);
    assert_int_not_equal(r->ids[user], 0);
}

/* Runs until idle (or until @p until), event by event as a virtual-time driver would. */
static void run_until(struct run *r, uint64_t until)
{
    uint64_t t;
    while ((t = atc_sim_next_event_us(r->sim)) != UINT64_MAX && t <= until)
        atc_sim_advance(r->sim, t);
}

static void drain(struct run *r)
{
    run_until(r, UINT64_MAX - 1);
    assert_int_equal(atc_sim_next_event_us(r->sim), UINT64_MAX);
}

static void test_ttft_grows_with_prompt(void **state)
{
    struct atc_sim_params p;
    params(&p);
    struct run *r = run_new(&p);
    submit(r, 0, 0, 100, 4, NULL, 0, 0);
    drain(r);
    /* 100 tokens at 15k/s = 6667 us, plus one decode step of 12 ms at batch 1. */
    assert_int_equal(r->first_us[0], 6667 + 12000);
    submit(r, 1000000, 1, 4000, 4, NULL, 0, 0);
    drain(r);
    assert_int_equal(r->first_us[1] - 1000000, 266667 + 12000);
    assert_true(r->done[0] && r->done[1]);
    assert_int_equal(r->ntok[0], 4);
    /* Later tokens come one decode step apart. */
    assert_int_equal(r->last_us[0] - r->prev_us[0], 12000);
    run_free(r);
}

static void test_cached_prefix_shortens_ttft(void **state)
{
    struct atc_sim_params p;
    params(&p);
    struct run *r = run_new(&p);
    uint64_t blocks[62];
    for (size_t i = 0; i < 62; i++)
        blocks[i] = 1000 + i;
    submit(r, 0, 0, 4000, 2, blocks, 62, 64);
    drain(r);
    uint64_t cold = r->first_us[0];
    assert_int_equal(atc_sim_prefix_cached(r->sim, blocks, 62), 62);

    submit(r, 1000000, 1, 4000, 2, blocks, 62, 64);
    drain(r);
    uint64_t warm = r->first_us[1] - 1000000;
    /* 62 * 64 = 3968 tokens were cached: only 32 are prefilled. */
    assert_int_equal(warm, 2133 + 12000);
    assert_true(warm * 5 < cold);

    struct atc_sim_stats st;
    atc_sim_stats(r->sim, &st);
    assert_int_equal(st.prefix_queries, 8000);
    assert_int_equal(st.prefix_hits, 3968);
    /* 62 blocks of 64 tokens cost 4 KV blocks each, and what each request held past them (32 tokens of
     * tail, 2 of output: 3 blocks) stays in the LRU until evicted; nothing runs, so nothing is in use. */
    assert_int_equal(st.kv_cached, 62 * 4 + 2 * 3);
    assert_true(st.kv_usage == 0.0);
    run_free(r);
}

static void test_more_than_max_seqs_wait(void **state)
{
    struct atc_sim_params p;
    params(&p);
    p.max_seqs = 2;
    struct run *r = run_new(&p);
    for (size_t i = 0; i < 3; i++)
        submit(r, 0, i, 100, 5, NULL, 0, 0);
    atc_sim_advance(r->sim, 0);
    struct atc_sim_stats st;
    atc_sim_stats(r->sim, &st);
    assert_int_equal(st.running, 2);
    assert_int_equal(st.waiting, 1);
    drain(r);
    /* The first two were batched together; the third starts only when a slot frees. */
    assert_int_equal(r->first_us[0], r->first_us[1]);
    assert_true(r->first_us[2] > r->last_us[0]);
    assert_true(r->done[2]);
    atc_sim_stats(r->sim, &st);
    assert_int_equal(st.running, 0);
    assert_int_equal(st.waiting, 0);
    run_free(r);
}

static uint64_t steady_gap(unsigned batch)
{
    struct atc_sim_params p;
    params(&p);
    struct run *r = run_new(&p);
    for (size_t i = 0; i < batch; i++)
        submit(r, 0, i, 16, 20, NULL, 0, 0);
    drain(r);
    uint64_t gap = r->last_us[0] - r->prev_us[0];
    run_free(r);
    return gap;
}

static void test_decode_slower_at_large_batch(void **state)
{
    assert_int_equal(steady_gap(1), 12000);
    assert_int_equal(steady_gap(64), 26400); /* 2.2 x 12 ms */
    assert_int_equal(steady_gap(128), 26400);
    uint64_t mid = steady_gap(32);
    assert_true(mid > 12000 && mid < 26400);
}

static void test_cancel_frees_slot(void **state)
{
    struct atc_sim_params p;
    params(&p);
    p.max_seqs = 1;
    struct run *r = run_new(&p);
    submit(r, 0, 0, 100, 1000, NULL, 0, 0);
    submit(r, 0, 1, 100, 3, NULL, 0, 0);
    run_until(r, 100000);
    assert_true(r->ntok[0] > 0);
    assert_int_equal(r->ntok[1], 0);
    atc_sim_cancel(r->sim, r->ids[0]);
    atc_sim_cancel(r->sim, r->ids[0]); /* twice is harmless */
    struct atc_sim_stats st;
    atc_sim_stats(r->sim, &st);
    assert_int_equal(st.running, 0);
    assert_int_equal(st.waiting, 1);
    unsigned before = r->ntok[0];
    drain(r);
    assert_int_equal(r->ntok[0], before); /* nothing more for the cancelled one */
    assert_true(r->done[1]);
    /* Admitted at the end of the iteration in progress, not after 1000 tokens. */
    assert_true(r->first_us[1] < 200000);

    /* Cancelling from the callback stops the stream at once and frees the slot too. */
    r->cancel_at[2] = 3;
    submit(r, 1000000, 2, 100, 50, NULL, 0, 0);
    submit(r, 1000000, 3, 100, 2, NULL, 0, 0);
    drain(r);
    assert_int_equal(r->ntok[2], 3);
    assert_true(r->done[3]);
    assert_true(r->first_us[3] < r->last_us[2] + 50000);
    run_free(r);
}

static void test_lru_eviction_at_capacity(void **state)
{
    struct atc_sim_params p;
    params(&p);
    p.kv_blocks = 4; /* 64 tokens */
    struct run *r = run_new(&p);
    uint64_t a[2] = {1, 2}, b[2] = {3, 4};
    /* Each needs 2 blocks for its prefix plus 1 for its single output token. */
    submit(r, 0, 0, 32, 1, a, 2, 16);
    drain(r);
    assert_int_equal(atc_sim_prefix_cached(r->sim, a, 2), 2);
    submit(r, 1000000, 1, 32, 1, b, 2, 16);
    drain(r);
    /* a's deeper block went first; its head stays. */
    assert_int_equal(atc_sim_prefix_cached(r->sim, b, 2), 2);
    assert_int_equal(atc_sim_prefix_cached(r->sim, a, 2), 1);
    struct atc_sim_stats st;
    atc_sim_stats(r->sim, &st);
    assert_int_equal(st.kv_cached, 4); /* b's 2, a's head, b's output block */
    assert_int_equal(st.prefix_hits, 0);

    /* a again: one block hit (16 tokens), b's deeper block is now the oldest and goes. */
    submit(r, 2000000, 2, 32, 1, a, 2, 16);
    drain(r);
    atc_sim_stats(r->sim, &st);
    assert_int_equal(st.prefix_hits, 16);
    assert_int_equal(atc_sim_prefix_cached(r->sim, a, 2), 2);
    assert_int_equal(atc_sim_prefix_cached(r->sim, b, 2), 1);
    run_free(r);
}

/* vLLM frees a finished request's blocks to the end of its free queue, its last block first
 * (vllm/v1/core/single_type_kv_cache_manager.py free): its output blocks take LRU room after everything
 * freed before, ahead of its own prompt. */
static void test_finished_output_takes_lru_room(void **state)
{
    struct atc_sim_params p;
    params(&p);
    p.kv_blocks = 8; /* 128 tokens */
    struct run *r = run_new(&p);
    uint64_t a[2] = {1, 2}, c[2] = {3, 4}, d[3] = {5, 6, 7};
    submit(r, 0, 0, 32, 32, a, 2, 16); /* its output ends on 2 blocks */
    drain(r);
    submit(r, 1000000, 1, 32, 16, c, 2, 16); /* 1 block of output; 7 of 8 blocks cached now */
    drain(r);
    assert_int_equal(atc_sim_prefix_cached(r->sim, a, 2), 2);
    /* d needs 4: a's output goes, then a's deeper block; c, freed later, stays whole */
    submit(r, 2000000, 2, 48, 16, d, 3, 16);
    drain(r);
    assert_int_equal(atc_sim_prefix_cached(r->sim, a, 2), 1);
    assert_int_equal(atc_sim_prefix_cached(r->sim, c, 2), 2);
    assert_int_equal(atc_sim_prefix_cached(r->sim, d, 3), 3);
    run_free(r);
}

static void test_kv_full_makes_requests_wait(void **state)
{
    struct atc_sim_params p;
    params(&p);
    p.kv_blocks = 10; /* 160 tokens */
    struct run *r = run_new(&p);
    /* A 100-token prompt needs 7 blocks to start: the second cannot start beside the first. */
    submit(r, 0, 0, 100, 50, NULL, 0, 0);
    submit(r, 0, 1, 100, 50, NULL, 0, 0);
    atc_sim_advance(r->sim, 0);
    struct atc_sim_stats st;
    atc_sim_stats(r->sim, &st);
    assert_int_equal(st.running, 1);
    assert_int_equal(st.waiting, 1);
    assert_true(st.kv_usage == 0.7);
    drain(r);
    assert_true(r->first_us[1] > r->last_us[0]);
    /* A request larger than the whole cache still runs when alone. */
    submit(r, 10000000, 2, 1000, 2, NULL, 0, 0);
    drain(r);
    assert_true(r->done[2]);
    atc_sim_stats(r->sim, &st);
    assert_int_equal(st.preemptions, 0);
    run_free(r);
}

static void test_kv_growth_preempts_newest(void **state)
{
    struct atc_sim_params p;
    params(&p);
    p.kv_blocks = 20; /* 320 tokens: room for both prompts, not for both outputs */
    struct run *r = run_new(&p);
    submit(r, 0, 0, 16, 200, NULL, 0, 0);
    submit(r, 0, 1, 16, 200, NULL, 0, 0);
    run_until(r, 100000);
    struct atc_sim_stats st;
    atc_sim_stats(r->sim, &st);
    assert_int_equal(st.running, 2);
    drain(r);
    atc_sim_stats(r->sim, &st);
    assert_true(st.preemptions >= 1);
    /* Both finish with every token once (on_token checks the order); the newer one was stalled. */
    assert_true(r->done[0] && r->done[1]);
    assert_int_equal(r->ntok[0], 200);
    assert_int_equal(r->ntok[1], 200);
    assert_true(r->last_us[1] > r->last_us[0] + 500000); /* its last 56 tokens came after 0 finished */
    run_free(r);
}

static void test_chunked_prefill_keeps_decoding(void **state)
{
    struct atc_sim_params p;
    params(&p);
    struct run *r = run_new(&p);
    submit(r, 0, 0, 16, 100, NULL, 0, 0);
    run_until(r, 50000);
    /* A 20k-token prompt is prefilled in chunks of 8192 - 1 (one token goes to the decoder). */
    submit(r, 50000, 1, 20000, 2, NULL, 0, 0);
    drain(r);
    uint64_t max_gap = 0, prev = 0;
    for (size_t i = 0; i < r->nlog; i++) {
        if ((uintptr_t)r->log[i].user != 0)
            continue;
        if (r->log[i].index > 0 && r->log[i].at_us - prev > max_gap)
            max_gap = r->log[i].at_us - prev;
        prev = r->log[i].at_us;
    }
    /* 8191 tokens / 15k/s = 546 ms plus a decode step: never the whole 1.33 s prefill at once. */
    assert_int_equal(max_gap, 546067 + 12000);
    assert_true(r->done[1]);
    run_free(r);
}

static void workload(const struct atc_sim_params *p, struct atc_sim_token *log, size_t *nlog)
{
    struct run *r = run_new(p);
    uint64_t state = 42, blocks[8];
    for (size_t i = 0; i < 100; i++) {
        uint64_t now = i * 20000;
        size_t nb = atc_sim_rand(&state) % 8;
        for (size_t k = 0; k < nb; k++)
            blocks[k] = (i % 5) * 100 + k; /* five shared prefixes */
        run_until(r, now);
        submit(r, now, i, 64 + (uint32_t)(atc_sim_rand(&state) % 2000), -1, blocks, nb, 64);
    }
    drain(r);
    for (size_t i = 0; i < 100; i++) {
        assert_true(r->done[i]);
        assert_in_range(r->ntok[i], 16, 512);
    }
    *nlog = r->nlog;
    memcpy(log, r->log, r->nlog * sizeof(*log));
    run_free(r);
}

static void test_deterministic_under_seed(void **state)
{
    static struct atc_sim_token a[MAXLOG], b[MAXLOG], c[MAXLOG];
    size_t na, nb, nc;
    struct atc_sim_params p;
    params(&p);
    p.max_seqs = 8;
    workload(&p, a, &na);
    workload(&p, b, &nb);
    assert_int_equal(na, nb);
    for (size_t i = 0; i < na; i++) {
        assert_int_equal(a[i].at_us, b[i].at_us);
        assert_ptr_equal(a[i].user, b[i].user);
        assert_int_equal(a[i].index, b[i].index);
    }
    p.seed = 2;
    workload(&p, c, &nc);
    bool same = nc == na;
    for (size_t i = 0; same && i < na; i++)
        same = a[i].at_us == c[i].at_us && a[i].user == c[i].user;
    assert_false(same);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ttft_grows_with_prompt),
        cmocka_unit_test(test_cached_prefix_shortens_ttft),
        cmocka_unit_test(test_more_than_max_seqs_wait),
        cmocka_unit_test(test_decode_slower_at_large_batch),
        cmocka_unit_test(test_cancel_frees_slot),
        cmocka_unit_test(test_lru_eviction_at_capacity),
        cmocka_unit_test(test_finished_output_takes_lru_room),
        cmocka_unit_test(test_kv_full_makes_requests_wait),
        cmocka_unit_test(test_kv_growth_preempts_newest),
        cmocka_unit_test(test_chunked_prefill_keeps_decoding),
        cmocka_unit_test(test_deterministic_under_seed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
