/* The session affinity table and the prefix index. affinity.c is included so that its allocations go
 * through cmocka's leak-checking allocator, and so that a test can force every key into one bucket. */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#define malloc(n) test_malloc(n)
#define calloc(n, m) test_calloc(n, m)
#define realloc(p, n) test_realloc(p, n)
#define free(p) test_free(p)
#include "../../engine/fleet/affinity.c"
#undef malloc
#undef calloc
#undef realloc
#undef free

/* The id under key (a copy, valid until the next call), or NULL when absent. */
static const char *getn(struct atc_affinity *t, const char *key, size_t keylen, uint64_t now)
{
    static char id[ATC_AFFINITY_ID_MAX + 1];
    memset(id, 'x', sizeof(id));
    size_t n = atc_affinity_get(t, key, keylen, now, id, sizeof(id));
    assert_true(n <= ATC_AFFINITY_ID_MAX);
    assert_int_equal(strlen(id), n); /* NUL-terminated, and the length returned is the copy's */
    return n > 0 ? id : NULL;
}

static const char *get(struct atc_affinity *t, const char *key, uint64_t now)
{
    return getn(t, key, strlen(key), now);
}

static int set(struct atc_affinity *t, const char *key, const char *id, uint64_t expires)
{
    return atc_affinity_set(t, key, strlen(key), id, expires);
}

static void test_set_get_del(void **state)
{
    struct atc_affinity *t = atc_affinity_create(16);
    assert_non_null(t);
    assert_int_equal(set(t, "s1", "ep-a", 1000), 0);
    assert_string_equal(get(t, "s1", 0), "ep-a");
    assert_null(get(t, "s", 0)); /* a prefix of a key is another key */
    assert_null(get(t, "s1x", 0));

    /* Keys are bytes, not C strings. */
    assert_int_equal(atc_affinity_set(t, "a\0b", 3, "ep-nul", 1000), 0);
    assert_null(getn(t, "a\0c", 3, 0));
    assert_null(getn(t, "a", 1, 0));
    assert_string_equal(getn(t, "a\0b", 3, 0), "ep-nul");
    assert_int_equal(atc_affinity_count(t), 2);

    /* Replacing: a shorter id is written in place, a longer one reallocates the entry. */
    assert_int_equal(set(t, "s1", "b", 1000), 0);
    assert_string_equal(get(t, "s1", 0), "b");
    assert_int_equal(set(t, "s1", "a-much-longer-endpoint-id", 1000), 0);
    assert_string_equal(get(t, "s1", 0), "a-much-longer-endpoint-id");
    assert_int_equal(atc_affinity_count(t), 2);

    atc_affinity_del(t, "s1", 2);
    assert_null(get(t, "s1", 0));
    assert_int_equal(atc_affinity_count(t), 1);
    atc_affinity_del(t, "s1", 2); /* absent: no-op */
    atc_affinity_del(t, "nope", 4);
    assert_int_equal(atc_affinity_count(t), 1);
    assert_string_equal(getn(t, "a\0b", 3, 0), "ep-nul");

    /* Endpoint ids: non-empty, at most ATC_AFFINITY_ID_MAX bytes. */
    char id[ATC_AFFINITY_ID_MAX + 2];
    memset(id, 'e', sizeof(id) - 1);
    id[sizeof(id) - 1] = '\0';
    assert_int_equal(set(t, "k", id, 1000), -1); /* 129 bytes */
    assert_int_equal(set(t, "k", "", 1000), -1);
    assert_int_equal(atc_affinity_set(t, "k", 1, NULL, 1000), -1);
    assert_null(get(t, "k", 0));
    id[ATC_AFFINITY_ID_MAX] = '\0';
    assert_int_equal(set(t, "k", id, 1000), 0); /* 128 bytes */
    assert_string_equal(get(t, "k", 0), id);
    atc_affinity_destroy(t);
}

static void test_get_copies_into_small_buffers_like_snprintf(void **state)
{
    struct atc_affinity *t = atc_affinity_create(16);
    assert_int_equal(set(t, "s", "endpoint-7", 1000), 0);
    char out[5] = "????";
    assert_int_equal(atc_affinity_get(t, "s", 1, 0, out, sizeof(out)), 10); /* the id's full length */
    assert_string_equal(out, "endp");
    assert_int_equal(atc_affinity_get(t, "s", 1, 0, out, 0), 10); /* nothing written */
    assert_string_equal(out, "endp");
    assert_int_equal(atc_affinity_get(t, "absent", 6, 0, out, sizeof(out)), 0);
    assert_string_equal(out, ""); /* a miss leaves an empty string, not the previous id */
    /* The copy is the caller's: it stays as it was when the entry changes or goes. */
    char id[ATC_AFFINITY_ID_MAX + 1];
    assert_int_equal(atc_affinity_get(t, "s", 1, 0, id, sizeof(id)), 10);
    assert_int_equal(set(t, "s", "e2", 1000), 0);
    atc_affinity_del(t, "s", 1);
    assert_string_equal(id, "endpoint-7");
    atc_affinity_destroy(t);
}

