/* Endpoint health (health.h): the check scheduler, passive ejection, panic mode, slow start, drain and
 * the load scrape's probe. Beside it: probe_answer.c judges the probes' answers, load_scrape.c reads a
 * metrics page, health_text.c is the seqlock of last_error, health_report.c shows it all.
 *
 * Each endpoint has four probes (live, ready, deep, scrape), each a small state machine on two libevent
 * timers: `timer` starts the next probe, `deadline` ends one that takes longer than its timeout. A probe
 * is one HTTP request on the endpoint's own check pool (upstream.c), so checks never queue behind, or
 * take connections from, real traffic. The next probe is timed from the end of the previous one, so a
 * slow server is never probed twice at once.
 *
 * From the verdicts of the checks, the drain flag and the ejection, set_state derives the endpoint's
 * state; update_model then derives, for the whole model, panic mode and each endpoint's `routable`.
 * Those two functions are the only writers of routing-visible state, and the only places that log
 * state changes. */

#include "fleet/health.h"
#include "fleet/health_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "fleet/balancer.h"
#include "config/config.h"
#include "config/engine_profile.h"
#include "fleet/endpoint.h"
#include "fleet/load_scrape.h"
#include "fleet/probe_answer.h"
#include "fleet/recent.h"
#include "base/json.h"
#include "base/log.h"
#include "http/upstream.h"
#include "base/clock.h"

/* Bodies kept per probe; a larger answer fails the probe (a models list or a metrics page that big is
 * not what we asked for). Live and deep bodies are only looked at briefly. */
#define READY_BODY_MAX (1u << 20)
#define SCRAPE_BODY_MAX (8u << 20)
#define OTHER_BODY_MAX (256u << 10)
/* Slow start begins at this share of the capacity and grows linearly to all of it. */
#define SLOW_START_FLOOR 0.1
/* How often the slow-start limits are recomputed while some endpoint ramps up. */
#define RAMP_TICK_MS 100
#define CHECK_HEADERS "User-Agent: atc-health-check\r\n"

static const char *const probe_names[NPROBES] = {"live", "ready", "deep", "scrape"};

static void set_state(struct hep *e, const char *reason);
static void schedule(struct probe *pr, uint64_t delay_ms);

/* ---- what the workers read ---- */

static void publish_state(struct hep *e, enum atc_health_state s)
{
    e->state = s;
    atomic_store_explicit(&e->pub.state, (int)s, memory_order_relaxed);
}

/* Sets the endpoint's last error (printf-style) and publishes it. */
static void set_last_error(struct hep *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_last_error(struct hep *e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->last_error, sizeof(e->last_error), fmt, ap);
    va_end(ap);
    atc_health_text_set(&e->pub.last_error, e->last_error);
}

/* Why a 401/403 from @p ep is a configuration error, and what to set. */
static void refusal_text(const struct atc_endpoint *ep, int status, char *why, size_t size)
{
    bool keyed = ep->authorization != NULL;
    snprintf(why, size, "the server refused atc's credentials (%d): %s%s", status,
             keyed ? "check the key in api_key "
                   : "set api_key_env or api_key_file on this endpoint or its model",
             keyed ? ep->api_key_source : "");
}

const char *atc_health_state_name(enum atc_health_state state)
{
    switch (state) {
    case ATC_HEALTH_STARTING:
        return "starting";
    case ATC_HEALTH_HEALTHY:
        return "healthy";
    case ATC_HEALTH_UNHEALTHY:
        return "unhealthy";
    case ATC_HEALTH_EJECTED:
        return "ejected";
    case ATC_HEALTH_DRAINING:
        return "draining";
    }
    return "unknown";
}

static const char *const verdict_names[] = {"unknown", "failed", "ok"}; /* by enum atc_check_verdict + 1 */

/* ---- state ---- */

static bool is_out(enum atc_health_state s)
{
    return s == ATC_HEALTH_UNHEALTHY || s == ATC_HEALTH_EJECTED;
}

static enum atc_health_state derive_state(const struct hep *e)
{
    if (e->drained)
        return ATC_HEALTH_DRAINING;
    if (e->ejected)
        return ATC_HEALTH_EJECTED;
    for (int k = 0; k < NPROBES; k++)
        if (e->probes[k].refused) /* a configuration error, whatever else the checks say */
            return ATC_HEALTH_UNHEALTHY;
    /* Still loading (within its start-up grace, never healthy yet): starting, not out. */
    if (!e->ever_healthy && (e->probes[PROBE_LIVE].loading || e->probes[PROBE_READY].loading))
        return ATC_HEALTH_STARTING;
    if (e->live == ATC_CHECK_FAILED || e->deep == ATC_CHECK_FAILED)
        return ATC_HEALTH_UNHEALTHY;
    /* Not ready: "starting" while the server answers (it is loading), "unhealthy" when it does not,
     * whichever of the live and ready checks notices first. */
    if (e->ready == ATC_CHECK_FAILED && e->ready_unanswered)
        return ATC_HEALTH_UNHEALTHY;
    if (e->ready != ATC_CHECK_OK)
        return ATC_HEALTH_STARTING;
    /* An engine with a start-up grace lists its model before it can serve (llama.cpp answers /v1/models
     * while /health says "Loading model"): healthy once the live check has spoken too. */
    if (e->live == ATC_CHECK_UNKNOWN && e->cfg->startup_grace_ms > 0)
        return ATC_HEALTH_STARTING;
    return ATC_HEALTH_HEALTHY;
}

/* The share of its capacity a slow-starting endpoint is offered now (1 = all: the ramp is over). */
static double ramp_share(const struct hep *e, uint64_t now)
{
    if (e->ramp_start_ms == 0 || e->cfg->slow_start_ms == 0)
        return 1.0;
    double x = (double)(now - e->ramp_start_ms) / (double)e->cfg->slow_start_ms;
    return x >= 1.0 ? 1.0 : SLOW_START_FLOOR + (1.0 - SLOW_START_FLOOR) * x;
}

/* Added at run time to a model another endpoint serves (not at start-up, nor a model's only server). */
static bool joins_serving_model(const struct hep *e)
{
    for (size_t i = 0; e->joined_live && i < e->model->neps; i++)
        if (e->model->eps[i] != e && e->model->eps[i]->state == ATC_HEALTH_HEALTHY)
            return true;
    return false;
}

