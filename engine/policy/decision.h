#ifndef ATC_POLICY_DECISION_H
#define ATC_POLICY_DECISION_H

/* The record of one routing decision: which version decided, what kind of decision it was, where the
 * request went and why, and the per-candidate scores a policy attached with atc.explain(ep, score, note).
 * The relay fills one per request; the access log, the trace recorder and (when policy.explain allows
 * and the client sent x-atc-explain: 1) a response header print it with atc_decision_record_json.
 *
 * Scores are collected only when someone asks (struct atc_route_request.explain not NULL): otherwise
 * atc.explain returns at once, so a policy that explains costs nothing when nobody reads it. */

#include <stdbool.h>
#include <stdint.h>

#include "policy/policy.h"

struct evbuffer;

#define ATC_EXPLAIN_MAX 8 /* scores kept per decision; more are counted in .dropped */

/* Room for an endpoint id in a record, NUL included; a longer id is cut (the affinity table and the
 * cluster refuse ids longer than 128 bytes: fleet/affinity.h). A record is read when its request ends,
 * and an endpoint it names but the request does not hold (a candidate scored and not picked, the prefill
 * server, the shadow's pick) may have been removed and freed by then: ids are copied, never borrowed. */
#define ATC_DECISION_ID_SIZE 129

struct atc_explain_score {
    double score;
    char endpoint[ATC_DECISION_ID_SIZE]; /* the endpoint's id (copied, cut) */
    char note[48];                       /* printable ASCII, cut */
};

/* What atc.explain collects during one decision; reset by each decision. */
struct atc_explain {
    unsigned n, dropped;
    struct atc_explain_score s[ATC_EXPLAIN_MAX];
};

struct atc_decision_record {
    uint64_t version;     /* the version that decided (0: no policy, the C balancer routes) */
    const char *kind;     /* atc_decision_kind_name's, or atc_decision_balancer (no policy) */
    const char *endpoint; /* where the request went, NULL when it went nowhere (an endpoint the request
                           * holds: borrowed) */
    char prefill[ATC_DECISION_ID_SIZE]; /* a disaggregated model: the prefill server the policy chose
                                         * (copied, cut), else "" */
    char reason[128]; /* fallback: why ("error", "overrun", "memory", "invalid_return"); queue or
                       * reject: the verdict's message; else "" */
    bool canary;      /* the version deciding was a canary (policy/canary.h) */
    const struct atc_explain *scores; /* NULL: none collected */
    /* The shadow's pick on the same request (policy/shadow.h); shadow_version 0: no shadow ran. */
    uint64_t shadow_version;
    const char *shadow_kind;
    char shadow_endpoint[ATC_DECISION_ID_SIZE]; /* (copied, cut) "": none */
};

/** A decision kind's one name wherever a decision is printed or handed to Lua (the access log's and the
 * traces' decision, x-atc-decision, x-atc-explain, t.route, t.replay): "endpoint" (the policy picked
 * one), "queue", "reject" or "fallback" (the policy failed: the C balancer routed). Interned: the same
 * pointer for the same kind, so a record's kind is compared by pointer. */
const char *atc_decision_kind_name(enum atc_decision_kind kind);

/* The kind of a request routed with no policy configured (the C balancer), beside those above. */
extern const char atc_decision_balancer[];

/** The decision record's word for a fallback reason (atc_policy_fallback_*): the reason as it is
 * ("overrun" for a budget overrun), "error" for NULL. */
const char *atc_decision_reason_name(const char *fallback_reason);

/** Fills @p rec from decision @p d (its strings are static or copied, but for endpoint, borrowed from the
 * endpoint the request holds, and @p scores, which must outlive @p rec's use). Leaves the shadow's fields
 * as they are. */
void atc_decision_record_set(struct atc_decision_record *rec, const struct atc_decision *d,
                             const struct atc_explain *scores);

/** Appends @p rec as one JSON object (one line, safe in an HTTP header value). */
void atc_decision_record_json(const struct atc_decision_record *rec, struct evbuffer *out);

/** Appends @p x's scores as a JSON array of {"endpoint", "score", "note"}. */
void atc_explain_json(const struct atc_explain *x, struct evbuffer *out);

/** Adds a score to @p x (the endpoint's id copied and cut to ATC_DECISION_ID_SIZE, the note cut and made
 * printable), or counts it as dropped when full. */
void atc_explain_add(struct atc_explain *x, const char *endpoint, double score, const char *note);

#endif
