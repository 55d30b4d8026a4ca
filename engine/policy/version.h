#ifndef ATC_POLICY_VERSION_H
#define ATC_POLICY_VERSION_H

/* One version of the policy: its own Lua state, built with the sandbox and the API, the entry file
 * loaded and init() run, all of it under lua_cpcall with a panic handler that logs: running out of
 * policy.memory anywhere in the construction comes back as a message ("policy.memory 20KiB is too
 * small to build the sandbox: not enough memory"), never as an exit. The `atc test` runner uses these
 * too. A version is used only by the thread that owns its runtime. */

/* init() and the synthetic requests of a reload get this many budgets: they may warm caches. */
#define POLICY_INIT_BUDGET_FACTOR 100

#include <stdint.h>

struct atc_policy_runtime;
struct policy_version;

/** A fresh state with the sandbox; in test mode nothing else, otherwise the entry loaded and checked.
 * NULL with an owned message in *err. */
struct policy_version *policy_version_create(struct atc_policy_runtime *rt, char **err);
void policy_version_destroy(struct policy_version *v);
/** lua_pcall of the function below its @p nargs arguments with message handler @p errfunc (0: none),
 * within @p budget_us; returns the Lua status and says why in *why (atc_policy_fallback_budget, _memory
 * or _error). One result (or the message) is left on the stack. */
int policy_protected_call(struct policy_version *v, int nargs, uint64_t budget_us, int errfunc,
                          const char **why);

#endif
