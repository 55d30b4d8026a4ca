/* The canary (see canary.h). */

#include "policy/canary.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <xxhash.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/json.h"
#include "policy/state.h"
#include "policy/version.h"

/* A TTFT p90 this close to the current version's passes whatever the ratio: at a few ms, scheduling
 * noise alone moves a p90 by more than a ratio guard allows. */
#define TTFT_SLACK_MS 5.0

#define TTFT_BUCKETS 128 /* 8 per doubling of 1 + ms: within 9% */

/* One side of a canary: its requests' TTFT, and its failures since the canary began. */
struct side {
    uint64_t decisions, errors, overruns, fallbacks; /* fallbacks: every failed decision */
    uint64_t ttft_n;
    uint32_t ttft[TTFT_BUCKETS];
};

/* The canary of one runtime: created and destroyed with it, holding at most one running canary, and
 * the record of those that ended. */
struct atc_policy_canary {
    /* A new version deciding a share of the requests, sticky per session; NULL: none. */
    struct policy_version *v;
    double share;
    double since;             /* unix seconds */
    struct side cside, bside; /* the canary's requests and the current version's */
    uint64_t promotions, rollbacks;
    char *last; /* the last canary's outcome, for status (NULL: none yet) */
};

struct atc_policy_canary *policy_canary_create(void)
{
    return calloc(1, sizeof(struct atc_policy_canary));
}

void policy_canary_destroy(struct atc_policy_canary *c)
{
    if (c == NULL)
        return;
    policy_version_destroy(c->v);
    free(c->last);
    free(c);
}

struct atc_policy_canary *policy_canary_status_copy(const struct atc_policy_canary *c,
                                                    struct atc_policy_runtime *copy, bool *failed)
{
    if (c == NULL)
        return NULL;
    struct atc_policy_canary *cc = malloc(sizeof(*cc));
    if (cc == NULL) {
        *failed = true;
        return NULL;
    }
    *cc = *c;
    cc->v = policy_version_status_copy(c->v, copy, failed);
    cc->last = c->last != NULL ? strdup(c->last) : NULL;
    *failed |= c->last != NULL && cc->last == NULL;
    return cc;
}

void policy_canary_status_copy_free(struct atc_policy_canary *copy)
{
    if (copy == NULL)
        return;
    free(copy->v); /* a status copy: no Lua state */
    free(copy->last);
    free(copy);
}

struct policy_version *policy_canary_running(const struct atc_policy_canary *c)
{
    return c->v;
}

struct policy_version *policy_canary_takes(const struct atc_policy_canary *c,
                                           const struct atc_route_request *req)
{
    if (c->v == NULL)
        return NULL;
    const char *key = req->session != NULL && req->session[0] != '\0' ? req->session : req->id;
    if (key == NULL)
        return NULL;
    /* A stable hash, so that a session stays on one side, on every worker and every replica. */
    uint64_t h = XXH3_64bits(key, strlen(key));
    return (double)(h >> 11) * (1.0 / 9007199254740992.0) < c->share ? c->v : NULL;
}

static void side_count(struct side *s, bool ok, const char *why)
{
    s->decisions++;
    if (ok)
        return;
    s->fallbacks++;
    if (why == atc_policy_fallback_budget)
        s->overruns++;
    else if (why == atc_policy_fallback_error || why == atc_policy_fallback_memory)
        s->errors++;
}

void policy_canary_count(struct atc_policy_canary *c, bool canary, bool ok, const char *why)
{
    if (c->v != NULL)
        side_count(canary ? &c->cside : &c->bside, ok, why);
}

/* 8 buckets per doubling of 1 + ms. */
static unsigned ttft_bucket(double ms)
{
    double b = 8 * log2(1 + ms);
    return b < 0 ? 0 : b >= TTFT_BUCKETS - 1 ? TTFT_BUCKETS - 1 : (unsigned)b;
}

static double bucket_ms(unsigned b)
{
    return exp2((b + 1) / 8.0) - 1; /* its upper end */
}

void atc_policy_observe(struct atc_policy_runtime *rt, uint64_t version, bool canary, double ttft_ms)
{
    struct atc_policy_canary *c = rt->canary;
    if (c->v == NULL || ttft_ms < 0)
        return;
    struct side *s = NULL;
    if (canary && version == c->v->version)
        s = &c->cside;
    else if (!canary && version == rt->current->version)
        s = &c->bside;
    if (s == NULL)
        return;
    s->ttft[ttft_bucket(ttft_ms)]++;
    s->ttft_n++;
}

