#include "config/config_endpoint.h"

#include <stdlib.h>
#include <string.h>

#include "base/config_value.h"

#define ENDPOINT_DEFAULT_CAPACITY 64 /* as an endpoint written in the YAML (config.c parse_endpoint) */

const char *atc_endpoint_origin_name(unsigned origin)
{
    switch (origin) {
    case ATC_ORIGIN_API:
        return "api";
    case ATC_ORIGIN_DNS:
        return "dns";
    default:
        return "config";
    }
}

static int dup_opt(char **dst, const char *src)
{
    *dst = NULL;
    return src != NULL && (*dst = strdup(src)) == NULL ? -1 : 0;
}

static int kv_events_copy(struct atc_kv_events_config *dst, const struct atc_kv_events_config *src)
{
    *dst = *src;
    dst->endpoint = dst->replay_endpoint = dst->topic = NULL;
    return dup_opt(&dst->endpoint, src->endpoint) < 0 ||
                   dup_opt(&dst->replay_endpoint, src->replay_endpoint) < 0 ||
                   dup_opt(&dst->topic, src->topic) < 0
               ? -1
               : 0;
}

int atc_config_endpoint_init(struct atc_endpoint_config *ec, const struct atc_config *cfg,
                             const struct atc_model_config *m, const char *id, const char *url,
                             unsigned origin, const char **err)
{
    *err = NULL;
    ec->capacity = ENDPOINT_DEFAULT_CAPACITY;
    ec->weight = 1;
    ec->origin = origin;
    if (atc_health_config_copy(&ec->health, &m->health) < 0 ||
        atc_upstream_access_copy(&ec->access, &m->access) < 0 ||
        kv_events_copy(&ec->kv_events, &m->kv_events) < 0 ||
        atc_health_config_apply_engine(&ec->health, &cfg->health, ec->access.engine) < 0)
        goto oom;
    if (id == NULL || id[0] == '\0') {
        *err = "the id must be a non-empty string";
        return -1;
    }
    if ((ec->id = strdup(id)) == NULL || (ec->model = strdup(m->name)) == NULL ||
        (ec->url = strdup(url)) == NULL)
        goto oom;
    if (atc_parse_url(url, &ec->host, &ec->port, err) < 0)
        return -1;
    return 0;
oom:
    *err = "out of memory";
    return -1;
}

struct atc_endpoint_config *atc_config_endpoint(const struct atc_config *cfg, const char *id,
                                                struct atc_model_config **model)
{
    for (size_t i = 0; i < cfg->nmodels; i++)
        for (size_t j = 0; j < cfg->models[i].nendpoints; j++)
            if (strcmp(cfg->models[i].endpoints[j].id, id) == 0) {
                if (model != NULL)
                    *model = &cfg->models[i];
                return &cfg->models[i].endpoints[j];
            }
    return NULL;
}

int atc_config_append_endpoint(struct atc_model_config *m, struct atc_endpoint_config *ec)
{
    struct atc_endpoint_config *eps = realloc(m->endpoints, (m->nendpoints + 1) * sizeof(*eps));
    if (eps == NULL)
        return -1;
    m->endpoints = eps;
    eps[m->nendpoints++] = *ec;
    *ec = (struct atc_endpoint_config){0};
    return 0;
}

bool atc_config_remove_endpoint(struct atc_config *cfg, const char *id)
{
    struct atc_model_config *m = NULL;
    struct atc_endpoint_config *ec = atc_config_endpoint(cfg, id, &m);
    if (ec == NULL)
        return false;
    atc_endpoint_config_dispose(ec);
    size_t at = (size_t)(ec - m->endpoints);
    memmove(ec, ec + 1, (m->nendpoints - at - 1) * sizeof(*ec));
    m->nendpoints--;
    return true;
}

/* A deep copy of @p src into @p dst (zeroed by the caller); on failure @p dst owns what was copied. */
static int endpoint_copy(struct atc_endpoint_config *dst, const struct atc_endpoint_config *src)
{
    *dst = *src;
    dst->id = dst->url = dst->host = dst->model = dst->version = NULL;
    dst->tags = NULL;
    dst->ntags = 0;
    dst->health = (struct atc_health_config){0};
    dst->access = (struct atc_upstream_access){0};
    dst->kv_events = (struct atc_kv_events_config){0};
    if (dup_opt(&dst->id, src->id) < 0 || dup_opt(&dst->url, src->url) < 0 ||
        dup_opt(&dst->host, src->host) < 0 || dup_opt(&dst->model, src->model) < 0 ||
        dup_opt(&dst->version, src->version) < 0 || atc_health_config_copy(&dst->health, &src->health) < 0 ||
        atc_upstream_access_copy(&dst->access, &src->access) < 0 ||
        kv_events_copy(&dst->kv_events, &src->kv_events) < 0)
        return -1;
    if (src->ntags > 0) {
        if ((dst->tags = calloc(src->ntags, sizeof(char *))) == NULL)
            return -1;
        for (; dst->ntags < src->ntags; dst->ntags++)
            if ((dst->tags[dst->ntags] = strdup(src->tags[dst->ntags])) == NULL)
                return -1;
    }
    return 0;
}

int atc_config_keep_joined(struct atc_config *ncfg, const struct atc_config *old)
{
    for (size_t i = 0; i < old->nmodels; i++) {
        const struct atc_model_config *om = &old->models[i];
        struct atc_model_config *m = atc_config_model(ncfg, om->name);
        for (size_t j = 0; m != NULL && j < om->nendpoints; j++) {
            const struct atc_endpoint_config *ec = &om->endpoints[j];
            if (ec->origin == ATC_ORIGIN_CONFIG || atc_config_endpoint(ncfg, ec->id, NULL) != NULL)
                continue;
            struct atc_endpoint_config copy = {0};
            if (endpoint_copy(&copy, ec) < 0 || atc_config_append_endpoint(m, &copy) < 0) {
                atc_endpoint_config_dispose(&copy);
                return -1;
            }
        }
    }
    return 0;
}
