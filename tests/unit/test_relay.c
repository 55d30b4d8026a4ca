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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allowed_moves),
        cmocka_unit_test(test_bad_moves_assert),
        cmocka_unit_test(test_sse_scan_counts_and_refuses_whatever_the_reads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
