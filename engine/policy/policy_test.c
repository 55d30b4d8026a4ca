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
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <lauxlib.h>

#include "base/clock.h"
#include "config/config.h"
#include "base/config_value.h"
#include "base/log.h"
#include "fleet/affinity.h"
#include "config/roles.h"
#include "fleet/endpoint.h"
#include "fleet/health.h"
#include "request/request_features.h"
#include "policy/decision.h"
#include "policy/policy_api.h"
#include "policy/sandbox.h"
#include "policy/state.h"
#include "policy/version.h"

static const char usage_test[] =
    "usage: atc test [-c FILE] [--scripts DIR] [--budget DURATION] [--filter TEXT] [-v] [PATH...]\n"
    "\n"
    "Runs policy unit tests in the production sandbox: every *_test.lua under each PATH (a directory,\n"
    "searched recursively, or a file; default tests/policy). A test file registers tests with\n"
    "`local t = require \"atc.test\"` and t.test(name, fn), or returns a table of name -> function; a\n"
    "test fails when it raises (t.expect(actual).to_be(expected) and the other matchers raise with a\n"
    "message). Prints one line per failure, FAIL file:line: test: message, then N passed, N failed; exits\n"
    "1 when any test failed. Modules are found in the scripts directory (the entry's directory of -c\n"
    "FILE's policy, else --scripts), then in stdlib/, then in the test file's directory. A policy's\n"
    "atc.log lines are printed under the test that produced them. t.replay replays policy = FILE or a\n"
    "module, else the one policy module the test file requires, else the policy under test.\n"
    "\n"
    "  -c, --config FILE     take the policy, module path and memory cap from this config\n"
    "      --scripts DIR     the policy's directory (default ./scripts)\n"
    "      --budget DURATION time limit per test (default 10s)\n"
    "      --filter TEXT     run only the tests whose name contains TEXT\n"
    "  -v, --verbose         also print a line per passing test\n"
    "      --contract        print the policy contract (stdlib/atc/contract.lua) as markdown tables\n"
    "  -h, --help            this text\n";

#define TEST_LOG_MAX (64 * 1024) /* bytes of atc.log lines kept per test; the rest are counted */

struct runner {
    struct atc_policy_runtime *rt;
    const char *filter;
    bool verbose;
    int passed, failed;
    /* The atc.log lines of the test that runs (each ending in a newline), printed under its line. */
    char *log;
    size_t log_len;
    unsigned log_dropped;
};

/* The runtime's log sink (settings.log): keeps the line for the test that runs. */
static void on_policy_log(void *ctx, const char *line)
{
    struct runner *r = ctx;
    size_t n = strlen(line);
    if (r->log == NULL)
        r->log = malloc(TEST_LOG_MAX);
    if (r->log == NULL || r->log_len + n + 1 > TEST_LOG_MAX) {
        r->log_dropped++;
        return;
    }
    memcpy(r->log + r->log_len, line, n);
    r->log_len += n;
    r->log[r->log_len++] = '\n';
}

/* Prints the kept atc.log lines, indented under the line just printed, and forgets them. */
static void flush_log(struct runner *r)
{
    for (size_t i = 0; i < r->log_len;) {
        const char *nl = memchr(r->log + i, '\n', r->log_len - i);
        size_t n = (size_t)(nl - (r->log + i));
        printf("     log: %.*s\n", (int)n, r->log + i);
        i += n + 1;
    }
    if (r->log_dropped > 0)
        printf("     log: ... %u more lines\n", r->log_dropped);
    r->log_len = 0;
    r->log_dropped = 0;
}

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

/* "dir/name" without a doubled slash when @p dir ends in one ("tests/policy/" from a shell's completion
 * printed tests/policy//x_test.lua in every line that names the file). */
