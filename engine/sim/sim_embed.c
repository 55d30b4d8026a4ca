/* atc sim's /v1/embeddings answer (sim_embed.h). */

#include "sim/sim_embed.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include <event2/buffer.h>
#include <xxhash.h>

#include "base/json.h"
#include "sim/sim.h"

#define EMBEDDING_DIM 8

/* Appends @p n bytes of @p in as base64 (RFC 4648, padded). */
static void add_base64(struct evbuffer *b, const unsigned char *in, size_t n)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t i = 0; i < n; i += 3) {
        unsigned v =
            (unsigned)in[i] << 16 | (i + 1 < n ? (unsigned)in[i + 1] << 8 : 0) | (i + 2 < n ? in[i + 2] : 0);
        char q[4] = {tab[v >> 18 & 63], tab[v >> 12 & 63], i + 1 < n ? tab[v >> 6 & 63] : '=',
                     i + 2 < n ? tab[v & 63] : '='};
        evbuffer_add(b, q, 4);
    }
}

/* The body's encoding_format: 0 "float" (or absent), 1 "base64", -1 anything else. */
static int encoding_format(const struct atc_json *j)
{
    char fmt[16];
    int i = atc_json_get(j, 0, "encoding_format");
    if (i < 0 || atc_json_is(j, i, "null"))
        return 0;
    return atc_json_string(j, i, fmt, sizeof(fmt), NULL) < 0 ? -1
           : strcmp(fmt, "base64") == 0                      ? 1
           : strcmp(fmt, "float") == 0                       ? 0
                                                             : -1;
}

/* Item @p index: a vector drawn from @p text. The official OpenAI SDK asks for base64 unless told
 * otherwise; both encodings carry the same numbers. */
static void add_embedding(struct evbuffer *b, uint64_t seed, const char *text, size_t len, int index,
                          int base64)
{
    evbuffer_add_printf(b, "%s{\"object\":\"embedding\",\"index\":%d,\"embedding\":%s", index ? "," : "",
                        index, base64 ? "\"" : "[");
    uint64_t st = seed ^ XXH3_64bits(text, len);
    unsigned char raw[EMBEDDING_DIM * 4];
    for (int i = 0; i < EMBEDDING_DIM; i++) {
        /* a uniform draw in (-1, 1), rounded as the float list prints it */
        float x = (float)(round((2 * atc_sim_uniform(&st) - 1) * 1e6) / 1e6);
        if (!base64) {
            evbuffer_add_printf(b, "%s%.6f", i ? "," : "", (double)x);
            continue;
        }
        uint32_t u;
        memcpy(&u, &x, 4);
        for (int k = 0; k < 4; k++)
            raw[i * 4 + k] = (unsigned char)(u >> (8 * k)); /* little-endian whatever the host */
    }
    if (base64) {
        add_base64(b, raw, sizeof(raw));
        evbuffer_add(b, "\"}", 2);
    } else {
        evbuffer_add(b, "]}", 2);
    }
}

int atc_sim_embeddings(struct evbuffer *out, uint64_t seed, const char *model, const char *body, size_t len,
                       unsigned prompt_tokens, const char **err)
{
    struct atc_json j = {0};
    int rc = -1;
    *err = "invalid JSON body"; /* (the request scan read it already) */
    if (atc_json_parse(&j, body, len, NULL) < 0)
        goto out;
    int base64 = encoding_format(&j), in = atc_json_get(&j, 0, "input");
    *err = "encoding_format must be 'float' or 'base64'.";
    if (base64 < 0)
        goto out;
    int n = in >= 0 && atc_json_type(&j, in) == ATC_JSON_ARRAY ? atc_json_count(&j, in) : 0;
    int e = n > 0 ? in + 1 : -1; /* its first item */
    bool each = e >= 0 && (atc_json_type(&j, e) == ATC_JSON_STRING || atc_json_type(&j, e) == ATC_JSON_ARRAY);
    size_t tl = 0;
    const char *text = in >= 0 ? atc_json_raw(&j, in, &tl) : "";
    evbuffer_add_printf(out, "{\"object\":\"list\",\"data\":[");
    if (!each)
        add_embedding(out, seed, text, tl, 0, base64);
    for (int k = 0; each && k < n; k++, e = atc_json_next(&j, e)) {
        text = atc_json_raw(&j, e, &tl);
        add_embedding(out, seed, text, tl, k, base64);
    }
    evbuffer_add_printf(out, "],\"model\":");
    atc_json_write_string(out, model);
    evbuffer_add_printf(out, ",\"usage\":{\"prompt_tokens\":%u,\"total_tokens\":%u}}", prompt_tokens,
                        prompt_tokens);
    rc = 0;
out:
    atc_json_dispose(&j);
    return rc;
}
