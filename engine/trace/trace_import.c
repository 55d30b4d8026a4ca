/* Importers of public traces (and of `atc trace dump`'s JSON lines) into atc traces.
 *
 *  - Mooncake (kvcache-ai/Mooncake, FAST'25): JSON lines {"timestamp": ms, "input_length": tokens,
 *    "output_length": tokens, "hash_ids": [...]}, one id per 512-token prompt block; two requests share
 *    a prefix as far as their leading ids agree. Ids are chained into 64-bit block hashes (trace.h).
 *  - Azure LLM inference traces (Azure/AzurePublicDataset, Splitwise ISCA'24): CSV with a header
 *    TIMESTAMP,ContextTokens,GeneratedTokens; timestamps "2023-11-16 18:17:03.9799600" (UTC). No prefix
 *    information.
 *  - Qwen-Bailian (alibaba-edu/qwen-bailian-usagetraces-anon, KVCache@ATC'25): Mooncake's keys, but
 *    "timestamp" in seconds and one hash id per 16-token block (its files are named blksz_16), and
 *    "chat_id" / "parent_chat_id" (-1 for a first turn) chaining a conversation's turns: each turn's
 *    session is its conversation's first chat_id ("chat-N"), as a client would name it to atc.
 *  - jsonl: one record per line with the keys of the atc trace format (what `atc trace dump` prints);
 *    Mooncake's keys are understood there too.
 *
 * A malformed line is reported as PATH:LINE: reason and skipped; too many of them fail the import. */

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "trace/trace_import.h"

#include <dirent.h>
#include <sys/stat.h>

#include "base/json.h"
#include "trace/trace.h"

#define DEFAULT_MODEL "llama-3-8b"
#define DEFAULT_MOONCAKE_BLOCK_TOKENS 512
#define DEFAULT_QWEN_BLOCK_TOKENS 16
#define DEFAULT_MAX_ERRORS 100
#define SHOWN_ERRORS 20 /* malformed lines reported one by one; the rest are counted */

struct importer {
    const char *path;
    const struct atc_trace_import_options *o;
    struct atc_trace *t;
    size_t line;
    size_t bad;
    char why[160];
    struct atc_json json; /* the current line's tokens (the array is reused) */
    uint64_t *blocks;
    size_t blocks_cap;
    char *strings; /* unescaped strings of the current line */
    size_t strings_cap, strings_used;
    struct atc_trace_field headers[ATC_TRACE_HEADERS_MAX]; /* the current line's */
    struct chat *chats; /* Qwen: chat_id -> its conversation's first chat_id, open addressing */
    size_t nchats, chats_cap;
    size_t failed; /* BurstGPT: failed requests left out */
};

struct chat {
    uint64_t id; /* chat_id + 1: 0 is an empty slot */
    uint64_t root;
};

/* The slot of chat @p id (id + 1 stored), or the empty one where it goes. */
static struct chat *chat_slot(struct importer *im, uint64_t id)
{
    size_t i = (size_t)((id + 1) * 0x9e3779b97f4a7c15ULL >> 20) & (im->chats_cap - 1);
    while (im->chats[i].id != 0 && im->chats[i].id != id + 1)
        i = (i + 1) & (im->chats_cap - 1);
    return &im->chats[i];
}

/* Notes that chat @p id belongs to the conversation that @p parent's does (@p parent < 0: it opens
 * one); returns that conversation's first chat_id. A parent not in the trace (a sampled file) opens one. */
