#include "fleet/endpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "config/config.h"

/* Weight of a new TTFT sample: about the last ten requests dominate. */
#define TTFT_EWMA_ALPHA 0.1

static struct atc_endpoint *endpoint_new(const char *model, const char *id, const char *host, uint16_t port,
                                         unsigned capacity)
{
    struct atc_endpoint *ep = calloc(1, sizeof(*ep));
    if (ep == NULL)
        return NULL;
    if ((ep->recent = calloc(1, sizeof(*ep->recent))) == NULL) {
        free(ep);
        return NULL;
    }
    ep->recent->since_ms = atc_mono_ms();
    ep->id = strdup(id);
    ep->host = strdup(host);
    ep->model = strdup(model);
    size_t urllen = strlen(host) + 32;
    ep->url = malloc(urllen);
    if (ep->id == NULL || ep->host == NULL || ep->model == NULL || ep->url == NULL) {
        free(ep->id);
        free(ep->host);
        free(ep->model);
        free(ep->url);
        free(ep->recent);
        free(ep);
        return NULL;
    }
    snprintf(ep->url, urllen, "http://%s:%u", host, (unsigned)port);
    ep->port = port;
    ep->capacity = capacity;
    ep->weight = 1;
    ep->routable = true;
    return ep;
}

/* Wipes and frees the endpoint's copy of its key. */
static void drop_key(struct atc_endpoint *ep)
{
    if (ep->authorization != NULL)
        explicit_bzero(ep->authorization, strlen(ep->authorization));
    free(ep->authorization);
    free(ep->api_key_source);
    ep->authorization = ep->api_key_source = NULL;
}

static void endpoint_free(struct atc_endpoint *ep)
{
    drop_key(ep);
    free(ep->id);
    free(ep->url);
    free(ep->host);
    free(ep->model);
    free(ep->version);
    for (size_t i = 0; i < ep->ntags; i++)
        free(ep->tags[i]);
    free(ep->tags);
    free(ep->recent);
    free(ep);
}

static int model_append(struct atc_model *m, struct atc_endpoint *ep)
{
    struct atc_endpoint **eps = realloc(m->endpoints, (m->nendpoints + 1) * sizeof(*eps));
    if (eps == NULL)
        return -1;
    eps[m->nendpoints++] = ep;
    m->endpoints = eps;
    return 0;
}

/* Appends @p ep to the table and to model @p m, in a new slot. */
static int table_append(struct atc_endpoint_table *t, struct atc_model *m, struct atc_endpoint *ep)
{
    struct atc_endpoint **eps = realloc(t->endpoints, (t->nendpoints + 1) * sizeof(*eps));
    if (eps == NULL)
        return -1;
    t->endpoints = eps;
    struct atc_endpoint **s = realloc(t->slots, (t->nslots + 1) * sizeof(*s));
    if (s == NULL)
        return -1;
    t->slots = s;
    if (model_append(m, ep) < 0)
        return -1;
    ep->index = (unsigned)t->nslots;
    t->slots[t->nslots++] = ep;
    eps[t->nendpoints++] = ep;
    return 0;
}

/* The settings of @p ec that may change in place (a config reload keeps the endpoint and its counters). */
static int apply_config(struct atc_endpoint *ep, const struct atc_endpoint_config *ec)
{
    ep->capacity = ec->capacity;
    ep->weight = ec->weight;
    ep->token_budget = ec->token_budget;
    ep->max_server_queue = ec->max_server_queue;
    ep->kv_tokens_config = ec->kv_tokens;
    if (ec->kv_tokens > 0)
        atomic_store_explicit(&ep->kv_tokens, ec->kv_tokens, memory_order_relaxed);
    ep->engine = ec->access.engine;
    ep->role = ec->role;
    ep->bootstrap_port = (uint16_t)ec->bootstrap_port;
    ep->forward_authorization = ec->access.forward_authorization;
    drop_key(ep);
    if (ec->access.api_key != NULL) {
        size_t n = strlen(ec->access.api_key) + sizeof("Bearer ");
        if ((ep->authorization = malloc(n)) == NULL ||
            (ep->api_key_source = strdup(ec->access.api_key_source ? ec->access.api_key_source : "set")) ==
                NULL)
            return -1;
        snprintf(ep->authorization, n, "Bearer %s", ec->access.api_key);
    }
    free(ep->version);
    ep->version = NULL;
    for (size_t i = 0; i < ep->ntags; i++)
        free(ep->tags[i]);
    free(ep->tags);
    ep->tags = NULL;
    ep->ntags = 0;
    if (ec->version != NULL && (ep->version = strdup(ec->version)) == NULL)
        return -1;
    if (ec->ntags > 0) {
        if ((ep->tags = calloc(ec->ntags, sizeof(char *))) == NULL)
            return -1;
        for (; ep->ntags < ec->ntags; ep->ntags++)
            if ((ep->tags[ep->ntags] = strdup(ec->tags[ep->ntags])) == NULL)
                return -1;
    }
    return 0;
}

