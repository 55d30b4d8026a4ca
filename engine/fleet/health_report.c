/* The reports of health (health_report.h): each endpoint's and model's health as JSON for the admin API
 * and as Prometheus metrics, from health's views. */

#include "fleet/health_report.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "base/clock.h"
#include "base/histogram.h"
#include "fleet/health.h"
#include "fleet/health_internal.h"
#include "base/json.h"

static void json_number(struct evbuffer *out, const char *key, double v)
{
    if (isfinite(v))
        evbuffer_add_printf(out, ",\"%s\":%.6g", key, v);
    else
        evbuffer_add_printf(out, ",\"%s\":null", key);
}

static void json_text(struct evbuffer *out, const char *key, const char *s)
{
    if (s == NULL || s[0] == '\0') {
        evbuffer_add_printf(out, ",\"%s\":null", key);
        return;
    }
    evbuffer_add_printf(out, ",\"%s\":\"", key);
    atc_json_escape(out, s, strlen(s));
    evbuffer_add(out, "\"", 1);
}

static void json_verdict(struct evbuffer *out, const char *key, enum atc_check_verdict v)
{
    evbuffer_add_printf(out, ",\"%s\":%s", key,
                        v == ATC_CHECK_OK       ? "true"
                        : v == ATC_CHECK_FAILED ? "false"
                                                : "null");
}

void atc_health_endpoint_json(const struct atc_endpoint *ep, struct evbuffer *out)
{
    struct atc_health_view p;
    if (!atc_health_view_endpoint(ep, &p))
        return;
    double now = (double)atc_mono_us() / 1000.0;
    evbuffer_add_printf(out, ",\"state\":\"%s\"", atc_health_state_name(p.state));
    json_verdict(out, "live", p.live);
    json_verdict(out, "ready", p.ready);
    json_verdict(out, "deep", p.deep);
    evbuffer_add_printf(out, ",\"deep_enabled\":%s", p.deep_enabled ? "true" : "false");
    evbuffer_add_printf(out, ",\"consecutive_failures\":%u", p.consecutive_failures);
    json_text(out, "last_error", p.last_error);
    json_number(out, "last_check_age_ms", p.last_check_ms > 0 ? now - p.last_check_ms : NAN);
    evbuffer_add_printf(out, ",\"state_changes\":%llu,\"ejections\":%llu",
                        (unsigned long long)p.state_changes, (unsigned long long)p.ejections_total);
    json_number(out, "slow_start", p.slow_start);
    evbuffer_add_printf(out, ",\"drained\":%s,\"ejected\":%s", p.drained ? "true" : "false",
                        p.ejected ? "true" : "false");
    evbuffer_add_printf(out, ",\"load\":{");
    evbuffer_add_printf(out, "\"scrapes_total\":%llu,\"scrape_errors_total\":%llu",
                        (unsigned long long)p.load.scrapes_total,
                        (unsigned long long)p.load.scrape_errors_total);
    json_number(out, "running", p.load.running);
    json_number(out, "waiting", p.load.waiting);
    json_number(out, "kv_usage", p.load.kv_usage);
    json_number(out, "prefix_hit_rate", p.load.prefix_hit_rate);
    json_number(out, "age_ms", p.load.scraped_ms > 0 ? now - p.load.scraped_ms : NAN);
    json_text(out, "last_error", p.load.last_error);
    evbuffer_add(out, "}", 1);
}

