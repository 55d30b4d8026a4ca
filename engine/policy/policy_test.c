/* `atc test`: policy unit tests, run in the production sandbox.
 *
 * A test file (NAME_test.lua) either registers tests with the atc.test module,
 *
 *   local t = require "atc.test"
 *   t.test("urgent requests go to the least loaded", function() t.expect(x).to_be(y) end)
 *
 * or returns a table of name -> function. Each file runs in a fresh Lua state; each test within the
 * budget. A failure prints one line, "FAIL file:line: test name: message", where file:line is the line
 * of the test file that was running when it failed; then a closing "N passed, N failed" line. */

#include <dirent.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <lauxlib.h>

#include "fleet/affinity.h"
#include "core/config.h"
#include "core/config_value.h"
#include "core/log.h"
#include "policy/policy_internal.h"
#include "trace/replay.h"
#include "trace/replay_lua.h"

static const char usage_test[] =
    "usage: atc test [-c FILE] [--scripts DIR] [--budget DURATION] [--filter TEXT] [-v] [PATH...]\n"
    "\n"
    "Runs policy unit tests in the production sandbox: every *_test.lua under each PATH (a directory,\n"
    "searched recursively, or a file; default tests/policy). A test file registers tests with\n"
    "`local t = require \"atc.test\"` and t.test(name, fn), or returns a table of name -> function; a\n"
    "test fails when it raises (t.expect(actual).to_be(expected) and the other matchers raise with a\n"
    "message). Prints one line per failure, FAIL file:line: test: message, then N passed, N failed; exits\n"
    "1 when any test failed. Modules are found in the scripts directory (the entry's directory of -c\n"
    "FILE's policy, else --scripts), then in stdlib/, then in the test file's directory.\n"
    "\n"
    "  -c, --config FILE     take the policy, module path and memory cap from this config\n"
    "      --scripts DIR     the policy's directory (default ./scripts)\n"
    "      --budget DURATION time limit per test (default 10s)\n"
    "      --filter TEXT     run only the tests whose name contains TEXT\n"
    "  -v, --verbose         also print a line per passing test\n"
    "  -h, --help            this text\n";

struct runner {
    struct atc_policy_runtime *rt;
    const char *filter;
    bool verbose;
    int passed, failed;
};

struct file_list {
    char **v;
    size_t n, cap;
};

static int add_file(struct file_list *l, const char *path)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        char **v = realloc(l->v, cap * sizeof(*v));
        if (v == NULL)
            return -1;
        l->v = v;
        l->cap = cap;
    }
    if ((l->v[l->n] = strdup(path)) == NULL)
        return -1;
    l->n++;
    return 0;
}

