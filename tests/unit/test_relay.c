/* relay.c's states: the moves relay_set_state allows, and that a move it does not allow, a second end
 * or a callback after the end stops the process (assert) instead of touching freed memory. Assertions
 * are on in this file whatever the build type; each bad move runs in a child process. */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#undef NDEBUG
#include "../../engine/proxy/relay.c"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

/* Runs fn(r) on a relay in state @p from in a child; true when the child died of an assertion. */
static bool aborts(enum relay_state from, void (*fn)(struct relay *r, int arg), int arg)
{
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct relay r = {.state = from};
        fclose(stderr); /* the assertion's message is expected */
        fn(&r, arg);
        _exit(0);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
}

static void move_to(struct relay *r, int to)
{
    relay_set_state(r, (enum relay_state)to);
}

static void expect_live(struct relay *r, int unused)
{
    relay_expect(r, RELAY_IN(RELAY_QUEUED) | RELAY_IN(RELAY_ATTEMPT) | RELAY_IN(RELAY_STREAMING));
}

static void test_allowed_moves(void **state)
{
    static const enum relay_state path[] = {RELAY_ROUTING,   RELAY_QUEUED,   RELAY_ATTEMPT, RELAY_ATTEMPT,
                                            RELAY_STREAMING, RELAY_FLUSHING, RELAY_ENDED};
    struct relay r = {.state = RELAY_ROUTING};
    for (size_t i = 1; i < sizeof(path) / sizeof(path[0]); i++) {
        relay_set_state(&r, path[i]);
        assert_int_equal(r.state, path[i]);
    }
    /* every live state may end at once */
    for (enum relay_state s = RELAY_ROUTING; s < RELAY_ENDED; s++)
        assert_false(aborts(s, move_to, RELAY_ENDED));
}

static void test_bad_moves_assert(void **state)
{
    assert_true(aborts(RELAY_ENDED, move_to, RELAY_ENDED));       /* a second end (a double free) */
    assert_true(aborts(RELAY_ENDED, move_to, RELAY_ATTEMPT));     /* a retry after the end */
    assert_true(aborts(RELAY_STREAMING, move_to, RELAY_ATTEMPT)); /* a retry once the answer started */
    assert_true(aborts(RELAY_FLUSHING, move_to, RELAY_STREAMING));
    assert_true(aborts(RELAY_QUEUED, move_to, RELAY_QUEUED)); /* queued twice */
    assert_true(aborts(RELAY_ENDED, expect_live, 0));         /* a callback after the end */
    assert_false(aborts(RELAY_ATTEMPT, expect_live, 0));
}

/* sse_scan over @p text cut after byte @p cut (0: one piece): the events counted, or -1 when refused. */
static long scan_cut(const char *text, size_t cut)
{
    struct relay r = {0};
    size_t len = strlen(text);
    bool ok =
        cut == 0 ? sse_scan(&r, text, len) : sse_scan(&r, text, cut) && sse_scan(&r, text + cut, len - cut);
    return ok ? (long)r.sse_events : -1;
}

/* What a stream's events count, and which streams are refused, does not depend on where the reads from
 * the server split it: an event's blank line split across two reads counts once, a line's head split
 * before its colon is still judged whole. */
static void test_sse_scan_counts_and_refuses_whatever_the_reads(void **state)
{
    static const struct {
        const char *text;
        long events; /* -1: refused */
    } cases[] = {
        {"data: {\"a\":1}\n\ndata: [DONE]\n\n", 2},
        {"data: x\r\n\r\n", 0}, /* "\n\r\n" is no "\n\n" (as before) */
        {"event: token\ndata: a long line past its head\n\n: comment\n\nid: 7\nretry: 10\n\n", 3},
        {"data: x\n\n\n", 1}, /* each "\n" ends at most one event */
        {"data: x\n\n\n\n", 2},
        {"data\n\n", 1}, /* a field with no value */
        {"<html>oops</html>\n\n", -1},
        {"dat\n\n", -1},
        {"datum: x\n\n", -1},
        {"data: ok\n\nHTTP/1.1 500 Internal Server Error\n", -1},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        size_t len = strlen(cases[i].text);
        for (size_t cut = 0; cut < len; cut++) {
            long got = scan_cut(cases[i].text, cut);
            if (got != cases[i].events)
                fail_msg("case %zu cut at %zu: %ld events, want %ld", i, cut, got, cases[i].events);
        }
    }
}

/* The first token is the first complete event with a data field: comments, empty events and an event
 * of other fields are not, nor is a data line whose event has not ended yet; whatever the reads. */
