/* The two-stage request of a disaggregated model: disagg.h says what each protocol sends, and from which
 * sources. */

#include "proxy/disagg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "base/clock.h"
#include "base/json.h"
#include "base/log.h"
#include "config/config.h"
#include "config/roles.h"
#include "fleet/balancer.h"
#include "fleet/endpoint.h"
#include "ops/access_log.h"
#include "ops/metrics.h"
#include "ops/stage_metrics.h"
#include "policy/policy.h"
#include "http/upstream.h"
#include "proxy/worker.h"

#define MAX_PREFILL_TRIES 8
/* A prefill answer is one token and the transfer params: anything larger is not one. */
#define MAX_PREFILL_ANSWER (1024 * 1024)
#define MAX_BATCH 1024 /* SGLang: rooms in one body at most */

struct atc_disagg {
    const struct atc_disagg_request *rq;
    /* rq->model's name and protocol, kept: the model struct belongs to a table that an endpoint set change
     * may replace (and free) between two callbacks, so a retry looks the model up again by name. */
    char model[128];
    unsigned disaggregation;
    struct atc_endpoint *prefill; /* holds a slot while set */
    struct atc_endpoint *tried[MAX_PREFILL_TRIES]; /* prefill servers that failed this request */
    unsigned ntried, failures;
    unsigned nsent;    /* prefill requests sent (at most upstream.tries) */
    unsigned ndecode;  /* decode attempts made ready: each after the first is a retry */
    bool pair_pending; /* SGLang: the pair's prefill runs beside a decode attempt the relay holds */
    bool pair_again;   /* SGLang: the next attempt is the pair again because its prefill failed */
    struct atc_upstream_req *up; /* the prefill request in flight */
    int status;
    struct evbuffer *answer; /* vLLM: the prefill answer so far */
    char *decode_body;       /* the decode server's body of the last attempt */
    size_t decode_len;
    char *kv_params;    /* vLLM: the prefill answer's kv_transfer_params (JSON), kept for decode retries */
    char *prefill_body; /* what the prefill request in flight sends (borrowed by upstream.c until it ends) */
    size_t prefill_len;
    uint64_t t_sent_us, t_answered_us;
    atc_disagg_on_ready on_ready;
    void *arg;
    char prefill_id[128];
};

static void prefill_send(struct atc_disagg *dg);

static struct atc_stage_metrics *stages(const struct atc_disagg *dg)
{
    return atc_metrics_stages(dg->rq->w->metrics);
}

static enum atc_stage_failure failure_of(int status, enum atc_upstream_error err)
{
    if (status == 429)
        return ATC_STAGE_FAIL_HTTP_429;
    if (status >= 500)
        return ATC_STAGE_FAIL_HTTP_5XX;
    if (status > 0)
        return ATC_STAGE_FAIL_OTHER; /* a refused key */
    return atc_upstream_is_timeout(err) ? ATC_STAGE_FAIL_TIMEOUT : ATC_STAGE_FAIL_CONNECTION;
}

/* atc's key for the prefill server, else the decode server's (what the relay sends it). */
static const char *prefill_auth(const struct atc_disagg *dg)
{
    return dg->prefill->authorization != NULL ? dg->prefill->authorization : dg->rq->auth;
}

/* ---- the body, member by member ---- */

/* Copies the top-level members of the object @p body into @p out but those named in @p drop (NULL-ended),
 * then appends @p extra (",\"key\":value..." or "") and the closing brace. -1 when @p body is not an
 * object. */
