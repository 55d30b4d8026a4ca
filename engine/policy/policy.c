/* The policy runtime: Lua states in a sandbox, a budget per decision, memory caps, versions with
 * hot reload and rollback, and the `atc test` runner. What a policy sees is in policy_api.c. */

#include "policy/policy.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <lauxlib.h>
#include <lualib.h>
#include <luajit.h>

#include "fleet/affinity.h"
#include "fleet/endpoint.h"
#include "http/http_util.h"
#include "core/log.h"
#include "policy/policy_internal.h"
#include "core/clock.h"

const char atc_policy_fallback_error[] = "error";
const char atc_policy_fallback_budget[] = "budget";
const char atc_policy_fallback_memory[] = "memory";
const char atc_policy_fallback_invalid[] = "invalid return";

#define BUDGET_ERROR "policy budget exceeded"
/* A new version is on probation (and can be rolled back) until it has made this many good decisions. */
#define PROBATION_SUCCESSES 100
/* init() and the synthetic requests of a reload get this many budgets: they may warm caches. */
#define INIT_BUDGET_FACTOR 100
/* Pattern functions refuse inputs whose worst case (subject length ^ (quantifiers + 1)) exceeds this:
 * Lua patterns backtrack, and a C function cannot be interrupted by the budget. */
#define PATTERN_WORK_MAX 2e7
#define PATTERN_SUBJECT_MAX (64 * 1024)
#define MODULE_NAME_MAX 128

static double default_now_ms(void *ctx)
{
    return (double)atc_mono_ns() / 1e6;
}

double policy_now_ms(const struct atc_policy_runtime *rt)
{
    return rt->now_ms(rt->now_ctx);
}

/* ---- the budget watchdog ----
 *
 * Count hooks cost on every instruction, so none is set on the normal path. A decision publishes its
 * deadline in an atomic; a watchdog thread that ticks while decisions flow arms a count hook on the
 * state only when a deadline has passed. The hook then raises on every instruction until the decision
 * returns, so pcall cannot swallow it. Arming races with the decision's end, so both sides claim the
 * deadline with an atomic exchange: whoever swaps it first decides. */

#define DEADLINE_IDLE 0
#define DEADLINE_KILLED UINT64_MAX

struct watchdog {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic uint64_t deadline_ns; /* DEADLINE_IDLE, DEADLINE_KILLED, or when the decision overruns */
    _Atomic(lua_State *) L;
    _Atomic bool armed;    /* the hook is set (after a kill) */
    _Atomic bool sleeping; /* no decision for a while: waiting on cv */
    bool stop;
    uint64_t tick_ns;
};

static void kill_hook(lua_State *L, lua_Debug *ar)
{
    lua_getinfo(L, "Sl", ar);
    if (ar->currentline > 0)
        lua_pushfstring(L, "%s:%d: " BUDGET_ERROR, ar->short_src, ar->currentline);
    else
        lua_pushliteral(L, BUDGET_ERROR);
    lua_error(L);
}

static void *watchdog_main(void *arg)
{
    struct watchdog *w = arg;
    unsigned idle_ticks = 0;
    for (;;) {
        uint64_t d = atomic_load(&w->deadline_ns);
        if (d == DEADLINE_IDLE) {
            /* After about a second without decisions, sleep until the next one wakes us. */
            if (++idle_ticks * w->tick_ns > 1000000000u) {
                pthread_mutex_lock(&w->mu);
                atomic_store(&w->sleeping, true);
                while (!w->stop && atomic_load(&w->deadline_ns) == DEADLINE_IDLE)
                    pthread_cond_wait(&w->cv, &w->mu);
                atomic_store(&w->sleeping, false);
                pthread_mutex_unlock(&w->mu);
                idle_ticks = 0;
            }
        } else {
            idle_ticks = 0;
            if (d != DEADLINE_KILLED && atc_mono_ns() >= d) {
                uint64_t expected = d;
                if (atomic_compare_exchange_strong(&w->deadline_ns, &expected, DEADLINE_KILLED)) {
                    lua_sethook(atomic_load(&w->L), kill_hook, LUA_MASKCOUNT | LUA_MASKCALL | LUA_MASKRET, 1);
                    atomic_store(&w->armed, true);
                }
            }
        }
        pthread_mutex_lock(&w->mu);
        bool stop = w->stop;
        pthread_mutex_unlock(&w->mu);
        if (stop)
            return NULL;
        struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)w->tick_ns};
        nanosleep(&ts, NULL);
    }
}

static struct watchdog *watchdog_start(uint64_t budget_us)
{
    struct watchdog *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return NULL;
    /* Ticking once per budget stops an overrun between 1x and 2x the budget. A faster tick stops it
     * sooner but costs every request while traffic flows (measured: at 2,000 wakeups a second on a busy
     * 2-core machine, about 13 us of CPU per request at 1,700 requests/s). */
    uint64_t tick = budget_us * 1000;
    w->tick_ns = tick < 50000 ? 50000 : tick > 10000000 ? 10000000 : tick;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (pthread_create(&w->thread, NULL, watchdog_main, w) != 0) {
        free(w);
        return NULL;
    }
    return w;
}

static void watchdog_stop(struct watchdog *w)
{
    if (w == NULL)
        return;
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w);
}

static void budget_begin(struct watchdog *w, lua_State *L, uint64_t budget_us)
{
    atomic_store(&w->L, L);
    atomic_store(&w->armed, false);
    atomic_store(&w->deadline_ns, atc_mono_ns() + budget_us * 1000);
    if (atomic_load(&w->sleeping)) {
        pthread_mutex_lock(&w->mu);
        pthread_cond_signal(&w->cv);
        pthread_mutex_unlock(&w->mu);
    }
}