struct atc_endpoint_table *atc_endpoint_table_create(const struct atc_config *cfg)
{
    struct atc_endpoint_table *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return NULL;
    t->signals = cfg->signals;
    t->models = calloc(cfg->nmodels ? cfg->nmodels : 1, sizeof(*t->models));
    if (t->models == NULL)
        goto error;
    for (size_t i = 0; i < cfg->nmodels; i++) {
        const struct atc_model_config *mc = &cfg->models[i];
        struct atc_model *m = &t->models[t->nmodels++];
        if ((m->name = strdup(mc->name)) == NULL)
            goto error;
        m->disaggregation = mc->disaggregation;
        for (size_t j = 0; j < mc->nendpoints; j++) {
            const struct atc_endpoint_config *ec = &mc->endpoints[j];
            struct atc_endpoint *ep = endpoint_new(mc->name, ec->id, ec->host, ec->port, ec->capacity);
            if (ep == NULL)
                goto error;
            if (apply_config(ep, ec) < 0 || table_append(t, m, ep) < 0) {
                endpoint_free(ep);
                goto error;
            }
        }
    }
    return t;
error:
    atc_endpoint_table_destroy(t);
    return NULL;
}

struct atc_endpoint *atc_endpoint_table_add(struct atc_endpoint_table *t, const char *model, const char *id,
                                            const char *host, uint16_t port, unsigned capacity)
{
    struct atc_model *m = atc_endpoint_table_model(t, model, strlen(model));
    if (m == NULL)
        return NULL;
    struct atc_endpoint *ep = endpoint_new(model, id, host, port, capacity);
    if (ep == NULL)
        return NULL;
    if (table_append(t, m, ep) < 0) {
        endpoint_free(ep);
        return NULL;
    }
    return ep;
}

/* Frees the table's arrays and model names, not its endpoints. */
static void table_free_shell(struct atc_endpoint_table *t)
{
    for (size_t i = 0; i < t->nmodels; i++) {
        free(t->models[i].name);
        free(t->models[i].endpoints);
    }
    free(t->endpoints);
    free(t->slots);
    free(t->models);
    free(t);
}

struct atc_endpoint_table *atc_endpoint_table_rebuild(struct atc_endpoint_table *old,
                                                      const struct atc_config *cfg,
                                                      struct atc_endpoint ***retired, size_t *nretired)
{
    struct atc_endpoint_table *t = calloc(1, sizeof(*t));
    bool *moved = calloc(old->nslots ? old->nslots : 1, sizeof(bool));
    struct atc_endpoint **gone = calloc(old->nendpoints ? old->nendpoints : 1, sizeof(*gone));
    if (t == NULL || moved == NULL || gone == NULL ||
        (t->models = calloc(cfg->nmodels ? cfg->nmodels : 1, sizeof(*t->models))) == NULL)
        goto error;
    t->signals = cfg->signals;
    for (size_t i = 0; i < cfg->nmodels; i++) {
        const struct atc_model_config *mc = &cfg->models[i];
        struct atc_model *m = &t->models[t->nmodels++];
        if ((m->name = strdup(mc->name)) == NULL)
            goto error;
        m->disaggregation = mc->disaggregation;
        for (size_t j = 0; j < mc->nendpoints; j++) {
            const struct atc_endpoint_config *ec = &mc->endpoints[j];
            /* Same id, model and address: the same server, which keeps its counters, pool and health. */
            struct atc_endpoint *ep = atc_endpoint_table_find(old, ec->id);
            if (atc_endpoint_same_server(ep, ec, mc->name))
                moved[ep->index] = true;
            else if ((ep = endpoint_new(mc->name, ec->id, ec->host, ec->port, ec->capacity)) == NULL)
                goto error;
            if (apply_config(ep, ec) < 0 || table_append(t, m, ep) < 0)
                goto error; /* out of memory: the process is in no state to go on either way */
        }
        /* Simulated servers stay as they are (simulate: changes need a restart). */
        struct atc_model *om = atc_endpoint_table_model(old, mc->name, strlen(mc->name));
        for (size_t j = 0; om != NULL && j < om->nendpoints; j++) {
            struct atc_endpoint *ep = om->endpoints[j];
            if (ep->simulated) {
                moved[ep->index] = true;
                if (table_append(t, m, ep) < 0)
                    goto error;
            }
        }
    }
    size_t n = 0;
    for (size_t i = 0; i < old->nslots; i++) /* (moved[] is by old slot: ep->index has changed) */
        if (old->slots[i] != NULL && !moved[i]) {
            old->slots[i]->routable = false;
            gone[n++] = old->slots[i];
        }
    free(moved);
    table_free_shell(old);
    *retired = gone;
    *nretired = n;
    return t;
error:
    abort(); /* allocation failure halfway through moving endpoints: nothing consistent is left */
}

