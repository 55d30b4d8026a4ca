/* The shadow policy (see shadow.h). */

#include "policy/shadow.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "base/log.h"
#include "base/strbuf.h"
#include "fleet/endpoint.h"
#include "base/json.h"
#include "policy/decision.h"
#include "policy/state.h"
#include "policy/version.h"

/* The shadow of one live runtime: created and destroyed with it, holding at most one loaded shadow. */
struct atc_policy_shadow {
    /* A runtime of its own (watchdog, clock, the shadow's affinity table) that decides the same requests
     * after the live decision; its picks are counted, never acted on. NULL: none loaded. */
    struct atc_policy_runtime *rt;
    char *entry;
    double sample;
    uint64_t versions; /* shadow versions loaded so far (each worker's the same) */
    /* Its record beside one live version: reset when the live version changes. */
    uint64_t live_version;
    uint64_t decisions, agreed;
    uint64_t *picks,
        *live_picks; /* per endpoint slot (ep->index) [npicks]: kept when endpoints come and go */
    size_t npicks;
};

struct atc_policy_shadow *policy_shadow_create(void)
{
    return calloc(1, sizeof(struct atc_policy_shadow));
}

static void stats_reset(struct atc_policy_shadow *ss, uint64_t live_version)
{
    ss->live_version = live_version;
    ss->decisions = ss->agreed = 0;
    memset(ss->picks, 0, ss->npicks * sizeof(uint64_t));
    memset(ss->live_picks, 0, ss->npicks * sizeof(uint64_t));
}

static void stats_free(struct atc_policy_shadow *ss)
{
    free(ss->picks);
    free(ss->live_picks);
    ss->picks = ss->live_picks = NULL;
    ss->npicks = 0;
    ss->live_version = ss->decisions = ss->agreed = 0;
}

static int stats_alloc(struct atc_policy_shadow *ss, size_t n)
{
    stats_free(ss);
    ss->picks = calloc(n ? n : 1, sizeof(uint64_t));
    ss->live_picks = calloc(n ? n : 1, sizeof(uint64_t));
    ss->npicks = n;
    return ss->picks != NULL && ss->live_picks != NULL ? 0 : -1;
}

/* Room for @p n slots, the counts so far kept (an endpoint added takes a new slot). -1: out of memory. */
static int stats_grow(struct atc_policy_shadow *ss, size_t n)
{
    if (n <= ss->npicks)
        return 0;
    uint64_t *p = realloc(ss->picks, n * sizeof(uint64_t));
    if (p != NULL)
        ss->picks = p;
    uint64_t *l = p != NULL ? realloc(ss->live_picks, n * sizeof(uint64_t)) : NULL;
    if (l == NULL)
        return -1;
    ss->live_picks = l;
    memset(ss->picks + ss->npicks, 0, (n - ss->npicks) * sizeof(uint64_t));
    memset(ss->live_picks + ss->npicks, 0, (n - ss->npicks) * sizeof(uint64_t));
    ss->npicks = n;
    return 0;
}

/* Unloads the shadow of @p ss, keeping the count of versions loaded. */
static void unload(struct atc_policy_shadow *ss)
{
    atc_policy_runtime_destroy(ss->rt);
    ss->rt = NULL;
    free(ss->entry);
    ss->entry = NULL;
    stats_free(ss);
}

void policy_shadow_destroy(struct atc_policy_shadow *ss)
{
    if (ss == NULL)
        return;
    unload(ss);
    free(ss);
}

static uint64_t *picks_copy(const uint64_t *p, size_t n, bool *failed)
{
    if (p == NULL)
        return NULL;
    uint64_t *c = malloc((n ? n : 1) * sizeof(*c));
    if (c == NULL)
        *failed = true;
    else
        memcpy(c, p, n * sizeof(*c));
    return c;
}

struct atc_policy_shadow *policy_shadow_status_copy(const struct atc_policy_shadow *ss, bool *failed)
{
    if (ss == NULL)
        return NULL;
    struct atc_policy_shadow *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        *failed = true;
        return NULL;
    }
    *c = *ss;
    c->entry = ss->entry != NULL ? strdup(ss->entry) : NULL;
    *failed |= ss->entry != NULL && c->entry == NULL;
    c->picks = picks_copy(ss->picks, ss->npicks, failed);
    c->live_picks = picks_copy(ss->live_picks, ss->npicks, failed);
    c->rt = NULL;
    if (ss->rt != NULL && (c->rt = policy_runtime_status_copy(ss->rt)) == NULL)
        *failed = true;
    return c;
}

