#ifndef ATC_POLICY_WATCHDOG_H
#define ATC_POLICY_WATCHDOG_H

/* The budget watchdog of one policy runtime: a thread that stops a Lua call which runs past its
 * deadline (see watchdog.c for how). The runtime's worker thread calls every function here; the
 * watchdog thread only reads the deadline and the lua_State published by policy_budget_begin. */

#include <lua.h>
#include <stdbool.h>
#include <stdint.h>

/* The message of a call stopped by the watchdog (the hook prefixes file:line when it knows it). */
#define POLICY_BUDGET_ERROR "policy budget exceeded"

struct watchdog;

/** Starts the watchdog thread, ticking about once per @p budget_us (clamped to 50 us .. 10 ms).
 * Returns it (owned: pass to policy_watchdog_stop), or NULL when the thread cannot start. */
struct watchdog *policy_watchdog_start(uint64_t budget_us);

/** Stops and joins the thread and frees @p w (NULL: nothing). No call may be in progress. */
void policy_watchdog_stop(struct watchdog *w);

/** Arms @p w for a call on @p L that may run @p budget_us of wall-clock time; @p L is borrowed until
 * policy_budget_end. One call at a time per watchdog. */
void policy_budget_begin(struct watchdog *w, lua_State *L, uint64_t budget_us);

/** Disarms @p w after the call; returns true when the call overran (and was stopped), having removed
 * the kill hook from @p L. */
bool policy_budget_end(struct watchdog *w, lua_State *L);

/** True while the call in progress has been stopped: for pcall and xpcall, which must not swallow it. */
bool policy_budget_killed(struct watchdog *w);

#endif
