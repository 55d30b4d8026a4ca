/* The defaults of every setting (a config before its file is read) and freeing a config: the two ends
 * of the struct's life, apart from the YAML walk of config.c. */

#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "config/config.h"
#include "config/roles.h"
#include "config/api_key.h"
#include "config/engine_profile.h"
#include "base/config_value.h"

void atc_signal_params_init(struct atc_signal_params *p)
{
    p->prefill_tps = 15000;
    p->itl_us = 12000;
    p->recent_half_life_ms = 2000;
}

static void kv_events_dispose(struct atc_kv_events_config *k)
{
    free(k->endpoint);
    free(k->replay_endpoint);
    free(k->topic);
}

static void health_dispose(struct atc_health_config *h)
{
    free(h->live.path);
    free(h->ready.path);
    free(h->deep.path);
    free(h->scrape.path);
}

int atc_health_config_copy(struct atc_health_config *dst, const struct atc_health_config *src)
{
    *dst = *src;
    dst->live.path = dst->ready.path = dst->deep.path = dst->scrape.path = NULL;
    if ((src->live.path && !(dst->live.path = strdup(src->live.path))) ||
        (src->ready.path && !(dst->ready.path = strdup(src->ready.path))) ||
        (src->deep.path && !(dst->deep.path = strdup(src->deep.path))) ||
        (src->scrape.path && !(dst->scrape.path = strdup(src->scrape.path))))
        return -1;
    return 0;
}

int atc_upstream_access_copy(struct atc_upstream_access *dst, const struct atc_upstream_access *src)
{
    *dst = *src;
    dst->api_key = dst->api_key_source = NULL;
    if ((src->api_key && !(dst->api_key = strdup(src->api_key))) ||
        (src->api_key_source && !(dst->api_key_source = strdup(src->api_key_source))))
        return -1;
    return 0;
}

/* Replaces *at with a copy of @p s. */
static int set_path(char **at, const char *s)
{
    char *c = strdup(s);
    if (c == NULL)
        return -1;
    free(*at);
    *at = c;
    return 0;
}

int atc_health_config_apply_engine(struct atc_health_config *h, const struct atc_health_config *top,
                                   unsigned engine)
{
    const struct atc_engine_profile *e = atc_engine_profile(engine);
    if (!(h->set & ATC_HEALTH_SET_LIVE_PATH) &&
        set_path(&h->live.path, e->live_path ? e->live_path : top->live.path) < 0)
        return -1;
    if (!(h->set & ATC_HEALTH_SET_READY_PATH) &&
        set_path(&h->ready.path, e->ready_path ? e->ready_path : top->ready.path) < 0)
        return -1;
    if (!(h->set & ATC_HEALTH_SET_LIVE_TIMEOUT))
        h->live.timeout_ms = e->live_timeout_ms ? e->live_timeout_ms : top->live.timeout_ms;
    if (!(h->set & ATC_HEALTH_SET_STARTUP_GRACE))
        h->startup_grace_ms = e->startup_grace_ms;
    return 0;
}

int atc_model_config_take_sim_engine(struct atc_model_config *m, const struct atc_health_config *top,
                                     unsigned sim)
{
    unsigned e = ATC_ENGINE_OPENAI;
    for (unsigned i = 0; atc_engine_names[i]; i++) /* a simulated engine's profile has its name */
        if (strcmp(atc_engine_names[i], atc_sim_engine_names[sim]) == 0)
            e = i;
    if (m->access.engine_set || m->access.engine == e)
        return 0;
    if (m->access.engine != ATC_ENGINE_OPENAI)
        return 1;
    m->access.engine = e;
    return atc_health_config_apply_engine(&m->health, top, e);
}

static void access_dispose(struct atc_upstream_access *a)
{
    atc_api_key_free(a->api_key);
    free(a->api_key_source);
}

struct atc_config *atc_config_new(const char *name, const char *dir)
{
    struct atc_config *cfg = calloc(1, sizeof *cfg);