static void test_sse_scan_counts_data_events_whatever_the_reads(void **state)
{
    static const struct {
        const char *text;
        uint64_t data_events;
    } cases[] = {
        {": ping\n\n", 0},
        {"\n\n\n", 0},
        {"event: ping\n\n", 0},
        {": ping\n\ndata: {\"a\":1}\n\n", 1},
        {"data: x\n", 0}, /* not ended yet */
        {"data\n\n", 1},
        {"id: 1\ndata: a\n\n: c\n\ndata: [DONE]\n\n", 2},
        {"data: a long line past its head, which is only eight bytes\n\n", 1},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        size_t len = strlen(cases[i].text);
        for (size_t cut = 0; cut < len; cut++) {
            struct relay r = {0};
            const char *t = cases[i].text;
            assert_true(cut == 0 ? sse_scan(&r, t, len)
                                 : sse_scan(&r, t, cut) && sse_scan(&r, t + cut, len - cut));
            if (r.data_events != cases[i].data_events)
                fail_msg("case %zu cut at %zu: %llu data events, want %llu", i, cut,
                         (unsigned long long)r.data_events, (unsigned long long)cases[i].data_events);
        }
    }
}

static char *text_of(struct evbuffer *b)
{
    evbuffer_add(b, "", 1);
    return (char *)evbuffer_pullup(b, -1);
}

/* The server's headers pass on but those atc writes itself. */
static void test_pass_headers(void **state)
{
    const char *in = "x-engine: vllm\r\nDate: Mon\r\nX-Request-Id: theirs\r\nx-atc-endpoint: e9\r\n"
                     "Cache-Control: no-store\r\nRetry-After: 3\r\n";
    char out[256];
    atc_answer_pass_headers(out, in, strlen(in), false);
    assert_string_equal(out, "x-engine: vllm\r\nCache-Control: no-store\r\nRetry-After: 3\r\n");
    atc_answer_pass_headers(out, in, strlen(in), true); /* atc sets no-cache on a stream */
    assert_string_equal(out, "x-engine: vllm\r\nRetry-After: 3\r\n");
}

/* Error bodies in OpenAI's shape: TGI's and plain text rewritten, OpenAI's left alone. */
static void test_error_bodies(void **state)
{
    static const struct {
        int status;
        const char *in, *out; /* NULL: left alone */
    } cases[] = {
        {429, "{\"error\":\"Model is overloaded\",\"error_type\":\"overloaded\"}",
         "{\"error\":{\"message\":\"Model is overloaded\",\"type\":\"rate_limit_error\",\"param\":null,"
         "\"code\":\"overloaded\"}}"},
        {422, "{\"error\":\"bad \\\"x\\\"\",\"error_type\":\"validation\"}",
         "{\"error\":{\"message\":\"bad \\\"x\\\"\",\"type\":\"invalid_request_error\",\"param\":null,"
         "\"code\":\"validation\"}}"},
        {502, "Bad Gateway\n",
         "{\"error\":{\"message\":\"Bad Gateway\",\"type\":\"server_error\",\"param\":null,\"code\":null}}"},
        {400, "{\"object\":\"error\",\"message\":\"too long\"}",
         "{\"error\":{\"message\":\"too "
         "long\",\"type\":\"invalid_request_error\",\"param\":null,\"code\":null}}"},
        {500, "",
         "{\"error\":{\"message\":\"the server answered with an error\",\"type\":\"server_error\","
         "\"param\":null,\"code\":null}}"},
        {400, "{\"error\":{\"message\":\"m\",\"type\":\"t\",\"param\":null,\"code\":null}}", NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct evbuffer *b = evbuffer_new();
        bool rewrote = atc_answer_error_body(b, cases[i].status, cases[i].in, strlen(cases[i].in));
        assert_int_equal(rewrote, cases[i].out != NULL);
        if (rewrote)
            assert_string_equal(text_of(b), cases[i].out);
        else
            assert_int_equal(evbuffer_get_length(b), 0);
        evbuffer_free(b);
    }
}

/* A stream's first data event as an error: found behind comments, rewritten in place when TGI-shaped. */
static void test_first_event_error(void **state)
{
    struct evbuffer *b = evbuffer_new();
    bool rewrote;
    const char *ok = ": ping\n\ndata: {\"choices\":[]}\n\n";
    assert_false(atc_answer_first_event_error(ok, strlen(ok), b, &rewrote));
    const char *tgi = ": ping\n\ndata:{\"error\":\"no\",\"error_type\":\"validation\"}\n\n";
    assert_true(atc_answer_first_event_error(tgi, strlen(tgi), b, &rewrote));
    assert_true(rewrote);
    assert_string_equal(text_of(b),
                        ": ping\n\ndata: {\"error\":{\"message\":\"no\",\"type\":\"server_error\","
                        "\"param\":null,\"code\":\"validation\"}}\n\n");
    evbuffer_free(b);
    b = evbuffer_new();
    const char *openai = "data: {\"error\":{\"message\":\"m\"}}\n\n";
    assert_true(atc_answer_first_event_error(openai, strlen(openai), b, &rewrote));
    assert_false(rewrote);
    evbuffer_free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allowed_moves),
        cmocka_unit_test(test_bad_moves_assert),
        cmocka_unit_test(test_sse_scan_counts_and_refuses_whatever_the_reads),
        cmocka_unit_test(test_sse_scan_counts_data_events_whatever_the_reads),
        cmocka_unit_test(test_pass_headers),
        cmocka_unit_test(test_error_bodies),
        cmocka_unit_test(test_first_event_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
