/* Small JSON documents over jsmn (json.h). */

#include "base/json.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JSMN_STATIC
#define JSMN_STRICT
#include <event2/buffer.h>
#include <jsmn.h>

static const jsmntok_t *tok(const struct atc_json *j, int i)
{
    return i >= 0 && i < j->n ? &((const jsmntok_t *)j->tokens)[i] : NULL;
}

/* True when brackets outside strings nest deeper than @p max. jsmn closes a bracket by scanning back
 * over the tokens, so a line of 300,000 '[' took it 25 s; nothing read here nests more than a few. */
static bool too_deep(const char *js, size_t len, int max)
{
    int depth = 0;
    bool in_string = false;
    for (size_t i = 0; i < len; i++) {
        char c = js[i];
        if (in_string) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '{' || c == '[') {
            if (++depth > max)
                return true;
        } else if (c == '}' || c == ']') {
            depth--;
        }
    }
    return false;
}

/* jsmn takes {"a"} and {"a": } (a key without a value) and {1: 2}: every member of every object must
 * be a string key with one value. */
static bool members_well_formed(const struct atc_json *j)
{
    const jsmntok_t *t = j->tokens;
    for (int i = 0; i < j->n; i++) {
        if (t[i].type != JSMN_OBJECT)
            continue;
        int k = i + 1;
        for (int m = 0; m < t[i].size; m++) {
            if (k >= j->n || t[k].type != JSMN_STRING || t[k].size != 1 || k + 1 >= j->n)
                return false;
            k = atc_json_next(j, k);
        }
    }
    return true;
}

int atc_json_parse(struct atc_json *j, const char *js, size_t len, const char **err)
{
    const char *why = NULL;
    jsmn_parser p;
    j->js = js;
    j->len = len;
    j->n = 0;
    if (too_deep(js, len, ATC_JSON_MAX_DEPTH)) {
        why = "JSON nested too deeply";
        goto error;
    }
    jsmn_init(&p);
    int n = jsmn_parse(&p, js, len, NULL, 0);
    if (n <= 0) {
        why = "invalid JSON";
        goto error;
    }
    if ((unsigned)n > j->cap) {
        jsmntok_t *t = realloc(j->tokens, (size_t)n * sizeof(*t));
        if (t == NULL) {
            why = "out of memory";
            goto error;
        }
        j->tokens = t;
        j->cap = (unsigned)n;
    }
    jsmn_init(&p);
    if (jsmn_parse(&p, js, len, j->tokens, j->cap) != n) {
        why = "invalid JSON";
        goto error;
    }
    j->n = n;
    /* jsmn reads "{} {}" as two values, without complaint: one value only */
    if (atc_json_next(j, 0) != n || !members_well_formed(j)) {
        j->n = 0;
        why = "invalid JSON";
        goto error;
    }
    return 0;
error:
    if (err != NULL)
        *err = why;
    return -1;
}

void atc_json_dispose(struct atc_json *j)
{
    free(j->tokens);
    *j = (struct atc_json){0};
}

enum atc_json_type atc_json_type(const struct atc_json *j, int i)
{
    const jsmntok_t *t = tok(j, i);
    if (t == NULL)
        return ATC_JSON_NONE;
    switch (t->type) {
    case JSMN_OBJECT:
        return ATC_JSON_OBJECT;
    case JSMN_ARRAY:
        return ATC_JSON_ARRAY;
    case JSMN_STRING:
        return ATC_JSON_STRING;
    default:
        return ATC_JSON_PRIMITIVE;
    }
}

int atc_json_count(const struct atc_json *j, int i)
{
    const jsmntok_t *t = tok(j, i);
    return t != NULL && (t->type == JSMN_OBJECT || t->type == JSMN_ARRAY) ? t->size : 0;
}

int atc_json_next(const struct atc_json *j, int i)
{
    /* Iterative, and never past the last token: jsmn makes an object's keys its children and each
     * key's value the key's one child, and its sizes are not to be trusted beyond the tokens it wrote. */
    const jsmntok_t *t = j->tokens;
    if (i < 0 || i >= j->n)
        return j->n;
    int k = i;
    for (long pending = 1; pending > 0 && k < j->n; k++)
        pending += t[k].size - 1;
    return k;
}

int atc_json_get(const struct atc_json *j, int obj, const char *key)
{
    if (atc_json_type(j, obj) != ATC_JSON_OBJECT)
        return -1;
    int i = obj + 1;
    for (int k = 0; k < atc_json_count(j, obj) && i + 1 < j->n; k++) {
        if (atc_json_is(j, i, key))
            return i + 1;
        i = atc_json_next(j, i); /* the key and its value */
    }
    return -1;
}

bool atc_json_is(const struct atc_json *j, int i, const char *s)
{
    const jsmntok_t *t = tok(j, i);
    size_t n = strlen(s);
    return t != NULL && t->type == JSMN_STRING && (size_t)(t->end - t->start) == n &&
           memcmp(j->js + t->start, s, n) == 0;
}

const char *atc_json_raw(const struct atc_json *j, int i, size_t *len)
{
    const jsmntok_t *t = tok(j, i);
    *len = t != NULL ? (size_t)(t->end - t->start) : 0;
    return t != NULL ? j->js + t->start : NULL;
}

static int hexval(char c)
{
    return isdigit((unsigned char)c) ? c - '0'
           : c >= 'a' && c <= 'f'    ? c - 'a' + 10
           : c >= 'A' && c <= 'F'    ? c - 'A' + 10
                                     : -1;
}

