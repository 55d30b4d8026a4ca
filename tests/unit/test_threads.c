/* What worker threads share, hammered from two threads at once: the affinity table and the prefix index
 * (a mutex each), the endpoint counters (atomics), the recorder and the metrics. Each test checks a
 * result that lost or torn updates would change, not just that nothing crashed; build with
 * -fsanitize=thread to see the races themselves.
 *
 * The real allocator, not cmocka's: test_malloc keeps a list that is not thread-safe. Likewise no cmocka
 * assertion runs on the hammering threads (a failure longjmps to the test's stack): they count what
 * went wrong and the test asserts on the counts. */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "base/clock.h"
#include "fleet/affinity.h"
#include "config/config.h"
#include "fleet/endpoint.h"
#include "fleet/health.h"
#include "ops/metrics.h"
#include "proxy/worker.h"
#include "trace/recorder.h"
#include "core/server.h"
#include "trace/trace.h"
#include "trace/trace_import.h"

/* Each hammer runs about 0.2 s and must get MIN_OPS done on each thread, so that the two overlap a lot.
 * ThreadSanitizer makes every access several times slower, and tests/run's TSan stage shares the machine
 * with other tests: there, a hammer runs longer and needs fewer operations. */
#if defined(__SANITIZE_THREAD__)
#define HAMMER_NS 500000000
#define MIN_OPS 200
#else
#define HAMMER_NS 200000000
#define MIN_OPS 1000
#endif

