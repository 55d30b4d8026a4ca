/* atc_features_scan over any bytes: a request body as a client sends it.
 *
 * Input: one byte picks the route (chat, completions, embeddings), the rest is the body, copied to a
 * buffer of exactly its length so that a read past the end is an ASan report. Besides not crashing,
 * a scan must keep its contract (request_features.h), and a body it accepted must still be accepted,
 * with the same features, after the relay rewrites its "model" (what happens when a policy maps an
 * alias to another model's endpoint). */

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "fuzz.h"
#include "base/json.h"
#include "request/request_features.h"

static struct atc_features f, g; /* 4 KiB of hashes each: off the stack */

static void check_accepted(const struct atc_features *x, const char *body, size_t len)
{
    CHECK(strlen(x->model) < ATC_FEATURES_NAME_MAX && strlen(x->user) < ATC_FEATURES_NAME_MAX);
    CHECK(x->prompt != NULL && x->prompt >= body && x->prompt + x->prompt_len <= body + len);
    CHECK(x->max_tokens >= -1);
    size_t blocks = x->prompt_len / ATC_PREFIX_BLOCK_BYTES;
    CHECK(x->nblocks == (blocks < ATC_PREFIX_BLOCKS_MAX ? blocks : ATC_PREFIX_BLOCKS_MAX));
    if (x->has_model) {
        CHECK(x->model_start >= 1 && x->model_start <= x->model_end && x->model_end < len);
        CHECK(body[x->model_start - 1] == '"' && body[x->model_end] == '"');
    }
}

/* The body with its model replaced as relay.c's body_for does it. */
static char *rewrite_model(const char *body, size_t len, const struct atc_features *x, const char *model,
                           size_t *outlen)
{
    struct evbuffer *b = evbuffer_new();
    evbuffer_add(b, body, x->model_start);
    atc_json_escape(b, model, strlen(model));
    evbuffer_add(b, body + x->model_end, len - x->model_end);
    *outlen = evbuffer_get_length(b);
    char *out = malloc(*outlen + 1);
    evbuffer_remove(b, out, *outlen);
    evbuffer_free(b);
    return out;
}

static bool valid_utf8(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned c = s[i], len = c < 0x80                 ? 1
                                 : c >= 0xc2 && c <= 0xdf ? 2
                                 : c >= 0xe0 && c <= 0xef ? 3
                                 : c >= 0xf0 && c <= 0xf4 ? 4
                                                          : 0;
        if (len == 0 || i + len > n)
            return false;
        unsigned cp = len == 1 ? c : c & (0x7f >> len);
        for (unsigned k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80)
                return false;
            cp = cp << 6 | (s[i + k] & 0x3f);
        }
        if ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
            (len == 4 && (cp < 0x10000 || cp > 0x10ffff)))
            return false;
        i += len;
    }
    return true;
}

/* atc_json_escape over any bytes (what atc does to a client's model name it quotes in an error) must
 * give the inside of a valid JSON string, in valid UTF-8. */
static void check_escape(const char *s, size_t n)
{
    struct evbuffer *b = evbuffer_new();
    evbuffer_add_printf(b, "{\"messages\":[],\"user\":\"");
    atc_json_escape(b, s, n);
    evbuffer_add_printf(b, "\"}");
    size_t len = evbuffer_get_length(b);
    const char *json = (const char *)evbuffer_pullup(b, -1);
    const char *err = NULL;
    CHECK(valid_utf8((const unsigned char *)json, len));
    CHECK(atc_features_scan(ATC_KIND_CHAT, json, len, &g, &err) == 0);
    evbuffer_free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    enum atc_request_kind kind = (enum atc_request_kind)(data[0] % 3);
    size_t len = size - 1;
    char *body = malloc(len ? len : 1);
    memcpy(body, data + 1, len);
    check_escape(body, len < 4096 ? len : 4096);

    const char *err = NULL;
    int rc = atc_features_scan(kind, body, len, &f, &err);
    CHECK(rc == 0 || rc == -1);
    if (rc < 0) {
        CHECK(err != NULL && err[0] != '\0');
        free(body);
        return 0;
    }
    check_accepted(&f, body, len);

    if (f.has_model) {
        static const char *const models[] = {"llama-3-8b", "a \"quoted\"\\ name\n\x01", ""};
        const char *model = models[len % 3];
        size_t len2;
        char *body2 = rewrite_model(body, len, &f, model, &len2);
        err = NULL;
        rc = atc_features_scan(kind, body2, len2, &g, &err);
        CHECK(rc == 0);
        check_accepted(&g, body2, len2);
        CHECK(g.has_model && strcmp(g.model, model) == 0);
        CHECK(g.stream == f.stream && g.has_tools == f.has_tools && g.max_tokens == f.max_tokens);
        CHECK(strcmp(g.user, f.user) == 0 && g.prompt_len == f.prompt_len);
        CHECK(memcmp(g.prompt, f.prompt, f.prompt_len) == 0);
        free(body2);
    }
    free(body);
    return 0;
}
