#include "http/http_util.h"

#include <stdio.h>
#include <string.h>

#include <event2/buffer.h>

/* The length of the well-formed UTF-8 sequence at @p s (at most @p n bytes), or 0 if it is not one:
 * a stray continuation byte, a cut sequence, an overlong form, a surrogate or a code point past U+10FFFF. */
static size_t utf8_sequence(const unsigned char *s, size_t n)
{
    size_t len;
    unsigned cp;
    if (s[0] >= 0xc2 && s[0] <= 0xdf) {
        len = 2;
        cp = s[0] & 0x1f;
    } else if (s[0] >= 0xe0 && s[0] <= 0xef) {
        len = 3;
        cp = s[0] & 0x0f;
    } else if (s[0] >= 0xf0 && s[0] <= 0xf4) {
        len = 4;
        cp = s[0] & 0x07;
    } else {
        return 0;
    }
    if (len > n)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
        (len == 4 && (cp < 0x10000 || cp > 0x10ffff)))
        return 0;
    return len;
}

void atc_json_escape(struct evbuffer *out, const char *s, size_t len)
{
    size_t start = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch >= 0x20 && ch != '"' && ch != '\\' && ch < 0x80)
            continue;
        if (ch >= 0x80) {
            /* JSON is UTF-8: a byte that is not part of a well-formed sequence (a client's model name
             * quoted in an error, say) becomes U+FFFD, or the answer would not parse. */
            size_t n = utf8_sequence((const unsigned char *)s + i, len - i);
            if (n > 0) {
                i += n - 1;
                continue;
            }
        }
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
            if (ch >= 0x80)
                evbuffer_add(out, "\\ufffd", 6);
            else
                evbuffer_add_printf(out, "\\u%04x", ch);
            break;
        }
        start = i + 1;
    }
    evbuffer_add(out, s + start, len - start);
}

void atc_json_key_string(struct evbuffer *out, const char *key, const char *value)
{
    evbuffer_add_printf(out, "\"%s\":", key);
    if (value == NULL) {
        evbuffer_add(out, "null", 4);
        return;
    }
    evbuffer_add(out, "\"", 1);
    atc_json_escape(out, value, strlen(value));
    evbuffer_add(out, "\"", 1);
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