static uint64_t mix(uint64_t x)
{
    x += UINT64_C(0x9e3779b97f4a7c15);
    x = (x ^ (x >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    x = (x ^ (x >> 27)) * UINT64_C(0x94d049bb133111eb);
    return x ^ (x >> 31);
}

/* Runs fn(&args[0]) and fn(&args[1]) on two threads and waits for both. */
static void run_two(void *(*fn)(void *), void *args, size_t argsize)
{
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, fn, (char *)args + i * argsize), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
}

/* ---- affinity table ---- */

#define SHARED_KEYS 64

struct affinity_arg {
    struct atc_affinity *big, *small; /* small: SHARED_KEYS / 2 entries, so sets evict */
    unsigned thread;
    uint64_t ops, own_mismatches, shared_bad;
};

/* The id stored for shared key k always names k, whichever thread wrote it, with a tail of varying
 * length so that updates go both in place and through a new entry. */
static int shared_id(char *out, size_t size, unsigned k, unsigned thread, uint64_t i)
{
    return snprintf(out, size, "k%u-t%u-%.*s", k, thread, (int)(i % 40),
                    "0123456789012345678901234567890123456789");
}

/* True when @p id (@p n bytes as returned) is one that shared_id could have written for key @p k. */
static bool names_key(const char *id, size_t n, unsigned k)
{
    char prefix[16];
    int p = snprintf(prefix, sizeof(prefix), "k%u-t", k);
    return n == strlen(id) && n >= (size_t)p + 2 && memcmp(id, prefix, (size_t)p) == 0 &&
           (id[p] == '0' || id[p] == '1') && id[p + 1] == '-';
}

static void *affinity_hammer(void *p)
{
    struct affinity_arg *a = p;
    uint64_t until = atc_mono_ns() + HAMMER_NS;
    char key[32], id[ATC_AFFINITY_ID_MAX + 1], got[ATC_AFFINITY_ID_MAX + 1];
    for (uint64_t i = 0;; i++) {
        if ((i & 255) == 0 && atc_mono_ns() >= until)
            break;
        uint64_t r = mix(i << 1 | a->thread);
        /* A key of this thread's own in the big table (never evicted): reads back what was just set. */
        int klen = snprintf(key, sizeof(key), "own-%u-%u", a->thread, (unsigned)(r % 1000));
        snprintf(id, sizeof(id), "ep-%llu", (unsigned long long)i);
        a->own_mismatches += atc_affinity_set(a->big, key, (size_t)klen, id, UINT64_MAX) != 0;
        size_t n = atc_affinity_get(a->big, key, (size_t)klen, 1, got, sizeof(got));
        a->own_mismatches += n != strlen(id) || strcmp(got, id) != 0;

        /* Keys both threads set, get and delete, in both tables. */
        unsigned k = (unsigned)((r >> 20) % SHARED_KEYS);
        klen = snprintf(key, sizeof(key), "shared-%u", k);
        struct atc_affinity *t = (r >> 40) & 1 ? a->big : a->small;
        switch ((r >> 41) % 4) {
        case 0:
        case 1:
            shared_id(id, sizeof(id), k, a->thread, i);
            a->shared_bad += atc_affinity_set(t, key, (size_t)klen, id, UINT64_MAX) != 0;
            break;
        case 2:
            n = atc_affinity_get(t, key, (size_t)klen, 1, got, sizeof(got));
            a->shared_bad += n > 0 && !names_key(got, n, k);
            a->shared_bad += n == 0 && got[0] != '\0';
            break;
        case 3:
            atc_affinity_del(t, key, (size_t)klen);
            break;
        }
        a->ops++;
    }
    return NULL;
}

static void test_affinity_from_two_threads(void **state)
{
    struct atc_affinity *big = atc_affinity_create(0), *small = atc_affinity_create(SHARED_KEYS / 2);
    struct affinity_arg args[2] = {{big, small, 0, 0, 0, 0}, {big, small, 1, 0, 0, 0}};
    run_two(affinity_hammer, args, sizeof(args[0]));
    for (int i = 0; i < 2; i++) {
        assert_true(args[i].ops > MIN_OPS);
        assert_int_equal(args[i].own_mismatches, 0);
        assert_int_equal(args[i].shared_bad, 0);
    }
    /* Both tables still hold together: bounded, and every entry reads back as what was written. */
    assert_true(atc_affinity_count(small) <= SHARED_KEYS / 2);
    assert_true(atc_affinity_count(big) <= 2 * 1000 + SHARED_KEYS);
    char key[32], got[ATC_AFFINITY_ID_MAX + 1];
    size_t found = 0;
    for (unsigned k = 0; k < SHARED_KEYS; k++) {
        int klen = snprintf(key, sizeof(key), "shared-%u", k);
        size_t n = atc_affinity_get(small, key, (size_t)klen, 1, got, sizeof(got));
        assert_true(n == 0 || names_key(got, n, k));
        found += n > 0;
    }
    assert_int_equal(found, atc_affinity_count(small)); /* every entry is reachable through its key */
    assert_int_equal(atc_affinity_set(small, "after", 5, "ep", UINT64_MAX), 0);
    assert_int_equal(atc_affinity_get(small, "after", 5, 1, got, sizeof(got)), 2);
    atc_affinity_destroy(big);
    atc_affinity_destroy(small);
}

/* ---- prefix index ---- */

#define CHAIN 8

struct prefix_arg {
    struct atc_prefix_index *idx;
    unsigned thread; /* also the endpoint index it records */
    bool rotating;   /* a small index: strict read-back cannot be expected */
    uint64_t ops, short_reads, crossed;
};

static void *prefix_hammer(void *p)
{
    struct prefix_arg *a = p;
    uint64_t until = atc_mono_ns() + HAMMER_NS;
    uint64_t blocks[CHAIN];
    uint16_t out[2];
    /* Without rotation, the index holds 500,000 blocks: stop before that many are inserted in all. */
    uint64_t max_chains = a->rotating ? UINT64_MAX : 500000 / CHAIN / 2 - 1;
    for (uint64_t i = 0; i < max_chains; i++) {
        /* (MIN_OPS at least, however long: the index's table is large and each new block's first touch
         * faults a page in, 12 us each on some virtual machines, which left 512 chains in 0.2 s) */
        if ((i & 255) == 0 && atc_mono_ns() >= until && i > MIN_OPS)
            break;
        /* Chains of this thread only: its blocks never belong to the other endpoint. */
        for (size_t k = 0; k < CHAIN; k++)
            blocks[k] = mix((uint64_t)a->thread << 62 | i << 8 | k);
        atc_prefix_index_insert(a->idx, blocks, CHAIN, a->thread, 64, 0);
        atc_prefix_index_overlaps(a->idx, blocks, CHAIN, out, 2);
        a->short_reads += out[a->thread] != CHAIN;
        a->crossed += out[1 - a->thread] != 0;
        /* And a chain the other thread may be writing now: whatever is found of it is its endpoint's. */
        for (size_t k = 0; k < CHAIN; k++)
            blocks[k] = mix((uint64_t)(1 - a->thread) << 62 | (i / 2) << 8 | k);
        atc_prefix_index_overlaps(a->idx, blocks, CHAIN, out, 2);
        a->crossed += out[a->thread] != 0;
        a->ops++;
    }
    return NULL;
}

static void test_prefix_index_from_two_threads(void **state)
{
    /* The default size does not rotate within the run: every chain reads back whole, right away. */
    struct atc_prefix_index *idx = atc_prefix_index_create(0);
    struct prefix_arg args[2] = {{idx, 0, false, 0, 0, 0}, {idx, 1, false, 0, 0, 0}};
    run_two(prefix_hammer, args, sizeof(args[0]));
    for (int i = 0; i < 2; i++) {
        assert_int_equal(args[i].short_reads, 0);
        assert_int_equal(args[i].crossed, 0);
    }
    assert_int_equal(atc_prefix_index_count(idx), (args[0].ops + args[1].ops) * CHAIN);
    atc_prefix_index_destroy(idx);
}

static void test_prefix_index_rotating_under_two_threads(void **state)
{
    /* 4,096 blocks: a rotation every 256 chains, while the other thread reads. */
    struct atc_prefix_index *idx = atc_prefix_index_create(4096);
    struct prefix_arg args[2] = {{idx, 0, true, 0, 0, 0}, {idx, 1, true, 0, 0, 0}};
    run_two(prefix_hammer, args, sizeof(args[0]));
    for (int i = 0; i < 2; i++) {
        assert_true(args[i].ops > MIN_OPS);
        assert_int_equal(args[i].crossed, 0);
        assert_true(args[i].short_reads < args[i].ops / 10); /* dropped only by a double rotation between */
    }
    assert_true(atc_prefix_index_count(idx) <= 4096);
    uint64_t blocks[CHAIN] = {1, 2, 3, 4, 5, 6, 7, 8};
    uint16_t out[2];
    atc_prefix_index_insert(idx, blocks, CHAIN, 1, 64, 0);
    atc_prefix_index_overlaps(idx, blocks, CHAIN, out, 2);
    assert_int_equal(out[1], CHAIN);
    atc_prefix_index_destroy(idx);
}

/* ---- endpoint counters ---- */

#define ACQUIRES 200000

struct endpoint_arg {
    struct atc_endpoint *ep;
    pthread_barrier_t *acquired, *checked;
    uint64_t tokens;
};

static void *endpoint_hammer(void *p)
{
    struct endpoint_arg *a = p;
    for (int i = 0; i < ACQUIRES; i++)
        atc_endpoint_acquire(a->ep, a->tokens);
    pthread_barrier_wait(a->acquired); /* the test reads the counters between the two */
    pthread_barrier_wait(a->checked);
    for (int i = 0; i < ACQUIRES; i++) {
        atc_endpoint_release(a->ep, a->tokens);
        atc_endpoint_record(a->ep, i % 4 != 0, 10.0);
    }
    return NULL;
}

static void test_endpoint_counters_from_two_threads(void **state)
{
    static struct atc_model_config model = {.name = "m"};
    struct atc_config cfg = {.models = &model, .nmodels = 1};
    struct atc_endpoint_table *t = atc_endpoint_table_create(&cfg);
    struct atc_endpoint *ep = atc_endpoint_table_add(t, "m", "a", "127.0.0.1", 9001, 4);
    assert_non_null(ep);
    pthread_barrier_t acquired, checked;
    pthread_barrier_init(&acquired, NULL, 3);
    pthread_barrier_init(&checked, NULL, 3);
    struct endpoint_arg args[2] = {{ep, &acquired, &checked, 3}, {ep, &acquired, &checked, 1000}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, endpoint_hammer, &args[i]), 0);
    pthread_barrier_wait(&acquired);
    /* Lost increments would show here (at the end, releases saturating at 0 would hide them). */
    assert_int_equal(ep->inflight, 2 * ACQUIRES);
    assert_int_equal(ep->inflight_tokens, (uint64_t)ACQUIRES * (3 + 1000));
    pthread_barrier_wait(&checked);
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
    assert_int_equal(ep->inflight, 0);
    assert_int_equal(ep->inflight_tokens, 0);
    assert_int_equal(ep->requests_total, 2 * ACQUIRES);
    assert_int_equal(ep->errors_total, 2 * ACQUIRES / 4);
    assert_true(ep->ttft_ewma_ms == 10.0);
    pthread_barrier_destroy(&acquired);
    pthread_barrier_destroy(&checked);
    atc_endpoint_table_destroy(t);
}

