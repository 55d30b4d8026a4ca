/* Request heads and chunked bodies in place (http_parse.h).
 *
 * Why hand-written rather than Debian's libhttp-parser 2.9.4 (nodejs/http-parser; archived upstream in
 * 2022 for llhttp, which Debian 12 does not package as a C library). tests/bench/parse_bench (built when
 * libhttp-parser-dev is installed) on this 2-core machine, shared and noisy, three rounds, on the head of
 * the chat request tests/bench sends with wrk (113 bytes, 3 headers):
 *
 *   this parser                                   464-961 ns per head, no allocation, slices kept
 *   http_parser_execute with url/field/value      1383-1994 ns per head, no allocation; its callbacks
 *   callbacks (its best case: one piece)          come per fragment, so a head split over two reads
 *                                                 needs the caller to glue the fragments back
 *
 * and on the hostile inputs (test_hostile.py's, and what a proxy must refuse), both refuse the garbage,
 * missing target, extra words, binary, no colon, bad lengths, bare CR, DEL, NUL and CL + TE together,
 * but http_parser takes "HTTP/9.9", "GET http://[::1", obs-fold continuation lines, a space before the
 * colon ("Host : x", a smuggling shape RFC 9112 5.1 says to refuse) and "Transfer-Encoding: gzip,
 * chunked" (a coding nothing here decodes): five checks a server would redo after it, in a second pass.
 * The server keeps the whole head in one buffer, so finding its end and walking it once is simpler and
 * 2-3x faster. The upstream response parser (upstream.c) was already hand-written over its read buffer
 * in the same way, and stays so.
 *
 * What is accepted: a request line METHOD SP target SP HTTP/1.0|1.1, header lines name ":" OWS value OWS,
 * lines ended by CRLF or a bare LF, up to ATC_HTTP_MAX_EMPTY_LINES empty lines before the request line
 * skipped (RFC 9112 2.2). Refused (400): more of them, HTTP/1.1 without Host, anything else on the request
 * line, a header name with a byte outside tchar, a value with a control byte (NUL included) other than
 * HTAB, a bare CR, obs-fold, a Content-Length that is not digits, Transfer-Encoding together with
 * Content-Length. Chunked framing is bounded (ATC_HTTP_MAX_CHUNK_LINE, ATC_HTTP_MAX_TRAILERS). */
#include "http/http_parse.h"

#include <string.h>
#include <strings.h>

/* tchar of RFC 9110 5.6.2 */
static const unsigned char tchar[256] = {
    ['!'] = 1, ['#'] = 1, ['$'] = 1, ['%'] = 1, ['&'] = 1, ['\''] = 1, ['*'] = 1, ['+'] = 1, ['-'] = 1,
    ['.'] = 1, ['^'] = 1, ['_'] = 1, ['`'] = 1, ['|'] = 1, ['~'] = 1, ['0'] = 1, ['1'] = 1, ['2'] = 1,
    ['3'] = 1, ['4'] = 1, ['5'] = 1, ['6'] = 1, ['7'] = 1, ['8'] = 1, ['9'] = 1, ['A'] = 1, ['B'] = 1,
    ['C'] = 1, ['D'] = 1, ['E'] = 1, ['F'] = 1, ['G'] = 1, ['H'] = 1, ['I'] = 1, ['J'] = 1, ['K'] = 1,
    ['L'] = 1, ['M'] = 1, ['N'] = 1, ['O'] = 1, ['P'] = 1, ['Q'] = 1, ['R'] = 1, ['S'] = 1, ['T'] = 1,
    ['U'] = 1, ['V'] = 1, ['W'] = 1, ['X'] = 1, ['Y'] = 1, ['Z'] = 1, ['a'] = 1, ['b'] = 1, ['c'] = 1,
    ['d'] = 1, ['e'] = 1, ['f'] = 1, ['g'] = 1, ['h'] = 1, ['i'] = 1, ['j'] = 1, ['k'] = 1, ['l'] = 1,
    ['m'] = 1, ['n'] = 1, ['o'] = 1, ['p'] = 1, ['q'] = 1, ['r'] = 1, ['s'] = 1, ['t'] = 1, ['u'] = 1,
    ['v'] = 1, ['w'] = 1, ['x'] = 1, ['y'] = 1, ['z'] = 1,
};

