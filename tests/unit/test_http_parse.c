/* http/http_parse.c's chunked decoder, which the server (request bodies) and the upstream client
 * (answers, streams) share: its verdicts, and that they do not depend on where reads split the bytes. */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "http/http_parse.h"

/* Decodes @p in fed in pieces of @p step bytes (0: one piece); the verdict, the body in @p body. */
static int decode(const char *in, size_t step, char *body, size_t *body_len)
{
    struct atc_http_chunked c = {0};
    char buf[256];
    size_t len = strlen(in), fed = 0, pos = 0, out = 0;
    assert_true(len < sizeof(buf));
    int rc = 0;
    while (rc == 0 && fed < len) {
        size_t n = step == 0 || len - fed < step ? len - fed : step;
        memcpy(buf + fed, in + fed, n); /* the bytes arrive after those already there, as in a connection */
        fed += n;
        rc = atc_http_chunked_decode(&c, buf, fed, &pos, &out);
    }
    memcpy(body, buf, out);
    *body_len = out;
    return rc;
}

static void expect(const char *in, int rc, const char *body)
{
    for (size_t step = 0; step <= 3; step++) {
        char got[256];
        size_t n;
        assert_int_equal(decode(in, step, got, &n), rc);
        assert_int_equal(n, strlen(body));
        assert_memory_equal(got, body, n);
    }
}

static void test_sizes(void **state)
{
    (void)state;
    expect("5\r\nhello\r\n0\r\n\r\n", 1, "hello");
    expect("5\nhello\n0\n\n", 1, "hello");
    expect("5 ;a=b\r\nhello\r\n0\r\n\r\n", 1, "hello");
    expect("5\t\r\nhello\r\n0\r\n\r\n", 1, "hello");
    expect("0000000000000000005\r\nhello\r\n0\r\n\r\n", 1, "hello"); /* leading zeros are no size */
    expect("ffffffffffffffff\r\n", 0, "");                          /* 16 digits: a size, data to come */
    expect("10000000000000000\r\n", -1, "");                        /* 17: more than 64 bits */
    /* Not a size: read leniently, "0x5" was a last chunk and "hello" a trailer, an empty answer. */
    expect("0x5\r\nhello\r\n0\r\n\r\n", -1, "");
    expect("5zz\r\nhello\r\n0\r\n\r\n", -1, "");
    expect("5 x\r\nhello\r\n0\r\n\r\n", -1, "");
    expect("\r\nhello\r\n", -1, "");
}

/* A framing fault after good data: the data decoded before it is kept and counted, so a stream relays
 * what came before the fault whether or not the two came in one read. */
static void test_data_before_a_fault(void **state)
{
    (void)state;
    expect("5\r\nhelloXX", -1, "hello");
    expect("3\r\nabc\r\n2\r\nde\r\nzz\r\n", -1, "abcde");
}

/* Feeds @p prefix, then @p filler over and over (up to 1 MiB), with @p max_body as the limit, dropping
 * what was consumed after each piece as the server does; the verdict, and in *@p fed how many bytes it
 * took to come. */
static int flood(const char *prefix, char filler, uint64_t max_body, size_t *fed)
{
    struct atc_http_chunked c = {.max_body = max_body};
    char buf[1024];
    size_t len = strlen(prefix), pos = 0, out = 0;
    memcpy(buf, prefix, len);
    *fed = len;
    int rc = atc_http_chunked_decode(&c, buf, len, &pos, &out);
    while (rc == 0 && *fed < (1u << 20)) {
        memmove(buf + out, buf + pos, len - pos);
        len -= pos - out;
        pos = out;
        memset(buf + len, filler, 100);
        len += 100;
        *fed += 100;
        assert_true(len < sizeof(buf)); /* what is consumed can be dropped: nothing piles up */
        rc = atc_http_chunked_decode(&c, buf, len, &pos, &out);
    }
    return rc;
}

/* Framing is bounded: an endless extension, trailer line, run of leading zeros or of whitespace after the
 * size is refused once it passes its limit, instead of being taken until the peer stops. */
static void test_framing_is_bounded(void **state)
{
    (void)state;
    size_t fed;
    assert_int_equal(flood("1;", 'a', 0, &fed), -1);
    assert_true(fed <= ATC_HTTP_MAX_CHUNK_LINE + 100);
    assert_int_equal(flood("1;a=", '"', 0, &fed), -1);
    assert_true(fed <= ATC_HTTP_MAX_CHUNK_LINE + 100);
    assert_int_equal(flood("", '0', 0, &fed), -1);
    assert_true(fed <= ATC_HTTP_MAX_CHUNK_LINE + 100);
    assert_int_equal(flood("1", ' ', 0, &fed), -1);
    assert_true(fed <= ATC_HTTP_MAX_CHUNK_LINE + 100);
    assert_int_equal(flood("1\r\nx\r\n0\r\nX-T: ", 'v', 0, &fed), -1);
    assert_true(fed <= ATC_HTTP_MAX_TRAILERS + 200);
    /* many short trailer lines count together */
    assert_int_equal(flood("0\r\nX-T: 1\n", 'v', 0, &fed), -1);
    /* up to the limits, all is well */
    expect("0000000000000000000000000000000000000000000000000000000000005\r\nhello\r\n0\r\n\r\n", 1, "hello");
}