/* Two workers racing for an endpoint's last slots: a take never goes past its capacity. */
#define CAPACITY 2

static void *slot_hammer(void *p)
{
    struct atc_endpoint *ep = p;
    unsigned over = 0;
    for (int i = 0; i < ACQUIRES; i++) {
        if (!atc_endpoint_try_acquire(ep, 1))
            continue;
        over += atomic_load(&ep->inflight) > CAPACITY;
        atc_endpoint_release(ep, 1);
    }
    return (void *)(uintptr_t)over;
}

static void test_try_acquire_never_passes_capacity(void **state)
{
    static struct atc_model_config model = {.name = "m"};
    struct atc_config cfg = {.models = &model, .nmodels = 1};
    struct atc_endpoint_table *t = atc_endpoint_table_create(&cfg);
    struct atc_endpoint *ep = atc_endpoint_table_add(t, "m", "a", "127.0.0.1", 9001, CAPACITY);
    assert_non_null(ep);
    ep->routable = true;
    pthread_t th[3];
    for (int i = 0; i < 3; i++)
        assert_int_equal(pthread_create(&th[i], NULL, slot_hammer, ep), 0);
    for (int i = 0; i < 3; i++) {
        void *over = NULL;
        assert_int_equal(pthread_join(th[i], &over), 0);
        assert_int_equal((uintptr_t)over, 0);
    }
    assert_int_equal(ep->inflight, 0);
    assert_false(atc_endpoint_try_acquire(ep, 1) && atc_endpoint_try_acquire(ep, 1) &&
                 atc_endpoint_try_acquire(ep, 1)); /* the third is over capacity */
    atc_endpoint_table_destroy(t);
}