/* A byte a header value may hold: visible ASCII, SP, HTAB, obs-text. */
static inline bool value_byte(unsigned char c)
{
    return (c >= 0x20 && c != 0x7f) || c == '\t';
}

/* A byte of a request target: visible ASCII or obs-text (never SP or a control). */
static inline bool target_byte(unsigned char c)
{
    return c > 0x20 && c != 0x7f;
}

/* Where the head ends: just past the empty line that ends it, or 0 when it has not come yet. */
static size_t head_end(const char *buf, size_t len)
{
    const char *p = buf, *end = buf + len;
    while ((p = memchr(p, '\n', (size_t)(end - p))) != NULL) {
        p++;
        if (p < end && *p == '\n')
            return (size_t)(p + 1 - buf);
        if (p + 1 < end && p[0] == '\r' && p[1] == '\n')
            return (size_t)(p + 2 - buf);
        if (p + 1 >= end)
            return 0;
    }
    return 0;
}

/* The end of the line starting at @p p (the CR of its CRLF, or its bare LF), or NULL if a bare CR is in
 * it. The head's end guarantees a LF ahead. */
static char *line_end(char *p)
{
    char *lf = strchr(p, '\n'); /* the head is NUL-free up to its end: checked by the callers' scans */
    if (lf == NULL)
        return NULL;
    char *e = lf > p && lf[-1] == '\r' ? lf - 1 : lf;
    return memchr(p, '\r', (size_t)(e - p)) == NULL ? e : NULL;
}

static enum atc_http_method method_of(const char *m, size_t n)
{
    switch (n) {
    case 3:
        if (memcmp(m, "GET", 3) == 0)
            return ATC_HTTP_GET;
        if (memcmp(m, "PUT", 3) == 0)
            return ATC_HTTP_PUT;
        break;
    case 4:
        if (memcmp(m, "POST", 4) == 0)
            return ATC_HTTP_POST;
        if (memcmp(m, "HEAD", 4) == 0)
            return ATC_HTTP_HEAD;
        break;
    case 5:
        if (memcmp(m, "PATCH", 5) == 0)
            return ATC_HTTP_PATCH;
        break;
    case 6:
        if (memcmp(m, "DELETE", 6) == 0)
            return ATC_HTTP_DELETE;
        break;
    case 7:
        if (memcmp(m, "OPTIONS", 7) == 0)
            return ATC_HTTP_OPTIONS;
        break;
    }
    return ATC_HTTP_OTHER;
}

/* An absolute-form target "http://authority/path": the path in it, or NULL when the authority is not
 * well-formed (an unclosed IPv6 literal, say). */