static void more_capacity(struct atc_health *h)
{
    if (h->on_capacity != NULL && !evtimer_pending(h->capacity_ev, NULL)) {
        struct timeval zero = {0, 0};
        evtimer_add(h->capacity_ev, &zero);
    }
}

static void on_capacity_ev(evutil_socket_t fd, short what, void *arg)
{
    struct atc_health *h = arg;
    if (h->on_capacity != NULL)
        h->on_capacity(h->on_capacity_arg);
}

void atc_health_on_capacity(struct atc_health *h, void (*cb)(void *arg), void *arg)
{
    h->on_capacity = cb;
    h->on_capacity_arg = arg;
}

/* Recomputes the slow-start limits; returns whether some endpoint still ramps. */
static bool apply_ramps(struct atc_health *h)
{
    uint64_t now = atc_mono_ms();
    bool more = false;
    for (size_t i = 0; i < h->neps; i++) {
        struct hep *e = h->eps[i];
        if (e->ramp_start_ms == 0)
            continue;
        double share = e->state == ATC_HEALTH_HEALTHY ? ramp_share(e, now) : 1.0;
        if (share >= 1.0) {
            if (e->state == ATC_HEALTH_HEALTHY) {
                atc_info("endpoint %s: slow start over: full capacity (%u)", e->ep->id, e->ep->capacity);
                more_capacity(h);
            }
            e->ramp_start_ms = 0;
            atomic_store_explicit(&e->ep->slow_start_limit, 0, memory_order_relaxed);
            e->slow_start = 1.0;
            continue;
        }
        unsigned limit = (unsigned)(share * e->ep->capacity);
        if (limit < 1)
            limit = 1;
        unsigned was = atomic_load_explicit(&e->ep->slow_start_limit, memory_order_relaxed);
        if (limit > was && was != 0)
            more_capacity(h);
        atomic_store_explicit(&e->ep->slow_start_limit, limit, memory_order_relaxed);
        e->slow_start = share;
        more = true;
    }
    return more;
}

static void on_ramp_tick(evutil_socket_t fd, short what, void *arg)
{
    struct atc_health *h = arg;
    if (apply_ramps(h)) {
        struct timeval tv = atc_timeval_ms(RAMP_TICK_MS);
        evtimer_add(h->ramp_timer, &tv);
    }
}

/* Panic mode and `routable` for every endpoint of @p m, from their states. */
static void update_model(struct hmodel *m)
{
    struct atc_health *h = m->h;
    size_t healthy = 0, out = 0, drained = 0;
    for (size_t i = 0; i < m->neps; i++) {
        healthy += m->eps[i]->state == ATC_HEALTH_HEALTHY;
        out += is_out(m->eps[i]->state);
        drained += m->eps[i]->state == ATC_HEALTH_DRAINING;
    }
    /* Panic when every endpoint the operator has not drained is out: none healthy, none starting. */
    bool panic = out > 0 && out + drained == m->neps;
    if (panic != m->panic) {
        m->panic = panic;
        if (panic) {
            m->panics_total++;
            h->stats.panics_total++;
            h->stats.models_in_panic++;
            if (m->cfg->panic == ATC_PANIC_ROUTE_ALL)
                atc_warn("model %s: no endpoint is healthy: panic mode, routing to all %zu that are out "
                         "(health.panic: route_all)",
                         m->name, out);
            else
                atc_warn(
                    "model %s: no endpoint is healthy: panic mode, failing its requests (health.panic: fail)",
                    m->name);
        } else {
            h->stats.models_in_panic--;
            atc_info("model %s: panic mode over: %zu endpoint(s) healthy", m->name, healthy);
        }
    }
    for (size_t i = 0; i < m->neps; i++) {
        struct hep *e = m->eps[i];
        bool was = atomic_load_explicit(&e->ep->routable, memory_order_relaxed);
        bool now = e->state == ATC_HEALTH_HEALTHY ||
                   (panic && m->cfg->panic == ATC_PANIC_ROUTE_ALL && is_out(e->state));
        atomic_store_explicit(&e->ep->routable, now, memory_order_relaxed);
        if (now && !was)
            more_capacity(h);
    }
}

static void start_deep_now(struct hep *e);

/* Derives the endpoint's state; on a change logs it with @p reason and updates the model. */
static void set_state(struct hep *e, const char *reason)
{
    enum atc_health_state old = e->state, s = derive_state(e);
    struct atc_health *h = e->h;
    if (s == old)
        return;
    uint64_t now = atc_mono_ms();
    publish_state(e, s);
    atc_recent_note_change(e->ep->recent, now, (int)old, (int)s); /* the status page's history */
    e->state_changes++;
    h->stats.state_changes_total++;
    if (s == ATC_HEALTH_HEALTHY)
        atc_info("endpoint %s: %s -> healthy: %s", e->ep->id, atc_health_state_name(old), reason);
    else
        atc_warn("endpoint %s: %s -> %s: %s", e->ep->id, atc_health_state_name(old), atc_health_state_name(s),
                 reason);
    if (s == ATC_HEALTH_HEALTHY) {
        /* Back after a failure (not the end of a drain), or new beside serving peers: ramp up. */
        if ((e->ever_healthy ? old != ATC_HEALTH_DRAINING : joins_serving_model(e)) &&
            e->cfg->slow_start_ms) {
            e->ramp_start_ms = now > 0 ? now : 1;
            apply_ramps(h);
            if (!evtimer_pending(h->ramp_timer, NULL)) {
                struct timeval tv = atc_timeval_ms(RAMP_TICK_MS);
                evtimer_add(h->ramp_timer, &tv);
            }
        }
        e->ever_healthy = true;
        e->returned_ms = now;
        e->cap_logged = false;
        /* A server that answers probes may still be unable to generate: ask it once now. */
        if (e->deep == ATC_CHECK_OK)
            start_deep_now(e);
    } else if (e->ramp_start_ms != 0) {
        e->ramp_start_ms = 0;
        atomic_store_explicit(&e->ep->slow_start_limit, 0, memory_order_relaxed);
        e->slow_start = 1.0;
    }
    update_model(e->model);
}

/* ---- probes ---- */

static void record_error(struct hep *e, const struct probe *pr, const char *why)
{
    set_last_error(e, "%s check: %s %s: %s", probe_names[pr->kind],
                   pr->kind == PROBE_DEEP ? e->deep_method : "GET", pr->cfg->path, why);
}

