/* trace.c and trace_import.c: the MessagePack trace format, reading it back, broken files, and the
 * importers of public traces with their malformed lines reported by line number. Also the replay's
 * determinism at the C level (replay.c), on a small trace. */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/config.h"
#include "trace/replay.h"
#include "trace/trace.h"
#include "trace/trace_import.h"

static char tmpdir[] = "/tmp/atc-test-trace-XXXXXX";

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

static const char *path_of(const char *name)
{
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof(buf[k]), "%s/%s", tmpdir, name);
    return buf[k];
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* Errors reported while importing, captured in a memory stream. */
struct captured {
    char *text;
    size_t len;
    FILE *f;
};

static void capture(struct captured *c)
{
    c->text = NULL;
    c->f = open_memstream(&c->text, &c->len);
    assert_non_null(c->f);
}

static void captured_done(struct captured *c)
{
    fclose(c->f);
}

#define assert_contains(hay, needle)                                                                         \
    do {                                                                                                     \
        if (strstr((hay), (needle)) == NULL) {                                                               \
            print_error("expected \"%s\" in:\n%s\n", (needle), (hay));                                       \
            fail();                                                                                          \
        }                                                                                                    \
    } while (0)

/* ---- the format ---- */

static void test_round_trip(void **state)
{
    struct atc_trace *t = atc_trace_new("record");
    assert_non_null(t);
    t->header.text = true;
    t->header.start_unix_us = 1700000000000000ull;
    uint64_t blocks[3] = {1, UINT64_MAX, 0x123456789abcdefull};
    struct atc_trace_record r;
    atc_trace_record_init(&r);
    r.at_us = 1500;
    r.id = "req-1";
    r.model = "llama-3-8b";
    r.kind = ATC_KIND_COMPLETION;
    r.prompt_tokens = 4096;
    r.max_tokens = 256;
    r.output_tokens = 200;
    r.priority = 7;
    r.tenant = "acme";
    r.session = "s-1";
    r.stream = true;
    r.blocks = blocks;
    r.nblocks = 3;
    r.block_tokens = 64;
    r.prompt = "[{\"role\":\"user\",\"content\":\"hi\"}]";
    r.prompt_len = strlen(r.prompt);
    r.endpoint = "llama-a";
    r.policy_version = 3;
    r.decision = "endpoint";
    r.attempts = 2;
    r.status = 200;
    r.ttft_ms = 12.5;
    r.total_ms = 900.25;
    assert_int_equal(atc_trace_append(t, &r), 0);
    struct atc_trace_record bare; /* every optional field absent */
    atc_trace_record_init(&bare);
    bare.at_us = 2000;
    assert_int_equal(atc_trace_append(t, &bare), 0);

    char *err = NULL;
    assert_int_equal(atc_trace_save(t, path_of("rt.atct"), &err), 0);
    atc_trace_free(t);

    struct atc_trace_header h;
    struct atc_trace_reader *rd = atc_trace_open(path_of("rt.atct"), &h, &err);
    assert_non_null(rd);
    assert_int_equal(h.version, ATC_TRACE_VERSION);
    assert_string_equal(h.source, "record");
    assert_true(h.text);
    assert_true(h.start_unix_us == 1700000000000000ull);
    struct atc_trace_record got;
    assert_int_equal(atc_trace_read(rd, &got, &err), 1);
    assert_int_equal(got.at_us, 1500);
    assert_string_equal(got.id, "req-1");
    assert_string_equal(got.model, "llama-3-8b");
    assert_int_equal(got.kind, ATC_KIND_COMPLETION);
    assert_int_equal(got.prompt_tokens, 4096);
    assert_int_equal(got.max_tokens, 256);
    assert_int_equal(got.output_tokens, 200);
    assert_int_equal(got.priority, 7);
    assert_string_equal(got.tenant, "acme");
    assert_string_equal(got.session, "s-1");
    assert_true(got.stream);
    assert_int_equal(got.nblocks, 3);
    assert_true(got.blocks[0] == 1 && got.blocks[1] == UINT64_MAX && got.blocks[2] == 0x123456789abcdefull);
    assert_int_equal(got.block_tokens, 64);
    assert_int_equal(got.prompt_len, strlen("[{\"role\":\"user\",\"content\":\"hi\"}]"));
    assert_string_equal(got.endpoint, "llama-a");
    assert_int_equal(got.policy_version, 3);
    assert_string_equal(got.decision, "endpoint");
    assert_int_equal(got.attempts, 2);
    assert_int_equal(got.status, 200);
    assert_true(got.ttft_ms == 12.5 && got.total_ms == 900.25);
    assert_int_equal(atc_trace_read(rd, &got, &err), 1);
    assert_int_equal(got.at_us, 2000);
    assert_null(got.id);
    assert_string_equal(got.model, "");
    assert_int_equal(got.max_tokens, -1);
    assert_int_equal(got.output_tokens, -1);
    assert_int_equal(got.nblocks, 0);
    assert_null(got.prompt);
    assert_null(got.endpoint);
    assert_int_equal(got.status, 0);
    assert_true(got.ttft_ms < 0);
    assert_int_equal(atc_trace_read(rd, &got, &err), 0);
    atc_trace_close(rd);
}