/* ---- health text (ep->health's last error) ---- */

/* Two texts of different lengths and letters: a torn read (part of one, part of the other, or a tail
 * left over from the longer one) matches neither. */
#define TEXT_A "live check: GET /health: answered 500"
#define TEXT_B                                                                                               \
    "ejected for 3.0s: 5 requests in a row failed (connection failures, timeouts or 5xx) ##########"

struct text_arg {
    bool writer;
    struct atc_health_text *t;
    _Atomic bool *stop;
    uint64_t ops, bad;
};

static void *text_writer(void *p)
{
    struct text_arg *a = p;
    uint64_t until = atc_mono_ns() + HAMMER_NS;
    for (uint64_t i = 0; atc_mono_ns() < until; i++, a->ops++) {
        atc_health_text_set(a->t, i % 2 ? TEXT_A : TEXT_B);
        /* Health writes once per probe at most; back to back writes would starve the reader, which
         * retries while a write is under way. A pause still lets most reads overlap a write. */
        for (volatile int k = 0; k < 200; k++)
            ;
    }
    atomic_store(a->stop, true);
    return NULL;
}

static void *text_reader(void *p)
{
    struct text_arg *a = p;
    char out[ATC_HEALTH_TEXT_WORDS * 8];
    while (!atomic_load(a->stop)) {
        size_t n = atc_health_text_get(a->t, out, sizeof(out));
        a->bad += !(n == 0 && out[0] == '\0') && !(n == strlen(TEXT_A) && strcmp(out, TEXT_A) == 0) &&
                  !(n == strlen(TEXT_B) && strcmp(out, TEXT_B) == 0);
        a->ops++;
    }
    return NULL;
}