/* Returns true when the decision overran (and was stopped). Removes the hook. */
static bool budget_end(struct watchdog *w, lua_State *L)
{
    if (atomic_exchange(&w->deadline_ns, DEADLINE_IDLE) != DEADLINE_KILLED)
        return false;
    while (!atomic_load(&w->armed)) /* the watchdog is between its claim and lua_sethook */
        ;
    lua_sethook(L, NULL, 0, 0);
    return true;
}

static bool budget_killed(struct watchdog *w)
{
    return atomic_load(&w->deadline_ns) == DEADLINE_KILLED;
}

/* ---- memory ---- */

static void *policy_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    struct policy_version *v = ud;
    if (nsize == 0) {
        free(ptr);
        v->mem_used -= osize;
        return NULL;
    }
    if (nsize > osize && v->mem_used + (nsize - osize) > v->mem_limit) {
        v->mem_refused = true;
        return NULL;
    }
    void *p = realloc(ptr, nsize);
    if (p == NULL)
        return NULL;
    v->mem_used = v->mem_used - osize + nsize;
    return p;
}

/* ---- the sandbox ---- */

static struct policy_version *version_of(lua_State *L)
{
    return lua_touserdata(L, lua_upvalueindex(1));
}

/* pcall and xpcall that cannot swallow a budget stop or an out-of-memory error. */
static int rethrow_if_fatal(lua_State *L, struct policy_version *v, int status)
{
    if (v->rt->watchdog != NULL && budget_killed(v->rt->watchdog)) {
        lua_pushliteral(L, BUDGET_ERROR); /* whatever a handler made of it */
        return lua_error(L);
    }
    if (status == LUA_ERRMEM)
        return lua_error(L);
    return 0;
}

static int sb_pcall(lua_State *L)
{
    struct policy_version *v = version_of(L);
    luaL_checkany(L, 1);
    int status = lua_pcall(L, lua_gettop(L) - 1, LUA_MULTRET, 0);
    rethrow_if_fatal(L, v, status);
    lua_pushboolean(L, status == 0);
    lua_insert(L, 1);
    return lua_gettop(L);
}

static int sb_xpcall(lua_State *L)
{
    struct policy_version *v = version_of(L);
    luaL_checkany(L, 2);
    lua_settop(L, 2);
    lua_insert(L, 1); /* handler, f */
    int status = lua_pcall(L, 0, LUA_MULTRET, 1);
    rethrow_if_fatal(L, v, status);
    lua_pushboolean(L, status == 0);
    lua_replace(L, 1);
    return lua_gettop(L);
}

/* Worst-case work of a Lua pattern on a subject: backtracking nests once per quantifier. */
static int pattern_guard(lua_State *L, bool anchored_ok)
{
    size_t n, m;
    luaL_checklstring(L, 1, &n);
    const char *pat = luaL_checklstring(L, 2, &m);
    if (n > PATTERN_SUBJECT_MAX)
        return luaL_error(L, "subject of %d bytes is too long for a pattern (limit %d); use a plain find",
                          (int)n, PATTERN_SUBJECT_MAX);
    int q = 0;
    for (size_t i = 0; i < m; i++) {
        if (pat[i] == '%')
            i++;
        else if (pat[i] == '*' || pat[i] == '+' || pat[i] == '-')
            q++;
    }
    int exponent = q + ((anchored_ok && m > 0 && pat[0] == '^') ? 0 : 1);
    if (q > 0 && pow((double)n, exponent) > PATTERN_WORK_MAX)
        return luaL_error(L, "pattern with %d quantifiers on %d bytes could take too long", q, (int)n);
    return 0;
}

static int call_original(lua_State *L)
{
    lua_pushvalue(L, lua_upvalueindex(2));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
    return lua_gettop(L);
}

static int sb_find(lua_State *L)
{
    if (!lua_toboolean(L, 4)) /* plain finds are linear */
        pattern_guard(L, true);
    return call_original(L);
}

static int sb_match(lua_State *L)
{
    pattern_guard(L, true);
    return call_original(L);
}

static int sb_scan(lua_State *L) /* gmatch and gsub visit every position */
{
    pattern_guard(L, false);
    return call_original(L);
}

/* Replaces string.NAME by a guard that calls the original (an upvalue). Table at -1. */
static void wrap_string_fn(lua_State *L, struct policy_version *v, const char *name, lua_CFunction guard)
{
    lua_pushlightuserdata(L, v);
    lua_getfield(L, -2, name);
    lua_pushcclosure(L, guard, 2);
    lua_setfield(L, -2, name);
}

static int readonly_newindex(lua_State *L)
{
    return luaL_error(L, "attempt to modify a read-only table");
}

static int global_newindex(lua_State *L)
{
    return luaL_error(L, "assignment to undeclared global '%s' (use local)", luaL_optstring(L, 2, "?"));
}

/* Pushes a read-only proxy of the table at @p idx. */
static void push_readonly(lua_State *L, int idx)
{
    idx = idx < 0 ? lua_gettop(L) + idx + 1 : idx;
    lua_newtable(L);
    lua_createtable(L, 0, 3);
    lua_pushvalue(L, idx);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, readonly_newindex);
    lua_setfield(L, -2, "__newindex");
    lua_pushboolean(L, 0);
    lua_setfield(L, -2, "__metatable");
    lua_setmetatable(L, -2);
}

