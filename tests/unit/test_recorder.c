/* recorder.c: records written to rotating trace files by the writer thread; a full buffer, sampling and
 * an unwritable directory counted, never fatal; what the relay notes about an answer. */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/buffer.h>

#include "trace/recorder.h"
#include "trace/trace.h"
#include "trace/trace_import.h"

static char tmpdir[] = "/tmp/atc-test-recorder-XXXXXX";

static int setup(void **state)
{
    return mkdtemp(tmpdir) == NULL ? -1 : 0;
}

static int teardown(void **state)
{
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static const char *dir_of(const char *name)
{
    static char buf[512];
    snprintf(buf, sizeof(buf), "%s/%s", tmpdir, name);
    return buf;
}

static size_t count_files(const char *dir)
{
    DIR *d = opendir(dir);
    size_t n = 0;
    struct dirent *e;
    if (d == NULL)
        return 0;
    while ((e = readdir(d)) != NULL)
        n += strstr(e->d_name, ".atct") != NULL;
    closedir(d);
    return n;
}

/* Polls the recorder's counters (1 ms apart, 10 s at most) until @p done says so. */
static void wait_stats(struct atc_recorder *rec, struct atc_recorder_stats *st,
                       bool (*done)(const struct atc_recorder_stats *, uint64_t), uint64_t arg)
{
    for (int i = 0; i < 10000; i++) {
        atc_recorder_stats(rec, st);
        if (done(st, arg))
            return;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    fail_msg("the recorder's writer did not get there in 10 s");
}

static bool written_at_least(const struct atc_recorder_stats *st, uint64_t n)
{
    return st->written >= n || st->write_errors > 0;
}

static bool failed(const struct atc_recorder_stats *st, uint64_t n)
{
    return st->write_errors >= n;
}

static struct atc_recorder_settings settings(const char *dir)
{
    return (struct atc_recorder_settings){
        .dir = dir,
        .prefix = "t",
        .rotate_size = 1 << 20,
        .rotate_interval_ms = 3600000,
        .buffer = 1 << 20,
        .sample = 1,
    };
}

static void add_records(struct atc_recorder *rec, int n, uint64_t t0)
{
    uint64_t blocks[4] = {1, 2, 3, 4};
    for (int i = 0; i < n; i++) {
        struct atc_trace_record r;
        atc_trace_record_init(&r);
        char id[32];
        snprintf(id, sizeof(id), "r%d", i);
        r.id = id;
        r.model = "m";
        r.prompt_tokens = 300;
        r.blocks = blocks;
        r.nblocks = 4;
        r.block_tokens = 64;
        r.prompt = "[]";
        r.prompt_len = 2;
        r.status = 200;
        atc_recorder_add(rec, &r, t0 + (uint64_t)i * 1000);
    }
}

static void test_records_reach_the_file(void **state)
{
    const char *dir = dir_of("plain");
    struct atc_recorder_settings s = settings(dir);
    struct atc_recorder *rec = atc_recorder_create(&s);
    assert_non_null(rec);
    assert_false(atc_recorder_text(rec));
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    add_records(rec, 50, (uint64_t)now.tv_sec * 1000000u + 5000000u); /* arrivals 5 s from now on */
    atc_recorder_destroy(rec);                                        /* flushes */
    assert_int_equal(count_files(dir), 1);

    struct atc_trace *t;
    char *err = NULL;
    assert_int_equal(atc_trace_load(dir, NULL, &t, NULL, &err), 0);
    assert_int_equal(t->n, 50);
    assert_string_equal(t->header.source, "record");
    assert_false(t->header.text);
    assert_true(t->header.start_unix_us > 0);
    assert_string_equal(t->records[7].id, "r7");
    assert_null(t->records[7].prompt); /* no text unless asked */
    assert_int_equal(t->records[7].at_us - t->records[6].at_us, 1000);
    atc_trace_free(t);
}

static void test_rotation_by_size(void **state)
{
    const char *dir = dir_of("rotating");
    struct atc_recorder_settings s = settings(dir);
    s.rotate_size = 200; /* about one record a file */
    s.text = true;
    struct atc_recorder *rec = atc_recorder_create(&s);
    for (int i = 0; i < 5; i++) {
        add_records(rec, 1, (uint64_t)i);
        struct atc_recorder_stats st; /* one batch per record: wait for the writer to take it */
        wait_stats(rec, &st, written_at_least, (uint64_t)i + 1);
    }
    atc_recorder_destroy(rec);
    assert_true(count_files(dir) >= 4);
    struct atc_trace *t;
    char *err = NULL;
    assert_int_equal(atc_trace_load(dir, NULL, &t, NULL, &err), 0);
    assert_int_equal(t->n, 5);
    assert_non_null(t->records[0].prompt); /* record.text */
    atc_trace_free(t);
}

static void test_full_buffer_drops_and_counts(void **state)
{
    struct atc_recorder_settings s = settings(dir_of("small"));
    s.buffer = 300; /* room for one record */
    struct atc_recorder *rec = atc_recorder_create(&s);
    add_records(rec, 100, 0);
    struct atc_recorder_stats st;
    atc_recorder_stats(rec, &st);
    assert_int_equal(st.recorded + st.dropped, 100);
    assert_true(st.dropped > 0);
    atc_recorder_destroy(rec);
}

static void test_sampling(void **state)
{
    struct atc_recorder_settings s = settings(dir_of("sampled"));
    s.sample = 0.25;
    struct atc_recorder *rec = atc_recorder_create(&s);
    add_records(rec, 4000, 0);
    struct atc_recorder_stats st;
    atc_recorder_stats(rec, &st);
    assert_int_equal(st.recorded + st.sampled_out, 4000);
    assert_in_range(st.recorded, 800, 1200);
    atc_recorder_destroy(rec);
}

static void test_unwritable_directory(void **state)
{
    char file[512];
    snprintf(file, sizeof(file), "%s/a-file", tmpdir);
    FILE *f = fopen(file, "w");
    fclose(f);
    char dir[600];
    snprintf(dir, sizeof(dir), "%s/traces", file); /* under a regular file: cannot exist */
    struct atc_recorder_settings s = settings(dir);
    struct atc_recorder *rec = atc_recorder_create(&s);
    assert_non_null(rec);
    add_records(rec, 10, 0);
    struct atc_recorder_stats st;
    wait_stats(rec, &st, failed, 1);
    assert_int_equal(st.written, 0);
    assert_int_equal(st.dropped, 10);
    atc_recorder_destroy(rec);
}

static void test_marks(void **state)
{
    struct atc_record_marks m;
    atc_record_marks_init(&m);
    assert_int_equal(atc_record_marks_output_tokens(&m, true), -1);
    struct evbuffer *b = evbuffer_new();
    evbuffer_add_printf(b, "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"
                           "data: {\"choices\":[{\"delta\":{\"content\":\"a \"}}]}\n\n");
    atc_record_marks_observe(&m, b, true, 1000);
    evbuffer_drain(b, evbuffer_get_length(b));
    evbuffer_add_printf(
        b, "data: {\"choices\":[{\"delta\":{\"content\":\"b \"}}]}\n\n"
           "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n");
    atc_record_marks_observe(&m, b, true, 2000);
    assert_int_equal(m.first_byte_us, 1000);
    assert_int_equal(m.events, 5);
    assert_true(m.done_event);
    assert_int_equal(atc_record_marks_output_tokens(&m, true), 2); /* role, finish and [DONE] not counted */

    /* vLLM's shape: finish_reason on the last content chunk, which is a token */
    atc_record_marks_init(&m);
    evbuffer_drain(b, evbuffer_get_length(b));
    evbuffer_add_printf(b, "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"
                           "data: {\"choices\":[{\"delta\":{\"content\":\"a \"}}]}\n\n"
                           "data: {\"choices\":[{\"delta\":{\"content\":\"b \"},\"finish_reason\":\"stop\"}]}\n\n"
                           "data: [DONE]\n\n");
    atc_record_marks_observe(&m, b, true, 1000);
    assert_int_equal(atc_record_marks_output_tokens(&m, true), 2);

    /* a usage object, when the server sends one, is exact */
    atc_record_marks_init(&m);
    evbuffer_drain(b, evbuffer_get_length(b));
    evbuffer_add_printf(b, "{\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\": 17,"
                           "\"prompt_tokens_details\":{\"cached_tokens\":4}}}");
    atc_record_marks_observe(&m, b, false, 5);
    assert_int_equal(m.events, 0);
    assert_int_equal(m.first_byte_us, 0); /* a whole answer: its first token is not seen */
    assert_int_equal(atc_record_marks_output_tokens(&m, true), 17);
    assert_int_equal(m.prompt_tokens, 9);
    assert_int_equal(m.cached_tokens, 4);
    evbuffer_free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_records_reach_the_file),       cmocka_unit_test(test_rotation_by_size),
        cmocka_unit_test(test_full_buffer_drops_and_counts), cmocka_unit_test(test_sampling),
        cmocka_unit_test(test_unwritable_directory),         cmocka_unit_test(test_marks),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