static int chat_root(struct importer *im, uint64_t id, int64_t parent, uint64_t *root)
{
    if (im->nchats * 2 >= im->chats_cap) { /* at most half full */
        size_t old_cap = im->chats_cap, cap = old_cap ? old_cap * 2 : 1024;
        struct chat *old = im->chats;
        if ((im->chats = calloc(cap, sizeof(*im->chats))) == NULL) {
            im->chats = old;
            return -1;
        }
        im->chats_cap = cap;
        for (size_t k = 0; k < old_cap; k++)
            if (old[k].id != 0)
                *chat_slot(im, old[k].id - 1) = old[k];
        free(old);
    }
    const struct chat *p = parent >= 0 ? chat_slot(im, (uint64_t)parent) : NULL;
    *root = p != NULL && p->id != 0 ? p->root : parent >= 0 ? (uint64_t)parent : id;
    struct chat *c = chat_slot(im, id);
    if (c->id == 0)
        im->nchats++;
    *c = (struct chat){.id = id + 1, .root = *root};
    return 0;
}

static int fail_line(struct importer *im, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int fail_line(struct importer *im, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(im->why, sizeof(im->why), fmt, ap);
    va_end(ap);
    return -1;
}

/* ---- JSON lines ---- */

/* The unescaped string at token @p i, in the line's string buffer (sized for the line's worst case in
 * import_json_line). */
static const char *line_string(struct importer *im, int i, size_t *len)
{
    char *out = im->strings + im->strings_used;
    if (atc_json_string(&im->json, i, out, im->strings_cap - im->strings_used, len) < 0)
        return NULL;
    im->strings_used += *len + 1;
    return out;
}

static int put_blocks(struct importer *im, size_t n)
{
    if (n > ATC_TRACE_BLOCKS_MAX)
        return fail_line(im, "more than %d prefix blocks", ATC_TRACE_BLOCKS_MAX);
    if (n > im->blocks_cap) {
        uint64_t *b = realloc(im->blocks, n * sizeof(uint64_t));
        if (b == NULL)
            return fail_line(im, "out of memory");
        im->blocks = b;
        im->blocks_cap = n;
    }
    return 0;
}

/* Reads an array of whole numbers at token @p i into im->blocks; chained when @p chain. */
static int get_blocks(struct importer *im, int i, const char *key, bool chain, size_t *n)
{
    if (atc_json_type(&im->json, i) != ATC_JSON_ARRAY)
        return fail_line(im, "'%s' must be an array of whole numbers", key);
    int count = atc_json_count(&im->json, i);
    if (put_blocks(im, (size_t)count) < 0)
        return -1;
    uint64_t prev = 0;
    for (int k = 0; k < count; k++) {
        uint64_t id;
        if (!atc_json_uint(&im->json, i + 1 + k, UINT64_MAX, &id))
            return fail_line(im, "'%s' must be an array of whole numbers (item %d is not)", key, k + 1);
        im->blocks[k] = chain ? (prev = atc_trace_chain(prev, id)) : id;
    }
    *n = (size_t)count;
    return 0;
}

static int import_json_line(struct importer *im, const char *js, size_t len, enum atc_trace_format format)
{
    bool mooncake = format == ATC_TRACE_MOONCAKE || format == ATC_TRACE_QWEN, qwen = format == ATC_TRACE_QWEN;
    struct atc_json *j = &im->json;
    const char *why;
    if (atc_json_parse(j, js, len, &why) < 0)
        return fail_line(im, "%s", why);
    size_t rawlen;
    const char *raw = atc_json_raw(j, 0, &rawlen);
    if (atc_json_type(j, 0) != ATC_JSON_OBJECT)
        return fail_line(im, "expected a JSON object");
    if ((size_t)(raw - js) + rawlen != len)
        return fail_line(im, "expected one JSON object on the line");
    if (len * 3 + 1 > im->strings_cap) {
        char *s = realloc(im->strings, len * 3 + 1);
        if (s == NULL)
            return fail_line(im, "out of memory");
        im->strings = s;
        im->strings_cap = len * 3 + 1;
    }
    im->strings_used = 0;

    struct atc_trace_record r;
    atc_trace_record_init(&r);
    r.model = im->o->model != NULL ? im->o->model : DEFAULT_MODEL;
    bool have_time = false, have_in = false, have_out = false, have_hash = false, have_chat = false;
    uint64_t block_tokens = 0, chat_id = 0;
    int64_t parent = -1;
    for (int i = 1; i < j->n;) {
        int ki = i, vi = i + 1; /* a key and its value (atc_json_parse checked that each key has one) */
        size_t klen;
        const char *key = atc_json_raw(j, ki, &klen);
        i = atc_json_next(j, ki);
        uint64_t u;
        double d;
        size_t slen;
        const char *s;
        if (atc_json_is(j, ki, "timestamp") || atc_json_is(j, ki, "at_ms")) {
            if (!atc_json_number(j, vi, &d) || d < 0 || d > 1e12)
                return fail_line(im, "'%.*s' must be a number of %s >= 0", (int)klen, key,
                                 qwen ? "seconds" : "milliseconds");
            r.at_us = (uint64_t)llround(d * (qwen ? 1e6 : 1e3));
            have_time = true;
        } else if (qwen && (atc_json_is(j, ki, "chat_id") || atc_json_is(j, ki, "parent_chat_id"))) {
            if (!atc_json_number(j, vi, &d) || d != floor(d) || d < -1 || d > 9e15)
                return fail_line(im, "'%.*s' must be a whole number (-1: none)", (int)klen, key);
            if (atc_json_is(j, ki, "parent_chat_id"))
                parent = (int64_t)d;
            else if (d < 0)
                return fail_line(im, "'chat_id' must be a whole number >= 0");
            else
                chat_id = (uint64_t)d, have_chat = true;
        } else if (atc_json_is(j, ki, "at_us")) {
            if (!atc_json_uint(j, vi, UINT64_MAX, &r.at_us))
                return fail_line(im, "'at_us' must be a whole number >= 0");
            have_time = true;
        } else if (atc_json_is(j, ki, "input_length") || atc_json_is(j, ki, "prompt_tokens")) {
            if (!atc_json_uint(j, vi, UINT32_MAX, &u))
                return fail_line(im, "'%.*s' must be a whole number >= 0", (int)klen, key);
            r.prompt_tokens = (uint32_t)u;
            have_in = true;
        } else if (atc_json_is(j, ki, "output_length")) {
            if (!atc_json_uint(j, vi, INT64_MAX, &u))
                return fail_line(im, "'output_length' must be a whole number >= 0");
            /* The answer had this many tokens, so the client allowed at least that many. */
            r.output_tokens = r.max_tokens = (int64_t)u;
            have_out = true;
        } else if (atc_json_is(j, ki, "output_tokens") || atc_json_is(j, ki, "max_tokens")) {
            if (!atc_json_uint(j, vi, INT64_MAX, &u))
                return fail_line(im, "'%.*s' must be a whole number >= 0", (int)klen, key);
            *(atc_json_is(j, ki, "max_tokens") ? &r.max_tokens : &r.output_tokens) = (int64_t)u;
        } else if (atc_json_is(j, ki, "hash_ids")) {
            if (get_blocks(im, vi, "hash_ids", true, &r.nblocks) < 0)
                return -1;
            have_hash = true;
            if (block_tokens == 0)
                block_tokens = im->o->block_tokens ? im->o->block_tokens
                               : qwen              ? DEFAULT_QWEN_BLOCK_TOKENS
                                                   : DEFAULT_MOONCAKE_BLOCK_TOKENS;
        } else if (atc_json_is(j, ki, "blocks")) {
            if (get_blocks(im, vi, "blocks", false, &r.nblocks) < 0)
                return -1;
        } else if (atc_json_is(j, ki, "block_tokens")) {
            if (!atc_json_uint(j, vi, UINT32_MAX, &block_tokens) || block_tokens == 0)
                return fail_line(im, "'block_tokens' must be a whole number > 0");
        } else if (atc_json_is(j, ki, "priority")) {
            if (!atc_json_uint(j, vi, 9, &u))
                return fail_line(im, "'priority' must be a whole number from 0 to 9");
            r.priority = (int)u;
        } else if (atc_json_is(j, ki, "stream")) {
            if (!atc_json_bool(j, vi, &r.stream))
                return fail_line(im, "'stream' must be true or false");
        } else if (atc_json_is(j, ki, "status")) {
            if (!atc_json_uint(j, vi, 999, &u))
                return fail_line(im, "'status' must be an HTTP status");
            r.status = (int)u;
        } else if (atc_json_is(j, ki, "attempts")) {
            if (!atc_json_uint(j, vi, 1000, &u))
                return fail_line(im, "'attempts' must be a whole number");
            r.attempts = (unsigned)u;
        } else if (atc_json_is(j, ki, "policy_version")) {
            if (!atc_json_uint(j, vi, UINT64_MAX, &r.policy_version))
                return fail_line(im, "'policy_version' must be a whole number");
        } else if (atc_json_is(j, ki, "ttft_ms") || atc_json_is(j, ki, "total_ms")) {
            if (!atc_json_number(j, vi, &d) || d < 0)
                return fail_line(im, "'%.*s' must be a number >= 0", (int)klen, key);
            *(atc_json_is(j, ki, "ttft_ms") ? &r.ttft_ms : &r.total_ms) = d;
        } else if (atc_json_is(j, ki, "headers")) { /* what atc trace dump prints of record.headers */
            int nh = atc_json_count(j, vi);
            if (atc_json_type(j, vi) != ATC_JSON_OBJECT || nh > ATC_TRACE_HEADERS_MAX)
                return fail_line(im, "'headers' must be an object of at most %d names and string values",
                                 ATC_TRACE_HEADERS_MAX);
            for (int k = 0, h = vi + 1; k < nh; k++, h = atc_json_next(j, h)) {
                const char *name = line_string(im, h, &slen), *value = line_string(im, h + 1, &slen);
                if (name == NULL || value == NULL)
                    return fail_line(im, "'headers' must be an object of at most %d names and string values",
                                     ATC_TRACE_HEADERS_MAX);
                if (slen > ATC_TRACE_HEADER_VALUE_MAX) /* as recording cuts it */
                    ((char *)value)[ATC_TRACE_HEADER_VALUE_MAX] = '\0';
                im->headers[k] = (struct atc_trace_field){.name = name, .value = value};
            }
            r.headers = im->headers;
            r.nheaders = (size_t)nh;
        } else if (atc_json_is(j, ki, "model") || atc_json_is(j, ki, "id") || atc_json_is(j, ki, "kind") ||
                   atc_json_is(j, ki, "tenant") || atc_json_is(j, ki, "session") ||
                   atc_json_is(j, ki, "prompt") || atc_json_is(j, ki, "endpoint") ||
                   atc_json_is(j, ki, "decision")) {
            if ((s = line_string(im, vi, &slen)) == NULL)
                return fail_line(im, "'%.*s' must be a string", (int)klen, key);
            if (atc_json_is(j, ki, "model"))
                r.model = s;
            else if (atc_json_is(j, ki, "id"))
                r.id = s;
            else if (atc_json_is(j, ki, "tenant"))
                r.tenant = s;
            else if (atc_json_is(j, ki, "session"))
                r.session = s;
            else if (atc_json_is(j, ki, "endpoint"))
                r.endpoint = s;
            else if (atc_json_is(j, ki, "decision"))
                r.decision = s;
            else if (atc_json_is(j, ki, "prompt")) {
                r.prompt = s;
                r.prompt_len = slen;
            } else if (atc_request_kind_parse(s, slen, &r.kind) < 0)
                return fail_line(im, "'kind' must be chat, completion or embedding");
        }
        /* other keys: ignored, so traces with extra columns import */
    }
    if (mooncake) {
        const char *missing = !have_time   ? "timestamp"
                              : !have_in   ? "input_length"
                              : !have_out  ? "output_length"
                              : !have_hash ? "hash_ids"
                                           : NULL;
        if (missing == NULL && qwen && !have_chat)
            missing = "chat_id";
        if (missing != NULL)
            return fail_line(
                im, "missing '%s' (a %s line has %stimestamp, input_length, output_length and hash_ids)",
                missing, qwen ? "Qwen" : "Mooncake", qwen ? "chat_id, parent_chat_id, " : "");
        if (qwen) { /* its conversation, named as its session (the buffer holds 3x the line: room) */
            char *s = im->strings + im->strings_used;
            uint64_t root;
            if (chat_root(im, chat_id, parent, &root) < 0)
                return fail_line(im, "out of memory");
            im->strings_used += (size_t)snprintf(s, im->strings_cap - im->strings_used, "chat-%llu",
                                                 (unsigned long long)root) +
                                1;
            r.session = s;
        }
    } else if (!have_time) {
        return fail_line(im, "missing 'at_us' (or 'timestamp' / 'at_ms' in milliseconds)");
    }
    if (r.nblocks > 0 && block_tokens == 0)
        return fail_line(im, "'blocks' needs 'block_tokens'");
    r.block_tokens = r.nblocks > 0 ? (uint32_t)block_tokens : 0;
    r.blocks = im->blocks;
    if (atc_trace_append(im->t, &r) < 0)
        return fail_line(im, "out of memory");
    return 0;
}

/* ---- CSV: Azure's LLM inference traces, and BurstGPT ----
 *
 * Azure (2023, 2024): TIMESTAMP (a UTC date and time), ContextTokens, GeneratedTokens.
 * BurstGPT (HPMLL/BurstGPT, Azure OpenAI GPT use at a university): Timestamp (seconds from the trace's
 * start), Model, Request tokens, Response tokens, Total tokens, Log Type. Its rows with 0 response
 * tokens are failed requests (the repository's README); they are left out and counted, as its
 * BurstGPT_without_fails files do. Neither has prompt contents: every prompt is its own. */

struct csv_columns {
    int time, context, generated, n;
    bool seconds; /* BurstGPT: the time is seconds from the start, not a date */
};

/* Splits @p line at commas into at most @p max fields (no quoting: these files have none). */
static int split_csv(char *line, char **fields, int max)
{
    int n = 0;
    for (char *p = line;; p++) {
        if (n < max)
            fields[n] = p;
        n++;
        p = strchr(p, ',');
        if (p == NULL)
            break;
        *p = '\0';
    }
    return n;
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    return s;
}

/* "2023-11-16 18:17:03.9799600" (UTC) -> microseconds since the epoch. */
static int parse_timestamp(const char *s, uint64_t *us)
{
    int y, mo, d, h, mi, sec, consumed = 0;
    if (sscanf(s, "%4d-%2d-%2d%*[ T]%2d:%2d:%2d%n", &y, &mo, &d, &h, &mi, &sec, &consumed) != 6 ||
        consumed == 0)
        return -1;
    if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60 || y < 1970)
        return -1;
    const char *p = s + consumed;
    uint64_t frac = 0, scale = 1000000;
    if (*p == '.') {
        p++;
        if (!isdigit((unsigned char)*p))
            return -1;
        for (; isdigit((unsigned char)*p); p++) {
            if (scale > 1) {
                scale /= 10;
                frac += (uint64_t)(*p - '0') * scale;
            }
        }
    }
    if (*p == 'Z')
        p++;
    if (*p != '\0')
        return -1;
    struct tm tm = {
        .tm_year = y - 1900, .tm_mon = mo - 1, .tm_mday = d, .tm_hour = h, .tm_min = mi, .tm_sec = sec};
    time_t t = timegm(&tm);
    if (t < 0)
        return -1;
    *us = (uint64_t)t * 1000000u + frac;
    return 0;
}