static uint64_t jittered(struct atc_health *h, uint64_t ms, double jitter)
{
    if (ms == 0 || jitter <= 0)
        return ms;
    double u = (double)(atc_random_next(&h->rng) >> 11) / 9007199254740992.0; /* [0, 1) */
    double d = (double)ms * (1.0 + jitter * (2.0 * u - 1.0));
    return d < 1.0 ? 1 : (uint64_t)d;
}

/* The wait before the next probe: faster while the verdict is changing, the down interval while it
 * is settled failed, else the check's interval. */
static uint64_t next_interval(const struct probe *pr)
{
    const struct atc_health_config *c = pr->e->cfg;
    uint64_t every = pr->cfg->interval_ms;
    if (pr->kind == PROBE_SCRAPE)
        return every;
    if (pr->verdict == ATC_CHECK_UNKNOWN || (pr->verdict == ATC_CHECK_OK && pr->fails > 0) ||
        (pr->verdict == ATC_CHECK_FAILED && pr->oks > 0) ||
        (pr->kind == PROBE_LIVE && pr->e->ejected && pr->e->down_seen)) /* may lift the ejection */
        return c->fast_interval_ms < every ? c->fast_interval_ms : every;
    if (pr->verdict == ATC_CHECK_FAILED)
        return c->down_interval_ms < every ? c->down_interval_ms : every;
    return every;
}

static void schedule(struct probe *pr, uint64_t delay_ms)
{
    struct timeval tv = atc_timeval_ms(jittered(pr->e->h, delay_ms, pr->e->cfg->jitter));
    evtimer_add(pr->timer, &tv);
}

/* Runs @p pr from the loop as soon as possible, unless it is running. */
static void kick(struct probe *pr)
{
    if (!pr->enabled || pr->req != NULL)
        return;
    struct timeval zero = {0, 0};
    evtimer_add(pr->timer, &zero);
}

static void start_deep_now(struct hep *e)
{
    struct probe *pr = &e->probes[PROBE_DEEP];
    uint64_t now = atc_mono_ms();
    /* At most once per fast interval when triggered: a flapping server is not flooded with inference. */
    if (!pr->enabled || pr->req != NULL ||
        (e->deep_started_ms != 0 && now - e->deep_started_ms < e->cfg->fast_interval_ms))
        return;
    kick(pr);
}

/* Some sign that the server is gone (a failed request, a refused scrape or ready probe): probe its
 * liveness now rather than at its next tick, at most once per fast interval. */
static void suspect(struct hep *e)
{
    uint64_t now = atc_mono_ms();
    if (e->live != ATC_CHECK_OK || now - e->last_kick_ms < e->cfg->fast_interval_ms)
        return;
    e->last_kick_ms = now;
    kick(&e->probes[PROBE_LIVE]);
}

static void first_round_step(struct atc_health *h)
{
    if (h->first_pending > 0 && --h->first_pending == 0 && h->first_cb != NULL && !h->first_done) {
        struct timeval zero = {0, 0};
        evtimer_add(h->first_ev, &zero);
    }
}

/* Applies one raw result to a check's verdict; @p why is the failure (NULL on success). */
static void check_result(struct probe *pr, bool ok, const char *why)
{
    struct hep *e = pr->e;
    struct atc_health *h = e->h;
    const struct atc_health_config *c = e->cfg;
    enum atc_check_verdict old = pr->verdict;
    char reason[320];

    /* A server that refuses connections (or, for an engine that says so, answers 503) while it may still
     * be loading its model, before it was ever healthy: starting (engine_profile.h, startup_grace). A
     * pass does not end it until the check's verdict is OK (recovery_threshold passes): a server that
     * has just come up is starting, not unhealthy, between its first pass and its second. */
    if (!ok)
        pr->loading = !e->ever_healthy && atc_mono_ms() - e->started_ms < c->startup_grace_ms &&
                      (pr->status == 0 || (pr->status == 503 && e->engine->loading_503));
    if (ok) {
        pr->oks++;
        pr->fails = 0;
    } else {
        pr->fails++;
        pr->oks = 0;
        record_error(e, pr, why);
    }
    reason[0] = '\0';
    if (old == ATC_CHECK_UNKNOWN) { /* start-up grace: the first result counts at once */
        pr->verdict = ok ? ATC_CHECK_OK : ATC_CHECK_FAILED;
        snprintf(reason, sizeof(reason), "first %s check %s", probe_names[pr->kind],
                 ok ? "passed" : "failed");
    } else if (old == ATC_CHECK_OK && pr->fails >= c->failure_threshold) {
        pr->verdict = ATC_CHECK_FAILED;
        snprintf(reason, sizeof(reason), "%s check failed %u time%s in a row", probe_names[pr->kind],
                 pr->fails, pr->fails == 1 ? "" : "s");
    } else if (old == ATC_CHECK_FAILED && pr->oks >= c->recovery_threshold) {
        pr->verdict = ATC_CHECK_OK;
        snprintf(reason, sizeof(reason), "%s check passed %u time%s in a row", probe_names[pr->kind], pr->oks,
                 pr->oks == 1 ? "" : "s");
    }
    /* An ejected server that the probes saw unreachable and then answering again (recovery_threshold
     * times in a row) has restarted: its ejection is lifted. One that failed requests while it kept
     * answering its probes (5xx, hangs) serves its time. */
    if (e->ejected && (pr->kind == PROBE_LIVE || pr->kind == PROBE_READY)) {
        if (!ok && (pr->kind == PROBE_LIVE || pr->status == 0))
            e->down_seen = true;
        else if (ok && pr->kind == PROBE_LIVE && e->down_seen && pr->oks >= c->recovery_threshold) {
            event_del(e->eject_timer);
            e->ejected = false;
            e->ejections = 0;
            snprintf(reason, sizeof(reason),
                     "unreachable, then live check passed %u times in a row: ejection lifted", pr->oks);
        }
    }
    if (!ok && reason[0] != '\0') {
        size_t n = strlen(reason);
        snprintf(reason + n, sizeof(reason) - n, " (%s)", e->last_error);
    }

    unsigned worst = 0;
    for (int k = PROBE_LIVE; k <= PROBE_DEEP; k++)
        if (e->probes[k].fails > worst)
            worst = e->probes[k].fails;
    atomic_store_explicit(&e->pub.consecutive_failures, worst, memory_order_relaxed);
    if (ok && pr->verdict == ATC_CHECK_OK)
        pr->loading = false;
    if (pr->kind == PROBE_LIVE)
        e->live = pr->verdict;
    else if (pr->kind == PROBE_READY)
        e->ready = pr->verdict;
    else
        e->deep = pr->verdict;
    if (pr->kind == PROBE_READY)
        e->ready_unanswered = !ok && pr->status == 0;
    if (pr->verdict != old)
        atc_debug("endpoint %s: %s check %s -> %s", e->ep->id, probe_names[pr->kind], verdict_names[old + 1],
                  verdict_names[pr->verdict + 1]);
    set_state(e, reason[0] != '\0' ? reason : e->last_error);
    /* A sign of life from a server that is out: check the other shallow probe now too, so that it
     * comes back at the pace of the faster one. */
    if (ok && pr->verdict == ATC_CHECK_FAILED && (pr->kind == PROBE_LIVE || pr->kind == PROBE_READY)) {
        struct probe *other = &e->probes[pr->kind == PROBE_LIVE ? PROBE_READY : PROBE_LIVE];
        if (other->verdict == ATC_CHECK_FAILED && other->oks == 0)
            kick(other);
    }
    /* A shallow check that starts failing (or flaps) while the endpoint is up: ask for a real answer. */
    if (!ok && pr->kind != PROBE_DEEP && pr->fails == 1 && e->state == ATC_HEALTH_HEALTHY)
        start_deep_now(e);
    if (pr->first_pending) {
        pr->first_pending = false;
        first_round_step(h);
    }
}