void atc_health_status_json(const struct atc_health *h, struct evbuffer *out)
{
    evbuffer_add_printf(out, "{\"models\":[");
    for (size_t i = 0; i < atc_health_nmodels(h); i++) {
        struct atc_health_model_view m;
        atc_health_view_model(h, i, &m);
        evbuffer_add_printf(out, "%s{\"name\":\"", i ? "," : "");
        atc_json_escape(out, m.name, strlen(m.name));
        evbuffer_add_printf(out, "\",\"panic\":%s,\"panic_mode\":\"%s\",\"panics_total\":%llu}",
                            m.panic ? "true" : "false", m.panic_fails ? "fail" : "route_all",
                            (unsigned long long)m.panics_total);
    }
    struct atc_health_stats s;
    atc_health_stats(h, &s);
    evbuffer_add_printf(out,
                        "],\"probes_total\":%llu,\"probe_failures_total\":%llu,\"state_changes_total\":%llu,"
                        "\"ejections_total\":%llu,\"panics_total\":%llu,\"models_in_panic\":%zu,"
                        "\"scrapes_total\":%llu,\"scrape_errors_total\":%llu}",
                        (unsigned long long)s.probes_total, (unsigned long long)s.probe_failures_total,
                        (unsigned long long)s.state_changes_total, (unsigned long long)s.ejections_total,
                        (unsigned long long)s.panics_total, s.models_in_panic,
                        (unsigned long long)s.scrapes_total, (unsigned long long)s.scrape_errors_total);
}

static void metric_help(struct evbuffer *out, const char *name, const char *type, const char *text)
{
    evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name, text, name, type);
}

static void metric_endpoint(struct evbuffer *out, const char *name, const struct atc_health_view *e,
                            const char *extra, double v)
{
    evbuffer_add_printf(out, "%s{model=\"", name);
    atc_histogram_label(out, e->model);
    evbuffer_add(out, "\",endpoint=\"", 12);
    atc_histogram_label(out, e->id);
    evbuffer_add_printf(out, "\"%s} ", extra);
    if (isnan(v))
        evbuffer_add(out, "NaN\n", 4);
    else
        evbuffer_add_printf(out, "%.9g\n", v);
}

void atc_health_metrics(const struct atc_health *h, struct evbuffer *out)
{
    static const enum atc_health_state states[] = {ATC_HEALTH_STARTING, ATC_HEALTH_HEALTHY,
                                                   ATC_HEALTH_UNHEALTHY, ATC_HEALTH_EJECTED,
                                                   ATC_HEALTH_DRAINING};
    size_t n = atc_health_nendpoints(h);
    struct atc_health_view *views = calloc(n ? n : 1, sizeof(*views));
    if (views == NULL)
        return;
    for (size_t i = 0; i < n; i++)
        atc_health_view_endpoint(atc_health_endpoint_at(h, i), &views[i]);
    metric_help(
        out, "atc_endpoint_health_state", "gauge",
        "1 for the endpoint's health state (starting, healthy, unhealthy, ejected, draining), else 0.");
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < sizeof(states) / sizeof(states[0]); k++) {
            char extra[40];
            snprintf(extra, sizeof(extra), ",state=\"%s\"", atc_health_state_name(states[k]));
            metric_endpoint(out, "atc_endpoint_health_state", &views[i], extra, views[i].state == states[k]);
        }
    static const struct {
        const char *name, *type, *help;
    } m[] = {
        {"atc_endpoint_check_consecutive_failures", "gauge",
         "The longest current run of failed probes of one check."},
        {"atc_endpoint_state_changes_total", "counter", "Health state changes of the endpoint."},
        {"atc_endpoint_ejections_total", "counter", "Ejections of the endpoint by failures of real traffic."},
        {"atc_endpoint_slow_start_ratio", "gauge",
         "Share of its capacity the endpoint is offered (1 unless ramping up)."},
        {"atc_endpoint_server_running_requests", "gauge",
         "Requests the server reports running (its /metrics)."},
        {"atc_endpoint_server_waiting_requests", "gauge",
         "Requests the server reports queued (its /metrics)."},
        {"atc_endpoint_server_kv_cache_usage_ratio", "gauge",
         "KV cache share in use, as the server reports it."},
        {"atc_endpoint_server_prefix_cache_hit_ratio", "gauge",
         "Prefix cache hits per prompt token queried, between two scrapes."},
        {"atc_endpoint_scrapes_total", "counter", "Scrapes of the server's /metrics."},
        {"atc_endpoint_scrape_errors_total", "counter", "Failed scrapes and malformed metrics pages."},
    };
    for (size_t k = 0; k < sizeof(m) / sizeof(m[0]); k++) {
        metric_help(out, m[k].name, m[k].type, m[k].help);
        for (size_t i = 0; i < n; i++) {
            const struct atc_health_view *p = &views[i];
            double v[] = {p->consecutive_failures,
                          (double)p->state_changes,
                          (double)p->ejections_total,
                          p->slow_start,
                          p->load.running,
                          p->load.waiting,
                          p->load.kv_usage,
                          p->load.prefix_hit_rate,
                          (double)p->load.scrapes_total,
                          (double)p->load.scrape_errors_total};
            metric_endpoint(out, m[k].name, p, "", v[k]);
        }
    }
    free(views);
    struct atc_health_model_view mv;
    metric_help(out, "atc_model_panic", "gauge", "1 while no endpoint of the model is healthy (panic mode).");
    for (size_t i = 0; i < atc_health_nmodels(h); i++) {
        atc_health_view_model(h, i, &mv);
        evbuffer_add(out, "atc_model_panic{model=\"", 23);
        atc_histogram_label(out, mv.name);
        evbuffer_add_printf(out, "\"} %d\n", mv.panic ? 1 : 0);
    }
    metric_help(out, "atc_model_panics_total", "counter", "Times the model entered panic mode.");
    for (size_t i = 0; i < atc_health_nmodels(h); i++) {
        atc_health_view_model(h, i, &mv);
        evbuffer_add(out, "atc_model_panics_total{model=\"", 30);
        atc_histogram_label(out, mv.name);
        evbuffer_add_printf(out, "\"} %llu\n", (unsigned long long)mv.panics_total);
    }
    struct atc_health_stats st;
    atc_health_stats(h, &st);
    metric_help(out, "atc_health_probes_total", "counter", "Active health probes (live, ready, deep) run.");
    evbuffer_add_printf(out, "atc_health_probes_total %llu\n", (unsigned long long)st.probes_total);
    metric_help(out, "atc_health_probe_failures_total", "counter", "Active health probes that failed.");
    evbuffer_add_printf(out, "atc_health_probe_failures_total %llu\n",
                        (unsigned long long)st.probe_failures_total);
}

