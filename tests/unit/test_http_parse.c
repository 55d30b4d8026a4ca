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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_data_before_a_fault),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