int atc_json_string(const struct atc_json *j, int i, char *out, size_t size, size_t *len)
{
    const jsmntok_t *t = tok(j, i);
    if (t == NULL || t->type != JSMN_STRING || size == 0)
        return -1;
    const char *s = j->js + t->start, *end = j->js + t->end;
    size_t o = 0;
    while (s < end) {
        char u8[3];
        size_t n = 1;
        if (*s != '\\') {
            u8[0] = *s++;
        } else {
            if (++s >= end)
                return -1;
            switch (*s) {
            case 'n':
                u8[0] = '\n';
                break;
            case 't':
                u8[0] = '\t';
                break;
            case 'r':
                u8[0] = '\r';
                break;
            case 'b':
                u8[0] = '\b';
                break;
            case 'f':
                u8[0] = '\f';
                break;
            case 'u': {
                /* surrogate pairs stay two 3-byte sequences, which is fine for ids and names */
                unsigned cp = 0;
                if (end - s < 5)
                    return -1;
                for (int k = 1; k <= 4; k++) {
                    int v = hexval(s[k]);
                    if (v < 0)
                        return -1;
                    cp = cp * 16 + (unsigned)v;
                }
                s += 4;
                n = 0;
                if (cp < 0x80) {
                    u8[n++] = (char)cp;
                } else if (cp < 0x800) {
                    u8[n++] = (char)(0xc0 | cp >> 6);
                    u8[n++] = (char)(0x80 | (cp & 0x3f));
                } else {
                    u8[n++] = (char)(0xe0 | cp >> 12);
                    u8[n++] = (char)(0x80 | ((cp >> 6) & 0x3f));
                    u8[n++] = (char)(0x80 | (cp & 0x3f));
                }
                break;
            }
            default:
                u8[0] = *s; /* \" \\ \/ */
                break;
            }
            s++;
        }
        if (o + n >= size)
            return -1;
        memcpy(out + o, u8, n);
        o += n;
    }
    out[o] = '\0';
    if (len != NULL)
        *len = o;
    return 0;
}

bool atc_json_number(const struct atc_json *j, int i, double *out)
{
    const jsmntok_t *t = tok(j, i);
    char buf[64], *end;
    size_t n = t != NULL ? (size_t)(t->end - t->start) : 0;
    if (t == NULL || t->type != JSMN_PRIMITIVE || n == 0 || n >= sizeof(buf))
        return false;
    char c = j->js[t->start];
    if (c != '-' && !isdigit((unsigned char)c))
        return false;
    memcpy(buf, j->js + t->start, n);
    buf[n] = '\0';
    errno = 0;
    double v = strtod(buf, &end);
    if (*end != '\0' || errno != 0 || !isfinite(v))
        return false;
    *out = v;
    return true;
}

bool atc_json_uint(const struct atc_json *j, int i, uint64_t max, uint64_t *out)
{
    const jsmntok_t *t = tok(j, i);
    size_t n = t != NULL ? (size_t)(t->end - t->start) : 0;
    if (t == NULL || t->type != JSMN_PRIMITIVE || n == 0 || n > 20)
        return false;
    uint64_t v = 0;
    for (size_t k = 0; k < n; k++) {
        char c = j->js[t->start + (int)k];
        if (!isdigit((unsigned char)c) || v > (UINT64_MAX - (uint64_t)(c - '0')) / 10)
            return false;
        v = v * 10 + (uint64_t)(c - '0');
    }
    if (v > max)
        return false;
    *out = v;
    return true;
}

bool atc_json_bool(const struct atc_json *j, int i, bool *out)
{
    const jsmntok_t *t = tok(j, i);
    if (t == NULL || t->type != JSMN_PRIMITIVE || (j->js[t->start] != 't' && j->js[t->start] != 'f'))
        return false;
    *out = j->js[t->start] == 't';
    return true;
}

/* ---- writing ---- */

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

/* Where escaped text goes: an evbuffer or a FILE. */
typedef void (*json_put)(void *sink, const char *p, size_t n);

static void put_evbuffer(void *sink, const char *p, size_t n)
{
    evbuffer_add(sink, p, n);
}

static void put_file(void *sink, const char *p, size_t n)
{
    fwrite(p, 1, n, sink);
}

static void escape_to(json_put put, void *out, const char *s, size_t len)
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
        put(out, s + start, i - start);
        switch (ch) {
        case '"':
            put(out, "\\\"", 2);
            break;
        case '\\':
            put(out, "\\\\", 2);
            break;
        case '\n':
            put(out, "\\n", 2);
            break;
        default:
            if (ch >= 0x80) {
                put(out, "\\ufffd", 6);
            } else {
                static const char hex[] = "0123456789abcdef";
                char u[6] = {'\\', 'u', '0', '0', hex[ch >> 4], hex[ch & 15]};
                put(out, u, 6);
            }
            break;
        }
        start = i + 1;
    }
    put(out, s + start, len - start);
}

void atc_json_escape(struct evbuffer *out, const char *s, size_t len)
{
    escape_to(put_evbuffer, out, s, len);
}

void atc_json_write_string(struct evbuffer *out, const char *s)
{
    evbuffer_add(out, "\"", 1);
    escape_to(put_evbuffer, out, s, strlen(s));
    evbuffer_add(out, "\"", 1);
}

void atc_json_fwrite_string(FILE *out, const char *s, size_t len)
{
    fputc('"', out);
    escape_to(put_file, out, s, len);
    fputc('"', out);
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
