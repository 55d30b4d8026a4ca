/* Per-tenant limits in one-minute windows, spent locally or from leases of a budget kept in Redis
 * (limits.h says how). */

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <xxhash.h>

#include "cluster/limits.h"
#include "config/config.h"
#include "base/json.h"

#define DYNAMIC_SLOTS 1024 /* other tenants tracked at once within a window */
#define PROBES 16          /* the slots a name may take: where it hashes, and the 15 after */

struct bucket {
    uint64_t used;     /* admitted this window: requests, or tokens (corrected) */
    uint64_t granted;  /* of the shared budget, leased to this replica this window */
    uint64_t reported; /* added to the window's counter in Redis by this replica (incl. pending) */
    uint64_t pending;  /* of reported, sent and not answered yet */
    uint64_t total;    /* the counter in Redis as last answered (every replica's increments) */
    bool answered;     /* a refill of this window was answered: until then a credit of one chunk */
};

struct slot {
    char name[ATC_LIMITS_TENANT_MAX + 1];
    bool in_use, configured;
    struct atc_limit_rule rule;
    uint64_t window;
    uint64_t last_used; /* the table's clock at this slot's last admission: the older goes first */
    uint32_t gen;       /* bumped when the slot is given to another tenant: tickets of the last one miss */
    struct bucket b[2];
    uint64_t admitted, limited, tokens; /* since start: configured tenants' own counters */
};

struct atc_limits {
    pthread_mutex_t mu; /* covers everything below */
    struct slot *slots; /* [nconf] configured, then [DYNAMIC_SLOTS] */
    size_t nconf;
    struct atc_limit_rule dflt;
    bool shared;
    unsigned replicas;
    uint64_t clock;   /* admissions so far: the slots' last_used */
    uint64_t evicted; /* other tenants' slots taken within their window by a new name */
    uint64_t other_admitted, other_limited, other_tokens; /* every tenant not configured */
    void (*on_low)(void *ctx);
    void *on_low_ctx;
};

static uint64_t limit_of(const struct atc_limit_rule *r, int k)
{
    return k == ATC_LIMIT_REQUESTS ? r->requests_per_minute : r->tokens_per_minute;
}

static uint64_t chunk_of(const struct atc_limits *l, uint64_t limit)
{
    uint64_t c = limit / (4u * (l->replicas ? l->replicas : 1));
    return c > 0 ? c : 1;
}

/* What this replica may still spend of kind @p k in its slot's window (may be negative). */
static int64_t available(const struct atc_limits *l, const struct slot *s, int k)
{
    const struct bucket *b = &s->b[k];
    uint64_t limit = limit_of(&s->rule, k);
    if (!l->shared)
        return (int64_t)limit - (int64_t)b->used;
    if (!b->answered)
        return (int64_t)chunk_of(l, limit) - (int64_t)b->used; /* the credit before the first lease */
    return (int64_t)b->granted - (int64_t)b->used;
}

struct atc_limits *atc_limits_create(const struct atc_config *cfg)
{
    struct atc_limits *l = calloc(1, sizeof(*l));
    if (l == NULL)
        return NULL;
    l->nconf = cfg->limits.ntenants;
    l->dflt = cfg->limits.dflt;
    l->replicas = 1;
    if ((l->slots = calloc(l->nconf + DYNAMIC_SLOTS, sizeof(*l->slots))) == NULL) {
        free(l);
        return NULL;
    }
    for (size_t i = 0; i < l->nconf; i++) {
        struct slot *s = &l->slots[i];
        snprintf(s->name, sizeof(s->name), "%s", cfg->limits.tenants[i]);
        s->in_use = s->configured = true;
        s->rule = cfg->limits.rules[i];
    }
    pthread_mutex_init(&l->mu, NULL);
    return l;
}

void atc_limits_destroy(struct atc_limits *l)
{
    if (l == NULL)
        return;
    pthread_mutex_destroy(&l->mu);
    free(l->slots);
    free(l);
}

/* Which of two slots a new name takes: a free one, else one of an older window, else the one that
 * spent least of this window's requests, else the one admitted longest ago. So a client rotating names
 * evicts its own names (each spent once) before a tenant that spent its budget, and never shares a
 * budget with another tenant. */
static bool better_victim(const struct slot *a, const struct slot *b, uint64_t w)
{
    if (!a->in_use || !b->in_use)
        return !a->in_use && b->in_use;
    if ((a->window < w) != (b->window < w))
        return a->window < w;
    if (a->b[ATC_LIMIT_REQUESTS].used != b->b[ATC_LIMIT_REQUESTS].used)
        return a->b[ATC_LIMIT_REQUESTS].used < b->b[ATC_LIMIT_REQUESTS].used;
    return a->last_used < b->last_used;
}