static void join_path(char *out, size_t size, const char *dir, const char *name)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    snprintf(out, size, "%.*s/%s", (int)n, dir, name);
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
        join_path(path, sizeof(path), dir, e->d_name);
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
    flush_log(r); /* what the file logged as it loaded was printed with it */
    if (policy_protected_call(v, 0, r->rt->s.budget_us, handler, &why) != 0) {
        const char *m = lua_tostring(L, -1);
        const char *tab = m != NULL ? strchr(m, '\t') : NULL;
        if (why == atc_policy_fallback_budget || tab == NULL) /* stopped: the message is the runtime's */
            printf("FAIL %s: %s: %s\n", file, name, m != NULL ? m : "error");
        else
            printf("FAIL %.*s%s: %s\n", (int)(tab - m), m, name, tab + 1);
        r->failed++;
    } else {
        if (r->verbose || r->log_len > 0 || r->log_dropped > 0) /* its log lines need a test to hang on */
            printf("ok   %s: %s\n", file, name);
        r->passed++;
    }
    flush_log(r);
    lua_settop(L, handler - 1);
}

/* ---- t.route: one decision on the engine's own views ----
 *
 * atc.test_route(spec, route) builds what production builds for a request: an endpoint table (with
 * each endpoint's live counters and health as spec says), a prefix index fed by earlier requests routed
 * to endpoints, the request's features scanned from its body by request_features.c, and the route
 * request as the relay assembles it; then it runs route(req, fleet) through atc_policy_route, the
 * serving path, with the test's own state as the deciding version. The views a policy reads are
 * therefore the C ones; stdlib/atc/test.lua documents the spec.
 *
 * Everything C allocates hangs off a userdata whose __gc frees it, so that a Lua error raised while
 * reading the spec (a bad field) leaks nothing. */

#define ROUTE_MT "atc.test_route"
#define ROUTE_HEADERS_MAX 32

struct route_scratch {
    struct atc_model_config *models;
    struct atc_endpoint_config *ecs;
    size_t nmodels, neps;
    struct atc_endpoint_table *table;
    struct atc_endpoint_health *health; /* one per endpoint */
    struct atc_prefix_index *prefix;
    struct atc_policy_runtime *rt; /* the decision's runtime: its table, prefix index, watchdog */
    struct atc_features *f;        /* the request's, and scratch for earlier routed ones */
    char *body;
    char *hname[ROUTE_HEADERS_MAX], *hvalue[ROUTE_HEADERS_MAX];
    size_t nheaders;
    struct atc_endpoint **tried;
    int64_t *cached; /* per endpoint: spec cached_tokens (what its KV events would say), -1: none */
};

static void scratch_free(struct route_scratch *x)
{
    for (size_t i = 0; x->ecs != NULL && i < x->neps; i++) {
        free(x->ecs[i].id);
        free(x->ecs[i].version);
        for (size_t k = 0; k < x->ecs[i].ntags; k++)
            free(x->ecs[i].tags[k]);
        free(x->ecs[i].tags);
    }
    for (size_t i = 0; x->models != NULL && i < x->nmodels; i++) {
        free(x->models[i].name);
        free(x->models[i].endpoints);
    }
    free(x->models);
    free(x->ecs);
    if (x->rt != NULL) {
        x->rt->current = NULL; /* the test's version: not the runtime's to free */
        atc_policy_runtime_destroy(x->rt);
    }
    atc_endpoint_table_destroy(x->table);
    free(x->health);
    if (x->prefix != NULL)
        atc_prefix_index_destroy(x->prefix);
    free(x->f);
    free(x->body);
    for (size_t i = 0; i < x->nheaders; i++) {
        free(x->hname[i]);
        free(x->hvalue[i]);
    }
    free(x->tried);
    free(x->cached);
    memset(x, 0, sizeof(*x));
}

static int scratch_gc(lua_State *L)
{
    scratch_free(lua_touserdata(L, 1));
    return 0;
}

static const char *route_header(void *ctx, const char *name)
{
    const struct route_scratch *x = ctx;
    for (size_t i = 0; i < x->nheaders; i++)
        if (strcasecmp(x->hname[i], name) == 0) /* as evhttp_find_header */
            return x->hvalue[i];
    return NULL;
}

static void *check_alloc(lua_State *L, void *p)
{
    if (p == NULL)
        luaL_error(L, "t.route: out of memory");
    return p;
}

static char *dup_checked(lua_State *L, const char *s)
{
    return s != NULL ? check_alloc(L, strdup(s)) : NULL;
}

/* Field @p name of the table at @p t: a number (or @p dflt when absent). */
static double spec_number(lua_State *L, int t, const char *name, double dflt)
{
    lua_getfield(L, t, name);
    double x = dflt;
    if (!lua_isnil(L, -1)) {
        if (lua_type(L, -1) != LUA_TNUMBER)
            luaL_error(L, "t.route: '%s' must be a number", name);
        x = lua_tonumber(L, -1);
    }
    lua_pop(L, 1);
    return x;
}

