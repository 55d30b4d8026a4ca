/* The simulated server's side of prefill/decode disaggregation: sim_disagg.h says what each role takes and
 * answers, and from which sources. */

#include "sim/sim_disagg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "base/json.h"
#include "config/roles.h"
#include "http/http_server.h"

#define LOG_SIZE 64               /* requests GET /sim/disagg lists, the last ones */
#define LOG_TEXT 1024             /* of each, what it carried (kv_transfer_params or bootstrap_room), cut */
#define MAX_BLOCK_IDS 1024        /* remote_block_ids listed in an answer at most */
#define BLOCK_TOKENS 16           /* vLLM's block size, as remote_block_ids count them */

struct seen {
    int64_t max_tokens;
    bool stream;
    char carried[LOG_TEXT]; /* the raw JSON of kv_transfer_params, or of bootstrap_room */
};

struct atc_sim_disagg {
    const struct atc_sim_params *p;
    struct seen log[LOG_SIZE];
    uint64_t nseen;   /* requests checked, total: log[(nseen - 1) % LOG_SIZE] is the last */
    uint64_t aborted; /* of those, the ones whose client (atc) left before the answer ended */
};

uint64_t atc_sim_transfer_us(const struct atc_sim_params *p, uint32_t prompt_tokens)
{
    double bytes = p->kv_bytes_per_token > 0 ? p->kv_bytes_per_token : ATC_SIM_KV_BYTES_PER_TOKEN;
    double gbps = p->transfer_gbps > 0 ? p->transfer_gbps : ATC_SIM_TRANSFER_GBPS;
    return (uint64_t)(bytes * prompt_tokens / (gbps * 1e9) * 1e6);
}

struct atc_sim_disagg *atc_sim_disagg_create(const struct atc_sim_params *p)
{
    struct atc_sim_disagg *d = calloc(1, sizeof(*d));
    if (d != NULL)
        d->p = p;
    return d;
}

void atc_sim_disagg_free(struct atc_sim_disagg *d)
{
    free(d);
}

void atc_sim_disagg_gone(struct atc_sim_disagg *d)
{
    if (d->p->role != ATC_ROLE_BOTH)
        d->aborted++;
}

static void note(struct atc_sim_disagg *d, const struct atc_json *j, int carried, int64_t max_tokens,
                 bool stream)
{
    struct seen *s = &d->log[d->nseen++ % LOG_SIZE];
    size_t n = 0;
    const char *raw = carried >= 0 ? atc_json_raw(j, carried, &n) : NULL;
    s->max_tokens = max_tokens;
    s->stream = stream;
    snprintf(s->carried, sizeof(s->carried), "%.*s", raw != NULL ? (int)n : 4, raw != NULL ? raw : "null");
}

/* A number, or a non-empty array of numbers (SGLang's batch form). */
static bool numbers(const struct atc_json *j, int i)
{
    double v;
    if (atc_json_type(j, i) != ATC_JSON_ARRAY)
        return atc_json_number(j, i, &v);
    int n = atc_json_count(j, i);
    for (int k = 0, at = i + 1; k < n; k++, at = atc_json_next(j, at))
        if (!atc_json_number(j, at, &v))
            return false;
    return n > 0;
}

static const char *check_vllm(const struct atc_sim_disagg *d, const struct atc_json *j, int kv,
                              int64_t max_tokens, bool stream)
{
    bool flag = false;
    if (d->p->role == ATC_ROLE_PREFILL) {
        /* toy_proxy_server.py's send_request_to_service: do_remote_decode, stream false, max_tokens 1 */
        if (kv < 0 || !atc_json_bool(j, atc_json_get(j, kv, "do_remote_decode"), &flag) || !flag)
            return "a prefill server takes requests with kv_transfer_params.do_remote_decode true";
        if (stream || max_tokens != 1)
            return "a prefill request must have stream false and max_tokens 1";
        return NULL;
    }
    /* the prefill answer's kv_transfer_params, as NixlConnector's decode side reads them */
    if (kv < 0 || !atc_json_bool(j, atc_json_get(j, kv, "do_remote_prefill"), &flag) || !flag)
        return "a decode server takes requests with kv_transfer_params.do_remote_prefill true";
    if (atc_json_type(j, atc_json_get(j, kv, "remote_engine_id")) != ATC_JSON_STRING ||
        atc_json_type(j, atc_json_get(j, kv, "remote_block_ids")) != ATC_JSON_ARRAY)
        return "kv_transfer_params must name remote_engine_id and remote_block_ids";
    return NULL;
}