static int azure_header(struct importer *im, char *line, struct csv_columns *c)
{
    char *fields[16];
    int n = split_csv(line, fields, 16);
    *c = (struct csv_columns){-1, -1, -1, n, false};
    for (int i = 0; i < n && i < 16; i++) {
        const char *f = trim(fields[i]);
        if (strcasecmp(f, "TIMESTAMP") == 0) {
            c->time = i;
        } else if (strcasecmp(f, "ContextTokens") == 0 || strcasecmp(f, "Request tokens") == 0) {
            c->seconds = strcasecmp(f, "Request tokens") == 0;
            c->context = i;
        } else if (strcasecmp(f, "GeneratedTokens") == 0 || strcasecmp(f, "Response tokens") == 0) {
            c->generated = i;
        }
    }
    if (c->time < 0 || c->context < 0 || c->generated < 0)
        return fail_line(im, "expected a header line with the columns TIMESTAMP, ContextTokens and "
                             "GeneratedTokens (Azure) or Timestamp, Request tokens and Response tokens "
                             "(BurstGPT)");
    return 0;
}

/* BurstGPT's "5" or "12.25": seconds from the start -> microseconds. */
static int parse_seconds(const char *s, uint64_t *us)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!isdigit((unsigned char)*s) || *end != '\0' || errno != 0 || !(v >= 0) || v > 1e12)
        return -1;
    *us = (uint64_t)(v * 1e6 + 0.5);
    return 0;
}

