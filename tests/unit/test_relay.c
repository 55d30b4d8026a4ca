/* relay.c's states: the moves relay_set_state allows, and that a move it does not allow, a second end
 * or a callback after the end stops the process (assert) instead of touching freed memory. Assertions
 * are on in this file whatever the build type; each bad move runs in a child process. */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#undef NDEBUG
#include "../../engine/http/relay.c"

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allowed_moves),
        cmocka_unit_test(test_bad_moves_assert),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
