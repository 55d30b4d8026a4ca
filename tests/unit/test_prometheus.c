/* prometheus.c: the text exposition format, well-formed pages as servers write them, and malformed
 * pages that must be refused with a line number rather than misread or crash. */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fleet/prometheus.h"

#define MAX_SAMPLES 32

struct got {
    size_t n;
    char name[MAX_SAMPLES][128];
    char labels[MAX_SAMPLES][256]; /* name=value|name=value, values unescaped */
    double value[MAX_SAMPLES];
    bool has_ts[MAX_SAMPLES];
    int64_t ts[MAX_SAMPLES];
    int stop_after; /* return 7 from the callback after this many samples (0 = never) */
};

static int collect(void *arg, const struct atc_prom_sample *s)
{
    struct got *g = arg;
    assert_true(g->n < MAX_SAMPLES);
    snprintf(g->name[g->n], sizeof(g->name[0]), "%.*s", (int)s->name_len, s->name);
    size_t o = 0;
    g->labels[g->n][0] = '\0';
    for (size_t i = 0; i < s->nlabels; i++)
        o += (size_t)snprintf(g->labels[g->n] + o, sizeof(g->labels[0]) - o, "%s%.*s=%.*s", i ? "|" : "",
                              (int)s->labels[i].name_len, s->labels[i].name, (int)s->labels[i].value_len,
                              s->labels[i].value);
    g->value[g->n] = s->value;
    g->has_ts[g->n] = s->has_timestamp;
    g->ts[g->n] = s->timestamp_ms;
    g->n++;
    return g->stop_after != 0 && g->n == (size_t)g->stop_after ? 7 : 0;
}

static struct got *parse_ok(const char *text)
{
    static struct got g;
    struct atc_prom_error err = {0};
    memset(&g, 0, sizeof(g));
    int rc = atc_prom_parse(text, strlen(text), collect, &g, &err);
    if (rc != 0)
        print_error("line %zu: %s\n", err.line, err.msg ? err.msg : "?");
    assert_int_equal(rc, 0);
    return &g;
}

static void expect_bad(const char *text, size_t line, const char *msg)
{
    struct got g = {0};
    struct atc_prom_error err = {0};
    int rc = atc_prom_parse(text, strlen(text), collect, &g, &err);
    if (rc != -1 || err.line != line || strstr(err.msg, msg) == NULL)
        print_error("for %s\nexpected line %zu \"%s\", got rc %d line %zu \"%s\"\n", text, line, msg, rc,
                    err.line, err.msg ? err.msg : "(none)");
    assert_int_equal(rc, -1);
    assert_int_equal(err.line, line);
    assert_non_null(strstr(err.msg, msg));
}

/* What vLLM serves (abridged), with HELP, TYPE, labels and a histogram. */
static void test_vllm_page(void **state)
{
    struct got *g =
        parse_ok("# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
                 "# TYPE vllm:num_requests_running gauge\n"
                 "vllm:num_requests_running{engine=\"0\",model_name=\"llama-3-8b\"} 3.0\n"
                 "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
                 "# TYPE vllm:kv_cache_usage_perc gauge\n"
                 "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"llama-3-8b\"} 0.4375\n"
                 "# TYPE vllm:e2e_request_latency_seconds histogram\n"
                 "vllm:e2e_request_latency_seconds_bucket{le=\"0.3\",model_name=\"m\"} 1.0\n"
                 "vllm:e2e_request_latency_seconds_bucket{le=\"+Inf\",model_name=\"m\"} 4.0\n"
                 "vllm:e2e_request_latency_seconds_count{model_name=\"m\"} 4.0\n"
                 "vllm:e2e_request_latency_seconds_sum{model_name=\"m\"} 2.5\n");
    assert_int_equal(g->n, 6);
    assert_string_equal(g->name[0], "vllm:num_requests_running");
    assert_string_equal(g->labels[0], "engine=0|model_name=llama-3-8b");
    assert_true(g->value[0] == 3.0);
    assert_true(g->value[1] == 0.4375);
    assert_string_equal(g->labels[3], "le=+Inf|model_name=m");
    assert_false(g->has_ts[0]);
}

static void test_special_values_and_timestamps(void **state)
{
    struct got *g = parse_ok("a NaN\n"
                             "b +Inf\n"
                             "c -Inf\n"
                             "d Inf 1700000000000\n"
                             "e -2.5e-3 -5\n"
                             "f 1e400\n"
                             "g .5\n"
                             "h 0x10\n"
                             "i nan\n");
    assert_int_equal(g->n, 9);
    assert_true(isnan(g->value[0]));
    assert_true(isinf(g->value[1]) && g->value[1] > 0);
    assert_true(isinf(g->value[2]) && g->value[2] < 0);
    assert_true(isinf(g->value[3]));
    assert_true(g->has_ts[3]);
    assert_true(g->ts[3] == 1700000000000LL);
    assert_true(g->value[4] == -2.5e-3);
    assert_true(g->ts[4] == -5);
    assert_true(isinf(g->value[5]));
    assert_true(g->value[6] == 0.5);
    assert_true(g->value[7] == 16.0);
    assert_true(isnan(g->value[8]));
}

