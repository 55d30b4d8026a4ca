/* Request features: a zero-copy scan of an OpenAI request body.
 *
 * jsmn tokenizes in place and fast, but even in strict mode it is lenient ("[1 2]", "[1,]", "{"a" "b"}",
 * "tru" and "{} {}" all pass) and closing a bracket walks up the parent chain, which makes a deeply
 * nested body quadratic. A router that parses more loosely than the inference server behind it can be
 * made to route on a field the server reads differently, so the scan has three steps:
 *
 *   1. prescan: one pass that lexes like jsmn, caps the nesting depth before jsmn runs, and counts the
 *      tokens so the thread-local token array is sized once (no NOMEM retry in practice);
 *   2. jsmn_parse into that array (strict mode, parent links: closing a bracket is O(depth));
 *   3. a walk over the tokens that checks what jsmn does not (separators, key/value pairing, number
 *      and literal grammar, control characters in strings) and picks the top-level fields.
 *
 * Duplicate top-level keys: the last one wins, as in Python's json module (vLLM, SGLang). A JSON null
 * counts as absent for optional fields, as pydantic's Optional[...] does.
 */
#include "request/request_features.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define JSMN_STATIC
#define JSMN_STRICT
#define JSMN_PARENT_LINKS
#include <jsmn.h>
#include <xxhash.h>

/* A token array this big (20 bytes a token) stays with the thread between requests; a bigger one,
 * needed only by an unusually large body, is freed after its scan so one such body does not pin
 * megabytes per worker. */
#define KEEP_TOKENS 32768

static const char ERR_JSON[] = "invalid JSON body";
static const char ERR_DEPTH[] = "JSON nested too deeply";
static const char ERR_NOT_OBJECT[] = "request body must be a JSON object";

static _Thread_local jsmntok_t *scratch;
static _Thread_local unsigned scratch_cap;

static const char *const kind_names[] = {
    [ATC_KIND_CHAT] = "chat",
    [ATC_KIND_COMPLETION] = "completion",
    [ATC_KIND_EMBEDDING] = "embedding",
};

const char *atc_request_kind_name(enum atc_request_kind kind)
{
    return (unsigned)kind < sizeof(kind_names) / sizeof(kind_names[0]) ? kind_names[kind]
                                                                       : kind_names[ATC_KIND_CHAT];
}

int atc_request_kind_parse(const char *s, size_t len, enum atc_request_kind *kind)
{
    for (unsigned k = 0; k < sizeof(kind_names) / sizeof(kind_names[0]); k++)
        if (strlen(kind_names[k]) == len && memcmp(s, kind_names[k], len) == 0) {
            *kind = (enum atc_request_kind)k;
            return 0;
        }
    return -1;
}

void atc_features_release(void)
{
    free(scratch);
    scratch = NULL;
    scratch_cap = 0;
}

/* Makes room for at least @p n tokens; the old contents are not kept. */
static int reserve(unsigned n)
{
    if (n <= scratch_cap)
        return 0;
    unsigned cap = scratch_cap ? scratch_cap : 256;
    while (cap < n)
        cap *= 2; /* n <= INT_MAX, so this cannot wrap */
    free(scratch);
    scratch = malloc((size_t)cap * sizeof *scratch);
    scratch_cap = scratch ? cap : 0;
    return scratch ? 0 : -1;
}

static bool is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* The closing quote of the string whose contents start at @p s, or NULL: the first quote not preceded
 * by an odd run of backslashes. memchr keeps this fast over long prompts. */
static const char *string_end(const char *s, const char *end)
{
    for (const char *p = s;;) {
        const char *q = memchr(p, '"', (size_t)(end - p));
        if (!q)
            return NULL;
        const char *b = q;
        while (b > s && b[-1] == '\\')
            b--;
        if ((q - b) % 2 == 0)
            return q;
        p = q + 1;
    }
}

/* Lexes @p js as jsmn will (strings end at an unescaped quote, primitives at whitespace, ',', ']' or
 * '}') to reject deep nesting before jsmn sees it and to count jsmn's tokens into *ntok. */