struct atc_endpoint *atc_endpoint_create(const char *model, const struct atc_endpoint_config *ec)
{
    struct atc_endpoint *ep = endpoint_new(model, ec->id, ec->host, ec->port, ec->capacity);
    if (ep != NULL && apply_config(ep, ec) < 0) {
        endpoint_free(ep);
        return NULL;
    }
    return ep;
}

struct atc_endpoint_table *atc_endpoint_table_with(const struct atc_endpoint_table *old,
                                                   struct atc_endpoint *add,
                                                   const struct atc_endpoint *remove)
{
    if (add != NULL && atc_endpoint_table_model(old, add->model, strlen(add->model)) == NULL)
        return NULL;
    struct atc_endpoint_table *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return NULL;
    t->signals = old->signals;
    t->nslots = old->nslots + (add != NULL);
    if ((t->models = calloc(old->nmodels ? old->nmodels : 1, sizeof(*t->models))) == NULL ||
        (t->slots = calloc(t->nslots ? t->nslots : 1, sizeof(*t->slots))) == NULL ||
        (t->endpoints = calloc(old->nendpoints + 1, sizeof(*t->endpoints))) == NULL)
        goto error;
    for (size_t i = 0; i < old->nmodels; i++) {
        const struct atc_model *om = &old->models[i];
        struct atc_model *m = &t->models[t->nmodels++];
        if ((m->name = strdup(om->name)) == NULL ||
            (m->endpoints = calloc(om->nendpoints + 1, sizeof(*m->endpoints))) == NULL)
            goto error;
        m->disaggregation = om->disaggregation;
        for (size_t j = 0; j < om->nendpoints; j++)
            if (om->endpoints[j] != remove)
                m->endpoints[m->nendpoints++] = om->endpoints[j];
        if (add != NULL && strcmp(add->model, m->name) == 0)
            m->endpoints[m->nendpoints++] = add;
    }
    for (size_t i = 0; i < old->nendpoints; i++)
        if (old->endpoints[i] != remove)
            t->endpoints[t->nendpoints++] = old->endpoints[i];
    if (old->nslots > 0) /* (a table without endpoints has no slots array) */
        memcpy(t->slots, old->slots, old->nslots * sizeof(*t->slots));
    if (remove != NULL && remove->index < old->nslots && old->slots[remove->index] == remove)
        t->slots[remove->index] = NULL;
    if (add != NULL) {
        add->index = (unsigned)old->nslots; /* (not published yet: no other thread reads it) */
        t->slots[add->index] = add;
        t->endpoints[t->nendpoints++] = add;
    }
    return t;
error:
    table_free_shell(t);
    return NULL;
}

struct atc_endpoint_table *atc_endpoint_table_only(const struct atc_endpoint_table *all, const bool *in)
{
    struct atc_endpoint_table *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return NULL;
    t->signals = all->signals;
    t->nslots = all->nslots;
    if ((t->models = calloc(all->nmodels ? all->nmodels : 1, sizeof(*t->models))) == NULL ||
        (t->slots = calloc(t->nslots ? t->nslots : 1, sizeof(*t->slots))) == NULL ||
        (t->endpoints = calloc(all->nendpoints ? all->nendpoints : 1, sizeof(*t->endpoints))) == NULL)
        goto error;
    for (size_t i = 0; i < all->nmodels; i++) {
        const struct atc_model *om = &all->models[i];
        struct atc_model *m = &t->models[t->nmodels++];
        if ((m->name = strdup(om->name)) == NULL ||
            (m->endpoints = calloc(om->nendpoints ? om->nendpoints : 1, sizeof(*m->endpoints))) == NULL)
            goto error;
        m->disaggregation = om->disaggregation;
        for (size_t j = 0; j < om->nendpoints; j++)
            if (in[om->endpoints[j]->index])
                m->endpoints[m->nendpoints++] = om->endpoints[j];
    }
    for (size_t i = 0; i < all->nendpoints; i++)
        if (in[all->endpoints[i]->index]) {
            t->endpoints[t->nendpoints++] = all->endpoints[i];
            t->slots[all->endpoints[i]->index] = all->endpoints[i];
        }
    return t;
error:
    table_free_shell(t);
    return NULL;
}

void atc_endpoint_table_free_shell(struct atc_endpoint_table *t)
{
    if (t != NULL)
        table_free_shell(t);
}

struct atc_endpoint *atc_endpoint_table_slot(const struct atc_endpoint_table *t, size_t slot)
{
    return t != NULL && slot < t->nslots ? t->slots[slot] : NULL;
}