static void test_truncated_and_foreign_files(void **state)
{
    /* a whole trace, then cut in the middle of its last record */
    struct atc_trace *t = atc_trace_new("record");
    struct atc_trace_record r;
    atc_trace_record_init(&r);
    r.model = "m";
    for (int i = 0; i < 3; i++) {
        r.at_us = (uint64_t)i * 1000;
        atc_trace_append(t, &r);
    }
    char *err = NULL;
    assert_int_equal(atc_trace_save(t, path_of("cut.atct"), &err), 0);
    atc_trace_free(t);
    FILE *f = fopen(path_of("cut.atct"), "r+");
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fclose(f);
    assert_int_equal(truncate(path_of("cut.atct"), size - 3), 0);

    struct atc_trace_header h;
    struct atc_trace_reader *rd = atc_trace_open(path_of("cut.atct"), &h, &err);
    assert_non_null(rd);
    struct atc_trace_record got;
    assert_int_equal(atc_trace_read(rd, &got, &err), 1);
    assert_int_equal(atc_trace_read(rd, &got, &err), 1);
    assert_int_equal(atc_trace_read(rd, &got, &err), -1);
    assert_contains(err, "record 3");
    assert_contains(err, "truncated");
    free(err);
    err = NULL;
    atc_trace_close(rd);

    /* not a trace at all */
    write_text(path_of("text.atct"), "hello\n");
    assert_null(atc_trace_open(path_of("text.atct"), &h, &err));
    assert_contains(err, "not an atc trace");
    free(err);
    err = NULL;

    /* a header from the future: refused, with both versions named */
    const unsigned char future[] = {0x81, 0xa9, 'a', 't', 'c', '_', 't', 'r', 'a', 'c', 'e', 0x07};
    f = fopen(path_of("future.atct"), "wb");
    fwrite(future, 1, sizeof(future), f);
    fclose(f);
    assert_null(atc_trace_open(path_of("future.atct"), &h, &err));
    assert_contains(err, "version 7 is newer than this atc's (1)");
    free(err);
}

static void test_chain(void **state)
{
    /* Chained hashes: equal prefixes give equal hashes, a different earlier block changes later ones. */
    uint64_t a1 = atc_trace_chain(0, 10), a2 = atc_trace_chain(a1, 11);
    uint64_t b1 = atc_trace_chain(0, 10), b2 = atc_trace_chain(b1, 11);
    uint64_t c1 = atc_trace_chain(0, 99), c2 = atc_trace_chain(c1, 11);
    assert_true(a1 == b1 && a2 == b2);
    assert_true(c2 != a2);
}

/* ---- importers ---- */

