/* The policy runtimes' state for the admin API (JSON) and /metrics (Prometheus text). */

#include "policy/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/buffer.h>

#include "base/json.h"
#include "policy/canary.h"
#include "policy/shadow.h"
#include "policy/state.h"

/* A version's record without its Lua state (NULL stays NULL). */
struct policy_version *policy_version_status_copy(const struct policy_version *v, struct atc_policy_runtime *rt,
                                                  bool *failed)
{
    if (v == NULL)
        return NULL;
    struct policy_version *c = malloc(sizeof(*c));
    if (c == NULL) {
        *failed = true;
        return NULL;
    }
    *c = *v;
    c->rt = rt;
    c->L = NULL;
    c->view_slots = NULL;
    c->lists = NULL;
    c->ids = NULL;
    c->req = NULL;
    c->overlaps = NULL;
    return c;
}

static char *string_copy(const char *s, bool *failed)
{
    if (s == NULL)
        return NULL;
    char *c = strdup(s);
    *failed |= c == NULL;
    return c;
}

/* Every plain field as it is; every pointer the renderers follow copied, every other one NULL (a renderer
 * that starts to follow a new pointer finds NULL in the tests, not a worker's live memory). */
struct atc_policy_runtime *policy_runtime_status_copy(const struct atc_policy_runtime *rt)
{
    struct atc_policy_runtime *c = malloc(sizeof(*c));
    if (c == NULL)
        return NULL;
    *c = *rt;
    bool failed = false;
    c->s = (struct atc_policy_settings){.budget_us = rt->s.budget_us,
                                        .memory = rt->s.memory,
                                        .jit = rt->s.jit,
                                        .rollback_after = rt->s.rollback_after};
    c->s.entry = string_copy(rt->s.entry, &failed);
    c->affinity = NULL;
    c->prefix = NULL;
    c->watchdog = NULL;
    c->watch_event = c->watch_debounce = NULL;
    c->on_change = NULL;
    c->on_change_arg = NULL;
    c->now_ms = NULL;
    c->now_ctx = NULL;
    c->nwatch = 0;
    memset(c->watch_dir, 0, sizeof(c->watch_dir));
    c->inotify_fd = -1;
    c->current = policy_version_status_copy(rt->current, c, &failed);
    c->last_good = policy_version_status_copy(rt->last_good, c, &failed);
    c->last_error = string_copy(rt->last_error, &failed);
    c->canary = policy_canary_status_copy(rt->canary, c, &failed);
    c->shadow = policy_shadow_status_copy(rt->shadow, &failed);
    if (failed) {
        atc_policy_status_copy_free(c);
        return NULL;
    }
    return c;
}

struct atc_policy_runtime *atc_policy_status_copy(struct atc_policy_runtime *rt)
{
    atc_policy_sync(rt);
    return policy_runtime_status_copy(rt);
}

void atc_policy_status_copy_free(struct atc_policy_runtime *copy)
{
    policy_runtime_status_copy_free(copy);
}

void policy_runtime_status_copy_free(struct atc_policy_runtime *copy)
{
    if (copy == NULL)
        return;
    free((char *)copy->s.entry);
    free(copy->current);
    free(copy->last_good);
    free(copy->last_error);
    policy_canary_status_copy_free(copy->canary);
    policy_shadow_status_copy_free(copy->shadow);
    free(copy);
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
        const struct policy_version *vs[] = {rts[i]->current, rts[i]->last_good,
                                             policy_canary_running(rts[i]->canary)};
        for (size_t k = 0; k < 3; k++) {
            const struct policy_version *o = vs[k];
            if (o == NULL || o->version != v->version)
                continue;
            t.c.decisions += o->c.decisions;
            t.c.errors += o->c.errors;
            t.c.overruns += o->c.overruns;
            t.c.oom += o->c.oom;
            t.c.invalid += o->c.invalid;
            t.c.gc_steps += o->c.gc_steps;
            t.c.gc_cycles += o->c.gc_cycles;
            t.mem_used += o->mem_used;
            if (o->consecutive_failures > t.consecutive_failures)
                t.consecutive_failures = o->consecutive_failures;
        }
    }
    return t;
}

