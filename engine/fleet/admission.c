#include "fleet/admission.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "base/json.h"
#include "base/log.h"
#include "base/histogram.h"
#include "base/clock.h"

/* Deadlines are checked, and capacity retried, this often even when nothing is released. */
#define TICK_MS 50
#define MAX_PRIORITY 9

static const uint64_t wait_buckets_ms[] = {1, 5, 10, 50, 100, 500, 1000, 5000, 10000, 30000, 60000};
#define NBUCKETS (sizeof(wait_buckets_ms) / sizeof(wait_buckets_ms[0]))

TAILQ_HEAD(item_list, atc_queue_item);

struct model_queue {
    char model[256];
    struct item_list items;
    unsigned n;
    struct model_queue *next;
};

/* A tenant's share: requests placed from a queue, per unit of weight. A tenant of admission.tenant_weights
 * is kept for good; any other only while it has requests waiting (a client picks the names it sends:
 * kept for good, every new x-atc-tenant was a record that was never freed and that each lookup scanned).
 * Forgetting an idle one loses nothing: a tenant that comes back from idle starts at the lowest share
 * among those waiting anyway (enqueue). */
struct tenant {
    char name[64];
    unsigned weight;
    double served; /* placed / weight */
    unsigned waiting;
    bool configured;
    struct tenant *next;
};

struct atc_admission {
    struct atc_admission_settings s;
    struct atc_admission_callbacks cb;
    struct event *tick;
    struct model_queue *queues;
    struct tenant *tenants;
    size_t waiting;
    bool kicking, kick_again;
    uint64_t admitted_direct, admitted_queued, shed_full, shed_deadline, left_queue;
    uint64_t wait_counts[NBUCKETS + 1];
    uint64_t wait_sum_ms;
};

/* Waiting per model across the workers. Model names are bounded (a configured model's, or "other":
 * the relay queues under atc_endpoint_table_model_label), so a list does. */
struct shared_count {
    char model[256];
    unsigned n;
    struct shared_count *next;
};

struct atc_admission_shared {
    pthread_mutex_t mu;
    struct shared_count *counts;
};

struct atc_admission_shared *atc_admission_shared_create(void)
{
    struct atc_admission_shared *sh = calloc(1, sizeof(*sh));
    if (sh != NULL && pthread_mutex_init(&sh->mu, NULL) != 0) {
        free(sh);
        return NULL;
    }
    return sh;
}

void atc_admission_shared_destroy(struct atc_admission_shared *sh)
{
    if (sh == NULL)
        return;
    while (sh->counts != NULL) {
        struct shared_count *c = sh->counts;
        sh->counts = c->next;
        free(c);
    }
    pthread_mutex_destroy(&sh->mu);
    free(sh);
}

/* Takes one of @p model's places in the whole process; false when they are all taken (or out of
 * memory). Without a shared count, true: the caller's own queue length is the limit. */
static bool shared_take(struct atc_admission *adm, const char *model)
{
    struct atc_admission_shared *sh = adm->s.shared;
    if (sh == NULL)
        return true;
    bool ok = false;
    pthread_mutex_lock(&sh->mu);
    struct shared_count *c = sh->counts;
    while (c != NULL && strcmp(c->model, model) != 0)
        c = c->next;
    if (c == NULL && (c = calloc(1, sizeof(*c))) != NULL) {
        snprintf(c->model, sizeof(c->model), "%s", model);
        c->next = sh->counts;
        sh->counts = c;
    }
    if (c != NULL && c->n < adm->s.max_queue) {
        c->n++;
        ok = true;
    }
    pthread_mutex_unlock(&sh->mu);
    return ok;
}

static void shared_release(struct atc_admission *adm, const char *model)
{
    struct atc_admission_shared *sh = adm->s.shared;
    if (sh == NULL)
        return;
    pthread_mutex_lock(&sh->mu);
    for (struct shared_count *c = sh->counts; c != NULL; c = c->next)
        if (strcmp(c->model, model) == 0 && c->n > 0) {
            c->n--;
            break;
        }
    pthread_mutex_unlock(&sh->mu);
}