static void scrape_failed(struct hep *e, const char *why)
{
    struct atc_server_load *l = &e->load;
    l->scrape_errors_total++;
    e->h->stats.scrape_errors_total++;
    snprintf(l->last_error, sizeof(l->last_error), "GET %s: %s", e->probes[PROBE_SCRAPE].cfg->path, why);
    if (!e->scrape_failing)
        atc_warn("endpoint %s: load scrape failed: %s (the last values are kept)", e->ep->id, l->last_error);
    e->scrape_failing = true;
}

static void scrape_page(struct hep *e, const char *page, size_t len)
{
    char why[128];
    if (atc_load_scrape_page(e->ep->model, e->engine_id, page, len, &e->load, &e->prefix_counters, why,
                             sizeof(why)) < 0) {
        scrape_failed(e, why);
        return;
    }
    struct atc_server_load *l = &e->load;
    /* What routing reads (replay fills the same fields from its simulated servers). */
    atomic_store_explicit(&e->ep->server_queue,
                          isfinite(l->waiting) && l->waiting > 0 ? (unsigned)lround(fmin(l->waiting, 1e9))
                                                                 : 0,
                          memory_order_relaxed);
    atomic_store_explicit(&e->ep->server_kv_usage, isfinite(l->kv_usage) ? l->kv_usage : 0,
                          memory_order_relaxed);
    if (e->ep->kv_tokens_config == 0 && isfinite(l->kv_tokens) && l->kv_tokens >= 1 && l->kv_tokens < 1e12)
        atomic_store_explicit(&e->ep->kv_tokens, (uint64_t)l->kv_tokens, memory_order_relaxed);
    l->scraped_ms = (double)atc_mono_us() / 1000.0;
    atc_signals_scraped(&e->ep->sig, l->running, l->waiting, l->kv_usage, l->prefix_hit_rate, atc_mono_us());
    if (e->scrape_failing)
        atc_info("endpoint %s: load scrape works again", e->ep->id);
    e->scrape_failing = false;
}

/* ---- running a probe ---- */

/* Ends the running probe. @p unreachable: it never reached a server (refused, reset, closed before an
 * answer), which is the live check's business: a deep probe then counts neither way. */
static void probe_end(struct probe *pr, bool ok, const char *why, bool unreachable)
{
    struct hep *e = pr->e;
    struct atc_health *h = e->h;
    event_del(pr->deadline);
    pr->req = NULL;
    atomic_store_explicit(&e->pub.last_check_ms, (double)atc_mono_us() / 1000.0, memory_order_relaxed);
    if (pr->kind == PROBE_DEEP && unreachable) {
        atc_debug("endpoint %s: deep probe did not reach the server: %s", e->ep->id, why);
    } else if (pr->kind == PROBE_SCRAPE) {
        e->load.scrapes_total++;
        h->stats.scrapes_total++;
        if (ok)
            scrape_page(e, (const char *)evbuffer_pullup(pr->body, -1), evbuffer_get_length(pr->body));
        else
            scrape_failed(e, why);
    } else {
        h->stats.probes_total++;
        h->stats.probe_failures_total += !ok;
        check_result(pr, ok, why);
    }
    if (!ok && pr->status == 0 && pr->kind != PROBE_LIVE)
        suspect(e); /* no HTTP answer at all */
    evbuffer_drain(pr->body, evbuffer_get_length(pr->body));
    schedule(pr, next_interval(pr));
}

static void on_probe_headers(void *arg, const struct atc_upstream_response *resp)
{
    struct probe *pr = arg;
    pr->status = resp->status;
}

static void on_probe_body(void *arg, const char *data, size_t len)
{
    struct probe *pr = arg;
    if (evbuffer_get_length(pr->body) + len > pr->body_max || evbuffer_add(pr->body, data, len) < 0) {
        atc_upstream_cancel(pr->req); /* no more callbacks: end the probe here */
        probe_end(pr, false, "the answer is too large", false);
    }
}

