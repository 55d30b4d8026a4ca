#ifndef ATC_ADMISSION_H
#define ATC_ADMISSION_H

/* Admission control: requests that cannot be placed now wait in a bounded queue per requested model,
 * ordered by priority (raised by ageing, so lower priorities are delayed, never starved), then by a
 * weighted fair share among tenants of the same priority, then by arrival. When capacity frees, the
 * best waiting request is offered to the router again; one that cannot be served by its deadline is
 * answered 503, and a full queue answers 429 at once. The queue owns no request: the relay embeds a
 * struct atc_queue_item and gets called back. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

struct event_base;
struct evbuffer;
struct atc_admission;
/* What the workers' admissions share so that admission.queue holds for the whole process: the number
 * of requests waiting per model in every worker's queue. Written by every worker (enqueue, and every
 * way out of a queue) under its own mutex; nothing else reads it. */
struct atc_admission_shared;

struct atc_admission_settings {
    unsigned max_queue;                  /* per model, in all the queues that share @p shared; 0 = no queue */
    struct atc_admission_shared *shared; /* borrowed; NULL: max_queue holds for this queue alone */
    uint64_t deadline_ms;                /* default wait */
    uint64_t max_deadline_ms;            /* the most a request may ask for (x-atc-deadline) */
    uint64_t aging_ms;                   /* waiting this long raises a request one priority level; 0 = off */
    const char *const *tenants;          /* tenant names with a weight (others weigh 1) */
    const unsigned *weights;
    size_t ntenants;
};

struct atc_queue_item {
    TAILQ_ENTRY(atc_queue_item) link;
    char model[256]; /* the requested model (aliases queue under their own name) */
    char tenant[64];
    int priority;
    uint64_t enqueued_ms, deadline_ms;
    void *owner;
    bool queued;
};

/* What the owner does when the queue calls. */
struct atc_admission_callbacks {
    /* Capacity may have freed: place @p owner now. Returns true when it left the queue for good
     * (placed, or answered), false to keep waiting. */
    bool (*try_place)(void *owner);
    /* Its deadline passed: answer 503 (the item is already out of the queue). */
    void (*expired)(void *owner, uint64_t waited_ms);
};

struct atc_admission *atc_admission_create(struct event_base *base, const struct atc_admission_settings *s,
                                           const struct atc_admission_callbacks *cb);
/** The count the workers' admissions share (one per process), or NULL out of memory. */
struct atc_admission_shared *atc_admission_shared_create(void);
/** Frees it, after every admission that borrowed it is destroyed. */
void atc_admission_shared_destroy(struct atc_admission_shared *sh);

/** Frees the queues; items still queued are dropped without callbacks (the owners are gone). */
void atc_admission_destroy(struct atc_admission *adm);

/** Queues @p item (model, tenant, priority and owner set by the caller) with a deadline of
 * @p deadline_ms from now (0: the default; capped at the maximum). Returns 0, or -1 when the model's
 * queue is full (the caller answers 429) or queueing is off. */
int atc_admission_enqueue(struct atc_admission *adm, struct atc_queue_item *item, uint64_t deadline_ms);

/** Takes @p item out of its queue (a client that left). No callback. */
void atc_admission_remove(struct atc_admission *adm, struct atc_queue_item *item);

/** Capacity freed somewhere: offers the best waiting request of each queue a place, until one stays. */
void atc_admission_kick(struct atc_admission *adm);

/** The highest effective priority (ageing included) of the requests waiting, or -1 when none wait. */
int atc_admission_top_priority(const struct atc_admission *adm);

/** Requests waiting now, in all queues. */
size_t atc_admission_waiting(const struct atc_admission *adm);

/** A Retry-After hint in seconds for a shed request (the default deadline, at least 1). */
int atc_admission_retry_after(const struct atc_admission *adm);

/* Each worker thread owns one admission (none of these functions locks). The two views below take all
 * of them at once, with the workers paused, and show their sum: one queue per model name (waiting
 * requests added up, by priority too; oldest_ms the longest wait in any), counters and wait buckets
 * added up. For n == 1 that is the admission as it is. */

/** A copy of @p adm's counters and queues (each item's priority and time queued) that the two functions
 * below read as they read an admission: made on the thread that owns @p adm (atc_workers_visit), read on
 * any other. Returns it (owned: atc_admission_copy_free), or NULL when out of memory. */
struct atc_admission *atc_admission_copy(const struct atc_admission *adm);
void atc_admission_copy_free(struct atc_admission *copy);

/** Appends {"waiting","models":[{"model","waiting","oldest_ms","by_priority":[10]}...],"admitted_direct",
 * "admitted_queued","shed_queue_full","shed_deadline","left_queue","wait_ms_sum","wait_ms_buckets":{...}}
 * for @p adms[0..n) (borrowed) to @p out. */
void atc_admission_status_json(struct atc_admission *const *adms, size_t n, struct evbuffer *out);

/** Appends the Prometheus metrics of @p adms[0..n) (borrowed): queue depth by model and priority, waits,
 * admitted and shed. */
void atc_admission_metrics(struct atc_admission *const *adms, size_t n, struct evbuffer *out);

/** Counts a request routed without waiting. */
void atc_admission_count_direct(struct atc_admission *adm);

#endif