/* Copies the global library @p name, minus @p drop, as a read-only proxy into the sandbox table at -1. */
static void sandbox_library(lua_State *L, const char *name, const char *const *drop)
{
    lua_getglobal(L, name);
    for (; drop != NULL && *drop != NULL; drop++) {
        lua_pushnil(L);
        lua_setfield(L, -2, *drop);
    }
    push_readonly(L, -1);
    lua_setfield(L, -3, name);
    lua_pop(L, 1);
}

static int sb_require(lua_State *L);

/* Builds the sandbox: the only globals a policy chunk can reach, read-only, in the registry under
 * "atc.sandbox". */
static void sandbox_open(struct policy_version *v)
{
    lua_State *L = v->L;
    static const lua_CFunction libs[] = {luaopen_base, luaopen_table, luaopen_string, luaopen_math,
                                         luaopen_bit};
    for (size_t i = 0; i < sizeof(libs) / sizeof(libs[0]); i++) {
        lua_pushcfunction(L, libs[i]);
        lua_call(L, 0, 0);
    }
    lua_newtable(L); /* the sandbox's globals */
    static const char *const base[] = {"assert",   "error",    "ipairs", "next",   "pairs", "select",
                                       "tonumber", "tostring", "type",   "unpack", NULL};
    for (const char *const *b = base; *b; b++) {
        lua_getglobal(L, *b);
        lua_setfield(L, -2, *b);
    }
    lua_pushlightuserdata(L, v);
    lua_pushcclosure(L, sb_pcall, 1);
    lua_setfield(L, -2, "pcall");
    lua_pushlightuserdata(L, v);
    lua_pushcclosure(L, sb_xpcall, 1);
    lua_setfield(L, -2, "xpcall");
    lua_pushlightuserdata(L, v);
    lua_pushcclosure(L, sb_require, 1);
    lua_setfield(L, -2, "require");

    /* string: no dump, guarded patterns; also reached through every string's metatable. */
    lua_getglobal(L, "string");
    lua_pushnil(L);
    lua_setfield(L, -2, "dump");
    wrap_string_fn(L, v, "find", sb_find);
    wrap_string_fn(L, v, "match", sb_match);
    wrap_string_fn(L, v, "gmatch", sb_scan);
    wrap_string_fn(L, v, "gsub", sb_scan);
    push_readonly(L, -1);
    lua_pushliteral(L, "");
    lua_getmetatable(L, -1);
    lua_pushvalue(L, -3);
    lua_setfield(L, -2, "__index");
    lua_pop(L, 2);
    lua_setfield(L, -3, "string");
    lua_pop(L, 1);

    policy_api_open(v); /* req, fleet, endpoints, and the atc table */

    /* math.random is the host's (seedable, replayable) generator. */
    lua_getglobal(L, "math");
    lua_getfield(L, -2, "atc");
    lua_getfield(L, -1, "random");
    lua_setfield(L, -3, "random");
    lua_pop(L, 2);
    static const char *const math_drop[] = {"randomseed", NULL};
    sandbox_library(L, "math", math_drop);
    sandbox_library(L, "table", NULL);
    sandbox_library(L, "bit", NULL);

    push_readonly(L, -1);
    lua_setfield(L, LUA_REGISTRYINDEX, "atc.sandbox");
    lua_pop(L, 1);

    /* Nothing outside the sandbox table should be reachable; drop the real globals' dangerous parts
     * too, in case a reference leaks. */
    static const char *const unsafe[] = {"load",           "loadstring", "dofile",       "loadfile",
                                         "setfenv",        "getfenv",    "rawset",       "rawget",
                                         "rawequal",       "newproxy",   "setmetatable", "getmetatable",
                                         "collectgarbage", "module",     "gcinfo",       NULL};
    for (const char *const *u = unsafe; *u; u++) {
        lua_pushnil(L);
        lua_setglobal(L, *u);
    }
}

/* Gives the function at -1 a fresh environment that reads the sandbox and refuses new globals. */
static void set_chunk_env(lua_State *L)
{
    lua_newtable(L);
    lua_createtable(L, 0, 3);
    lua_getfield(L, LUA_REGISTRYINDEX, "atc.sandbox");
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, global_newindex);
    lua_setfield(L, -2, "__newindex");
    lua_pushboolean(L, 0);
    lua_setfield(L, -2, "__metatable");
    lua_setmetatable(L, -2);
    lua_setfenv(L, -2);
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? cap * 2 : 16384;
            char *nb = realloc(buf, cap);
            if (nb == NULL) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = nb;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0)
            break;
    }
    fclose(f);
    *len = n;
    return buf;
}

/* Loads a Lua source file (text only) as a sandboxed chunk; pushes it, or an error message. 0 / -1. */
int policy_load_chunk(lua_State *L, const char *path)
{
    size_t len;
    char *src = read_file(path, &len);
    if (src == NULL) {
        lua_pushfstring(L, "cannot read %s: %s", path, strerror(errno));
        return -1;
    }
    char chunkname[PATH_MAX + 2];
    snprintf(chunkname, sizeof(chunkname), "@%s", path);
    int rc = luaL_loadbufferx(L, src, len, chunkname, "t");
    free(src);
    if (rc != 0)
        return -1;
    set_chunk_env(L);
    return 0;
}