void policy_shadow_status_copy_free(struct atc_policy_shadow *copy)
{
    if (copy == NULL)
        return;
    free(copy->entry);
    free(copy->picks);
    free(copy->live_picks);
    policy_runtime_status_copy_free(copy->rt);
    free(copy);
}

uint64_t policy_shadow_versions(const struct atc_policy_shadow *ss)
{
    return ss->versions;
}

void policy_shadow_clear(struct atc_policy_runtime *rt, bool log)
{
    struct atc_policy_shadow *ss = rt->shadow;
    if (ss->rt == NULL)
        return;
    if (log)
        atc_info("policy shadow v%llu (%s) removed", (unsigned long long)ss->rt->current->version, ss->entry);
    unload(ss);
}

uint64_t policy_shadow_adopt(struct atc_policy_runtime *rt, struct policy_version *v, uint64_t version,
                             const char *entry, double sample, bool log)
{
    struct atc_policy_shadow *ss = rt->shadow;
    policy_shadow_clear(rt, false);
    ss->versions = version;
    /* Its own runtime: the live policy's settings but for the entry, no group (its failures roll
     * nothing back), and the shadow's affinity table, so that its pins never steer live requests. */
    struct atc_policy_settings s = rt->s;
    s.entry = entry;
    s.group = NULL;
    s.rollback_after = 0;
    s.quiet = true;
    struct atc_policy_runtime *sh = policy_runtime_create(&s);
    if (sh == NULL || (ss->entry = strdup(entry)) == NULL || stats_alloc(ss, rt->table->nslots) < 0) {
        atc_policy_runtime_destroy(sh);
        policy_version_destroy(v);
        unload(ss);
        atc_error("policy shadow: out of memory");
        return 0;
    }
    sh->table = rt->table;
    sh->affinity = rt->s.shadow_affinity;
    sh->prefix = rt->prefix; /* read only: atc_policy_routed is never called on a shadow */
    v->rt = sh;
    v->version = sh->next_version = version;
    sh->current = v;
    ss->rt = sh;
    ss->sample = sample;
    stats_reset(ss, rt->current->version);
    if (log)
        atc_info("policy shadow v%llu loaded from %s (sample %.3g, files hash %016llx), beside v%llu",
                 (unsigned long long)version, entry, sample, (unsigned long long)v->files_hash,
                 (unsigned long long)rt->current->version);
    return version;
}

void policy_shadow_set_table(struct atc_policy_runtime *rt, struct atc_endpoint_table *table)
{
    struct atc_policy_shadow *ss = rt->shadow;
    if (ss->rt == NULL)
        return;
    char *err = NULL;
    if (atc_policy_set_table(ss->rt, table, &err) == 0 || stats_alloc(ss, table->nslots) < 0) {
        atc_error("policy shadow removed: it does not load against the new endpoint table: %s",
                  err != NULL ? err : "out of memory");
        policy_shadow_clear(rt, false);
    } else {
        stats_reset(ss, rt->current->version);
    }
    free(err);
}

void policy_shadow_update_table(struct atc_policy_runtime *rt, struct atc_endpoint_table *table)
{
    struct atc_policy_shadow *ss = rt->shadow;
    if (ss->rt == NULL)
        return;
    char *err = NULL;
    /* Its views only, as the live version's: no Lua code runs, its module state and record go on. */
    if (atc_policy_update_table(ss->rt, table, &err) == 0 || stats_grow(ss, table->nslots) < 0) {
        atc_error("policy shadow removed: it does not take the new endpoint set: %s",
                  err != NULL ? err : "out of memory");
        policy_shadow_clear(rt, false);
    }
    free(err);
}

/* xorshift64*, of the shadow's own stream: sampling must not move the live policy's random numbers. */
static double draw(struct atc_policy_runtime *sh)
{
    sh->rng ^= sh->rng >> 12;
    sh->rng ^= sh->rng << 25;
    sh->rng ^= sh->rng >> 27;
    return (double)((sh->rng * 0x2545F4914F6CDD1Dull) >> 11) * (1.0 / 9007199254740992.0);
}