static struct model_queue *queue_of(struct atc_admission *adm, const char *model, bool create)
{
    for (struct model_queue *q = adm->queues; q != NULL; q = q->next)
        if (strcmp(q->model, model) == 0)
            return q;
    if (!create)
        return NULL;
    struct model_queue *q = calloc(1, sizeof(*q));
    if (q == NULL)
        return NULL;
    snprintf(q->model, sizeof(q->model), "%s", model);
    TAILQ_INIT(&q->items);
    q->next = adm->queues;
    adm->queues = q;
    return q;
}

/* The tenant called @p name (as stored: cut to 63 bytes), made when @p create; NULL otherwise or out of
 * memory. */
static struct tenant *tenant_of(struct atc_admission *adm, const char *name, bool create)
{
    char key[sizeof(((struct tenant *)0)->name)];
    snprintf(key, sizeof(key), "%s", name);
    for (struct tenant *t = adm->tenants; t != NULL; t = t->next)
        if (strcmp(t->name, key) == 0)
            return t;
    if (!create)
        return NULL;
    struct tenant *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return NULL;
    snprintf(t->name, sizeof(t->name), "%s", key);
    t->weight = 1;
    t->next = adm->tenants;
    adm->tenants = t;
    return t;
}

/* Frees @p t once nothing of it waits, unless it is a configured tenant. */
static void forget_if_idle(struct atc_admission *adm, struct tenant *t)
{
    if (t == NULL || t->configured || t->waiting > 0)
        return;
    for (struct tenant **p = &adm->tenants; *p != NULL; p = &(*p)->next)
        if (*p == t) {
            *p = t->next;
            free(t);
            return;
        }
}

static int effective_priority(const struct atc_admission *adm, const struct atc_queue_item *it, uint64_t now)
{
    /* Ageing raises a waiting request toward the top, never past it: a fresh top-priority request still
     * goes first unless others have waited long enough to reach the top themselves. */
    int p = it->priority;
    if (adm->s.aging_ms > 0)
        p += (int)((now - it->enqueued_ms) / adm->s.aging_ms);
    return p > MAX_PRIORITY ? MAX_PRIORITY : p;
}

/* The item to place next: highest effective priority; then the tenant furthest below its weighted
 * share; then the earliest. */
static struct atc_queue_item *best_item(struct atc_admission *adm, struct model_queue *q, uint64_t now)
{
    struct atc_queue_item *best = NULL;
    int best_prio = -1;
    double best_share = 0;
    struct atc_queue_item *it;
    TAILQ_FOREACH(it, &q->items, link)
    {
        int prio = effective_priority(adm, it, now);
        struct tenant *t = tenant_of(adm, it->tenant, false);
        double share = t != NULL ? t->served : 0;
        if (best == NULL || prio > best_prio || (prio == best_prio && share < best_share) ||
            (prio == best_prio && share == best_share && it->enqueued_ms < best->enqueued_ms)) {
            best = it;
            best_prio = prio;
            best_share = share;
        }
    }
    return best;
}

/* Takes @p it out of this worker's queue; its place in the process-wide count is still held. */
static void unlink_local(struct atc_admission *adm, struct atc_queue_item *it)
{
    struct model_queue *q = queue_of(adm, it->model, false);
    if (q != NULL) {
        TAILQ_REMOVE(&q->items, it, link);
        q->n--;
    }
    struct tenant *t = tenant_of(adm, it->tenant, false);
    if (t != NULL && t->waiting > 0)
        t->waiting--;
    it->queued = false;
    adm->waiting--;
}

static void unlink_item(struct atc_admission *adm, struct atc_queue_item *it)
{
    unlink_local(adm, it);
    shared_release(adm, it->model);
}

static void count_wait(struct atc_admission *adm, uint64_t waited)
{
    size_t b = 0;
    while (b < NBUCKETS && waited > wait_buckets_ms[b])
        b++;
    adm->wait_counts[b]++;
    adm->wait_sum_ms += waited;
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    struct atc_admission *adm = arg;
    uint64_t now = atc_mono_ms();
    for (struct model_queue *q = adm->queues; q != NULL; q = q->next) {
        struct atc_queue_item *it, *next;
        for (it = TAILQ_FIRST(&q->items); it != NULL; it = next) {
            next = TAILQ_NEXT(it, link);
            if (now < it->deadline_ms)
                continue;
            unlink_item(adm, it);
            forget_if_idle(adm, tenant_of(adm, it->tenant, false));
            adm->shed_deadline++;
            count_wait(adm, now - it->enqueued_ms);
            adm->cb.expired(it->owner, now - it->enqueued_ms);
        }
    }
    atc_admission_kick(adm);
}