static void test_long_keys_rejected_not_truncated(void **state)
{
    struct atc_affinity *t = atc_affinity_create(16);
    char key[ATC_AFFINITY_KEY_MAX + 1];
    memset(key, 'k', sizeof(key));
    assert_int_equal(atc_affinity_set(t, key, ATC_AFFINITY_KEY_MAX, "ep-max", 1000), 0);
    assert_string_equal(getn(t, key, ATC_AFFINITY_KEY_MAX, 0), "ep-max");
    /* One byte longer: truncating would find ep-max under a different key. */
    assert_null(getn(t, key, sizeof(key), 0));
    assert_int_equal(atc_affinity_set(t, key, sizeof(key), "ep-long", 1000), -1);
    atc_affinity_del(t, key, sizeof(key));
    assert_int_equal(atc_affinity_count(t), 1);
    assert_string_equal(getn(t, key, ATC_AFFINITY_KEY_MAX, 0), "ep-max");
    atc_affinity_destroy(t);
}

static void test_expiry(void **state)
{
    struct atc_affinity *t = atc_affinity_create(16);
    assert_int_equal(set(t, "s", "ep", 1000), 0);
    assert_string_equal(get(t, "s", 999), "ep");
    assert_null(get(t, "s", 1000));             /* expires_at is the first instant it is gone */
    assert_int_equal(atc_affinity_count(t), 0); /* dropped on access */
    assert_null(get(t, "s", 0));                /* gone, even for an older clock */

    /* Setting again extends the expiry. */
    assert_int_equal(set(t, "s", "ep", 2000), 0);
    assert_int_equal(set(t, "s", "ep", 3000), 0);
    assert_string_equal(get(t, "s", 2500), "ep");
    assert_null(get(t, "s", 3001));
    atc_affinity_destroy(t);
}

static void test_lru_evicts_least_recently_used(void **state)
{
    struct atc_affinity *t = atc_affinity_create(3);
    assert_int_equal(set(t, "a", "1", 1000), 0);
    assert_int_equal(set(t, "b", "2", 1000), 0);
    assert_int_equal(set(t, "c", "3", 1000), 0);
    assert_non_null(get(t, "a", 0)); /* a is now the most recently used: b is the oldest */
    assert_int_equal(set(t, "d", "4", 1000), 0);
    assert_int_equal(atc_affinity_count(t), 3);
    assert_null(get(t, "b", 0));
    /* Use order now c, a, d: c is the least recently used. */
    assert_string_equal(get(t, "c", 0), "3");
    assert_string_equal(get(t, "a", 0), "1");
    assert_string_equal(get(t, "d", 0), "4");
    assert_int_equal(set(t, "e", "5", 1000), 0);
    assert_null(get(t, "c", 0));
    assert_non_null(get(t, "a", 0));
    /* Updating an existing key refreshes it too: d, e, a -> set d -> e, a, d; next eviction is e. */
    assert_non_null(get(t, "e", 0));
    assert_non_null(get(t, "a", 0));
    assert_int_equal(set(t, "d", "44", 1000), 0);
    assert_int_equal(set(t, "f", "6", 1000), 0);
    assert_null(get(t, "e", 0));
    assert_string_equal(get(t, "d", 0), "44");
    assert_int_equal(atc_affinity_count(t), 3);
    atc_affinity_destroy(t);
}

static void test_evicts_expired_before_lru(void **state)
{
    struct atc_affinity *t = atc_affinity_create(3);
    assert_int_equal(set(t, "a", "1", 10000), 0);
    assert_int_equal(set(t, "b", "2", 100), 0);
    assert_int_equal(set(t, "c", "3", 10000), 0);
    /* At 200, b has expired; a is the least recently used but still valid. */
    assert_string_equal(get(t, "c", 200), "3");
    assert_int_equal(set(t, "d", "4", 10000), 0);
    assert_int_equal(atc_affinity_count(t), 3);
    assert_string_equal(get(t, "a", 200), "1"); /* plain LRU would have evicted a */
    assert_string_equal(get(t, "d", 200), "4");
    atc_affinity_destroy(t);
}

