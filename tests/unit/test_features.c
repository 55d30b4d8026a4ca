/* Unit tests for engine/request/request_features.c: what a router reads from OpenAI request bodies. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "request/request_features.h"

static struct atc_features f; /* 4 KiB of hashes: keep it off the stack */

static int scan(enum atc_request_kind kind, const char *body, const char **err)
{
    *err = NULL;
    int rc = atc_features_scan(kind, body, strlen(body), &f, err);
    if (rc == 0)
        assert_null(*err);
    else
        assert_non_null(*err);
    return rc;
}

/* Scans @p body expecting failure with message @p want. */
static void expect_error(enum atc_request_kind kind, const char *body, const char *want)
{
    const char *err;
    if (scan(kind, body, &err) == 0)
        fail_msg("accepted: %s", body);
    assert_string_equal(err, want);
}

static void assert_prompt(const char *want)
{
    assert_non_null(f.prompt);
    assert_int_equal(f.prompt_len, strlen(want));
    assert_memory_equal(f.prompt, want, f.prompt_len);
}

static char *repeat(char c, size_t n)
{
    char *s = malloc(n + 1);
    assert_non_null(s);
    memset(s, c, n);
    s[n] = '\0';
    return s;
}

/* ---- basic requests -------------------------------------------------------------------------------- */

static void test_chat_basic(void **state)
{
    const char *messages =
        "[{\"role\":\"system\",\"content\":\"be brief\"},{\"role\":\"user\",\"content\":\"hi\"}]";
    char body[512];
    snprintf(body, sizeof body,
             "{\"model\":\"llama-3-8b\",\"messages\":%s,\"stream\":true,\"max_tokens\":128,\"user\":\"u-42\","
             "\"temperature\":0.7,\"stop\":null,\"logit_bias\":{\"50256\":-100}}",
             messages);
    const char *err;
    assert_int_equal(scan(ATC_KIND_CHAT, body, &err), 0);
    assert_true(f.has_model);
    assert_string_equal(f.model, "llama-3-8b");
    assert_true(f.stream);
    assert_int_equal(f.max_tokens, 128);
    assert_string_equal(f.user, "u-42");
    assert_prompt(messages);
    assert_int_equal(f.prompt_tokens, (strlen(messages) + 3) / 4);
    assert_int_equal(f.nblocks, 0);
}

static void test_chat_defaults(void **state)
{
    const char *err;
    assert_int_equal(scan(ATC_KIND_CHAT, " \n\t{\"messages\":[]}\r\n ", &err), 0);
    assert_false(f.has_model);
    assert_string_equal(f.model, "");
    assert_false(f.stream);
    assert_int_equal(f.max_tokens, -1);
    assert_int_equal(f.choices, 1);
    assert_string_equal(f.user, "");
    assert_prompt("[]");
    assert_int_equal(f.prompt_tokens, 1);
}

static void test_tools_and_model_span(void **state)
{
    const char *err;
    const char *body = "{\"model\":\"auto\",\"messages\":[],\"tools\":[{\"type\":\"function\"}]}";
    assert_int_equal(scan(ATC_KIND_CHAT, body, &err), 0);
    assert_true(f.has_tools);
    /* the span of the model's characters, used to rewrite an alias */
    assert_int_equal(f.model_end - f.model_start, 4);
    assert_memory_equal(body + f.model_start, "auto", 4);
    assert_int_equal(scan(ATC_KIND_CHAT, "{\"model\":\"m\",\"messages\":[],\"tools\":[]}", &err), 0);
    assert_false(f.has_tools); /* an empty list offers no tool */
    assert_int_equal(scan(ATC_KIND_CHAT, "{\"model\":\"m\",\"messages\":[{\"tools\":[1]}]}", &err), 0);
    assert_false(f.has_tools); /* nested keys do not count */
}

