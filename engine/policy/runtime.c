/* The policy runtime: versions with hot reload and rollback, decisions within a budget, the clock.
 * The pieces: watchdog.c (the budget), sandbox.c (a state's sandbox and require), version.c (one
 * version's state), status.c (status JSON and metrics), watch.c (inotify); what a policy sees is in
 * policy_api.c, the `atc test` runner in policy_test.c. */

#include "policy/policy.h"
#include "policy/canary.h"
#include "policy/decision.h"
#include "policy/policy_api.h"
#include "policy/shadow.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <lauxlib.h>

#include "base/clock.h"
#include "base/log.h"
#include "fleet/affinity.h"
#include "config/roles.h"
#include "fleet/endpoint.h"
#include "policy/sandbox.h"
#include "policy/state.h"
#include "policy/version.h"
#include "policy/watch.h"
#include "policy/watchdog.h"

const char atc_policy_fallback_error[] = "error";
const char atc_policy_fallback_budget[] = "overrun"; /* the one name: header, record, metrics, log */
const char atc_policy_fallback_memory[] = "memory";
const char atc_policy_fallback_invalid[] = "invalid_return"; /* a label value: no space */

/* A new version is on probation (and can be rolled back) until it has made this many good decisions. */
#define PROBATION_SUCCESSES 100

static double default_now_ms(void *ctx)
{
    return (double)atc_mono_ns() / 1e6;
}

/* ---- decisions ---- */

/* streak: the failures in a row of v counted across the workers (what rollback_after compares), 0 for a
 * canary's decision, which counts toward no streak. */
static void log_failure(struct atc_policy_runtime *rt, struct policy_version *v, const char *what,
                        const char *msg, unsigned streak)
{
    /* Rate-limited: the first failures of a version on this worker, then every 1000th. */
    uint64_t failures = v->c.errors + v->c.overruns + v->c.oom + v->c.invalid;
    if (streak > 0 && (failures <= 10 || failures % 1000 == 0))
        atc_warn("policy v%llu %s (%u in a row across the workers, routed by the C balancer): %s",
                 (unsigned long long)v->version, what, streak, msg);
    else if (failures <= 10 || failures % 1000 == 0)
        atc_warn("policy v%llu %s (canary, routed by the C balancer): %s", (unsigned long long)v->version,
                 what, msg);
    free(rt->last_error);
    rt->last_error = strdup(msg);
}

/* Only the worker whose failure reached rollback_after (leader) says so; the others follow it quietly
 * at their next decision (atc_policy_sync), when the streak is already reset. */
static void rollback(struct atc_policy_runtime *rt, bool leader)
{
    struct policy_version *bad = rt->current;
    if (leader)
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
    policy_version_destroy(bad); /* decisions are synchronous: nothing else uses it now */
}

void atc_policy_sync(struct atc_policy_runtime *rt)
{
    if (rt->s.group != NULL && rt->last_good != NULL &&
        atomic_load(&rt->s.group->rolled_back) == rt->current->version) {
        rollback(rt, false);
    }
}

/* Counts a decision of v; a failure is logged here (what, msg), with the streak it makes. */
static void count_result(struct atc_policy_runtime *rt, struct policy_version *v, bool ok, const char *what,
                         const char *msg)
{
    struct atc_policy_group *g = rt->s.group;
    if (ok) {
        v->consecutive_failures = 0;
        /* It served: from now on it is the version a later bad one rolls back to (swap_in). */
        if (v->successes == 0 && g != NULL &&
            atomic_load_explicit(&g->served, memory_order_relaxed) < v->version)
            atomic_store(&g->served, v->version);
        if (g != NULL && atomic_load_explicit(&g->streak, memory_order_relaxed) != 0)
            atomic_store(&g->streak, 0);
        if (++v->successes == PROBATION_SUCCESSES && rt->last_good != NULL && rt->current == v) {
            policy_version_destroy(rt->last_good); /* proven: the previous version is no longer needed */
            rt->last_good = NULL;
        }
        return;
    }
    rt->fallbacks++;
    v->consecutive_failures = g != NULL ? atomic_fetch_add(&g->streak, 1) + 1 : v->consecutive_failures + 1;
    log_failure(rt, v, what, msg, v->consecutive_failures);
    if (rt->current == v && rt->last_good != NULL && rt->s.rollback_after > 0 &&
        v->consecutive_failures >= rt->s.rollback_after)
        rollback(rt, true);
}

