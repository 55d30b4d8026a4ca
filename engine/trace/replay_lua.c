/* atc.replay(opts) for `atc test` (t.replay in stdlib/atc/test.lua): a trace replayed through a policy
 * against a simulated fleet, returning every decision to the test so it can assert invariants. */

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>

#include "config/config.h"
#include "fleet/endpoint.h"
#include "policy/decision.h"
#include "policy/sandbox.h"
#include "policy/policy.h"
#include "trace/replay.h"
#include "trace/replay_lua.h"
#include "trace/trace.h"
#include "trace/trace_import.h"

#define MAX_OUTAGES 64

struct recorded {
    size_t record;
    double at_ms;
    unsigned attempt;
    enum atc_decision_kind kind;
    const char *reason;
    int endpoint; /* index, -1: none */
    unsigned inflight, capacity;
    int status;
};

#define ABSENT UINT_MAX /* a snapshot's capacity of a server out of the fleet (its from: / until:) */

struct collector {
    struct recorded *v;
    size_t n, cap;
    bool snapshots;
    unsigned *snap; /* per decision: neps (slots) x (inflight, capacity, routable); capacity ABSENT: out */
    size_t neps;
    bool oom;
};

static void on_decision(void *ctx, const struct atc_replay_decision *d)
{
    struct collector *c = ctx;
    if (c->oom)
        return;
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 1024;
        struct recorded *v = realloc(c->v, cap * sizeof(*v));
        unsigned *snap =
            c->snapshots ? realloc(c->snap, cap * d->table->nslots * 3 * sizeof(unsigned)) : NULL;
        if (v != NULL)
            c->v = v;
        if (snap != NULL)
            c->snap = snap;
        if (v == NULL || (c->snapshots && snap == NULL)) {
            c->oom = true;
            return;
        }
        c->cap = cap;
    }
    c->v[c->n] = (struct recorded){
        .record = d->record,
        .at_ms = (double)d->at_us / 1000.0,
        .attempt = d->attempt,
        .kind = d->kind,
        .reason = d->reason,
        .endpoint = d->endpoint != NULL ? (int)d->endpoint->index : -1,
        .inflight = d->inflight,
        .capacity = d->capacity,
        .status = d->status,
    };
    if (c->snapshots) { /* by slot, as res.endpoints[] (the fleet now may lack servers out of their window) */
        c->neps = d->table->nslots;
        unsigned *row = c->snap + c->n * c->neps * 3;
        for (size_t k = 0; k < c->neps; k++) {
            const struct atc_endpoint *ep = d->table->slots[k];
            row[3 * k] = ep != NULL ? ep->inflight : 0;
            row[3 * k + 1] = ep != NULL ? ep->capacity : ABSENT;
            row[3 * k + 2] = ep != NULL && ep->routable;
        }
    }
    c->n++;
}

/* Appends "  key: value" for a scalar at the top of the stack (key at -2); -1 when it is not one. */
static int yaml_scalar(lua_State *L, luaL_Buffer *b)
{
    const char *key = lua_tostring(L, -2);
    if (lua_type(L, -2) != LUA_TSTRING || strspn(key, "abcdefghijklmnopqrstuvwxyz_0123456789") != strlen(key))
        return -1;
    /* from_ms / until_ms (a number): from: / until: in milliseconds, as outages' from_ms (until is a
     * keyword in Lua) */
    bool ms = (strcmp(key, "from_ms") == 0 || strcmp(key, "until_ms") == 0) && lua_type(L, -1) == LUA_TNUMBER;
    luaL_addstring(b, "    ");
    luaL_addlstring(b, key, strlen(key) - (ms ? 3 : 0));
    luaL_addstring(b, ": ");
    switch (lua_type(L, -1)) {
    case LUA_TNUMBER: {
        char num[64];
        snprintf(num, sizeof(num), ms ? "%.17gms" : "%.17g", lua_tonumber(L, -1));
        luaL_addstring(b, num);
        break;
    }
    case LUA_TBOOLEAN:
        luaL_addstring(b, lua_toboolean(L, -1) ? "true" : "false");
        break;
    case LUA_TSTRING: {
        const char *s = lua_tostring(L, -1);
        luaL_addchar(b, '"');
        for (; *s; s++) {
            if (*s == '"' || *s == '\\')
                luaL_addchar(b, '\\');
            if ((unsigned char)*s >= 0x20)
                luaL_addchar(b, *s);
        }
        luaL_addchar(b, '"');
        break;
    }
    default:
        return -1;
    }
    luaL_addchar(b, '\n');
    return 0;
}