static int rewrite(struct evbuffer *out, const char *body, size_t len, const char *const *drop,
                   const char *extra)
{
    struct atc_json j = {0};
    if (atc_json_parse(&j, body, len, NULL) < 0 || atc_json_type(&j, 0) != ATC_JSON_OBJECT) {
        atc_json_dispose(&j);
        return -1;
    }
    bool first = true;
    int n = atc_json_count(&j, 0);
    evbuffer_add(out, "{", 1);
    for (int k = 0, key = 1; k < n; k++, key = atc_json_next(&j, key)) {
        bool dropped = false;
        for (size_t d = 0; drop[d] != NULL && !dropped; d++)
            dropped = atc_json_is(&j, key, drop[d]);
        if (dropped)
            continue;
        size_t klen, vlen;
        const char *kraw = atc_json_raw(&j, key, &klen), *vraw = atc_json_raw(&j, key + 1, &vlen);
        const char *start = kraw - 1; /* its opening quote */
        const char *end = vraw + vlen + (atc_json_type(&j, key + 1) == ATC_JSON_STRING); /* and closing */
        if (!first)
            evbuffer_add(out, ",", 1);
        evbuffer_add(out, start, (size_t)(end - start));
        first = false;
    }
    atc_json_dispose(&j);
    evbuffer_add(out, first && extra[0] == ',' ? extra + 1 : extra,
                 strlen(first && extra[0] == ',' ? extra + 1 : extra));
    evbuffer_add(out, "}", 1);
    return 0;
}

static int take_body(struct evbuffer *b, char **out, size_t *len)
{
    free(*out);
    *len = evbuffer_get_length(b);
    *out = malloc(*len + 1);
    if (*out != NULL) {
        evbuffer_remove(b, *out, *len);
        (*out)[*len] = '\0';
    }
    evbuffer_free(b);
    return *out != NULL ? 0 : -1;
}

/* SGLang's batch size (pd_router.rs get_*_batch_size): a completion's prompt array, or a chat's n > 1. */
static unsigned batch_size(const char *body, size_t len)
{
    struct atc_json j = {0};
    unsigned n = 0;
    uint64_t v;
    if (atc_json_parse(&j, body, len, NULL) == 0 && atc_json_type(&j, 0) == ATC_JSON_OBJECT) {
        int prompt = atc_json_get(&j, 0, "prompt"), choices = atc_json_get(&j, 0, "n");
        if (atc_json_type(&j, prompt) == ATC_JSON_ARRAY && atc_json_type(&j, prompt + 1) == ATC_JSON_STRING)
            n = (unsigned)atc_json_count(&j, prompt);
        else if (atc_json_uint(&j, choices, MAX_BATCH, &v) && v > 1)
            n = (unsigned)v;
    }
    atc_json_dispose(&j);
    return n < MAX_BATCH ? n : MAX_BATCH;
}

/* ---- the prefill server ---- */

/* Frees the prefill server's slot; @p ok its outcome (passive health), < 0 none (cancelled). */
static void release_prefill(struct atc_disagg *dg, int ok)
{
    if (dg->prefill == NULL)
        return;
    struct atc_worker *w = dg->rq->w;
    bool had_errors = dg->prefill->consecutive_errors > 0;
    if (ok >= 0) {
        atc_endpoint_record(dg->prefill, ok, -1);
        atc_worker_observe(w, dg->prefill, ok, had_errors);
    }
    if (dg->rq->rreq != NULL && w->policy != NULL) /* the prompt's KV, sent on: free there now */
        atc_policy_released(w->policy, dg->rq->rreq->features, dg->rq->rreq->block_tokens, dg->prefill, 0);
    atc_endpoint_release(dg->prefill, dg->rq->tokens);
    dg->prefill = NULL;
    atc_worker_capacity_freed(w);
}