/* The stage @p ep takes of a request of its model: ATC_ROLE_PREFILL for a prefill server of a
 * disaggregated model, ATC_ROLE_DECODE for its decode (or both) servers, ATC_ROLE_BOTH when the model is
 * not disaggregated. */
static unsigned stage_of(const struct policy_version *v, const struct atc_endpoint *ep)
{
    const struct atc_model *m =
        v->rt->table != NULL ? atc_endpoint_table_model(v->rt->table, ep->model, strlen(ep->model)) : NULL;
    if (m == NULL || m->disaggregation == ATC_DISAGG_NONE)
        return ATC_ROLE_BOTH;
    return ep->role == ATC_ROLE_PREFILL ? ATC_ROLE_PREFILL : ATC_ROLE_DECODE;
}

/* The field @p name of the table at -1 (a plain table: no metamethod runs): false when it is set to
 * anything but an available endpoint that takes @p stage of a disaggregated model (a prefill stage:
 * role prefill or both; a decode stage: decode or both); *ep NULL when it is not set. */
static bool pair_field(struct policy_version *v, const char *name, unsigned stage, struct atc_endpoint **ep)
{
    lua_State *L = v->L;
    lua_getfield(L, -1, name);
    bool ok = lua_isnil(L, -1);
    *ep = ok ? NULL : policy_api_to_endpoint(v, -1);
    if (*ep != NULL && policy_api_available(v, *ep) && stage_of(v, *ep) != ATC_ROLE_BOTH)
        ok = stage == ATC_ROLE_PREFILL ? (*ep)->role != ATC_ROLE_DECODE : (*ep)->role != ATC_ROLE_PREFILL;
    lua_pop(L, 1);
    return ok;
}

/* route returned a table {prefill = ep, decode = ep} (either may be left out: the C balancer picks that
 * one): a disaggregated model's pair. */
static bool interpret_pair(struct policy_version *v, struct atc_decision *out)
{
    struct atc_endpoint *prefill, *decode;
    if (!pair_field(v, "prefill", ATC_ROLE_PREFILL, &prefill) ||
        !pair_field(v, "decode", ATC_ROLE_DECODE, &decode))
        return false;
    if ((prefill == NULL && decode == NULL) ||
        (prefill != NULL && decode != NULL && strcmp(prefill->model, decode->model) != 0))
        return false;
    out->kind = ATC_DECISION_ENDPOINT;
    out->endpoint = decode;
    out->prefill = prefill;
    return true;
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
    struct atc_endpoint *ep = policy_api_to_endpoint(v, -1), *prefill = NULL;
    if (ep == NULL && lua_istable(L, -1) && policy_api_view_index(v, -1) < 0) /* {prefill = , decode = } */
        return interpret_pair(v, out);
    if (ep == NULL || !policy_api_available(v, ep))
        return false;
    if (stage_of(v, ep) == ATC_ROLE_PREFILL) /* one prefill server: its stage; the C balancer the other */
        prefill = ep, ep = NULL;
    out->kind = ATC_DECISION_ENDPOINT;
    out->endpoint = ep;
    out->prefill = prefill;
    return true;
}

/* What a script returned, for the log: bounded, one line. */
static void describe_value(lua_State *L, char *buf, size_t size)
{
    int t = lua_type(L, -1);
    if (t == LUA_TSTRING) {
        size_t len;
        const char *s = lua_tolstring(L, -1, &len);
        size_t n = len > 64 ? 64 : len, k = 0;
        char text[65];
        for (size_t i = 0; i < n; i++)
            text[k++] = s[i] >= 0x20 && s[i] < 0x7f && s[i] != '"' ? s[i] : '?';
        text[k] = '\0';
        snprintf(buf, size, "\"%s\"%s", text, len > 64 ? "..." : "");
    } else if (t == LUA_TNUMBER) {
        snprintf(buf, size, "%.14g", lua_tonumber(L, -1));
    } else if (t == LUA_TBOOLEAN) {
        snprintf(buf, size, "%s", lua_toboolean(L, -1) ? "true" : "false");
    } else {
        snprintf(buf, size, "a %s", luaL_typename(L, -1));
    }
}

