#ifndef ATC_POLICY_VERSION_H
#define ATC_POLICY_VERSION_H

/* One version of the policy: its own Lua state, built with the sandbox and the API, the entry file
 * loaded and init() run, all of it under lua_cpcall with a panic handler that logs: running out of
 * policy.memory anywhere in the construction comes back as a message ("policy.memory 20KiB is too
 * small to build the sandbox: not enough memory"), never as an exit. policy_version_create,
 * policy_version_free and policy_protected_call are declared in policy_internal.h (the `atc test`
 * runner uses them too). A version is used only by the thread that owns its runtime. */

/* init() and the synthetic requests of a reload get this many budgets: they may warm caches. */
#define POLICY_INIT_BUDGET_FACTOR 100

#endif