static void test_completion(void **state)
{
    const char *err;
    assert_int_equal(scan(ATC_KIND_COMPLETION, "{\"model\":\"m\",\"prompt\":\"Say \\\"hi\\\"\\n\"}", &err),
                     0);
    assert_prompt("Say \\\"hi\\\"\\n");   /* raw bytes between the quotes, escapes left alone */
    assert_int_equal(f.prompt_tokens, 3); /* 12 bytes */
    assert_int_equal(scan(ATC_KIND_COMPLETION, "{\"prompt\":[[1, 2, 3], [4]],\"model\":\"m\"}", &err), 0);
    assert_prompt("[[1, 2, 3], [4]]");
    assert_int_equal(scan(ATC_KIND_COMPLETION, "{\"prompt\":\"\"}", &err), 0);
    assert_int_equal(f.prompt_len, 0);
    assert_int_equal(f.prompt_tokens, 0);

    expect_error(ATC_KIND_COMPLETION, "{\"model\":\"m\"}", "'prompt' is required");
    expect_error(ATC_KIND_COMPLETION, "{\"model\":\"m\",\"messages\":[]}", "'prompt' is required");
    expect_error(ATC_KIND_COMPLETION, "{\"prompt\":{\"text\":\"x\"}}",
                 "'prompt' must be a string or an array");
    expect_error(ATC_KIND_COMPLETION, "{\"prompt\":7}", "'prompt' must be a string or an array");
}

static void test_embedding(void **state)
{
    const char *err;
    assert_int_equal(scan(ATC_KIND_EMBEDDING, "{\"model\":\"bge\",\"input\":\"hello world\"}", &err), 0);
    assert_string_equal(f.model, "bge");
    assert_prompt("hello world");
    assert_int_equal(f.prompt_tokens, 3);
    assert_int_equal(scan(ATC_KIND_EMBEDDING, "{\"input\":[\"a\",\"b\"],\"model\":\"bge\"}", &err), 0);
    assert_prompt("[\"a\",\"b\"]");

    expect_error(ATC_KIND_EMBEDDING, "{\"model\":\"bge\",\"prompt\":\"x\"}", "'input' is required");
    expect_error(ATC_KIND_EMBEDDING, "{\"input\":true}", "'input' must be a string or an array");
    expect_error(ATC_KIND_EMBEDDING, "{\"input\":null}", "'input' must be a string or an array");
}

/* ---- top-level lookup ------------------------------------------------------------------------------ */

static void test_nested_keys_ignored(void **state)
{
    const char *body =
        "{\"messages\":[{\"role\":\"user\",\"model\":\"evil\",\"content\":[{\"type\":\"text\",\"text\":\"x\","
        "\"stream\":true},{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:,\",\"max_tokens\":9}}]},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
        "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"model\\\":\\\"evil2\\\"}\",\"user\":\"u\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"{}\",\"messages\":7}],"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"model\":{\"type\":\"string\"}}}}}],"
        "\"model\":\"good\"}";
    const char *err;
    assert_int_equal(scan(ATC_KIND_CHAT, body, &err), 0);
    assert_true(f.has_model);
    assert_string_equal(f.model, "good");
    assert_false(f.stream);
    assert_int_equal(f.max_tokens, -1);
    assert_string_equal(f.user, "");
    assert_true(f.prompt[0] == '[');
    assert_true(f.prompt[f.prompt_len - 1] == ']');
    assert_ptr_equal(f.prompt, strstr(body, "[{\"role\":\"user\""));
    assert_ptr_equal(f.prompt + f.prompt_len, strstr(body, ",\"tools\""));

    /* only a nested model: none at top level */
    assert_int_equal(
        scan(ATC_KIND_CHAT, "{\"messages\":[{\"model\":\"evil\"}],\"x\":{\"model\":\"e\"}}", &err), 0);
    assert_false(f.has_model);
    assert_string_equal(f.model, "");
}

static void test_duplicate_keys_last_wins(void **state)
{
    const char *err;
    /* as Python's json module reads it, so router and server agree */
    assert_int_equal(scan(ATC_KIND_CHAT,
                          "{\"model\":\"a\",\"messages\":7,\"stream\":1,\"model\":\"b\",\"messages\":[],"
                          "\"stream\":true}",
                          &err),
                     0);
    assert_string_equal(f.model, "b");
    assert_true(f.stream);
    assert_prompt("[]");
    expect_error(ATC_KIND_CHAT, "{\"model\":\"a\",\"messages\":[],\"model\":3}", "'model' must be a string");
}