static int import_csv_line(struct importer *im, char *line, const struct csv_columns *c)
{
    char *fields[16];
    int n = split_csv(line, fields, 16);
    if (n != c->n)
        return fail_line(im, "expected %d comma-separated fields, got %d", c->n, n);
    struct atc_trace_record r;
    atc_trace_record_init(&r);
    r.model = im->o->model != NULL ? im->o->model : DEFAULT_MODEL;
    uint64_t us, u;
    char *end;
    if (c->seconds ? parse_seconds(trim(fields[c->time]), &us) < 0 : parse_timestamp(trim(fields[c->time]), &us) < 0)
        return fail_line(im, c->seconds ? "Timestamp: expected seconds, got '%.40s'"
                                        : "TIMESTAMP: expected YYYY-MM-DD HH:MM:SS[.fraction], got '%.40s'",
                         fields[c->time]);
    const char *ctx = trim(fields[c->context]), *gen = trim(fields[c->generated]);
    errno = 0;
    u = strtoull(ctx, &end, 10);
    if (!isdigit((unsigned char)*ctx) || *end != '\0' || errno != 0 || u > UINT32_MAX)
        return fail_line(im, "%s: expected a whole number, got '%.40s'",
                         c->seconds ? "Request tokens" : "ContextTokens", ctx);
    r.prompt_tokens = (uint32_t)u;
    errno = 0;
    u = strtoull(gen, &end, 10);
    if (!isdigit((unsigned char)*gen) || *end != '\0' || errno != 0 || u > INT64_MAX)
        return fail_line(im, "%s: expected a whole number, got '%.40s'",
                         c->seconds ? "Response tokens" : "GeneratedTokens", gen);
    if (c->seconds && u == 0) {
        im->failed++; /* a failed request: left out (see above) */
        return 0;
    }
    r.output_tokens = r.max_tokens = (int64_t)u;
    r.at_us = us; /* wall clock for now: made relative once every line is read */
    if (atc_trace_append(im->t, &r) < 0)
        return fail_line(im, "out of memory");
    return 0;
}