/* A chunk size past max_body is refused as it is read (-2), not after waiting for its data; an
 * unrepresentable one without a limit is a framing error. */
static void test_size_over_max_body(void **state)
{
    (void)state;
    size_t fed;
    assert_int_equal(flood("ffffffffffffffff", 'x', 1 << 20, &fed), -2);
    assert_int_equal(flood("100001", 'x', 1 << 20, &fed), -2);
    struct atc_http_chunked c = {.max_body = 1 << 20};
    char buf[64] = "100000\r\n"; /* 1 MiB: allowed, data to come */
    size_t pos = 0, out = 0;
    assert_int_equal(atc_http_chunked_decode(&c, buf, strlen(buf), &pos, &out), 0);
    /* the sizes add up: two chunks of 600 KiB pass 1 MiB at the second size */
    c = (struct atc_http_chunked){.max_body = 1 << 20};
    strcpy(buf, "96000\r\n");
    pos = out = 0;
    assert_int_equal(atc_http_chunked_decode(&c, buf, strlen(buf), &pos, &out), 0);
    c.left = 0; /* as if its data came */
    c.state = 4; /* CH_DATA_END */
    strcpy(buf, "\r\n96000\r\n");
    pos = out = 0;
    assert_int_equal(atc_http_chunked_decode(&c, buf, strlen(buf), &pos, &out), -2);
}

/* A CR in a trailer line is only its end: a bare one is refused. */
static void test_bare_cr_in_trailer(void **state)
{
    (void)state;
    expect("1\r\nx\r\n0\r\nX-T: a\rb\r\n\r\n", -1, "x");
    expect("1\r\nx\r\n0\r\nX-T: ab\r\n\r\n", 1, "x");
    expect("1\r\nx\r\n0\r\nX-T: ab\n\n", 1, "x");
}

/* Request heads: a few empty lines before the request line are skipped, a stream of them refused;
 * HTTP/1.1 needs a Host, and no request has two. */
static void test_request_heads(void **state)
{
    (void)state;
    struct atc_http_head h;
    char a[] = "\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n";
    assert_int_equal(atc_http_parse_request(a, strlen(a), 1024, &h), (int)strlen(a));
    char b[] = "\r\n\r\n\r\n\r\n\r\n";
    assert_int_equal(atc_http_parse_request(b, strlen(b), 1024, &h), -400);
    assert_ptr_equal(h.refused, &atc_http_refused_empty_lines);
    assert_string_equal(h.refused->code, "too_many_empty_lines");
    char c[] = "\n\n\n\n\n\n\n\n\n";
    assert_int_equal(atc_http_parse_request(c, strlen(c), 1024, &h), -400);
    char d[] = "\r\n\r\n";
    assert_int_equal(atc_http_parse_request(d, strlen(d), 1024, &h), 0); /* not yet */
    char e[] = "GET / HTTP/1.1\r\nX: y\r\n\r\n";
    assert_int_equal(atc_http_parse_request(e, strlen(e), 1024, &h), -400);
    assert_ptr_equal(h.refused, &atc_http_refused_missing_host);
    char f[] = "GET / HTTP/1.0\r\n\r\n"; /* HTTP/1.0 has no such rule */
    assert_int_equal(atc_http_parse_request(f, strlen(f), 1024, &h), (int)strlen(f));
    char g[] = "GET / HTTP/1.1\r\nHost: a\r\nX: y\r\nhost: b\r\n\r\n"; /* and one only, in any version */
    assert_int_equal(atc_http_parse_request(g, strlen(g), 1024, &h), -400);
    assert_ptr_equal(h.refused, &atc_http_refused_two_hosts);
    char i[] = "GET / HTTP/1.0\r\nHost: a\r\nHost: a\r\n\r\n";
    assert_int_equal(atc_http_parse_request(i, strlen(i), 1024, &h), -400);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_data_before_a_fault),
        cmocka_unit_test(test_framing_is_bounded),
        cmocka_unit_test(test_size_over_max_body),
        cmocka_unit_test(test_bare_cr_in_trailer),
        cmocka_unit_test(test_request_heads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
