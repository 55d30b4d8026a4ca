/* The KV-event decoder (fleet/kv_event_decode.c) on payloads built here with msgpack-c's packer from
 * vLLM's format (vllm/distributed/kv_events.py: EventBatch, BlockStored, BlockRemoved,
 * AllBlocksCleared as msgspec tagged structs, array_like or maps, trailing defaults omitted), and the
 * exact index (fleet/kv_index.c): store, remove, clear, tiers, the cap's overflow rule, a model check
 * against a plain reference, the seqlock's retry with the writer run between a reader's loads, and a reader
 * thread racing the writer (run under ThreadSanitizer). */

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <msgpack.h>

#define malloc(n) test_malloc(n)
#define calloc(n, m) test_calloc(n, m)
#define realloc(p, n) test_realloc(p, n)
#define free(p) test_free(p)
/* The writer between a reader's loads of a slot (kv_index.c's KV_INDEX_MID_READ), when a test arms it. */
struct slot;
static void mid_read(const struct slot *s);
#define KV_INDEX_MID_READ(s) mid_read(s)
#include "../../engine/fleet/kv_event_decode.c"
#include "../../engine/fleet/kv_index.c"
#undef malloc
#undef calloc
#undef realloc
#undef free

/* ---- building payloads ---- */

struct pk {
    msgpack_sbuffer buf;
    msgpack_packer p;
};

static void pk_init(struct pk *k)
{
    msgpack_sbuffer_init(&k->buf);
    msgpack_packer_init(&k->p, &k->buf, msgpack_sbuffer_write);
}

static void str(struct pk *k, const char *s)
{
    msgpack_pack_str(&k->p, strlen(s));
    msgpack_pack_str_body(&k->p, s, strlen(s));
}

static void u64s(struct pk *k, const uint64_t *v, size_t n)
{
    msgpack_pack_array(&k->p, n);
    for (size_t i = 0; i < n; i++)
        msgpack_pack_uint64(&k->p, v[i]);
}

static void tokens(struct pk *k, size_t n)
{
    msgpack_pack_array(&k->p, n);
    for (size_t i = 0; i < n; i++)
        msgpack_pack_uint32(&k->p, (uint32_t)(1000 + i));
}

static int decode(struct pk *k, struct atc_kv_batch *b, const char **err)
{
    return atc_kv_batch_decode(k->buf.data, k->buf.size, b, err);
}

/* [ts, [stored, removed, cleared], rank]: msgspec array_like, every field present. */
static void test_array_encoded_batch(void **state)
{
    struct pk k;
    pk_init(&k);
    msgpack_pack_array(&k.p, 3);
    msgpack_pack_double(&k.p, 1700000000.5);
    msgpack_pack_array(&k.p, 3);
    /* BlockStored: block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name,
     * extra_keys, group_idx */
    msgpack_pack_array(&k.p, 10);
    str(&k, "BlockStored");
    u64s(&k, (uint64_t[]){11, 12, UINT64_MAX}, 3);
    msgpack_pack_nil(&k.p);
    tokens(&k, 48);
    msgpack_pack_uint32(&k.p, 16);
    msgpack_pack_nil(&k.p);
    str(&k, "GPU");
    msgpack_pack_nil(&k.p);
    msgpack_pack_array(&k.p, 3);
    for (int i = 0; i < 3; i++)
        msgpack_pack_nil(&k.p);
    msgpack_pack_uint32(&k.p, 0);
    msgpack_pack_array(&k.p, 3);
    str(&k, "BlockRemoved");
    u64s(&k, (uint64_t[]){12}, 1);
    str(&k, "CPU");
    msgpack_pack_array(&k.p, 1);
    str(&k, "AllBlocksCleared");
    msgpack_pack_uint32(&k.p, 2);

    struct atc_kv_batch b;
    const char *err = "unset";
    assert_int_equal(decode(&k, &b, &err), 0);
    assert_null(err);
    assert_true(b.ts == 1700000000.5);
    assert_int_equal(b.dp_rank, 2);
    assert_int_equal(b.nevents, 3);
    assert_int_equal(b.events[0].type, ATC_KV_STORED);
    assert_int_equal(b.events[0].tier, ATC_KV_GPU);
    assert_int_equal(b.events[0].block_size, 16);
    assert_int_equal(b.events[0].nkeys, 3);
    assert_true(b.events[0].keys[0] == 11 && b.events[0].keys[1] == 12 && b.events[0].keys[2] == UINT64_MAX);
    assert_int_equal(b.events[1].type, ATC_KV_REMOVED);
    assert_int_equal(b.events[1].tier, ATC_KV_CPU);
    assert_int_equal(b.events[1].nkeys, 1);
    assert_true(b.events[1].keys[0] == 12);
    assert_int_equal(b.events[2].type, ATC_KV_CLEARED);
    assert_int_equal(b.unknown, 0);
    atc_kv_batch_dispose(&b);
    msgpack_sbuffer_destroy(&k.buf);
}