static void test_mooncake(void **state)
{
    write_text(path_of("mc.jsonl"),
               "{\"timestamp\": 0, \"input_length\": 1100, \"output_length\": 6, \"hash_ids\": [0, 1, 2]}\n"
               "{\"timestamp\": 40, \"input_length\": 600, \"output_length\": 4, \"hash_ids\": [0, 1]}\n"
               "\n"
               "{\"timestamp\": 40.5, \"input_length\": 12, \"output_length\": 3, \"hash_ids\": [7]}\n");
    struct atc_trace *t;
    char *err = NULL;
    size_t bad = 99;
    struct atc_trace_import_options o = {.format = ATC_TRACE_MOONCAKE, .model = "kimi"};
    assert_int_equal(atc_trace_load(path_of("mc.jsonl"), &o, &t, &bad, &err), 0);
    assert_int_equal(bad, 0);
    assert_string_equal(t->header.source, "mooncake");
    assert_int_equal(t->n, 3);
    assert_int_equal(t->records[1].at_us, 40000);
    assert_int_equal(t->records[2].at_us, 40500);
    assert_string_equal(t->records[0].model, "kimi");
    assert_int_equal(t->records[0].prompt_tokens, 1100);
    assert_int_equal(t->records[0].output_tokens, 6);
    assert_int_equal(t->records[0].max_tokens, 6);
    assert_int_equal(t->records[0].block_tokens, 512);
    assert_int_equal(t->records[0].nblocks, 3);
    /* the shared leading ids become equal leading hashes */
    assert_true(t->records[0].blocks[0] == t->records[1].blocks[0]);
    assert_true(t->records[0].blocks[1] == t->records[1].blocks[1]);
    assert_true(t->records[2].blocks[0] != t->records[0].blocks[0]);
    atc_trace_free(t);
}

/* Alibaba's Qwen-Bailian traces: seconds, 16-token ids, a conversation's turns chained by parent_chat_id
 * into one session; found by content (AUTO), a missing chat_id refused. */
static void test_qwen(void **state)
{
    write_text(path_of("qwen.jsonl"),
               "{\"chat_id\": 3, \"parent_chat_id\": -1, \"timestamp\": 1.5, \"input_length\": 40, "
               "\"output_length\": 5, \"type\": \"text\", \"turn\": 1, \"hash_ids\": [1, 2]}\n"
               "{\"chat_id\": 8, \"parent_chat_id\": 3, \"timestamp\": 4.0, \"input_length\": 70, "
               "\"output_length\": 4, \"type\": \"text\", \"turn\": 2, \"hash_ids\": [1, 2, 3, 4]}\n"
               "{\"chat_id\": 9, \"parent_chat_id\": 8, \"timestamp\": 6.25, \"input_length\": 90, "
               "\"output_length\": 4, \"type\": \"text\", \"turn\": 3, \"hash_ids\": [1, 2, 3, 4, 5]}\n"
               "{\"chat_id\": 12, \"parent_chat_id\": 11, \"timestamp\": 7, \"input_length\": 30, "
               "\"output_length\": 2, \"type\": \"file\", \"turn\": 2, \"hash_ids\": [20]}\n"
               "{\"parent_chat_id\": -1, \"timestamp\": 8, \"input_length\": 30, \"output_length\": 2, "
               "\"hash_ids\": [20]}\n"
               "{\"chat_id\": \"x\", \"parent_chat_id\": -1, \"timestamp\": 9, \"input_length\": 30, "
               "\"output_length\": 2, \"hash_ids\": [21]}\n");
    struct atc_trace *t;
    char *err = NULL;
    size_t bad = 0;
    struct atc_trace_import_options o = {.format = ATC_TRACE_AUTO};
    assert_int_equal(atc_trace_load(path_of("qwen.jsonl"), &o, &t, &bad, &err), 0);
    assert_int_equal(bad, 2); /* the lines without a chat_id, and with one that is not a number */
    assert_string_equal(t->header.source, "qwen");
    assert_int_equal(t->n, 4);
    assert_int_equal(t->records[1].at_us, 2500000); /* seconds, the first at 0 */
    assert_int_equal(t->records[2].at_us, 4750000);
    assert_int_equal(t->records[0].block_tokens, 16);
    assert_string_equal(t->records[0].session, "chat-3");
    assert_string_equal(t->records[1].session, "chat-3");
    assert_string_equal(t->records[2].session, "chat-3"); /* a turn of a turn: still the first's */
    assert_string_equal(t->records[3].session, "chat-11"); /* a parent the file does not hold */
    assert_true(t->records[2].blocks[3] == t->records[1].blocks[3]);
    atc_trace_free(t);
}