/* A fleet given as a list of simulate: entries ({model = "m", count = 3, max_seqs = 8, ...}), as the
 * YAML the config parser validates. Pushes the text. */
static void fleet_yaml(lua_State *L, int list)
{
    luaL_Buffer b;
    int n = (int)lua_objlen(L, list);
    if (n == 0)
        luaL_error(L, "t.replay: fleet: a non-empty list of simulated servers expected");
    luaL_buffinit(L, &b);
    luaL_addstring(&b, "models:\n");
    for (int i = 1; i <= n; i++) { /* each model once */
        lua_rawgeti(L, list, i);
        if (!lua_istable(L, -1))
            luaL_error(L, "t.replay: fleet[%d]: a table expected", i);
        lua_getfield(L, -1, "model");
        const char *model = lua_tostring(L, -1);
        if (model == NULL)
            luaL_error(L, "t.replay: fleet[%d]: model (a string) expected", i);
        bool seen = false;
        for (int j = 1; j < i && !seen; j++) {
            lua_rawgeti(L, list, j);
            lua_getfield(L, -1, "model");
            seen = strcmp(lua_tostring(L, -1), model) == 0;
            lua_pop(L, 2);
        }
        if (!seen) {
            luaL_addstring(&b, "  - name: \"");
            luaL_addstring(&b, model);
            luaL_addstring(&b, "\"\n");
        }
        lua_pop(L, 2);
    }
    luaL_addstring(&b, "simulate:\n");
    for (int i = 1; i <= n; i++) {
        lua_rawgeti(L, list, i);
        luaL_addstring(&b, "  -\n");
        lua_pushnil(L);
        while (lua_next(L, -2) != 0) {
            if (yaml_scalar(L, &b) < 0)
                luaL_error(L,
                           "t.replay: fleet[%d]: '%s' must be a simple key with a number, string or boolean",
                           i, lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : "?");
            lua_pop(L, 1);
        }
        lua_pop(L, 1);
    }
    luaL_pushresult(&b);
}

static double opt_number(lua_State *L, int t, const char *key, double dflt)
{
    lua_getfield(L, t, key);
    double v = lua_isnil(L, -1) ? dflt : luaL_checknumber(L, -1);
    lua_pop(L, 1);
    return v;
}

static void set_number(lua_State *L, const char *key, double v)
{
    lua_pushnumber(L, v);
    lua_setfield(L, -2, key);
}

static void set_string(lua_State *L, const char *key, const char *v)
{
    if (v == NULL)
        return;
    lua_pushstring(L, v);
    lua_setfield(L, -2, key);
}

/* What push_results builds the tables from (owned by atc_replay_lua, which frees it afterwards). */
struct results {
    const struct collector *c;
    struct atc_replay_result res;
    const struct atc_trace *trace;
    const char *model;
    const char *policy; /* the file replayed */
    size_t *last;       /* per record: its last decision + 1 (0: none) */
};

/* Where push_results leaves its tables (a registry key). */
static const char results_key;

static int push_results(lua_State *L);

/* Raises "t.replay: MSG" after freeing @p msg (owned; NULL: @p dflt): the message is copied first, so
 * nothing C owns is left behind by the longjmp. */
static int raise_owned(lua_State *L, char *msg, const char *dflt)
{
    char buf[2048];
    snprintf(buf, sizeof(buf), "t.replay: %s", msg != NULL ? msg : dflt);
    free(msg);
    return luaL_error(L, "%s", buf);
}