/* {"ts", "events", "data_parallel_rank"} with events as maps tagged by "type" (msgspec's default). */
static void test_map_encoded_batch(void **state)
{
    struct pk k;
    pk_init(&k);
    msgpack_pack_map(&k.p, 3);
    str(&k, "events");
    msgpack_pack_array(&k.p, 2);
    msgpack_pack_map(&k.p, 6);
    str(&k, "type");
    str(&k, "BlockStored");
    str(&k, "block_hashes");
    u64s(&k, (uint64_t[]){7, 8}, 2);
    str(&k, "parent_block_hash");
    msgpack_pack_uint64(&k.p, 6);
    str(&k, "token_ids");
    tokens(&k, 32);
    str(&k, "block_size");
    msgpack_pack_uint32(&k.p, 16);
    str(&k, "medium");
    str(&k, "CPU");
    msgpack_pack_map(&k.p, 2);
    str(&k, "block_hashes");
    u64s(&k, (uint64_t[]){8}, 1);
    str(&k, "type"); /* the tag need not come first in a map */
    str(&k, "BlockRemoved");
    str(&k, "ts");
    msgpack_pack_double(&k.p, 12.25);
    str(&k, "data_parallel_rank");
    msgpack_pack_nil(&k.p);

    struct atc_kv_batch b;
    const char *err;
    assert_int_equal(decode(&k, &b, &err), 0);
    assert_true(b.ts == 12.25);
    assert_int_equal(b.dp_rank, -1);
    assert_int_equal(b.nevents, 2);
    assert_int_equal(b.events[0].type, ATC_KV_STORED);
    assert_int_equal(b.events[0].tier, ATC_KV_CPU);
    assert_int_equal(b.events[0].nkeys, 2);
    assert_true(b.events[0].keys[1] == 8);
    assert_int_equal(b.events[1].type, ATC_KV_REMOVED);
    assert_int_equal(b.events[1].tier, ATC_KV_GPU); /* no medium: the default, GPU */
    atc_kv_batch_dispose(&b);
    msgpack_sbuffer_destroy(&k.buf);
}

/* Older builds and omit_defaults: [ts, events] without a rank; BlockStored without medium and after;
 * hashes as negative integers (SGLang) and as bytes (vLLM without int hashes: the low 64 bits). */
