/* The sandbox of a policy state: memory cap, allow-listed globals, guarded patterns, chunk loading,
 * require. */

#include "policy/sandbox.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <lauxlib.h>
#include <xxhash.h>
#include <lualib.h>

#include "policy/policy_api.h"
#include "policy/state.h"
#include "policy/watchdog.h"

/* Pattern functions refuse inputs whose worst case (subject length ^ (quantifiers + 1)) exceeds this:
 * Lua patterns backtrack, and a C function cannot be interrupted by the budget. */
#define PATTERN_WORK_MAX 2e7
#define PATTERN_SUBJECT_MAX (64 * 1024)
/* The count hook cannot stop a C function halfway, so the library calls that could run long in one go
 * are capped well under a 1 ms budget (measured here: sorting 16k numbers ~1 ms, 2M 0.88 s; a string.rep
 * near a 64 MiB cap 36-59 ms). */
#define REP_MAX (1024 * 1024)
#define SORT_MAX 16384
#define CONCAT_MAX 65536
#define MODULE_NAME_MAX 128

void *policy_sandbox_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
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
    if (nsize > osize)
        v->mem_allocated += nsize - osize;
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
    if (v->rt->watchdog != NULL && policy_budget_killed(v->rt->watchdog)) {
        lua_pushliteral(L, POLICY_BUDGET_ERROR); /* whatever a handler made of it */
        return lua_error(L);
    }
    /* Also a memory error the runtime caught and raised again (lua_cpcall in require, atc.replay). */
    if (status == LUA_ERRMEM || (status != 0 && v->mem_refused))
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

/* xpcall(f, handler) runs the handler after the error has unwound, as an ordinary call, not as
 * lua_pcall's message handler: LuaJIT runs a message handler while the budget's count hook is marked
 * active, so no hook fires inside it, and a handler that never returns held the worker for good. Here
 * the budget stops it like any other code. (What a message handler could see before unwinding, the
 * stack, is not a policy's to see: no debug library.) An error in the handler itself is "error in
 * error handling", as in Lua 5.1. */