int atc_sim_disagg_check(struct atc_sim_disagg *d, const char *body, size_t len, int64_t max_tokens,
                         uint32_t prompt_tokens, bool stream, struct atc_sim_disagg_req *out,
                         const char **err)
{
    *out = (struct atc_sim_disagg_req){.max_tokens = max_tokens, .compute_prompt = true};
    if (d->p->role == ATC_ROLE_BOTH)
        return 0;
    struct atc_json j = {0};
    if (atc_json_parse(&j, body, len, err) < 0 || atc_json_type(&j, 0) != ATC_JSON_OBJECT) {
        atc_json_dispose(&j);
        *err = "the body must be a JSON object";
        return -1;
    }
    int carried;
    if (d->p->engine == ATC_SIM_SGLANG) {
        carried = atc_json_get(&j, 0, "bootstrap_room");
        if (carried < 0 || !numbers(&j, carried) || atc_json_get(&j, 0, "bootstrap_host") < 0 ||
            atc_json_get(&j, 0, "bootstrap_port") < 0)
            *err = "a disaggregated server takes requests with bootstrap_host, bootstrap_port and "
                   "bootstrap_room";
        else
            *err = NULL;
    } else {
        carried = atc_json_get(&j, 0, "kv_transfer_params");
        if (carried >= 0 && atc_json_type(&j, carried) != ATC_JSON_OBJECT)
            carried = -1;
        *err = check_vllm(d, &j, carried, max_tokens, stream);
    }
    if (*err == NULL)
        note(d, &j, carried, max_tokens, stream);
    atc_json_dispose(&j);
    if (*err != NULL)
        return -1;
    if (d->p->role == ATC_ROLE_PREFILL && d->p->engine == ATC_SIM_SGLANG)
        out->max_tokens = 1; /* it runs the prefill and hands the KV on; decode generates */
    if (d->p->role == ATC_ROLE_DECODE) {
        out->transfer_us = atc_sim_transfer_us(d->p, prompt_tokens);
        out->compute_prompt = false;
    }
    return 0;
}

void atc_sim_disagg_answer(struct atc_sim_disagg *d, struct evbuffer *b, uint16_t port, uint64_t num,
                           uint32_t prompt_tokens)
{
    if (d->p->role != ATC_ROLE_PREFILL || d->p->engine == ATC_SIM_SGLANG)
        return;
    /* NixlConnector's request_finished: what the decode side needs to read the blocks */
    evbuffer_add_printf(
        b,
        ",\"kv_transfer_params\":{\"do_remote_prefill\":true,\"do_remote_decode\":false,"
        "\"remote_engine_id\":\"atc-sim-%u\",\"remote_request_id\":\"atc-sim-%u-%llu\","
        "\"remote_host\":\"127.0.0.1\",\"remote_port\":%u,\"tp_size\":1,\"remote_block_ids\":[",
        (unsigned)port, (unsigned)port, (unsigned long long)num, (unsigned)port);
    uint32_t blocks = (prompt_tokens + BLOCK_TOKENS - 1) / BLOCK_TOKENS;
    for (uint32_t i = 0; i < blocks && i < MAX_BLOCK_IDS; i++)
        evbuffer_add_printf(b, "%s%u", i ? "," : "", (unsigned)(num * MAX_BLOCK_IDS + i) % 1000000);
    evbuffer_add(b, "]}", 2);
}

bool atc_sim_disagg_route(struct atc_sim_disagg *d, struct atc_http_req *req, const char *path)
{
    if (strcmp(path, "/sim/disagg") != 0)
        return false;
    struct evbuffer *b = evbuffer_new();
    if (b == NULL) {
        atc_http_reply(req, 500, "text/plain", NULL, "out of memory", 13);
        return true;
    }
    evbuffer_add_printf(b,
                        "{\"role\":\"%s\",\"protocol\":\"%s\",\"requests\":%llu,\"aborted\":%llu,\"seen\":[",
                        atc_role_names[d->p->role], d->p->engine == ATC_SIM_SGLANG ? "sglang" : "vllm",
                        (unsigned long long)d->nseen, (unsigned long long)d->aborted);
    uint64_t first = d->nseen > LOG_SIZE ? d->nseen - LOG_SIZE : 0;
    for (uint64_t i = first; i < d->nseen; i++) {
        const struct seen *s = &d->log[i % LOG_SIZE];
        /* carried is JSON as the request had it; a cut one is given as a string */
        bool whole = strlen(s->carried) < LOG_TEXT - 1;
        evbuffer_add_printf(b, "%s{\"max_tokens\":%lld,\"stream\":%s,\"carried\":", i > first ? "," : "",
                            (long long)s->max_tokens, s->stream ? "true" : "false");
        if (whole)
            evbuffer_add(b, s->carried, strlen(s->carried));
        else
            atc_json_write_string(b, s->carried);
        evbuffer_add(b, "}", 1);
    }
    evbuffer_add(b, "]}", 2);
    atc_http_reply(req, 200, "application/json", NULL, (const char *)evbuffer_pullup(b, -1),
                   evbuffer_get_length(b));
    evbuffer_free(b);
    return true;
}