static void test_escaped_label_values(void **state)
{
    struct got *g = parse_ok("m{path=\"C:\\\\dir\",q=\"say \\\"hi\\\"\",nl=\"a\\nb\",other=\"\\x\"} 1\n"
                             "m{empty=\"\",comma=\"a,b}c\",} 2\n"
                             "m{} 3\n"
                             "m { a = \"1\" , b=\"2\" } 4\n");
    assert_int_equal(g->n, 4);
    assert_string_equal(g->labels[0], "path=C:\\dir|q=say \"hi\"|nl=a\nb|other=x");
    assert_string_equal(g->labels[1], "empty=|comma=a,b}c");
    assert_string_equal(g->labels[2], "");
    assert_string_equal(g->labels[3], "a=1|b=2");
}

static void test_comments_blank_lines_crlf_and_eof(void **state)
{
    struct got *g = parse_ok("\n"
                             "# just a comment, with {braces} and \"quotes\n"
                             "#no space after the hash\n"
                             "   \t\n"
                             "# HELP x Docstring with \\\\ and \\n escapes and \"quotes\".\n"
                             "# HELP y\n"
                             "x 1\r\n"
                             "  y 2\n"
                             "# EOF\n"
                             "this is not parsed at all\n");
    assert_int_equal(g->n, 2);
    assert_string_equal(g->name[1], "y");
}

static void test_quoted_names(void **state)
{
    struct got *g = parse_ok("# TYPE \"http.requests\" counter\n"
                             "{\"http.requests\",\"code.class\"=\"2xx\"} 7\n"
                             "{\"only.name\"} 8\n");
    assert_int_equal(g->n, 2);
    assert_string_equal(g->name[0], "http.requests");
    assert_string_equal(g->labels[0], "code.class=2xx");
    assert_string_equal(g->name[1], "only.name");
}

static void test_sglang_page(void **state)
{
    struct got *g = parse_ok("# HELP sglang:num_running_reqs The number of running requests.\n"
                             "# TYPE sglang:num_running_reqs gauge\n"
                             "sglang:num_running_reqs{model_name=\"qwen\",tp_rank=\"0\"} 12.0\n"
                             "sglang:num_queue_reqs{model_name=\"qwen\",tp_rank=\"0\"} 5.0\n"
                             "sglang:token_usage{model_name=\"qwen\",tp_rank=\"0\"} 0.25\n");
    assert_int_equal(g->n, 3);
    assert_true(g->value[2] == 0.25);
}

static void test_label_helpers(void **state)
{
    struct atc_prom_label l[2] = {{"model_name", 10, "m", 1}, {"engine", 6, "0", 1}};
    struct atc_prom_sample s = {.name = "vllm:x", .name_len = 6, .labels = l, .nlabels = 2};
    assert_true(atc_prom_name_is(&s, "vllm:x"));
    assert_false(atc_prom_name_is(&s, "vllm:xy"));
    assert_false(atc_prom_name_is(&s, "vllm:"));
    assert_true(atc_prom_label_is(&s, "model_name", "m"));
    assert_false(atc_prom_label_is(&s, "model_name", "mm"));
    assert_false(atc_prom_label_is(&s, "model", "m"));
    assert_true(atc_prom_label_is(&s, "engine", "0"));
}

static void test_callback_stops_the_parse(void **state)
{
    struct got g = {.stop_after = 2};
    const char *text = "a 1\nb 2\nc 3\n";
    assert_int_equal(atc_prom_parse(text, strlen(text), collect, &g, NULL), 7);
    assert_int_equal(g.n, 2);
}

static void test_empty_and_unterminated_last_line(void **state)
{
    assert_int_equal(parse_ok("")->n, 0);
    struct got *g = parse_ok("a 1\nb 2");
    assert_int_equal(g->n, 2);
    assert_true(g->value[1] == 2.0);
}