static int sb_xpcall(lua_State *L)
{
    struct policy_version *v = version_of(L);
    luaL_checkany(L, 2);
    lua_settop(L, 2);
    lua_insert(L, 1); /* handler, f */
    int status = lua_pcall(L, 0, LUA_MULTRET, 0);
    rethrow_if_fatal(L, v, status);
    if (status == 0) {
        lua_pushboolean(L, 1);
        lua_replace(L, 1);
        return lua_gettop(L);
    }
    lua_insert(L, 1); /* err, handler */
    lua_insert(L, 1); /* handler, err */
    status = lua_pcall(L, 1, 1, 0);
    rethrow_if_fatal(L, v, status);
    if (status != 0) {
        lua_pop(L, 1);
        lua_pushliteral(L, "error in error handling");
    }
    lua_pushboolean(L, 0);
    lua_insert(L, -2);
    return 2;
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
    /* Every construct that backtracks or scans counts: * + - and ? (each ? doubles the ways to try),
     * %bxy (a scan per attempt), back-references %1-%9 (likewise). Sets are not parsed: counting a
     * quantifier character inside [...] only errs on the safe side. */
    int q = 0;
    for (size_t i = 0; i < m; i++) {
        if (pat[i] == '%') {
            if (i + 1 < m && pat[i + 1] == 'b') {
                q++;
                i += 3;
                continue;
            }
            if (i + 1 < m && pat[i + 1] >= '1' && pat[i + 1] <= '9')
                q++;
            i++;
        } else if (pat[i] == '*' || pat[i] == '+' || pat[i] == '-' || pat[i] == '?') {
            q++;
        }
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

static int sb_rep(lua_State *L)
{
    size_t len;
    luaL_checklstring(L, 1, &len);
    double n = luaL_checknumber(L, 2);
    size_t sep = 0;
    if (lua_isstring(L, 3))
        lua_tolstring(L, 3, &sep);
    double bytes = n > 0 ? (double)(len + sep) * n : 0;
    struct policy_version *v = version_of(L);
    if (v->mem_limit > 0 && bytes > (double)v->mem_limit) { /* what the allocator would refuse: say so now */
        v->mem_refused = true;
        lua_pushliteral(L, "not enough memory");
        return lua_error(L);
    }
    if (bytes > REP_MAX)
        return luaL_error(L, "string.rep of %.0f bytes: a policy builds at most %d in one call", bytes,
                          REP_MAX);
    return call_original(L);
}

static int sb_sort(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    if (lua_objlen(L, 1) > SORT_MAX)
        return luaL_error(L, "table.sort of %d elements: a policy sorts at most %d in one call",
                          (int)lua_objlen(L, 1), SORT_MAX);
    return call_original(L);
}

static int sb_concat(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    if (lua_objlen(L, 1) > CONCAT_MAX)
        return luaL_error(L, "table.concat of %d elements: a policy joins at most %d in one call",
                          (int)lua_objlen(L, 1), CONCAT_MAX);
    return call_original(L);
}

/* Replaces lib.NAME by a guard that calls the original (an upvalue). The library table at -1. */
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
void policy_sandbox_open(struct policy_version *v)
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
    wrap_string_fn(L, v, "rep", sb_rep);
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
    lua_getglobal(L, "table");
    wrap_string_fn(L, v, "sort", sb_sort);
    wrap_string_fn(L, v, "concat", sb_concat);
    lua_pop(L, 1);
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

/* Reads a policy source file whole into an owned buffer; NULL with errno set (EFBIG: over
 * POLICY_FILE_MAX; EINVAL: not a regular file). The path is resolved first and the result opened with
 * O_NOFOLLOW (a link swapped in between is refused) and O_NONBLOCK (a FIFO returns at once instead of
 * blocking the loader), then fstat'd: only a regular file is read, so that /dev/zero, a FIFO or a socket
 * never are. */
static char *read_file(const char *path, size_t *len)
{
    char real[PATH_MAX];
    if (realpath(path, real) == NULL)
        return NULL;
    int fd = open(real, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    struct stat st;
    char *buf = NULL;
    size_t n = 0;
    int e = 0;
    if (fstat(fd, &st) != 0) {
        e = errno;
        goto out;
    }
    if (!S_ISREG(st.st_mode) || st.st_size < 0) {
        e = EINVAL;
        goto out;
    }
    if (st.st_size > POLICY_FILE_MAX) {
        e = EFBIG;
        goto out;
    }
    /* One byte more than the cap: a file that grew since fstat is refused rather than cut. */
    size_t cap = (size_t)st.st_size + 1;
    if ((buf = malloc(cap)) == NULL) {
        e = ENOMEM;
        goto out;
    }
    for (;;) {
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            e = errno;
            break;
        }
        if (r == 0)
            break;
        n += (size_t)r;
        if (n == cap) {
            if (cap > POLICY_FILE_MAX) {
                e = EFBIG;
                break;
            }
            size_t ncap = cap * 2 > POLICY_FILE_MAX + 1 ? POLICY_FILE_MAX + 1 : cap * 2;
            char *nb = realloc(buf, ncap);
            if (nb == NULL) {
                e = ENOMEM;
                break;
            }
            buf = nb;
            cap = ncap;
        }
    }
out:
    close(fd);
    if (e != 0) {
        free(buf);
        errno = e;
        return NULL;
    }
    *len = n;
    return buf;
}

/* Why read_file failed, for a message that names the path and never its content. */
static const char *read_error(int e)
{
    if (e == EINVAL)
        return "not a regular file";
    if (e == EFBIG)
        return "larger than " POLICY_FILE_MAX_TEXT;
    return strerror(e);
}

/* Where load_protected leaves the chunk for policy_load_chunk (a registry key). */
static const char chunk_key;
/* The hash of the files loaded into this state so far, in load order (a registry key: a uint64_t
 * userdata), so /admin/policy can say which sources are serving. */
static const char files_hash_key;

/* Chains @p h (a file's hash) into the state's files hash. May raise (out of memory): call it with no C
 * resource held. */
static void add_file_hash(lua_State *L, uint64_t h)
{
    lua_pushlightuserdata(L, (void *)&files_hash_key);
    lua_rawget(L, LUA_REGISTRYINDEX);
    uint64_t *acc = lua_touserdata(L, -1);
    lua_pop(L, 1);
    if (acc == NULL) {
        lua_pushlightuserdata(L, (void *)&files_hash_key);
        acc = lua_newuserdata(L, sizeof(*acc));
        *acc = 0;
        lua_rawset(L, LUA_REGISTRYINDEX);
    }
    *acc = XXH3_64bits_withSeed(&h, sizeof(h), *acc);
}

uint64_t policy_files_hash(lua_State *L)
{
    lua_pushlightuserdata(L, (void *)&files_hash_key);
    lua_rawget(L, LUA_REGISTRYINDEX);
    const uint64_t *acc = lua_touserdata(L, -1);
    lua_pop(L, 1);
    return acc != NULL ? *acc : 0;
}

/* lua_cpcall: loads the file whose path is argument 1 (a light userdata), stores the chunk under chunk_key.
 * The source is freed before anything that can raise. */
static int load_protected(lua_State *L)
{
    const char *path = lua_touserdata(L, 1);
    size_t len;
    char *src = read_file(path, &len);
    if (src == NULL) {
        lua_pushfstring(L, "cannot read %s: %s", path, read_error(errno));
        return lua_error(L);
    }
    char chunkname[PATH_MAX + 2];
    snprintf(chunkname, sizeof(chunkname), "@%s", path);
    int rc = luaL_loadbufferx(L, src, len, chunkname, "t");
    uint64_t h = XXH3_64bits(src, len);
    free(src);
    if (rc != 0)
        return lua_error(L);
    add_file_hash(L, h);
    set_chunk_env(L);
    lua_pushlightuserdata(L, (void *)&chunk_key);
    lua_insert(L, -2);
    lua_rawset(L, LUA_REGISTRYINDEX);
    return 0;
}

/* Loads a Lua source file (text only) as a sandboxed chunk; pushes it, or an error message. 0 / -1.
 * Safe outside a protected call: what allocates runs under lua_cpcall, and taking the chunk out of
 * the registry slot it was stored in allocates nothing (the key is already there). */
int policy_load_chunk(lua_State *L, const char *path)
{
    if (lua_cpcall(L, load_protected, (void *)path) != 0)
        return -1;
    lua_pushlightuserdata(L, (void *)&chunk_key);
    lua_rawget(L, LUA_REGISTRYINDEX);
    lua_pushlightuserdata(L, (void *)&chunk_key);
    lua_pushnil(L);
    lua_rawset(L, LUA_REGISTRYINDEX);
    return 0;
}

/* The directories require searches, in order: the entry's own, stdlib, then policy.path. */
size_t policy_module_dirs(const struct atc_policy_runtime *rt, const char **dirs, char *entry_dir, size_t max)
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

/* Whether the resolved path @p real is inside the directory @p dir (resolved here). */
static bool under(const char *real, const char *dir)
{
    char root[PATH_MAX];
    if (dir == NULL || realpath(dir, root) == NULL)
        return false;
    size_t n = strlen(root);
    if (n == 1) /* "/" */
        return true;
    return strncmp(real, root, n) == 0 && real[n] == '/';
}

int policy_check_entry(const struct atc_policy_runtime *rt, const char *entry, char **err)
{
    *err = NULL;
    char real[PATH_MAX];
    struct stat st;
    const char *why = NULL;
    if (realpath(entry, real) == NULL || stat(real, &st) != 0)
        why = strerror(errno);
    if (why == NULL) {
        char entry_dir[PATH_MAX];
        const char *dirs[16];
        size_t n = policy_module_dirs(rt, dirs, entry_dir, 16), i = 0;
        /* The live policy's folder and policy.path: not the stdlib (dirs[1] when there is one). */
        for (; i < n; i++)
            if ((i == 0 || dirs[i] != rt->s.stdlib_dir) && under(real, dirs[i]))
                break;
        if (i == n)
            why = "outside the live policy's folder and policy.path";
        else if (!S_ISREG(st.st_mode))
            why = "not a regular file";
        else if (st.st_size > POLICY_FILE_MAX)
            why = "larger than " POLICY_FILE_MAX_TEXT;
    }
    if (why == NULL)
        return 0;
    if (asprintf(err, "%s: %s", entry, why) < 0)
        *err = NULL;
    return -1;
}

/* Pushes the registry table @p key, made when missing. */
static void registry_table(lua_State *L, const char *key)
{
    lua_getfield(L, LUA_REGISTRYINDEX, key);
    if (lua_istable(L, -1))
        return;
    lua_pop(L, 1);
    lua_newtable(L);
    lua_pushvalue(L, -1);
    lua_setfield(L, LUA_REGISTRYINDEX, key);
}

/* atc test: notes where module @p name came from and whether the test file itself required it (its
 * caller is level 1 of the stack), for t.replay. */
static void note_module(lua_State *L, const char *name, const char *path)
{
    registry_table(L, POLICY_MODULE_FILES);
    lua_pushstring(L, path);
    lua_setfield(L, -2, name);
    lua_pop(L, 1);
    lua_getfield(L, LUA_REGISTRYINDEX, POLICY_TEST_FILE);
    const char *test = lua_tostring(L, -1);
    lua_Debug ar;
    bool by_test =
        test != NULL && lua_getstack(L, 1, &ar) && lua_getinfo(L, "S", &ar) && strcmp(ar.source, test) == 0;
    lua_pop(L, 1);
    if (!by_test)
        return;
    registry_table(L, POLICY_TEST_MODULES);
    lua_pushstring(L, name);
    lua_rawseti(L, -2, (int)lua_objlen(L, -2) + 1);
    lua_pop(L, 1);
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
    size_t ndirs = policy_module_dirs(v->rt, dirs, entry_dir, 16);
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
        if (v->rt->test_mode)
            note_module(L, name, path);
        return 1;
    }
    return luaL_error(L, "module '%s' not found in the policy's module path (as %s)", name, rel);
}