/* Why the value at -1 is no decision, with the value and where route is defined (the return itself has
 * left the stack by now). */
static void describe_invalid(struct policy_version *v, char *buf, size_t size)
{
    lua_State *L = v->L;
    char where[300] = "";
    lua_Debug ar;
    lua_rawgeti(L, LUA_REGISTRYINDEX, v->route_ref);
    if (lua_getinfo(L, ">S", &ar) != 0)
        snprintf(where, sizeof(where), "%s:%d", ar.short_src, ar.linedefined);
    char value[96];
    describe_value(L, value, sizeof(value));
    const struct atc_endpoint *ep = policy_api_to_endpoint(v, -1);
    if (lua_isnil(L, -1))
        snprintf(buf, size, "%s: route returned nil (return an endpoint, atc.queue() or atc.reject())",
                 where);
    else if (ep != NULL)
        snprintf(buf, size,
                 "%s: route returned endpoint %s, which cannot take it now (full, unhealthy or tried)", where,
                 ep->id);
    else if (lua_type(L, -1) == LUA_TSTRING)
        snprintf(buf, size, "%s: route returned %s, which is no endpoint id", where, value);
    else if (lua_istable(L, -1))
        snprintf(buf, size,
                 "%s: route returned a table that is neither an endpoint view nor {prefill = ep, decode = ep} "
                 "of available servers that take those stages of one disaggregated model",
                 where);
    else
        snprintf(buf, size, "%s: route returned %s (return an endpoint, atc.queue() or atc.reject())", where,
                 value);
}

/* Runs one decision on version @p v. Returns true when the policy decided. */
static bool decide(struct policy_version *v, const struct atc_route_request *req, uint64_t budget_us,
                   struct atc_decision *out, char *errbuf, size_t errsize, const char **why)
{
    lua_State *L = v->L;
    v->req = req;
    v->overlaps_ready = false;
    v->serial++;
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
        describe_invalid(v, errbuf, errsize);
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
    struct policy_version *cv = policy_canary_takes(rt->canary, req);
    struct policy_version *v = cv != NULL ? cv : rt->current;
    out->version = v->version;
    out->canary = cv != NULL;
    if (rt->stale) {
        out->kind = ATC_DECISION_FALLBACK;
        out->reason = atc_policy_fallback_error;
        rt->fallbacks++;
        return;
    }
    char err[512];
    const char *why = NULL;
    if (req->explain != NULL)
        req->explain->n = req->explain->dropped = 0;
    bool ok = decide(v, req, rt->s.budget_us, out, err, sizeof(err), &why);
    if (!ok) {
        out->kind = ATC_DECISION_FALLBACK;
        out->reason = why;
    }
    policy_canary_count(rt->canary, out->canary, ok, why);
    if (out->canary) { /* no streak and no rollback of its own: its window judges it (canary.c) */
        rt->fallbacks += !ok;
        if (!ok)
            log_failure(rt, v, why, err, 0);
    } else {
        count_result(rt, v, ok, why, err);
    }
}

size_t atc_policy_routed(struct atc_policy_runtime *rt, const struct atc_route_request *req,
                         const struct atc_endpoint *ep)
{
    if (rt->prefix == NULL || req->features == NULL || req->features->nblocks == 0)
        return 0;
    uint32_t bt = atc_block_tokens(req->block_tokens);
    return atc_prefix_index_insert(rt->prefix, req->features->blocks, req->features->nblocks, ep->index, bt,
                                   atomic_load_explicit(&ep->kv_tokens, memory_order_relaxed));
}

