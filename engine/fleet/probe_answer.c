/* What a good answer to a health probe is (probe_answer.h): the ready check's model list and the deep
 * check's inference answer, read with jsmn. */

#include "fleet/probe_answer.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define JSMN_STATIC
#define JSMN_STRICT
#include <jsmn.h>

/* Decodes the JSON string token @p t of @p js into @p out (at most @p size - 1 bytes, NUL-terminated).
 * Returns -1 when it does not fit or has a bad escape. */
static int json_string(const char *js, const jsmntok_t *t, char *out, size_t size)
{
    size_t o = 0;
    for (int i = t->start; i < t->end; i++) {
        unsigned c = (unsigned char)js[i];
        if (c == '\\') {
            if (++i >= t->end)
                return -1;
            switch (js[i]) {
            case 'n':
                c = '\n';
                break;
            case 't':
                c = '\t';
                break;
            case 'r':
                c = '\r';
                break;
            case 'b':
                c = '\b';
                break;
            case 'f':
                c = '\f';
                break;
            case 'u': {
                if (i + 4 >= t->end)
                    return -1;
                unsigned cp = 0;
                for (int k = 1; k <= 4; k++) {
                    char x = js[i + k];
                    cp = cp * 16 + (unsigned)(x >= '0' && x <= '9'   ? x - '0'
                                              : x >= 'a' && x <= 'f' ? x - 'a' + 10
                                              : x >= 'A' && x <= 'F' ? x - 'A' + 10
                                                                     : 0);
                }
                i += 4;
                char u8[3];
                size_t n = 0;
                if (cp < 0x80) {
                    u8[n++] = (char)cp;
                } else if (cp < 0x800) {
                    u8[n++] = (char)(0xc0 | (cp >> 6));
                    u8[n++] = (char)(0x80 | (cp & 0x3f));
                } else {
                    u8[n++] = (char)(0xe0 | (cp >> 12));
                    u8[n++] = (char)(0x80 | ((cp >> 6) & 0x3f));
                    u8[n++] = (char)(0x80 | (cp & 0x3f));
                }
                if (o + n >= size)
                    return -1;
                memcpy(out + o, u8, n);
                o += n;
                continue;
            }
            default:
                c = (unsigned char)js[i]; /* \" \\ \/ */
                break;
            }
        }
        if (o + 1 >= size)
            return -1;
        out[o++] = (char)c;
    }
    out[o] = '\0';
    return 0;
}

/* The index just past token @p i and everything inside it (tokens are in document order). */
static int json_skip(const jsmntok_t *t, int n, int i)
{
    int k = i + 1;
    while (k < n && t[k].start < t[i].end)
        k++;
    return k;
}

/* Tokenizes @p len bytes of @p js; returns the token count (> 0) and an owned array, or -1. */
static int json_tokens(const char *js, size_t len, jsmntok_t **out)
{
    jsmn_parser p;
    jsmn_init(&p);
    int n = jsmn_parse(&p, js, len, NULL, 0);
    if (n <= 0)
        return -1;
    jsmntok_t *t = malloc((size_t)n * sizeof(*t));
    if (t == NULL)
        return -1;
    jsmn_init(&p);
    if (jsmn_parse(&p, js, len, t, (unsigned)n) != n || t[0].type != JSMN_OBJECT) {
        free(t);
        return -1;
    }
    *out = t;
    return n;
}

/* The value token of top-level key @p key of the object at token 0, or -1. */
static int json_member(const char *js, const jsmntok_t *t, int n, const char *key)
{
    size_t klen = strlen(key);
    for (int i = 1, k = 0; i < n && k < t[0].size; k++) {
        int v = i + 1;
        if (v >= n)
            return -1;
        if (t[i].type == JSMN_STRING && (size_t)(t[i].end - t[i].start) == klen &&
            memcmp(js + t[i].start, key, klen) == 0)
            return v;
        i = json_skip(t, n, v);
    }
    return -1;
}

/* Whether an OpenAI model list ({"data": [{"id": ...}, ...]}) names @p model. NULL when it does, else
 * why not. */
const char *atc_probe_answer_lists_model(const char *js, size_t len, const char *model)
{
    jsmntok_t *t;
    int n = json_tokens(js, len, &t);
    if (n < 0)
        return "the answer is not a JSON object";
    const char *why = "the model list does not name this endpoint's model";
    int data = json_member(js, t, n, "data");
    if (data < 0 || t[data].type != JSMN_ARRAY) {
        why = "the answer has no 'data' list of models";
        goto done;
    }
    for (int i = data + 1, k = 0; i < n && k < t[data].size; k++) {
        if (t[i].type == JSMN_OBJECT) {
            for (int j = i + 1, m = 0; j + 1 < n && m < t[i].size; m++) {
                char id[512];
                if (t[j].type == JSMN_STRING && t[j].end - t[j].start == 2 &&
                    memcmp(js + t[j].start, "id", 2) == 0 && t[j + 1].type == JSMN_STRING &&
                    json_string(js, &t[j + 1], id, sizeof(id)) == 0 && strcmp(id, model) == 0) {
                    why = NULL;
                    goto done;
                }
                j = json_skip(t, n, j + 1);
            }
        }
        i = json_skip(t, n, i);
    }
done:
    free(t);
    return why;
}

/* A deep probe's answer: a JSON object with "choices" (completions) or "data" (embeddings). */
const char *atc_probe_answer_inference(const char *js, size_t len)
{
    jsmntok_t *t;
    int n = json_tokens(js, len, &t);
    if (n < 0)
        return "the answer is not a JSON object";
    bool ok = json_member(js, t, n, "choices") >= 0 || json_member(js, t, n, "data") >= 0;
    free(t);
    return ok ? NULL : "the answer has neither 'choices' nor 'data'";
}