static int prescan(const char *js, size_t len, unsigned *ntok, const char **err)
{
    unsigned n = 0;
    int depth = 0;
    size_t i = 0;
    while (i < len) {
        char c = js[i];
        if (c == '{' || c == '[') {
            if (++depth > ATC_FEATURES_DEPTH_MAX) {
                *err = ERR_DEPTH;
                return -1;
            }
            n++;
            i++;
        } else if (c == '}' || c == ']') {
            if (--depth < 0) { /* else "}]]][[[[" would pass with depth to spare */
                *err = ERR_JSON;
                return -1;
            }
            i++;
        } else if (c == '"') {
            const char *q = string_end(js + i + 1, js + len);
            if (!q) {
                *err = ERR_JSON;
                return -1;
            }
            n++;
            i = (size_t)(q - js) + 1;
        } else if (is_ws(c) || c == ',' || c == ':') {
            i++;
        } else if (c == '-' || is_digit(c) || c == 't' || c == 'f' || c == 'n') {
            n++;
            while (i < len && !is_ws(js[i]) && js[i] != ',' && js[i] != ']' && js[i] != '}')
                i++;
        } else {
            *err = ERR_JSON; /* also a NUL byte, where jsmn would silently stop */
            return -1;
        }
    }
    *ntok = n;
    return 0;
}

/* ---- token walk ---------------------------------------------------------------------------------- */

static int raw_start(const jsmntok_t *t)
{
    return t->type == JSMN_STRING ? t->start - 1 : t->start; /* jsmn's string spans omit the quotes */
}

static int raw_end(const jsmntok_t *t)
{
    return t->type == JSMN_STRING ? t->end + 1 : t->end;
}

/* True if js[from..to) is whitespace around exactly one @p sep, or only whitespace if @p sep is 0. */
static bool gap_ok(const char *js, int from, int to, char sep)
{
    if (from > to)
        return false;
    while (from < to && is_ws(js[from]))
        from++;
    if (sep) {
        if (from == to || js[from] != sep)
            return false;
        from++;
        while (from < to && is_ws(js[from]))
            from++;
    }
    return from == to;
}

static size_t skip_digits(const char *p, size_t n, size_t i)
{
    while (i < n && is_digit(p[i]))
        i++;
    return i;
}

/* JSON's grammar for a literal or a number; jsmn only checks the first character. */
static bool primitive_ok(const char *p, size_t n)
{
    if ((n == 4 && !memcmp(p, "true", 4)) || (n == 5 && !memcmp(p, "false", 5)) ||
        (n == 4 && !memcmp(p, "null", 4)))
        return true;
    size_t i = 0, d;
    if (i < n && p[i] == '-')
        i++;
    if (i < n && p[i] == '0')
        i++;
    else if (i < n && p[i] >= '1' && p[i] <= '9')
        i = skip_digits(p, n, i);
    else
        return false;
    if (i < n && p[i] == '.') {
        d = ++i;
        if ((i = skip_digits(p, n, i)) == d)
            return false;
    }
    if (i < n && (p[i] == 'e' || p[i] == 'E')) {
        i++;
        if (i < n && (p[i] == '+' || p[i] == '-'))
            i++;
        d = i;
        if ((i = skip_digits(p, n, i)) == d)
            return false;
    }
    return i == n;
}

/* JSON forbids raw control characters in strings; jsmn lets them through. Branch-free so it
 * vectorizes over a multi-megabyte prompt. */
static bool has_ctrl(const char *s, size_t n)
{
    unsigned bad = 0;
    for (size_t i = 0; i < n; i++)
        bad |= (unsigned char)s[i] < 0x20;
    return bad;
}

static bool string_ok(const char *js, const jsmntok_t *t)
{
    return !has_ctrl(js + t->start, (size_t)(t->end - t->start));
}

/* Top-level fields: the index of the value token of the last occurrence of each key, or -1. */
struct fields {
    const char *prompt_key;
    int model, stream, max_tokens, max_completion_tokens, user, prompt, tools, choices;
};

struct walk {
    const char *js;
    const jsmntok_t *t;
    int n; /* tokens */
    int i; /* next token */
    struct fields *top;
};

static size_t unescape(const char *s, size_t n, char *out, size_t cap, bool *truncated);

static bool key_is(const char *s, size_t n, const char *name)
{
    return n == strlen(name) && !memcmp(s, name, n);
}

/* Where to note the value of top-level key @p k, or NULL. Keys are compared unescaped: "mod\u0065l" is
 * "model" to the inference server, so it must be to us. */
