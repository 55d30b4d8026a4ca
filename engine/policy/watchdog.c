/* The budget: stops a policy call that runs past its wall-clock deadline, with nothing that wakes or
 * ticks while calls are short. */

#include "policy/watchdog.h"

#include <stdlib.h>

#include "base/clock.h"

/* A count hook stays set on every policy state: each CHECK_EVERY VM instructions it looks at the clock
 * (the vDSO: no syscall) against the deadline of the call in progress on this thread. Past it, the
 * hook becomes a kill hook that raises on every instruction, call and return until the call returns, so
 * pcall cannot swallow it. An overrun is stopped within a few microseconds of its deadline.
 *
 * Why not the thread this replaced: it ticked once per budget while decisions flowed, and each tick
 * woke it on the other core: 60 us of CPU per paced request with the Lua policy against 38 us with the C
 * balancer (docs/benchmarks.md, "Where the time goes"). A timer armed per decision costs two syscalls each; a
 * timer on the thread's CPU-time clock fires only on the scheduler's tick (every 4 ms on this kernel,
 * measured), too coarse for a 1 ms budget. The hook's cost is paid inside the interpreter: LuaJIT sends
 * every instruction through its hook dispatch while a count hook is set (a decrement and a branch), and
 * policies run interpreted anyway (the budget needs that: compiled traces never call a count hook). With
 * the JIT on for a trusted policy, the deadline is looked at only where the interpreter runs.
 *
 * Calls nest on one thread (atc test's t.replay runs decisions of another state inside a test's call):
 * the hook answers to the innermost call, and only on that call's state. Everything here runs on the
 * calling thread. */

/* Instructions between two looks at the clock: a few microseconds of interpreted Lua. */
#define CHECK_EVERY 1000

#define DEADLINE_IDLE 0
#define DEADLINE_KILLED UINT64_MAX

struct watchdog {
    uint64_t deadline_ns;   /* DEADLINE_IDLE, DEADLINE_KILLED, or when the call overruns */
    lua_State *L;           /* the call's state while one is in progress */
    struct watchdog *outer; /* the call in progress on this thread when this one began */
};

static _Thread_local struct watchdog *current; /* the innermost call in progress on this thread */

static void kill_hook(lua_State *L, lua_Debug *ar)
{
    lua_getinfo(L, "Sl", ar);
    if (ar->currentline > 0)
        lua_pushfstring(L, "%s:%d: " POLICY_BUDGET_ERROR, ar->short_src, ar->currentline);
    else
        lua_pushliteral(L, POLICY_BUDGET_ERROR);
    lua_error(L);
}

static void budget_hook(lua_State *L, lua_Debug *ar)
{
    struct watchdog *w = current;
    if (w == NULL || w->L != L || w->deadline_ns == DEADLINE_IDLE || atc_mono_ns() < w->deadline_ns)
        return;
    w->deadline_ns = DEADLINE_KILLED;
    lua_sethook(L, kill_hook, LUA_MASKCOUNT | LUA_MASKCALL | LUA_MASKRET, 1);
    kill_hook(L, ar);
}

struct watchdog *policy_watchdog_create(void)
{
    return calloc(1, sizeof(struct watchdog));
}

void policy_watchdog_destroy(struct watchdog *w)
{
    free(w);
}

void policy_budget_begin(struct watchdog *w, lua_State *L, uint64_t budget_us)
{
    w->L = L;
    w->deadline_ns = atc_mono_ns() + budget_us * 1000;
    w->outer = current;
    current = w;
    if (lua_gethook(L) != budget_hook) /* once per state: setting a hook rewrites the dispatch table */
        lua_sethook(L, budget_hook, LUA_MASKCOUNT, CHECK_EVERY);
}

bool policy_budget_end(struct watchdog *w, lua_State *L)
{
    bool killed = w->deadline_ns == DEADLINE_KILLED;
    w->deadline_ns = DEADLINE_IDLE;
    w->L = NULL;
    current = w->outer;
    w->outer = NULL;
    if (killed)
        lua_sethook(L, budget_hook, LUA_MASKCOUNT, CHECK_EVERY);
    return killed;
}

bool policy_budget_killed(struct watchdog *w)
{
    return w->deadline_ns == DEADLINE_KILLED;
}
