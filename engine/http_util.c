#include "http_util.h"

#include <stdio.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/http.h>

void atc_json_escape(struct evbuffer *out, const char *s, size_t len)
{
    size_t start = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch >= 0x20 && ch != '"' && ch != '\\')
            continue;
        evbuffer_add(out, s + start, i - start);
        switch (ch) {
        case '"':
            evbuffer_add(out, "\\\"", 2);
            break;
        case '\\':
            evbuffer_add(out, "\\\\", 2);
            break;
        case '\n':
            evbuffer_add(out, "\\n", 2);
            break;
        default:
            evbuffer_add_printf(out, "\\u%04x", ch);
            break;
        }
        start = i + 1;
    }
    evbuffer_add(out, s + start, len - start);
}

const char *atc_http_reason(int status)
{
    switch (status) {
    case 200:
        return "OK";
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 408:
        return "Request Timeout";
    case 413:
        return "Payload Too Large";
    case 422:
        return "Unprocessable Entity";
    case 429:
        return "Too Many Requests";
    case 500:
        return "Internal Server Error";
    case 502:
        return "Bad Gateway";
    case 503:
        return "Service Unavailable";
    case 504:
        return "Gateway Timeout";
    default:
        return status < 300 ? "OK" : status < 500 ? "Client Error" : "Server Error";
    }
}

void atc_http_send_json(struct evhttp_request *req, int status, struct evbuffer *body)
{
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
    evhttp_send_reply(req, status, atc_http_reason(status), body);
}

void atc_http_send_error(struct evhttp_request *req, int status, const char *type, const char *code,
                         const char *message, int retry_after_s)
{
    struct evbuffer *body = evbuffer_new();
    if (body == NULL) {
        evhttp_send_error(req, status, NULL);
        return;
    }
    evbuffer_add_printf(body, "{\"error\":{\"message\":\"");
    atc_json_escape(body, message, strlen(message));
    evbuffer_add_printf(body, "\",\"type\":\"%s\",\"param\":null,\"code\":", type);
    if (code != NULL)
        evbuffer_add_printf(body, "\"%s\"}}\n", code);
    else
        evbuffer_add_printf(body, "%d}}\n", status);
    if (retry_after_s > 0) {
        char v[16];
        snprintf(v, sizeof(v), "%d", retry_after_s);
        evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", v);
    }
    atc_http_send_json(req, status, body);
    evbuffer_free(body);
}