static void test_trailing_fields_absent_and_hash_kinds(void **state)
{
    struct pk k;
    pk_init(&k);
    msgpack_pack_array(&k.p, 2);
    msgpack_pack_uint64(&k.p, 99);
    msgpack_pack_array(&k.p, 3);
    msgpack_pack_array(&k.p, 6);
    str(&k, "BlockStored");
    msgpack_pack_array(&k.p, 2);
    msgpack_pack_int64(&k.p, -2);
    uint8_t digest[32];
    for (int i = 0; i < 32; i++)
        digest[i] = (uint8_t)i;
    msgpack_pack_bin(&k.p, 32);
    msgpack_pack_bin_body(&k.p, digest, 32);
    msgpack_pack_nil(&k.p);
    tokens(&k, 32);
    msgpack_pack_uint32(&k.p, 16);
    msgpack_pack_nil(&k.p);
    msgpack_pack_array(&k.p, 2);
    str(&k, "BlockRemoved");
    u64s(&k, (uint64_t[]){5}, 1);
    msgpack_pack_array(&k.p, 2);
    str(&k, "SomethingNewer");
    msgpack_pack_uint32(&k.p, 1);

    struct atc_kv_batch b;
    const char *err;
    assert_int_equal(decode(&k, &b, &err), 0);
    assert_true(b.ts == 99);
    assert_int_equal(b.dp_rank, -1);
    assert_int_equal(b.nevents, 3);
    assert_int_equal(b.events[0].tier, ATC_KV_GPU);
    assert_true(b.events[0].keys[0] == (uint64_t)-2);
    assert_true(b.events[0].keys[1] == UINT64_C(0x18191a1b1c1d1e1f)); /* bytes 24..31, big-endian */
    assert_int_equal(b.events[1].tier, ATC_KV_GPU);
    assert_int_equal(b.events[2].type, ATC_KV_UNKNOWN);
    assert_int_equal(b.unknown, 1);
    atc_kv_batch_dispose(&b);
    msgpack_sbuffer_destroy(&k.buf);
}

static void expect_error(const void *data, size_t len, const char *want)
{
    struct atc_kv_batch b;
    const char *err = NULL;
    assert_int_equal(atc_kv_batch_decode(data, len, &b, &err), -1);
    if (want)
        assert_ptr_equal(err, want);
    else
        assert_non_null(err);
    assert_int_equal(b.nevents, 0);
    atc_kv_batch_dispose(&b);
}

static void test_bad_payloads(void **state)
{
    struct pk k;
    pk_init(&k);
    msgpack_pack_array(&k.p, 3);
    msgpack_pack_double(&k.p, 1);
    msgpack_pack_array(&k.p, 1);
    msgpack_pack_array(&k.p, 7);
    str(&k, "BlockStored");
    u64s(&k, (uint64_t[]){1, 2, 3, 4}, 4);
    msgpack_pack_nil(&k.p);
    tokens(&k, 64);
    msgpack_pack_uint32(&k.p, 16);
    msgpack_pack_nil(&k.p);
    str(&k, "GPU");
    msgpack_pack_uint32(&k.p, 0);
    /* every truncation fails cleanly */
    for (size_t n = 0; n < k.buf.size; n++)
        expect_error(k.buf.data, n, NULL);
    /* trailing bytes */
    char *more = test_malloc(k.buf.size + 1);
    memcpy(more, k.buf.data, k.buf.size);
    more[k.buf.size] = 0;
    expect_error(more, k.buf.size + 1, atc_kv_err_msgpack);
    test_free(more);
    msgpack_sbuffer_destroy(&k.buf);

    /* an array32 header claiming 4 billion items, a map32 likewise, a str32 past the end */
    expect_error("\xdd\xff\xff\xff\xff\x00", 6, atc_kv_err_msgpack);
    expect_error("\x92\xcb\0\0\0\0\0\0\0\0\xdf\xff\xff\xff\xff", 15, atc_kv_err_msgpack);
    expect_error("\xdb\xff\xff\xff\xf0xx", 7, atc_kv_err_msgpack);
    expect_error("\xc1", 1, atc_kv_err_msgpack);
    /* nested too deep: 100 fixarrays of one */
    char deep[100];
    memset(deep, 0x91, sizeof deep);
    deep[99] = 0;
    expect_error(deep, sizeof deep, atc_kv_err_too_deep);
    /* well-formed msgpack, not a batch */
    expect_error("\xa3"
                 "abc",
                 4, atc_kv_err_shape);
    expect_error("\x92\xa1x\x90", 4, atc_kv_err_shape); /* ts a string */
    /* an event that is a number; a hash that is a string */
    expect_error("\x92\x01\x91\x05", 4, atc_kv_err_event);
    pk_init(&k);
    msgpack_pack_array(&k.p, 2);
    msgpack_pack_uint32(&k.p, 1);
    msgpack_pack_array(&k.p, 1);
    msgpack_pack_array(&k.p, 2);
    str(&k, "BlockRemoved");
    msgpack_pack_array(&k.p, 1);
    str(&k, "nothash");
    expect_error(k.buf.data, k.buf.size, atc_kv_err_hash);
    msgpack_sbuffer_destroy(&k.buf);
}

