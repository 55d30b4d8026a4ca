/* base/strbuf.h: the bounded string building the request path uses instead of snprintf. */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "base/strbuf.h"

static void test_appends_and_numbers(void **state)
{
    (void)state;
    char buf[64];
    struct atc_strbuf b = atc_strbuf_init(buf, sizeof(buf));
    assert_string_equal(buf, "");
    atc_strbuf_add(&b, "x-atc-policy-version: ");
    atc_strbuf_u64(&b, 0);
    atc_strbuf_add(&b, " ");
    atc_strbuf_u64(&b, 18446744073709551615ull);
    atc_strbuf_addn(&b, "\r\nnot this", 2);
    assert_string_equal(buf, "x-atc-policy-version: 0 18446744073709551615\r\n");
    assert_int_equal(b.len, strlen(buf));

    b = atc_strbuf_init(buf, sizeof(buf));
    atc_strbuf_hex(&b, 0, 0);
    atc_strbuf_add(&b, " ");
    atc_strbuf_hex(&b, 0x1a2f, 0);
    atc_strbuf_add(&b, " ");
    atc_strbuf_hex(&b, 0x2a, 16);
    atc_strbuf_add(&b, " ");
    atc_strbuf_hex(&b, UINT64_MAX, 16);
    assert_string_equal(buf, "0 1a2f 000000000000002a ffffffffffffffff");
}

/* Output is cut at the buffer's size and stays terminated, as snprintf's does; nothing is written
 * past it. */
static void test_cut_at_size(void **state)
{
    (void)state;
    char buf[12];
    memset(buf, 'X', sizeof(buf));
    struct atc_strbuf b = atc_strbuf_init(buf, 8);
    atc_strbuf_add(&b, "abcd");
    atc_strbuf_u64(&b, 123456);
    assert_string_equal(buf, "abcd123");
    atc_strbuf_add(&b, "more");
    assert_string_equal(buf, "abcd123");
    assert_int_equal(b.len, 7);
    assert_int_equal(buf[8], 'X');

    char one[1] = {'X'};
    b = atc_strbuf_init(one, 1);
    atc_strbuf_add(&b, "anything");
    assert_int_equal(one[0], '\0');
}

static void test_strlcpy(void **state)
{
    (void)state;
    char buf[6];
    atc_strlcpy(buf, sizeof(buf), "tenant-with-a-long-name");
    assert_string_equal(buf, "tenan");
    atc_strlcpy(buf, sizeof(buf), NULL);
    assert_string_equal(buf, "");
    atc_strlcpy(buf, sizeof(buf), "ok");
    assert_string_equal(buf, "ok");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_appends_and_numbers),
        cmocka_unit_test(test_cut_at_size),
        cmocka_unit_test(test_strlcpy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
