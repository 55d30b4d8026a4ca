/* One version of the policy: a Lua state with the sandbox, the entry loaded and checked; calls into
 * it within a budget. */

#include "policy/version.h"

#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <luajit.h>

#include "core/clock.h"
#include "fleet/endpoint.h"
#include "policy/policy_internal.h"
#include "policy/sandbox.h"
#include "policy/watchdog.h"

void policy_version_free(struct policy_version *v)
{
    if (v == NULL)
        return;
    if (v->L != NULL)
        lua_close(v->L);
    free(v->overlaps);
    free(v->view_slots);
    free(v);
}

/* Calls the function at -2 - nargs with budget @p budget_us; returns the Lua status, 0 when fine,
 * and says why in *why ("budget", "memory", "error"). The result or message is left at -1. */
int policy_protected_call(struct policy_version *v, int nargs, uint64_t budget_us, int errfunc,
                          const char **why)
{
    lua_State *L = v->L;
    struct watchdog *w = v->rt->watchdog;
    v->mem_refused = false;
    policy_budget_begin(w, L, budget_us);
    int status = lua_pcall(L, nargs, 1, errfunc);
    bool overran = policy_budget_end(w, L);
    if (overran) {
        *why = "budget";
        if (status == 0) { /* finished right as the watchdog fired: still an overrun */
            lua_pop(L, 1);
            lua_pushliteral(L, POLICY_BUDGET_ERROR);
            status = LUA_ERRRUN;
        }
    } else if (status == LUA_ERRMEM || (status != 0 && v->mem_refused)) {
        *why = "memory";
    } else {
        *why = "error";
    }
    if (status != 0 && !lua_isstring(L, -1)) {
        lua_pop(L, 1);
        lua_pushliteral(L, "error object is not a string");
    }
    /* Garbage must not pile up to the cap between decisions: collect when half of it is used. */
    if (v->mem_used > v->mem_limit / 2)
        lua_gc(L, LUA_GCCOLLECT, 0);
    return status;
}

/* Creates a version from the entry file. Returns NULL with an owned message in *err. */
struct policy_version *policy_version_create(struct atc_policy_runtime *rt, char **err)
{
    struct policy_version *v = calloc(1, sizeof(*v));
    if (v == NULL)
        goto oom;
    v->rt = rt;
    v->version = rt->next_version + 1; /* what it will be if it loads: init() logs show it */
    v->mem_limit = rt->s.memory;
    v->loaded_at = atc_wall_s();
    v->L = lua_newstate(policy_sandbox_alloc, v);
    if (v->L == NULL)
        goto oom;
    lua_State *L = v->L;
    /* Interpreted by default: count hooks do not fire in compiled traces. */
    luaJIT_setmode(L, 0, LUAJIT_MODE_ENGINE | (rt->s.jit ? LUAJIT_MODE_ON : LUAJIT_MODE_OFF));
    lua_gc(L, LUA_GCSETPAUSE, 200);
    size_t nendpoints = rt->table != NULL ? rt->table->nendpoints : 0;
    if ((v->overlaps = calloc(nendpoints ? nendpoints : 1, sizeof(uint16_t))) == NULL)
        goto oom;
    lua_newtable(L);
    lua_setfield(L, LUA_REGISTRYINDEX, "atc.loaded");
    policy_sandbox_open(v);
    if (rt->test_mode) /* atc test: the sandbox alone */
        return v;

    if (policy_load_chunk(L, rt->s.entry) < 0)
        goto lua_fail;
    const char *why;
    if (policy_protected_call(v, 0, rt->s.budget_us * POLICY_INIT_BUDGET_FACTOR, 0, &why) != 0)
        goto lua_fail;
    if (lua_istable(L, -1)) {
        lua_getfield(L, -1, "init");
        if (lua_isfunction(L, -1)) {
            lua_rawgeti(L, LUA_REGISTRYINDEX, v->fleet_ref);
            if (policy_protected_call(v, 1, rt->s.budget_us * POLICY_INIT_BUDGET_FACTOR, 0, &why) != 0)
                goto lua_fail;
        }
        lua_pop(L, 1);
        lua_getfield(L, -1, "route");
        lua_remove(L, -2);
    }
    if (!lua_isfunction(L, -1)) {
        lua_pushfstring(L, "%s: must return a function route(req, fleet) or a table with one (got %s)",
                        rt->s.entry, luaL_typename(L, -1));
        goto lua_fail;
    }
    v->route_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    return v;

lua_fail:
    *err = strdup(lua_tostring(L, -1) != NULL ? lua_tostring(L, -1) : "policy failed to load");
    policy_version_free(v);
    return NULL;
oom:
    *err = strdup("out of memory creating the policy state");
    policy_version_free(v);
    return NULL;
}