static void test_mooncake_malformed_lines(void **state)
{
    write_text(path_of("bad.jsonl"),
               "{\"timestamp\": 0, \"input_length\": 100, \"output_length\": 6, \"hash_ids\": [0]}\n"
               "{\"timestamp\": 1, \"input_length\": -5, \"output_length\": 6, \"hash_ids\": [0]}\n"
               "{\"timestamp\": 2, \"input_length\": 100, \"output_length\": 6, \"hash_ids\": [0]\n"
               "{\"timestamp\": 3, \"input_length\": 100, \"hash_ids\": [0]}\n"
               "{\"timestamp\": 4, \"input_length\": 100, \"output_length\": 6, \"hash_ids\": [0, \"x\"]}\n"
               "[1, 2]\n"
               "{\"timestamp\": 6, \"input_length\": 100, \"output_length\": 1, \"hash_ids\": [0, 1]}\n");
    struct captured c;
    capture(&c);
    struct atc_trace *t;
    char *err = NULL;
    size_t bad = 0;
    struct atc_trace_import_options o = {.format = ATC_TRACE_MOONCAKE, .errors = c.f};
    assert_int_equal(atc_trace_load(path_of("bad.jsonl"), &o, &t, &bad, &err), 0);
    captured_done(&c);
    assert_int_equal(bad, 5);
    assert_int_equal(t->n, 2);
    assert_contains(c.text, "bad.jsonl:2: 'input_length' must be a whole number >= 0");
    assert_contains(c.text, "bad.jsonl:3: invalid JSON");
    assert_contains(c.text, "bad.jsonl:4: missing 'output_length'");
    assert_contains(c.text, "bad.jsonl:5: 'hash_ids' must be an array of whole numbers (item 2 is not)");
    assert_contains(c.text, "bad.jsonl:6: expected a JSON object");
    assert_null(strstr(c.text, "bad.jsonl:1:"));
    assert_null(strstr(c.text, "bad.jsonl:7:"));
    free(c.text);
    atc_trace_free(t);

    /* past max_errors the import gives up, naming the line */
    o.max_errors = 2;
    capture(&c);
    o.errors = c.f;
    assert_int_equal(atc_trace_load(path_of("bad.jsonl"), &o, &t, &bad, &err), -1);
    captured_done(&c);
    assert_contains(err, "more than 2 malformed lines, giving up at line 4");
    free(err);
    free(c.text);
}

static void test_azure(void **state)
{
    write_text(path_of("az.csv"), "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                  "2023-11-16 18:17:03.9799600,4808,10\n"
                                  "2023-11-16 18:17:04.0319600,3180,8\r\n"
                                  "2023-11-16 18:17:04,12,x\n"
                                  "yesterday,1,1\n"
                                  "2023-11-16 18:17:05.5,1,1,extra\n"
                                  "2023-11-16 18:17:06.0000001,100,1\n");
    struct captured c;
    capture(&c);
    struct atc_trace *t;
    char *err = NULL;
    size_t bad = 0;
    struct atc_trace_import_options o = {.format = ATC_TRACE_AUTO, .errors = c.f};
    assert_int_equal(atc_trace_load(path_of("az.csv"), &o, &t, &bad, &err), 0);
    captured_done(&c);
    assert_string_equal(t->header.source, "azure");
    assert_int_equal(bad, 3);
    assert_int_equal(t->n, 3);
    assert_int_equal(t->records[0].at_us, 0);
    assert_int_equal(t->records[1].at_us, 52000);
    assert_int_equal(t->records[2].at_us, 2020040); /* 18:17:06.0000001 - 18:17:03.97996 */
    assert_int_equal(t->records[0].prompt_tokens, 4808);
    assert_int_equal(t->records[0].output_tokens, 10);
    assert_int_equal(t->records[0].nblocks, 0);
    /* the wall clock of the first request is kept */
    assert_true(t->header.start_unix_us == 1700158623979960ull);
    assert_contains(c.text, "az.csv:4: GeneratedTokens: expected a whole number, got 'x'");
    assert_contains(c.text, "az.csv:5: TIMESTAMP: expected YYYY-MM-DD HH:MM:SS[.fraction]");
    assert_contains(c.text, "az.csv:6: expected 3 comma-separated fields, got 4");
    free(c.text);
    atc_trace_free(t);

    write_text(path_of("noheader.csv"), "1,2,3\n");
    o.format = ATC_TRACE_AZURE;
    o.errors = NULL;
    assert_int_equal(atc_trace_load(path_of("noheader.csv"), &o, &t, &bad, &err), -1);
    assert_contains(err, "noheader.csv:1: expected a header line with the columns TIMESTAMP");
    free(err);
}