/* ---- the line loop ---- */

int atc_trace_import_text(const char *path, const struct atc_trace_import_options *o, struct atc_trace *t,
                          size_t *bad_lines, char **err)
{
    struct importer im = {.path = path, .o = o, .t = t};
    size_t max_errors = o->max_errors ? o->max_errors : DEFAULT_MAX_ERRORS;
    enum atc_trace_format format = o->format;
    struct csv_columns cols = {0};
    bool have_header = false;
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        if (asprintf(err, "%s: cannot open: %s", path, strerror(errno)) < 0)
            *err = NULL;
        return -1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int rc = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        im.line++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = '\0';
        size_t lead = strspn(line, " \t");
        if ((size_t)len == lead)
            continue; /* blank lines are not records */
        /* By the first line: Mooncake's has input_length, Qwen's a parent_chat_id too. */
        if (format == ATC_TRACE_AUTO)
            format = strstr(line, "\"input_length\"") == NULL     ? ATC_TRACE_JSONL
                     : strstr(line, "\"parent_chat_id\"") != NULL ? ATC_TRACE_QWEN
                                                                  : ATC_TRACE_MOONCAKE;
        int ok;
        if (format == ATC_TRACE_AZURE) {
            if (!have_header) {
                ok = azure_header(&im, line, &cols);
                if (ok < 0) {
                    if (o->errors != NULL)
                        fprintf(o->errors, "%s:%zu: %s\n", path, im.line, im.why);
                    if (asprintf(err, "%s:%zu: %s", path, im.line, im.why) < 0)
                        *err = NULL;
                    rc = -1;
                    break;
                }
                have_header = true;
                continue;
            }
            ok = import_csv_line(&im, line, &cols);
        } else {
            ok = import_json_line(&im, line + lead, (size_t)len - lead, format);
        }
        if (ok < 0) {
            im.bad++;
            if (o->errors != NULL && im.bad <= SHOWN_ERRORS)
                fprintf(o->errors, "%s:%zu: %s\n", path, im.line, im.why);
            if (im.bad > max_errors) {
                if (asprintf(err, "%s: more than %zu malformed lines, giving up at line %zu", path,
                             max_errors, im.line) < 0)
                    *err = NULL;
                rc = -1;
                break;
            }
        }
    }
    if (format == ATC_TRACE_AZURE && t->n > 0) { /* times relative to the first request, kept in the header */
        uint64_t first = UINT64_MAX;
        for (size_t i = 0; i < t->n; i++)
            first = t->records[i].at_us < first ? t->records[i].at_us : first;
        for (size_t i = 0; i < t->n; i++)
            t->records[i].at_us -= first;
        t->header.start_unix_us = cols.seconds ? 0 : first; /* BurstGPT's times are not dates */
    }
    if (o->errors != NULL && im.failed > 0)
        fprintf(o->errors, "%s: %zu failed requests (Response tokens 0) left out\n", path, im.failed);
    if (o->errors != NULL && im.bad > SHOWN_ERRORS)
        fprintf(o->errors, "%s: %zu more malformed lines not shown\n", path, im.bad - SHOWN_ERRORS);
    if (rc == 0 && ferror(f)) {
        if (asprintf(err, "%s: read error: %s", path, strerror(errno)) < 0)
            *err = NULL;
        rc = -1;
    }
    if (rc == 0 && format == ATC_TRACE_AZURE && !have_header) {
        if (asprintf(err, "%s: empty (no header line)", path) < 0)
            *err = NULL;
        rc = -1;
    }
    fclose(f);
    free(line);
    atc_json_dispose(&im.json);
    free(im.blocks);
    free(im.strings);
    free(im.chats);
    snprintf(t->header.source, sizeof(t->header.source), "%s",
             format == ATC_TRACE_AZURE      ? (cols.seconds ? "burstgpt" : "azure")
             : format == ATC_TRACE_MOONCAKE ? "mooncake"
             : format == ATC_TRACE_QWEN     ? "qwen"
                                            : "jsonl");
    *bad_lines = im.bad;
    return rc;
}