    if (!cfg)
        return NULL;
    cfg->path = strdup(name);
    cfg->dir = strdup(dir && *dir ? dir : ".");
    cfg->listen_host = strdup("127.0.0.1");
    cfg->listen_port = 8080;
    cfg->admin_host = strdup("127.0.0.1");
    cfg->admin_port = 8081;
    cfg->policy.entry = cfg->dir ? atc_config_path(cfg->dir, "scripts/policy.lua") : NULL;
    cfg->policy.budget_us = 1000;
    cfg->policy.memory = (size_t)64 << 20;
    cfg->policy.rollback_after = 20;
    cfg->policy.shadow_sample = 1;
    cfg->policy.canary.error_rate = cfg->policy.canary.fallback_rate = cfg->policy.canary.overrun_rate = 0.01;
    cfg->policy.canary.ttft_p90 = 1.25;
    cfg->policy.canary.min_requests = 20;
    atc_signal_params_init(&cfg->signals);
    cfg->admission.queue = 1024;
    cfg->admission.deadline_ms = 30000;
    cfg->admission.max_deadline_ms = 120000;
    cfg->admission.aging_ms = 10000;
    cfg->policy.watch = true;
    cfg->upstream.connect_timeout_ms = 2000;
    cfg->upstream.first_byte_timeout_ms = 60000;
    cfg->upstream.idle_timeout_ms = 60000;
    cfg->upstream.token_timeout_ms = 100;
    cfg->upstream.tries = 2;
    cfg->upstream.keepalive = 32;
    cfg->record.dir = cfg->dir ? atc_config_path(cfg->dir, "traces") : NULL;
    cfg->record.prefix = strdup("atc");
    cfg->record.rotate_size = (size_t)256 << 20;
    cfg->record.rotate_interval_ms = 3600 * 1000;
    cfg->record.buffer = (size_t)8 << 20;
    cfg->record.sample = 1;
    cfg->cluster.sync_interval_ms = 50;
    cfg->max_body = (size_t)8 << 20;
    cfg->drain_timeout_ms = 10000;
    cfg->client_timeout_ms = 30000;
    /* A client connection may hold an upstream one: half the descriptors, less some for the listeners,
     * logs, health checks and the loops' own. */
    struct rlimit nofile;
    rlim_t fds = getrlimit(RLIMIT_NOFILE, &nofile) == 0 ? nofile.rlim_cur : 1024;
    cfg->max_connections = fds == RLIM_INFINITY || fds > (1u << 25) ? 1u << 24
                           : fds > 64                               ? (unsigned)(fds / 2 - 16)
                                                                    : 16;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    cfg->workers = cores < 1 ? 1 : cores > ATC_MAX_WORKERS ? ATC_MAX_WORKERS : (unsigned)cores;
    cfg->health = (struct atc_health_config){
        .enabled = true,
        .live = {.enabled = true, .path = strdup("/health"), .interval_ms = 2000, .timeout_ms = 1000},
        .ready = {.enabled = true, .path = strdup("/v1/models"), .interval_ms = 2000, .timeout_ms = 1000},
        .deep = {.enabled = true,
                 .path = strdup("/v1/chat/completions"),
                 .interval_ms = 60000,
                 .timeout_ms = 30000},
        .scrape = {.enabled = true, .path = strdup("/metrics"), .interval_ms = 1000, .timeout_ms = 1000},
        .failure_threshold = 3,
        .recovery_threshold = 2,
        .fast_interval_ms = 500,
        .down_interval_ms = 2000,
        .jitter = 0.1,
        .eject = {.consecutive_errors = 5, .base_time_ms = 30000, .max_time_ms = 300000, .max_share = 0.5},
        .panic = ATC_PANIC_ROUTE_ALL,
        .slow_start_ms = 10000,
    };
    if (!cfg->health.live.path || !cfg->health.ready.path || !cfg->health.deep.path ||
        !cfg->health.scrape.path || !cfg->path || !cfg->dir || !cfg->listen_host || !cfg->admin_host ||
        !cfg->policy.entry || !cfg->record.dir || !cfg->record.prefix) {
        atc_config_free(cfg);
        return NULL;
    }
    return cfg;
}