static void test_model_escapes(void **state)
{
    const char *err;
    assert_int_equal(scan(ATC_KIND_CHAT,
                          "{\"messages\":[],\"model\":\"org\\/llama\\\"3\\\\ \\t\\u0041\\u00e9\\u20ac"
                          "\\ud83d\\ude00\\uD800x\"}",
                          &err),
                     0);
    assert_string_equal(f.model, "org/llama\"3\\ \tA\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xef\xbf\xbdx");
    /* raw UTF-8 passes through */
    assert_int_equal(scan(ATC_KIND_CHAT, "{\"messages\":[],\"model\":\"mod\xc3\xa8le\"}", &err), 0);
    assert_string_equal(f.model, "mod\xc3\xa8le");
    /* an escaped key is the same key to the server */
    assert_int_equal(
        scan(ATC_KIND_CHAT, "{\"mod\\u0065l\":\"x\",\"m\\u0065ssages\":[1],\"str\\u0065am\":true}", &err), 0);
    assert_string_equal(f.model, "x");
    assert_true(f.stream);
    assert_prompt("[1]");
    expect_error(ATC_KIND_CHAT, "{\"messages\":[],\"model\":\"a\\u0000b\"}",
                 "'model' must not contain a NUL character");
}

static void test_model_missing_and_wrong(void **state)
{
    const char *err;
    assert_int_equal(scan(ATC_KIND_CHAT, "{\"messages\":[],\"model\":null}", &err), 0);
    assert_false(f.has_model);
    assert_int_equal(scan(ATC_KIND_CHAT, "{\"messages\":[],\"model\":\"\"}", &err), 0);
    assert_true(f.has_model);
    assert_string_equal(f.model, "");
    expect_error(ATC_KIND_CHAT, "{\"messages\":[],\"model\":42}", "'model' must be a string");
    expect_error(ATC_KIND_CHAT, "{\"messages\":[],\"model\":[\"a\"]}", "'model' must be a string");
    expect_error(ATC_KIND_CHAT, "{\"messages\":[],\"model\":{\"name\":\"a\"}}", "'model' must be a string");
}

static void test_model_length(void **state)
{
    char body[1024];
    char *name = repeat('m', ATC_FEATURES_NAME_MAX - 1);
    const char *err;
    snprintf(body, sizeof body, "{\"messages\":[],\"model\":\"%s\"}", name);
    assert_int_equal(scan(ATC_KIND_CHAT, body, &err), 0);
    assert_string_equal(f.model, name);
    free(name);

    name = repeat('m', ATC_FEATURES_NAME_MAX);
    snprintf(body, sizeof body, "{\"messages\":[],\"model\":\"%s\"}", name);
    expect_error(ATC_KIND_CHAT, body, "'model' is too long");
    free(name);

    /* 250 bytes raw, but escapes decode to 254 + a 2-byte character that does not fit */
    name = repeat('m', 250);
    snprintf(body, sizeof body, "{\"messages\":[],\"model\":\"%s\\u0041\\u0041\\u0041\\u0041\\u00e9\"}",
             name);
    expect_error(ATC_KIND_CHAT, body, "'model' is too long");
    free(name);
}

static void test_user(void **state)
{
    char body[1024];
    char *name = repeat('u', ATC_FEATURES_NAME_MAX - 2);
    const char *err;
    /* too long: cut before the character that does not fit, never inside it */
    snprintf(body, sizeof body, "{\"messages\":[],\"user\":\"%s\xc3\xa9tail\"}", name);
    assert_int_equal(scan(ATC_KIND_CHAT, body, &err), 0);
    assert_string_equal(f.user, name);
    free(name);
    assert_int_equal(scan(ATC_KIND_CHAT, "{\"messages\":[],\"user\":\"a\\u00e9\"}", &err), 0);
    assert_string_equal(f.user, "a\xc3\xa9");
    assert_int_equal(scan(ATC_KIND_CHAT, "{\"messages\":[],\"user\":null}", &err), 0);
    assert_string_equal(f.user, "");
    expect_error(ATC_KIND_CHAT, "{\"messages\":[],\"user\":12}", "'user' must be a string");
}

static void test_messages_required(void **state)
{
    expect_error(ATC_KIND_CHAT, "{\"model\":\"m\"}", "'messages' is required");
    expect_error(ATC_KIND_CHAT, "{}", "'messages' is required");
    expect_error(ATC_KIND_CHAT, "{\"model\":\"m\",\"prompt\":\"hi\"}", "'messages' is required");
    expect_error(ATC_KIND_CHAT, "{\"messages\":{}}", "'messages' must be an array");
    expect_error(ATC_KIND_CHAT, "{\"messages\":\"hi\"}", "'messages' must be an array");
    expect_error(ATC_KIND_CHAT, "{\"messages\":null}", "'messages' must be an array");
    expect_error(ATC_KIND_CHAT, "{\"messages\":3}", "'messages' must be an array");
}