int atc_trace_format_parse(const char *name, enum atc_trace_format *out)
{
    static const struct {
        const char *name;
        enum atc_trace_format f;
    } names[] = {{"auto", ATC_TRACE_AUTO},         {"atc", ATC_TRACE_NATIVE},  {"native", ATC_TRACE_NATIVE},
                 {"mooncake", ATC_TRACE_MOONCAKE}, {"azure", ATC_TRACE_AZURE}, {"jsonl", ATC_TRACE_JSONL},
                 {"qwen", ATC_TRACE_QWEN}};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (strcmp(name, names[i].name) == 0) {
            *out = names[i].f;
            return 0;
        }
    }
    return -1;
}

/* An atc trace starts with a MessagePack map (fixmap 0x80-0x8f, map16 0xde, map32 0xdf); text traces
 * start with '{' or a letter. */
static bool looks_native(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return false;
    int c = fgetc(f);
    fclose(f);
    return (c >= 0x80 && c <= 0x8f) || c == 0xde || c == 0xdf;
}

static int load_native(const char *path, struct atc_trace *t, char **err)
{
    struct atc_trace_reader *rd = atc_trace_open(path, &t->header, err);
    if (rd == NULL)
        return -1;
    struct atc_trace_record r;
    int rc;
    while ((rc = atc_trace_read(rd, &r, err)) > 0) {
        if (atc_trace_append(t, &r) < 0) {
            *err = strdup("out of memory");
            rc = -1;
            break;
        }
    }
    atc_trace_close(rd);
    return rc;
}