struct atc_admission *atc_admission_create(struct event_base *base, const struct atc_admission_settings *s,
                                           const struct atc_admission_callbacks *cb)
{
    struct atc_admission *adm = calloc(1, sizeof(*adm));
    if (adm == NULL)
        return NULL;
    adm->s = *s;
    adm->s.tenants = NULL;
    adm->s.weights = NULL;
    adm->s.ntenants = 0;
    adm->cb = *cb;
    /* Weights are copied into the tenant list now: the settings' arrays need not outlive us. */
    for (size_t i = 0; i < s->ntenants; i++) {
        struct tenant *t = tenant_of(adm, s->tenants[i], true);
        if (t != NULL) {
            t->weight = s->weights[i];
            t->configured = true;
        }
    }
    adm->tick = event_new(base, -1, EV_PERSIST, on_tick, adm);
    if (adm->tick == NULL) {
        free(adm);
        return NULL;
    }
    struct timeval tv = {0, TICK_MS * 1000};
    event_add(adm->tick, &tv);
    return adm;
}

void atc_admission_destroy(struct atc_admission *adm)
{
    if (adm == NULL)
        return;
    event_free(adm->tick);
    while (adm->queues != NULL) {
        struct model_queue *q = adm->queues;
        adm->queues = q->next;
        free(q);
    }
    while (adm->tenants != NULL) {
        struct tenant *t = adm->tenants;
        adm->tenants = t->next;
        free(t);
    }
    free(adm);
}

struct atc_admission *atc_admission_copy(const struct atc_admission *adm)
{
    struct atc_admission *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->s = adm->s;
    c->waiting = adm->waiting;
    c->admitted_direct = adm->admitted_direct;
    c->admitted_queued = adm->admitted_queued;
    c->shed_full = adm->shed_full;
    c->shed_deadline = adm->shed_deadline;
    c->left_queue = adm->left_queue;
    memcpy(c->wait_counts, adm->wait_counts, sizeof(c->wait_counts));
    c->wait_sum_ms = adm->wait_sum_ms;
    struct model_queue **tail = &c->queues;
    for (const struct model_queue *q = adm->queues; q != NULL; q = q->next) {
        struct model_queue *cq = calloc(1, sizeof(*cq));
        if (cq == NULL)
            goto error;
        memcpy(cq->model, q->model, sizeof(cq->model));
        TAILQ_INIT(&cq->items);
        *tail = cq;
        tail = &cq->next;
        const struct atc_queue_item *it;
        TAILQ_FOREACH(it, &q->items, link)
        {
            struct atc_queue_item *ci = calloc(1, sizeof(*ci));
            if (ci == NULL)
                goto error;
            ci->priority = it->priority;
            ci->enqueued_ms = it->enqueued_ms;
            TAILQ_INSERT_TAIL(&cq->items, ci, link);
            cq->n++;
        }
    }
    return c;
error:
    atc_admission_copy_free(c);
    return NULL;
}

void atc_admission_copy_free(struct atc_admission *copy)
{
    if (copy == NULL)
        return;
    while (copy->queues != NULL) {
        struct model_queue *q = copy->queues;
        copy->queues = q->next;
        struct atc_queue_item *it;
        while ((it = TAILQ_FIRST(&q->items)) != NULL) {
            TAILQ_REMOVE(&q->items, it, link);
            free(it);
        }
        free(q);
    }
    free(copy);
}