uint64_t atc_policy_canary_version(const struct atc_policy_runtime *rt)
{
    return rt->canary->v != NULL ? rt->canary->v->version : 0;
}

void policy_canary_adopt(struct atc_policy_runtime *rt, struct policy_version *v, double share, bool log)
{
    struct atc_policy_canary *c = rt->canary;
    policy_version_destroy(c->v);
    c->v = v;
    c->share = share;
    c->since = atc_wall_s();
    memset(&c->cside, 0, sizeof(c->cside));
    memset(&c->bside, 0, sizeof(c->bside));
    if (log)
        atc_info("policy v%llu loaded from %s as a canary for %.3g of the requests (files hash %016llx); "
                 "v%llu decides the rest",
                 (unsigned long long)v->version, rt->s.entry, share, (unsigned long long)v->files_hash,
                 (unsigned long long)rt->current->version);
}

struct side_totals {
    struct side s;
    double p90_ms; /* NAN: no TTFT seen */
};

static struct side_totals side_totals(struct atc_policy_runtime *const *rts, size_t n, bool canary)
{
    struct side_totals t = {.p90_ms = NAN};
    for (size_t i = 0; i < n; i++) {
        const struct atc_policy_canary *ci = rts[i]->canary;
        const struct side *s = canary ? &ci->cside : &ci->bside;
        if (ci->v == NULL)
            continue;
        t.s.decisions += s->decisions;
        t.s.errors += s->errors;
        t.s.overruns += s->overruns;
        t.s.fallbacks += s->fallbacks;
        t.s.ttft_n += s->ttft_n;
        for (unsigned b = 0; b < TTFT_BUCKETS; b++)
            t.s.ttft[b] += s->ttft[b];
    }
    uint64_t seen = 0, want = (uint64_t)ceil(0.9 * (double)t.s.ttft_n);
    for (unsigned b = 0; t.s.ttft_n > 0 && b < TTFT_BUCKETS; b++)
        if ((seen += t.s.ttft[b]) >= want) {
            t.p90_ms = bucket_ms(b);
            break;
        }
    return t;
}

static double rate(uint64_t k, uint64_t n)
{
    return n > 0 ? (double)k / (double)n : 0;
}

int atc_policy_canary_judge(struct atc_policy_runtime *const *rts, size_t n, const struct atc_canary_guards *g,
                            char *why, size_t size)
{
    if (rts[0]->canary->v == NULL)
        return -1;
    struct side_totals c = side_totals(rts, n, true), b = side_totals(rts, n, false);
    const struct {
        const char *name;
        double canary, current, guard;
    } rates[] = {
        {"error rate", rate(c.s.errors, c.s.decisions), rate(b.s.errors, b.s.decisions), g->error_rate},
        {"fallback rate", rate(c.s.fallbacks, c.s.decisions), rate(b.s.fallbacks, b.s.decisions), g->fallback_rate},
        {"overrun rate", rate(c.s.overruns, c.s.decisions), rate(b.s.overruns, b.s.decisions), g->overrun_rate},
    };
    if (c.s.decisions < g->min_requests) {
        snprintf(why, size, "it decided %llu requests in its window, fewer than policy.canary.min_requests %u",
                 (unsigned long long)c.s.decisions, g->min_requests);
        return 0;
    }
    for (size_t i = 0; i < 3; i++)
        if (rates[i].canary > rates[i].current + rates[i].guard) {
            snprintf(why, size, "its %s %.4f is above the current version's %.4f + %.4f (%llu decisions)",
                     rates[i].name, rates[i].canary, rates[i].current, rates[i].guard,
                     (unsigned long long)c.s.decisions);
            return 0;
        }
    if (!isnan(c.p90_ms) && !isnan(b.p90_ms) && c.p90_ms > b.p90_ms * g->ttft_p90 &&
        c.p90_ms > b.p90_ms + TTFT_SLACK_MS) {
        snprintf(why, size, "its requests' TTFT p90 %.1f ms is above %.2f x the current version's %.1f ms",
                 c.p90_ms, g->ttft_p90, b.p90_ms);
        return 0;
    }
    snprintf(why, size,
             "%llu decisions, error %.4f, fallback %.4f, overrun %.4f, TTFT p90 %.1f ms (current: %.4f, %.4f, "
             "%.4f, %.1f ms)",
             (unsigned long long)c.s.decisions, rates[0].canary, rates[1].canary, rates[2].canary, c.p90_ms,
             rates[0].current, rates[1].current, rates[2].current, b.p90_ms);
    return 1;
}