/* Takes a slot on a prefill server not tried yet; false when none can take it or no tries are left. */
static bool pick_prefill(struct atc_disagg *dg)
{
    const struct atc_disagg_request *rq = dg->rq;
    unsigned tries = rq->w->cfg->upstream.tries;
    struct atc_endpoint *want = rq->prefill;
    const struct atc_model *m = atc_endpoint_table_model(rq->w->table, dg->model, strlen(dg->model));
    for (unsigned i = 0; want != NULL && i < dg->ntried; i++)
        want = dg->tried[i] == want ? NULL : want; /* the policy's pick failed once: the C balancer's now */
    bool listed = false; /* (and only while it is still in the table: it may have been removed since) */
    for (size_t i = 0; want != NULL && m != NULL && i < m->nendpoints; i++)
        listed |= m->endpoints[i] == want;
    want = listed ? want : NULL;
    for (int round = 0; round < 3 && dg->nsent < tries && dg->ntried < MAX_PREFILL_TRIES; round++) {
        struct atc_endpoint *ep = want != NULL ? want
                                  : m == NULL  ? NULL /* the model left the config */
                                              : atc_balancer_pick_stage(m, &rq->w->rng, dg->tried, dg->ntried,
                                                                        rq->tokens, ATC_ROLE_PREFILL);
        want = NULL;
        if (ep == NULL)
            return false;
        if (!atc_endpoint_try_acquire(ep, rq->tokens))
            continue; /* another worker took its last slot: pick again */
        dg->prefill = ep;
        dg->nsent++;
        /* The prefill server computes (and caches) the prompt, as the decode server does once the KV
         * arrives: both hold its blocks, so both go into the prefix index the next pick reads. */
        if (rq->rreq != NULL && rq->w->policy != NULL)
            atc_policy_routed(rq->w->policy, rq->rreq, ep);
        snprintf(dg->prefill_id, sizeof(dg->prefill_id), "%s", ep->id);
        return true;
    }
    return false;
}

/* Counts a failure of the prefill stage on dg->prefill (@p why), which is not tried again. */
static void count_prefill_failure(struct atc_disagg *dg, const char *why, enum atc_stage_failure reason)
{
    atc_warn("prefill server %s: %s", dg->prefill != NULL ? dg->prefill->id : "-", why);
    atc_stage_failed(stages(dg), dg->model, ATC_STAGE_PREFILL, reason);
    if (dg->prefill != NULL && dg->ntried < MAX_PREFILL_TRIES)
        dg->tried[dg->ntried++] = dg->prefill;
    release_prefill(dg, false);
    dg->failures++;
}

/* The prefill stage failed on dg->prefill: another prefill server, or the relay is told. */
static void prefill_failed(struct atc_disagg *dg, const char *why, enum atc_stage_failure reason)
{
    count_prefill_failure(dg, why, reason);
    if (pick_prefill(dg)) {
        atc_stage_retried(stages(dg), dg->model, ATC_STAGE_PREFILL);
        prefill_send(dg);
        return;
    }
    dg->on_ready(dg->arg, why);
}

static void on_prefill_headers(void *arg, const struct atc_upstream_response *resp)
{
    struct atc_disagg *dg = arg;
    dg->status = resp->status;
}

static void on_prefill_body(void *arg, const char *data, size_t len)
{
    struct atc_disagg *dg = arg;
    if (dg->answer != NULL && evbuffer_get_length(dg->answer) + len <= MAX_PREFILL_ANSWER)
        evbuffer_add(dg->answer, data, len);
}

/* vLLM: the prefill answer's kv_transfer_params, into the client's body for the decode server. */
static const char *decode_body_vllm(struct atc_disagg *dg)
{
    static const char *const drop[] = {"kv_transfer_params", NULL};
    struct evbuffer *b = evbuffer_new(), *extra = evbuffer_new();
    const char *why = "out of memory";
    if (b == NULL || extra == NULL)
        goto out;
    evbuffer_add_printf(extra, ",\"kv_transfer_params\":%s", dg->kv_params);
    evbuffer_add(extra, "", 1);
    why = rewrite(b, dg->rq->body, dg->rq->len, drop, (const char *)evbuffer_pullup(extra, -1)) < 0
              ? "the request body is not a JSON object"
              : NULL;
    if (why == NULL && take_body(b, &dg->decode_body, &dg->decode_len) < 0)
        why = "out of memory";
    b = NULL;
out:
    if (b != NULL)
        evbuffer_free(b);
    if (extra != NULL)
        evbuffer_free(extra);
    return why;
}