void atc_endpoint_free(struct atc_endpoint *ep)
{
    endpoint_free(ep);
}

void atc_endpoint_table_destroy(struct atc_endpoint_table *t)
{
    if (t == NULL)
        return;
    for (size_t i = 0; i < t->nendpoints; i++)
        endpoint_free(t->endpoints[i]);
    for (size_t i = 0; i < t->nmodels; i++) {
        free(t->models[i].name);
        free(t->models[i].endpoints);
    }
    free(t->endpoints);
    free(t->slots);
    free(t->models);
    free(t);
}

struct atc_model *atc_endpoint_table_model(const struct atc_endpoint_table *t, const char *name, size_t len)
{
    for (size_t i = 0; i < t->nmodels; i++)
        if (strlen(t->models[i].name) == len && memcmp(t->models[i].name, name, len) == 0)
            return &t->models[i];
    return NULL;
}

const char *atc_endpoint_table_model_label(const struct atc_endpoint_table *t, const char *name)
{
    const struct atc_model *m = name != NULL ? atc_endpoint_table_model(t, name, strlen(name)) : NULL;
    return m != NULL ? m->name : "other";
}

bool atc_endpoint_same_server(const struct atc_endpoint *ep, const struct atc_endpoint_config *ec,
                              const char *model)
{
    return ep != NULL && !ep->simulated && ep->port == ec->port && strcmp(ep->host, ec->host) == 0 &&
           strcmp(ep->model, model) == 0;
}

struct atc_endpoint *atc_endpoint_table_find(const struct atc_endpoint_table *t, const char *id)
{
    for (size_t i = 0; i < t->nendpoints; i++)
        if (strcmp(t->endpoints[i]->id, id) == 0)
            return t->endpoints[i];
    return NULL;
}

void atc_endpoint_acquire(struct atc_endpoint *ep, uint64_t tokens)
{
    atomic_fetch_add_explicit(&ep->inflight, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&ep->inflight_tokens, tokens, memory_order_relaxed);
}

bool atc_endpoint_try_acquire(struct atc_endpoint *ep, uint64_t tokens)
{
    unsigned cur = atomic_load_explicit(&ep->inflight, memory_order_relaxed);
    do {
        /* available() with the count this exchange is based on (the token sum is checked, not reserved,
         * in the same step: a budget can be passed by one request per worker at the same instant) */
        if (!atc_endpoint_available_at(ep, cur, tokens))
            return false;
    } while (!atomic_compare_exchange_weak_explicit(&ep->inflight, &cur, cur + 1, memory_order_relaxed,
                                                    memory_order_relaxed));
    atomic_fetch_add_explicit(&ep->inflight_tokens, tokens, memory_order_relaxed);
    return true;
}

void atc_endpoint_release(struct atc_endpoint *ep, uint64_t tokens)
{
    /* Saturate rather than wrap: a bookkeeping slip must not make an endpoint look infinitely busy. A CAS
     * loop, since another worker may release (or acquire) between our load and our store. */
    unsigned n = atomic_load_explicit(&ep->inflight, memory_order_relaxed);
    while (n > 0 && !atomic_compare_exchange_weak_explicit(&ep->inflight, &n, n - 1, memory_order_relaxed,
                                                           memory_order_relaxed))
        ;
    uint64_t t = atomic_load_explicit(&ep->inflight_tokens, memory_order_relaxed);
    while (t > 0 &&
           !atomic_compare_exchange_weak_explicit(&ep->inflight_tokens, &t, t >= tokens ? t - tokens : 0,
                                                  memory_order_relaxed, memory_order_relaxed))
        ;
}

void atc_endpoint_record(struct atc_endpoint *ep, bool ok, double ttft_ms)
{
    atc_recent_record(ep->recent, atc_mono_ms(), ok, ttft_ms);
    atomic_fetch_add_explicit(&ep->requests_total, 1, memory_order_relaxed);
    if (!ok) {
        atomic_fetch_add_explicit(&ep->errors_total, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&ep->consecutive_errors, 1, memory_order_relaxed);
        return;
    }
    atomic_store_explicit(&ep->consecutive_errors, 0, memory_order_relaxed);
    if (ttft_ms < 0)
        return;
    /* A load and a store, not a CAS loop: when two workers record at the same instant one sample is lost,
     * which a moving average over about ten requests does not notice. */
    double ewma = atomic_load_explicit(&ep->ttft_ewma_ms, memory_order_relaxed);
    atomic_store_explicit(&ep->ttft_ewma_ms, ewma == 0 ? ttft_ms : ewma + TTFT_EWMA_ALPHA * (ttft_ms - ewma),
                          memory_order_relaxed);
}