static void free_strv(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

void atc_endpoint_config_dispose(struct atc_endpoint_config *ep)
{
    free(ep->id);
    free(ep->url);
    free(ep->host);
    free(ep->model);
    free(ep->version);
    free_strv(ep->tags, ep->ntags);
    health_dispose(&ep->health);
    access_dispose(&ep->access);
    kv_events_dispose(&ep->kv_events);
}

void atc_config_free(struct atc_config *cfg)
{
    if (!cfg)
        return;
    for (size_t i = 0; i < cfg->nmodels; i++) {
        struct atc_model_config *m = &cfg->models[i];
        for (size_t j = 0; j < m->nendpoints; j++) {
            atc_endpoint_config_dispose(&m->endpoints[j]);
        }
        free(m->endpoints);
        free(m->name);
        health_dispose(&m->health);
        access_dispose(&m->access);
        kv_events_dispose(&m->kv_events);
        free(m->discover.dns);
        free(m->discover.srv);
        free(m->discover.resolver);
    }
    health_dispose(&cfg->health);
    free(cfg->models);
    for (size_t i = 0; i < cfg->nsimulate; i++)
        atc_sim_params_dispose(&cfg->simulate[i].params);
    free(cfg->simulate);
    free_strv(cfg->policy.path, cfg->policy.npath);
    free(cfg->policy.entry);
    free(cfg->policy.shadow_entry);
    free(cfg->record.dir);
    free(cfg->record.prefix);
    free_strv(cfg->record.headers, cfg->record.nheaders);
    free(cfg->access_log);
    free(cfg->admin_token);
    for (size_t i = 0; i < cfg->admission.tenant_weights.n; i++)
        free(cfg->admission.tenant_weights.names[i]);
    free(cfg->admission.tenant_weights.names);
    free(cfg->admission.tenant_weights.weights);
    free(cfg->cluster.redis);
    free(cfg->cluster.host);
    free(cfg->cluster.name);
    free_strv(cfg->limits.tenants, cfg->limits.ntenants);
    free(cfg->limits.rules);
    free(cfg->admin_host);
    free(cfg->listen_host);
    free(cfg->dir);
    free(cfg->path);
    free(cfg);
}

/* ---- lookups across a config's entries ---- */

struct atc_model_config *atc_config_model(const struct atc_config *cfg, const char *name)
{
    for (size_t i = 0; i < cfg->nmodels; i++)
        if (cfg->models[i].name && !strcmp(cfg->models[i].name, name))
            return &cfg->models[i];
    return NULL;
}

bool atc_config_simulated(const struct atc_config *cfg, const char *name)
{
    for (size_t i = 0; i < cfg->nsimulate; i++)
        if (cfg->simulate[i].params.model && !strcmp(cfg->simulate[i].params.model, name))
            return true;
    return false;
}

const char *atc_roles_missing(const struct atc_config *cfg, const struct atc_model_config *m)
{
    if (m->disaggregation == ATC_DISAGG_NONE || m->name == NULL)
        return NULL;
    bool prefill = false, decode = false;
    for (size_t i = 0; i < m->nendpoints; i++) {
        prefill |= m->endpoints[i].role != ATC_ROLE_DECODE;
        decode |= m->endpoints[i].role != ATC_ROLE_PREFILL;
    }
    for (size_t i = 0; i < cfg->nsimulate; i++) {
        const struct atc_simulate_config *s = &cfg->simulate[i];
        if (s->params.model == NULL || strcmp(s->params.model, m->name) != 0)
            continue;
        prefill |= s->params.role != ATC_ROLE_DECODE;
        decode |= s->params.role != ATC_ROLE_PREFILL;
    }
    return !prefill ? "prefill" : !decode ? "decode" : NULL;
}