static void *text_hammer(void *p)
{
    struct text_arg *a = p;
    return a->writer ? text_writer(p) : text_reader(p);
}

static void test_health_text_read_while_written(void **state)
{
    static struct atc_health_text t; /* zero: "" */
    _Atomic bool stop = false;
    struct text_arg args[2] = {{true, &t, &stop, 0, 0}, {false, &t, &stop, 0, 0}};
    run_two(text_hammer, args, sizeof(args[0]));
    assert_true(args[0].ops > MIN_OPS);
    assert_true(args[1].ops > MIN_OPS / 10);
    assert_int_equal(args[1].bad, 0);
    char out[8];
    assert_int_equal(atc_health_text_get(&t, out, sizeof(out)), 7); /* cut to fit */
}

/* ---- metrics ---- */

#define METRIC_REQUESTS 200000

static void *metrics_hammer(void *p)
{
    static const char *const endpoints[] = {"e0", "e1", "e2", "e3", "e4"};
    struct atc_metrics *m = p;
    for (int i = 0; i < METRIC_REQUESTS; i++) {
        /* Five series, the first request of each creating it while the other thread adds. */
        struct atc_request_metrics r = {.model = "m",
                                        .endpoint = endpoints[i % 5],
                                        .status = 200,
                                        .ttft_s = 0.01,
                                        .total_s = 0.2,
                                        .bytes = 10};
        atc_metrics_request(m, &r);
        atc_metrics_decision(m, 2e-5, i % 10 == 0 ? atc_policy_fallback_budget : NULL);
    }
    return NULL;
}

static void test_metrics_from_two_threads(void **state)
{
    struct atc_metrics *m = atc_metrics_create();
    static struct atc_model_config model = {.name = "m"};
    struct atc_config cfg = {.models = &model, .nmodels = 1};
    struct atc_endpoint_table *table = atc_endpoint_table_create(&cfg);
    struct atc_metrics_sources src = {.table = table};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, metrics_hammer, m), 0);
    struct evbuffer *out = evbuffer_new();
    atc_metrics_render(m, &src, out); /* while they add */
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
    evbuffer_drain(out, evbuffer_get_length(out));
    atc_metrics_render(m, &src, out);
    evbuffer_add(out, "", 1);
    const char *text = (const char *)evbuffer_pullup(out, -1);
    char line[128];
    for (int e = 0; e < 5; e++) {
        snprintf(line, sizeof(line),
                 "atc_requests_total{model=\"m\",endpoint=\"e%d\",status=\"200\",priority=\"0\"} %d\n", e,
                 2 * METRIC_REQUESTS / 5);
        assert_non_null(strstr(text, line));
    }
    snprintf(line, sizeof(line), "atc_policy_decision_seconds_count %d\n", 2 * METRIC_REQUESTS);
    assert_non_null(strstr(text, line));
    snprintf(line, sizeof(line), "atc_policy_fallbacks_total{reason=\"overrun\"} %d\n",
             2 * METRIC_REQUESTS / 10);
    assert_non_null(strstr(text, line));
    snprintf(line, sizeof(line), "atc_relayed_bytes_total %d\n", 2 * METRIC_REQUESTS * 10);
    assert_non_null(strstr(text, line));
    evbuffer_free(out);
    atc_endpoint_table_destroy(table);
    atc_metrics_destroy(m);
}

/* ---- recorder ---- */

#define RECORDS 20000

struct recorder_arg {
    struct atc_recorder *rec;
    unsigned thread;
};

