/* The policy runtime at its memory cap: building a state (sandbox, API, entry, require, init) under
 * every cap from far too small to enough either works or says "policy.memory ... is too small", never
 * exits; loading a chunk outside a protected call is safe; and atc.replay running out of Lua memory
 * while it builds its results raises a memory error, frees its C memory and does not let pcall swallow
 * it. Run from the source tree (ctest does). */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <lauxlib.h>

#include "config/config.h"
#include "base/log.h"
#include "fleet/affinity.h"
#include "fleet/endpoint.h"
#include "policy/sandbox.h"
#include "policy/state.h"
#include "policy/version.h"
#include "trace/replay.h"
#include "trace/replay_lua.h"

static char tmpdir[] = "/tmp/atc-test-policy-memory-XXXXXX";

static int setup(void **state)
{
    atc_log_set_level(ATC_LOG_ERROR);
    return mkdtemp(tmpdir) == NULL ? -1 : 0;
}

static int teardown(void **state)
{
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static const char *write_file(const char *name, const char *text)
{
    static char path[512];
    snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

/* The shipped policy (it requires stdlib modules and runs init) under caps from 8KiB to 1MiB: each
 * either loads or fails with a message naming policy.memory; some of each. */
static void test_every_cap_loads_or_says_why(void **state)
{
    struct atc_model_config model = {.name = "llama-3-8b"};
    struct atc_config cfg = {.models = &model, .nmodels = 1};
    struct atc_endpoint_table *table = atc_endpoint_table_create(&cfg);
    assert_non_null(table);
    for (int i = 0; i < 4; i++) {
        char id[16];
        snprintf(id, sizeof(id), "ep-%d", i);
        assert_non_null(atc_endpoint_table_add(table, "llama-3-8b", id, "127.0.0.1", 9000, 8));
    }
    unsigned loaded = 0, sandbox = 0, policy = 0;
    for (size_t cap = 8 << 10; cap <= 1 << 20; cap += 3001) {
        struct atc_policy_settings s = {
            .entry = "scripts/policy.lua",
            .stdlib_dir = atc_policy_stdlib_dir(),
            .budget_us = 1000000,
            .memory = cap,
        };
        char *err = NULL;
        struct atc_policy_runtime *rt = atc_policy_runtime_create(&s, table, NULL, NULL, &err);
        if (rt != NULL) {
            assert_null(err);
            loaded++;
            atc_policy_runtime_destroy(rt);
            continue;
        }
        assert_non_null(err);
        if (strstr(err, "is too small to build the sandbox: not enough memory") != NULL ||
            strstr(err, "is too small to create a Lua state") != NULL)
            sandbox++;
        else if (strstr(err, "is too small to load the policy: ") != NULL)
            policy++;
        else if (strstr(err, "not enough memory") == NULL) /* the smoke test's words */
            fail_msg("cap %zu: %s", cap, err);
        assert_true(strncmp(err, "policy.memory ", 14) == 0 || strstr(err, "not enough memory") != NULL);
        free(err);
    }
    assert_true(loaded > 0);
    assert_true(sandbox > 0);
    assert_true(policy > 0);
    atc_endpoint_table_destroy(table);
}

/* A test-mode runtime (the sandbox alone, atc.replay installed) with @p cap bytes per state. */
static struct atc_policy_runtime *test_runtime(size_t cap)
{
    struct atc_policy_settings s = {
        .entry = "scripts/policy.lua",
        .stdlib_dir = atc_policy_stdlib_dir(),
        .budget_us = 30 * 1000000,
        .memory = cap,
    };
    struct atc_policy_runtime *rt = policy_runtime_create(&s);
    assert_non_null(rt);
    rt->test_mode = true;
    rt->test_replay = (lua_CFunction)atc_replay_lua;
    return rt;
}

/* policy_load_chunk as the `atc test` runner calls it (no protected call around it), with the state's
 * memory nearly used up: it fails with a message or loads, and the state stays usable. */
static void test_load_chunk_at_the_cap(void **state)
{
    const char *path = write_file("chunk.lua", "local t = {} for i = 1, 10 do t[i] = i end return #t\n");
    unsigned failed = 0, ok = 0;
    for (size_t headroom = 0; headroom < 4096; headroom += 16) {
        struct atc_policy_runtime *rt = test_runtime(1 << 20);
        char *err = NULL;
        struct policy_version *v = policy_version_create(rt, &err);
        assert_non_null(v);
        v->mem_limit = v->mem_used + headroom;
        lua_State *L = v->L;
        int top = lua_gettop(L);
        if (policy_load_chunk(L, path) < 0) {
            assert_int_equal(lua_type(L, -1), LUA_TSTRING);
            failed++;
        } else {
            assert_int_equal(lua_type(L, -1), LUA_TFUNCTION);
            ok++;
        }
        assert_int_equal(lua_gettop(L), top + 1);
        policy_version_destroy(v);
        atc_policy_runtime_destroy(rt);
    }
    assert_true(failed > 0);
    assert_true(ok > 0);
}

/* Runs @p code (a chunk) in a fresh test-mode state with @p headroom bytes left once it is loaded
 * (0: 64MiB in all); returns the protected call's status, its why, and its result or message in @p out. */
static int run_chunk(size_t headroom, const char *code, const char **why, char *out, size_t outsize)
{
    struct atc_policy_runtime *rt = test_runtime(64 << 20);
    rt->affinity = atc_affinity_create(0);
    char *err = NULL;
    struct policy_version *v = policy_version_create(rt, &err);
    assert_non_null(v);
    const char *path = write_file("replay.lua", code);
    assert_int_equal(policy_load_chunk(v->L, path), 0);
    if (headroom > 0)
        v->mem_limit = v->mem_used + headroom;
    int status = policy_protected_call(v, 0, rt->s.budget_us, 0, why);
    snprintf(out, outsize, "%s", lua_tostring(v->L, -1) != NULL ? lua_tostring(v->L, -1) : "?");
    policy_version_destroy(v);
    atc_affinity_destroy(rt->affinity);
    atc_policy_runtime_destroy(rt);
    return status;
}

#define REPLAY                                                                                               \
    "atc.replay { trace = 'tests/policy/fixtures/sessions.jsonl', snapshots = true, policy = "               \
    "'examples/policies/round_robin.lua', fleet = { { model = 'llama-3-8b', count = 3, max_seqs = 8 } } }"

static void test_replay_out_of_memory_frees_its_c_memory(void **state)
{
    const char *why;
    char out[512];
    /* With room, the replay returns every decision. */
    int status =
        run_chunk(0, "local d, r = " REPLAY " return #d .. ' ' .. r.requests", &why, out, sizeof(out));
    if (status != 0)
        fail_msg("%s", out);
    assert_string_equal(out, "274 274");

    /* With room for the call (64KiB) but not for its result tables (about 1KiB a decision): a memory
     * error, that pcall does not swallow, and no C memory left behind: about the same main-arena bytes
     * in use after each run (the trace and results the C side holds are over 100KiB a run). */
    const char *code = "local ok = pcall(function() return " REPLAY " end) return 'swallowed'";
    size_t before = 0;
    for (int i = 0; i < 8; i++) {
        status = run_chunk(64 << 10, code, &why, out, sizeof(out));
        assert_int_not_equal(status, 0);
        assert_string_equal(why, "memory");
        assert_non_null(strstr(out, "not enough memory"));
        malloc_trim(0);
        size_t used = mallinfo2().uordblks;
        if (i == 2) /* after the caches of the first runs (a few KiB) are warm */
            before = used;
        else if (i > 2 && used > before + (32 << 10))
            fail_msg("replay %d: %zu bytes more in use than after the third (a leak)", i, used - before);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_cap_loads_or_says_why),
        cmocka_unit_test(test_load_chunk_at_the_cap),
        cmocka_unit_test(test_replay_out_of_memory_frees_its_c_memory),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