static void on_probe_done(void *arg)
{
    struct probe *pr = arg;
    struct hep *e = pr->e;
    char why[200];
    const char *bad = NULL;
    const char *body = (const char *)evbuffer_pullup(pr->body, -1);
    size_t len = evbuffer_get_length(pr->body);
    int st = pr->status;

    pr->refused = st == 401 || st == 403;
    if (pr->refused) {
        refusal_text(e->ep, st, why, sizeof(why));
        probe_end(pr, false, why, false);
        return;
    }
    switch (pr->kind) {
    case PROBE_LIVE:
        /* Any answer but a server error means the process is up. A 503 from a server that is not ready
         * (loading its model) is the ready check's business, not a liveness failure; from one that is
         * ready it is the server saying it is broken. An engine whose 503 means loading (llama.cpp: its
         * /v1/models answers first) fails it, which its start-up grace reads as "starting". */
        if (st >= 500 && !(st == 503 && e->ready != ATC_CHECK_OK && !e->engine->loading_503))
            bad = "";
        break;
    case PROBE_READY:
        if (st < 200 || st > 299)
            bad = "";
        else {
            size_t plen = strlen(pr->cfg->path);
            /* An OpenAI model list must name the model; another ready path just has to answer 2xx. */
            if (plen >= 7 && strcmp(pr->cfg->path + plen - 7, "/models") == 0)
                bad = atc_probe_answer_lists_model(body != NULL ? body : "", len, e->ep->model);
        }
        break;
    case PROBE_DEEP:
        bad = st < 200 || st > 299 ? "" : atc_probe_answer_inference(body != NULL ? body : "", len);
        break;
    case PROBE_SCRAPE:
        if (st != 200)
            bad = "";
        break;
    case NPROBES:
        break;
    }
    if (bad != NULL && bad[0] == '\0') {
        snprintf(why, sizeof(why), "answered %d", st);
        bad = why;
    } else if (bad != NULL && pr->kind == PROBE_READY && strstr(bad, "model list") != NULL) {
        snprintf(why, sizeof(why), "%s ('%s'): not ready", bad, e->ep->model);
        bad = why;
    }
    probe_end(pr, bad == NULL, bad, false);
}

static void on_probe_error(void *arg, enum atc_upstream_error err, bool got_response)
{
    struct probe *pr = arg;
    /* A timeout means the server took the request and did not answer: a real failure of any check. */
    probe_end(pr, false, atc_upstream_strerror(err),
              !got_response && (err == ATC_UPSTREAM_ERR_CONNECT || err == ATC_UPSTREAM_ERR_CONNECT_TIMEOUT ||
                                err == ATC_UPSTREAM_ERR_CLOSED));
}

static const struct atc_upstream_callbacks probe_cb = {
    .on_headers = on_probe_headers,
    .on_body = on_probe_body,
    .on_done = on_probe_done,
    .on_error = on_probe_error,
};

static void on_probe_deadline(evutil_socket_t fd, short what, void *arg)
{
    struct probe *pr = arg;
    char why[64];
    if (pr->req == NULL)
        return;
    atc_upstream_cancel(pr->req);
    snprintf(why, sizeof(why), "no answer within %llums", (unsigned long long)pr->cfg->timeout_ms);
    probe_end(pr, false, why, false);
}

static void on_probe_timer(evutil_socket_t fd, short what, void *arg)
{
    struct probe *pr = arg;
    struct hep *e = pr->e;
    if (pr->req != NULL)
        return;
    /* A deep probe only means something on a server that is up and ready. */
    if (pr->kind == PROBE_DEEP && (e->live == ATC_CHECK_FAILED || e->ready != ATC_CHECK_OK)) {
        schedule(pr, next_interval(pr));
        return;
    }
    const char *method = "GET", *body = NULL;
    size_t len = 0;
    if (pr->kind == PROBE_DEEP) {
        method = e->deep_method;
        body = e->deep_body;
        len = e->deep_len;
        e->deep_started_ms = atc_mono_ms();
    }
    pr->status = 0;
    pr->started_ms = atc_mono_ms();
    pr->req = atc_upstream_send_as(e->pool, method, pr->cfg->path, CHECK_HEADERS, e->ep->authorization, body,
                                   len, &probe_cb, pr);
    if (pr->req == NULL) {
        probe_end(pr, false, "out of memory", false);
        return;
    }
    struct timeval tv = atc_timeval_ms(pr->cfg->timeout_ms);
    evtimer_add(pr->deadline, &tv);
}

/* ---- passive checks ---- */

static void on_eject_over(evutil_socket_t fd, short what, void *arg)
{
    struct hep *e = arg;
    char reason[96];
    e->ejected = false;
    snprintf(reason, sizeof(reason), "ejection over after %.1fs", (double)e->eject_ms / 1000.0);
    set_state(e, reason);
}

void atc_health_key_refused(struct atc_endpoint *ep, int status)
{
    char why[sizeof(((struct hep *)0)->last_error)];
    refusal_text(ep, status, why, sizeof(why));
    struct hep *e = atc_health_hep_of(ep);
    if (e != NULL && (e->removed || strcmp(e->last_error, why) == 0))
        return; /* said already, or it has left */
    atc_warn("endpoint %s: %s", ep->id, why);
    if (e != NULL)
        set_last_error(e, "%s", why);
}

void atc_health_observe(struct atc_endpoint *ep, bool ok)
{
    struct hep *e = atc_health_hep_of(ep);
    if (e == NULL || e->removed) /* (a request that ended after it left: its e->cfg is stale) */
        return;
    if (ok) {
        e->passive_fails = 0;
        e->cap_logged = false;
        return;
    }
    e->passive_fails++;
    const struct atc_health_config *c = e->cfg;
    uint64_t now = atc_mono_ms();
    suspect(e); /* real traffic failing */
    if (c->eject.consecutive_errors == 0 || e->passive_fails < c->eject.consecutive_errors ||
        e->state != ATC_HEALTH_HEALTHY)
        return;
    struct hmodel *m = e->model;
    size_t ejected = 0;
    for (size_t i = 0; i < m->neps; i++)
        ejected += m->eps[i]->ejected;
    size_t allowed = (size_t)floor(m->cfg->eject.max_share * (double)m->neps + 1e-9);
    if (ejected + 1 > allowed) {
        if (!e->cap_logged)
            atc_warn("endpoint %s: %u requests in a row failed, but it stays: %zu of the %zu endpoints of %s "
                     "are ejected already (health.eject.max_share %.2f)",
                     ep->id, e->passive_fails, ejected, m->neps, m->name, m->cfg->eject.max_share);
        e->cap_logged = true;
        return;
    }
    if (e->returned_ms != 0 && now - e->returned_ms >= c->eject.max_time_ms)
        e->ejections = 0; /* well behaved for a long while: start the growth again */
    e->ejections++;
    uint64_t t = c->eject.base_time_ms * e->ejections;
    e->eject_ms =
        t < c->eject.max_time_ms && t / e->ejections == c->eject.base_time_ms ? t : c->eject.max_time_ms;
    e->ejected = true;
    e->down_seen =
        e->probes[PROBE_LIVE].fails > 0 || (e->probes[PROBE_READY].fails > 0 && e->ready_unanswered);
    e->ejections_total++;
    e->h->stats.ejections_total++;
    set_last_error(e, "ejected for %.1fs: %u requests in a row failed (connection failures, timeouts or 5xx)",
                   (double)e->eject_ms / 1000.0, e->passive_fails);
    unsigned fails = e->passive_fails;
    e->passive_fails = 0;
    struct timeval tv = atc_timeval_ms(e->eject_ms);
    evtimer_add(e->eject_timer, &tv);
    char reason[160];
    snprintf(reason, sizeof(reason), "%u requests in a row failed: ejected for %.1fs (ejection %u)", fails,
             (double)e->eject_ms / 1000.0, e->ejections);
    set_state(e, reason);
    /* Whether it can generate at all decides if it is unhealthy beyond this ejection. */
    start_deep_now(e);
}