static void test_colliding_buckets(void **state)
{
    enum { N = 1000 };
    struct atc_affinity *t = atc_affinity_create(2 * N);
    t->mask = 0; /* every key lands in bucket 0: one chain holds them all */
    char key[32], id[32];
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof(key), "session-%d", i);
        snprintf(id, sizeof(id), "ep-%d", i);
        assert_int_equal(set(t, key, id, 1000), 0);
    }
    size_t chain = 0;
    for (struct entry *e = t->buckets[0]; e != NULL; e = e->chain)
        chain++;
    assert_int_equal(chain, N);
    for (int i = 0; i < N; i += 2) {
        snprintf(key, sizeof(key), "session-%d", i);
        atc_affinity_del(t, key, strlen(key));
    }
    assert_int_equal(atc_affinity_count(t), N / 2);
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof(key), "session-%d", i);
        snprintf(id, sizeof(id), "ep-%d", i);
        if (i % 2)
            assert_string_equal(get(t, key, 0), id);
        else
            assert_null(get(t, key, 0));
    }
    /* Fill past capacity: evictions unlink from the middle of the shared chain. */
    for (int i = N; i < 3 * N; i++) {
        snprintf(key, sizeof(key), "session-%d", i);
        assert_int_equal(set(t, key, "x", 1000), 0);
    }
    assert_int_equal(atc_affinity_count(t), 2 * N);
    assert_null(get(t, "session-1", 0));
    assert_string_equal(get(t, "session-2999", 0), "x");
    atc_affinity_destroy(t);
}

/* ---- prefix index ---- */