static int by_string(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every *.atct file of directory @p dir, one after another (a recording's rotated files share one
 * time base, and atc_trace_normalize orders the records). */
static int load_dir(const char *dir, struct atc_trace *t, char **err)
{
    DIR *d = opendir(dir);
    if (d == NULL) {
        if (asprintf(err, "%s: %s", dir, strerror(errno)) < 0)
            *err = NULL;
        return -1;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len < 6 || strcmp(e->d_name + len - 5, ".atct") != 0 || e->d_name[0] == '.')
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            char **v = realloc(names, cap * sizeof(*v));
            if (v == NULL) {
                rc = -1;
                break;
            }
            names = v;
        }
        if (asprintf(&names[n], "%s/%s", dir, e->d_name) < 0) {
            rc = -1;
            break;
        }
        n++;
    }
    closedir(d);
    if (rc < 0)
        *err = strdup("out of memory");
    else if (n == 0 && asprintf(err, "%s: no .atct files in this directory", dir) >= 0)
        rc = -1;
    if (n > 0)
        qsort(names, n, sizeof(*names), by_string);
    struct atc_trace_header first = t->header;
    for (size_t i = 0; i < n; i++) {
        if (rc == 0 && load_native(names[i], t, err) < 0)
            rc = -1;
        if (i == 0)
            first = t->header;
        free(names[i]);
    }
    t->header = first;
    free(names);
    return rc;
}