/* The slot of @p name (under the lock), made or taken for window @p w when @p create; -1 when it is not
 * limited (or not found). */
static int find_slot(struct atc_limits *l, const char *name, uint64_t w, bool create)
{
    for (size_t i = 0; i < l->nconf; i++)
        if (strcmp(l->slots[i].name, name) == 0)
            return (int)i;
    if (l->dflt.requests_per_minute == 0 && l->dflt.tokens_per_minute == 0)
        return -1;
    size_t h = (size_t)XXH3_64bits(name, strlen(name)) % DYNAMIC_SLOTS;
    struct slot *victim = NULL;
    for (int p = 0; p < PROBES; p++) { /* the whole run first: a name is in at most one of its slots */
        struct slot *s = &l->slots[l->nconf + (h + (size_t)p) % DYNAMIC_SLOTS];
        if (s->in_use && strcmp(s->name, name) == 0)
            return (int)(s - l->slots);
        if (victim == NULL || better_victim(s, victim, w))
            victim = s;
    }
    if (!create)
        return -1;
    if (victim->in_use && victim->window == w)
        l->evicted++;
    uint32_t gen = victim->gen + 1;
    memset(victim, 0, sizeof(*victim));
    snprintf(victim->name, sizeof(victim->name), "%s", name);
    victim->in_use = true;
    victim->rule = l->dflt;
    victim->window = w;
    victim->gen = gen;
    return (int)(victim - l->slots);
}

/* A new window starts from nothing spent and nothing leased. */
static void roll(struct slot *s, uint64_t w)
{
    if (s->window != w) {
        memset(s->b, 0, sizeof(s->b));
        s->window = w;
    }
}

int atc_limits_admit(struct atc_limits *l, const char *tenant, uint64_t tokens, uint64_t now_ms,
                     struct atc_limit_ticket *t, enum atc_limit_kind *kind)
{
    char name[ATC_LIMITS_TENANT_MAX + 1];
    snprintf(name, sizeof(name), "%s", tenant != NULL ? tenant : "");
    uint64_t w = now_ms / ATC_LIMITS_WINDOW_MS;
    int retry = (int)((ATC_LIMITS_WINDOW_MS - now_ms % ATC_LIMITS_WINDOW_MS + 999) / 1000);
    bool low = false;
    *t = (struct atc_limit_ticket){.slot = -1};
    pthread_mutex_lock(&l->mu);
    int i = find_slot(l, name, w, true);
    if (i < 0) {
        l->other_admitted++;
        pthread_mutex_unlock(&l->mu);
        return 0;
    }
    struct slot *s = &l->slots[i];
    roll(s, w);
    s->last_used = ++l->clock;
    for (int k = 0; k < 2; k++) {
        if (limit_of(&s->rule, k) > 0 && available(l, s, k) <= 0) {
            *kind = (enum atc_limit_kind)k;
            if (s->configured)
                s->limited++;
            else
                l->other_limited++;
            low = l->shared && s->b[k].pending == 0;
            pthread_mutex_unlock(&l->mu);
            if (low && l->on_low != NULL) /* refused, but a refill may still find room */
                l->on_low(l->on_low_ctx);
            return retry > 0 ? retry : 1;
        }
    }
    s->b[ATC_LIMIT_REQUESTS].used++;
    s->b[ATC_LIMIT_TOKENS].used += tokens;
    if (s->configured) {
        s->admitted++;
        s->tokens += tokens;
    } else {
        l->other_admitted++;
        l->other_tokens += tokens;
    }
    for (int k = 0; k < 2 && l->shared; k++) {
        uint64_t limit = limit_of(&s->rule, k);
        if (limit > 0 && s->b[k].pending == 0 && available(l, s, k) <= (int64_t)(chunk_of(l, limit) / 2))
            low = true;
    }
    *t = (struct atc_limit_ticket){.slot = i, .gen = s->gen, .window = w, .tokens = tokens};
    pthread_mutex_unlock(&l->mu);
    if (low && l->on_low != NULL)
        l->on_low(l->on_low_ctx);
    return 0;
}

void atc_limits_settle(struct atc_limits *l, const struct atc_limit_ticket *t, uint64_t actual_tokens)
{
    if (t->slot < 0 || actual_tokens == t->tokens)
        return;
    pthread_mutex_lock(&l->mu);
    struct slot *s = &l->slots[t->slot];
    if (s->window == t->window && s->gen == t->gen) { /* still that tenant's slot */
        struct bucket *b = &s->b[ATC_LIMIT_TOKENS];
        b->used = b->used + actual_tokens > t->tokens ? b->used + actual_tokens - t->tokens : 0;
        uint64_t *sum = s->configured ? &s->tokens : &l->other_tokens;
        *sum = *sum + actual_tokens > t->tokens ? *sum + actual_tokens - t->tokens : 0;
    }
    pthread_mutex_unlock(&l->mu);
}

