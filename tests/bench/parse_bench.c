/* The measurement behind http_parse.c's choice: atc's in-place request-head parser against Debian's
 * libhttp-parser (http_parser_execute with the callbacks a server needs to keep the request line and
 * headers), on the chat request tests/bench sends with wrk, and which of the hostile inputs each
 * refuses. Built only when http_parser.h is installed (apt-get install libhttp-parser-dev).
 *
 *   build/tests/parse_bench [iterations]
 */
#include <http_parser.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "http/http_parse.h"

static const char chat[] = "POST /v1/chat/completions HTTP/1.1\r\n"
                           "Host: 127.0.0.1:8080\r\n"
                           "Content-Type: application/json\r\n"
                           "Content-Length: 115\r\n"
                           "\r\n";

/* What a server keeps with http_parser: the slices of the line and the headers. Fields may come in
 * fragments when a head spans reads; here every head comes in one piece, its best case. */
struct hp_ctx {
    const char *url;
    size_t url_len;
    const char *names[ATC_HTTP_MAX_HEADERS], *values[ATC_HTTP_MAX_HEADERS];
    size_t nlen[ATC_HTTP_MAX_HEADERS], vlen[ATC_HTTP_MAX_HEADERS];
    unsigned n;
    int complete;
};

static int hp_url(http_parser *p, const char *at, size_t len)
{
    struct hp_ctx *c = p->data;
    c->url = at;
    c->url_len = len;
    return 0;
}

static int hp_field(http_parser *p, const char *at, size_t len)
{
    struct hp_ctx *c = p->data;
    if (c->n == ATC_HTTP_MAX_HEADERS)
        return 1;
    c->names[c->n] = at;
    c->nlen[c->n] = len;
    return 0;
}

static int hp_value(http_parser *p, const char *at, size_t len)
{
    struct hp_ctx *c = p->data;
    c->values[c->n] = at;
    c->vlen[c->n++] = len;
    return 0;
}

static int hp_headers_complete(http_parser *p)
{
    ((struct hp_ctx *)p->data)->complete = 1;
    return 1; /* stop here: the head alone, as the hand-written parser */
}

static const http_parser_settings hp_settings = {
    .on_url = hp_url,
    .on_header_field = hp_field,
    .on_header_value = hp_value,
    .on_headers_complete = hp_headers_complete,
};

/* 1 when http_parser takes @p s (len bytes) as a good request head, 0 when it refuses it. */
static int hp_accepts(const char *s, size_t len, struct hp_ctx *c)
{
    http_parser p;
    http_parser_init(&p, HTTP_REQUEST);
    memset(c, 0, sizeof(*c));
    p.data = c;
    http_parser_execute(&p, &hp_settings, s, len);
    return c->complete && (HTTP_PARSER_ERRNO(&p) == HPE_OK || HTTP_PARSER_ERRNO(&p) == HPE_CB_headers_complete);
}

static int atc_accepts(const char *s, size_t len)
{
    char *copy = malloc(len + 1);
    memcpy(copy, s, len);
    struct atc_http_head h;
    int rc = atc_http_parse_request(copy, len, 64 * 1024, &h);
    free(copy);
    return rc > 0;
}

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    long iters = argc > 1 ? atol(argv[1]) : 2000000;
    size_t len = sizeof(chat) - 1;
    char buf[sizeof(chat)];
    struct atc_http_head h;
    struct hp_ctx c;
    volatile size_t sink = 0;
    for (int round = 0; round < 3; round++) {
        double t0 = now_ns();
        for (long i = 0; i < iters; i++) {
            memcpy(buf, chat, len); /* it writes NULs into the buffer: a fresh copy, as a new read */
            sink += (size_t)atc_http_parse_request(buf, len, 64 * 1024, &h);
        }
        double t1 = now_ns();
        for (long i = 0; i < iters; i++) {
            memcpy(buf, chat, len);
            http_parser p;
            http_parser_init(&p, HTTP_REQUEST);
            c.n = 0;
            c.complete = 0;
            p.data = &c;
            sink += http_parser_execute(&p, &hp_settings, buf, len);
        }
        double t2 = now_ns();
        printf("round %d: chat head (%zu bytes, %u headers): atc %.0f ns, http_parser %.0f ns\n", round, len,
               h.nheaders, (t1 - t0) / (double)iters, (t2 - t1) / (double)iters);
    }

    static const struct {
        const char *name, *bytes;
        int want; /* 1: a server must take it; 0: it must refuse it */
    } cases[] = {
        {"chat request", chat, 1},
        {"GET, Host only", "GET /health HTTP/1.1\r\nHost: a\r\n\r\n", 1},
        {"HTTP/1.0", "GET / HTTP/1.0\r\n\r\n", 1},
        {"garbage", "GARBAGE\r\n\r\n", 0},
        {"no target", "GET\r\n\r\n", 0},
        {"unknown version", "GET /health HTTP/9.9\r\n\r\n", 0},
        {"extra words", "GET /health HTTP/1.1 extra\r\n\r\n", 0},
        {"binary", "\x01\x02\xff\r\n\r\n", 0},
        {"bad target", "GET http://[::1 HTTP/1.1\r\n\r\n", 0},
        {"no colon", "GET / HTTP/1.1\r\nNoColonHere\r\n\r\n", 0},
        {"length not a number", "POST / HTTP/1.1\r\nContent-Length: abc\r\n\r\n", 0},
        {"negative length", "POST / HTTP/1.1\r\nContent-Length: -5\r\n\r\n", 0},
        {"obs-fold", "GET / HTTP/1.1\r\nX-A: a\r\n b\r\n\r\n", 0},
        {"CL and TE together", "POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", 0},
        {"space before colon", "GET / HTTP/1.1\r\nHost : x\r\n\r\n", 0},
        {"bare CR in value", "GET / HTTP/1.1\r\nX-A: a\rb\r\n\r\n", 0},
        {"DEL in value", "GET / HTTP/1.1\r\nX-A: a\x7f\r\n\r\n", 0},
        {"TE gzip, chunked", "POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 0},
    };
    int differ = 0;
    printf("\n%-22s %-6s %-6s %-11s\n", "input", "atc", "http_parser", "should");
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        size_t n = strlen(cases[i].bytes);
        int a = atc_accepts(cases[i].bytes, n), b = hp_accepts(cases[i].bytes, n, &c);
        printf("%-22s %-6s %-11s %s\n", cases[i].name, a ? "takes" : "400", b ? "takes" : "refuses",
               cases[i].want ? "take" : "refuse");
        differ += a != cases[i].want;
    }
    /* a NUL inside a header value */
    static const char nul[] = "GET / HTTP/1.1\r\nX-A: a\0b\r\n\r\n";
    printf("%-22s %-6s %-11s refuse\n", "NUL in value", atc_accepts(nul, sizeof(nul) - 1) ? "takes" : "400",
           hp_accepts(nul, sizeof(nul) - 1, &c) ? "takes" : "refuses");
    printf("(sink %zu)\n", (size_t)sink);
    return differ != 0;
}