/* BurstGPT's CSV: seconds from the start, "Request tokens" / "Response tokens"; failed rows (0 response
 * tokens) left out and counted, not malformed. */
static void test_burstgpt(void **state)
{
    write_text(path_of("burst.csv"), "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                                     "45,ChatGPT,1087,230,1317,Conversation log\n"
                                     "5,ChatGPT,472,18,490,Conversation log\n"
                                     "46.25,GPT-4,300,0,300,API log\n"
                                     "soon,GPT-4,1,1,2,API log\n"
                                     "60,GPT-4,many,1,2,API log\n"
                                     "118.5,GPT-4,417,276,693,Conversation log\n");
    struct captured c;
    capture(&c);
    struct atc_trace *t;
    char *err = NULL;
    size_t bad = 0;
    struct atc_trace_import_options o = {.format = ATC_TRACE_AUTO, .errors = c.f};
    assert_int_equal(atc_trace_load(path_of("burst.csv"), &o, &t, &bad, &err), 0);
    captured_done(&c);
    assert_string_equal(t->header.source, "burstgpt");
    assert_int_equal(bad, 2);
    assert_int_equal(t->n, 3);
    assert_int_equal(t->records[0].at_us, 0); /* sorted, and relative to the first */
    assert_int_equal(t->records[0].prompt_tokens, 472);
    assert_int_equal(t->records[1].at_us, 40000000);
    assert_int_equal(t->records[1].output_tokens, 230);
    assert_int_equal(t->records[2].at_us, 113500000);
    assert_true(t->header.start_unix_us == 0); /* seconds from the start are not a date */
    assert_contains(c.text, "burst.csv:5: Timestamp: expected seconds, got 'soon'");
    assert_contains(c.text, "burst.csv:6: Request tokens: expected a whole number, got 'many'");
    assert_contains(c.text, "burst.csv: 1 failed requests (Response tokens 0) left out");
    free(c.text);
    atc_trace_free(t);
}

