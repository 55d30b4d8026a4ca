/* base/json.c: the small JSON reader that cli.c, health.c and trace_import.c share. */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "base/json.h"

static int parse(struct atc_json *j, const char *s, const char **why)
{
    return atc_json_parse(j, s, strlen(s), why);
}

static void test_lookups(void **state)
{
    struct atc_json j = {0};
    const char *doc = "{\"error\": {\"message\": \"no \\\"such\\\" model \\u00e9\", \"code\": 404},"
                      " \"data\": [{\"id\": \"a\"}, [1, [2]], {\"id\": \"b\"}], \"n\": 18446744073709551615,"
                      " \"x\": -1.5e3, \"on\": true, \"off\": false, \"none\": null}";
    assert_int_equal(parse(&j, doc, NULL), 0);
    assert_int_equal(atc_json_type(&j, 0), ATC_JSON_OBJECT);
    assert_int_equal(atc_json_count(&j, 0), 7);

    char buf[64];
    size_t len;
    int msg = atc_json_get(&j, atc_json_get(&j, 0, "error"), "message");
    assert_int_equal(atc_json_string(&j, msg, buf, sizeof(buf), &len), 0);
    assert_string_equal(buf, "no \"such\" model \xc3\xa9");
    assert_int_equal(len, strlen(buf));
    assert_int_equal(atc_json_string(&j, msg, buf, 5, NULL), -1); /* does not fit */

    /* items of an array, skipping nested values whole */
    int data = atc_json_get(&j, 0, "data");
    assert_int_equal(atc_json_type(&j, data), ATC_JSON_ARRAY);
    assert_int_equal(atc_json_count(&j, data), 3);
    int i = data + 1;
    assert_int_equal(atc_json_string(&j, atc_json_get(&j, i, "id"), buf, sizeof(buf), NULL), 0);
    assert_string_equal(buf, "a");
    i = atc_json_next(&j, i);
    assert_int_equal(atc_json_type(&j, i), ATC_JSON_ARRAY);
    i = atc_json_next(&j, i);
    assert_int_equal(atc_json_string(&j, atc_json_get(&j, i, "id"), buf, sizeof(buf), NULL), 0);
    assert_string_equal(buf, "b");

    uint64_t u;
    double d;
    bool b;
    assert_true(atc_json_uint(&j, atc_json_get(&j, 0, "n"), UINT64_MAX, &u));
    assert_true(u == UINT64_MAX);
    assert_false(atc_json_uint(&j, atc_json_get(&j, 0, "n"), 10, &u));
    assert_false(atc_json_uint(&j, atc_json_get(&j, 0, "x"), UINT64_MAX, &u));
    assert_true(atc_json_number(&j, atc_json_get(&j, 0, "x"), &d));
    assert_true(d == -1500);
    assert_true(atc_json_bool(&j, atc_json_get(&j, 0, "on"), &b) && b);
    assert_true(atc_json_bool(&j, atc_json_get(&j, 0, "off"), &b) && !b);
    assert_false(atc_json_bool(&j, atc_json_get(&j, 0, "none"), &b));

    /* a key that is not there, and lookups on "none" (-1), answer "not found" without reading */
    assert_int_equal(atc_json_get(&j, 0, "missing"), -1);
    assert_int_equal(atc_json_get(&j, -1, "error"), -1);
    assert_int_equal(atc_json_type(&j, -1), ATC_JSON_NONE);
    assert_int_equal(atc_json_count(&j, -1), 0);
    assert_int_equal(atc_json_string(&j, -1, buf, sizeof(buf), NULL), -1);
    assert_false(atc_json_number(&j, atc_json_get(&j, 0, "error"), &d));
    const char *raw = atc_json_raw(&j, atc_json_get(&j, 0, "x"), &len);
    assert_int_equal(len, 6);
    assert_memory_equal(raw, "-1.5e3", 6);
    assert_null(atc_json_raw(&j, -1, &len));
    assert_int_equal(len, 0);

    /* the token array is reused by the next parse */
    assert_int_equal(parse(&j, "[1, 2]", NULL), 0);
    assert_int_equal(atc_json_count(&j, 0), 2);
    assert_int_equal(atc_json_get(&j, 0, "error"), -1); /* not an object */
    atc_json_dispose(&j);
}

static void test_refused(void **state)
{
    struct atc_json j = {0};
    const char *why = NULL;
    assert_int_equal(parse(&j, "{\"a\": }", &why), -1);
    assert_string_equal(why, "invalid JSON");
    assert_int_equal(parse(&j, "{} {}", &why), -1);
    assert_string_equal(why, "invalid JSON");
    assert_int_equal(parse(&j, "", &why), -1);
    char deep[200];
    memset(deep, '[', sizeof(deep) - 1);
    deep[sizeof(deep) - 1] = '\0';
    assert_int_equal(parse(&j, deep, &why), -1);
    assert_string_equal(why, "JSON nested too deeply");
    assert_int_equal(parse(&j, "{\"s\": \"bad \\u12\"}", &why), -1); /* a short \u escape */
    assert_int_equal(parse(&j, "{\"a\"}", &why), -1);                /* a key without a value */
    assert_int_equal(parse(&j, "{\"a\": 1, 2: 3}", &why), -1);       /* a key that is not a string */
    assert_int_equal(parse(&j, "{\"a\": [1, {\"b\"}]}", &why), -1);  /* ... also when nested */
    atc_json_dispose(&j);
}

/* The one JSON string writer, to an evbuffer and to a FILE: the same escapes either way (the trace dump,
 * replay's JSON, the simulated server and the answers all write through it). */
static void test_string_writers(void **state)
{
    (void)state;
    static const char in[] = "a\"b\\c\nd\x01\x7f\xc3\xa9\xff";
    static const char want[] = "\"a\\\"b\\\\c\\nd\\u0001\x7f\xc3\xa9\\ufffd\"";
    struct evbuffer *b = evbuffer_new();
    atc_json_write_string(b, in);
    evbuffer_add(b, "", 1);
    assert_string_equal((const char *)evbuffer_pullup(b, -1), want);
    evbuffer_free(b);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    atc_json_fwrite_string(f, in, strlen(in));
    fclose(f);
    assert_string_equal(text, want);
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lookups),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_string_writers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