int atc_admission_enqueue(struct atc_admission *adm, struct atc_queue_item *item, uint64_t deadline_ms)
{
    struct model_queue *q = adm->s.max_queue > 0 ? queue_of(adm, item->model, true) : NULL;
    /* the queue-full check first: a shed request leaves no tenant record behind */
    bool room = q != NULL && q->n < adm->s.max_queue && shared_take(adm, item->model);
    struct tenant *t = room ? tenant_of(adm, item->tenant, true) : NULL;
    if (t == NULL) {
        if (room)
            shared_release(adm, item->model);
        adm->shed_full++;
        return -1;
    }
    uint64_t now = atc_mono_ms();
    if (deadline_ms == 0)
        deadline_ms = adm->s.deadline_ms;
    if (deadline_ms > adm->s.max_deadline_ms)
        deadline_ms = adm->s.max_deadline_ms;
    item->enqueued_ms = now;
    item->deadline_ms = now + deadline_ms;
    item->queued = true;
    /* A tenant that was idle starts at the lowest share among those waiting, not at its old low count:
     * a quiet period earns no burst that would starve the others. */
    if (t->waiting == 0) {
        double floor = -1;
        for (struct tenant *o = adm->tenants; o != NULL; o = o->next)
            if (o->waiting > 0 && (floor < 0 || o->served < floor))
                floor = o->served;
        if (floor > t->served)
            t->served = floor;
    }
    t->waiting++;
    TAILQ_INSERT_TAIL(&q->items, item, link);
    q->n++;
    adm->waiting++;
    return 0;
}

void atc_admission_remove(struct atc_admission *adm, struct atc_queue_item *item)
{
    if (!item->queued)
        return;
    unlink_item(adm, item);
    forget_if_idle(adm, tenant_of(adm, item->tenant, false));
    adm->left_queue++;
}

void atc_admission_kick(struct atc_admission *adm)
{
    if (adm == NULL || adm->waiting == 0)
        return;
    if (adm->kicking) { /* a placement freed capacity while we were placing: go round again */
        adm->kick_again = true;
        return;
    }
    adm->kicking = true;
    do {
        adm->kick_again = false;
        uint64_t now = atc_mono_ms();
        for (struct model_queue *q = adm->queues; q != NULL; q = q->next) {
            struct atc_queue_item *it;
            while ((it = best_item(adm, q, now)) != NULL) {
                struct tenant *t = tenant_of(adm, it->tenant, false);
                /* Its process-wide place is kept until it is placed: released before, another worker
                 * could queue one more meanwhile (4 waiting under queue: 3, under TSan). */
                unlink_local(adm, it);
                uint64_t waited = now - it->enqueued_ms;
                char model[sizeof(it->model)]; /* (a placed request may end, and its item with it) */
                memcpy(model, it->model, sizeof(model));
                if (!adm->cb.try_place(it->owner)) {
                    /* No room yet: back in line, keeping its place (arrival time and deadline). */
                    it->queued = true;
                    TAILQ_INSERT_HEAD(&q->items, it, link);
                    q->n++;
                    adm->waiting++;
                    if (t != NULL)
                        t->waiting++;
                    break;
                }
                shared_release(adm, model);
                adm->admitted_queued++;
                count_wait(adm, waited);
                if (t != NULL)
                    t->served += 1.0 / t->weight;
                forget_if_idle(adm, t);
            }
        }
    } while (adm->kick_again);
    adm->kicking = false;
}

int atc_admission_top_priority(const struct atc_admission *adm)
{
    int top = -1;
    if (adm == NULL || adm->waiting == 0)
        return top;
    uint64_t now = atc_mono_ms();
    for (const struct model_queue *q = adm->queues; q != NULL && top < MAX_PRIORITY; q = q->next) {
        const struct atc_queue_item *it;
        TAILQ_FOREACH(it, &q->items, link)
        {
            int p = effective_priority(adm, it, now);
            if (p > top)
                top = p;
        }
    }
    return top;
}

size_t atc_admission_waiting(const struct atc_admission *adm)
{
    return adm != NULL ? adm->waiting : 0;
}

int atc_admission_retry_after(const struct atc_admission *adm)
{
    uint64_t s = adm->s.deadline_ms / 1000;
    return s < 1 ? 1 : (int)s;
}

void atc_admission_count_direct(struct atc_admission *adm)
{
    adm->admitted_direct++;
}

/* ---- one view over the admissions of every worker ----
 *
 * Each worker owns an admission; the admin API and /metrics show their sum: queues merged by model name
 * (in the order the first admission lists them, then those only later ones have), counters and wait
 * buckets added up. Called with the workers paused, so nothing here locks. */