static int *field_slot(struct fields *top, const char *js, const jsmntok_t *k)
{
    char name[32];
    const char *s = js + k->start;
    size_t n = (size_t)(k->end - k->start);
    if (memchr(s, '\\', n)) {
        bool truncated;
        n = unescape(s, n, name, sizeof name, &truncated);
        if (truncated)
            return NULL; /* longer than any key we read */
        s = name;
    }
    if (key_is(s, n, "model"))
        return &top->model;
    if (key_is(s, n, "stream"))
        return &top->stream;
    if (key_is(s, n, "max_tokens"))
        return &top->max_tokens;
    if (key_is(s, n, "max_completion_tokens"))
        return &top->max_completion_tokens;
    if (key_is(s, n, "user"))
        return &top->user;
    if (key_is(s, n, "tools"))
        return &top->tools;
    if (key_is(s, n, "n"))
        return &top->choices;
    if (key_is(s, n, top->prompt_key))
        return &top->prompt;
    return NULL;
}

static bool check_value(struct walk *w);

/* Checks object or array @p c, whose children start at token w->i: every byte between '{' and '}' must
 * be a child token or the separators JSON requires there. That also catches jsmn's miscounted sizes
 * ("a":"b":"c", a key without a value), as a miscount leaves bytes no gap accepts. Fills w->top for
 * the outermost object. */
static bool check_container(struct walk *w, const jsmntok_t *c)
{
    bool is_object = c->type == JSMN_OBJECT;
    struct fields *top = w->top;
    w->top = NULL;
    int pos = c->start + 1;
    for (int k = 0; k < c->size; k++) {
        if (w->i >= w->n || !gap_ok(w->js, pos, raw_start(&w->t[w->i]), k ? ',' : 0))
            return false;
        if (is_object) {
            const jsmntok_t *key = &w->t[w->i++];
            if (key->type != JSMN_STRING || !string_ok(w->js, key))
                return false;
            if (w->i >= w->n || !gap_ok(w->js, key->end + 1, raw_start(&w->t[w->i]), ':'))
                return false;
            int *slot = top ? field_slot(top, w->js, key) : NULL;
            if (slot)
                *slot = w->i;
        }
        const jsmntok_t *v = &w->t[w->i];
        if (!check_value(w))
            return false;
        pos = raw_end(v);
    }
    return gap_ok(w->js, pos, c->end - 1, 0);
}

/* Checks the value at token w->i and its subtree and moves w->i past them. prescan has capped the
 * depth, so the recursion is at most ATC_FEATURES_DEPTH_MAX deep. */
static bool check_value(struct walk *w)
{
    if (w->i >= w->n)
        return false;
    const jsmntok_t *v = &w->t[w->i++];
    switch (v->type) {
    case JSMN_STRING:
        return string_ok(w->js, v);
    case JSMN_PRIMITIVE:
        return primitive_ok(w->js + v->start, (size_t)(v->end - v->start));
    case JSMN_OBJECT:
    case JSMN_ARRAY:
        return check_container(w, v);
    default:
        return false;
    }
}

/* ---- field values -------------------------------------------------------------------------------- */

