#ifndef ATC_POLICY_WATCHDOG_H
#define ATC_POLICY_WATCHDOG_H

/* The budget of one policy runtime's calls: stops a Lua call which runs past its deadline, from a count
 * hook that looks at the clock (see watchdog.c for how and why; there is no thread). Every function here
 * runs on the thread that makes the call. */

#include <lua.h>
#include <stdbool.h>
#include <stdint.h>

/* The message of a call stopped by the watchdog (the hook prefixes file:line when it knows it). */
#define POLICY_BUDGET_ERROR "policy budget exceeded"

struct watchdog;

/** A watchdog (each call gives its own budget, policy_budget_begin). Returns it (owned: pass to
 * policy_watchdog_destroy), or NULL without memory. */
struct watchdog *policy_watchdog_create(void);

/** Frees @p w (NULL: nothing). No call may be in progress. */
void policy_watchdog_destroy(struct watchdog *w);

/** Arms @p w for a call on @p L that may run @p budget_us of wall-clock time; @p L is borrowed until
 * policy_budget_end. One call at a time per watchdog; calls of several watchdogs on one thread nest
 * (begin and end in reverse order). Sets the budget's count hook on @p L (kept after the call). */
void policy_budget_begin(struct watchdog *w, lua_State *L, uint64_t budget_us);

/** Disarms @p w after the call; returns true when the call overran (and was stopped), having put the
 * budget's hook back in place of the kill hook on @p L. */
bool policy_budget_end(struct watchdog *w, lua_State *L);

/** True while the call in progress has been stopped: for pcall and xpcall, which must not swallow it. */
bool policy_budget_killed(struct watchdog *w);

#endif