/* Admission @p adm's queue for @p model, or NULL. */
static const struct model_queue *find_queue(const struct atc_admission *adm, const char *model)
{
    for (const struct model_queue *q = adm->queues; q != NULL; q = q->next)
        if (strcmp(q->model, model) == 0)
            return q;
    return NULL;
}

/* True when an admission before adms[i] has a queue for @p model (which was then shown with it). */
static bool shown_before(struct atc_admission *const *adms, size_t i, const char *model)
{
    for (size_t j = 0; j < i; j++)
        if (find_queue(adms[j], model) != NULL)
            return true;
    return false;
}

/* One model's queues, summed. */
struct queue_sum {
    unsigned waiting;
    unsigned by_prio[MAX_PRIORITY + 1];
    uint64_t oldest_ms; /* the longest wait now */
};

/* Sums the queues for @p model of adms[from..n): none of adms[0..from) has one. */
static void sum_queues(struct atc_admission *const *adms, size_t from, size_t n, const char *model,
                       uint64_t now, struct queue_sum *sum)
{
    *sum = (struct queue_sum){0};
    for (size_t i = from; i < n; i++) {
        const struct model_queue *q = find_queue(adms[i], model);
        if (q == NULL)
            continue;
        sum->waiting += q->n;
        const struct atc_queue_item *it;
        TAILQ_FOREACH(it, &q->items, link)
        {
            sum->by_prio[it->priority < 0 ? 0 : it->priority > MAX_PRIORITY ? MAX_PRIORITY : it->priority]++;
            if (now - it->enqueued_ms > sum->oldest_ms)
                sum->oldest_ms = now - it->enqueued_ms;
        }
    }
}

/* Calls @p fn once per model queued anywhere, with the sum of its queues. */
static void each_model(struct atc_admission *const *adms, size_t n, uint64_t now,
                       void (*fn)(const char *model, const struct queue_sum *sum, void *arg), void *arg)
{
    for (size_t i = 0; i < n; i++)
        for (const struct model_queue *q = adms[i]->queues; q != NULL; q = q->next) {
            if (shown_before(adms, i, q->model))
                continue;
            struct queue_sum sum;
            sum_queues(adms, i, n, q->model, now, &sum);
            fn(q->model, &sum, arg);
        }
}

/* Counters of every admission, summed. */
struct counter_sum {
    size_t waiting;
    uint64_t admitted_direct, admitted_queued, shed_full, shed_deadline, left_queue;
    uint64_t wait_counts[NBUCKETS + 1];
    uint64_t wait_sum_ms;
};

static void sum_counters(struct atc_admission *const *adms, size_t n, struct counter_sum *sum)
{
    *sum = (struct counter_sum){0};
    for (size_t i = 0; i < n; i++) {
        const struct atc_admission *adm = adms[i];
        sum->waiting += adm->waiting;
        sum->admitted_direct += adm->admitted_direct;
        sum->admitted_queued += adm->admitted_queued;
        sum->shed_full += adm->shed_full;
        sum->shed_deadline += adm->shed_deadline;
        sum->left_queue += adm->left_queue;
        for (size_t b = 0; b <= NBUCKETS; b++)
            sum->wait_counts[b] += adm->wait_counts[b];
        sum->wait_sum_ms += adm->wait_sum_ms;
    }
}

static void model_metrics(const char *model, const struct queue_sum *sum, void *arg)
{
    struct evbuffer *out = arg;
    for (int p = 0; p <= MAX_PRIORITY; p++) {
        evbuffer_add_printf(out, "atc_queue_waiting_requests{model=\"");
        atc_histogram_label(out, model);
        evbuffer_add_printf(out, "\",priority=\"%d\"} %u\n", p, sum->by_prio[p]);
    }
}