static void test_jsonl_round_trip_and_order(void **state)
{
    /* what `atc trace dump` prints reads back; out-of-order lines are sorted, ties kept in file order */
    write_text(path_of("d.jsonl"),
               "{\"at_us\":5000,\"id\":\"b\",\"model\":\"m\",\"prompt_tokens\":10,\"session\":\"s\\u00e9\","
               "\"stream\":true,\"priority\":9,\"block_tokens\":64,\"blocks\":[18446744073709551615,2],"
               "\"status\":499,\"ttft_ms\":1.5,\"decision\":\"fallback\",\"kind\":\"embedding\"}\n"
               "{\"at_us\":1000,\"id\":\"a\",\"model\":\"m\",\"prompt_tokens\":10}\n"
               "{\"at_us\":5000,\"id\":\"c\",\"model\":\"m\",\"prompt_tokens\":10}\n");
    struct atc_trace *t;
    char *err = NULL;
    size_t bad = 0;
    struct atc_trace_import_options o = {.format = ATC_TRACE_JSONL};
    assert_int_equal(atc_trace_load(path_of("d.jsonl"), &o, &t, &bad, &err), 0);
    assert_int_equal(t->n, 3);
    assert_string_equal(t->records[0].id, "a");
    assert_string_equal(t->records[1].id, "b");
    assert_string_equal(t->records[2].id, "c");
    assert_int_equal(t->records[0].at_us, 0);
    assert_int_equal(t->records[1].at_us, 4000);
    const struct atc_trace_record *b = &t->records[1];
    assert_string_equal(b->session, "s\xc3\xa9");
    assert_true(b->blocks[0] == UINT64_MAX);
    assert_int_equal(b->status, 499);
    assert_int_equal(b->kind, ATC_KIND_EMBEDDING);
    assert_string_equal(b->decision, "fallback");
    char *text = NULL;
    size_t len;
    FILE *f = open_memstream(&text, &len);
    atc_trace_record_json(f, b);
    fclose(f);
    assert_contains(text, "\"blocks\":[18446744073709551615,2]");
    assert_contains(text, "\"kind\":\"embedding\"");
    write_text(path_of("again.jsonl"), text);
    free(text);
    struct atc_trace *t2;
    assert_int_equal(atc_trace_load(path_of("again.jsonl"), &o, &t2, &bad, &err), 0);
    assert_int_equal(t2->n, 1);
    assert_string_equal(t2->records[0].session, b->session);
    assert_int_equal(t2->records[0].priority, 9);
    atc_trace_free(t2);
    atc_trace_free(t);
}

/* ---- replay: the same seed gives the same run ---- */

static void run_replay(const struct atc_config *cfg, const struct atc_trace *t, uint64_t seed,
                       struct atc_replay_result *res)
{
    struct atc_replay_options o = {.seed = seed};
    char *err = NULL;
    int rc = atc_replay_run(cfg, t, "scripts/policy.lua", "shipped", &o, res, &err);
    if (rc != 0)
        print_error("replay: %s\n", err);
    assert_int_equal(rc, 0);
}

static void test_replay_deterministic(void **state)
{
    const char *yaml = "models:\n  - name: llama-3-8b\nsimulate:\n  - model: llama-3-8b\n    count: 3\n"
                       "    max_seqs: 8\n";
    struct atc_config *cfg;
    char *errors = NULL;
    assert_int_equal(atc_config_parse(yaml, strlen(yaml), "fleet", ".", &cfg, &errors), 0);
    struct atc_trace *t;
    char *err = NULL;
    assert_int_equal(atc_trace_load("tests/policy/fixtures/sessions.jsonl", NULL, &t, NULL, &err), 0);
    struct atc_replay_result a, b;
    run_replay(cfg, t, 3, &a);
    run_replay(cfg, t, 3, &b);
    assert_int_equal(a.completed, t->n);
    assert_int_equal(a.decisions, b.decisions);
    for (size_t i = 0; i < t->n; i++) {
        assert_int_equal(a.endpoint[i], b.endpoint[i]);
        assert_true(a.ttft_ms[i] == b.ttft_ms[i]);
        assert_true(a.e2e_ms[i] == b.e2e_ms[i]);
    }
    assert_true(a.cache_hit_rate == b.cache_hit_rate && a.cache_hit_rate > 0.5);
    assert_true(a.ttft_p90_ms > 0 && a.ttft_p90_ms <= a.ttft_p99_ms);
    atc_replay_result_dispose(&a);
    atc_replay_result_dispose(&b);
    atc_trace_free(t);
    atc_config_free(cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_truncated_and_foreign_files),
        cmocka_unit_test(test_chain),
        cmocka_unit_test(test_mooncake),
        cmocka_unit_test(test_mooncake_malformed_lines),
        cmocka_unit_test(test_qwen),
        cmocka_unit_test(test_azure),
        cmocka_unit_test(test_burstgpt),
        cmocka_unit_test(test_jsonl_round_trip_and_order),
        cmocka_unit_test(test_replay_deterministic),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