static unsigned hex4(const char *p)
{
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        char c = p[k];
        v = v * 16 + (unsigned)(is_digit(c) ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    return v;
}

static size_t utf8_encode(unsigned cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12);
        out[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18);
    out[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Decodes JSON string contents s[0..n) (jsmn has checked the escapes) into @p out, NUL-terminated, at
 * most cap - 1 bytes. A character that does not fit is left out whole, so the result is never a cut
 * UTF-8 sequence, and *truncated is set. A surrogate pair becomes one character; a lone surrogate
 * becomes U+FFFD. Returns the decoded length (which counts any \u0000 as a byte). */
static size_t unescape(const char *s, size_t n, char *out, size_t cap, bool *truncated)
{
    size_t o = 0, i = 0;
    *truncated = false;
    while (i < n) {
        char buf[4];
        const char *src = buf;
        size_t len = 1;
        unsigned char c = (unsigned char)s[i];
        if (c != '\\') {
            /* a raw UTF-8 sequence is copied whole */
            len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
            len = len < n - i ? len : n - i;
            src = s + i;
            i += len;
        } else if (i + 1 < n && s[i + 1] != 'u') {
            static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
            const char *e = memchr(from, s[i + 1], sizeof from - 1);
            buf[0] = e ? to[e - from] : s[i + 1];
            i += 2;
        } else if (i + 6 <= n) {
            unsigned cp = hex4(s + i + 2);
            i += 6;
            if (cp >= 0xD800 && cp <= 0xDBFF && i + 6 <= n && s[i] == '\\' && s[i + 1] == 'u') {
                unsigned lo = hex4(s + i + 2);
                if (lo >= 0xDC00 && lo <= 0xDFFF) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    i += 6;
                }
            }
            if (cp >= 0xD800 && cp <= 0xDFFF)
                cp = 0xFFFD;
            len = utf8_encode(cp, buf);
        } else {
            break; /* cannot happen after jsmn: a cut escape */
        }
        if (o + len >= cap) {
            *truncated = true;
            break;
        }
        memcpy(out + o, src, len);
        o += len;
    }
    out[o] = '\0';
    return o;
}

static bool is_null(const char *js, const jsmntok_t *t)
{
    return t->type == JSMN_PRIMITIVE && js[t->start] == 'n'; /* the grammar is checked: 'n' is null */
}

/* A top-level string field: 0 if absent or null, 1 if copied, -1 if not a string. */
static int get_string(const char *js, const jsmntok_t *toks, int idx, char *out, bool *truncated, size_t *len)
{
    *truncated = false;
    if (idx < 0 || is_null(js, &toks[idx]))
        return 0;
    const jsmntok_t *t = &toks[idx];
    if (t->type != JSMN_STRING)
        return -1;
    *len = unescape(js + t->start, (size_t)(t->end - t->start), out, ATC_FEATURES_NAME_MAX, truncated);
    return 1;
}

/* A non-negative integer field into *out: 0 if absent or null (untouched), 1 if read, -1 otherwise.
 * Fractions and exponents are refused: the servers want an int. */
static int get_count(const char *js, const jsmntok_t *toks, int idx, int64_t *out)
{
    if (idx < 0 || is_null(js, &toks[idx]))
        return 0;
    const jsmntok_t *t = &toks[idx];
    if (t->type != JSMN_PRIMITIVE)
        return -1;
    int64_t v = 0;
    for (int i = t->start; i < t->end; i++) {
        if (!is_digit(js[i]) || v > (INT64_MAX - (js[i] - '0')) / 10)
            return -1;
        v = v * 10 + (js[i] - '0');
    }
    *out = v;
    return 1;
}

static int get_fields(enum atc_request_kind kind, const char *js, const jsmntok_t *toks,
                      const struct fields *top, struct atc_features *f, const char **err)
{
    bool truncated;
    size_t len = 0;
    int r = get_string(js, toks, top->model, f->model, &truncated, &len);
    if (r < 0) {
        *err = "'model' must be a string";
        return -1;
    }
    if (truncated) {
        *err = "'model' is too long";
        return -1;
    }
    if (r > 0 && len != strlen(f->model)) {
        *err = "'model' must not contain a NUL character";
        return -1;
    }
    f->has_model = r > 0;
    f->has_tools = top->tools >= 0 && toks[top->tools].type == JSMN_ARRAY && toks[top->tools].size > 0;
    if (f->has_model) { /* where the value's characters are, to rewrite it when a policy maps an alias */
        f->model_start = (size_t)toks[top->model].start;
        f->model_end = (size_t)toks[top->model].end;
    }

    /* Unlike model, user is only a hint (affinity, tenant): keep a long one's prefix and serve it. */
    if (get_string(js, toks, top->user, f->user, &truncated, &len) < 0) {
        *err = "'user' must be a string";
        return -1;
    }

    if (top->stream >= 0 && !is_null(js, &toks[top->stream])) {
        const jsmntok_t *t = &toks[top->stream];
        if (t->type != JSMN_PRIMITIVE || (js[t->start] != 't' && js[t->start] != 'f')) {
            *err = "'stream' must be a boolean";
            return -1;
        }
        f->stream = js[t->start] == 't';
    }

    /* Both given: max_completion_tokens wins, as in vLLM (max_tokens is its deprecated alias). */
    int64_t mct = -1;
    if (get_count(js, toks, top->max_tokens, &f->max_tokens) < 0) {
        *err = "'max_tokens' must be a non-negative integer";
        return -1;
    }
    if (get_count(js, toks, top->max_completion_tokens, &mct) < 0) {
        *err = "'max_completion_tokens' must be a non-negative integer";
        return -1;
    }
    if (mct >= 0)
        f->max_tokens = mct;
    /* n: how many completions; an engine runs one sequence for each (vLLM V1: n child requests). One that
     * is not a count, or 0, counts as 1: the engine refuses it in its own words (as the sim does); a huge
     * n counts as ATC_FEATURES_CHOICES_MAX. */
    int64_t choices = 1;
    (void)get_count(js, toks, top->choices, &choices); /* sets choices only when n is a count */
    f->choices = choices < 1                          ? 1
                 : choices > ATC_FEATURES_CHOICES_MAX ? ATC_FEATURES_CHOICES_MAX
                                                      : (uint32_t)choices;

    static const char *const missing[] = {
        [ATC_KIND_CHAT] = "'messages' is required",
        [ATC_KIND_COMPLETION] = "'prompt' is required",
        [ATC_KIND_EMBEDDING] = "'input' is required",
    };
    static const char *const wrong[] = {
        [ATC_KIND_CHAT] = "'messages' must be an array",
        [ATC_KIND_COMPLETION] = "'prompt' must be a string or an array",
        [ATC_KIND_EMBEDDING] = "'input' must be a string or an array",
    };
    if (top->prompt < 0) {
        *err = missing[kind];
        return -1;
    }
    const jsmntok_t *p = &toks[top->prompt];
    if (p->type != JSMN_ARRAY && (kind == ATC_KIND_CHAT || p->type != JSMN_STRING)) {
        *err = wrong[kind];
        return -1;
    }
    f->prompt = js + p->start;
    f->prompt_len = (size_t)(p->end - p->start);
    return 0;
}

int atc_features_scan(enum atc_request_kind kind, const char *body, size_t len, struct atc_features *f,
                      const char **err)
{
    static const char *const prompt_keys[] = {
        [ATC_KIND_CHAT] = "messages",
        [ATC_KIND_COMPLETION] = "prompt",
        [ATC_KIND_EMBEDDING] = "input",
    };
    f->model[0] = '\0';
    f->has_model = false;
    f->has_tools = false;
    f->stream = false;
    f->max_tokens = -1;
    f->choices = 1;
    f->user[0] = '\0';
    f->prompt = NULL;
    f->prompt_len = 0;
    f->prompt_tokens = 0;
    f->nblocks = 0;

    size_t i = 0;
    while (i < len && is_ws(body[i]))
        i++;
    if (i == len) {
        *err = "request body is empty";
        return -1;
    }
    if (body[i] != '{') {
        *err = ERR_NOT_OBJECT;
        return -1;
    }
    if (len >= INT_MAX) { /* jsmn keeps offsets in int */
        *err = "request body is too large";
        return -1;
    }
    unsigned ntok;
    if (prescan(body, len, &ntok, err) < 0)
        return -1;

    int rc = -1;
    int n;
    jsmn_parser parser;
    for (;;) {
        if (reserve(ntok) < 0) {
            *err = "out of memory";
            goto out;
        }
        jsmn_init(&parser);
        n = jsmn_parse(&parser, body, len, scratch, scratch_cap);
        if (n != JSMN_ERROR_NOMEM)
            break;
        ntok = scratch_cap * 2; /* prescan counts exactly; this is only a safety net */
    }
    if (n < 1) {
        *err = ERR_JSON;
        goto out;
    }

    struct fields top = {.prompt_key = prompt_keys[kind], -1, -1, -1, -1, -1, -1, -1, -1};
    struct walk w = {.js = body, .t = scratch, .n = n, .i = 1, .top = &top};
    /* the object must be the whole body: jsmn happily tokenizes "{} {}" */
    if (!check_container(&w, &scratch[0]) || w.i != n || !gap_ok(body, scratch[0].end, (int)len, 0)) {
        *err = ERR_JSON;
        goto out;
    }
    if (get_fields(kind, body, scratch, &top, f, err) < 0)
        goto out;

    /* About 4 bytes of text per token, as OpenAI's rule of thumb for English. For chat the span is raw
     * JSON, so its syntax ({"role":"user","content":...}) stands in for the few tokens the chat
     * template adds per message; \uXXXX escapes overcount, which errs towards caution. */
    size_t est = f->prompt_len / 4 + (f->prompt_len % 4 != 0);
    f->prompt_tokens = est > UINT32_MAX ? UINT32_MAX : (uint32_t)est;
    f->nblocks = atc_prefix_hash(f->prompt, f->prompt_len, f->blocks, ATC_PREFIX_BLOCKS_MAX);
    rc = 0;
out:
    if (scratch_cap > KEEP_TOKENS)
        atc_features_release();
    return rc;
}

size_t atc_prefix_hash(const char *data, size_t len, uint64_t *out, size_t max)
{
    size_t n = len / ATC_PREFIX_BLOCK_BYTES;
    if (n > max)
        n = max;
    /* Each block is seeded with the previous block's hash, so blocks[k] names the whole prefix up to
     * block k, not just block k's bytes: equal hashes at k mean equal prompts up to there. */
    uint64_t seed = 0;
    for (size_t k = 0; k < n; k++) {
        seed = XXH3_64bits_withSeed(data + k * ATC_PREFIX_BLOCK_BYTES, ATC_PREFIX_BLOCK_BYTES, seed);
        out[k] = seed;
    }
    return n;
}