void atc_admission_metrics(struct atc_admission *const *adms, size_t n, struct evbuffer *out)
{
    evbuffer_add_printf(
        out, "# HELP atc_queue_waiting_requests Requests waiting for capacity, by model and priority.\n"
             "# TYPE atc_queue_waiting_requests gauge\n");
    each_model(adms, n, atc_mono_ms(), model_metrics, out);
    struct counter_sum c;
    sum_counters(adms, n, &c);
    evbuffer_add_printf(out,
                        "# HELP atc_queue_wait_seconds Time requests waited in the queue (placed or shed).\n"
                        "# TYPE atc_queue_wait_seconds histogram\n");
    uint64_t cumulative = 0;
    for (size_t b = 0; b < NBUCKETS; b++) {
        cumulative += c.wait_counts[b];
        evbuffer_add_printf(out, "atc_queue_wait_seconds_bucket{le=\"%g\"} %llu\n",
                            wait_buckets_ms[b] / 1000.0, (unsigned long long)cumulative);
    }
    cumulative += c.wait_counts[NBUCKETS];
    evbuffer_add_printf(
        out,
        "atc_queue_wait_seconds_bucket{le=\"+Inf\"} %llu\natc_queue_wait_seconds_sum %.3f\n"
        "atc_queue_wait_seconds_count %llu\n"
        "# HELP atc_admitted_total Requests routed, directly or after waiting.\n"
        "# TYPE atc_admitted_total counter\n"
        "atc_admitted_total{how=\"direct\"} %llu\natc_admitted_total{how=\"queued\"} %llu\n"
        "# HELP atc_shed_total Requests answered without being routed, by reason.\n"
        "# TYPE atc_shed_total counter\n"
        "atc_shed_total{reason=\"queue_full\"} %llu\natc_shed_total{reason=\"deadline\"} %llu\n"
        "atc_shed_total{reason=\"client_left\"} %llu\n",
        (unsigned long long)cumulative, c.wait_sum_ms / 1000.0, (unsigned long long)cumulative,
        (unsigned long long)c.admitted_direct, (unsigned long long)c.admitted_queued,
        (unsigned long long)c.shed_full, (unsigned long long)c.shed_deadline,
        (unsigned long long)c.left_queue);
}

struct json_models {
    struct evbuffer *out;
    bool first;
};

static void model_json(const char *model, const struct queue_sum *sum, void *arg)
{
    struct json_models *j = arg;
    evbuffer_add_printf(j->out, "%s{\"model\":\"", j->first ? "" : ",");
    atc_json_escape(j->out, model, strlen(model));
    evbuffer_add_printf(j->out, "\",\"waiting\":%u,\"oldest_ms\":%llu,\"by_priority\":[", sum->waiting,
                        (unsigned long long)sum->oldest_ms);
    for (int p = 0; p <= MAX_PRIORITY; p++)
        evbuffer_add_printf(j->out, "%s%u", p ? "," : "", sum->by_prio[p]);
    evbuffer_add(j->out, "]}", 2);
    j->first = false;
}

void atc_admission_status_json(struct atc_admission *const *adms, size_t n, struct evbuffer *out)
{
    struct counter_sum c;
    sum_counters(adms, n, &c);
    evbuffer_add_printf(out, "{\"waiting\":%zu,\"models\":[", c.waiting);
    struct json_models j = {out, true};
    each_model(adms, n, atc_mono_ms(), model_json, &j);
    evbuffer_add_printf(
        out,
        "],\"admitted_direct\":%llu,\"admitted_queued\":%llu,\"shed_queue_full\":%llu,"
        "\"shed_deadline\":%llu,\"left_queue\":%llu,\"wait_ms_sum\":%llu,\"wait_ms_buckets\":{",
        (unsigned long long)c.admitted_direct, (unsigned long long)c.admitted_queued,
        (unsigned long long)c.shed_full, (unsigned long long)c.shed_deadline,
        (unsigned long long)c.left_queue, (unsigned long long)c.wait_sum_ms);
    for (size_t b = 0; b <= NBUCKETS; b++) {
        if (b < NBUCKETS)
            evbuffer_add_printf(out, "%s\"%llu\":%llu", b ? "," : "", (unsigned long long)wait_buckets_ms[b],
                                (unsigned long long)c.wait_counts[b]);
        else
            evbuffer_add_printf(out, ",\"+Inf\":%llu", (unsigned long long)c.wait_counts[b]);
    }
    evbuffer_add(out, "}}", 2);
}