/* ---- admin ---- */

void atc_health_set_drained(struct atc_health *h, struct atc_endpoint *ep, bool drain)
{
    struct hep *e = atc_health_hep_of(ep);
    if (e == NULL || e->removed || e->drained == drain)
        return;
    e->drained = drain;
    set_state(e, drain ? "drained by the admin API" : "enabled by the admin API");
}

/* ---- start and stop ---- */

static void on_first_round(evutil_socket_t fd, short what, void *arg)
{
    struct atc_health *h = arg;
    if (h->first_done || h->first_cb == NULL)
        return;
    h->first_done = true;
    h->first_cb(h->first_arg);
}

void atc_health_on_first_round(struct atc_health *h, void (*cb)(void *arg), void *arg)
{
    h->first_cb = cb;
    h->first_arg = arg;
    if (h->first_pending == 0) {
        struct timeval zero = {0, 0};
        evtimer_add(h->first_ev, &zero);
    }
}

/* The settings for @p ep: its own, else its model's (simulated endpoints), else the top level's; and
 * its engine (a simulated endpoint's is its model's). */
static const struct atc_health_config *config_for(const struct atc_config *cfg, const struct atc_endpoint *ep,
                                                  const struct atc_health_config **model_cfg,
                                                  unsigned *engine)
{
    *model_cfg = &cfg->health;
    *engine = ep->engine;
    for (size_t i = 0; i < cfg->nmodels; i++) {
        const struct atc_model_config *m = &cfg->models[i];
        if (strcmp(m->name, ep->model) != 0)
            continue;
        *model_cfg = &m->health;
        if (ep->simulated)
            *engine = m->access.engine;
        for (size_t j = 0; j < m->nendpoints; j++)
            if (strcmp(m->endpoints[j].id, ep->id) == 0)
                return &m->endpoints[j].health;
        return &m->health;
    }
    return &cfg->health;
}

/* The request of a deep probe, by the kind of path: chat, embeddings, else a completion. */
static int make_deep_body(struct hep *e)
{
    const char *path = e->cfg->deep.path;
    struct evbuffer *b = evbuffer_new();
    if (b == NULL)
        return -1;
    evbuffer_add_printf(b, "{\"model\":\"");
    atc_json_escape(b, e->ep->model, strlen(e->ep->model));
    if (strstr(path, "chat") != NULL)
        evbuffer_add_printf(b, "\",\"messages\":[{\"role\":\"user\",\"content\":\"ping\"}],\"max_tokens\":1,"
                               "\"stream\":false}");
    else if (strstr(path, "embeddings") != NULL)
        evbuffer_add_printf(b, "\",\"input\":\"ping\"}");
    else
        evbuffer_add_printf(b, "\",\"prompt\":\"ping\",\"max_tokens\":1,\"stream\":false}");
    e->deep_len = evbuffer_get_length(b);
    e->deep_body = malloc(e->deep_len);
    if (e->deep_body != NULL)
        evbuffer_remove(b, e->deep_body, e->deep_len);
    evbuffer_free(b);
    e->deep_method = "POST";
    return e->deep_body != NULL ? 0 : -1;
}

static int hep_init(struct atc_health *h, struct hep *e, struct atc_endpoint *ep,
                    const struct atc_config *cfg, const char **err)
{
    const struct atc_health_config *mc;
    unsigned engine;
    e->h = h;
    e->ep = ep;
    e->cfg = config_for(cfg, ep, &mc, &engine);
    e->engine = atc_engine_profile(engine);
    e->engine_id = engine;
    e->started_ms = atc_mono_ms();
    publish_state(e, ATC_HEALTH_STARTING);
    e->live = e->ready = ATC_CHECK_UNKNOWN;
    e->deep = ATC_CHECK_OK;
    e->slow_start = 1.0;
    e->load.running = e->load.waiting = e->load.kv_usage = e->load.kv_tokens = e->load.prefix_hit_rate = NAN;
    if ((e->eject_timer = evtimer_new(h->base, on_eject_over, e)) == NULL || make_deep_body(e) < 0)
        goto oom;
    const struct atc_check_config *checks[NPROBES] = {&e->cfg->live, &e->cfg->ready, &e->cfg->deep,
                                                      &e->cfg->scrape};
    static const size_t body_max[NPROBES] = {OTHER_BODY_MAX, READY_BODY_MAX, OTHER_BODY_MAX, SCRAPE_BODY_MAX};
    uint64_t longest = 1;
    for (int k = 0; k < NPROBES; k++) {
        struct probe *pr = &e->probes[k];
        pr->e = e;
        pr->kind = (enum probe_kind)k;
        pr->cfg = checks[k];
        pr->enabled = checks[k]->enabled && (k == PROBE_SCRAPE || e->cfg->enabled);
        pr->verdict = k == PROBE_DEEP ? ATC_CHECK_OK : ATC_CHECK_UNKNOWN;
        pr->body_max = body_max[k];
        if (!pr->enabled) {
            pr->verdict = ATC_CHECK_OK;
            continue;
        }
        if ((pr->timer = evtimer_new(h->base, on_probe_timer, pr)) == NULL ||
            (pr->deadline = evtimer_new(h->base, on_probe_deadline, pr)) == NULL ||
            (pr->body = evbuffer_new()) == NULL)
            goto oom;
        if (checks[k]->timeout_ms > longest)
            longest = checks[k]->timeout_ms;
    }
    e->live = e->probes[PROBE_LIVE].verdict;
    e->ready = e->probes[PROBE_READY].verdict;
    /* Its own pool: probes never wait behind real traffic, nor take its warm connections. The
     * deadline timer enforces each probe's timeout; the pool's are only a backstop. */
    struct atc_upstream_settings us = {
        .connect_timeout_ms = longest,
        .first_byte_timeout_ms = longest,
        .idle_timeout_ms = longest,
        .keepalive = NPROBES,
    };
    if ((e->pool = atc_upstream_pool_create(h->base, ep->host, ep->port, &us, err)) == NULL)
        return -1;
    return 0;
oom:
    *err = "out of memory";
    return -1;
}