static void on_prefill_done(void *arg)
{
    struct atc_disagg *dg = arg;
    dg->up = NULL;
    if (dg->status != 200) {
        char why[64];
        snprintf(why, sizeof(why), "the prefill server answered %d", dg->status);
        if (dg->status >= 500 || dg->status == 429) {
            prefill_failed(dg, "the prefill server failed", failure_of(dg->status, 0));
            return;
        }
        release_prefill(dg, true); /* the request's fault (a 4xx): no other server will do better */
        dg->on_ready(dg->arg, "the prefill server refused the request");
        return;
    }
    struct atc_json j = {0};
    size_t n = evbuffer_get_length(dg->answer), plen = 0;
    const char *text = (const char *)evbuffer_pullup(dg->answer, -1);
    int kv =
        atc_json_parse(&j, text != NULL ? text : "", n, NULL) == 0 && atc_json_type(&j, 0) == ATC_JSON_OBJECT
            ? atc_json_get(&j, 0, "kv_transfer_params")
            : -1;
    const char *params = atc_json_type(&j, kv) == ATC_JSON_OBJECT ? atc_json_raw(&j, kv, &plen) : NULL;
    free(dg->kv_params);
    dg->kv_params = params != NULL ? strndup(params, plen) : NULL;
    atc_json_dispose(&j);
    evbuffer_drain(dg->answer, n);
    if (dg->kv_params == NULL) { /* not a NixlConnector prefill server: its KV cannot reach decode */
        prefill_failed(dg, "the prefill answer has no kv_transfer_params", ATC_STAGE_FAIL_NO_KV_PARAMS);
        return;
    }
    dg->t_answered_us = atc_mono_us();
    release_prefill(dg, true);
    dg->on_ready(dg->arg, decode_body_vllm(dg));
}

static void on_prefill_error(void *arg, enum atc_upstream_error err, bool got_response)
{
    struct atc_disagg *dg = arg;
    (void)got_response;
    dg->up = NULL;
    prefill_failed(dg, atc_upstream_strerror(err), failure_of(0, err));
}

static const struct atc_upstream_callbacks prefill_cb = {
    .on_headers = on_prefill_headers,
    .on_body = on_prefill_body,
    .on_done = on_prefill_done,
    .on_error = on_prefill_error,
};

/* SGLang: the pair's prefill failed. It counts against the prefill server, which is not tried again, and
 * the relay is told while it holds the decode attempt: before decode's first byte it sends the pair again
 * (a new room), as pd_router.rs retries a failed dual dispatch; after, decode's answer goes on. */
static void sglang_failed(struct atc_disagg *dg, const char *why, enum atc_stage_failure reason)
{
    count_prefill_failure(dg, why, reason);
    if (dg->pair_pending) {
        dg->pair_pending = false;
        dg->pair_again = true;
        dg->on_ready(dg->arg, why);
    }
}

/* SGLang's prefill answer is not used: read and dropped (pd_router.rs relays decode's). */
static void on_sglang_done(void *arg)
{
    struct atc_disagg *dg = arg;
    dg->up = NULL;
    if (dg->status >= 500 || dg->status == 429) {
        sglang_failed(dg, "the prefill server failed", failure_of(dg->status, 0));
        return;
    }
    release_prefill(dg, true);
}

static void on_sglang_error(void *arg, enum atc_upstream_error err, bool got_response)
{
    struct atc_disagg *dg = arg;
    (void)got_response;
    dg->up = NULL;
    sglang_failed(dg, atc_upstream_strerror(err), failure_of(0, err));
}

static void on_ignore_body(void *arg, const char *data, size_t len)
{
    (void)arg, (void)data, (void)len;
}

static const struct atc_upstream_callbacks sglang_cb = {
    .on_headers = on_prefill_headers,
    .on_body = on_ignore_body,
    .on_done = on_sglang_done,
    .on_error = on_sglang_error,
};