/* The directories require searches, in order: the entry's own, stdlib, then policy.path. */
static size_t module_dirs(const struct atc_policy_runtime *rt, const char **dirs, char *entry_dir, size_t max)
{
    size_t n = 0;
    snprintf(entry_dir, PATH_MAX, "%s", rt->s.entry != NULL ? rt->s.entry : ".");
    char *slash = strrchr(entry_dir, '/');
    if (slash != NULL)
        *slash = '\0';
    else
        snprintf(entry_dir, PATH_MAX, ".");
    dirs[n++] = entry_dir;
    if (rt->s.stdlib_dir != NULL)
        dirs[n++] = rt->s.stdlib_dir;
    for (size_t i = 0; i < rt->s.npath && n < max; i++)
        dirs[n++] = rt->s.path[i];
    return n;
}

static int sb_require(lua_State *L)
{
    struct policy_version *v = version_of(L);
    size_t len;
    const char *name = luaL_checklstring(L, 1, &len);
    if (len == 0 || len > MODULE_NAME_MAX || strstr(name, "..") != NULL || name[0] == '.')
        return luaL_error(L, "invalid module name '%s'", name);
    for (size_t i = 0; i < len; i++)
        if (!(name[i] == '.' || name[i] == '_' || name[i] == '-' || (name[i] >= 'a' && name[i] <= 'z') ||
              (name[i] >= 'A' && name[i] <= 'Z') || (name[i] >= '0' && name[i] <= '9')))
            return luaL_error(L, "invalid module name '%s'", name);

    lua_getfield(L, LUA_REGISTRYINDEX, "atc.loaded");
    lua_getfield(L, -1, name);
    if (lua_touserdata(L, -1) == (void *)sb_require)
        return luaL_error(L, "module '%s' requires itself (a require loop)", name);
    if (!lua_isnil(L, -1))
        return 1;
    lua_pop(L, 1);

    char rel[MODULE_NAME_MAX + 8];
    snprintf(rel, sizeof(rel), "%s.lua", name);
    for (char *p = rel; *p && strcmp(p, ".lua") != 0; p++)
        if (*p == '.')
            *p = '/';
    const char *dirs[16];
    char entry_dir[PATH_MAX];
    size_t ndirs = module_dirs(v->rt, dirs, entry_dir, 16);
    char path[PATH_MAX];
    for (size_t i = 0; i < ndirs; i++) {
        snprintf(path, sizeof(path), "%s/%s", dirs[i], rel);
        struct stat st;
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        lua_pushlightuserdata(L, (void *)sb_require); /* loading sentinel */
        lua_setfield(L, -2, name);
        if (policy_load_chunk(L, path) < 0)
            return lua_error(L);
        lua_pushstring(L, name);
        lua_call(L, 1, 1);
        if (lua_isnil(L, -1)) {
            lua_pop(L, 1);
            lua_pushboolean(L, 1);
        }
        lua_pushvalue(L, -1);
        lua_setfield(L, -3, name);
        return 1;
    }
    return luaL_error(L, "module '%s' not found in the policy's module path (as %s)", name, rel);
}