static bool same_pick(const struct atc_decision *a, const struct atc_decision *b)
{
    if (a->kind != b->kind)
        return false;
    return a->kind != ATC_DECISION_ENDPOINT || (a->endpoint == b->endpoint && a->prefill == b->prefill);
}

void atc_policy_shadow_route(struct atc_policy_runtime *rt, const struct atc_route_request *req,
                             const struct atc_decision *live, struct atc_decision_record *rec)
{
    struct atc_policy_shadow *ss = rt->shadow;
    struct atc_policy_runtime *sh = ss->rt;
    if (sh == NULL || live->canary || (ss->sample < 1 && draw(sh) >= ss->sample))
        return; /* a canary's decisions are not the live version's: comparing them would mix two records */
    if (ss->live_version != live->version)
        stats_reset(ss, live->version);
    struct atc_route_request q = *req;
    q.explain = NULL; /* the record explains the live decision */
    struct atc_decision d;
    atc_policy_route(sh, &q, &d);
    ss->decisions++;
    if (same_pick(&d, live))
        ss->agreed++;
    if (d.kind == ATC_DECISION_ENDPOINT && d.endpoint != NULL && d.endpoint->index < ss->npicks)
        ss->picks[d.endpoint->index]++;
    if (live->kind == ATC_DECISION_ENDPOINT && live->endpoint != NULL && live->endpoint->index < ss->npicks)
        ss->live_picks[live->endpoint->index]++;
    if (rec != NULL) {
        rec->shadow_version = d.version;
        rec->shadow_kind = atc_decision_kind_name(d.kind);
        atc_strlcpy(rec->shadow_endpoint, sizeof(rec->shadow_endpoint),
                    d.kind == ATC_DECISION_ENDPOINT && d.endpoint != NULL ? d.endpoint->id : "");
    }
}

/* The shadow's record summed over the workers whose shadow and live version are rts[0]'s. */
struct shadow_totals {
    uint64_t decisions, agreed, errors, overruns, invalid;
    uint64_t *picks, *live_picks;
    size_t npicks;
};

static bool totals(struct atc_policy_runtime *const *rts, size_t n, struct shadow_totals *t)
{
    const struct atc_policy_shadow *s0 = rts[0]->shadow;
    if (s0->rt == NULL)
        return false;
    *t = (struct shadow_totals){.npicks = s0->npicks};
    for (size_t i = 0; i < n; i++) /* (a worker may not have taken the latest endpoint set yet) */
        if (rts[i]->shadow->npicks > t->npicks)
            t->npicks = rts[i]->shadow->npicks;
    t->picks = calloc(t->npicks ? t->npicks : 1, sizeof(uint64_t));
    t->live_picks = calloc(t->npicks ? t->npicks : 1, sizeof(uint64_t));
    if (t->picks == NULL || t->live_picks == NULL) {
        free(t->picks);
        free(t->live_picks);
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        const struct atc_policy_shadow *ss = rts[i]->shadow;
        if (ss->rt == NULL || ss->rt->current->version != s0->rt->current->version)
            continue;
        const struct policy_counters *c = &ss->rt->current->c;
        t->errors += c->errors + c->oom;
        t->overruns += c->overruns;
        t->invalid += c->invalid;
        if (ss->live_version != s0->live_version)
            continue;
        t->decisions += ss->decisions;
        t->agreed += ss->agreed;
        for (size_t k = 0; k < ss->npicks; k++) {
            t->picks[k] += ss->picks[k];
            t->live_picks[k] += ss->live_picks[k];
        }
    }
    return true;
}

static void picks_json(struct evbuffer *out, const struct atc_endpoint_table *table, const uint64_t *picks,
                       size_t n)
{
    evbuffer_add(out, "{", 1);
    bool first = true;
    for (size_t k = 0; k < n && k < table->nslots; k++) { /* (an endpoint removed is no longer named) */
        if (picks[k] == 0 || table->slots[k] == NULL)
            continue;
        const char *id = table->slots[k]->id;
        evbuffer_add_printf(out, "%s\"", first ? "" : ",");
        atc_json_escape(out, id, strlen(id));
        evbuffer_add_printf(out, "\":%llu", (unsigned long long)picks[k]);
        first = false;
    }
    evbuffer_add(out, "}", 1);
}