/* Field @p name: a string (NULL when absent); it stays valid while the table holds it. */
static const char *spec_string(lua_State *L, int t, const char *name)
{
    lua_getfield(L, t, name);
    const char *s = NULL;
    if (!lua_isnil(L, -1)) {
        if (lua_type(L, -1) != LUA_TSTRING)
            luaL_error(L, "t.route: '%s' must be a string", name);
        s = lua_tostring(L, -1);
    }
    lua_pop(L, 1);
    return s;
}

static enum atc_request_kind kind_of_path(lua_State *L, const char *path)
{
    if (strcmp(path, "/v1/chat/completions") == 0)
        return ATC_KIND_CHAT;
    if (strcmp(path, "/v1/completions") == 0)
        return ATC_KIND_COMPLETION;
    if (strcmp(path, "/v1/embeddings") == 0)
        return ATC_KIND_EMBEDDING;
    luaL_error(L, "t.route: path '%s' is not one atc serves", path);
    return ATC_KIND_CHAT;
}

/* The endpoint table of spec.endpoints, as atc_endpoint_table_create builds it from a config. */
static void build_table(lua_State *L, struct route_scratch *x, int eps)
{
    size_t n = lua_objlen(L, eps);
    x->ecs = check_alloc(L, calloc(n ? n : 1, sizeof(*x->ecs)));
    x->models = check_alloc(L, calloc(n ? n : 1, sizeof(*x->models)));
    for (size_t i = 0; i < n; i++) {
        x->neps = i + 1; /* counted before it is filled: scratch_free frees what a raise left half-done */
        lua_rawgeti(L, eps, (int)i + 1);
        int e = lua_gettop(L);
        luaL_checktype(L, e, LUA_TTABLE);
        struct atc_endpoint_config *ec = &x->ecs[i];
        const char *id = spec_string(L, e, "id"), *model = spec_string(L, e, "model");
        if (id == NULL)
            luaL_error(L, "t.route: endpoint %d has no id", (int)i + 1);
        for (size_t k = 0; k < i; k++)
            if (strcmp(x->ecs[k].id, id) == 0)
                luaL_error(L, "t.route: duplicate endpoint id '%s'", id);
        ec->id = dup_checked(L, id);
        ec->host = "127.0.0.1";
        ec->port = (uint16_t)(1 + i);
        ec->version = dup_checked(L, spec_string(L, e, "version"));
        ec->capacity = (unsigned)spec_number(L, e, "capacity", 8);
        ec->weight = (unsigned)spec_number(L, e, "weight", 1);
        ec->token_budget = (uint64_t)spec_number(L, e, "token_budget", 0);
        ec->max_server_queue = (unsigned)spec_number(L, e, "max_server_queue", 0);
        const char *role = spec_string(L, e, "role"), *disagg = spec_string(L, e, "disaggregation");
        for (unsigned k = 0; role != NULL && atc_role_names[k] != NULL; k++)
            ec->role = strcmp(role, atc_role_names[k]) == 0 ? k : ec->role;
        if (role != NULL && strcmp(role, atc_role_names[ec->role]) != 0)
            luaL_error(L, "t.route: endpoint '%s': unknown role '%s'", id, role);
        lua_getfield(L, e, "tags");
        if (lua_istable(L, -1)) {
            size_t nt = lua_objlen(L, -1);
            ec->tags = check_alloc(L, calloc(nt ? nt : 1, sizeof(char *)));
            for (; ec->ntags < nt; ec->ntags++) {
                lua_rawgeti(L, -1, (int)ec->ntags + 1);
                ec->tags[ec->ntags] = dup_checked(L, luaL_checkstring(L, -1));
                lua_pop(L, 1);
            }
        }
        lua_pop(L, 1);
        if (model == NULL)
            model = "m";
        size_t m = 0;
        while (m < x->nmodels && strcmp(x->models[m].name, model) != 0)
            m++;
        if (m == x->nmodels) {
            x->nmodels++;
            x->models[m].name = dup_checked(L, model);
            x->models[m].endpoints = check_alloc(L, calloc(n, sizeof(struct atc_endpoint_config)));
        }
        struct atc_model_config *mc = &x->models[m];
        for (unsigned k = 0; disagg != NULL && atc_disagg_names[k] != NULL; k++)
            mc->disaggregation = strcmp(disagg, atc_disagg_names[k]) == 0 ? k : mc->disaggregation;
        mc->endpoints[mc->nendpoints++] = *ec; /* a shallow copy: the strings stay x->ecs[i]'s */
        lua_settop(L, e - 1);
    }
    struct atc_config cfg = {.models = x->models, .nmodels = x->nmodels};
    atc_signal_params_init(&cfg.signals);
    x->table = check_alloc(L, atc_endpoint_table_create(&cfg));
    x->health = check_alloc(L, calloc(n ? n : 1, sizeof(*x->health)));
}