/* Points @p e's settings (its own and its probes') into @p cfg, and its model's: adding or removing an
 * endpoint at run time moves the entries of the config's endpoint arrays. */
static void bind_config(struct hep *e, const struct atc_config *cfg)
{
    const struct atc_health_config *mc;
    unsigned engine;
    e->cfg = config_for(cfg, e->ep, &mc, &engine);
    const struct atc_check_config *checks[NPROBES] = {&e->cfg->live, &e->cfg->ready, &e->cfg->deep,
                                                      &e->cfg->scrape};
    for (int k = 0; k < NPROBES; k++)
        e->probes[k].cfg = checks[k];
}

static const struct atc_health_config *model_config(const struct atc_config *cfg, const char *name)
{
    for (size_t j = 0; j < cfg->nmodels; j++)
        if (strcmp(cfg->models[j].name, name) == 0)
            return &cfg->models[j].health;
    return &cfg->health;
}

static void rebind(struct atc_health *h, const struct atc_config *cfg)
{
    for (size_t i = 0; i < h->neps; i++)
        bind_config(h->eps[i], cfg);
    for (size_t i = 0; i < h->nmodels; i++)
        h->models[i].cfg = model_config(cfg, h->models[i].name);
}

/* Stops @p e's probes and timers and frees what they hold; its `pub` stays as it was. */
static void hep_stop(struct hep *e)
{
    for (int k = 0; k < NPROBES; k++) {
        struct probe *pr = &e->probes[k];
        if (pr->req != NULL)
            atc_upstream_cancel(pr->req);
        if (pr->timer != NULL)
            event_free(pr->timer);
        if (pr->deadline != NULL)
            event_free(pr->deadline);
        if (pr->body != NULL)
            evbuffer_free(pr->body);
        *pr = (struct probe){.e = e, .kind = pr->kind, .cfg = pr->cfg}; /* stopped: no timer, no request */
    }
    if (e->eject_timer != NULL)
        event_free(e->eject_timer);
    e->eject_timer = NULL;
    atc_upstream_pool_destroy(e->pool);
    e->pool = NULL;
    free(e->deep_body);
    e->deep_body = NULL;
}

/* Frees @p e, once no worker reads its endpoint's health any more (or they are parked). */
static void hep_free(struct hep *e)
{
    if (e == NULL)
        return;
    hep_stop(e);
    if (e->ep != NULL && e->ep->health == &e->pub) {
        e->ep->health = NULL;
        atomic_store_explicit(&e->ep->slow_start_limit, 0, memory_order_relaxed);
    }
    free(e);
}

/* A config reload: an endpoint that stays keeps what its checks found, so it keeps serving. */
static void carry_over(struct hep *e, const struct atc_health *previous)
{
    for (size_t i = 0; previous != NULL && i < previous->neps; i++) {
        const struct hep *o = previous->eps[i];
        if (o->ep != e->ep)
            continue;
        e->live = o->live;
        e->ready = o->ready;
        e->deep = o->deep;
        e->load = o->load;
        atomic_store_explicit(&e->pub.last_check_ms,
                              atomic_load_explicit(&o->pub.last_check_ms, memory_order_relaxed),
                              memory_order_relaxed);
        e->drained = o->drained;
        e->ever_healthy = o->ever_healthy;
        e->ready_unanswered = o->ready_unanswered;
        return;
    }
}

/* @p e's first state: starting, or what @p previous found (may be NULL); healthy at once without active
 * checks. */
static void first_state(struct hep *e, const struct atc_health *previous)
{
    publish_state(e, ATC_HEALTH_STARTING);
    carry_over(e, previous);
    enum atc_health_state s = derive_state(e);
    if (s != ATC_HEALTH_STARTING) {
        publish_state(e, s);
        if (s == ATC_HEALTH_HEALTHY) {
            e->ever_healthy = true;
            e->returned_ms = atc_mono_ms();
        }
    }
}

/* @p e's first probes: live and ready at once (they count towards the first round until it is over). */
static void start_probes(struct hep *e)
{
    struct atc_health *h = e->h;
    for (int k = 0; k < NPROBES; k++) {
        struct probe *pr = &e->probes[k];
        if (!pr->enabled)
            continue;
        if ((k == PROBE_LIVE || k == PROBE_READY) && !h->first_done) {
            pr->first_pending = true;
            h->first_pending++;
        }
        if (k == PROBE_DEEP)
            schedule(pr, pr->cfg->interval_ms); /* and at once when it first turns healthy */
        else
            kick(pr); /* start-up: check at once */
    }
}