void atc_policy_canary_end(struct atc_policy_runtime *rt, bool promote, const char *why)
{
    struct atc_policy_canary *c = rt->canary;
    struct policy_version *v = c->v;
    if (v == NULL)
        return;
    c->v = NULL;
    char *last = NULL;
    if (asprintf(&last, "v%llu %s: %s", (unsigned long long)v->version, promote ? "promoted" : "rolled back",
                 why) < 0)
        last = NULL;
    free(c->last);
    c->last = last;
    if (promote) {
        c->promotions++;
        /* It served: a later bad one rolls back to it. */
        v->successes += c->cside.decisions - c->cside.fallbacks;
        policy_swap_in(rt, v);
    } else {
        c->rollbacks++;
        policy_version_destroy(v);
    }
}

static void side_json(struct evbuffer *out, const struct side_totals *t)
{
    evbuffer_add_printf(out,
                        "{\"decisions\":%llu,\"errors\":%llu,\"budget_overruns\":%llu,\"fallbacks\":%llu,"
                        "\"ttft_count\":%llu,\"ttft_p90_ms\":",
                        (unsigned long long)t->s.decisions, (unsigned long long)t->s.errors,
                        (unsigned long long)t->s.overruns, (unsigned long long)t->s.fallbacks,
                        (unsigned long long)t->s.ttft_n);
    if (isnan(t->p90_ms))
        evbuffer_add_printf(out, "null}");
    else
        evbuffer_add_printf(out, "%.1f}", t->p90_ms);
}

void policy_canary_status_json(struct atc_policy_runtime *const *rts, size_t n, struct evbuffer *out)
{
    const struct atc_policy_canary *c0 = rts[0]->canary;
    evbuffer_add_printf(out, ",\"canary_promotions\":%llu,\"canary_rollbacks\":%llu,\"last_canary\":",
                        (unsigned long long)c0->promotions, (unsigned long long)c0->rollbacks);
    if (c0->last != NULL) {
        evbuffer_add(out, "\"", 1);
        atc_json_escape(out, c0->last, strlen(c0->last));
        evbuffer_add(out, "\"", 1);
    } else {
        evbuffer_add_printf(out, "null");
    }
    if (c0->v == NULL) {
        evbuffer_add_printf(out, ",\"canary\":null");
        return;
    }
    struct side_totals c = side_totals(rts, n, true), b = side_totals(rts, n, false);
    evbuffer_add_printf(
        out,
        ",\"canary\":{\"version\":%llu,\"files_hash\":\"%016llx\",\"share\":%g,\"since\":%.3f,"
        "\"requests\":",
        (unsigned long long)c0->v->version, (unsigned long long)c0->v->files_hash, c0->share, c0->since);
    side_json(out, &c);
    evbuffer_add_printf(out, ",\"current\":");
    side_json(out, &b);
    evbuffer_add(out, "}", 1);
}

void policy_canary_metrics(struct atc_policy_runtime *const *rts, size_t n, struct evbuffer *out)
{
    const struct atc_policy_runtime *r0 = rts[0];
    const struct atc_policy_canary *c0 = r0->canary;
    evbuffer_add_printf(out,
                        "# HELP atc_policy_canary_version The canary version deciding a share (0: none).\n"
                        "# TYPE atc_policy_canary_version gauge\natc_policy_canary_version %llu\n"
                        "# HELP atc_policy_canaries_total Canaries ended, by outcome.\n"
                        "# TYPE atc_policy_canaries_total counter\n"
                        "atc_policy_canaries_total{outcome=\"promoted\"} %llu\n"
                        "atc_policy_canaries_total{outcome=\"rolled_back\"} %llu\n",
                        (unsigned long long)atc_policy_canary_version(r0), (unsigned long long)c0->promotions,
                        (unsigned long long)c0->rollbacks);
    if (c0->v == NULL)
        return;
    struct side_totals c = side_totals(rts, n, true);
    evbuffer_add_printf(
        out,
        "# HELP atc_policy_canary_decisions_total The canary's decisions, and those that fell back.\n"
        "# TYPE atc_policy_canary_decisions_total counter\n"
        "atc_policy_canary_decisions_total{version=\"%llu\",result=\"ok\"} %llu\n"
        "atc_policy_canary_decisions_total{version=\"%llu\",result=\"fallback\"} %llu\n",
        (unsigned long long)c0->v->version, (unsigned long long)(c.s.decisions - c.s.fallbacks),
        (unsigned long long)c0->v->version, (unsigned long long)c.s.fallbacks);
}