/* vLLM: the prefill server's body (toy_proxy_server.py send_request_to_service). */
static void prefill_send(struct atc_disagg *dg)
{
    static const char *const drop[] = {"kv_transfer_params",
                                       "stream",
                                       "max_tokens",
                                       "max_completion_tokens",
                                       "stream_options",
                                       "min_tokens",
                                       "min_completion_tokens",
                                       NULL};
    const struct atc_disagg_request *rq = dg->rq;
    struct evbuffer *b = evbuffer_new();
    bool had_mct = strstr(rq->body, "\"max_completion_tokens\"") != NULL; /* set to 1 only if it was there */
    char extra[320];
    snprintf(extra, sizeof(extra),
             ",\"kv_transfer_params\":{\"do_remote_decode\":true,\"do_remote_prefill\":false,"
             "\"remote_engine_id\":null,\"remote_block_ids\":null,\"remote_host\":null,\"remote_port\":null},"
             "\"stream\":false,\"max_tokens\":1%s",
             had_mct ? ",\"max_completion_tokens\":1" : "");
    int rc = b != NULL ? rewrite(b, rq->body, rq->len, drop, extra) : -1;
    if (rc < 0 && b != NULL)
        evbuffer_free(b);
    if (rc < 0 || take_body(b, &dg->prefill_body, &dg->prefill_len) < 0) {
        release_prefill(dg, true);
        dg->on_ready(dg->arg, rc < 0 ? "the request body is not a JSON object" : "out of memory");
        return;
    }
    dg->status = 0;
    if (dg->t_sent_us == 0)
        dg->t_sent_us = atc_mono_us();
    dg->up = atc_upstream_send_as(dg->prefill->pools[rq->w->id], "POST", rq->path, rq->headers,
                                  prefill_auth(dg), dg->prefill_body, dg->prefill_len, &prefill_cb, dg);
    if (dg->up == NULL)
        prefill_failed(dg, "out of memory", ATC_STAGE_FAIL_OTHER);
}

/* SGLang: the bootstrap fields into the body, which goes to the prefill server now and is the decode
 * server's (pd_router.rs inject_bootstrap_into_value: a room per item of a batch). */
static int sglang_attempt(struct atc_disagg *dg, const char **err)
{
    static const char *const drop[] = {"bootstrap_host", "bootstrap_port", "bootstrap_room", NULL};
    const struct atc_disagg_request *rq = dg->rq;
    unsigned n = batch_size(rq->body, rq->len);
    struct evbuffer *extra = evbuffer_new(), *b = evbuffer_new();
    *err = "out of memory";
    if (extra == NULL || b == NULL)
        goto error;
    const char *host = dg->prefill->host;
    for (int field = 0; field < 3; field++) {
        static const char *const names[] = {"bootstrap_host", "bootstrap_port", "bootstrap_room"};
        evbuffer_add_printf(extra, ",\"%s\":%s", names[field], n ? "[" : "");
        for (unsigned i = 0; i < (n ? n : 1); i++) {
            if (i > 0)
                evbuffer_add(extra, ",", 1);
            if (field == 0)
                atc_json_write_string(extra, host);
            else if (field == 1)
                evbuffer_add_printf(extra, "%u", (unsigned)dg->prefill->bootstrap_port);
            else /* pd_types.rs generate_room_id: random below 2^63 */
                evbuffer_add_printf(extra, "%llu", (unsigned long long)(atc_random_next(&rq->w->rng) >> 1));
        }
        if (n)
            evbuffer_add(extra, "]", 1);
    }
    evbuffer_add(extra, "", 1);
    if (rewrite(b, rq->body, rq->len, drop, (const char *)evbuffer_pullup(extra, -1)) < 0) {
        *err = "the request body is not a JSON object";
        goto error;
    }
    evbuffer_free(extra);
    extra = NULL;
    if (take_body(b, &dg->decode_body, &dg->decode_len) < 0)
        return -1;
    dg->status = 0;
    dg->t_sent_us = atc_mono_us();
    /* The same body to both: it is the decode body too, and lives as long as dg. */
    dg->up = atc_upstream_send_as(dg->prefill->pools[rq->w->id], "POST", rq->path, rq->headers,
                                  prefill_auth(dg), dg->decode_body, dg->decode_len, &sglang_cb, dg);
    if (dg->up == NULL) {
        release_prefill(dg, true);
        return -1;
    }
    dg->pair_pending = true;
    *err = NULL;
    return 0;
error:
    if (extra != NULL)
        evbuffer_free(extra);
    if (b != NULL)
        evbuffer_free(b);
    release_prefill(dg, true);
    return -1;
}