/* "2026-01-31T12:00:00.250Z" for unix seconds @p t (UTC, as the log's timestamps); "" for 0 (never). */
static void iso_time(double t, char *out, size_t size)
{
    if (t <= 0) {
        out[0] = '\0';
        return;
    }
    time_t s = (time_t)t;
    struct tm tm;
    gmtime_r(&s, &tm);
    size_t n = strftime(out, size, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out + n, size - n, ".%03dZ", (int)((t - (double)s) * 1000) % 1000);
}

static void counters_json(struct evbuffer *out, struct atc_policy_runtime *const *rts, size_t n,
                          const struct policy_version *v)
{
    struct version_totals t = version_totals(rts, n, v);
    char at[40];
    iso_time(v->loaded_at, at, sizeof(at));
    evbuffer_add_printf(out, "{\"files_hash\":\"%016llx\",\"loaded\":\"%s\",",
                        (unsigned long long)v->files_hash, at);
    evbuffer_add_printf(
        out,
        "\"version\":%llu,\"loaded_at\":%.3f,\"decisions\":%llu,\"errors\":%llu,"
        "\"budget_overruns\":%llu,\"memory_errors\":%llu,\"invalid_returns\":%llu,"
        "\"consecutive_failures\":%u,\"memory_bytes\":%zu,\"gc_steps\":%llu,\"gc_cycles\":%llu}",
        (unsigned long long)v->version, v->loaded_at, (unsigned long long)t.c.decisions,
        (unsigned long long)t.c.errors, (unsigned long long)t.c.overruns, (unsigned long long)t.c.oom,
        (unsigned long long)t.c.invalid, t.consecutive_failures, t.mem_used, (unsigned long long)t.c.gc_steps,
        (unsigned long long)t.c.gc_cycles);
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
    char loaded[40], reloaded[40];
    iso_time(rt->current->loaded_at, loaded, sizeof(loaded));
    iso_time(rt->last_reload_at, reloaded, sizeof(reloaded));
    /* The hash names the sources that serve (the same files give the same hash on every worker and
     * every host); "loaded"/"last_reload" are the same times as *_at, in UTC ISO 8601. */
    evbuffer_add_printf(out,
                        "\",\"files_hash\":\"%016llx\",\"loaded\":\"%s\",\"last_reload\":\"%s\","
                        "\"loaded_at\":%.3f,\"last_reload_at\":%.3f,",
                        (unsigned long long)rt->current->files_hash, loaded, reloaded, rt->current->loaded_at,
                        rt->last_reload_at);
    atc_json_key_string(out, "last_error", last_error);
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
    policy_shadow_status_json(rts, n, out);
    policy_canary_status_json(rts, n, out);
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
        } kinds[] = {{"error", t.c.errors},
                     {"overrun", t.c.overruns},
                     {"memory", t.c.oom},
                     {"invalid_return", t.c.invalid}};
        for (size_t k = 0; k < 4; k++)
            evbuffer_add_printf(out, "atc_policy_failures_total{version=\"%llu\",kind=\"%s\"} %llu\n",
                                (unsigned long long)v->version, kinds[k].kind,
                                (unsigned long long)kinds[k].n);
    }
    evbuffer_add_printf(
        out,
        "# HELP atc_policy_memory_bytes Memory of the deciding policy's Lua states (every worker's).\n"
        "# TYPE atc_policy_memory_bytes gauge\natc_policy_memory_bytes %zu\n",
        version_totals(rts, n, rt->current).mem_used);
    policy_shadow_metrics(rts, n, out);
    policy_canary_metrics(rts, n, out);
}
