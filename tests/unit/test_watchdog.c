/* The budget watchdog (policy/watchdog.c) on its own: a call that spins is stopped within 2x its
 * budget, also inside pcall, with file:line in the message, and the stop ends with its call (the next
 * call on the state runs); short calls are never stopped; and there is no thread to wake. */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <string.h>
#include <time.h>

#include <lauxlib.h>
#include <lualib.h>
#include <luajit.h>

#include "base/clock.h"
#include "policy/watchdog.h"

static lua_State *new_state(const char *chunk)
{
    lua_State *L = luaL_newstate();
    assert_non_null(L);
    luaL_openlibs(L);
    luaJIT_setmode(L, 0, LUAJIT_MODE_ENGINE | LUAJIT_MODE_OFF); /* interpreted, as policies run */
    assert_int_equal(luaL_loadbuffer(L, chunk, strlen(chunk), "=spin.lua"), 0);
    assert_int_equal(lua_pcall(L, 0, 1, 0), 0); /* the chunk returns the function to call */
    return L;
}

static uint64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Calls the function on top of the stack (kept) under @p w and @p budget_us; its status, the elapsed
 * wall-clock and this thread's CPU time, ns. */
static int call(struct watchdog *w, lua_State *L, uint64_t budget_us, bool *overran, uint64_t *ns, uint64_t *cpu)
{
    lua_pushvalue(L, -1);
    uint64_t t0 = atc_mono_ns(), c0 = cpu_ns();
    policy_budget_begin(w, L, budget_us);
    int status = lua_pcall(L, 0, 1, 0);
    *overran = policy_budget_end(w, L);
    *ns = atc_mono_ns() - t0;
    *cpu = cpu_ns() - c0;
    return status;
}

static void test_a_spinning_call_is_stopped_within_twice_its_budget(void **state)
{
    (void)state;
    /* the inner pcall must not swallow the stop: the hook raises again on the next instruction */
    lua_State *L = new_state("return function() while true do pcall(function() while true do end end) end end");
    const uint64_t budget_us = 5000;
    struct watchdog *w = policy_watchdog_create();
    assert_non_null(w);
    for (int i = 0; i < 5; i++) {
        bool overran;
        uint64_t ns, cpu;
        assert_int_not_equal(call(w, L, budget_us, &overran, &ns, &cpu), 0);
        assert_true(overran);
        assert_non_null(strstr(lua_tostring(L, -1), "spin.lua:1: " POLICY_BUDGET_ERROR));
        lua_pop(L, 1);
        assert_true(ns >= budget_us * 1000);
        /* within 2x the budget of the thread's running time; of wall-clock too on a quiet machine, but a
         * busy one may hold the thread off its core for longer than that: wall-clock only says "stopped" */
        assert_true(cpu < 2 * budget_us * 1000 + 500000);
        assert_true(ns < 1000000000ull);
        assert_int_equal(lua_gethookmask(L), LUA_MASKCOUNT); /* the kill hook went with its call */
    }
    lua_settop(L, 0);
    const char *after = "return 7";
    assert_int_equal(luaL_loadbuffer(L, after, strlen(after), "=after.lua"), 0);
    bool overran;
    uint64_t ns, cpu;
    assert_int_equal(call(w, L, budget_us, &overran, &ns, &cpu), 0);
    assert_false(overran);
    assert_int_equal(lua_tointeger(L, -1), 7);
    policy_watchdog_destroy(w);
    lua_close(L);
}

static void test_short_calls_are_never_stopped(void **state)
{
    (void)state;
    lua_State *L = new_state("return function() local s = 0 for i = 1, 200 do s = s + i end return s end");
    /* a budget far above a call's few us, so that a shared machine's preemption does not make an overrun */
    struct watchdog *w = policy_watchdog_create();
    assert_non_null(w);
    uint64_t start = atc_mono_ns();
    unsigned calls = 0;
    while (atc_mono_ns() - start < 200 * 1000000ull) { /* 200 ms of short calls: ten ticks of the watchdog */
        bool overran;
        uint64_t ns, cpu;
        assert_int_equal(call(w, L, 20000, &overran, &ns, &cpu), 0);
        assert_false(overran);
        assert_int_equal(lua_tointeger(L, -1), 20100);
        lua_pop(L, 1);
        calls++;
    }
    assert_true(calls > 1000);
    policy_watchdog_destroy(w);
    lua_close(L);
}

static unsigned threads_now(void)
{
    unsigned n = 0;
    DIR *d = opendir("/proc/self/task");
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static void test_the_watchdog_runs_no_thread(void **state)
{
    (void)state;
    unsigned before = threads_now();
    struct watchdog *w = policy_watchdog_create();
    assert_non_null(w);
    assert_int_equal(threads_now(), before);
    policy_watchdog_destroy(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_spinning_call_is_stopped_within_twice_its_budget),
        cmocka_unit_test(test_short_calls_are_never_stopped),
        cmocka_unit_test(test_the_watchdog_runs_no_thread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
