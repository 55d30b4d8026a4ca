/* One version of the policy: a Lua state with the sandbox, the entry loaded and checked; calls into
 * it within a budget. */

#include "policy/version.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <luajit.h>

#include "base/clock.h"
#include "base/log.h"
#include "fleet/endpoint.h"
#include "policy/policy_api.h"
#include "policy/state.h"
#include "policy/sandbox.h"
#include "policy/watchdog.h"

/* Messages pushed after a failed call, kept referenced from the registry so that pushing them again
 * finds them interned and allocates nothing: they are needed right when the state may be out of memory,
 * outside any protected call. */
#define NOT_A_STRING "error object is not a string"
static const char keep_key;

void policy_version_destroy(struct policy_version *v)
{
    if (v == NULL)
        return;
    if (v->L != NULL)
        lua_close(v->L);
    policy_fleet_free(v);
    free(v->overlaps);
    free(v->view_slots);
    free(v);
}

/* Garbage must not pile up to the cap: LuaJIT has no emergency collection (an allocation past the cap
 * fails however much is garbage), and with the live set above half the cap the collector's own pace (a
 * cycle once memory doubles) starts too late. A full collection of such a state takes tens of ms, so
 * instead, after each call of a state above half its cap, the collector is stepped in proportion to what
 * the call allocated (GC_PACE times as much work, at least one step of GC_STEP_KB), in steps of
 * GC_STEP_KB, until the call's budget has passed (at least one step): over a few hundred decisions that
 * is a whole cycle, each within its budget, and a call that allocates little costs little. The cap is
 * lifted during a step, which may reallocate the string table: a refusal there would raise outside any
 * protected call (a policy's code cannot run in it: it has no __gc). */
#define GC_STEP_KB 64
#define GC_PACE 4

static void collect_some(struct policy_version *v, uint64_t t0_ns, uint64_t budget_us, size_t allocated)
{
    uint64_t deadline = t0_ns + budget_us * 1000;
    size_t work_kb = allocated / 1024 * GC_PACE;
    size_t limit = v->mem_limit;
    v->mem_limit = SIZE_MAX;
    for (size_t done = 0;;) {
        v->c.gc_steps++;
        if (lua_gc(v->L, LUA_GCSTEP, GC_STEP_KB)) {
            v->c.gc_cycles++;
            break;
        }
        done += GC_STEP_KB;
        if (done >= work_kb || atc_mono_ns() >= deadline)
            break;
    }
    v->mem_limit = limit;
}

/* Calls the function at -2 - nargs with budget @p budget_us; returns the Lua status, 0 when fine,
 * and says why in *why (atc_policy_fallback_budget, _memory or _error). The result or message is left
 * at -1. */
int policy_protected_call(struct policy_version *v, int nargs, uint64_t budget_us, int errfunc,
                          const char **why)
{
    lua_State *L = v->L;
    struct watchdog *w = v->rt->watchdog;
    v->mem_refused = false;
    uint64_t t0 = atc_mono_ns();
    size_t allocated0 = v->mem_allocated;
    policy_budget_begin(w, L, budget_us);
    int status = lua_pcall(L, nargs, 1, errfunc);
    bool overran = policy_budget_end(w, L);
    if (overran) {
        *why = atc_policy_fallback_budget;
        if (status == 0) { /* finished right as the watchdog fired: still an overrun */
            lua_pop(L, 1);
            lua_pushliteral(L, POLICY_BUDGET_ERROR);
            status = LUA_ERRRUN;
        }
    } else if (status == LUA_ERRMEM || (status != 0 && v->mem_refused)) {
        *why = atc_policy_fallback_memory;
    } else {
        *why = atc_policy_fallback_error;
    }
    if (status != 0 && !lua_isstring(L, -1)) {
        lua_pop(L, 1);
        lua_pushliteral(L, NOT_A_STRING);
    }
    if (v->mem_used > v->mem_limit / 2)
        collect_some(v, t0, budget_us, v->mem_allocated - allocated0);
    return status;
}

/* Last resort: every Lua call of the runtime is protected, so this means a bug. Lua exits when it
 * returns; say why first. */
static int on_panic(lua_State *L)
{
    atc_error("policy: unprotected Lua error, exiting: %s",
              lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "(not a string)");
    return 0;
}

/* lua_cpcall: the sandbox, the API and the registry entries of a fresh state. */
static int build_state(lua_State *L)
{
    struct policy_version *v = lua_touserdata(L, 1);
    lua_newtable(L);
    lua_setfield(L, LUA_REGISTRYINDEX, "atc.loaded");
    lua_pushlightuserdata(L, (void *)&keep_key);
    lua_createtable(L, 2, 0);
    lua_pushliteral(L, POLICY_BUDGET_ERROR);
    lua_rawseti(L, -2, 1);
    lua_pushliteral(L, NOT_A_STRING);
    lua_rawseti(L, -2, 2);
    lua_rawset(L, LUA_REGISTRYINDEX);
    policy_sandbox_open(v);
    return 0;
}