/* ---- the index ---- */

static void test_index_store_remove_clear(void **state)
{
    size_t caps[2] = {100, 100};
    struct atc_kv_index *ix = atc_kv_index_create(caps, 2);
    assert_non_null(ix);
    uint64_t keys[4] = {10, 20, 30, 40};
    assert_int_equal(atc_kv_index_store(ix, 0, 10, ATC_KV_GPU), 1);
    assert_int_equal(atc_kv_index_store(ix, 0, 10, ATC_KV_GPU), 0); /* known already */
    assert_int_equal(atc_kv_index_store(ix, 0, 20, ATC_KV_GPU), 1);
    assert_int_equal(atc_kv_index_store(ix, 0, 40, ATC_KV_GPU), 1);
    assert_int_equal(atc_kv_index_store(ix, 0, 30, ATC_KV_CPU), 1);
    assert_int_equal(atc_kv_index_store(ix, 1, 10, ATC_KV_GPU), 1);
    assert_int_equal(atc_kv_index_store(ix, 2, 10, ATC_KV_GPU), -1);
    /* in order from the first, stopping at the first not held; tiers kept apart */
    assert_int_equal(atc_kv_index_held_prefix(ix, 0, keys, 4, 1u << ATC_KV_GPU), 2);
    assert_int_equal(atc_kv_index_held_prefix(ix, 0, keys, 4, 1u << ATC_KV_CPU), 0);
    assert_int_equal(atc_kv_index_held_prefix(ix, 0, keys, 4, 3), 4);
    assert_int_equal(atc_kv_index_held_prefix(ix, 1, keys, 4, 3), 1);
    assert_int_equal(atc_kv_index_blocks(ix, 0, ATC_KV_GPU), 3);
    assert_int_equal(atc_kv_index_blocks(ix, 0, ATC_KV_CPU), 1);
    assert_int_equal(atc_kv_index_remove(ix, 0, 20, ATC_KV_GPU), 1);
    assert_int_equal(atc_kv_index_remove(ix, 0, 20, ATC_KV_GPU), 0);
    assert_int_equal(atc_kv_index_remove(ix, 0, 30, ATC_KV_GPU), 0); /* held on the CPU, not the GPU */
    assert_int_equal(atc_kv_index_held_prefix(ix, 0, keys, 4, 3), 1);
    atc_kv_index_clear(ix, 0);
    assert_int_equal(atc_kv_index_blocks(ix, 0, ATC_KV_GPU), 0);
    assert_int_equal(atc_kv_index_blocks(ix, 0, ATC_KV_CPU), 0);
    assert_int_equal(atc_kv_index_held_prefix(ix, 0, keys, 4, 3), 0);
    assert_int_equal(atc_kv_index_held_prefix(ix, 1, keys, 4, 3), 1); /* the other endpoint keeps its own */
    atc_kv_index_destroy(ix);
}