static bool is_test_file(const char *name)
{
    size_t n = strlen(name);
    return n > 9 && strcmp(name + n - 9, "_test.lua") == 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every *_test.lua under @p dir, recursively (hidden directories skipped). */
static void collect(struct file_list *l, const char *dir, int depth)
{
    DIR *d = opendir(dir);
    if (d == NULL || depth > 16) {
        if (d != NULL)
            closedir(d);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char path[PATH_MAX];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        struct stat st;
        if (stat(path, &st) != 0)
            continue;
        if (S_ISDIR(st.st_mode))
            collect(l, path, depth + 1);
        else if (S_ISREG(st.st_mode) && is_test_file(e->d_name))
            add_file(l, path);
    }
    closedir(d);
}

/* Message handler: the error message, prefixed with the line of the test file (upvalue 1 is its chunk
 * name, "@path") that was running; a message already pointing at that line is not repeated. */
static int on_error(lua_State *L)
{
    const char *chunk = lua_tostring(L, lua_upvalueindex(1));
    const char *msg = lua_tostring(L, 1);
    if (msg == NULL)
        msg = luaL_typename(L, 1); /* an error value that is not a string: say what it was */
    lua_Debug ar;
    for (int level = 1; lua_getstack(L, level, &ar); level++) {
        if (!lua_getinfo(L, "Sl", &ar) || ar.currentline <= 0 || strcmp(ar.source, chunk) != 0)
            continue;
        char where[PATH_MAX + 32];
        int n = snprintf(where, sizeof(where), "%s:%d: ", chunk + 1, ar.currentline);
        if (n > 0 && strncmp(msg, where, (size_t)n) == 0)
            msg += n;
        lua_pushfstring(L, "%s\t%s", where, msg);
        return 1;
    }
    lua_pushfstring(L, "%s: \t%s", chunk + 1, msg);
    return 1;
}

/* Runs the function at the top of the stack as test @p name; prints its failure. */
static void run_one(struct runner *r, struct policy_version *v, const char *file, const char *name)
{
    lua_State *L = v->L;
    const char *why;
    char chunk[PATH_MAX + 2];
    snprintf(chunk, sizeof(chunk), "@%s", file);
    lua_pushstring(L, chunk);
    lua_pushcclosure(L, on_error, 1);
    lua_insert(L, -2); /* handler, fn */
    int handler = lua_gettop(L) - 1;
    if (policy_protected_call(v, 0, r->rt->s.budget_us, handler, &why) != 0) {
        const char *m = lua_tostring(L, -1);
        const char *tab = m != NULL ? strchr(m, '\t') : NULL;
        if (why == atc_policy_fallback_budget || tab == NULL) /* stopped: the message is the runtime's */
            printf("FAIL %s: %s: %s\n", file, name, m != NULL ? m : "error");
        else
            printf("FAIL %.*s%s: %s\n", (int)(tab - m), m, name, tab + 1);
        r->failed++;
    } else {
        if (r->verbose)
            printf("ok   %s: %s\n", file, name);
        r->passed++;
    }
    lua_settop(L, handler - 1);
}

static bool wanted(const struct runner *r, const char *name)
{
    return r->filter == NULL || strstr(name, r->filter) != NULL;
}

static void run_file(struct runner *r, const char *file)
{
    char *err = NULL;
    /* A fresh state per file, so that files cannot leak state into each other. */
    struct policy_version *v = policy_version_create(r->rt, &err);
    if (v == NULL) {
        printf("FAIL %s: %s\n", file, err);
        free(err);
        r->failed++;
        return;
    }
    lua_State *L = v->L;
    const char *why;
    if (policy_load_chunk(L, file) < 0 || policy_protected_call(v, 0, r->rt->s.budget_us, 0, &why) != 0) {
        printf("FAIL %s: %s\n", file, lua_isstring(L, -1) ? lua_tostring(L, -1) : "cannot load");
        r->failed++;
        policy_version_free(v);
        return;
    }
    int returned = lua_gettop(L), found = 0;

    /* Tests registered with atc.test, in the order they were declared. */
    lua_getfield(L, LUA_REGISTRYINDEX, "atc.loaded");
    lua_getfield(L, -1, "atc.test");
    if (lua_istable(L, -1)) {
        lua_getfield(L, -1, "_take");
        if (lua_isfunction(L, -1) && policy_protected_call(v, 0, r->rt->s.budget_us, 0, &why) == 0 &&
            lua_istable(L, -1)) {
            int list = lua_gettop(L);
            int n = (int)lua_objlen(L, list);
            for (int i = 1; i <= n; i++) {
                lua_rawgeti(L, list, i);
                lua_getfield(L, -1, "name");
                lua_getfield(L, -2, "fn");
                const char *name = lua_tostring(L, -2);
                found++;
                if (name != NULL && lua_isfunction(L, -1) && wanted(r, name))
                    run_one(r, v, file, name);
                lua_settop(L, list);
            }
        }
    }
    lua_settop(L, returned);

    /* A returned table of name -> function, in name order so that output is stable. */
    if (lua_istable(L, returned)) {
        lua_newtable(L);
        int names = lua_gettop(L), n = 0;
        lua_pushnil(L);
        while (lua_next(L, returned) != 0) {
            bool fn = lua_isfunction(L, -1);
            lua_pop(L, 1);
            if (fn && lua_type(L, -1) == LUA_TSTRING) {
                lua_pushvalue(L, -1);
                lua_rawseti(L, names, ++n);
            }
        }
        char **sorted = calloc((size_t)n + 1, sizeof(char *));
        for (int i = 1; sorted != NULL && i <= n; i++) {
            lua_rawgeti(L, names, i);
            sorted[i - 1] = strdup(lua_tostring(L, -1));
            lua_pop(L, 1);
        }
        if (sorted != NULL)
            qsort(sorted, (size_t)n, sizeof(char *), by_name);
        for (int i = 0; sorted != NULL && i < n; i++) {
            found++;
            if (sorted[i] != NULL && wanted(r, sorted[i])) {
                lua_getfield(L, returned, sorted[i]);
                run_one(r, v, file, sorted[i]);
            }
            free(sorted[i]);
        }
        free(sorted);
    }
    if (found == 0) {
        printf(
            "FAIL %s: no tests (register them with t.test(name, fn) from require \"atc.test\", or return a "
            "table of name -> function)\n",
            file);
        r->failed++;
    }
    policy_version_free(v);
}

int atc_policy_test_main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"config", required_argument, NULL, 'c'},
        {"scripts", required_argument, NULL, 's'},
        {"budget", required_argument, NULL, 'b'},
        {"filter", required_argument, NULL, 'f'},
        {"verbose", no_argument, NULL, 'v'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *config = NULL, *scripts = "scripts";
    struct runner r = {0};
    uint64_t budget_us = 10 * 1000 * 1000;
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "c:vh", longopts, NULL)) != -1) {
        switch (ch) {
        case 'c':
            config = optarg;
            break;
        case 's':
            scripts = optarg;
            break;
        case 'b':
            if (atc_parse_duration_us(optarg, &budget_us) < 0 || budget_us == 0) {
                fprintf(stderr, "atc test: invalid --budget '%s'\n", optarg);
                return 2;
            }
            break;
        case 'f':
            r.filter = optarg;
            break;
        case 'v':
            r.verbose = true;
            break;
        case 'h':
            fputs(usage_test, stdout);
            return 0;
        default:
            fputs(usage_test, stderr);
            return 2;
        }
    }
    struct file_list files = {0};
    const char *default_path[] = {"tests/policy"};
    char **paths = optind < argc ? argv + optind : (char **)default_path;
    int npaths = optind < argc ? argc - optind : 1;
    for (int i = 0; i < npaths; i++) {
        struct stat st;
        if (stat(paths[i], &st) != 0) {
            fprintf(stderr, "atc test: %s: no such file or directory\n", paths[i]);
            return 2;
        }
        size_t before = files.n;
        if (S_ISDIR(st.st_mode))
            collect(&files, paths[i], 0);
        else
            add_file(&files, paths[i]);
        if (files.n > before && S_ISDIR(st.st_mode))
            qsort(files.v + before, files.n - before, sizeof(char *), by_name);
        if (files.n == before)
            fprintf(stderr, "atc test: no *_test.lua files under %s\n", paths[i]);
    }

    if (getenv("ATC_LOG") == NULL)
        atc_log_set_level(ATC_LOG_WARN); /* atc.log lines and replays' "policy loaded" are noise here */
    struct atc_config *cfg = NULL;
    char *errors = NULL;
    if (config != NULL && atc_config_load(config, &cfg, &errors) < 0) {
        fprintf(stderr, "%s\n", errors);
        free(errors);
        return 1;
    }
    char entry[PATH_MAX];
    snprintf(entry, sizeof(entry), "%s/policy.lua", scripts);
    struct atc_policy_settings s = {
        .entry = cfg != NULL ? cfg->policy.entry : entry,
        .path = cfg != NULL ? (const char *const *)cfg->policy.path : NULL,
        .npath = cfg != NULL ? cfg->policy.npath : 0,
        .stdlib_dir = atc_policy_stdlib_dir(),
        .budget_us = budget_us,
        .memory = cfg != NULL ? cfg->policy.memory : (size_t)256 << 20,
    };
    r.rt = policy_runtime_new(&s);
    atc_config_free(cfg);
    if (r.rt == NULL)
        return 1;
    r.rt->test_mode = true;
    r.rt->test_replay = (lua_CFunction)atc_replay_lua;
    r.rt->affinity = atc_affinity_create(0);
    for (size_t i = 0; i < files.n; i++) {
        /* The test file's directory is searched last, for helpers kept beside the tests. */
        char dir[PATH_MAX];
        snprintf(dir, sizeof(dir), "%s", files.v[i]);
        char *slash = strrchr(dir, '/');
        if (slash != NULL)
            *slash = '\0';
        else
            snprintf(dir, sizeof(dir), ".");
        const char *paths_for_file[] = {dir};
        const char *const *saved = r.rt->s.path;
        size_t saved_n = r.rt->s.npath;
        if (saved_n == 0) {
            r.rt->s.path = paths_for_file;
            r.rt->s.npath = 1;
        }
        run_file(&r, files.v[i]);
        r.rt->s.path = saved;
        r.rt->s.npath = saved_n;
        free(files.v[i]);
    }
    free(files.v);
    printf("%d passed, %d failed\n", r.passed, r.failed);
    atc_affinity_destroy(r.rt->affinity);
    atc_policy_runtime_destroy(r.rt);
    return r.failed > 0 || files.n == 0 ? 1 : 0;
}