struct atc_health *atc_health_create(struct event_base *base, struct atc_endpoint_table *table,
                                     const struct atc_config *cfg, const struct atc_health *previous,
                                     const char **err)
{
    struct atc_health *h = calloc(1, sizeof(*h));
    if (h == NULL) {
        *err = "out of memory";
        return NULL;
    }
    h->base = base;
    h->rng = atc_mono_us() ^ ((uint64_t)getpid() << 32);
    h->nmodels = table->nmodels;
    h->eps = calloc(table->nendpoints ? table->nendpoints : 1, sizeof(*h->eps));
    h->models = calloc(h->nmodels ? h->nmodels : 1, sizeof(*h->models));
    h->ramp_timer = evtimer_new(base, on_ramp_tick, h);
    h->first_ev = evtimer_new(base, on_first_round, h);
    h->capacity_ev = evtimer_new(base, on_capacity_ev, h);
    if (h->eps == NULL || h->models == NULL || h->ramp_timer == NULL || h->first_ev == NULL ||
        h->capacity_ev == NULL) {
        *err = "out of memory";
        goto error;
    }
    for (size_t i = 0; i < table->nendpoints; i++) {
        struct hep *e = calloc(1, sizeof(*e));
        if (e == NULL) {
            *err = "out of memory";
            goto error;
        }
        h->eps[h->neps++] = e;
        if (hep_init(h, e, table->endpoints[i], cfg, err) < 0)
            goto error;
    }
    for (size_t i = 0; i < h->nmodels; i++) {
        struct atc_model *tm = &table->models[i];
        struct hmodel *m = &h->models[i];
        m->h = h;
        m->cfg = model_config(cfg, tm->name);
        if ((m->name = strdup(tm->name)) == NULL ||
            (m->eps = calloc(tm->nendpoints ? tm->nendpoints : 1, sizeof(*m->eps))) == NULL) {
            *err = "out of memory";
            goto error;
        }
        for (size_t j = 0; j < h->neps; j++) /* (in the table's order: the model's own may differ) */
            for (size_t k = 0; k < tm->nendpoints; k++)
                if (tm->endpoints[k] == h->eps[j]->ep) {
                    h->eps[j]->model = m;
                    m->eps[m->neps++] = h->eps[j];
                }
    }
    /* Publish, then derive every state (endpoints without active checks are healthy at once), then
     * start the first probes. */
    for (size_t i = 0; i < h->neps; i++) {
        struct hep *e = h->eps[i];
        e->ep->health = &e->pub; /* (the workers are parked, or not started yet) */
        atomic_store_explicit(&e->ep->routable, false, memory_order_relaxed);
        atomic_store_explicit(&e->ep->slow_start_limit, 0, memory_order_relaxed);
    }
    for (size_t i = 0; i < h->neps; i++)
        if (h->eps[i]->model != NULL)
            first_state(h->eps[i], previous);
    for (size_t i = 0; i < h->nmodels; i++)
        if (h->models[i].neps > 0)
            update_model(&h->models[i]);
    for (size_t i = 0; i < h->neps; i++)
        start_probes(h->eps[i]);
    return h;
error:
    atc_health_destroy(h);
    return NULL;
}

int atc_health_add(struct atc_health *h, struct atc_endpoint *ep, const struct atc_config *cfg,
                   const char **err)
{
    struct hmodel *m = NULL;
    for (size_t i = 0; i < h->nmodels && m == NULL; i++)
        if (strcmp(h->models[i].name, ep->model) == 0)
            m = &h->models[i];
    if (m == NULL) {
        *err = "no model with this name";
        return -1;
    }
    struct hep **eps = realloc(h->eps, (h->neps + 1) * sizeof(*eps));
    if (eps != NULL)
        h->eps = eps;
    struct hep **meps = eps != NULL ? realloc(m->eps, (m->neps + 1) * sizeof(*meps)) : NULL;
    if (meps != NULL)
        m->eps = meps;
    struct hep *e = meps != NULL ? calloc(1, sizeof(*e)) : NULL;
    if (e == NULL) {
        *err = "out of memory";
        return -1;
    }
    if (hep_init(h, e, ep, cfg, err) < 0) {
        hep_free(e);
        return -1;
    }
    e->model = m;
    h->eps[h->neps++] = e;
    m->eps[m->neps++] = e;
    rebind(h, cfg);
    /* Before any worker can see the endpoint: the caller publishes it afterwards. */
    ep->health = &e->pub;
    atomic_store_explicit(&ep->routable, false, memory_order_relaxed);
    atomic_store_explicit(&ep->slow_start_limit, 0, memory_order_relaxed);
    e->joined_live = true;
    first_state(e, NULL);
    update_model(m);
    start_probes(e);
    return 0;
}

void atc_health_remove(struct atc_health *h, struct atc_endpoint *ep, const struct atc_config *cfg)
{
    struct hep *e = NULL;
    atomic_store_explicit(&ep->routable, false, memory_order_relaxed);
    for (size_t i = 0; h != NULL && i < h->neps && e == NULL; i++)
        if (h->eps[i]->ep == ep) {
            e = h->eps[i];
            memmove(&h->eps[i], &h->eps[i + 1], (--h->neps - i) * sizeof(*h->eps));
        }
    if (e != NULL) {
        e->removed = true; /* its cfg points into a config array that moves */
        struct hmodel *m = e->model;
        for (size_t i = 0; m != NULL && i < m->neps; i++)
            if (m->eps[i] == e) {
                memmove(&m->eps[i], &m->eps[i + 1], (m->neps - i - 1) * sizeof(*m->eps));
                m->neps--;
                break;
            }
        for (int k = 0; k < NPROBES; k++)
            if (e->probes[k].first_pending) {
                e->probes[k].first_pending = false;
                first_round_step(h);
            }
        hep_stop(e);
        /* Workers may still read ep->health until they all take the table without it: it stays, as
         * "draining" (what the endpoint does now), until atc_health_forget. */
        publish_state(e, ATC_HEALTH_DRAINING);
        atomic_store_explicit(&ep->slow_start_limit, 0, memory_order_relaxed);
        struct hep **husks = realloc(h->husks, (h->nhusks + 1) * sizeof(*husks));
        if (husks != NULL) {
            h->husks = husks;
            h->husks[h->nhusks++] = e;
        } /* else it is never freed: a few hundred bytes, rather than a pointer a worker may follow */
        if (m != NULL && m->neps > 0) {
            update_model(m);
        } else if (m != NULL && m->panic) {
            m->panic = false;
            h->stats.models_in_panic--;
        }
    }
    if (h != NULL)
        rebind(h, cfg);
}

void atc_health_forget(struct atc_health *h, struct atc_endpoint *ep)
{
    for (size_t i = 0; h != NULL && i < h->nhusks; i++)
        if (h->husks[i]->ep == ep) {
            hep_free(h->husks[i]);
            h->husks[i] = h->husks[--h->nhusks];
            return;
        }
}

void atc_health_destroy(struct atc_health *h)
{
    if (h == NULL)
        return;
    for (size_t i = 0; i < h->neps; i++)
        hep_free(h->eps[i]);
    for (size_t i = 0; i < h->nhusks; i++) /* (the workers are parked or gone, as for the others) */
        hep_free(h->husks[i]);
    for (size_t i = 0; i < h->nmodels; i++) {
        free(h->models[i].name);
        free(h->models[i].eps);
    }
    if (h->ramp_timer != NULL)
        event_free(h->ramp_timer);
    if (h->first_ev != NULL)
        event_free(h->first_ev);
    if (h->capacity_ev != NULL)
        event_free(h->capacity_ev);
    free(h->eps);
    free(h->husks);
    free(h->models);
    free(h);
}