/* ---- versions ---- */

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
    budget_begin(w, L, budget_us);
    int status = lua_pcall(L, nargs, 1, errfunc);
    bool overran = budget_end(w, L);
    if (overran) {
        *why = atc_policy_fallback_budget;
        if (status == 0) { /* finished right as the watchdog fired: still an overrun */
            lua_pop(L, 1);
            lua_pushliteral(L, BUDGET_ERROR);
            status = LUA_ERRRUN;
        }
    } else if (status == LUA_ERRMEM || (status != 0 && v->mem_refused)) {
        *why = atc_policy_fallback_memory;
    } else {
        *why = atc_policy_fallback_error;
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
    v->L = lua_newstate(policy_alloc, v);
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
    sandbox_open(v);
    if (rt->test_mode) /* atc test: the sandbox alone */
        return v;

    if (policy_load_chunk(L, rt->s.entry) < 0)
        goto lua_fail;
    const char *why;
    if (policy_protected_call(v, 0, rt->s.budget_us * INIT_BUDGET_FACTOR, 0, &why) != 0)
        goto lua_fail;
    if (lua_istable(L, -1)) {
        lua_getfield(L, -1, "init");
        if (lua_isfunction(L, -1)) {
            lua_rawgeti(L, LUA_REGISTRYINDEX, v->fleet_ref);
            if (policy_protected_call(v, 1, rt->s.budget_us * INIT_BUDGET_FACTOR, 0, &why) != 0)
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

/* ---- decisions ---- */

static void log_failure(struct atc_policy_runtime *rt, struct policy_version *v, const char *what,
                        const char *msg)
{
    /* Rate-limited: the first failures of a version, then every 1000th. */
    uint64_t failures = v->c.errors + v->c.overruns + v->c.oom + v->c.invalid;
    if (failures <= 10 || failures % 1000 == 0)
        atc_warn("policy v%llu %s (failure %llu, routed by the C balancer): %s",
                 (unsigned long long)v->version, what, (unsigned long long)failures, msg);
    free(rt->last_error);
    rt->last_error = strdup(msg);
}

static void rollback(struct atc_policy_runtime *rt)
{
    struct policy_version *bad = rt->current;
    atc_error("policy v%llu failed %u decisions in a row: rolling back to v%llu",
              (unsigned long long)bad->version, bad->consecutive_failures,
              (unsigned long long)rt->last_good->version);
    rt->current = rt->last_good;
    rt->last_good = NULL;
    rt->rollbacks++;
    if (rt->s.group != NULL) { /* the other workers follow at their next decision */
        atomic_store(&rt->s.group->rolled_back, bad->version);
        atomic_store(&rt->s.group->streak, 0);
    }
    policy_version_free(bad); /* decisions are synchronous: nothing else uses it now */
}

void atc_policy_sync(struct atc_policy_runtime *rt)
{
    if (rt->s.group != NULL && rt->last_good != NULL &&
        atomic_load(&rt->s.group->rolled_back) == rt->current->version) {
        rt->current->consecutive_failures = atomic_load(&rt->s.group->streak);
        rollback(rt);
    }
}

static void count_result(struct atc_policy_runtime *rt, struct policy_version *v, bool ok)
{
    struct atc_policy_group *g = rt->s.group;
    if (ok) {
        v->consecutive_failures = 0;
        if (g != NULL && atomic_load_explicit(&g->streak, memory_order_relaxed) != 0)
            atomic_store(&g->streak, 0);
        if (++v->successes == PROBATION_SUCCESSES && rt->last_good != NULL && rt->current == v) {
            policy_version_free(rt->last_good); /* proven: the previous version is no longer needed */
            rt->last_good = NULL;
        }
        return;
    }
    rt->fallbacks++;
    v->consecutive_failures = g != NULL ? atomic_fetch_add(&g->streak, 1) + 1 : v->consecutive_failures + 1;
    if (rt->current == v && rt->last_good != NULL && rt->s.rollback_after > 0 &&
        v->consecutive_failures >= rt->s.rollback_after)
        rollback(rt);
}

/* Turns the value at -1 into a decision; false when it is not one. */
static bool interpret(struct policy_version *v, struct atc_decision *out)
{
    lua_State *L = v->L;
    struct policy_verdict *verdict = luaL_testudata(L, -1, POLICY_MT_VERDICT);
    if (verdict != NULL) {
        out->kind = verdict->kind;
        out->status = verdict->status;
        snprintf(out->message, sizeof(out->message), "%s", verdict->message);
        return true;
    }
    struct atc_endpoint *ep = policy_api_to_endpoint(v, -1);
    if (ep == NULL || !policy_api_available(v, ep))
        return false;
    out->kind = ATC_DECISION_ENDPOINT;
    out->endpoint = ep;
    return true;
}

static void describe_invalid(lua_State *L, char *buf, size_t size, const char *entry)
{
    if (lua_isnil(L, -1))
        snprintf(buf, size, "%s: route returned nil (return an endpoint, atc.queue() or atc.reject())",
                 entry);
    else if (lua_type(L, -1) == LUA_TSTRING || lua_istable(L, -1))
        snprintf(buf, size, "%s: route returned an endpoint that is unknown, full or unavailable", entry);
    else
        snprintf(buf, size, "%s: route returned a %s", entry, luaL_typename(L, -1));
}

/* Runs one decision on version @p v. Returns true when the policy decided. */
static bool decide(struct policy_version *v, const struct atc_route_request *req, uint64_t budget_us,
                   struct atc_decision *out, char *errbuf, size_t errsize, const char **why)
{
    lua_State *L = v->L;
    v->req = req;
    v->overlaps_ready = false;
    v->c.decisions++;
    lua_rawgeti(L, LUA_REGISTRYINDEX, v->route_ref);
    lua_rawgeti(L, LUA_REGISTRYINDEX, v->req_ref);
    lua_rawgeti(L, LUA_REGISTRYINDEX, v->fleet_ref);
    int status = policy_protected_call(v, 2, budget_us, 0, why);
    bool ok = false;
    if (status != 0) {
        snprintf(errbuf, errsize, "%s", lua_tostring(L, -1));
        if (*why == atc_policy_fallback_budget)
            v->c.overruns++;
        else if (*why == atc_policy_fallback_memory)
            v->c.oom++;
        else
            v->c.errors++;
    } else if (interpret(v, out)) {
        ok = true;
    } else {
        *why = atc_policy_fallback_invalid;
        describe_invalid(L, errbuf, errsize, v->rt->s.entry);
        v->c.invalid++;
    }
    lua_settop(L, 0);
    v->req = NULL;
    return ok;
}

void atc_policy_route(struct atc_policy_runtime *rt, const struct atc_route_request *req,
                      struct atc_decision *out)
{
    memset(out, 0, sizeof(*out));
    atc_policy_sync(rt);
    struct policy_version *v = rt->current;
    out->version = v->version;
    if (rt->stale) {
        out->kind = ATC_DECISION_FALLBACK;
        out->reason = atc_policy_fallback_error;
        rt->fallbacks++;
        return;
    }
    char err[512];
    const char *why = NULL;
    bool ok = decide(v, req, rt->s.budget_us, out, err, sizeof(err), &why);
    if (!ok) {
        out->kind = ATC_DECISION_FALLBACK;
        out->reason = why;
        log_failure(rt, v, why, err);
    }
    count_result(rt, v, ok);
}

size_t atc_policy_routed(struct atc_policy_runtime *rt, const struct atc_route_request *req,
                         const struct atc_endpoint *ep)
{
    if (rt->prefix == NULL || req->features == NULL || req->features->nblocks == 0)
        return 0;
    return atc_prefix_index_insert(rt->prefix, req->features->blocks, req->features->nblocks, ep->index);
}

/* ---- reload ---- */

static const char *no_header(void *ctx, const char *name)
{
    return NULL;
}

/* Runs a new version on a few made-up requests, one per model (up to 4) at low and high priority. */
static int smoke_test(struct atc_policy_runtime *rt, struct policy_version *v, char **err)
{
    static struct atc_features f; /* zeroed: no prefix blocks, so the prefix index is not touched */
    size_t nmodels = rt->table->nmodels < 4 ? rt->table->nmodels : 4;
    for (size_t i = 0; i < nmodels; i++) {
        for (int prio = 0; prio <= 9; prio += 9) {
            snprintf(f.model, sizeof(f.model), "%s", rt->table->models[i].name);
            f.has_model = true;
            f.max_tokens = 16;
            f.prompt_tokens = 100;
            f.stream = prio > 0;
            struct atc_route_request req = {
                .id = "atc-reload-check",
                .path = "/v1/chat/completions",
                .kind = ATC_KIND_CHAT,
                .features = &f,
                .priority = prio,
                .tenant = "",
                .session = "",
                .attempt = 1,
                .header = no_header,
            };
            struct atc_decision d;
            char msg[512];
            const char *why = NULL;
            if (!decide(v, &req, rt->s.budget_us * INIT_BUDGET_FACTOR, &d, msg, sizeof(msg), &why) &&
                why != atc_policy_fallback_invalid) {
                if (asprintf(err, "%s (on a test request for model '%s')", msg, f.model) < 0)
                    *err = NULL;
                return -1;
            }
        }
    }
    memset(&v->c, 0, sizeof(v->c));
    return 0;
}

uint64_t atc_policy_reload(struct atc_policy_runtime *rt, char **err)
{
    *err = NULL;
    struct policy_version *v = policy_version_create(rt, err);
    if (v != NULL && smoke_test(rt, v, err) < 0) {
        policy_version_free(v);
        v = NULL;
    }
    rt->last_reload_at = atc_wall_s();
    if (v == NULL) {
        if (*err == NULL)
            *err = strdup("reload failed");
        rt->reloads_failed++;
        free(rt->last_error);
        rt->last_error = strdup(*err);
        atc_error("policy reload failed, v%llu keeps routing: %s", (unsigned long long)rt->current->version,
                  *err);
        return 0;
    }
    v->version = ++rt->next_version;
    /* The outgoing version stays as the fallback while the new one is on probation. */
    struct policy_version *old = rt->current;
    if (rt->last_good == NULL)
        rt->last_good = old;
    else
        policy_version_free(
            old); /* still on probation itself: the older, proven version stays the fallback */
    rt->current = v;
    rt->reloads_ok++;
    if (rt->s.group != NULL)
        atomic_store(&rt->s.group->streak, 0); /* a new version starts with a clean record */
    free(rt->last_error);
    rt->last_error = NULL;
    atc_info("policy v%llu loaded from %s", (unsigned long long)v->version, rt->s.entry);
    return v->version;
}

uint64_t atc_policy_set_table(struct atc_policy_runtime *rt, struct atc_endpoint_table *table, char **err)
{
    rt->table = table;
    rt->stale = true;
    policy_version_free(rt->last_good); /* its views index the old table */
    rt->last_good = NULL;
    uint64_t version = atc_policy_reload(rt, err);
    if (version != 0) {
        rt->stale = false;
        policy_version_free(rt->last_good); /* the outgoing version: same problem */
        rt->last_good = NULL;
    }
    return version;
}

/* ---- runtime ---- */

const char *atc_policy_stdlib_dir(void)
{
    static char dir[PATH_MAX];
    struct stat st;
    const char *env = getenv("ATC_STDLIB");
    if (env != NULL)
        return env;
    /* Built from source: the tree it was built from; installed: share/atc/stdlib beside bin/. */
    if (stat(ATC_SOURCE_STDLIB, &st) == 0 && S_ISDIR(st.st_mode))
        return ATC_SOURCE_STDLIB;
    char exe[PATH_MAX - 32];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash != NULL) {
            *slash = '\0';
            snprintf(dir, sizeof(dir), "%s/../share/atc/stdlib", exe);
            if (stat(dir, &st) == 0 && S_ISDIR(st.st_mode))
                return dir;
        }
    }
    return ATC_INSTALL_STDLIB;
}

static char *dup_or_null(const char *s)
{
    return s != NULL ? strdup(s) : NULL;
}

struct atc_policy_runtime *policy_runtime_new(const struct atc_policy_settings *s)
{
    struct atc_policy_runtime *rt = calloc(1, sizeof(*rt));
    if (rt == NULL)
        return NULL;
    rt->s = *s;
    rt->s.entry = dup_or_null(s->entry);
    rt->s.stdlib_dir = dup_or_null(s->stdlib_dir);
    rt->s.path = NULL;
    if (s->npath > 0) {
        char **paths = calloc(s->npath, sizeof(char *));
        for (size_t i = 0; paths != NULL && i < s->npath; i++)
            paths[i] = strdup(s->path[i]);
        rt->s.path = (const char *const *)paths;
    }
    rt->rng = s->seed != 0 ? s->seed : 0x2545F4914F6CDD1Dull ^ (uint64_t)atc_mono_ns();
    rt->now_ms = s->now_ms != NULL ? s->now_ms : default_now_ms;
    rt->now_ctx = s->now_ctx;
    rt->inotify_fd = -1;
    rt->watchdog = watchdog_start(s->budget_us);
    if (rt->watchdog == NULL) {
        atc_policy_runtime_destroy(rt);
        return NULL;
    }
    return rt;
}

struct atc_policy_runtime *atc_policy_runtime_create(const struct atc_policy_settings *s,
                                                     struct atc_endpoint_table *table,
                                                     struct atc_affinity *affinity,
                                                     struct atc_prefix_index *prefix, char **err)
{
    struct atc_policy_runtime *rt = policy_runtime_new(s);
    if (rt == NULL) {
        *err = strdup("cannot start the policy runtime");
        return NULL;
    }
    rt->table = table;
    rt->affinity = affinity;
    rt->prefix = prefix;
    struct policy_version *v = policy_version_create(rt, err);
    if (v == NULL || smoke_test(rt, v, err) < 0) {
        policy_version_free(v);
        atc_policy_runtime_destroy(rt);
        return NULL;
    }
    v->version = ++rt->next_version;
    rt->current = v;
    rt->last_reload_at = atc_wall_s();
    atc_info("policy v%llu loaded from %s", (unsigned long long)v->version, rt->s.entry);
    return rt;
}

void atc_policy_runtime_destroy(struct atc_policy_runtime *rt)
{
    if (rt == NULL)
        return;
    if (rt->watch_event != NULL)
        event_free(rt->watch_event);
    if (rt->watch_debounce != NULL)
        event_free(rt->watch_debounce);
    if (rt->inotify_fd >= 0)
        close(rt->inotify_fd);
    policy_version_free(rt->current);
    policy_version_free(rt->last_good);
    watchdog_stop(rt->watchdog);
    free((char *)rt->s.entry);
    free((char *)rt->s.stdlib_dir);
    for (size_t i = 0; rt->s.path != NULL && i < rt->s.npath; i++)
        free((char *)rt->s.path[i]);
    free((void *)rt->s.path);
    free(rt->last_error);
    free(rt);
}

uint64_t atc_policy_version(const struct atc_policy_runtime *rt)
{
    return rt->current->version;
}

void atc_policy_set_clock(struct atc_policy_runtime *rt, double (*now_ms)(void *ctx), void *ctx)
{
    rt->now_ms = now_ms;
    rt->now_ctx = ctx;
}

void atc_policy_seed(struct atc_policy_runtime *rt, uint64_t seed)
{
    rt->rng = seed ? seed : 1;
}

/* Version @p v's record summed over every worker's runtime (each loads the same files, so a version
 * number means the same code everywhere). */
struct version_totals {
    struct policy_counters c;
    unsigned consecutive_failures;
    size_t mem_used;
};

static struct version_totals version_totals(struct atc_policy_runtime *const *rts, size_t n,
                                            const struct policy_version *v)
{
    struct version_totals t = {0};
    for (size_t i = 0; i < n; i++) {
        const struct policy_version *vs[] = {rts[i]->current, rts[i]->last_good};
        for (size_t k = 0; k < 2; k++) {
            const struct policy_version *o = vs[k];
            if (o == NULL || o->version != v->version)
                continue;
            t.c.decisions += o->c.decisions;
            t.c.errors += o->c.errors;
            t.c.overruns += o->c.overruns;
            t.c.oom += o->c.oom;
            t.c.invalid += o->c.invalid;
            t.mem_used += o->mem_used;
            if (o->consecutive_failures > t.consecutive_failures)
                t.consecutive_failures = o->consecutive_failures;
        }
    }
    return t;
}

static void counters_json(struct evbuffer *out, struct atc_policy_runtime *const *rts, size_t n,
                          const struct policy_version *v)
{
    struct version_totals t = version_totals(rts, n, v);
    evbuffer_add_printf(out,
                        "{\"version\":%llu,\"loaded_at\":%.3f,\"decisions\":%llu,\"errors\":%llu,"
                        "\"budget_overruns\":%llu,\"memory_errors\":%llu,\"invalid_returns\":%llu,"
                        "\"consecutive_failures\":%u,\"memory_bytes\":%zu}",
                        (unsigned long long)v->version, v->loaded_at, (unsigned long long)t.c.decisions,
                        (unsigned long long)t.c.errors, (unsigned long long)t.c.overruns,
                        (unsigned long long)t.c.oom, (unsigned long long)t.c.invalid, t.consecutive_failures,
                        t.mem_used);
}

void atc_policy_status_json(struct atc_policy_runtime *const *rts, size_t n, struct evbuffer *out)
{
    const struct atc_policy_runtime *rt = rts[0];
    const char *last_error = NULL;
    uint64_t rollbacks = 0, fallbacks = 0;
    for (size_t i = 0; i < n; i++) {
        if (last_error == NULL)
            last_error = rts[i]->last_error;
        fallbacks += rts[i]->fallbacks;
        if (rts[i]->rollbacks > rollbacks) /* every worker rolls back the same version: one event */
            rollbacks = rts[i]->rollbacks;
    }
    evbuffer_add_printf(out, "{\"version\":%llu,\"entry\":\"", (unsigned long long)rt->current->version);
    atc_json_escape(out, rt->s.entry, strlen(rt->s.entry));
    evbuffer_add_printf(out, "\",\"loaded_at\":%.3f,\"last_reload_at\":%.3f,\"last_error\":",
                        rt->current->loaded_at, rt->last_reload_at);
    if (last_error != NULL) {
        evbuffer_add(out, "\"", 1);
        atc_json_escape(out, last_error, strlen(last_error));
        evbuffer_add(out, "\"", 1);
    } else {
        evbuffer_add(out, "null", 4);
    }
    evbuffer_add_printf(out,
                        ",\"budget_us\":%llu,\"memory_limit\":%zu,\"jit\":%s,\"reloads_ok\":%llu,"
                        "\"reloads_failed\":%llu,\"rollbacks\":%llu,\"fallbacks\":%llu,\"runtimes\":%zu,"
                        "\"current\":",
                        (unsigned long long)rt->s.budget_us, rt->s.memory, rt->s.jit ? "true" : "false",
                        (unsigned long long)rt->reloads_ok, (unsigned long long)rt->reloads_failed,
                        (unsigned long long)rollbacks, (unsigned long long)fallbacks, n);
    counters_json(out, rts, n, rt->current);
    evbuffer_add_printf(out, ",\"previous\":");
    if (rt->last_good != NULL)
        counters_json(out, rts, n, rt->last_good);
    else
        evbuffer_add(out, "null", 4);
    evbuffer_add(out, "}\n", 2);
}

void atc_policy_metrics(struct atc_policy_runtime *const *rts, size_t n, struct evbuffer *out)
{
    const struct atc_policy_runtime *rt = rts[0];
    uint64_t rollbacks = 0;
    for (size_t i = 0; i < n; i++)
        if (rts[i]->rollbacks > rollbacks)
            rollbacks = rts[i]->rollbacks;
    evbuffer_add_printf(
        out,
        "# HELP atc_policy_version The policy version deciding now.\n"
        "# TYPE atc_policy_version gauge\natc_policy_version %llu\n"
        "# HELP atc_policy_reloads_total Policy reloads, by result.\n"
        "# TYPE atc_policy_reloads_total counter\n"
        "atc_policy_reloads_total{result=\"ok\"} %llu\natc_policy_reloads_total{result=\"failed\"} %llu\n"
        "# HELP atc_policy_rollbacks_total New versions rolled back after consecutive failures.\n"
        "# TYPE atc_policy_rollbacks_total counter\natc_policy_rollbacks_total %llu\n"
        "# HELP atc_policy_failures_total Failed decisions of the loaded versions, by version and kind.\n"
        "# TYPE atc_policy_failures_total counter\n",
        (unsigned long long)rt->current->version, (unsigned long long)rt->reloads_ok,
        (unsigned long long)rt->reloads_failed, (unsigned long long)rollbacks);
    const struct policy_version *versions[] = {rt->current, rt->last_good};
    for (size_t i = 0; i < 2; i++) {
        const struct policy_version *v = versions[i];
        if (v == NULL)
            continue;
        struct version_totals t = version_totals(rts, n, v);
        const struct {
            const char *kind;
            uint64_t n;
        } kinds[] = {{"error", t.c.errors}, {"budget", t.c.overruns}, {"memory", t.c.oom}, {"invalid", t.c.invalid}};
        for (size_t k = 0; k < 4; k++)
            evbuffer_add_printf(out, "atc_policy_failures_total{version=\"%llu\",kind=\"%s\"} %llu\n",
                                (unsigned long long)v->version, kinds[k].kind,
                                (unsigned long long)kinds[k].n);
    }
    evbuffer_add_printf(out,
                        "# HELP atc_policy_memory_bytes Memory of the deciding policy's Lua states (every worker's).\n"
                        "# TYPE atc_policy_memory_bytes gauge\natc_policy_memory_bytes %zu\n",
                        version_totals(rts, n, rt->current).mem_used);
}

/* ---- file watching ---- */

static void on_watch_debounced(evutil_socket_t fd, short what, void *arg)
{
    struct atc_policy_runtime *rt = arg;
    char *err = NULL;
    atc_info("policy files changed: reloading");
    if (rt->on_change != NULL) {
        rt->on_change(rt->on_change_arg);
        return;
    }
    atc_policy_reload(rt, &err);
    free(err);
}

static void on_inotify(evutil_socket_t fd, short what, void *arg)
{
    struct atc_policy_runtime *rt = arg;
    char buf[8192] __attribute__((aligned(__alignof__(struct inotify_event))));
    bool relevant = false;
    ssize_t n;
    while ((n = read(fd, buf, sizeof(buf))) > 0) {
        for (char *p = buf; p < buf + n;) {
            struct inotify_event *ev = (struct inotify_event *)p;
            size_t len = ev->len ? strlen(ev->name) : 0;
            if (len > 4 && strcmp(ev->name + len - 4, ".lua") == 0)
                relevant = true;
            p += sizeof(*ev) + ev->len;
        }
    }
    if (relevant) {
        /* Editors write in several steps (truncate, write, rename): wait for the burst to end. */
        struct timeval tv = {0, 100000};
        event_add(rt->watch_debounce, &tv);
    }
}

int atc_policy_watch(struct atc_policy_runtime *rt, struct event_base *base, void (*on_change)(void *arg),
                     void *arg)
{
    rt->on_change = on_change;
    rt->on_change_arg = arg;
    rt->inotify_fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (rt->inotify_fd < 0)
        return -1;
    const char *dirs[16];
    char entry_dir[PATH_MAX];
    size_t ndirs = module_dirs(rt, dirs, entry_dir, 16);
    for (size_t i = 0; i < ndirs; i++) {
        if (rt->s.stdlib_dir != NULL && dirs[i] == rt->s.stdlib_dir)
            continue; /* the shipped stdlib changes with atc itself, not in production */
        if (inotify_add_watch(rt->inotify_fd, dirs[i],
                              IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_MOVED_FROM) < 0)
            atc_warn("cannot watch %s for policy changes: %s", dirs[i], strerror(errno));
    }
    rt->watch_event = event_new(base, rt->inotify_fd, EV_READ | EV_PERSIST, on_inotify, rt);
    rt->watch_debounce = evtimer_new(base, on_watch_debounced, rt);
    if (rt->watch_event == NULL || rt->watch_debounce == NULL)
        return -1;
    return event_add(rt->watch_event, NULL);
}