static char *absolute_path(char *t)
{
    char *a = strstr(t, "://");
    if (a == NULL)
        return NULL;
    for (char *s = t; s < a; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z')))
            return NULL;
    a += 3;
    char *slash = strchr(a, '/');
    char *auth_end = slash != NULL ? slash : a + strlen(a);
    char *open = memchr(a, '[', (size_t)(auth_end - a));
    if (open != NULL && (open != a || memchr(a, ']', (size_t)(auth_end - a)) == NULL))
        return NULL;
    if (auth_end == a)
        return NULL;
    return slash != NULL ? slash : (char *)"/";
}

static int parse_request_line(char *p, char *e, struct atc_http_head *h)
{
    char *sp1 = memchr(p, ' ', (size_t)(e - p));
    if (sp1 == NULL || sp1 == p)
        return -400;
    for (char *s = p; s < sp1; s++)
        if (!tchar[(unsigned char)*s])
            return -400;
    char *t = sp1 + 1, *sp2 = t;
    while (sp2 < e && target_byte((unsigned char)*sp2))
        sp2++;
    if (sp2 == t || sp2 >= e || *sp2 != ' ')
        return -400;
    char *v = sp2 + 1;
    if (e - v != 8 || memcmp(v, "HTTP/1.", 7) != 0 || (v[7] != '0' && v[7] != '1'))
        return -400;
    h->minor = v[7] - '0';
    h->method = method_of(p, (size_t)(sp1 - p));
    *sp1 = '\0';
    *sp2 = '\0';
    h->method_name = p;
    h->target = t;
    if (*t == '/') {
        h->path = t;
    } else if (*t == '*' && t[1] == '\0' && h->method == ATC_HTTP_OPTIONS) {
        h->path = t;
    } else if ((h->path = absolute_path(t)) == NULL) {
        return -400;
    }
    return 0;
}

bool atc_http_has_token(const char *v, const char *token)
{
    size_t n = strlen(token);
    while (*v) {
        while (*v == ' ' || *v == '\t' || *v == ',')
            v++;
        const char *s = v;
        while (*v && *v != ',')
            v++;
        const char *e = v;
        while (e > s && (e[-1] == ' ' || e[-1] == '\t'))
            e--;
        if ((size_t)(e - s) == n && strncasecmp(s, token, n) == 0)
            return true;
    }
    return false;
}

/* The framing headers: lengths, codings, connection, expectation. */
static int framing(struct atc_http_head *h, const char *name, size_t name_len, const char *value,
                   size_t value_len)
{
    switch (name_len) {
    case 14:
        if (strcasecmp(name, "content-length") == 0) {
            if (value_len == 0 || value_len > 15)
                return -400;
            int64_t n = 0;
            for (const char *s = value; *s; s++) {
                if (*s < '0' || *s > '9')
                    return -400;
                n = n * 10 + (*s - '0');
            }
            if (h->content_length >= 0 && h->content_length != n)
                h->conflicting_lengths = true;
            h->content_length = n;
        }
        break;
    case 17:
        if (strcasecmp(name, "transfer-encoding") == 0) {
            /* chunked must be the last coding, and the only one this server decodes */
            if (strcasecmp(value, "chunked") != 0)
                return atc_http_has_token(value, "chunked") ? -400 : -501;
            if (h->chunked)
                return -400;
            h->chunked = true;
        }
        break;
    case 10:
        if (strcasecmp(name, "connection") == 0) {
            if (atc_http_has_token(value, "close"))
                h->keep_alive = false;
            else if (atc_http_has_token(value, "keep-alive"))
                h->keep_alive = true;
        }
        break;
    case 4:
        if (strcasecmp(name, "host") == 0) {
            if (h->host) { /* RFC 9112 3.2: two Host lines are a 400 (hops may each read another one) */
                h->refused = &atc_http_refused_two_hosts;
                return -400;
            }
            h->host = true;
        }
        break;
    case 6:
        if (strcasecmp(name, "expect") == 0 && strcasecmp(value, "100-continue") == 0)
            h->expect_continue = true;
        break;
    }
    return 0;
}

const struct atc_http_refusal atc_http_refused_empty_lines = {"too_many_empty_lines",
                                                              "too many empty lines before the request line"};
const struct atc_http_refusal atc_http_refused_nul_in_header = {"nul_in_header",
                                                                "a header contains a NUL byte"};
const struct atc_http_refusal atc_http_refused_obs_fold = {
    "obs_fold", "a header line starts with a space or tab (obs-fold); send each header on one line"};
const struct atc_http_refusal atc_http_refused_missing_host = {"missing_host",
                                                               "an HTTP/1.1 request needs a Host header"};
const struct atc_http_refusal atc_http_refused_two_hosts = {"two_hosts",
                                                            "a request has one Host header, not several"};

int atc_http_parse_request(char *buf, size_t len, size_t max_head, struct atc_http_head *h)
{
    /* Empty lines before the request line: a few are skipped, more refused, so that a stream of them is
     * neither buffered without end nor rescanned at each read (each call sees at most these bytes). */
    h->refused = NULL;
    size_t skip = 0;
    while (skip < len && (buf[skip] == '\r' || buf[skip] == '\n'))
        if (++skip > 2 * ATC_HTTP_MAX_EMPTY_LINES) {
            h->refused = &atc_http_refused_empty_lines;
            return -400;
        }
    size_t scan = len < max_head + skip ? len : max_head + skip;
    size_t end = head_end(buf + skip, scan - skip);
    if (end == 0)
        return len >= max_head + skip ? -400 : 0;
    end += skip;
    char *p = buf + skip, *stop = buf + end;
    if (memchr(p, '\0', (size_t)(stop - p)) != NULL) {
        h->refused =
            &atc_http_refused_nul_in_header; /* evhttp cut a value there: the next hop may read the rest */
        return -400;
    }
    h->base = buf;
    h->nheaders = 0;
    h->content_length = -1;
    h->chunked = h->expect_continue = h->conflicting_lengths = h->host = false;
    char *e = line_end(p);
    if (e == NULL)
        return -400;
    char *next = *e == '\r' ? e + 2 : e + 1;
    int rc = parse_request_line(p, e, h);
    if (rc < 0)
        return rc;
    h->keep_alive = h->minor == 1;
    for (p = next; p < stop && *p != '\r' && *p != '\n'; p = next) {
        if ((e = line_end(p)) == NULL)
            return -400;
        next = *e == '\r' ? e + 2 : e + 1;
        char *colon = p;
        while (colon < e && tchar[(unsigned char)*colon])
            colon++;
        if (colon == p || colon == e || *colon != ':') { /* obs-fold starts with SP/HTAB: refused here too */
            if (*p == ' ' || *p == '\t')
                h->refused =
                    &atc_http_refused_obs_fold; /* joined to the line before by some hops, not by others */
            return -400;
        }
        char *v = colon + 1, *ve = e;
        while (v < ve && (*v == ' ' || *v == '\t'))
            v++;
        while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
            ve--;
        for (char *s = v; s < ve; s++)
            if (!value_byte((unsigned char)*s))
                return -400;
        if (h->nheaders == ATC_HTTP_MAX_HEADERS)
            return -431;
        *colon = '\0';
        *ve = '\0';
        /* the head is shorter than max_head, itself an int's worth at most (the return value) */
        h->headers[h->nheaders++] = (struct atc_http_header){(uint32_t)(p - buf), (uint32_t)(v - buf)};
        if ((rc = framing(h, p, (size_t)(colon - p), v, (size_t)(ve - v))) < 0)
            return rc;
    }
    if (h->chunked && h->content_length >= 0)
        return -400;
    if (h->minor == 1 && !h->host) {
        h->refused =
            &atc_http_refused_missing_host; /* RFC 9112 3.2: an HTTP/1.1 request without Host is a 400 */
        return -400;
    }
    char *q = strchr(h->path, '?');
    h->query = NULL;
    if (q != NULL) {
        *q = '\0'; /* the path alone; the query follows its NUL */
        h->query = q + 1;
    }
    return (int)end;
}

/* First letters first: a request is looked up for about six names, most of them absent, and most of its
 * lines differ from a name in the first letter (| 0x20 folds a letter's case; it may match two other
 * bytes too, which strcasecmp then tells apart). That took 21 strcasecmp calls a small request to 1. */
const char *atc_http_head_find(const struct atc_http_head *h, const char *name)
{
    unsigned char first = (unsigned char)name[0] | 0x20;
    for (unsigned i = 0; i < h->nheaders; i++) {
        const char *line = atc_http_header_name(h, i);
        if (((unsigned char)line[0] | 0x20) == first && strcasecmp(line, name) == 0)
            return atc_http_header_value(h, i);
    }
    return NULL;
}

enum {
    CH_SIZE,     /* hex digits of the size */
    CH_EXT,      /* after the size: extensions up to the LF */
    CH_EXT_LF,   /* the size line's LF after its CR */
    CH_DATA,     /* chunk data */
    CH_DATA_END, /* the CRLF after the data */
    CH_DATA_LF,
    CH_TRAILER,      /* start of a trailer line, or the final empty line */
    CH_TRAILER_LINE, /* inside a trailer field line */
    CH_TRAILER_LF,   /* a trailer line's LF after its CR */
    CH_LAST_LF,      /* the final line's LF after its CR */
    CH_SIZE_WS,      /* OWS between the size and ';' or the line's end */
};

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = (char)(c | 0x20);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* One byte of a size line or of the trailers taken: over @p limit of them, the framing is refused. Every
 * byte that is not chunk data goes through here, so framing costs a peer at most those bytes per chunk
 * (and the caller drops what was consumed): an endless extension, trailer, run of leading zeros or of
 * OWS is refused at once instead of waiting for client_timeout while it is buffered. */
#define TAKE(limit)                                                                                            \
    do {                                                                                                       \
        i++;                                                                                                   \
        if (++c->line > (limit))                                                                               \
            rc = -1;                                                                                           \
    } while (0)

int atc_http_chunked_decode(struct atc_http_chunked *c, char *buf, size_t len, size_t *pos, size_t *out)
{
    size_t i = *pos, o = *out;
    int rc = 0;
    while (i < len && rc == 0) {
        char ch = buf[i];
        switch (c->state) {
        case CH_SIZE: {
            int d = hexval(ch);
            if (d >= 0) {
                if (c->left >> 60) { /* one more digit would not fit in 64 bits (leading zeros do) */
                    rc = -1;
                    break;
                }
                c->size_digits++;
                c->left = c->left * 16 + (uint64_t)d;
                /* refused as soon as the size says so, not after client_timeout waiting for its data */
                if (c->max_body > 0 && c->left > c->max_body - c->body) {
                    rc = -2;
                    break;
                }
                TAKE(ATC_HTTP_MAX_CHUNK_LINE);
                break;
            }
            /* The size ends at OWS, ';' or the line's end: "0x5" or "5zz" is no size (read leniently it
             * was a last chunk, and the data after it a trailer). */
            if (c->size_digits == 0 || (ch != ' ' && ch != '\t' && ch != ';' && ch != '\r' && ch != '\n')) {
                rc = -1;
                break;
            }
            c->state = ch == ' ' || ch == '\t' ? CH_SIZE_WS : CH_EXT;
            break;
        }
        case CH_SIZE_WS: /* OWS after the size: more of it, then ';' or the line's end */
            if (ch == ' ' || ch == '\t') {
                TAKE(ATC_HTTP_MAX_CHUNK_LINE);
            } else if (ch == ';' || ch == '\r' || ch == '\n') {
                c->state = CH_EXT;
            } else {
                rc = -1;
            }
            break;
        case CH_EXT:
            /* ";name=value" extensions: skipped, control bytes refused. A CR is a state of its own, so that
             * the verdict on what follows it does not depend on whether the CR was the last byte of a read. */
            if (ch == '\r' || ch == '\n') {
                c->state = CH_EXT_LF;
                if (ch == '\r')
                    TAKE(ATC_HTTP_MAX_CHUNK_LINE);
            } else if (value_byte((unsigned char)ch)) {
                TAKE(ATC_HTTP_MAX_CHUNK_LINE);
            } else {
                rc = -1;
            }
            break;
        case CH_EXT_LF:
            if (ch != '\n') {
                rc = -1;
                break;
            }
            i++;
            c->size_digits = 0;
            c->line = 0;
            c->body += c->left;
            c->state = c->left > 0 ? CH_DATA : CH_TRAILER;
            break;
        case CH_DATA: {
            size_t n = len - i < c->left ? len - i : (size_t)c->left;
            memmove(buf + o, buf + i, n);
            o += n;
            i += n;
            c->left -= n;
            if (c->left == 0)
                c->state = CH_DATA_END;
            break;
        }
        case CH_DATA_END:
            if (ch == '\r') {
                c->state = CH_DATA_LF;
                i++;
                break;
            }
            /* a bare LF */
            __attribute__((fallthrough));
        case CH_DATA_LF:
            if (ch != '\n') {
                rc = -1;
                break;
            }
            i++;
            c->state = CH_SIZE;
            break;
        case CH_TRAILER:
            if (ch == '\n') {
                i++;
                rc = 1;
            } else if (ch == '\r') {
                c->state = CH_LAST_LF;
                TAKE(ATC_HTTP_MAX_TRAILERS);
            } else if (ch == ' ' || ch == '\t' || !tchar[(unsigned char)ch]) {
                rc = -1;
            } else {
                c->state = CH_TRAILER_LINE;
            }
            break;
        case CH_TRAILER_LINE:
            /* a CR only as the line's end: a bare one is a line break to some hops and not to others */
            if (ch == '\n')
                c->state = CH_TRAILER;
            else if (ch == '\r')
                c->state = CH_TRAILER_LF;
            else if (!value_byte((unsigned char)ch))
                rc = -1;
            if (rc == 0)
                TAKE(ATC_HTTP_MAX_TRAILERS);
            break;
        case CH_TRAILER_LF:
            if (ch != '\n') {
                rc = -1;
                break;
            }
            c->state = CH_TRAILER;
            TAKE(ATC_HTTP_MAX_TRAILERS);
            break;
        case CH_LAST_LF:
            if (ch != '\n') {
                rc = -1;
                break;
            }
            i++;
            rc = 1;
            break;
        }
    }
    if (rc == 1)
        c->done = true;
    *pos = i;
    *out = o;
    return rc;
}