void atc_policy_released(struct atc_policy_runtime *rt, const struct atc_features *f, uint32_t block_tokens,
                         const struct atc_endpoint *ep, int64_t output_tokens)
{
    if (rt->prefix == NULL || f == NULL) /* a prompt of no full block: its output still takes room */
        return;
    uint32_t bt = atc_block_tokens(block_tokens);
    uint64_t full = (uint64_t)f->nblocks * bt;
    atc_prefix_index_released(rt->prefix, f->blocks, f->nblocks, ep->index, bt,
                              atomic_load_explicit(&ep->kv_tokens, memory_order_relaxed),
                              (f->prompt_tokens > full ? f->prompt_tokens - full : 0) +
                                  (output_tokens > 0 ? (uint64_t)output_tokens : 0));
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
            if (!decide(v, &req, rt->s.budget_us * POLICY_INIT_BUDGET_FACTOR, &d, msg, sizeof(msg), &why) &&
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

static void reload_failed(struct atc_policy_runtime *rt, const char *err, bool log);

uint64_t atc_policy_reload(struct atc_policy_runtime *rt, char **err)
{
    *err = NULL;
    struct policy_version *v = policy_version_create(rt, err);
    if (v != NULL && smoke_test(rt, v, err) < 0) {
        policy_version_destroy(v);
        v = NULL;
    }
    if (v == NULL) {
        if (*err == NULL)
            *err = strdup("reload failed");
        reload_failed(rt, *err, true);
        return 0;
    }
    v->version = ++rt->next_version;
    policy_swap_in(rt, v);
    return v->version;
}

/* Records a reload that failed with @p err (copied); @p log: say so (once per reload, not per worker). */
static void reload_failed(struct atc_policy_runtime *rt, const char *err, bool log)
{
    rt->last_reload_at = atc_wall_s();
    rt->reloads_failed++;
    free(rt->last_error);
    rt->last_error = strdup(err);
    if (log)
        atc_error("policy reload failed, v%llu keeps routing: %s", (unsigned long long)rt->current->version,
                  err);
}

/* Makes @p v (built, numbered) the version that decides from the next decision on. */
void policy_swap_in(struct atc_policy_runtime *rt, struct policy_version *v)
{
    rt->last_reload_at = atc_wall_s();
    /* The version a bad new one rolls back to is the last one that served: the outgoing one once it made a
     * good decision (here or, through the group, on any worker), else the one kept before it. */
    struct policy_version *old = rt->current;
    bool served =
        old->successes > 0 || (rt->s.group != NULL && atomic_load(&rt->s.group->served) >= old->version);
    if (rt->last_good == NULL || served) {
        policy_version_destroy(rt->last_good);
        rt->last_good = old;
    } else {
        policy_version_destroy(old);
    }
    rt->current = v;
    rt->reloads_ok++;
    if (rt->s.group != NULL)
        atomic_store(&rt->s.group->streak, 0); /* a new version starts with a clean record */
    free(rt->last_error);
    rt->last_error = NULL;
    if (!rt->s.quiet)
        atc_info("policy v%llu loaded from %s (files hash %016llx)", (unsigned long long)v->version,
                 rt->s.entry, (unsigned long long)v->files_hash);
}

/* ---- building a version off the serving thread ---- */

struct atc_policy_build {
    /* The loader: a runtime of its own (watchdog, clock, random numbers) over the same settings, endpoint
     * table and engine tables, so that it may run on another thread while the runtimes decide. */
    struct atc_policy_runtime *loader;
    struct policy_version **versions; /* [n]: one per runtime, taken by atc_policy_adopt */
    size_t n;
    uint64_t version;         /* the number they take */
    uint64_t table_changes;   /* the runtimes' when the build began: a later table makes the build stale */
    uint64_t table_updates;   /* likewise for endpoint set changes: its views are then updated on adoption */
    uint64_t shadow_versions; /* the runtimes' shadows loaded so far: a shadow build numbers from there */
    bool failed;
    char *err;                        /* why it failed (NULL: out of memory) */
    struct atc_policy_target_spec as; /* as.entry owned */
};

int atc_policy_build_target(struct atc_policy_build *b, const struct atc_policy_target_spec *spec)
{
    b->as = *spec;
    b->as.entry = NULL;
    if (spec->target != ATC_POLICY_SHADOW)
        return 0;
    struct atc_policy_runtime *l = b->loader;
    if ((b->as.entry = strdup(spec->entry)) == NULL)
        return -1;
    /* Checked here, on the main thread before the loader starts, against the live settings: a refused
     * path fails the build with its reason and the loader reads nothing. */
    if (policy_check_entry(l, spec->entry, &b->err) < 0) {
        b->failed = true;
        return b->err != NULL ? 0 : -1;
    }
    free((char *)l->s.entry);
    l->s.entry = strdup(spec->entry);
    l->affinity = l->s.shadow_affinity; /* its init() and smoke test pin nothing of the live policy's */
    l->next_version = b->shadow_versions;
    return l->s.entry != NULL ? 0 : -1;
}

uint64_t atc_policy_build_version(const struct atc_policy_build *b)
{
    return b->as.target == ATC_POLICY_SHADOW ? b->loader->next_version + 1 : b->version;
}

struct atc_policy_build *atc_policy_build_create(struct atc_policy_runtime *const *rts, size_t n)
{
    struct atc_policy_build *b = calloc(1, sizeof(*b));
    if (b == NULL || (b->versions = calloc(n, sizeof(*b->versions))) == NULL ||
        (b->loader = policy_runtime_create(&rts[0]->s)) == NULL) {
        atc_policy_build_destroy(b);
        return NULL;
    }
    struct atc_policy_runtime *l = b->loader;
    l->s.group = NULL; /* a version's record starts when it is adopted */
    l->table = rts[0]->table;
    l->affinity = rts[0]->affinity;
    l->prefix = rts[0]->prefix;
    l->next_version = rts[0]->next_version; /* so that init() logs show the number it will have */
    b->shadow_versions = policy_shadow_versions(rts[0]->shadow);
    b->n = n;
    b->version = rts[0]->next_version + 1;
    b->table_changes = rts[0]->table_changes;
    b->table_updates = rts[0]->table_updates;
    return b;
}

int atc_policy_build_run(struct atc_policy_build *b)
{
    if (b->failed) /* refused before it began (atc_policy_build_target) */
        return -1;
    bool quiet = b->loader->s.quiet;
    for (size_t i = 0; b->as.target != ATC_POLICY_SHADOW_CLEAR && i < b->n; i++) {
        char *err = NULL;
        b->loader->s.quiet = quiet || i > 0; /* init()'s log lines once per load, not once per worker */
        struct policy_version *v = policy_version_create(b->loader, &err);
        if (v != NULL && smoke_test(b->loader, v, &err) < 0) {
            policy_version_destroy(v);
            v = NULL;
        }
        if (v == NULL) {
            b->loader->s.quiet = quiet;
            b->failed = true;
            b->err = err;
            return -1;
        }
        b->versions[i] = v;
    }
    b->loader->s.quiet = quiet;
    return 0;
}

const char *atc_policy_build_error(const struct atc_policy_build *b)
{
    if (!b->failed)
        return NULL;
    return b->err != NULL ? b->err : "out of memory";
}

static int update_views(struct policy_version *v);

uint64_t atc_policy_adopt(struct atc_policy_runtime *rt, struct atc_policy_build *b, size_t i)
{
    bool first = i == 0;
    if (b->as.target == ATC_POLICY_SHADOW_CLEAR) {
        policy_shadow_clear(rt, first);
        return 0;
    }
    if (b->failed) {
        if (b->as.target == ATC_POLICY_LIVE)
            reload_failed(rt, atc_policy_build_error(b), first);
        else if (first)
            atc_error("policy %s failed to load: %s", b->as.target == ATC_POLICY_SHADOW ? "shadow" : "canary",
                      atc_policy_build_error(b));
        return 0;
    }
    struct policy_version *v = b->versions[i];
    b->versions[i] = NULL;
    if (b->table_changes != rt->table_changes) { /* a config reload rebuilt the runtime meanwhile */
        policy_version_destroy(v);
        return 0;
    }
    bool stale = b->table_updates != rt->table_updates; /* built on an older endpoint set: its views */
    if (b->as.target == ATC_POLICY_SHADOW) {
        uint64_t version =
            policy_shadow_adopt(rt, v, atc_policy_build_version(b), b->as.entry, b->as.sample, first);
        if (version != 0 && stale && update_views(v) < 0) { /* (v is the shadow's now, on rt->table) */
            policy_shadow_clear(rt, first);
            return 0;
        }
        return version;
    }
    v->rt = rt; /* from here on its own watchdog, clock and random numbers */
    if (stale && update_views(v) < 0) {
        policy_version_destroy(v);
        return 0;
    }
    if (b->as.target == ATC_POLICY_CANARY) {
        v->version = rt->next_version = b->version;
        policy_canary_adopt(rt, v, b->as.share, first);
        return v->version;
    }
    v->version = rt->next_version = b->version;
    policy_swap_in(rt, v);
    return v->version;
}

void atc_policy_build_destroy(struct atc_policy_build *b)
{
    if (b == NULL)
        return;
    for (size_t i = 0; b->versions != NULL && i < b->n; i++)
        policy_version_destroy(b->versions[i]);
    free(b->versions);
    atc_policy_runtime_destroy(b->loader);
    free((char *)b->as.entry);
    free(b->err);
    free(b);
}

static int update_views_protected(lua_State *L)
{
    policy_api_update_views(lua_touserdata(L, 1));
    return 0;
}

/* @p v's views for v->rt->table, which atc_endpoint_table_with made from the one they were built on:
 * no Lua code runs. -1 when Lua ran out of memory (the views are then as they were). */
static int update_views(struct policy_version *v)
{
    if (lua_cpcall(v->L, update_views_protected, v) == 0)
        return 0;
    lua_pop(v->L, 1);
    return -1;
}

uint64_t atc_policy_update_table(struct atc_policy_runtime *rt, struct atc_endpoint_table *table, char **err)
{
    *err = NULL;
    rt->table = table;
    rt->table_updates++;
    /* A canary goes on: both sides see the same new set from here, so its window still compares like with
     * like (with DNS discovery an endpoint set may change more often than any window ends). */
    struct policy_version *cv = policy_canary_running(rt->canary);
    if (cv != NULL && update_views(cv) < 0)
        atc_policy_canary_end(rt, false, "out of memory updating its views for a changed endpoint set");
    policy_shadow_update_table(rt, table); /* its views too: its record, kept by slot, goes on */
    if (rt->last_good != NULL && update_views(rt->last_good) < 0) {
        policy_version_destroy(rt->last_good);
        rt->last_good = NULL;
    }
    if (update_views(rt->current) == 0)
        return rt->current->version;
    return atc_policy_set_table(rt, table, err); /* out of memory in the state: a fresh one */
}

uint64_t atc_policy_set_table(struct atc_policy_runtime *rt, struct atc_endpoint_table *table, char **err)
{
    rt->table = table;
    rt->table_changes++;
    rt->stale = true;
    policy_version_destroy(rt->last_good); /* its views index the old table */
    rt->last_good = NULL;
    if (policy_canary_running(rt->canary) != NULL) /* its views index the old table too */
        atc_policy_canary_end(rt, false, "the config reload replaced the endpoint table");
    policy_shadow_set_table(rt, table);
    uint64_t version = atc_policy_reload(rt, err);
    if (version != 0) {
        rt->stale = false;
        policy_version_destroy(rt->last_good); /* the outgoing version: same problem */
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

struct atc_policy_runtime *policy_runtime_create(const struct atc_policy_settings *s)
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
    rt->watchdog = policy_watchdog_create();
    rt->shadow = policy_shadow_create();
    rt->canary = policy_canary_create();
    if (rt->watchdog == NULL || rt->shadow == NULL || rt->canary == NULL) {
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
    struct atc_policy_runtime *rt = policy_runtime_create(s);
    if (rt == NULL) {
        *err = strdup("cannot start the policy runtime");
        return NULL;
    }
    rt->table = table;
    rt->affinity = affinity;
    rt->prefix = prefix;
    struct policy_version *v = policy_version_create(rt, err);
    if (v == NULL || smoke_test(rt, v, err) < 0) {
        policy_version_destroy(v);
        atc_policy_runtime_destroy(rt);
        return NULL;
    }
    v->version = ++rt->next_version;
    rt->current = v;
    rt->last_reload_at = atc_wall_s();
    if (!rt->s.quiet)
        atc_info("policy v%llu loaded from %s (files hash %016llx)", (unsigned long long)v->version,
                 rt->s.entry, (unsigned long long)v->files_hash);
    return rt;
}

void atc_policy_runtime_destroy(struct atc_policy_runtime *rt)
{
    if (rt == NULL)
        return;
    policy_watch_stop(rt);
    policy_shadow_destroy(rt->shadow);
    policy_canary_destroy(rt->canary);
    policy_version_destroy(rt->current);
    policy_version_destroy(rt->last_good);
    policy_watchdog_destroy(rt->watchdog);
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
