#include "ops/metrics.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <xxhash.h>

#include "cluster/cluster.h"
#include "cluster/limits.h"
#include "fleet/kv_events.h"
#include "base/clock.h"
#include "base/histogram.h"
#include "fleet/admission.h"
#include "fleet/endpoint.h"
#include "fleet/health.h"
#include "fleet/health_report.h"
#include "ops/stage_metrics.h"
#include "policy/policy.h"

static const double latency_bounds[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
static const double decision_bounds[] = {1e-6,   2.5e-6, 5e-6, 1e-5,   2.5e-5, 5e-5, 1e-4,
                                         2.5e-4, 5e-4,   1e-3, 2.5e-3, 5e-3,   1e-2, 2.5e-2};
#define NELEMS(a) (sizeof(a) / sizeof((a)[0]))

/* One label set: requests by (model, endpoint, status, priority) and latencies by (model, endpoint).
 * Series are few (models x endpoints x statuses), so a chained hash of small structs does. */
struct series {
    char model[128], endpoint[128];
    int status, priority; /* -1 for the latency series */
    uint64_t requests;
    uint64_t broken; /* the latency series only: answers that broke after they started */
    struct atc_histogram ttft, total;
    struct series *next;
};

_Static_assert(sizeof(((struct series *)0)->model) == sizeof(((struct series *)0)->endpoint),
               "label_len cuts both labels at one size");

#define NBUCKETS 256

/* One per process, fed by every worker: the mutex covers all of it (series, histograms, counters). A
 * request takes it once, for a hash lookup and a few additions. */
struct atc_metrics {
    pthread_mutex_t mu;
    struct series *buckets[NBUCKETS];
    struct atc_histogram decision;
    uint64_t fallbacks[8];
    uint64_t retries, client_gone, bytes, sse_events;
    struct atc_stage_metrics *stages; /* a disaggregated model's stages, under their own lock */
};

/* atc_policy_fallback_* (interned: compared by pointer), in the order of m->fallbacks */
static const char *const fallback_reasons[] = {atc_policy_fallback_error, atc_policy_fallback_budget,
                                               atc_policy_fallback_memory, atc_policy_fallback_invalid};

struct atc_metrics *atc_metrics_create(void)
{
    struct atc_metrics *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return NULL;
    if (pthread_mutex_init(&m->mu, NULL) != 0) {
        free(m);
        return NULL;
    }
    atc_histogram_init(&m->decision, decision_bounds, NELEMS(decision_bounds));
    if ((m->stages = atc_stage_metrics_create()) == NULL) {
        atc_metrics_destroy(m);
        return NULL;
    }
    return m;
}

void atc_metrics_destroy(struct atc_metrics *m)
{
    if (m == NULL)
        return;
    for (size_t i = 0; i < NBUCKETS; i++) {
        while (m->buckets[i] != NULL) {
            struct series *s = m->buckets[i];
            m->buckets[i] = s->next;
            free(s);
        }
    }
    atc_stage_metrics_free(m->stages);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

/* The bytes of a label as its series stores it (cut to the field's size), so that a long name finds its
 * own series. */
static size_t label_len(const char *s)
{
    return strnlen(s, sizeof(((struct series *)0)->model) - 1);
}

static bool label_is(const char *stored, const char *s, size_t len)
{
    return memcmp(stored, s, len) == 0 && stored[len] == '\0';
}

/* Called twice for every request, under the lock: no formatting, one hash over the labels' bytes. */
static struct series *series_of(struct atc_metrics *m, const char *model, const char *endpoint, int status,
                                int priority)
{
    size_t mlen = label_len(model), elen = label_len(endpoint);
    uint64_t h = XXH3_64bits_withSeed(endpoint, elen, XXH3_64bits(model, mlen));
    h ^= ((uint64_t)(uint32_t)status << 32 | (uint32_t)priority) * 0x9E3779B97F4A7C15ull;
    size_t b = (h ^ h >> 29) % NBUCKETS;
    for (struct series *s = m->buckets[b]; s != NULL; s = s->next)
        if (s->status == status && s->priority == priority && label_is(s->model, model, mlen) &&
            label_is(s->endpoint, endpoint, elen))
            return s;
    struct series *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    memcpy(s->model, model, mlen);
    memcpy(s->endpoint, endpoint, elen);
    s->status = status;
    s->priority = priority;
    atc_histogram_init(&s->ttft, latency_bounds, NELEMS(latency_bounds));
    atc_histogram_init(&s->total, latency_bounds, NELEMS(latency_bounds));
    s->next = m->buckets[b];
    m->buckets[b] = s;
    return s;
}

void atc_metrics_request(struct atc_metrics *m, const struct atc_request_metrics *r)
{
    const char *endpoint = r->endpoint != NULL ? r->endpoint : "";
    pthread_mutex_lock(&m->mu);
    struct series *count = series_of(m, r->model, endpoint, r->status, r->priority);
    if (count != NULL)
        count->requests++;
    struct series *lat = series_of(m, r->model, endpoint, -1, -1);
    if (lat != NULL) {
        if (r->ttft_s >= 0)
            atc_histogram_observe(&lat->ttft, r->ttft_s);
        atc_histogram_observe(&lat->total, r->total_s);
        lat->broken += r->broken;
    }
    m->retries += r->retries;
    m->client_gone += r->status == 499;
    m->bytes += r->bytes;
    m->sse_events += r->sse_events;
    pthread_mutex_unlock(&m->mu);
}

struct atc_stage_metrics *atc_metrics_stages(struct atc_metrics *m)
{
    return m->stages;
}

void atc_metrics_decision(struct atc_metrics *m, double seconds, const char *fallback_reason)
{
    pthread_mutex_lock(&m->mu);
    atc_histogram_observe(&m->decision, seconds);
    for (size_t i = 0; fallback_reason != NULL && i < NELEMS(fallback_reasons); i++)
        if (fallback_reason == fallback_reasons[i])
            m->fallbacks[i]++;
    pthread_mutex_unlock(&m->mu);
}

static void help(struct evbuffer *out, const char *name, const char *type, const char *text)
{
    evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name, text, name, type);
}

static void endpoint_labels(struct evbuffer *out, const struct atc_endpoint *ep)
{
    evbuffer_add(out, "{model=\"", 8);
    atc_histogram_label(out, ep->model);
    evbuffer_add(out, "\",endpoint=\"", 12);
    atc_histogram_label(out, ep->id);
    evbuffer_add(out, "\"}", 2);
}

static void render_endpoints(const struct atc_metrics_sources *src, struct evbuffer *out)
{
    const struct atc_endpoint_table *t = src->table;
    static const struct {
        const char *name, *type, *help;
    } gauges[] = {
        {"atc_endpoint_inflight_requests", "gauge", "Requests in flight to the endpoint."},
        {"atc_endpoint_inflight_tokens", "gauge",
         "Prompt estimate plus max_tokens of the requests in flight."},
        {"atc_endpoint_capacity_requests", "gauge", "Configured capacity (max concurrent requests)."},
        {"atc_endpoint_routable", "gauge", "1 when the endpoint may get new requests."},
        {"atc_endpoint_ttft_ewma_seconds", "gauge",
         "Moving average of the time to the first byte of answers."},
        {"atc_endpoint_attempts_total", "counter", "Upstream attempts sent to the endpoint."},
        {"atc_endpoint_errors_total", "counter",
         "Connection failures, timeouts and 5xx answers from the endpoint."},
        {"atc_endpoint_idle_connections", "gauge", "Idle keep-alive connections to the endpoint."},
        {"atc_endpoint_remote_inflight_requests", "gauge",
         "Requests the other replicas of the cluster have in flight to the endpoint (0 without one)."},
        {"atc_endpoint_fleet_inflight_requests", "gauge",
         "Requests in flight to the endpoint from every replica: this one's plus the others'."},
    };
    for (size_t g = 0; g < NELEMS(gauges); g++) {
        help(out, gauges[g].name, gauges[g].type, gauges[g].help);
        for (size_t i = 0; i < t->nendpoints; i++) {
            const struct atc_endpoint *ep = t->endpoints[i];
            double v = 0;
            switch (g) {
            case 0:
                v = ep->inflight;
                break;
            case 1:
                v = (double)ep->inflight_tokens;
                break;
            case 2:
                v = ep->capacity;
                break;
            case 3:
                v = ep->routable;
                break;
            case 4:
                v = ep->ttft_ewma_ms / 1000.0;
                break;
            case 5:
                v = (double)ep->requests_total;
                break;
            case 6:
                v = (double)ep->errors_total;
                break;
            case 7:
                v = src->idle != NULL ? (double)src->idle[i] : 0;
                break;
            case 8:
                v = atomic_load_explicit(&ep->remote.inflight, memory_order_relaxed);
                break;
            case 9:
                v = atc_endpoint_fleet_inflight(ep);
                break;
            }
            evbuffer_add_printf(out, "%s", gauges[g].name);
            endpoint_labels(out, ep);
            evbuffer_add_printf(out, " %.9g\n", v);
        }
    }
    /* how old the others' figures are: only where some replica's are summed */
    uint64_t now_ms = atc_mono_ms();
    help(out, "atc_endpoint_remote_age_seconds", "gauge",
         "Age of the oldest of the other replicas' figures summed into the remote in-flight count.");
    for (size_t i = 0; i < t->nendpoints; i++) {
        uint64_t at = atomic_load_explicit(&t->endpoints[i]->remote.at_ms, memory_order_relaxed);
        if (at == 0)
            continue;
        evbuffer_add_printf(out, "atc_endpoint_remote_age_seconds");
        endpoint_labels(out, t->endpoints[i]);
        evbuffer_add_printf(out, " %.3f\n", (double)(now_ms > at ? now_ms - at : 0) / 1000.0);
    }
    /* the prefix index's guess against the engine's own usage.prompt_tokens_details.cached_tokens */
    static const char *const guess[][2] = {
        {"atc_prefix_guess_answers_total",
         "Answers that reported cached prompt tokens, to compare the guess with."},
        {"atc_prefix_guess_cached_tokens_total",
         "Prompt tokens atc's prefix index guessed the endpoint held."},
        {"atc_prefix_guess_reported_cached_tokens_total",
         "Prompt tokens the endpoint reported cached (usage)."},
        {"atc_prefix_guess_error_tokens_total", "|guessed - reported| cached prompt tokens, summed."},
    };
    for (size_t g = 0; g < NELEMS(guess); g++) {
        help(out, guess[g][0], "counter", guess[g][1]);
        for (size_t i = 0; i < t->nendpoints; i++) {
            struct atc_signals_guess sg;
            atc_signals_guess(&t->endpoints[i]->sig, &sg);
            const uint64_t v[] = {sg.samples, sg.guessed_tokens, sg.reported_tokens, sg.error_tokens};
            evbuffer_add_printf(out, "%s", guess[g][0]);
            endpoint_labels(out, t->endpoints[i]);
            evbuffer_add_printf(out, " %llu\n", (unsigned long long)v[g]);
        }
    }
}

void atc_metrics_render(struct atc_metrics *m, const struct atc_metrics_sources *src, struct evbuffer *out)
{
    /* Workers wait for the lock while m's series are rendered: a scrape's worth of printf, every few
     * seconds. The other subsystems' numbers are read after it is released. */
    pthread_mutex_lock(&m->mu);
    help(out, "atc_requests_total", "counter",
         "Client requests answered, by model, endpoint (empty if none), status (499: client left) and "
         "priority.");
    for (size_t b = 0; b < NBUCKETS; b++)
        for (const struct series *s = m->buckets[b]; s != NULL; s = s->next) {
            if (s->status < 0)
                continue;
            evbuffer_add(out, "atc_requests_total{model=\"", 26);
            atc_histogram_label(out, s->model);
            evbuffer_add(out, "\",endpoint=\"", 12);
            atc_histogram_label(out, s->endpoint);
            evbuffer_add_printf(out, "\",status=\"%d\",priority=\"%d\"} %llu\n", s->status, s->priority,
                                (unsigned long long)s->requests);
        }
    /* Beside the status: a stream cut after its 200 went out counts there as a 200, and an error-ratio
     * panel must still see it. Every (model, endpoint) that answered shows, 0 included, so that a rate()
     * over it starts from a known value. */
    help(out, "atc_requests_broken_total", "counter",
         "Answers that broke after they started (the client saw the status, then an error event or a cut "
         "connection), by model and endpoint; also counted in atc_requests_total by that status.");
    for (size_t b = 0; b < NBUCKETS; b++)
        for (const struct series *s = m->buckets[b]; s != NULL; s = s->next) {
            if (s->status >= 0 || s->endpoint[0] == '\0')
                continue;
            evbuffer_add(out, "atc_requests_broken_total{model=\"", 33);
            atc_histogram_label(out, s->model);
            evbuffer_add(out, "\",endpoint=\"", 12);
            atc_histogram_label(out, s->endpoint);
            evbuffer_add_printf(out, "\"} %llu\n", (unsigned long long)s->broken);
        }
    static const char *const hist_names[] = {"atc_request_ttft_seconds", "atc_request_duration_seconds"};
    static const char *const hist_help[] = {
        "Time from the request to the first byte of the server's answer.",
        "Time from the request to the end of the answer relayed to the client.",
    };
    for (int k = 0; k < 2; k++) {
        help(out, hist_names[k], "histogram", hist_help[k]);
        for (size_t b = 0; b < NBUCKETS; b++)
            for (const struct series *s = m->buckets[b]; s != NULL; s = s->next) {
                if (s->status >= 0)
                    continue;
                struct evbuffer *labels = evbuffer_new();
                evbuffer_add(labels, "model=\"", 7);
                atc_histogram_label(labels, s->model);
                evbuffer_add(labels, "\",endpoint=\"", 12);
                atc_histogram_label(labels, s->endpoint);
                evbuffer_add(labels, "\",", 3);
                atc_histogram_render(k == 0 ? &s->ttft : &s->total, out, hist_names[k],
                                     (const char *)evbuffer_pullup(labels, -1));
                evbuffer_free(labels);
            }
    }

    help(out, "atc_policy_decision_seconds", "histogram",
         "Time of one routing decision (policy or C balancer).");
    atc_histogram_render(&m->decision, out, "atc_policy_decision_seconds", "");
    help(out, "atc_policy_fallbacks_total", "counter",
         "Decisions the C balancer made because the policy failed, by reason.");
    for (size_t i = 0; i < NELEMS(fallback_reasons); i++)
        evbuffer_add_printf(out, "atc_policy_fallbacks_total{reason=\"%s\"} %llu\n", fallback_reasons[i],
                            (unsigned long long)m->fallbacks[i]);
    const uint64_t retries = m->retries, client_gone = m->client_gone, bytes = m->bytes,
                   sse_events = m->sse_events;
    pthread_mutex_unlock(&m->mu);
    if (src->npolicies > 0)
        atc_policy_metrics(src->policies, src->npolicies, out);

    help(out, "atc_retries_total", "counter", "Upstream attempts after the first, on another endpoint.");
    evbuffer_add_printf(out, "atc_retries_total %llu\n", (unsigned long long)retries);
    help(out, "atc_client_disconnects_total", "counter", "Clients that left before their answer ended.");
    evbuffer_add_printf(out, "atc_client_disconnects_total %llu\n", (unsigned long long)client_gone);
    help(out, "atc_relayed_bytes_total", "counter", "Body bytes of answers relayed to clients.");
    evbuffer_add_printf(out, "atc_relayed_bytes_total %llu\n", (unsigned long long)bytes);
    help(out, "atc_relayed_sse_events_total", "counter", "Server-sent events relayed to clients.");
    evbuffer_add_printf(out, "atc_relayed_sse_events_total %llu\n", (unsigned long long)sse_events);
    atc_stage_metrics_render(m->stages, out);
    help(out, "atc_active_requests", "gauge", "Client requests in progress (waiting, routed or relaying).");
    evbuffer_add_printf(out, "atc_active_requests %u\n", src->active);
    help(out, "atc_worker_requests_total", "counter", "Client requests accepted, by worker thread.");
    for (unsigned i = 0; i < src->nworkers; i++)
        evbuffer_add_printf(out, "atc_worker_requests_total{worker=\"%u\"} %llu\n", i,
                            (unsigned long long)src->worker_requests[i]);
    help(out, "atc_worker_parks_total", "counter",
         "Times every worker thread was stopped between two callbacks so that the main thread could change "
         "their state.");
    evbuffer_add_printf(out, "atc_worker_parks_total %llu\n", (unsigned long long)src->worker_parks);
    help(out, "atc_endpoints_removed_pending", "gauge",
         "Endpoints removed (admin API, discovery, config reload) not freed yet: requests still in flight "
         "on them, or a worker still to take the table without them.");
    evbuffer_add_printf(out, "atc_endpoints_removed_pending %zu\n", src->endpoints_removed);

    if (src->table != NULL)
        render_endpoints(src, out);
    if (src->health != NULL)
        atc_health_metrics(src->health, out);
    if (src->nadmissions > 0)
        atc_admission_metrics(src->admissions, src->nadmissions, out);
    if (src->cluster != NULL)
        atc_cluster_metrics(src->cluster, out);
    atc_kv_events_metrics(src->kv, out); /* (nothing without kv_events:) */
    if (src->limits != NULL)
        atc_limits_metrics(src->limits, out, atc_wall_us() / 1000);
}