/* A module the test required that may be a policy: a function, or a table with a route function. */
static bool is_policy(lua_State *L, int idx)
{
    if (lua_isfunction(L, idx))
        return true;
    if (!lua_istable(L, idx))
        return false;
    lua_getfield(L, idx, "route");
    bool fn = lua_isfunction(L, -1);
    lua_pop(L, 1);
    return fn;
}

/* The file of the module whose value is at @p idx (a value require returned), or NULL. */
static const char *module_file(lua_State *L, int idx)
{
    const char *file = NULL;
    int top = lua_gettop(L);
    lua_getfield(L, LUA_REGISTRYINDEX, "atc.loaded");
    lua_getfield(L, LUA_REGISTRYINDEX, POLICY_MODULE_FILES);
    if (lua_istable(L, top + 1) && lua_istable(L, top + 2)) {
        lua_pushnil(L);
        while (lua_next(L, top + 1) != 0) {
            if (lua_rawequal(L, -1, idx)) {
                lua_pushvalue(L, -2);
                lua_rawget(L, top + 2);
                file = lua_tostring(L, -1); /* held by the module files table */
                break;
            }
            lua_pop(L, 1);
        }
    }
    lua_settop(L, top);
    return file;
}

static bool in_dir(const char *path, const char *dir)
{
    size_t n = dir != NULL ? strlen(dir) : 0;
    return n > 0 && strncmp(path, dir, n) == 0 && path[n] == '/';
}

/* Replaces the policy option at @p idx by the file t.replay replays and returns it (kept alive there):
 * a path as given; a module as require returned it (policy = require "x"); without one, the policy
 * module the test file required itself, so that a test of examples/x.lua does not silently replay
 * scripts/policy.lua; with none, the policy under test (-c's entry, else scripts/policy.lua). Two
 * policy modules and no policy option is an error that names them. */
static const char *replayed_policy(lua_State *L, const struct atc_policy_settings *ps, int idx)
{
    if (lua_type(L, idx) == LUA_TSTRING)
        return lua_tostring(L, idx);
    const char *file = NULL;
    if (!lua_isnil(L, idx)) {
        if ((file = module_file(L, idx)) == NULL)
            luaL_error(L,
                       "t.replay: policy: a file name, or a module as require returned it, expected (got a "
                       "%s that no require returned)",
                       luaL_typename(L, idx));
    } else {
        lua_getfield(L, LUA_REGISTRYINDEX, POLICY_TEST_MODULES);
        int names = lua_gettop(L);
        lua_getfield(L, LUA_REGISTRYINDEX, "atc.loaded");
        lua_pushliteral(L, ""); /* the names of the policy modules, for the error */
        int loaded = names + 1, found = names + 2, n = 0;
        for (int i = 1; lua_istable(L, names) && lua_istable(L, loaded) && i <= (int)lua_objlen(L, names);
             i++) {
            lua_rawgeti(L, names, i);
            lua_pushvalue(L, -1);
            lua_rawget(L, loaded);
            const char *mf = is_policy(L, -1) ? module_file(L, lua_gettop(L)) : NULL;
            if (mf != NULL && !in_dir(mf, ps->stdlib_dir)) { /* atc.test has a route too */
                file = mf;
                lua_pushfstring(L, "%s%s\"%s\"", lua_tostring(L, found), n++ > 0 ? ", " : "",
                                lua_tostring(L, -2));
                lua_replace(L, found);
            }
            lua_settop(L, found);
        }
        if (n > 1)
            luaL_error(L,
                       "t.replay: this test required several policies (%s): say which to replay with "
                       "policy = require \"NAME\"",
                       lua_tostring(L, found));
        if (n == 0)
            file = ps->entry;
        lua_settop(L, names - 1);
    }
    if (file == NULL)
        luaL_error(L, "t.replay: no policy to replay (give policy = FILE)");
    lua_pushstring(L, file);
    lua_replace(L, idx);
    return lua_tostring(L, idx);
}

