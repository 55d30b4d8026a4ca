/* The decision record (see decision.h). */

#include "policy/decision.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include <event2/buffer.h>

#include "base/strbuf.h"
#include "fleet/endpoint.h"
#include "base/json.h"

static const char *const kind_names[] = {
    [ATC_DECISION_ENDPOINT] = "endpoint",
    [ATC_DECISION_QUEUE] = "queue",
    [ATC_DECISION_REJECT] = "reject",
    [ATC_DECISION_FALLBACK] = "fallback",
};

const char atc_decision_balancer[] = "balancer";

const char *atc_decision_kind_name(enum atc_decision_kind kind)
{
    return (unsigned)kind < sizeof(kind_names) / sizeof(kind_names[0]) ? kind_names[kind]
                                                                       : kind_names[ATC_DECISION_FALLBACK];
}

const char *atc_decision_reason_name(const char *fallback_reason)
{
    /* The reasons are printable as they are (atc_policy_fallback_budget is "overrun" everywhere). */
    return fallback_reason != NULL ? fallback_reason : atc_policy_fallback_error;
}

void atc_decision_record_set(struct atc_decision_record *rec, const struct atc_decision *d,
                             const struct atc_explain *scores)
{
    rec->version = d->version;
    rec->kind = atc_decision_kind_name(d->kind);
    rec->endpoint = d->kind == ATC_DECISION_ENDPOINT && d->endpoint != NULL ? d->endpoint->id : NULL;
    atc_strlcpy(rec->prefill, sizeof(rec->prefill),
                d->kind == ATC_DECISION_ENDPOINT && d->prefill != NULL ? d->prefill->id : "");
    const char *reason = d->kind == ATC_DECISION_FALLBACK  ? atc_decision_reason_name(d->reason)
                         : d->kind == ATC_DECISION_ENDPOINT ? ""
                                                            : d->message;
    atc_strlcpy(rec->reason, sizeof(rec->reason), reason);
    rec->canary = d->canary;
    rec->scores = scores != NULL && scores->n + scores->dropped > 0 ? scores : NULL;
}

/* ,"key":"value" (or null): the record's fields after its first. */
static void json_string(struct evbuffer *out, const char *key, const char *value)
{
    evbuffer_add(out, ",", 1);
    atc_json_key_string(out, key, value);
}

void atc_explain_json(const struct atc_explain *x, struct evbuffer *out)
{
    evbuffer_add(out, "[", 1);
    for (unsigned i = 0; i < x->n; i++) {
        const struct atc_explain_score *s = &x->s[i];
        evbuffer_add_printf(out, "%s{\"endpoint\":\"", i ? "," : "");
        atc_json_escape(out, s->endpoint, strlen(s->endpoint));
        /* %.6g of a finite number is valid JSON; NaN and infinities are not */
        if (isfinite(s->score))
            evbuffer_add_printf(out, "\",\"score\":%.6g", s->score);
        else
            evbuffer_add_printf(out, "\",\"score\":null");
        if (s->note[0] != '\0')
            json_string(out, "note", s->note);
        evbuffer_add(out, "}", 1);
    }
    evbuffer_add(out, "]", 1);
}

void atc_decision_record_json(const struct atc_decision_record *rec, struct evbuffer *out)
{
    evbuffer_add_printf(out, "{\"version\":%llu", (unsigned long long)rec->version);
    json_string(out, "kind", rec->kind);
    json_string(out, "endpoint", rec->endpoint);
    if (rec->prefill[0] != '\0')
        json_string(out, "prefill", rec->prefill);
    json_string(out, "reason", rec->reason[0] != '\0' ? rec->reason : NULL);
    if (rec->canary)
        evbuffer_add_printf(out, ",\"canary\":true");
    if (rec->scores != NULL) {
        evbuffer_add_printf(out, ",\"scores\":");
        atc_explain_json(rec->scores, out);
        if (rec->scores->dropped > 0)
            evbuffer_add_printf(out, ",\"scores_dropped\":%u", rec->scores->dropped);
    }
    if (rec->shadow_version != 0) {
        evbuffer_add_printf(out, ",\"shadow\":{\"version\":%llu", (unsigned long long)rec->shadow_version);
        json_string(out, "kind", rec->shadow_kind);
        json_string(out, "endpoint", rec->shadow_endpoint[0] != '\0' ? rec->shadow_endpoint : NULL);
        evbuffer_add(out, "}", 1);
    }
    evbuffer_add(out, "}", 1);
}

void atc_explain_add(struct atc_explain *x, const char *endpoint, double score, const char *note)
{
    if (x->n == ATC_EXPLAIN_MAX) {
        x->dropped++;
        return;
    }
    struct atc_explain_score *s = &x->s[x->n++];
    atc_strlcpy(s->endpoint, sizeof(s->endpoint), endpoint);
    s->score = score;
    size_t k = 0;
    for (; note != NULL && note[k] != '\0' && k + 1 < sizeof(s->note); k++)
        s->note[k] = note[k] >= 0x20 && note[k] < 0x7f ? note[k] : '?';
    s->note[k] = '\0';
}