void atc_limits_set_shared(struct atc_limits *l, bool shared, unsigned replicas)
{
    pthread_mutex_lock(&l->mu);
    l->shared = shared;
    l->replicas = replicas > 0 ? replicas : 1;
    pthread_mutex_unlock(&l->mu);
}

void atc_limits_on_low(struct atc_limits *l, void (*fn)(void *ctx), void *ctx)
{
    l->on_low = fn;
    l->on_low_ctx = ctx;
}

size_t atc_limits_refills(struct atc_limits *l, uint64_t now_ms, struct atc_limit_refill *out, size_t max)
{
    uint64_t w = now_ms / ATC_LIMITS_WINDOW_MS;
    size_t n = 0;
    pthread_mutex_lock(&l->mu);
    for (size_t i = 0; l->shared && i < l->nconf + DYNAMIC_SLOTS && n < max; i++) {
        struct slot *s = &l->slots[i];
        if (!s->in_use || s->window != w)
            continue; /* nothing spent this window (a configured tenant rolls at its first request) */
        for (int k = 0; k < 2 && n < max; k++) {
            struct bucket *b = &s->b[k];
            uint64_t limit = limit_of(&s->rule, k), chunk = chunk_of(l, limit);
            if (limit == 0 || b->pending > 0)
                continue;
            uint64_t debt = b->used > b->reported ? b->used - b->reported : 0;
            bool low = available(l, s, k) <= (int64_t)(chunk / 2);
            if (debt == 0 && (!low || b->total >= limit)) /* enough, or nothing left to lease */
                continue;
            uint64_t amount = debt + (b->total >= limit ? 0 : chunk);
            b->reported += amount;
            b->pending = amount;
            out[n] = (struct atc_limit_refill){.kind = (enum atc_limit_kind)k, .window = w, .amount = amount};
            memcpy(out[n].tenant, s->name, sizeof(out[n].tenant));
            n++;
        }
    }
    pthread_mutex_unlock(&l->mu);
    return n;
}

void atc_limits_refilled(struct atc_limits *l, const struct atc_limit_refill *r, int64_t total)
{
    pthread_mutex_lock(&l->mu);
    int i = find_slot(l, r->tenant, r->window, false);
    struct slot *s = i >= 0 ? &l->slots[i] : NULL;
    if (s != NULL && s->window == r->window && s->b[r->kind].pending == r->amount) {
        struct bucket *b = &s->b[r->kind];
        b->pending = 0;
        if (total < 0) {
            b->reported -= r->amount;
        } else {
            /* The room the counter had before this increment is what it grants (the debt included:
             * already spent, it is granted when there was room for it, and the budget is short else). */
            int64_t room = (int64_t)limit_of(&s->rule, r->kind) - (total - (int64_t)r->amount);
            b->granted += room <= 0 ? 0 : (uint64_t)room < r->amount ? (uint64_t)room : r->amount;
            b->total = (uint64_t)total;
            b->answered = true;
        }
    }
    pthread_mutex_unlock(&l->mu);
}

/* What is left of @p s's budget of kind @p k this window, fleet-wide as far as this replica knows. */
static uint64_t remaining(const struct atc_limits *l, const struct slot *s, int k, uint64_t w)
{
    uint64_t limit = limit_of(&s->rule, k);
    if (s->window != w)
        return limit;
    const struct bucket *b = &s->b[k];
    int64_t left;
    if (!l->shared) {
        left = (int64_t)limit - (int64_t)b->used;
    } else {
        uint64_t spent = b->total > b->reported ? b->total : b->reported;
        uint64_t debt = b->used > b->reported ? b->used - b->reported : 0;
        uint64_t unused = b->granted > b->used ? b->granted - b->used : 0;
        left = (int64_t)limit - (int64_t)spent - (int64_t)debt + (int64_t)unused;
    }
    return left > 0 ? (uint64_t)left : 0;
}