int atc_disagg_attempt(struct atc_disagg **dgp, const struct atc_disagg_request *rq,
                       struct atc_endpoint *decode, atc_disagg_on_ready on_ready, void *arg, const char **err)
{
    struct atc_disagg *dg = *dgp;
    (void)decode;
    if (dg == NULL && (dg = *dgp = calloc(1, sizeof(*dg))) != NULL)
        dg->answer = evbuffer_new();
    if (dg == NULL || dg->answer == NULL) {
        *err = "out of memory";
        return -1;
    }
    dg->rq = rq;
    snprintf(dg->model, sizeof(dg->model), "%s", rq->model->name);
    dg->disaggregation = rq->model->disaggregation;
    dg->on_ready = on_ready;
    dg->arg = arg;
    dg->pair_pending = false;
    if (dg->ndecode++ > 0) /* the relay tries another decode server (SGLang: the pair again) */
        atc_stage_retried(stages(dg), dg->model, dg->pair_again ? ATC_STAGE_PREFILL : ATC_STAGE_DECODE);
    dg->pair_again = false;
    if (dg->disaggregation == ATC_DISAGG_VLLM && dg->kv_params != NULL)
        return 0;         /* a decode retry: the prefill server still holds the blocks for these params */
    if (dg->up != NULL) { /* SGLang: the last pair's prefill, whose decode failed */
        atc_upstream_cancel(dg->up);
        dg->up = NULL;
        release_prefill(dg, -1);
    }
    if (!pick_prefill(dg)) {
        *err = "no prefill server can take the request now";
        return -1;
    }
    if (dg->disaggregation == ATC_DISAGG_SGLANG)
        return sglang_attempt(dg, err);
    prefill_send(dg);
    return 1;
}

void atc_disagg_body(const struct atc_disagg *dg, const char **body, size_t *len)
{
    *body = dg->decode_body;
    *len = dg->decode_len;
}

void atc_disagg_decode_failed(struct atc_disagg *dg, int status, enum atc_upstream_error err)
{
    if (dg != NULL)
        atc_stage_failed(stages(dg), dg->model, ATC_STAGE_DECODE, failure_of(status, err));
}

void atc_disagg_log(struct atc_disagg *dg, struct atc_access_record *rec, uint64_t first_us)
{
    if (dg == NULL)
        return;
    dg->pair_pending = false; /* the relay ends */
    rec->prefill_endpoint = dg->prefill_id;
    rec->prefill_ms = dg->t_answered_us ? (double)(dg->t_answered_us - dg->t_sent_us) / 1000.0 : -1;
    /* SGLang's stages overlap: its decode waits from the send of both */
    uint64_t from = dg->t_answered_us ? dg->t_answered_us : dg->t_sent_us;
    rec->decode_first_ms = first_us > from && from != 0 ? (double)(first_us - from) / 1000.0 : -1;
    atc_stage_times(stages(dg), dg->model, rec->prefill_ms >= 0 ? rec->prefill_ms / 1000.0 : -1,
                    rec->decode_first_ms >= 0 ? rec->decode_first_ms / 1000.0 : -1);
}

void atc_disagg_free(struct atc_disagg *dg)
{
    if (dg == NULL)
        return;
    if (dg->up != NULL)
        atc_upstream_cancel(dg->up);
    release_prefill(dg, -1);
    if (dg->answer != NULL)
        evbuffer_free(dg->answer);
    free(dg->decode_body);
    free(dg->kv_params);
    free(dg->prefill_body);
    free(dg);
}

const struct atc_model *atc_disagg_model(const struct atc_endpoint_table *t, const struct atc_endpoint *ep)
{
    const struct atc_model *m = atc_endpoint_table_model(t, ep->model, strlen(ep->model));
    return m != NULL && m->disaggregation != ATC_DISAGG_NONE ? m : NULL;
}

bool atc_disagg_prefill_room(struct atc_worker *w, const struct atc_endpoint *decode, uint64_t tokens)
{
    const struct atc_model *m = atc_disagg_model(w->table, decode);
    return m == NULL || atc_balancer_pick_stage(m, &w->rng, NULL, 0, tokens, ATC_ROLE_PREFILL) != NULL;
}