static void test_malformed(void **state)
{
    expect_bad("ok 1\n1bad 2\n", 2, "expected a metric name");
    expect_bad("m\n", 1, "missing value");
    expect_bad("m \n", 1, "missing value");
    expect_bad("m abc\n", 1, "bad value");
    expect_bad("m 1.2.3\n", 1, "bad value");
    expect_bad("m nan(1)\n", 1, "bad value");
    expect_bad("m --1\n", 1, "bad value");
    expect_bad("m 1 12x\n", 1, "bad timestamp");
    expect_bad("m 1 99999999999999999999\n", 1, "bad timestamp");
    expect_bad("m 1 2 3\n", 1, "unexpected text after the timestamp");
    expect_bad("m{a=\"1\" 2\n", 1, "expected ',' or '}'");
    expect_bad("m{a=\"1} 2\n", 1, "unterminated quoted string");
    expect_bad("m{a=\"1\\", 1, "unterminated quoted string");
    expect_bad("m{a=1} 2\n", 1, "expected '\"'");
    expect_bad("m{a} 2\n", 1, "expected '='");
    expect_bad("m{=\"x\"} 2\n", 1, "expected a label name");
    expect_bad("m{a:b=\"x\"} 2\n", 1, "expected '='");
    expect_bad("m{a=\"1\",a=\"2\"} 2\n", 1, "duplicate label name");
    expect_bad("m{a=\"1\"}2\n", 1, "expected a space before the value");
    expect_bad("{\"n\"} 1\n{\"x\",\"y\"} 2\n", 2, "expected '='");
    expect_bad("name{\"other\"} 1\n", 1, "a metric name both before and inside the braces");
    expect_bad("{a=\"1\"} 2\n", 1, "expected a metric name");
    expect_bad("# TYPE m sometimes\n", 1, "unknown metric type");
    expect_bad("# TYPE m gauge extra\n", 1, "unexpected text after the type");
    expect_bad("# TYPE 1m gauge\n", 1, "expected a metric name");
    expect_bad("# HELP m-x text\n", 1, "bad character in a metric name");
    expect_bad("m 1e\n", 1, "bad value");
    /* found by tests/fuzz (prometheus): a quoted name may not be empty either */
    expect_bad("m{\"\"=\"v\"} 1\n", 1, "empty name");
    expect_bad("{\"\"} 1\n", 1, "empty name");
    expect_bad("# TYPE \"\" gauge\n", 1, "empty name");
    static const char nul[] = "a 1\nb\0 2\n";
    struct atc_prom_error err = {0};
    struct got g = {0};
    assert_int_equal(atc_prom_parse(nul, sizeof(nul) - 1, collect, &g, &err), -1);
    assert_int_equal(err.line, 2);
    assert_string_equal(err.msg, "NUL byte");
    assert_int_equal(g.n, 1);
    char longnum[200];
    memset(longnum, '1', sizeof(longnum));
    memcpy(longnum, "m ", 2);
    longnum[sizeof(longnum) - 1] = '\0';
    expect_bad(longnum, 1, "number too long");
}

/* Every prefix of a well-formed page, and every single-byte corruption of it, parses or fails cleanly
 * (ASan/UBSan builds check the "cleanly"). */
static void test_truncations_and_corruptions(void **state)
{
    const char *page = "# HELP vllm:num_requests_waiting Waiting.\n"
                       "# TYPE vllm:num_requests_waiting gauge\n"
                       "vllm:num_requests_waiting{model_name=\"a\\\"b\",engine=\"0\",} 2 1700000000\n"
                       "{\"q.name\",x=\"y\"} +Inf\n";
    size_t len = strlen(page);
    static const char bytes[] = {'\0', '"', '\\', '{', '}', '=', ',', ' ', '\n', '#', 'x', '9', '\r'};
    char *buf = malloc(len + 1);
    struct got g;
    for (size_t cut = 0; cut <= len; cut++) {
        memset(&g, 0, sizeof(g));
        memcpy(buf, page, cut);
        (void)atc_prom_parse(buf, cut, collect, &g, NULL);
    }
    for (size_t i = 0; i < len; i++) {
        for (size_t b = 0; b < sizeof(bytes); b++) {
            memcpy(buf, page, len);
            buf[i] = bytes[b];
            memset(&g, 0, sizeof(g));
            struct atc_prom_error err = {0};
            int rc = atc_prom_parse(buf, len, collect, &g, &err);
            assert_true(rc == 0 || (rc == -1 && err.msg != NULL && err.line >= 1 && err.line <= 5));
        }
    }
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vllm_page),
        cmocka_unit_test(test_special_values_and_timestamps),
        cmocka_unit_test(test_escaped_label_values),
        cmocka_unit_test(test_comments_blank_lines_crlf_and_eof),
        cmocka_unit_test(test_quoted_names),
        cmocka_unit_test(test_sglang_page),
        cmocka_unit_test(test_label_helpers),
        cmocka_unit_test(test_callback_stops_the_parse),
        cmocka_unit_test(test_empty_and_unterminated_last_line),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_truncations_and_corruptions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