static void test_stream(void **state)
{
    const char *err;
    assert_int_equal(scan(ATC_KIND_CHAT, "{\"messages\":[],\"stream\":true}", &err), 0);
    assert_true(f.stream);
    assert_int_equal(scan(ATC_KIND_CHAT, "{\"stream\":false,\"messages\":[]}", &err), 0);
    assert_false(f.stream);
    assert_int_equal(scan(ATC_KIND_CHAT, "{\"stream\":null,\"messages\":[]}", &err), 0);
    assert_false(f.stream);
    assert_int_equal(scan(ATC_KIND_CHAT, "{\"messages\":[],\"stream\" : true }", &err), 0);
    assert_true(f.stream);
    expect_error(ATC_KIND_CHAT, "{\"messages\":[],\"stream\":\"true\"}", "'stream' must be a boolean");
    expect_error(ATC_KIND_CHAT, "{\"messages\":[],\"stream\":1}", "'stream' must be a boolean");
    expect_error(ATC_KIND_CHAT, "{\"messages\":[],\"stream\":{}}", "'stream' must be a boolean");
}

static void test_max_tokens(void **state)
{
    static const struct {
        const char *json;
        int64_t want;
    } ok[] = {
        {"{\"messages\":[],\"max_tokens\":0}", 0},
        {"{\"messages\":[],\"max_tokens\":4096}", 4096},
        {"{\"messages\":[],\"max_tokens\":null}", -1},
        {"{\"messages\":[],\"max_completion_tokens\":77}", 77},
        {"{\"messages\":[],\"max_tokens\":9223372036854775807}", INT64_MAX},
        /* the newer name wins whatever the order */
        {"{\"messages\":[],\"max_tokens\":10,\"max_completion_tokens\":20}", 20},
        {"{\"max_completion_tokens\":20,\"messages\":[],\"max_tokens\":10}", 20},
        {"{\"max_completion_tokens\":null,\"messages\":[],\"max_tokens\":10}", 10},
    };
    const char *err;
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        assert_int_equal(scan(ATC_KIND_CHAT, ok[i].json, &err), 0);
        assert_int_equal(f.max_tokens, ok[i].want);
    }
    static const char *const bad[] = {
        "-1", "1.5", "1e3", "\"10\"", "true", "[10]", "9223372036854775808", "99999999999999999999999"};
    char body[128];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(body, sizeof body, "{\"messages\":[],\"max_tokens\":%s}", bad[i]);
        expect_error(ATC_KIND_CHAT, body, "'max_tokens' must be a non-negative integer");
        snprintf(body, sizeof body, "{\"messages\":[],\"max_completion_tokens\":%s}", bad[i]);
        expect_error(ATC_KIND_CHAT, body, "'max_completion_tokens' must be a non-negative integer");
    }
}

/* n: the choices an engine runs a sequence for each; absent, null, 0 or not a count, it counts as 1 (the
 * engine refuses what is wrong), a huge n as ATC_FEATURES_CHOICES_MAX; a nested "n" is not the request's. */
static void test_choices(void **state)
{
    static const struct {
        const char *json;
        uint32_t want;
    } ok[] = {
        {"{\"messages\":[]}", 1},
        {"{\"messages\":[],\"n\":4}", 4},
        {"{\"n\":null,\"messages\":[]}", 1},
        {"{\"messages\":[],\"n\":0}", 1},
        {"{\"messages\":[],\"n\":100000000}", ATC_FEATURES_CHOICES_MAX},
        {"{\"messages\":[{\"n\":9}],\"n\":2}", 2},
        {"{\"messages\":[],\"\\u006e\":3}", 3}, /* "\u006e" is "n" to the engine */
    };
    const char *err;
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        assert_int_equal(scan(ATC_KIND_CHAT, ok[i].json, &err), 0);
        assert_int_equal(f.choices, ok[i].want);
    }
    assert_int_equal(scan(ATC_KIND_COMPLETION, "{\"prompt\":\"x\",\"n\":3}", &err), 0);
    assert_int_equal(f.choices, 3);
    static const char *const bad[] = {"-1", "1.5", "\"2\"", "true", "[2]"};
    char body[128];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) { /* the engine's to refuse */
        snprintf(body, sizeof body, "{\"messages\":[],\"n\":%s}", bad[i]);
        assert_int_equal(scan(ATC_KIND_CHAT, body, &err), 0);
        assert_int_equal(f.choices, 1);
    }
}