int atc_trace_load(const char *path, const struct atc_trace_import_options *o, struct atc_trace **out,
                   size_t *bad_lines, char **err)
{
    struct atc_trace_import_options opts = o != NULL ? *o : (struct atc_trace_import_options){0};
    size_t bad = 0;
    *out = NULL;
    *err = NULL;
    if (opts.format == ATC_TRACE_AUTO) {
        size_t len = strlen(path);
        if (looks_native(path))
            opts.format = ATC_TRACE_NATIVE;
        else if (len > 4 && strcasecmp(path + len - 4, ".csv") == 0)
            opts.format = ATC_TRACE_AZURE;
        /* else JSON lines: Mooncake's or ours, told apart by the first line (trace_import.c) */
    }
    struct atc_trace *t = atc_trace_new("");
    if (t == NULL) {
        *err = strdup("out of memory");
        return -1;
    }
    struct stat st;
    int rc;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        rc = load_dir(path, t, err);
    else if (opts.format == ATC_TRACE_NATIVE)
        rc = load_native(path, t, err);
    else
        rc = atc_trace_import_text(path, &opts, t, &bad, err);
    if (bad_lines != NULL)
        *bad_lines = bad;
    if (rc < 0) {
        atc_trace_free(t);
        return -1;
    }
    if (atc_trace_normalize(t) < 0) {
        atc_trace_free(t);
        *err = strdup("out of memory");
        return -1;
    }
    *out = t;
    return 0;
}
