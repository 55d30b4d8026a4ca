/* What the relay makes of a server's answer (answer.h). */

#include "proxy/answer.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include <event2/buffer.h>

#include "base/json.h"

/* A message cut to this many bytes: a server's error page is not worth relaying whole. */
#define MESSAGE_MAX 1024

static bool name_is(const char *line, size_t n, const char *name)
{
    return strlen(name) == n && strncasecmp(line, name, n) == 0;
}

size_t atc_answer_pass_headers(char *dst, const char *src, size_t len, bool event_stream)
{
    size_t out = 0;
    for (size_t at = 0; at < len;) {
        const char *line = src + at;
        const char *nl = memchr(line, '\n', len - at);
        size_t linelen = nl != NULL ? (size_t)(nl + 1 - line) : len - at;
        const char *colon = memchr(line, ':', linelen);
        size_t n = colon != NULL ? (size_t)(colon - line) : 0;
        at += linelen;
        if (n == 0 || name_is(line, n, "date") || name_is(line, n, "x-request-id") ||
            (n >= 6 && strncasecmp(line, "x-atc-", 6) == 0) ||
            (event_stream && name_is(line, n, "cache-control")))
            continue;
        memcpy(dst + out, line, linelen);
        out += linelen;
    }
    dst[out] = '\0';
    return out;
}

static const char *type_of(int status)
{
    if (status == 429)
        return "rate_limit_error";
    if (status == 401)
        return "authentication_error";
    if (status == 403)
        return "permission_error";
    if (status == 404)
        return "not_found_error";
    return status < 500 ? "invalid_request_error" : "server_error";
}

bool atc_answer_error_body(struct evbuffer *out, int status, const char *body, size_t len)
{
    struct atc_json j = {0};
    const char *msg = body;
    size_t msglen = len;
    const char *code = NULL;
    size_t codelen = 0;
    char text[MESSAGE_MAX * 3 + 1];
    if (atc_json_parse(&j, body, len, NULL) == 0 && atc_json_type(&j, 0) == ATC_JSON_OBJECT) {
        int e = atc_json_get(&j, 0, "error");
        if (atc_json_type(&j, e) == ATC_JSON_OBJECT) {
            atc_json_dispose(&j);
            return false; /* OpenAI's shape already (vLLM, SGLang, llama.cpp) */
        }
        int m = atc_json_type(&j, e) == ATC_JSON_STRING ? e : atc_json_get(&j, 0, "message");
        if (atc_json_string(&j, m, text, sizeof(text), &msglen) == 0)
            msg = text;
        else if (atc_json_type(&j, m) == ATC_JSON_STRING) /* too long to decode: its text, escapes and all */
            msg = atc_json_raw(&j, m, &msglen);
        int t = atc_json_get(&j, 0, "error_type");
        if (atc_json_type(&j, t) == ATC_JSON_STRING)
            code = atc_json_raw(&j, t, &codelen);
    }
    while (msglen > 0 && (msg[msglen - 1] == '\n' || msg[msglen - 1] == '\r' || msg[msglen - 1] == ' '))
        msglen--;
    if (msglen > MESSAGE_MAX)
        msglen = MESSAGE_MAX;
    if (msglen == 0) {
        msg = "the server answered with an error";
        msglen = strlen(msg);
    }
    evbuffer_add_printf(out, "{\"error\":{\"message\":\"");
    atc_json_escape(out, msg, msglen);
    evbuffer_add_printf(out, "\",\"type\":\"%s\",\"param\":null,\"code\":", type_of(status));
    if (code != NULL) {
        evbuffer_add(out, "\"", 1);
        atc_json_escape(out, code, codelen);
        evbuffer_add(out, "\"", 1);
    } else {
        evbuffer_add(out, "null", 4);
    }
    evbuffer_add(out, "}}", 2);
    atc_json_dispose(&j);
    return true;
}

bool atc_answer_first_event_error(const char *held, size_t len, struct evbuffer *rewritten, bool *rewrote)
{
    *rewrote = false;
    const char *end = held + len;
    for (const char *p = held; p < end;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *eol = nl != NULL ? nl : end;
        if (eol - p >= 5 && memcmp(p, "data:", 5) == 0) {
            const char *v = p + 5;
            while (v < eol && *v == ' ')
                v++;
            size_t vlen = (size_t)(eol - v);
            while (vlen > 0 && v[vlen - 1] == '\r')
                vlen--;
            struct atc_json j = {0};
            bool error = atc_json_parse(&j, v, vlen, NULL) == 0 && atc_json_type(&j, 0) == ATC_JSON_OBJECT &&
                         atc_json_get(&j, 0, "error") >= 0;
            atc_json_dispose(&j);
            if (!error)
                return false;
            struct evbuffer *shaped = evbuffer_new();
            if (shaped != NULL && atc_answer_error_body(shaped, 500, v, vlen)) {
                evbuffer_add(rewritten, held, (size_t)(p - held));
                evbuffer_add(rewritten, "data: ", 6);
                evbuffer_add_buffer(rewritten, shaped);
                evbuffer_add(rewritten, v + vlen, (size_t)(end - (v + vlen)));
                *rewrote = true;
            }
            if (shaped != NULL)
                evbuffer_free(shaped);
            return true;
        }
        p = nl != NULL ? nl + 1 : end;
    }
    return false;
}

const char *atc_answer_unknown_model(char *buf, size_t size, const char *model)
{
    snprintf(buf, size, "The model '%s' does not exist; GET /v1/models lists the models served", model);
    return buf;
}