static double nan_or(lua_State *L, int t, const char *name)
{
    return spec_number(L, t, name, NAN);
}

/* Each endpoint's live state, written where the engine writes it (counters, health.c's fields). */
static void set_live(lua_State *L, struct route_scratch *x, int eps)
{
    for (size_t i = 0; i < x->neps; i++) {
        lua_rawgeti(L, eps, (int)i + 1);
        int e = lua_gettop(L);
        struct atc_endpoint *ep = atc_endpoint_table_find(x->table, x->ecs[i].id);
        ep->inflight = (unsigned)spec_number(L, e, "inflight", 0);
        ep->inflight_tokens = (uint64_t)spec_number(L, e, "inflight_tokens", 0);
        ep->ttft_ewma_ms = spec_number(L, e, "ttft_ewma", 0);
        ep->errors_total = (uint64_t)spec_number(L, e, "errors", 0);
        ep->slow_start_limit = (unsigned)spec_number(L, e, "slow_start_limit", 0);
        lua_getfield(L, e, "health");
        bool checked = !(lua_type(L, -1) == LUA_TBOOLEAN && !lua_toboolean(L, -1)); /* false: no health */
        const char *state = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "healthy";
        enum atc_health_state hs = ATC_HEALTH_HEALTHY;
        bool found = false;
        for (int k = ATC_HEALTH_STARTING; k <= ATC_HEALTH_DRAINING && !found; k++)
            if (strcmp(atc_health_state_name((enum atc_health_state)k), state) == 0) {
                hs = (enum atc_health_state)k;
                found = true;
            }
        if (!found)
            luaL_error(L, "t.route: endpoint '%s': unknown health '%s'", ep->id, state);
        lua_pop(L, 1);
        lua_getfield(L, e, "routable");
        ep->routable = lua_isnil(L, -1) ? (!checked || hs == ATC_HEALTH_HEALTHY) : lua_toboolean(L, -1);
        lua_pop(L, 1);
        double queue = nan_or(L, e, "server_queue"), kv = nan_or(L, e, "kv_usage");
        if (checked) {
            struct atc_endpoint_health *h = &x->health[i];
            h->state = (int)hs; /* (what health.c publishes to the workers: atomics, the text a seqlock) */
            h->consecutive_failures = (unsigned)spec_number(L, e, "consecutive_failures", 0);
            const char *last_error = spec_string(L, e, "last_error");
            atc_health_text_set(&h->last_error, last_error != NULL ? last_error : "");
            h->last_check_ms = spec_number(L, e, "last_check", 0);
            ep->health = h;
        }
        /* What routing reads of the scrape (health.c), or what a simulated server reports (replay). */
        ep->server_queue = isfinite(queue) && queue > 0 ? (unsigned)lround(queue) : 0;
        ep->server_kv_usage = isfinite(kv) ? kv : 0;
        /* The routing signals (fleet/signals.h), on the runtime's clock (monotonic under atc test). */
        struct atc_signals *s = &ep->sig;
        uint64_t now = atc_mono_us();
        s->prefill_tokens = (uint64_t)spec_number(L, e, "prefill_tokens", 0);
        s->prefilling = (unsigned)spec_number(L, e, "prefilling", 0);
        s->decoding = (unsigned)spec_number(L, e, "decoding", 0);
        atc_signals_recent_set(s, spec_number(L, e, "recent_tokens", 0), now);
        s->prefill_tps_ewma = spec_number(L, e, "prefill_rate", 0); /* 0: none observed, the prior */
        s->itl_ms_ewma = spec_number(L, e, "itl", 0);
        s->uncached_ewma = spec_number(L, e, "uncached_mean", 0);
        ep->kv_tokens = (uint64_t)spec_number(L, e, "kv_tokens", 0);
        double cached = nan_or(L, e, "cached_token_share"); /* nil: never reported */
        if (isfinite(cached) && cached >= 0 && cached <= 1)
            atc_signals_cached(s, NULL, 1000000, (uint64_t)(cached * 1000000.0));
        double running = nan_or(L, e, "running"), hit = nan_or(L, e, "prefix_hit_rate");
        double age = spec_number(L, e, "scrape_age", 0);
        if (isfinite(queue) || isfinite(kv) || isfinite(running) || isfinite(hit))
            atc_signals_scraped(s, running, queue, kv, hit, now - (uint64_t)(age * 1000.0));
        lua_settop(L, e - 1);
    }
}