/* ---- malformed bodies ------------------------------------------------------------------------------ */

static void test_not_an_object(void **state)
{
    expect_error(ATC_KIND_CHAT, "", "request body is empty");
    expect_error(ATC_KIND_CHAT, " \r\n\t", "request body is empty");
    expect_error(ATC_KIND_CHAT, "[]", "request body must be a JSON object");
    expect_error(ATC_KIND_CHAT, "\"messages\"", "request body must be a JSON object");
    expect_error(ATC_KIND_CHAT, "42", "request body must be a JSON object");
    expect_error(ATC_KIND_CHAT, "null", "request body must be a JSON object");
    expect_error(ATC_KIND_CHAT, "messages=[]", "request body must be a JSON object");
}

static void test_malformed(void **state)
{
    static const char *const bad[] = {
        /* truncated */
        "{",
        "{\"messages\":[",
        "{\"messages\":[],\"model\":\"llama",
        "{\"messages\":[],\"model\":",
        "{\"messages\":[],\"model\"",
        "{\"messages\":[],\"max_tokens\":12",
        "{\"messages\":[{\"role\":\"user\"}]",
        /* trailing garbage */
        "{\"messages\":[]} x",
        "{\"messages\":[]}{}",
        "{\"messages\":[]}}",
        "{\"messages\":[]}]",
        "{\"messages\":[]} 1",
        "{\"messages\":[]}\"",
        /* what strict jsmn still lets through */
        "{\"messages\":[1 2]}",
        "{\"messages\":[1,]}",
        "{\"messages\":[,1]}",
        "{\"messages\":[1,,2]}",
        "{\"messages\":[],}",
        "{,\"messages\":[]}",
        "{\"messages\":[] \"model\":\"m\"}",
        "{\"messages\" []}",
        "{\"messages\"::[]}",
        "{\"messages\":[],\"a\"}",
        "{\"messages\":[],\"a\":}",
        "{\"messages\":[],\"a\":\"b\":\"c\"}",
        "{\"messages\":[{\"a\" \"b\"}]}",
        "{\"messages\":[\"a\":1]}",
        "{\"messages\":[{\"a\":1 \"b\":2}]}",
        "{\"messages\":[],\"stream\":tru}",
        "{\"messages\":[],\"stream\":truex}",
        "{\"messages\":[],\"stream\":nul}",
        "{\"messages\":[],\"max_tokens\":01}",
        "{\"messages\":[],\"max_tokens\":1.}",
        "{\"messages\":[],\"max_tokens\":.5}",
        "{\"messages\":[],\"max_tokens\":1e}",
        "{\"messages\":[],\"max_tokens\":-}",
        "{\"messages\":[],\"max_tokens\":+1}",
        "{\"messages\":[],\"x\":t[[[[}",
        "{\"messages\":[],\"x\":1\"a\"}",
        "{\"messages\":[],\"model\":'m'}",
        "{messages:[]}",
        "{\"messages\":[],\"model\":\"a\\x\"}",
        "{\"messages\":[],\"model\":\"a\\u12\"}",
        "{\"messages\":[],\"model\":\"tab\there\"}",
        "{\"messages\":[],\"model\":\"new\nline\"}",
        "{\"messages\":[],\"k\ney\":1}",
        "{\"messages\":[}",
        "{\"messages\":[]]",
        "{\"messages\":[]}]]]]][[[[[",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_error(ATC_KIND_CHAT, bad[i], "invalid JSON body");

    /* a NUL byte ends jsmn's input; it must not end ours */
    static const char nul[] = "{\"messages\":[]}\0{\"x\":1}";
    const char *err = NULL;
    assert_int_equal(atc_features_scan(ATC_KIND_CHAT, nul, sizeof nul - 1, &f, &err), -1);
    assert_string_equal(err, "invalid JSON body");
    static const char nul_in_string[] = "{\"messages\":[],\"model\":\"a\0b\"}";
    err = NULL;
    assert_int_equal(atc_features_scan(ATC_KIND_CHAT, nul_in_string, sizeof nul_in_string - 1, &f, &err), -1);
    assert_string_equal(err, "invalid JSON body");

    /* the length bounds the scan: a valid body followed by bytes we were not given */
    static const char longer[] = "{\"messages\":[]}GARBAGE";
    err = NULL;
    assert_int_equal(atc_features_scan(ATC_KIND_CHAT, longer, strlen("{\"messages\":[]}"), &f, &err), 0);
    err = NULL;
    assert_int_equal(atc_features_scan(ATC_KIND_CHAT, longer, strlen("{\"messages\":[]"), &f, &err), -1);
    assert_string_equal(err, "invalid JSON body");
}

static void test_valid_syntax_variety(void **state)
{
    /* all legal JSON: must not be refused by the stricter checks */
    const char *body = "{ \"messages\" : [ { \"role\" : \"user\" , \"content\" : [ ] } , { } , [ [ ] ] ] ,\n"
                       "  \"x\" : [ -0 , 0.5 , -1.25e+10 , 3E-2 , 1e5 , true , false , null , \"\" ] ,\n"
                       "  \"s\" : \"\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00FF\\\\\" , \"\" : { \"\" : \"\" } }";
    const char *err;
    assert_int_equal(scan(ATC_KIND_CHAT, body, &err), 0);
    assert_int_equal(f.prompt[0], '[');
}

/* ---- nesting depth --------------------------------------------------------------------------------- */

static char *nested(const char *head, size_t depth, const char *tail, bool close)
{
    size_t hl = strlen(head), tl = strlen(tail);
    char *s = malloc(hl + 2 * depth + tl + 1);
    assert_non_null(s);
    memcpy(s, head, hl);
    memset(s + hl, '[', depth);
    size_t n = hl + depth;
    if (close) {
        memset(s + n, ']', depth);
        n += depth;
    }
    memcpy(s + n, tail, tl + 1);
    return s;
}

static void test_depth(void **state)
{
    const char *err;
    /* the outer object is depth 1: 63 more brackets make 64 */
    char *s = nested("{\"messages\":", ATC_FEATURES_DEPTH_MAX - 1, "}", true);
    assert_int_equal(scan(ATC_KIND_CHAT, s, &err), 0);
    free(s);
    s = nested("{\"messages\":", ATC_FEATURES_DEPTH_MAX, "}", true);
    expect_error(ATC_KIND_CHAT, s, "JSON nested too deeply");
    free(s);
    /* objects count as well as arrays */
    assert_int_equal(scan(ATC_KIND_CHAT, "{\"messages\":[],\"a\":{\"b\":{\"c\":[{}]}}}", &err), 0);

    s = repeat('[', 10000);
    assert_int_equal(scan(ATC_KIND_CHAT, s, &err), -1);
    free(s);

    s = nested("{\"messages\":", 10000, "", false);
    expect_error(ATC_KIND_CHAT, s, "JSON nested too deeply");
    free(s);

    /* a closed bomb: jsmn alone is quadratic here, so it must be turned away before jsmn runs */
    s = nested("{\"messages\":[],\"x\":", 1000000, "}", true);
    clock_t t0 = clock();
    expect_error(ATC_KIND_CHAT, s, "JSON nested too deeply");
    assert_true(clock() - t0 < CLOCKS_PER_SEC / 10);
    free(s);

    /* unmatched closers do not buy depth back */
    s = nested("{\"messages\":[]}]]]]]", ATC_FEATURES_DEPTH_MAX + 3, "", false);
    expect_error(ATC_KIND_CHAT, s, "invalid JSON body");
    free(s);

    /* brackets inside strings are text, not nesting */
    s = nested("{\"messages\":[\"", 10000, "\"]}", true);
    assert_int_equal(scan(ATC_KIND_CHAT, s, &err), 0);
    free(s);
}

/* ---- large bodies ---------------------------------------------------------------------------------- */

static void test_huge_prompt(void **state)
{
    const size_t content = 4u << 20;
    const char *head = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"";
    const char *tail = "\"}],\"stream\":true}";
    size_t hl = strlen(head), tl = strlen(tail);
    char *body = malloc(hl + content + tl);
    assert_non_null(body);
    memcpy(body, head, hl);
    for (size_t i = 0; i < content; i++)
        body[hl + i] = (char)('a' + i % 26);
    memcpy(body + hl + content, tail, tl);

    const char *err = NULL;
    assert_int_equal(atc_features_scan(ATC_KIND_CHAT, body, hl + content + tl, &f, &err), 0);
    assert_string_equal(f.model, "m");
    assert_true(f.stream);
    assert_ptr_equal(f.prompt, body + strlen("{\"model\":\"m\",\"messages\":"));
    assert_int_equal(f.prompt_len, content + strlen("[{\"role\":\"user\",\"content\":\"\"}]"));
    assert_in_range(f.prompt_tokens, content / 4, content / 4 + 16);
    assert_int_equal(f.nblocks, ATC_PREFIX_BLOCKS_MAX);
    uint64_t want[ATC_PREFIX_BLOCKS_MAX];
    assert_int_equal(atc_prefix_hash(f.prompt, f.prompt_len, want, ATC_PREFIX_BLOCKS_MAX),
                     ATC_PREFIX_BLOCKS_MAX);
    assert_memory_equal(f.blocks, want, sizeof want);
    free(body);
}

static void test_many_tokens(void **state)
{
    /* a prompt of token ids: many jsmn tokens, so the token array grows (and is given back after) */
    const size_t ids = 200000;
    char *body = malloc(ids * 8 + 64);
    assert_non_null(body);
    size_t n = (size_t)snprintf(body, 64, "{\"model\":\"m\",\"prompt\":[");
    for (size_t i = 0; i < ids; i++)
        n += (size_t)snprintf(body + n, 8, "%zu,", i % 100000);
    body[n - 1] = ']';
    body[n++] = '}';
    const char *err = NULL;
    assert_int_equal(atc_features_scan(ATC_KIND_COMPLETION, body, n, &f, &err), 0);
    assert_int_equal(f.prompt_len, n - strlen("{\"model\":\"m\",\"prompt\":") - 1);
    assert_int_equal(f.nblocks, ATC_PREFIX_BLOCKS_MAX);
    free(body);

    /* and a small body right after still scans */
    assert_int_equal(scan(ATC_KIND_COMPLETION, "{\"prompt\":[1,2,3]}", &err), 0);
    assert_prompt("[1,2,3]");
    atc_features_release();
    assert_int_equal(scan(ATC_KIND_COMPLETION, "{\"prompt\":[4]}", &err), 0);
    assert_prompt("[4]");
    atc_features_release();
}

/* ---- prefix hashes --------------------------------------------------------------------------------- */

#define B ATC_PREFIX_BLOCK_BYTES

static void fill(char *buf, size_t len, unsigned seed)
{
    for (size_t i = 0; i < len; i++)
        buf[i] = (char)('a' + (i * 7 + seed) % 26);
}

static void test_prefix_blocks_count(void **state)
{
    static char buf[B * 10];
    uint64_t out[16];
    fill(buf, sizeof buf, 0);
    assert_int_equal(atc_prefix_hash(buf, 0, out, 16), 0);
    assert_int_equal(atc_prefix_hash(buf, B - 1, out, 16), 0);
    assert_int_equal(atc_prefix_hash(buf, B, out, 16), 1);
    assert_int_equal(atc_prefix_hash(buf, 2 * B - 1, out, 16), 1);
    assert_int_equal(atc_prefix_hash(buf, 10 * B, out, 16), 10);
    out[3] = 0;
    assert_int_equal(atc_prefix_hash(buf, 10 * B, out, 3), 3);
    assert_int_equal(out[3], 0); /* max is respected */
    /* a partial tail does not change the full blocks */
    uint64_t a[4], b[4];
    atc_prefix_hash(buf, 3 * B, a, 4);
    atc_prefix_hash(buf, 3 * B + 100, b, 4);
    assert_memory_equal(a, b, sizeof(uint64_t) * 3);
}

static void test_prefix_divergence(void **state)
{
    static char x[B * 8], y[B * 8];
    uint64_t hx[8], hy[8];
    fill(x, sizeof x, 1);
    memcpy(y, x, sizeof y);
    assert_int_equal(atc_prefix_hash(x, sizeof x, hx, 8), 8);
    assert_int_equal(atc_prefix_hash(y, sizeof y, hy, 8), 8);
    assert_memory_equal(hx, hy, sizeof hx);
    for (size_t k = 0; k < 8; k++)
        for (size_t j = 0; j < k; j++)
            assert_true(hx[j] != hx[k]);

    /* diverge in block 5: blocks 0..4 agree, 5..7 all differ */
    y[5 * B + 17] ^= 1;
    atc_prefix_hash(y, sizeof y, hy, 8);
    for (size_t k = 0; k < 8; k++) {
        if (k < 5)
            assert_true(hx[k] == hy[k]);
        else
            assert_true(hx[k] != hy[k]);
    }

    /* chaining: a change in block 0 changes every later hash, though blocks 1.. hold the same bytes */
    memcpy(y, x, sizeof y);
    y[0] ^= 1;
    atc_prefix_hash(y, sizeof y, hy, 8);
    for (size_t k = 0; k < 8; k++)
        assert_true(hx[k] != hy[k]);

    /* same bytes at a different block index hash differently too: position is part of the chain */
    static char z[B * 2];
    memset(z, 'q', sizeof z);
    uint64_t hz[2];
    atc_prefix_hash(z, sizeof z, hz, 2);
    assert_true(hz[0] != hz[1]);
}

static void test_scan_prefix_sharing(void **state)
{
    /* two chats with the same long system prompt share their leading blocks, and only those */
    char *sys = repeat('s', 4 * B), *q = repeat('.', 2 * B);
    size_t cap = 8 * B;
    char *b1 = malloc(cap), *b2 = malloc(cap);
    assert_non_null(b1);
    assert_non_null(b2);
    const char *fmt = "{\"messages\":[{\"role\":\"system\",\"content\":\"%s\"},"
                      "{\"role\":\"user\",\"content\":\"%c%s\"}]}";
    snprintf(b1, cap, fmt, sys, 'A', q);
    snprintf(b2, cap, fmt, sys, 'B', q);
    const char *err;
    static struct atc_features f1;
    assert_int_equal(scan(ATC_KIND_CHAT, b1, &err), 0);
    f1 = f;
    assert_int_equal(scan(ATC_KIND_CHAT, b2, &err), 0);
    assert_int_equal(f1.nblocks, 6); /* a 1.6 KB span */
    assert_int_equal(f.nblocks, 6);
    size_t shared = 0;
    while (shared < f.nblocks && f1.blocks[shared] == f.blocks[shared])
        shared++;
    /* the span starts at '[', so the blocks wholly before the first differing byte are shared */
    size_t common =
        strlen("[{\"role\":\"system\",\"content\":\"\"},{\"role\":\"user\",\"content\":\"") + 4 * B;
    assert_int_equal(shared, common / B);
    free(sys);
    free(q);
    free(b1);
    free(b2);
}

/* One token count for a request, one spelling of its kind: what serving, replay and t.route share. */
static void test_tokens_and_kind_names(void **state)
{
    (void)state;
    assert_int_equal(atc_request_tokens(100, 20, 1), 120);
    assert_int_equal(atc_request_tokens(100, 0, 1), 100);
    assert_int_equal(atc_request_tokens(100, -1, 1), 100 + ATC_DEFAULT_OUTPUT_TOKENS);
    assert_int_equal(atc_request_tokens(100, 20, 4), 180); /* n = 4: four outputs, one prompt */
    enum atc_request_kind k = ATC_KIND_CHAT;
    for (enum atc_request_kind want = ATC_KIND_CHAT; want <= ATC_KIND_EMBEDDING; want++) {
        const char *name = atc_request_kind_name(want);
        assert_int_equal(atc_request_kind_parse(name, strlen(name), &k), 0);
        assert_int_equal(k, want);
    }
    assert_string_equal(atc_request_kind_name(ATC_KIND_COMPLETION), "completion");
    assert_int_equal(atc_request_kind_parse("chatter", 4, &k), 0); /* the length counts, not a NUL */
    assert_int_equal(atc_request_kind_parse("chatter", 7, &k), -1);
    assert_int_equal(atc_request_kind_parse("", 0, &k), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_basic),
        cmocka_unit_test(test_chat_defaults),
        cmocka_unit_test(test_tools_and_model_span),
        cmocka_unit_test(test_completion),
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_nested_keys_ignored),
        cmocka_unit_test(test_duplicate_keys_last_wins),
        cmocka_unit_test(test_model_escapes),
        cmocka_unit_test(test_model_missing_and_wrong),
        cmocka_unit_test(test_model_length),
        cmocka_unit_test(test_user),
        cmocka_unit_test(test_messages_required),
        cmocka_unit_test(test_stream),
        cmocka_unit_test(test_max_tokens),
        cmocka_unit_test(test_choices),
        cmocka_unit_test(test_not_an_object),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_valid_syntax_variety),
        cmocka_unit_test(test_depth),
        cmocka_unit_test(test_huge_prompt),
        cmocka_unit_test(test_many_tokens),
        cmocka_unit_test(test_prefix_blocks_count),
        cmocka_unit_test(test_prefix_divergence),
        cmocka_unit_test(test_scan_prefix_sharing),
        cmocka_unit_test(test_tokens_and_kind_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