static uint64_t mix(uint64_t x)
{
    x += UINT64_C(0x9e3779b97f4a7c15);
    x = (x ^ (x >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    x = (x ^ (x >> 27)) * UINT64_C(0x94d049bb133111eb);
    return x ^ (x >> 31);
}

/* n distinct block hashes for request number r. */
static void blocks_of(uint64_t *out, size_t n, uint64_t r)
{
    for (size_t k = 0; k < n; k++)
        out[k] = mix(r << 32 | k);
}

/* An endpoint whose KV cache size is known loses, in the index, what it must have evicted: once it has
 * taken in more new prompt tokens than its cache holds since a block was last sent there. */
static void test_index_forgets_what_a_full_cache_evicted(void **state)
{
    struct atc_prefix_index *idx = atc_prefix_index_create(100000);
    assert_non_null(idx);
    uint16_t out[4];
    const uint64_t a[5] = {11, 12, 13, 14, 15}; /* 5 blocks of 100 tokens */
    atc_prefix_index_insert(idx, a, 5, 0, 100, 1600); /* endpoint 0: 1,600 tokens of KV cache */
    atc_prefix_index_insert(idx, a, 5, 1, 100, 0);    /* endpoint 1: size unknown */
    atc_prefix_index_insert(idx, a, 5, 2, 100, 1600); /* endpoint 2: kept warm below */
    uint64_t other[5];
    for (uint64_t r = 0; r < 2; r++) { /* 1,000 new tokens on endpoint 0 since a: a still fits */
        for (uint64_t k = 0; k < 5; k++)
            other[k] = 1000 + r * 10 + k;
        atc_prefix_index_insert(idx, other, 5, 0, 100, 1600);
    }
    atc_prefix_index_overlaps(idx, a, 5, out, 3);
    assert_int_equal(out[0], 5);
    for (uint64_t r = 2; r < 6; r++) { /* 3,000 new tokens in all: a was evicted there */
        for (uint64_t k = 0; k < 5; k++)
            other[k] = 1000 + r * 10 + k;
        atc_prefix_index_insert(idx, other, 5, 0, 100, 1600);
        atc_prefix_index_insert(idx, other, 5, 2, 100, 1600);
        assert_int_equal(atc_prefix_index_insert(idx, a, 5, 2, 100, 1600), 5); /* used again: stays */
    }
    atc_prefix_index_overlaps(idx, a, 5, out, 3);
    assert_int_equal(out[0], 0);
    assert_int_equal(out[1], 5); /* nothing known of its size: nothing taken as evicted */
    assert_int_equal(out[2], 5);
    /* sent there again: a new copy, counted as uncached (0 blocks were there) */
    assert_int_equal(atc_prefix_index_insert(idx, a, 5, 0, 100, 1600), 0);
    atc_prefix_index_overlaps(idx, a, 5, out, 3);
    assert_int_equal(out[0], 5);
    /* a server that says its cache holds 1 token: each block is gone once anything else came, and a
     * huge request costs no more than the ring of marks (it used to take one step per token) */
    const uint64_t big[1] = {777};
    atc_prefix_index_insert(idx, a, 5, 3, 100, 1);
    atc_prefix_index_insert(idx, big, 1, 3, UINT32_MAX, 1);
    atc_prefix_index_overlaps(idx, a, 5, out, 4);
    assert_int_equal(out[3], 0);
    atc_prefix_index_destroy(idx);
}

/* A hit moves its blocks to the front of the server's LRU too: a block is gone once the distinct tokens
 * sent there since it last was fill the cache, whether they were new or cached. Counting only the new
 * ones kept B below (the index said 21% fewer uncached tokens than the server computed on Mooncake's
 * trace). */
static void test_index_counts_hits_as_recent_use(void **state)
{
    struct atc_prefix_index *idx = atc_prefix_index_create(100000);
    assert_non_null(idx);
    uint16_t out[1];
    const uint64_t a[5] = {21, 22, 23, 24, 25}, b[5] = {31, 32, 33, 34, 35}, d[5] = {41, 42, 43, 44, 45};
    /* endpoint 0: 1,000 tokens of KV cache, blocks of 100 tokens: A and B fill it */
    assert_int_equal(atc_prefix_index_insert(idx, a, 5, 0, 100, 1000), 0);
    assert_int_equal(atc_prefix_index_insert(idx, b, 5, 0, 100, 1000), 0);
    assert_int_equal(atc_prefix_index_insert(idx, a, 5, 0, 100, 1000), 5); /* a hit: A is the newest */
    atc_prefix_index_overlaps(idx, b, 5, out, 1);
    assert_int_equal(out[0], 5); /* nothing new yet: B is still there */
    assert_int_equal(atc_prefix_index_insert(idx, d, 5, 0, 100, 1000), 0); /* D takes B's place */
    atc_prefix_index_overlaps(idx, b, 5, out, 1);
    assert_int_equal(out[0], 0);
    atc_prefix_index_overlaps(idx, a, 5, out, 1);
    assert_int_equal(out[0], 5);
    /* the same block sent twice in one request is one block of the cache, not two */
    const uint64_t again[10] = {51, 52, 51, 52, 51, 52, 51, 52, 51, 52};
    assert_int_equal(atc_prefix_index_insert(idx, again, 10, 0, 100, 1000), 0);
    atc_prefix_index_overlaps(idx, d, 5, out, 1);
    assert_int_equal(out[0], 5); /* 200 tokens since D (counted as 1,000, D would be gone) */
    atc_prefix_index_destroy(idx);
}

/* A request pins its blocks while it runs, and the server frees them to the end of its LRU when it ends
 * (vLLM's free queue): a long answer keeps its prompt, which the index would otherwise take for evicted by
 * what was sent during it; and what the answer held pushes older blocks out like new prompt tokens. */
static void test_index_takes_a_finished_request_as_recent_use(void **state)
{
    struct atc_prefix_index *idx = atc_prefix_index_create(100000);
    assert_non_null(idx);
    uint16_t out[2];
    const uint64_t a[5] = {81, 82, 83, 84, 85}, b[5] = {91, 92, 93, 94, 95};
    /* endpoints 0 and 1: 1,000 tokens of KV cache, blocks of 100 tokens; A runs long on both */
    atc_prefix_index_insert(idx, a, 5, 0, 100, 1000);
    atc_prefix_index_insert(idx, a, 5, 1, 100, 1000);
    for (uint64_t r = 0; r < 3; r++) { /* 1,500 new tokens on each while A runs */
        uint64_t o[5];
        blocks_of(o, 5, 2000 + r);
        atc_prefix_index_insert(idx, o, 5, 0, 100, 1000);
        atc_prefix_index_insert(idx, o, 5, 1, 100, 1000);
    }
    atc_prefix_index_released(idx, a, 5, 0, 100, 1000, 0); /* A ends on endpoint 0 only */
    atc_prefix_index_overlaps(idx, a, 5, out, 2);
    assert_int_equal(out[0], 5);
    assert_int_equal(out[1], 0);
    /* B comes, then A's 600-token answer and its prompt's partial block end on endpoint 0: with B's 500 and
     * A's 500 that is 1,600 tokens since B, which is gone; A is not */
    atc_prefix_index_insert(idx, b, 5, 0, 100, 1000);
    atc_prefix_index_released(idx, a, 5, 0, 100, 1000, 600);
    atc_prefix_index_overlaps(idx, b, 5, out, 1);
    assert_int_equal(out[0], 0);
    atc_prefix_index_overlaps(idx, a, 5, out, 1);
    assert_int_equal(out[0], 5);
    /* an endpoint past the index's range is ignored, as by insert */
    atc_prefix_index_released(idx, a, 5, ATC_PREFIX_INDEX_ENDPOINTS_MAX, 100, 1000, 0);
    atc_prefix_index_destroy(idx);
}

/* A review's two findings: the first prompt an endpoint gets counts a block it repeats once too; and an
 * endpoint idle while the index's 32-bit clock moves on past its stamps' range starts its ring again,
 * where it used to take every block sent there afterwards as evicted at once. */
static void test_index_first_prompt_and_an_idle_endpoint(void **state)
{
    struct atc_prefix_index *idx = atc_prefix_index_create(100000);
    assert_non_null(idx);
    uint16_t out[1];
    const uint64_t again[10] = {51, 52, 51, 52, 51, 52, 51, 52, 51, 52}, fresh[5] = {61, 62, 63, 64, 65};
    atc_prefix_index_insert(idx, again, 10, 0, 100, 1000);
    atc_prefix_index_insert(idx, fresh, 5, 0, 100, 1000); /* 700 distinct tokens in all */
    atc_prefix_index_overlaps(idx, again, 2, out, 1);
    assert_int_equal(out[0], 2);
    for (uint64_t r = 0; r < 30; r++) { /* endpoint 0's ring fills past its end */
        uint64_t b[5];
        blocks_of(b, 5, 1000 + r);
        atc_prefix_index_insert(idx, b, 5, 0, 100, 1000);
    }
    for (uint64_t r = 0; r < 36; r++) { /* 36 x 2^32 tokens elsewhere: the clock passes 2^31 units */
        uint64_t b = mix(UINT64_C(7) << 60 | r);
        atc_prefix_index_insert(idx, &b, 1, 1, UINT32_MAX, 0);
    }
    const uint64_t now[3] = {71, 72, 73};
    atc_prefix_index_insert(idx, now, 3, 0, 100, 1000);
    atc_prefix_index_overlaps(idx, now, 3, out, 1);
    assert_int_equal(out[0], 3);
    atc_prefix_index_destroy(idx);
}

static void test_overlap_counts_leading_blocks(void **state)
{
    struct atc_prefix_index *idx = atc_prefix_index_create(1000);
    assert_non_null(idx);
    uint16_t out[2];
    const uint64_t a[5] = {11, 12, 13, 14, 15};
    atc_prefix_index_insert(idx, a, 5, 0, 64, 0);

    atc_prefix_index_overlaps(idx, a, 5, out, 2);
    assert_int_equal(out[0], 5);
    assert_int_equal(out[1], 0);
    const uint64_t gap[5] = {11, 12, 13, 99, 15}; /* block 3 missing: block 4 must not count */
    atc_prefix_index_overlaps(idx, gap, 5, out, 2);
    assert_int_equal(out[0], 3);
    const uint64_t late[3] = {99, 12, 13}; /* a miss at block 0 means no overlap at all */
    atc_prefix_index_overlaps(idx, late, 3, out, 2);
    assert_int_equal(out[0], 0);
    const uint64_t longer[7] = {11, 12, 13, 14, 15, 16, 17};
    atc_prefix_index_overlaps(idx, longer, 7, out, 2);
    assert_int_equal(out[0], 5);
    atc_prefix_index_overlaps(idx, a, 2, out, 2);
    assert_int_equal(out[0], 2);
    out[0] = out[1] = 77;
    atc_prefix_index_overlaps(idx, a, 0, out, 2);
    assert_int_equal(out[0], 0);
    assert_int_equal(out[1], 0);

    /* A block hash of 0 is a block like any other. */
    const uint64_t zero[2] = {0, 7};
    atc_prefix_index_insert(idx, zero, 2, 1, 64, 0);
    atc_prefix_index_overlaps(idx, zero, 2, out, 2);
    assert_int_equal(out[0], 0);
    assert_int_equal(out[1], 2);
    atc_prefix_index_destroy(idx);
}

static void test_overlaps_of_several_endpoints_in_one_pass(void **state)
{
    struct atc_prefix_index *idx = atc_prefix_index_create(10000);
    uint64_t req[20], other[20];
    blocks_of(req, 20, 1);
    blocks_of(other, 20, 2);
    memcpy(other, req, 7 * sizeof(uint64_t)); /* shares 7 leading blocks with req */
    atc_prefix_index_insert(idx, req, 10, 0, 64, 0);
    atc_prefix_index_insert(idx, req, 4, 1, 64, 0);
    atc_prefix_index_insert(idx, other, 20, 2, 64, 0);
    atc_prefix_index_insert(idx, req + 1, 19, 5, 64, 0); /* everything but block 0 */
    atc_prefix_index_insert(idx, req, 20, 63, 64, 0);

    uint16_t out[72];
    memset(out, 0xff, sizeof(out));
    atc_prefix_index_overlaps(idx, req, 20, out, 64);
    const uint16_t want[6] = {10, 4, 7, 0, 0, 0};
    for (int i = 0; i < 6; i++)
        assert_int_equal(out[i], want[i]);
    for (int i = 6; i < 63; i++)
        assert_int_equal(out[i], 0);
    assert_int_equal(out[63], 20);
    assert_int_equal(out[64], 0xffff); /* nothing written past nendpoints */

    memset(out, 0xff, sizeof(out));
    atc_prefix_index_overlaps(idx, req, 20, out, 3);
    assert_int_equal(out[0], 10);
    assert_int_equal(out[2], 7);
    assert_int_equal(out[3], 0xffff);

    /* Indices from 64 on are as exact as the others (they used to share a bit with index % 64). */
    atc_prefix_index_insert(idx, req, 12, 64 + 6, 64, 0);
    atc_prefix_index_overlaps(idx, req, 20, out, 72);
    assert_int_equal(out[6], 0);
    assert_int_equal(out[70], 12);
    assert_int_equal(out[64], 0);
    assert_int_equal(out[0], 10);
    assert_int_equal(out[71], 0);
    /* ... up to the last one recorded; from ATC_PREFIX_INDEX_ENDPOINTS_MAX on, nothing is */
    assert_int_equal(atc_prefix_index_insert(idx, req, 20, ATC_PREFIX_INDEX_ENDPOINTS_MAX, 64, 0), 0);
    atc_prefix_index_insert(idx, req, 3, ATC_PREFIX_INDEX_ENDPOINTS_MAX - 1, 64, 0);
    static uint16_t all[ATC_PREFIX_INDEX_ENDPOINTS_MAX + 1];
    atc_prefix_index_overlaps(idx, req, 20, all, ATC_PREFIX_INDEX_ENDPOINTS_MAX + 1);
    assert_int_equal(all[ATC_PREFIX_INDEX_ENDPOINTS_MAX - 1], 3);
    assert_int_equal(all[ATC_PREFIX_INDEX_ENDPOINTS_MAX], 0);
    assert_int_equal(all[63], 20);
    atc_prefix_index_destroy(idx);
}

/* A shared system prompt held by every server of a 512-server fleet, and each server's own tail: every
 * server's overlap is exact, whether the block's holders fit in the slot or take a wide set. */
static void test_exact_at_512_endpoints(void **state)
{
    enum { N = 512 };
    struct atc_prefix_index *idx = atc_prefix_index_create(100000);
    uint64_t req[8];
    static uint16_t out[N];
    blocks_of(req, 8, 7);
    for (unsigned e = 0; e < N; e++) /* endpoint e has the first 1 + e % 8 blocks */
        assert_int_equal(atc_prefix_index_insert(idx, req, 1 + e % 8, e, 64, 0), 0);
    atc_prefix_index_overlaps(idx, req, 8, out, N);
    for (unsigned e = 0; e < N; e++)
        assert_int_equal(out[e], 1 + e % 8);
    for (unsigned e = 0; e < N; e += 37) /* what each has, as insert tells it */
        assert_int_equal(atc_prefix_index_insert(idx, req, 8, e, 64, 0), 1 + e % 8);
    assert_int_equal(atc_prefix_index_dropped(idx), 0);

    /* With the wide sets used up (a tiny index: 16 of them a generation), a fifth holder replaces an
     * older one, and that is counted. */
    struct atc_prefix_index *small = atc_prefix_index_create(100);
    for (uint64_t b = 0; b < 17; b++) {
        uint64_t one = 1000 + b;
        for (unsigned e = 0; e < 5; e++)
            atc_prefix_index_insert(small, &one, 1, e, 64, 0);
    }
    assert_int_equal(atc_prefix_index_dropped(small), 1);
    uint64_t last = 1016;
    atc_prefix_index_overlaps(small, &last, 1, out, 5);
    assert_int_equal(out[0] + out[1] + out[2] + out[3] + out[4], 4);
    assert_int_equal(out[4], 1); /* the most recent holder stays */
    atc_prefix_index_destroy(small);
    atc_prefix_index_destroy(idx);
}

static void test_eviction_keeps_memory_bounded(void **state)
{
    enum { MAX = 1000, PER = 10, REQUESTS = 10 * MAX / PER };
    struct atc_prefix_index *idx = atc_prefix_index_create(MAX);
    size_t bytes = atc_prefix_index_bytes(idx);
    /* the bound stated in affinity.h: 62 bytes a block, + 1.1 MB of per-endpoint clocks */
    assert_true(bytes < MAX * 62 + 1100 * 1024);
    uint64_t req[PER];
    uint16_t out[8];
    for (uint64_t r = 0; r < REQUESTS; r++) {
        blocks_of(req, PER, r);
        atc_prefix_index_insert(idx, req, PER, (unsigned)(r % 8), 64, 0);
        assert_true(atc_prefix_index_count(idx) <= MAX);
    }
    assert_true(atc_prefix_index_count(idx) >= MAX / 2);
    assert_int_equal(atc_prefix_index_bytes(idx), bytes);
    /* The latest max_blocks / 2 blocks are always there. */
    for (uint64_t r = REQUESTS - MAX / 2 / PER; r < REQUESTS; r++) {
        blocks_of(req, PER, r);
        atc_prefix_index_overlaps(idx, req, PER, out, 8);
        for (unsigned i = 0; i < 8; i++)
            assert_int_equal(out[i], i == r % 8 ? PER : 0);
    }
    /* The oldest are forgotten. */
    blocks_of(req, PER, 0);
    atc_prefix_index_overlaps(idx, req, PER, out, 8);
    assert_int_equal(out[0], 0);
    atc_prefix_index_destroy(idx);
}

static void insert_cold(struct atc_prefix_index *idx, uint64_t *next, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t b = mix(UINT64_C(1) << 63 | (*next)++);
        atc_prefix_index_insert(idx, &b, 1, 9, 64, 0);
    }
}

static void test_hot_prefix_survives_rotations(void **state)
{
    struct atc_prefix_index *idx = atc_prefix_index_create(1000); /* rotates every 500 new blocks */
    uint64_t hot[4], cold = 0;
    uint16_t out[2];
    blocks_of(hot, 4, 42);
    atc_prefix_index_insert(idx, hot, 4, 0, 64, 0);
    insert_cold(idx, &cold, 600); /* one rotation: hot (for 0) is now in the previous generation */
    assert_int_equal(idx->cur.count, 104);
    atc_prefix_index_insert(idx, hot, 4, 1, 64, 0); /* copies it forward, with endpoint 0 */
    insert_cold(idx, &cold, 400);            /* one more rotation drops the old copy */
    assert_int_equal(idx->cur.count, 8);
    atc_prefix_index_overlaps(idx, hot, 4, out, 2);
    assert_int_equal(out[0], 4);
    assert_int_equal(out[1], 4);

    for (int i = 0; i < 20; i++) { /* 8,000 cold blocks, 8x the index, while hot keeps being used */
        atc_prefix_index_insert(idx, hot, 4, 0, 64, 0);
        insert_cold(idx, &cold, 400);
    }
    atc_prefix_index_overlaps(idx, hot, 4, out, 2);
    assert_int_equal(out[0], 4);
    assert_int_equal(out[1], 4);
    uint64_t first = mix(UINT64_C(1) << 63); /* the oldest cold block, inserted for endpoint 9 */
    uint16_t all[10];
    atc_prefix_index_overlaps(idx, &first, 1, all, 10);
    assert_int_equal(all[9], 0);
    atc_prefix_index_destroy(idx);
}

static void test_clear(void **state)
{
    struct atc_prefix_index *idx = atc_prefix_index_create(1000);
    uint64_t req[8];
    uint16_t out[2];
    blocks_of(req, 8, 3);
    atc_prefix_index_insert(idx, req, 8, 1, 64, 0);
    uint64_t cold = 0;
    insert_cold(idx, &cold, 700); /* something in both generations */
    atc_prefix_index_clear(idx);
    assert_int_equal(atc_prefix_index_count(idx), 0);
    atc_prefix_index_overlaps(idx, req, 8, out, 2);
    assert_int_equal(out[1], 0);
    atc_prefix_index_insert(idx, req, 8, 0, 64, 0);
    atc_prefix_index_overlaps(idx, req, 8, out, 2);
    assert_int_equal(out[0], 8);
    assert_int_equal(out[1], 0); /* not resurrected */
    atc_prefix_index_destroy(idx);
}

/* An endpoint that leaves the fleet (a replay's until:): its holdings go, in both generations and in the
 * wide sets, and nobody else's; its pins go, nobody else's. */
static void test_forget_an_endpoint(void **state)
{
    struct atc_prefix_index *idx = atc_prefix_index_create(1000);
    uint64_t req[8], cold = 0;
    uint16_t out[8];
    blocks_of(req, 8, 9);
    atc_prefix_index_insert(idx, req, 8, 1, 64, 0);
    insert_cold(idx, &cold, 700);    /* req's blocks move to the previous generation */
    for (unsigned e = 2; e < 8; e++) /* held by 7 endpoints: a wide set */
        atc_prefix_index_insert(idx, req, 4, e, 64, 0);
    atc_prefix_index_forget(idx, 1);
    atc_prefix_index_forget(idx, 3);
    atc_prefix_index_overlaps(idx, req, 8, out, 8);
    const uint16_t want[8] = {0, 0, 4, 0, 4, 4, 4, 4};
    for (int i = 0; i < 8; i++)
        assert_int_equal(out[i], want[i]);
    atc_prefix_index_destroy(idx);

    struct atc_affinity *t = atc_affinity_create(16);
    assert_int_equal(set(t, "s1", "gone", 1000), 0);
    assert_int_equal(set(t, "s2", "stays", 1000), 0);
    assert_int_equal(set(t, "s3", "gone", 1000), 0);
    assert_int_equal(atc_affinity_forget_endpoint(t, "gone"), 2);
    assert_null(get(t, "s1", 0));
    assert_null(get(t, "s3", 0));
    assert_string_equal(get(t, "s2", 0), "stays");
    assert_int_equal(atc_affinity_count(t), 1);
    atc_affinity_destroy(t);
}

/* ---- micro-benchmark: printed, not asserted ---- */

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static void test_bench(void **state)
{
    enum { KEYS = ATC_AFFINITY_DEFAULT_ENTRIES, GETS = 1000000, KEYLEN = 24 };
    struct atc_affinity *t = atc_affinity_create(0);
    char(*keys)[KEYLEN] = test_malloc(sizeof(*keys) * KEYS);
    for (int i = 0; i < KEYS; i++) {
        snprintf(keys[i], KEYLEN, "session-%015d", i);
        assert_int_equal(atc_affinity_set(t, keys[i], KEYLEN - 1, "vllm-endpoint-07", UINT64_MAX), 0);
    }
    size_t sink = 0;
    uint64_t x = 1;
    double t0 = now_ns();
    for (int i = 0; i < GETS; i++) {
        x = x * 6364136223846793005u + 1442695040888963407u; /* random order: not just cache hits */
        char id[ATC_AFFINITY_ID_MAX + 1];
        sink += atc_affinity_get(t, keys[(x >> 33) % KEYS], KEYLEN - 1, 1, id, sizeof(id)) > 0;
    }
    double get_ns = (now_ns() - t0) / GETS;
    assert_int_equal(sink, GETS);
    t0 = now_ns();
    for (int i = 0; i < GETS; i++) {
        x = x * 6364136223846793005u + 1442695040888963407u;
        atc_affinity_set(t, keys[(x >> 33) % KEYS], KEYLEN - 1, "vllm-endpoint-08", UINT64_MAX);
    }
    double set_ns = (now_ns() - t0) / GETS;
    atc_affinity_destroy(t);
    test_free(keys);

    /* The default-size index, half full of other traffic; one 128-block request known to 64 endpoints:
     * the worst case, no early stop. */
    enum { CALLS = 20000, BLOCKS = 128, FILL = ATC_PREFIX_INDEX_DEFAULT_BLOCKS / 2 };
    struct atc_prefix_index *idx = atc_prefix_index_create(0);
    uint64_t req[BLOCKS];
    t0 = now_ns();
    for (int i = 0; i < FILL / BLOCKS; i++) {
        blocks_of(req, BLOCKS, 1000 + i);
        atc_prefix_index_insert(idx, req, BLOCKS, i % 64, 64, 0);
    }
    double insert_ns = (now_ns() - t0) / (FILL / BLOCKS * BLOCKS);
    blocks_of(req, BLOCKS, 7);
    for (unsigned e = 0; e < 64; e++)
        atc_prefix_index_insert(idx, req, BLOCKS, e, 64, 0);
    uint16_t out[64];
    t0 = now_ns();
    for (int i = 0; i < CALLS; i++) {
        atc_prefix_index_overlaps(idx, req, BLOCKS, out, 64);
        sink += out[i % 64];
    }
    double overlaps_ns = (now_ns() - t0) / CALLS;
    assert_int_equal(out[63], BLOCKS);
    t0 = now_ns();
    rotate(idx);
    double rotate_ns = now_ns() - t0;
    size_t bytes = atc_prefix_index_bytes(idx);
    atc_prefix_index_destroy(idx);

    printf("bench: affinity get hit %.0f ns, set (update) %.0f ns  [100k entries, random order]\n", get_ns,
           set_ns);
    printf("bench: prefix overlaps 128 blocks x 64 endpoints %.0f ns/call (%.1f ns/block), insert %.0f "
           "ns/block, rotation %.2f ms  [default size, %zu bytes]\n",
           overlaps_ns, overlaps_ns / BLOCKS, insert_ns, rotate_ns / 1e6, bytes);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_set_get_del),
        cmocka_unit_test(test_get_copies_into_small_buffers_like_snprintf),
        cmocka_unit_test(test_long_keys_rejected_not_truncated),
        cmocka_unit_test(test_expiry),
        cmocka_unit_test(test_lru_evicts_least_recently_used),
        cmocka_unit_test(test_evicts_expired_before_lru),
        cmocka_unit_test(test_colliding_buckets),
        cmocka_unit_test(test_overlap_counts_leading_blocks),
        cmocka_unit_test(test_index_forgets_what_a_full_cache_evicted),
        cmocka_unit_test(test_index_counts_hits_as_recent_use),
        cmocka_unit_test(test_index_takes_a_finished_request_as_recent_use),
        cmocka_unit_test(test_index_first_prompt_and_an_idle_endpoint),
        cmocka_unit_test(test_overlaps_of_several_endpoints_in_one_pass),
        cmocka_unit_test(test_exact_at_512_endpoints),
        cmocka_unit_test(test_eviction_keeps_memory_bounded),
        cmocka_unit_test(test_hot_prefix_survives_rotations),
        cmocka_unit_test(test_clear),
        cmocka_unit_test(test_forget_an_endpoint),
        cmocka_unit_test(test_bench),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