void policy_shadow_status_json(struct atc_policy_runtime *const *rts, size_t n, struct evbuffer *out)
{
    struct shadow_totals t;
    if (!totals(rts, n, &t)) {
        evbuffer_add_printf(out, ",\"shadow\":null");
        return;
    }
    const struct atc_policy_runtime *r0 = rts[0];
    const struct atc_policy_shadow *s0 = r0->shadow;
    evbuffer_add_printf(out, ",\"shadow\":{\"version\":%llu,\"live_version\":%llu,\"entry\":\"",
                        (unsigned long long)s0->rt->current->version, (unsigned long long)s0->live_version);
    atc_json_escape(out, s0->entry, strlen(s0->entry));
    evbuffer_add_printf(
        out,
        "\",\"files_hash\":\"%016llx\",\"sample\":%g,\"decisions\":%llu,\"agreed\":%llu,"
        "\"agreement\":%.6f,\"errors\":%llu,\"budget_overruns\":%llu,\"invalid_returns\":%llu,"
        "\"picks\":",
        (unsigned long long)s0->rt->current->files_hash, s0->sample, (unsigned long long)t.decisions,
        (unsigned long long)t.agreed, t.decisions ? (double)t.agreed / (double)t.decisions : 0.0,
        (unsigned long long)t.errors, (unsigned long long)t.overruns, (unsigned long long)t.invalid);
    picks_json(out, r0->table, t.picks, t.npicks);
    evbuffer_add_printf(out, ",\"live_picks\":");
    picks_json(out, r0->table, t.live_picks, t.npicks);
    evbuffer_add(out, "}", 1);
    free(t.picks);
    free(t.live_picks);
}

void policy_shadow_metrics(struct atc_policy_runtime *const *rts, size_t n, struct evbuffer *out)
{
    struct shadow_totals t;
    if (!totals(rts, n, &t))
        return;
    const struct atc_policy_runtime *r0 = rts[0];
    const struct atc_policy_shadow *s0 = r0->shadow;
    char labels[64];
    snprintf(labels, sizeof(labels), "live=\"%llu\",shadow=\"%llu\"", (unsigned long long)s0->live_version,
             (unsigned long long)s0->rt->current->version);
    evbuffer_add_printf(out,
                        "# HELP atc_policy_shadow_decisions_total Decisions the shadow policy made beside the live one.\n"
                        "# TYPE atc_policy_shadow_decisions_total counter\natc_policy_shadow_decisions_total{%s} %llu\n"
                        "# HELP atc_policy_shadow_agreed_total Shadow decisions that matched the live pick.\n"
                        "# TYPE atc_policy_shadow_agreed_total counter\natc_policy_shadow_agreed_total{%s} %llu\n"
                        "# HELP atc_policy_shadow_failures_total Shadow decisions that failed, by kind.\n"
                        "# TYPE atc_policy_shadow_failures_total counter\n"
                        "atc_policy_shadow_failures_total{%s,kind=\"error\"} %llu\n"
                        "atc_policy_shadow_failures_total{%s,kind=\"overrun\"} %llu\n"
                        "atc_policy_shadow_failures_total{%s,kind=\"invalid_return\"} %llu\n"
                        "# HELP atc_policy_shadow_picks_total Endpoints the shadow picked.\n"
                        "# TYPE atc_policy_shadow_picks_total counter\n",
                        labels, (unsigned long long)t.decisions, labels, (unsigned long long)t.agreed, labels,
                        (unsigned long long)t.errors, labels, (unsigned long long)t.overruns, labels,
                        (unsigned long long)t.invalid);
    for (size_t k = 0; k < t.npicks && k < r0->table->nslots; k++)
        if (r0->table->slots[k] != NULL)
            evbuffer_add_printf(out, "atc_policy_shadow_picks_total{%s,endpoint=\"%s\"} %llu\n", labels,
                                r0->table->slots[k]->id, (unsigned long long)t.picks[k]);
    free(t.picks);
    free(t.live_picks);
}