static void *recorder_hammer(void *p)
{
    struct recorder_arg *a = p;
    uint64_t blocks[3] = {a->thread, a->thread + 1, a->thread + 2};
    char prompt[64];
    for (int i = 0; i < RECORDS; i++) {
        struct atc_trace_record r;
        atc_trace_record_init(&r);
        char id[32];
        snprintf(id, sizeof(id), "t%u-%d", a->thread, i);
        int plen = snprintf(prompt, sizeof(prompt), "prompt of %s", id);
        r.id = id;
        r.model = a->thread ? "model-one" : "m0";
        r.prompt_tokens = (uint32_t)i;
        r.blocks = blocks;
        r.nblocks = 3;
        r.block_tokens = 64;
        r.prompt = prompt;
        r.prompt_len = (size_t)plen;
        r.status = 200;
        atc_recorder_add(a->rec, &r, (uint64_t)i);
    }
    return NULL;
}

static char dir[] = "/tmp/atc-test-threads-XXXXXX";

static int make_dir(void **state)
{
    return mkdtemp(dir) == NULL ? -1 : 0;
}

static int remove_dir(void **state) /* runs even when the test failed */
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_recorder_from_two_threads(void **state)
{
    struct atc_recorder_settings s = {.dir = dir,
                                      .prefix = "t",
                                      .rotate_size = 64 << 20,
                                      .rotate_interval_ms = 3600000,
                                      .text = true,
                                      .buffer = 64 << 20, /* room for everything: nothing dropped */
                                      .sample = 1};
    struct atc_recorder *rec = atc_recorder_create(&s);
    assert_non_null(rec);
    struct recorder_arg args[2] = {{rec, 0}, {rec, 1}};
    run_two(recorder_hammer, args, sizeof(args[0]));
    struct atc_recorder_stats st;
    atc_recorder_stats(rec, &st);
    assert_int_equal(st.recorded, 2 * RECORDS);
    assert_int_equal(st.dropped, 0);
    atc_recorder_destroy(rec);

    /* Every record whole, and each thread's in the order it added them. */
    struct atc_trace *t;
    char *err = NULL;
    assert_int_equal(atc_trace_load(dir, NULL, &t, NULL, &err), 0);
    assert_int_equal(t->n, 2 * RECORDS);
    int next[2] = {0, 0};
    for (size_t i = 0; i < t->n; i++) {
        const struct atc_trace_record *r = &t->records[i];
        unsigned th;
        int n;
        assert_int_equal(sscanf(r->id, "t%u-%d", &th, &n), 2);
        assert_true(th < 2);
        assert_string_equal(r->model, th ? "model-one" : "m0");
        assert_int_equal(r->prompt_tokens, n);
        assert_int_equal(r->nblocks, 3);
        assert_int_equal(r->blocks[2], th + 2);
        char prompt[64];
        int plen = snprintf(prompt, sizeof(prompt), "prompt of %s", r->id);
        assert_int_equal(r->prompt_len, plen);
        assert_memory_equal(r->prompt, prompt, (size_t)plen);
        assert_true(n >= next[th]);
        next[th] = n + 1;
    }
    atc_trace_free(t);

    /* Sampling draws from both threads too: every record is either kept or counted out. */
    s.sample = 0.5;
    rec = atc_recorder_create(&s);
    args[0].rec = args[1].rec = rec;
    run_two(recorder_hammer, args, sizeof(args[0]));
    atc_recorder_stats(rec, &st);
    assert_int_equal(st.recorded + st.sampled_out, 2 * RECORDS);
    assert_in_range(st.recorded, 2 * RECORDS * 4 / 10, 2 * RECORDS * 6 / 10);
    atc_recorder_destroy(rec);
}

/* A read of the workers (atc_workers_visit, what /metrics and the admin API read through) stops none of
 * them: while worker 1 is busy and the visit waits for it, worker 2 runs what is posted to it. (Through
 * atc_workers_pause, worker 2 would be parked until worker 1 parked too, and its task would wait.) Each
 * visit runs on its worker's own thread. */