/* lua_cpcall: loads the entry, runs it and init(), keeps route in the registry. */
static int load_entry(lua_State *L)
{
    struct policy_version *v = lua_touserdata(L, 1);
    struct atc_policy_runtime *rt = v->rt;
    const char *why;
    if (policy_load_chunk(L, rt->s.entry) < 0 ||
        policy_protected_call(v, 0, rt->s.budget_us * POLICY_INIT_BUDGET_FACTOR, 0, &why) != 0)
        return lua_error(L);
    if (lua_istable(L, -1)) {
        lua_getfield(L, -1, "init");
        if (lua_isfunction(L, -1)) {
            lua_rawgeti(L, LUA_REGISTRYINDEX, v->fleet_ref);
            if (policy_protected_call(v, 1, rt->s.budget_us * POLICY_INIT_BUDGET_FACTOR, 0, &why) != 0)
                return lua_error(L);
        }
        lua_pop(L, 1);
        lua_getfield(L, -1, "route");
        lua_remove(L, -2);
    }
    if (!lua_isfunction(L, -1))
        return luaL_error(L, "%s: must return a function route(req, fleet) or a table with one (got %s)",
                          rt->s.entry, luaL_typename(L, -1));
    v->route_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    return 0;
}

/* "20KiB", "16MiB", or "1000 bytes": the cap as a config would write it. */
static void format_size(char *buf, size_t size, size_t n)
{
    static const char *const units[] = {" bytes", "KiB", "MiB", "GiB"};
    size_t u = 0;
    while (u < 3 && n >= 1024 && n % 1024 == 0) {
        n /= 1024;
        u++;
    }
    snprintf(buf, size, "%zu%s", n, units[u]);
}

/* The message of a failed construction step (the Lua error is at -1), in *err (owned). */
static void build_error(struct policy_version *v, int status, const char *step, char **err)
{
    const char *msg = lua_type(v->L, -1) == LUA_TSTRING ? lua_tostring(v->L, -1) : "policy failed to load";
    char cap[32];
    format_size(cap, sizeof(cap), v->mem_limit);
    int n = status == LUA_ERRMEM || v->mem_refused
                ? asprintf(err, "policy.memory %s is too small to %s: %s", cap, step, msg)
                : asprintf(err, "%s", msg);
    if (n < 0)
        *err = NULL;
}

/* Creates a version from the entry file. Every Lua call runs protected (lua_cpcall), so that running out
 * of memory anywhere comes back as a message. Returns NULL with an owned message in *err. */
struct policy_version *policy_version_create(struct atc_policy_runtime *rt, char **err)
{
    *err = NULL;
    struct policy_version *v = calloc(1, sizeof(*v));
    if (v == NULL)
        goto oom;
    v->rt = rt;
    v->version = rt->next_version + 1; /* what it will be if it loads: init() logs show it */
    v->mem_limit = rt->s.memory;
    v->loaded_at = atc_wall_s();
    size_t nendpoints = rt->table != NULL ? rt->table->nslots : 0; /* overlaps are by slot */
    if ((v->overlaps = calloc(nendpoints ? nendpoints : 1, sizeof(uint16_t))) == NULL)
        goto oom;
    /* LuaJIT's lua_newstate crashes when an allocation fails half-way (measured: a cap of 8KiB), so
     * the cap is applied after it. */
    v->mem_limit = SIZE_MAX;
    v->L = lua_newstate(policy_sandbox_alloc, v);
    v->mem_limit = rt->s.memory;
    if (v->L == NULL)
        goto oom;
    if (v->mem_used > v->mem_limit) {
        char cap[32];
        format_size(cap, sizeof(cap), v->mem_limit);
        if (asprintf(err, "policy.memory %s is too small to create a Lua state", cap) < 0)
            *err = NULL;
        goto fail;
    }
    lua_State *L = v->L;
    lua_atpanic(L, on_panic);
    /* Interpreted by default: count hooks do not fire in compiled traces. */
    luaJIT_setmode(L, 0, LUAJIT_MODE_ENGINE | (rt->s.jit ? LUAJIT_MODE_ON : LUAJIT_MODE_OFF));
    lua_gc(L, LUA_GCSETPAUSE, 200);
    int status = lua_cpcall(L, build_state, v);
    if (status != 0) {
        build_error(v, status, "build the sandbox", err);
        goto fail;
    }
    if (rt->test_mode) /* atc test: the sandbox alone */
        return v;
    v->mem_refused = false;
    if ((status = lua_cpcall(L, load_entry, v)) != 0) {
        build_error(v, status, "load the policy", err);
        goto fail;
    }
    v->files_hash = policy_files_hash(L);
    return v;

oom:
    *err = strdup("out of memory creating the policy state");
fail:
    if (*err == NULL)
        *err = strdup("policy failed to load");
    policy_version_destroy(v);
    return NULL;
}