static void test_index_cap_evicts_oldest(void **state)
{
    size_t caps[1] = {4};
    struct atc_kv_index *ix = atc_kv_index_create(caps, 1);
    for (uint64_t k = 1; k <= 6; k++)
        assert_int_equal(atc_kv_index_store(ix, 0, k, ATC_KV_GPU), 1);
    assert_int_equal(atc_kv_index_blocks(ix, 0, ATC_KV_GPU), 4);
    assert_int_equal(atc_kv_index_evicted(ix, 0), 2);
    uint64_t oldest[1] = {1}, second[1] = {2}, newest[4] = {3, 4, 5, 6};
    assert_int_equal(atc_kv_index_held_prefix(ix, 0, oldest, 1, 1), 0);
    assert_int_equal(atc_kv_index_held_prefix(ix, 0, second, 1, 1), 0);
    assert_int_equal(atc_kv_index_held_prefix(ix, 0, newest, 4, 1), 4);
    /* a long churn through the ring (compactions) keeps the count at the cap and the newest four */
    for (uint64_t k = 7; k < 5000; k++) {
        atc_kv_index_store(ix, 0, k, ATC_KV_GPU);
        if (k % 3 == 0)
            atc_kv_index_remove(ix, 0, k - 1, ATC_KV_GPU);
        if (k % 5 == 0) { /* removed and stored again */
            atc_kv_index_remove(ix, 0, k, ATC_KV_GPU);
            atc_kv_index_store(ix, 0, k, ATC_KV_GPU);
        }
        assert_true(atc_kv_index_blocks(ix, 0, ATC_KV_GPU) <= 4);
    }
    uint64_t last[1] = {4999};
    assert_int_equal(atc_kv_index_held_prefix(ix, 0, last, 1, 1), 1);
    atc_kv_index_destroy(ix);
}

/* Random stores and removes on three endpoints against a plain array: deletions that shift probe
 * chains must never lose or invent a key. Keys are few so chains collide. */
static void test_index_matches_a_reference(void **state)
{
    enum { KEYS = 3000, EPS = 3 };
    size_t caps[EPS] = {KEYS * 2, KEYS * 2, KEYS * 2};
    struct atc_kv_index *ix = atc_kv_index_create(caps, EPS);
    static unsigned char ref[EPS][KEYS][2];
    memset(ref, 0, sizeof ref);
    uint64_t rng = 42;
    for (int step = 0; step < 200000; step++) {
        rng = rng * 6364136223846793005u + 1442695040888963407u;
        unsigned ep = (unsigned)(rng >> 60) % EPS, tier = (unsigned)(rng >> 58) & 1;
        size_t key = (size_t)(rng >> 20) % KEYS;
        bool store = (rng >> 40) & 1;
        int got = store ? atc_kv_index_store(ix, ep, key * 0x9e3779b97f4a7c15u, tier)
                        : atc_kv_index_remove(ix, ep, key * 0x9e3779b97f4a7c15u, tier);
        assert_int_equal(got, store ? !ref[ep][key][tier] : ref[ep][key][tier]);
        ref[ep][key][tier] = store;
    }
    for (unsigned ep = 0; ep < EPS; ep++) {
        size_t n[2] = {0, 0};
        for (size_t key = 0; key < KEYS; key++) {
            uint64_t kk = key * 0x9e3779b97f4a7c15u;
            for (unsigned t = 0; t < 2; t++) {
                n[t] += ref[ep][key][t];
                assert_int_equal(atc_kv_index_held_prefix(ix, ep, &kk, 1, 1u << t), ref[ep][key][t]);
            }
        }
        assert_int_equal(atc_kv_index_blocks(ix, ep, ATC_KV_GPU), n[0]);
        assert_int_equal(atc_kv_index_blocks(ix, ep, ATC_KV_CPU), n[1]);
    }
    atc_kv_index_destroy(ix);
}