int atc_replay_lua(struct lua_State *L)
{
    const struct atc_policy_settings *ps = atc_policy_settings_of(L);
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_settop(L, 1);

    /* Everything is read and checked first: a Lua error must not leak what is allocated below. */
    lua_getfield(L, 1, "trace");
    const char *trace_path = luaL_checkstring(L, -1); /* kept alive at index 2 */
    lua_getfield(L, 1, "policy");
    const char *entry = replayed_policy(L, ps, 3); /* index 3 */
    lua_getfield(L, 1, "model");
    const char *model = lua_isnil(L, -1) ? NULL : luaL_checkstring(L, -1); /* index 4 */
    lua_getfield(L, 1, "fleet");                                           /* index 5 */
    const char *fleet_path = NULL;
    if (lua_istable(L, 5))
        fleet_yaml(L, 5); /* index 6 */
    else
        fleet_path = luaL_checkstring(L, 5);
    const char *fleet_text = fleet_path == NULL ? lua_tostring(L, 6) : NULL;
    lua_getfield(L, 1, "snapshots");
    bool snapshots = lua_toboolean(L, -1);
    lua_pop(L, 1);
    struct atc_replay_options o = {
        .seed = (uint64_t)opt_number(L, 1, "seed", 1),
        .limit = (size_t)opt_number(L, 1, "limit", 0),
        .model = model,
        .module_path = ps->path,
        .nmodule_path = ps->npath,
        .log = ps->log,
        .log_ctx = ps->log_ctx,
    };
    struct atc_replay_outage outages[MAX_OUTAGES];
    lua_getfield(L, 1, "outages");
    int top = lua_gettop(L);
    if (!lua_isnil(L, top)) {
        luaL_checktype(L, top, LUA_TTABLE);
        int n = (int)lua_objlen(L, top);
        if (n > MAX_OUTAGES)
            return luaL_error(L, "t.replay: at most %d outages", MAX_OUTAGES);
        for (int i = 1; i <= n; i++) {
            lua_rawgeti(L, top, i); /* stays on the stack: keeps the endpoint string alive */
            if (!lua_istable(L, -1))
                return luaL_error(
                    L, "t.replay: outages[%d]: {endpoint = ID, from_ms = T, to_ms = T} expected", i);
            lua_getfield(L, -1, "endpoint");
            outages[i - 1].endpoint = luaL_checkstring(L, -1);
            lua_pop(L, 1);
            double from = opt_number(L, lua_gettop(L), "from_ms", 0),
                   to = opt_number(L, lua_gettop(L), "to_ms", 1e15);
            if (from < 0 || to < from)
                return luaL_error(L, "t.replay: outages[%d]: need 0 <= from_ms <= to_ms", i);
            outages[i - 1].from_us = (uint64_t)(from * 1000);
            outages[i - 1].to_us = (uint64_t)(to * 1000);
        }
        o.outages = outages;
        o.noutages = (size_t)n;
    }
    struct atc_replay_restart restarts[MAX_OUTAGES];
    lua_getfield(L, 1, "restarts");
    top = lua_gettop(L);
    if (!lua_isnil(L, top)) {
        luaL_checktype(L, top, LUA_TTABLE);
        int n = (int)lua_objlen(L, top);
        if (n > MAX_OUTAGES)
            return luaL_error(L, "t.replay: at most %d restarts", MAX_OUTAGES);
        for (int i = 1; i <= n; i++) {
            lua_rawgeti(L, top, i); /* stays on the stack: keeps the endpoint string alive */
            if (!lua_istable(L, -1))
                return luaL_error(L, "t.replay: restarts[%d]: {endpoint = ID, at_ms = T} expected", i);
            lua_getfield(L, -1, "endpoint");
            restarts[i - 1].endpoint = luaL_checkstring(L, -1);
            lua_pop(L, 1);
            double at = opt_number(L, lua_gettop(L), "at_ms", -1);
            if (at < 0)
                return luaL_error(L, "t.replay: restarts[%d]: need at_ms >= 0", i);
            restarts[i - 1].at_us = (uint64_t)(at * 1000);
        }
        o.restarts = restarts;
        o.nrestarts = (size_t)n;
    }
    o.around = opt_number(L, 1, "around", 0);
    if (o.around < 0 || o.around > 1)
        return luaL_error(L, "t.replay: around: a share in [0, 1] expected");

    /* From here on C owns memory: nothing below raises until it is freed (collect, clean up, then
     * raise). The result tables are built under lua_cpcall, and an error there is raised again only
     * after the C side is freed. */
    struct atc_config *cfg = NULL;
    char *err = NULL;
    if (fleet_path != NULL
            ? atc_config_load(fleet_path, &cfg, &err) < 0
            : atc_config_parse(fleet_text, strlen(fleet_text), "t.replay fleet", ".", &cfg, &err) < 0)
        return raise_owned(L, err, "bad fleet");
    struct atc_trace *trace = NULL;
    struct atc_trace_import_options io = {0};
    if (atc_trace_load(trace_path, &io, &trace, NULL, &err) < 0) {
        atc_config_free(cfg);
        return raise_owned(L, err, "cannot load the trace");
    }
    struct collector c = {.snapshots = snapshots};
    o.on_decision = on_decision;
    o.ctx = &c;
    struct results r = {.c = &c, .trace = trace, .model = model, .policy = entry};
    int rc = atc_replay_run(cfg, trace, entry, "test", &o, &r.res, &err);
    atc_config_free(cfg);
    if (rc == 0) { /* err is the failure's only */
        free(err);
        err = NULL;
    }
    if (rc == 0 && !c.oom)
        r.last = calloc(r.res.requests ? r.res.requests : 1, sizeof(size_t));
    int status = rc == 0 && !c.oom && r.last != NULL ? lua_cpcall(L, push_results, &r) : -1;
    if (rc == 0)
        atc_replay_result_dispose(&r.res);
    atc_trace_free(trace);
    free(c.v);
    free(c.snap);
    free(r.last);
    if (status < 0)
        return raise_owned(L, err, "out of memory");
    /* push_results' message is at the top; a memory error stays fatal to pcall (mem_refused is set). */
    if (status != 0)
        return lua_error(L);
    lua_pushlightuserdata(L, (void *)&results_key); /* taking them out of the registry allocates nothing */
    lua_rawget(L, LUA_REGISTRYINDEX);
    lua_pushlightuserdata(L, (void *)&results_key);
    lua_pushnil(L);
    lua_rawset(L, LUA_REGISTRYINDEX);
    lua_rawgeti(L, -1, 1);
    lua_rawgeti(L, -2, 2);
    return 2;
}