struct visit_state {
    atomic_int gate;    /* worker 1's busy task returns once it is 1 */
    atomic_int ran;     /* worker 2's task ran */
    atomic_int visited; /* visits made on the visited worker's own thread */
    pthread_t task_thread[3], visit_thread[3]; /* where the posted tasks and the visits ran, by worker */
    struct atc_worker *workers;
};

static void busy_task(void *arg)
{
    struct visit_state *vs = arg;
    vs->task_thread[1] = pthread_self();
    uint64_t deadline = atc_mono_ms() + 5000;
    while (!atomic_load(&vs->gate) && atc_mono_ms() < deadline)
        ;
}

static void ran_task(void *arg)
{
    struct visit_state *vs = arg;
    vs->task_thread[2] = pthread_self();
    atomic_store(&vs->ran, 1);
}

/* A thread beside the visit: posts to worker 2, waits (2 s at most) for it to run, then lets worker 1 go. */
static void *poster(void *arg)
{
    struct visit_state *vs = arg;
    atc_worker_post(&vs->workers[2], ran_task, vs);
    uint64_t deadline = atc_mono_ms() + 2000;
    while (!atomic_load(&vs->ran) && atc_mono_ms() < deadline)
        ;
    atomic_store(&vs->ran, atomic_load(&vs->ran) ? 2 : 0); /* 2: ran while worker 1 was still busy */
    atomic_store(&vs->gate, 1);
    return NULL;
}

static void on_visit(struct atc_worker *w, void *arg)
{
    struct visit_state *vs = arg;
    vs->visit_thread[w->id] = pthread_self();
    atomic_fetch_add(&vs->visited, 1);
}

static void test_visit_parks_no_worker(void **state)
{
    struct atc_worker_group g = {0};
    struct atc_worker w[3];
    struct event_base *bases[3];
    memset(w, 0, sizeof(w));
    atc_worker_group_init(&g);
    g.workers = w;
    g.nworkers = 3;
    for (unsigned i = 0; i < 3; i++) {
        bases[i] = atc_event_base_new();
        assert_int_equal(atc_worker_init(&w[i], &g, i, bases[i], 1), 0);
    }
    for (unsigned i = 1; i < 3; i++)
        assert_int_equal(atc_worker_start(&w[i]), 0);
    struct visit_state vs = {.workers = w};
    assert_int_equal(atc_worker_post(&w[1], busy_task, &vs), 0);
    pthread_t t;
    pthread_create(&t, NULL, poster, &vs);
    atc_workers_visit(&g, on_visit, &vs);
    pthread_join(t, NULL);
    assert_int_equal(atomic_load(&vs.ran), 2);
    assert_int_equal(atomic_load(&vs.visited), 3);
    for (unsigned i = 1; i < 3; i++)
        atc_worker_join(&w[i]); /* (orders the workers' writes to vs before the reads below) */
    assert_true(pthread_equal(vs.visit_thread[0], pthread_self()));
    for (unsigned i = 1; i < 3; i++)
        assert_true(pthread_equal(vs.visit_thread[i], vs.task_thread[i]));
    assert_false(pthread_equal(vs.visit_thread[1], vs.visit_thread[2]));
    for (unsigned i = 0; i < 3; i++) {
        atc_worker_free(&w[i]);
        event_base_free(bases[i]);
    }
    atc_worker_group_dispose(&g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_affinity_from_two_threads),
        cmocka_unit_test(test_prefix_index_from_two_threads),
        cmocka_unit_test(test_prefix_index_rotating_under_two_threads),
        cmocka_unit_test(test_endpoint_counters_from_two_threads),
        cmocka_unit_test(test_try_acquire_never_passes_capacity),
        cmocka_unit_test(test_health_text_read_while_written),
        cmocka_unit_test(test_metrics_from_two_threads),
        cmocka_unit_test_setup_teardown(test_recorder_from_two_threads, make_dir, remove_dir),
        cmocka_unit_test(test_visit_parks_no_worker),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