/* The seqlock's retry, deterministically: the writer rewrites a slot between the reader's load of its key
 * and of its masks (a torn read: the old key with the new masks). The reader must notice the sequence moved
 * and read again, returning the new slot whole. Without the retry it returns the old key with the new
 * masks, and this fails; the thread test below rarely hits that moment. */
static struct {
    struct slot *slot;
    struct slot_view next;
    unsigned fired;
} armed;

static void mid_read(const struct slot *s)
{
    if (armed.slot != s || armed.fired++ > 0)
        return;
    slot_write(armed.slot, &armed.next);
}

static void test_index_torn_read_is_retried(void **state)
{
    (void)state;
    size_t caps[1] = {16};
    struct atc_kv_index *ix = atc_kv_index_create(caps, 1);
    uint64_t old_key = 12345;
    atc_kv_index_store(ix, 0, old_key, ATC_KV_GPU);
    struct slot *s = &ix->slots[find(ix, old_key)];
    armed.slot = s;
    armed.next = (struct slot_view){.used = 1, .key = 777, .mask = {0, 1}}; /* another key moved in */
    armed.fired = 0;
    struct slot_view v = slot_read(s);
    assert_int_equal(armed.fired, 2); /* read twice: the hook ran in the first, and was called again */
    assert_int_equal(v.key, 777);
    assert_int_equal(v.mask[0], 0);
    assert_int_equal(v.mask[1], 1);
    armed.slot = NULL;
    atc_kv_index_destroy(ix);
}

/* One writer (as the main thread), one reader (as a worker) at once. Keys 0..63 are always held by
 * endpoint 0: a reader must always find all of them, whatever the writer does to other keys. */
struct race {
    struct atc_kv_index *ix;
    atomic_bool stop;
    atomic_size_t missed, reads;
};

static void *reader(void *arg)
{
    struct race *r = arg;
    uint64_t keys[64];
    for (int i = 0; i < 64; i++)
        keys[i] = (uint64_t)i * 1000003u;
    while (!atomic_load(&r->stop)) {
        if (atc_kv_index_held_prefix(r->ix, 0, keys, 64, 1) != 64)
            atomic_fetch_add(&r->missed, 1);
        atomic_fetch_add(&r->reads, 1);
    }
    return NULL;
}

static void test_index_reader_thread(void **state)
{
    size_t caps[2] = {200, 4096}; /* endpoint 0: room for its 64 keys on both tiers */
    struct race r = {.ix = atc_kv_index_create(caps, 2)};
    for (int i = 0; i < 64; i++)
        atc_kv_index_store(r.ix, 0, (uint64_t)i * 1000003u, ATC_KV_GPU);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, reader, &r), 0);
    for (int round = 0; round < 20000 || atomic_load(&r.reads) < 100; round++) {
        uint64_t k = (uint64_t)round * 7919u + 1;
        atc_kv_index_store(r.ix, 1, k, ATC_KV_GPU); /* endpoint 1 churns: evictions, compactions */
        atc_kv_index_store(r.ix, 0, (uint64_t)(round % 64) * 1000003u, ATC_KV_CPU);
        if (round % 2)
            atc_kv_index_remove(r.ix, 1, k, ATC_KV_GPU);
    }
    atomic_store(&r.stop, true);
    pthread_join(t, NULL);
    /* endpoint 0 holds every key all along: a reader that missed one, after its retries, is a bug */
    assert_int_equal(atomic_load(&r.missed), 0);
    atc_kv_index_destroy(r.ix);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_array_encoded_batch),
        cmocka_unit_test(test_map_encoded_batch),
        cmocka_unit_test(test_trailing_fields_absent_and_hash_kinds),
        cmocka_unit_test(test_bad_payloads),
        cmocka_unit_test(test_index_store_remove_clear),
        cmocka_unit_test(test_index_cap_evicts_oldest),
        cmocka_unit_test(test_index_matches_a_reference),
        cmocka_unit_test(test_index_torn_read_is_retried),
        cmocka_unit_test(test_index_reader_thread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