/* lua_cpcall with a struct results: builds the decisions and the summary from C memory the caller
 * frees afterwards, and leaves them in the registry under results_key as {decisions, summary}. */
static int push_results(lua_State *L)
{
    const struct results *rs = lua_touserdata(L, 1);
    const struct collector c = *rs->c;
    const struct atc_replay_result res = rs->res;
    const struct atc_trace *trace = rs->trace;
    const char *model = rs->model;
    size_t *last = rs->last; /* last decision of a record */
    lua_pushlightuserdata(L, (void *)&results_key);
    lua_createtable(L, 2, 0);
    lua_createtable(L, (int)c.n, 0);
    int decisions = lua_gettop(L);
    for (size_t k = 0; k < c.n; k++) {
        const struct recorded *d = &c.v[k];
        const struct atc_trace_record *r = &trace->records[d->record];
        lua_createtable(L, 0, 16);
        set_number(L, "record", (double)d->record + 1);
        set_string(L, "id", r->id);
        set_number(L, "at_ms", d->at_ms);
        set_number(L, "attempt", d->attempt);
        set_string(L, "kind", atc_decision_kind_name(d->kind));
        if (d->endpoint >= 0) {
            set_string(L, "endpoint", res.endpoints[d->endpoint].id);
            set_number(L, "inflight", d->inflight);
            set_number(L, "capacity", d->capacity);
        }
        set_string(L, "model", model != NULL ? model : r->model);
        set_string(L, "session", r->session);
        set_string(L, "tenant", r->tenant);
        set_number(L, "priority", r->priority);
        set_number(L, "prompt_tokens", r->prompt_tokens);
        set_string(L, "reason", d->reason);
        if (d->status != 0)
            set_number(L, "status", d->status);
        if (c.snapshots) {
            lua_createtable(L, 0, (int)c.neps);
            const unsigned *row = c.snap + k * c.neps * 3;
            for (size_t e = 0; e < c.neps && e < res.nendpoints; e++) {
                if (row[3 * e + 1] == ABSENT)
                    continue; /* not in the fleet then: d.fleet[id] is nil */
                lua_createtable(L, 0, 3);
                set_number(L, "inflight", row[3 * e]);
                set_number(L, "capacity", row[3 * e + 1]);
                lua_pushboolean(L, row[3 * e + 2]);
                lua_setfield(L, -2, "routable");
                lua_setfield(L, -2, res.endpoints[e].id);
            }
            lua_setfield(L, -2, "fleet");
        }
        lua_rawseti(L, decisions, (int)k + 1);
        last[d->record] = k + 1;
    }
    for (size_t i = 0; i < res.requests; i++) {
        if (last[i] == 0 || res.ttft_ms[i] != res.ttft_ms[i]) /* no decision, or did not complete */
            continue;
        lua_rawgeti(L, decisions, (int)last[i]);
        set_number(L, "ttft_ms", res.ttft_ms[i]);
        set_number(L, "e2e_ms", res.e2e_ms[i]);
        lua_pop(L, 1);
    }
    lua_rawseti(L, -2, 1);
    lua_createtable(L, 0, 24);
    set_number(L, "requests", (double)res.requests);
    set_number(L, "completed", (double)res.completed);
    set_number(L, "rejected", (double)res.rejected);
    set_number(L, "unserved", (double)res.unserved);
    set_number(L, "queued", (double)res.queued);
    set_number(L, "decisions", (double)res.decisions);
    set_number(L, "fallbacks", (double)res.fallbacks);
    set_number(L, "policy_errors", (double)res.policy_errors);
    set_number(L, "budget_overruns", (double)res.budget_overruns);
    set_number(L, "ttft_p50_ms", res.ttft_p50_ms);
    set_number(L, "ttft_p90_ms", res.ttft_p90_ms);
    set_number(L, "ttft_p99_ms", res.ttft_p99_ms);
    set_number(L, "e2e_p50_ms", res.e2e_p50_ms);
    set_number(L, "e2e_p99_ms", res.e2e_p99_ms);
    set_number(L, "throughput_rps", res.throughput_rps);
    set_number(L, "output_tps", res.output_tps);
    set_number(L, "cache_hit_rate", res.cache_hit_rate);
    set_number(L, "imbalance", res.imbalance);
    set_number(L, "queue_wait_p99_ms", res.queue_wait_p99_ms);
    set_string(L, "policy", rs->policy);
    set_number(L, "around", (double)res.around);
    set_number(L, "guess_samples", (double)res.guess_samples);
    set_number(L, "guessed_cached_tokens", (double)res.guessed_cached_tokens);
    set_number(L, "actual_cached_tokens", (double)res.actual_cached_tokens);
    set_number(L, "guess_error_tokens", (double)res.guess_error_tokens);
    set_number(L, "exact_samples", (double)res.exact_samples);
    set_number(L, "exact_error_tokens", (double)res.exact_error_tokens);
    lua_createtable(L, 0, (int)res.nendpoints); /* endpoints: {[id] = {requests, prefix_blocks, ...}} */
    for (size_t e = 0; e < res.nendpoints; e++) {
        const struct atc_replay_endpoint_result *er = &res.endpoints[e];
        lua_createtable(L, 0, 3);
        set_number(L, "requests", (double)er->requests);
        set_number(L, "prefix_blocks", (double)er->prefix_blocks);
        set_number(L, "prefix_block_hits", (double)er->prefix_block_hits);
        if (er->from_ms > 0)
            set_number(L, "from_ms", (double)er->from_ms);
        if (er->until_ms > 0) {
            set_number(L, "until_ms", (double)er->until_ms);
            set_number(L, "inflight_at_leave", (double)er->inflight_at_leave);
        }
        lua_setfield(L, -2, er->id);
    }
    lua_setfield(L, -2, "endpoints");
    lua_rawseti(L, -2, 2);
    lua_rawset(L, LUA_REGISTRYINDEX);
    return 0;
}