/* Scans @p body as a request to @p path into x->f. */
static void scan(lua_State *L, struct route_scratch *x, const char *path, const char *body, size_t len,
                 enum atc_request_kind *kind)
{
    *kind = kind_of_path(L, path);
    const char *err = NULL;
    if (atc_features_scan(*kind, body, len, x->f, &err) < 0)
        luaL_error(L, "t.route: the body is one atc answers with 400: %s", err);
}

/* ep:cached_tokens under t.route: the spec's figure for that endpoint. */
static int64_t route_cached(void *ctx, const struct atc_endpoint *ep)
{
    const struct route_scratch *x = ctx;
    for (size_t i = 0; i < x->neps; i++)
        if (strcmp(x->ecs[i].id, ep->id) == 0)
            return x->cached[i];
    return -1;
}

static int set_table_protected(lua_State *L)
{
    policy_api_set_table(lua_touserdata(L, 1));
    return 0;
}

static int test_route(lua_State *L)
{
    struct policy_version *v = lua_touserdata(L, lua_upvalueindex(1));
    luaL_checktype(L, 1, LUA_TTABLE);
    luaL_checktype(L, 2, LUA_TFUNCTION);
    if (v->req != NULL)
        return luaL_error(L, "t.route: not from inside a decision");
    lua_settop(L, 2);
    struct route_scratch *x = lua_newuserdata(L, sizeof(*x)); /* 3 */
    memset(x, 0, sizeof(*x));
    if (luaL_newmetatable(L, ROUTE_MT)) {
        lua_pushcfunction(L, scratch_gc);
        lua_setfield(L, -2, "__gc");
    }
    lua_setmetatable(L, 3);

    lua_getfield(L, 1, "endpoints");
    luaL_checktype(L, -1, LUA_TTABLE);
    int eps = lua_gettop(L);
    build_table(L, x, eps);
    set_live(L, x, eps);
    x->f = check_alloc(L, malloc(sizeof(*x->f)));
    x->prefix = check_alloc(L, atc_prefix_index_create(1 << 16));
    struct atc_policy_settings settings = v->rt->s;
    double budget_ms = spec_number(L, 1, "budget_ms", 0); /* a decision's budget (default: the test's) */
    if (budget_ms > 0)
        settings.budget_us = (uint64_t)(budget_ms * 1000);
    x->rt = check_alloc(L, policy_runtime_create(&settings));
    x->rt->test_mode = true;
    x->rt->table = x->table;
    x->rt->prefix = x->prefix;
    x->rt->affinity = v->rt->affinity; /* the run's: session pins last for the whole run, as documented */
    x->rt->rng = (uint64_t)spec_number(L, 1, "seed", 1);

    /* Earlier requests, routed where spec.routed says: the prefix index learns their blocks. */
    lua_getfield(L, 1, "routed");
    if (lua_istable(L, -1)) {
        int routed = lua_gettop(L);
        for (int i = 1; i <= (int)lua_objlen(L, routed); i++) {
            lua_rawgeti(L, routed, i);
            int r = lua_gettop(L);
            luaL_checktype(L, r, LUA_TTABLE);
            const char *id = spec_string(L, r, "endpoint"), *path = spec_string(L, r, "path");
            lua_getfield(L, r, "body");
            size_t len;
            const char *body = luaL_checklstring(L, -1, &len);
            struct atc_endpoint *ep = id != NULL ? atc_endpoint_table_find(x->table, id) : NULL;
            if (ep == NULL)
                luaL_error(L, "t.route: routed[%d]: no endpoint '%s'", i, id != NULL ? id : "(none)");
            enum atc_request_kind kind;
            scan(L, x, path != NULL ? path : "/v1/chat/completions", body, len, &kind);
            struct atc_route_request earlier = {.features = x->f};
            atc_policy_routed(x->rt, &earlier, ep);
            lua_settop(L, routed);
        }
    }
    lua_settop(L, eps);

    /* The request, as http_front.c and relay.c make it. */
    lua_getfield(L, 1, "headers");
    if (lua_istable(L, -1)) {
        for (lua_pushnil(L); lua_next(L, -2) != 0; lua_pop(L, 1)) {
            if (lua_type(L, -2) != LUA_TSTRING || !lua_isstring(L, -1))
                luaL_error(L, "t.route: headers must map names to strings");
            if (x->nheaders == ROUTE_HEADERS_MAX)
                luaL_error(L, "t.route: more than %d headers", ROUTE_HEADERS_MAX);
            size_t h = x->nheaders++;
            x->hname[h] = dup_checked(L, lua_tostring(L, -2));
            x->hvalue[h] = dup_checked(L, lua_tostring(L, -1));
        }
    }
    lua_pop(L, 1);
    const char *path = spec_string(L, 1, "path");
    if (path == NULL)
        path = "/v1/chat/completions";
    lua_getfield(L, 1, "body");
    size_t len;
    const char *body = luaL_checklstring(L, -1, &len);
    x->body = check_alloc(L, malloc(len + 1)); /* the features borrow it; the spec may change meanwhile */
    memcpy(x->body, body, len + 1);
    lua_pop(L, 1);
    enum atc_request_kind kind;
    scan(L, x, path, x->body, len, &kind);
    if (!x->f->has_model || x->f->model[0] == '\0')
        luaL_error(L, "t.route: the body has no model (atc answers 400)");
    const char *prio = route_header(x, "x-atc-priority");
    if (prio != NULL && (prio[0] < '0' || prio[0] > '9' || prio[1] != '\0'))
        luaL_error(L, "t.route: x-atc-priority must be a digit (atc answers 400)");
    char id[64], tenant[128], session[ATC_FEATURES_NAME_MAX];
    const char *given = route_header(x, "x-request-id"); /* http_front.c's request_id, but for its charset */
    if (given == NULL || given[0] == '\0')
        given = spec_string(L, 1, "id");
    snprintf(id, sizeof(id), "%s", given != NULL ? given : "t-route");
    const char *t = route_header(x, "x-atc-tenant"), *s = route_header(x, "x-atc-session");
    snprintf(tenant, sizeof(tenant), "%s", t != NULL ? t : ""); /* relay.c's copy_str */
    snprintf(session, sizeof(session), "%s", s != NULL ? s : x->f->user);

    /* endpoints[i].cached_tokens: what that endpoint's KV events say it holds of this request */
    x->cached = check_alloc(L, calloc(x->neps ? x->neps : 1, sizeof(*x->cached)));
    bool any_cached = false;
    for (size_t i = 0; i < x->neps; i++) {
        lua_rawgeti(L, eps, (int)i + 1);
        double c = nan_or(L, lua_gettop(L), "cached_tokens");
        x->cached[i] = isfinite(c) && c >= 0 ? (int64_t)c : -1;
        any_cached |= x->cached[i] >= 0;
        lua_pop(L, 1);
    }

    lua_getfield(L, 1, "tried");
    size_t ntried = lua_istable(L, -1) ? lua_objlen(L, -1) : 0;
    x->tried = check_alloc(L, calloc(ntried ? ntried : 1, sizeof(*x->tried)));
    for (size_t i = 0; i < ntried; i++) {
        lua_rawgeti(L, -1, (int)i + 1);
        const char *tid = luaL_checkstring(L, -1);
        if ((x->tried[i] = atc_endpoint_table_find(x->table, tid)) == NULL)
            luaL_error(L, "t.route: tried: no endpoint '%s'", tid);
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    struct atc_route_request rq = {
        .id = id,
        .path = path,
        .kind = kind,
        .features = x->f,
        .priority = prio != NULL ? prio[0] - '0' : 0,
        .tenant = tenant,
        .session = session,
        .attempt = (unsigned)spec_number(L, 1, "attempt", (double)ntried + 1),
        .tokens = atc_request_tokens(x->f->prompt_tokens, x->f->max_tokens, x->f->choices),
        .tried = x->tried,
        .ntried = ntried,
        .header = route_header,
        .header_ctx = x,
        .block_tokens = (uint32_t)spec_number(L, 1, "block_tokens", 0),
        .cached_tokens = any_cached ? route_cached : NULL,
        .cached_ctx = x,
    };
    struct atc_explain scores = {0};
    rq.explain = &scores; /* d.scores: what atc.explain attached */

    /* The decision, on the serving path, with this state deciding. Everything it needs is anchored in
     * the registry: atc_policy_route clears this function's stack. */
    lua_pushvalue(L, 3);
    int scratch_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    struct atc_policy_runtime *own = v->rt;
    int own_route = v->route_ref;
    v->rt = x->rt;
    if (lua_cpcall(L, set_table_protected, v) != 0) {
        v->rt = own;
        luaL_unref(L, LUA_REGISTRYINDEX, scratch_ref);
        return lua_error(L);
    }
    lua_pushvalue(L, 2);
    v->route_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    x->rt->current = v;
    struct atc_decision d;
    atc_policy_route(x->rt, &rq, &d);
    x->rt->current = NULL;
    luaL_unref(L, LUA_REGISTRYINDEX, v->route_ref);
    v->route_ref = own_route;
    v->rt = own;
    int restored = lua_cpcall(L, set_table_protected, v); /* back to the runner's (empty) table */

    char endpoint[256] = "", prefill[256] = "", error[512] = "";
    if (d.kind == ATC_DECISION_ENDPOINT && d.endpoint != NULL)
        snprintf(endpoint, sizeof(endpoint), "%s", d.endpoint->id);
    if (d.kind == ATC_DECISION_ENDPOINT && d.prefill != NULL)
        snprintf(prefill, sizeof(prefill), "%s", d.prefill->id);
    if (d.kind == ATC_DECISION_FALLBACK && x->rt->last_error != NULL) /* what log_failure logged */
        snprintf(error, sizeof(error), "%s", x->rt->last_error);
    char score_ids[ATC_EXPLAIN_MAX][128]; /* the ids are the scratch table's, freed next */
    for (unsigned i = 0; i < scores.n; i++)
        snprintf(score_ids[i], sizeof(score_ids[i]), "%s", scores.s[i].endpoint);
    scratch_free(x);
    luaL_unref(L, LUA_REGISTRYINDEX, scratch_ref);
    if (restored != 0)
        return lua_error(L);
    lua_createtable(L, 0, 6);
    lua_createtable(L, (int)scores.n, 0);
    for (unsigned i = 0; i < scores.n; i++) {
        lua_createtable(L, 0, 3);
        lua_pushstring(L, score_ids[i]);
        lua_setfield(L, -2, "endpoint");
        lua_pushnumber(L, scores.s[i].score);
        lua_setfield(L, -2, "score");
        lua_pushstring(L, scores.s[i].note);
        lua_setfield(L, -2, "note");
        lua_rawseti(L, -2, (int)i + 1);
    }
    lua_setfield(L, -2, "scores");
    lua_pushstring(L, atc_decision_kind_name(d.kind));
    lua_setfield(L, -2, "kind");
    if (endpoint[0] != '\0') {
        lua_pushstring(L, endpoint);
        lua_setfield(L, -2, "endpoint");
    }
    if (prefill[0] != '\0') {
        lua_pushstring(L, prefill);
        lua_setfield(L, -2, "prefill");
    }
    if (d.kind == ATC_DECISION_REJECT) {
        lua_pushinteger(L, d.status);
        lua_setfield(L, -2, "status");
    }
    if (d.kind == ATC_DECISION_QUEUE || d.kind == ATC_DECISION_REJECT) {
        lua_pushstring(L, d.message);
        lua_setfield(L, -2, "message");
    }
    if (d.reason != NULL) {
        lua_pushstring(L, d.reason);
        lua_setfield(L, -2, "reason");
    }
    if (error[0] != '\0') {
        lua_pushstring(L, error);
        lua_setfield(L, -2, "error");
    }
    return 1;
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
    char chunk[PATH_MAX + 2];
    snprintf(chunk, sizeof(chunk), "@%s", file);
    lua_pushstring(L, chunk); /* for sandbox.c: the modules this file requires itself (t.replay) */
    lua_setfield(L, LUA_REGISTRYINDEX, POLICY_TEST_FILE);
    if (policy_load_chunk(L, file) < 0 || policy_protected_call(v, 0, r->rt->s.budget_us, 0, &why) != 0) {
        printf("FAIL %s: %s\n", file, lua_isstring(L, -1) ? lua_tostring(L, -1) : "cannot load");
        flush_log(r);
        r->failed++;
        policy_version_destroy(v);
        return;
    }
    int returned = lua_gettop(L), found = 0;
    if (r->log_len > 0 || r->log_dropped > 0) { /* logged by the file itself, outside any test */
        printf("load %s\n", file);
        flush_log(r);
    }

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
    policy_version_destroy(v);
}

/* `atc test --contract`: stdlib/atc/contract.lua's markdown(), run in the sandbox, on stdout. */
static int print_contract(void)
{
    struct atc_policy_settings s = {
        .stdlib_dir = atc_policy_stdlib_dir(),
        .budget_us = 10 * 1000 * 1000,
        .memory = (size_t)64 << 20,
    };
    struct atc_policy_runtime *rt = policy_runtime_create(&s);
    if (rt == NULL)
        return 1;
    rt->test_mode = true;
    char *err = NULL;
    struct policy_version *v = policy_version_create(rt, &err);
    int rc = 1;
    if (v == NULL) {
        fprintf(stderr, "atc test: %s\n", err);
        free(err);
        goto done;
    }
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/atc/contract.lua", s.stdlib_dir);
    const char *why;
    lua_State *L = v->L;
    if (policy_load_chunk(L, path) < 0 || policy_protected_call(v, 0, s.budget_us, 0, &why) != 0 ||
        !lua_istable(L, -1)) {
        fprintf(stderr, "atc test: %s: %s\n", path, lua_isstring(L, -1) ? lua_tostring(L, -1) : "no table");
        goto done;
    }
    lua_getfield(L, -1, "markdown");
    if (policy_protected_call(v, 0, s.budget_us, 0, &why) != 0 || !lua_isstring(L, -1)) {
        fprintf(stderr, "atc test: %s: markdown(): %s\n", path,
                lua_isstring(L, -1) ? lua_tostring(L, -1) : "no text");
        goto done;
    }
    fputs(lua_tostring(L, -1), stdout);
    rc = 0;
done:
    policy_version_destroy(v);
    atc_policy_runtime_destroy(rt);
    return rc;
}

int atc_policy_test_main(int argc, char **argv, int (*replay)(lua_State *L))
{
    static const struct option longopts[] = {
        {"config", required_argument, NULL, 'c'}, {"scripts", required_argument, NULL, 's'},
        {"budget", required_argument, NULL, 'b'}, {"filter", required_argument, NULL, 'f'},
        {"verbose", no_argument, NULL, 'v'},      {"contract", no_argument, NULL, 'C'},
        {"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0},
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
        case 'C':
            return print_contract();
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
    join_path(entry, sizeof(entry), scripts, "policy.lua");
    struct atc_policy_settings s = {
        .entry = cfg != NULL ? cfg->policy.entry : entry,
        .path = cfg != NULL ? (const char *const *)cfg->policy.path : NULL,
        .npath = cfg != NULL ? cfg->policy.npath : 0,
        .stdlib_dir = atc_policy_stdlib_dir(),
        .budget_us = budget_us,
        .memory = cfg != NULL ? cfg->policy.memory : (size_t)256 << 20,
        .log = on_policy_log,
        .log_ctx = &r,
    };
    r.rt = policy_runtime_create(&s);
    atc_config_free(cfg);
    if (r.rt == NULL)
        return 1;
    r.rt->test_mode = true;
    r.rt->test_replay = replay;
    r.rt->test_route = test_route;
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
    free(r.log);
    return r.failed > 0 || files.n == 0 ? 1 : 0;
}
