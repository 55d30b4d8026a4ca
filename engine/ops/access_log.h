#ifndef ATC_ACCESS_LOG_H
#define ATC_ACCESS_LOG_H

/* The access log: one JSON line per request, buffered in memory and written from a timer so the event
 * loop never waits on the disk; reopened on SIGUSR1 (for logrotate). A write that fails is counted and
 * logged, never fatal. */

#include <stdbool.h>
#include <stdint.h>

struct event_base;
struct evbuffer;
struct atc_access_log;
struct atc_decision_record;

/** Opens @p path for appending ("stderr" writes to standard error). NULL and errno on failure. */
struct atc_access_log *atc_access_log_open(struct event_base *base, const char *path);
/** Flushes and closes. */
void atc_access_log_close(struct atc_access_log *log);
/* What one request's line says. Strings may be NULL or "" (written as null). */
struct atc_access_record {
    const char *id, *model, *tenant, *session, *endpoint, *error;
    int priority, status; /* status as the client saw it; 499 when it left first */
    uint64_t policy_version;
    bool stream;
    double ttft_ms; /* < 0: none */
    double total_ms;
    uint32_t prompt_tokens;
    int64_t max_tokens; /* < 0: not set */
    unsigned retries;
    uint64_t bytes, sse_events;
    /* the answer's own usage (its "usage" object), when @p usage: written as
     * "usage":{"prompt_tokens":..,"completion_tokens":..,"cached_tokens":..} beside the estimate above,
     * each -1 (null) when it was not in the object; else "usage":null */
    bool usage;
    int64_t usage_prompt_tokens, usage_completion_tokens, usage_cached_tokens;
    /* the decision that routed it: kind and reason always, the whole record (scores, the shadow's pick)
     * when it has scores or a shadow ran; NULL: none (no policy) */
    const struct atc_decision_record *decision;
    /* a disaggregated model's two stages (proxy/disagg.c): the prefill server (NULL: not disaggregated),
     * the prefill's ms from its send to its answer, and from that answer to the first token the client
     * saw (the KV's transfer and the decode server's first step); < 0: not known */
    const char *prefill_endpoint;
    double prefill_ms, decode_first_ms;
};

/** Appends @p r as one JSON line. */
void atc_access_log_request(struct atc_access_log *log, const struct atc_access_record *r);

/** Reopens the file (after logrotate moved it). 0 or -1. */
int atc_access_log_reopen(struct atc_access_log *log);

#endif