/* ---- the views (health.h), copied from health.c's state ---- */

bool atc_health_view_endpoint(const struct atc_endpoint *ep, struct atc_health_view *v)
{
    const struct hep *e = atc_health_hep_of(ep);
    if (e == NULL)
        return false;
    *v = (struct atc_health_view){
        .id = ep->id,
        .model = ep->model,
        .state = e->state,
        .live = e->live,
        .ready = e->ready,
        .deep = e->deep,
        .deep_enabled = e->probes[PROBE_DEEP].enabled,
        .consecutive_failures = atomic_load_explicit(&e->pub.consecutive_failures, memory_order_relaxed),
        .last_check_ms = atomic_load_explicit(&e->pub.last_check_ms, memory_order_relaxed),
        .state_changes = e->state_changes,
        .ejections_total = e->ejections_total,
        .slow_start = e->slow_start,
        .drained = e->drained,
        .ejected = e->ejected,
        .load = e->load,
    };
    snprintf(v->last_error, sizeof(v->last_error), "%s", e->last_error);
    return true;
}

size_t atc_health_nendpoints(const struct atc_health *h)
{
    return h->neps;
}

const struct atc_endpoint *atc_health_endpoint_at(const struct atc_health *h, size_t i)
{
    return h->eps[i]->ep;
}

size_t atc_health_nmodels(const struct atc_health *h)
{
    return h->nmodels;
}

void atc_health_view_model(const struct atc_health *h, size_t i, struct atc_health_model_view *v)
{
    const struct hmodel *m = &h->models[i];
    *v = (struct atc_health_model_view){
        .name = m->name,
        .panic = m->panic,
        .panic_fails = m->cfg->panic == ATC_PANIC_FAIL,
        .panics_total = m->panics_total,
    };
}

void atc_health_stats(const struct atc_health *h, struct atc_health_stats *out)
{
    *out = h->stats;
}