void atc_limits_metrics(struct atc_limits *l, struct evbuffer *out, uint64_t now_ms)
{
    uint64_t w = now_ms / ATC_LIMITS_WINDOW_MS;
    static const char *const kinds[] = {"requests", "tokens"};
    pthread_mutex_lock(&l->mu);
    evbuffer_add_printf(out, "# HELP atc_tenant_requests_total Client requests by tenant (limits:), admitted "
                             "or refused over its budget.\n# TYPE atc_tenant_requests_total counter\n");
    for (size_t i = 0; i < l->nconf; i++) {
        const struct slot *s = &l->slots[i];
        evbuffer_add_printf(out,
                            "atc_tenant_requests_total{tenant=\"%s\",result=\"admitted\"} %" PRIu64 "\n"
                            "atc_tenant_requests_total{tenant=\"%s\",result=\"limited\"} %" PRIu64 "\n",
                            s->name, s->admitted, s->name, s->limited);
    }
    evbuffer_add_printf(out,
                        "atc_tenant_requests_total{tenant=\"other\",result=\"admitted\"} %" PRIu64 "\n"
                        "atc_tenant_requests_total{tenant=\"other\",result=\"limited\"} %" PRIu64 "\n",
                        l->other_admitted, l->other_limited);
    evbuffer_add_printf(out, "# HELP atc_tenant_tokens_total Tokens of admitted requests by tenant (estimate "
                             "corrected by the answers' usage).\n# TYPE atc_tenant_tokens_total counter\n");
    for (size_t i = 0; i < l->nconf; i++)
        evbuffer_add_printf(out, "atc_tenant_tokens_total{tenant=\"%s\"} %" PRIu64 "\n", l->slots[i].name,
                            l->slots[i].tokens);
    evbuffer_add_printf(out, "atc_tenant_tokens_total{tenant=\"other\"} %" PRIu64 "\n", l->other_tokens);
    evbuffer_add_printf(out, "# HELP atc_tenant_remaining What is left of a configured tenant's budget in this "
                             "minute (fleet-wide when shared).\n# TYPE atc_tenant_remaining gauge\n");
    for (size_t i = 0; i < l->nconf; i++)
        for (int k = 0; k < 2; k++)
            if (limit_of(&l->slots[i].rule, k) > 0)
                evbuffer_add_printf(out, "atc_tenant_remaining{tenant=\"%s\",kind=\"%s\"} %" PRIu64 "\n",
                                    l->slots[i].name, kinds[k], remaining(l, &l->slots[i], k, w));
    evbuffer_add_printf(out,
                        "# HELP atc_limits_evicted_total Tenants under the default budget whose slot a new "
                        "name took within their window (they start again from nothing spent).\n"
                        "# TYPE atc_limits_evicted_total counter\natc_limits_evicted_total %" PRIu64 "\n",
                        l->evicted);
    evbuffer_add_printf(out, "# HELP atc_limits_shared 1 while tenant budgets are shared through Redis, 0 "
                             "while each replica spends its own.\n# TYPE atc_limits_shared gauge\n"
                             "atc_limits_shared %d\n",
                        l->shared ? 1 : 0);
    pthread_mutex_unlock(&l->mu);
}

void atc_limits_json(struct atc_limits *l, struct evbuffer *out, uint64_t now_ms)
{
    uint64_t w = now_ms / ATC_LIMITS_WINDOW_MS;
    pthread_mutex_lock(&l->mu);
    evbuffer_add_printf(out, "{\"mode\": \"%s\", \"window_ends_in_s\": %.3f, \"tenants\": [",
                        l->shared ? "shared" : "local",
                        (double)(ATC_LIMITS_WINDOW_MS - now_ms % ATC_LIMITS_WINDOW_MS) / 1000.0);
    for (size_t i = 0; i < l->nconf; i++) {
        const struct slot *s = &l->slots[i];
        evbuffer_add_printf(out, "%s{\"tenant\": \"", i ? ", " : "");
        atc_json_escape(out, s->name, strlen(s->name));
        /* a budget that is not set has nothing remaining to show: null, not 0 */
        char left[2][24];
        for (int k = 0; k < 2; k++)
            if ((k == 0 ? s->rule.requests_per_minute : s->rule.tokens_per_minute) == 0)
                snprintf(left[k], sizeof(left[k]), "null");
            else
                snprintf(left[k], sizeof(left[k]), "%" PRIu64, remaining(l, s, k, w));
        evbuffer_add_printf(out,
                            "\", \"requests_per_minute\": %" PRIu64 ", \"tokens_per_minute\": %" PRIu64
                            ", \"requests\": %" PRIu64 ", \"tokens\": %" PRIu64 ", \"requests_remaining\": %s"
                            ", \"tokens_remaining\": %s, \"admitted_total\": %" PRIu64
                            ", \"limited_total\": %" PRIu64 "}",
                            s->rule.requests_per_minute, s->rule.tokens_per_minute,
                            s->window == w ? s->b[0].used : 0, s->window == w ? s->b[1].used : 0, left[0],
                            left[1], s->admitted, s->limited);
    }
    evbuffer_add_printf(out,
                        "], \"other\": {\"requests_per_minute\": %" PRIu64 ", \"tokens_per_minute\": %" PRIu64
                        ", \"admitted_total\": %" PRIu64 ", \"limited_total\": %" PRIu64
                        ", \"evicted_total\": %" PRIu64 "}}",
                        l->dflt.requests_per_minute, l->dflt.tokens_per_minute, l->other_admitted,
                        l->other_limited, l->evicted);
    pthread_mutex_unlock(&l->mu);
}
