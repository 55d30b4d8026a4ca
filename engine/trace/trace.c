/* The trace format (trace.h): MessagePack encoding and decoding of the header and the records, a
 * streaming reader, and whole traces in memory. The text importers are in trace_import.c, the
 * `atc trace` command in trace_cli.c. */

#include "trace/trace.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/time.h>

#include <msgpack.h>
#include <xxhash.h>

#include "base/json.h"

#define READ_CHUNK (256 * 1024)
#define ARENA_CHUNK (256 * 1024)

void atc_trace_record_init(struct atc_trace_record *r)
{
    *r = (struct atc_trace_record){
        .model = "",
        .kind = ATC_KIND_CHAT,
        .max_tokens = -1,
        .output_tokens = -1,
        .tenant = "",
        .session = "",
        .ttft_ms = -1,
        .total_ms = -1,
    };
}

uint64_t atc_trace_chain(uint64_t prev, uint64_t id)
{
    uint64_t in[2] = {prev, id};
    return XXH3_64bits(in, sizeof(in));
}

/* ---- encoding ---- */

static int buf_write(void *data, const char *p, size_t len)
{
    struct atc_trace_buf *b = data;
    if (b->len + len > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->len + len)
            cap *= 2;
        char *d = realloc(b->data, cap);
        if (d == NULL)
            return -1;
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, len);
    b->len += len;
    return 0;
}

static void pack_key(msgpack_packer *pk, const char *k)
{
    size_t n = strlen(k);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, k, n);
}

static void pack_str(msgpack_packer *pk, const char *k, const char *v, size_t n)
{
    pack_key(pk, k);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, v, n);
}

/* Makes room for @p need more bytes, so that the packing that follows cannot fail half-way. */
static int reserve(struct atc_trace_buf *out, size_t need)
{
    if (out->cap - out->len >= need)
        return 0;
    size_t cap = out->cap ? out->cap : 1024;
    while (cap - out->len < need)
        cap *= 2;
    char *d = realloc(out->data, cap);
    if (d == NULL)
        return -1;
    out->data = d;
    out->cap = cap;
    return 0;
}

int atc_trace_encode_header(struct atc_trace_buf *out, const struct atc_trace_header *h)
{
    if (reserve(out, 256 + strlen(h->source) + strlen(h->atc_version)) < 0)
        return -1;
    msgpack_packer pk;
    msgpack_packer_init(&pk, out, buf_write);
    msgpack_pack_map(&pk, h->start_unix_us ? 6 : 5);
    pack_key(&pk, "atc_trace");
    msgpack_pack_uint32(&pk, ATC_TRACE_VERSION);
    pack_str(&pk, "source", h->source, strlen(h->source));
    pack_key(&pk, "created");
    msgpack_pack_double(&pk, h->created);
    pack_str(&pk, "atc", h->atc_version, strlen(h->atc_version));
    pack_key(&pk, "text");
    if (h->text)
        msgpack_pack_true(&pk);
    else
        msgpack_pack_false(&pk);
    if (h->start_unix_us) {
        pack_key(&pk, "start_unix_us");
        msgpack_pack_uint64(&pk, h->start_unix_us);
    }
    return 0;
}

static size_t opt_len(const char *s)
{
    return s != NULL ? strlen(s) : 0;
}

int atc_trace_encode_record(struct atc_trace_buf *out, const struct atc_trace_record *r)
{
    /* Every key and value fits in this, so no write in the middle can fail. */
    size_t need = 512 + r->nblocks * 9 + (r->prompt ? r->prompt_len : 0) + strlen(r->model) +
                  strlen(r->tenant) + strlen(r->session) + (r->id ? strlen(r->id) : 0) +
                  (r->endpoint ? strlen(r->endpoint) : 0) + (r->decision ? strlen(r->decision) : 0) +
                  opt_len(r->reason) + opt_len(r->scores) + opt_len(r->shadow_decision) +
                  opt_len(r->shadow_endpoint);
    for (size_t i = 0; i < r->nheaders; i++)
        need += 16 + strlen(r->headers[i].name) + strlen(r->headers[i].value);
    if (reserve(out, need) < 0)
        return -1;
    unsigned n = 1 + (r->id != NULL) + (r->model[0] != '\0') + (r->kind != ATC_KIND_CHAT) + 1 +
                 (r->max_tokens >= 0) + (r->output_tokens >= 0) + (r->priority != 0) + (r->tenant[0] != 0) +
                 (r->session[0] != 0) + (r->stream) + (r->nblocks > 0 ? 2 : 0) + (r->prompt != NULL) +
                 (r->nheaders > 0) + (r->endpoint != NULL) + (r->policy_version != 0) +
                 (r->decision != NULL) + (r->attempts != 0) + (r->status != 0) + (r->ttft_ms >= 0) +
                 (r->total_ms >= 0) + (r->reason != NULL) + (r->scores != NULL) + (r->shadow_version != 0) +
                 (r->shadow_decision != NULL) + (r->shadow_endpoint != NULL);
    msgpack_packer pk;
    msgpack_packer_init(&pk, out, buf_write);
    msgpack_pack_map(&pk, n);
    pack_key(&pk, "at_us");
    msgpack_pack_uint64(&pk, r->at_us);
    if (r->id != NULL)
        pack_str(&pk, "id", r->id, strlen(r->id));
    if (r->model[0] != '\0')
        pack_str(&pk, "model", r->model, strlen(r->model));
    if (r->kind != ATC_KIND_CHAT)
        pack_str(&pk, "kind", atc_request_kind_name(r->kind), strlen(atc_request_kind_name(r->kind)));
    pack_key(&pk, "prompt_tokens");
    msgpack_pack_uint32(&pk, r->prompt_tokens);
    if (r->max_tokens >= 0) {
        pack_key(&pk, "max_tokens");
        msgpack_pack_int64(&pk, r->max_tokens);
    }
    if (r->output_tokens >= 0) {
        pack_key(&pk, "output_tokens");
        msgpack_pack_int64(&pk, r->output_tokens);
    }
    if (r->priority != 0) {
        pack_key(&pk, "priority");
        msgpack_pack_int(&pk, r->priority);
    }
    if (r->tenant[0] != '\0')
        pack_str(&pk, "tenant", r->tenant, strlen(r->tenant));
    if (r->session[0] != '\0')
        pack_str(&pk, "session", r->session, strlen(r->session));
    if (r->stream) {
        pack_key(&pk, "stream");
        msgpack_pack_true(&pk);
    }
    if (r->nblocks > 0) {
        pack_key(&pk, "block_tokens");
        msgpack_pack_uint32(&pk, r->block_tokens);
        pack_key(&pk, "blocks");
        msgpack_pack_array(&pk, r->nblocks);
        for (size_t i = 0; i < r->nblocks; i++)
            msgpack_pack_uint64(&pk, r->blocks[i]);
    }
    if (r->prompt != NULL)
        pack_str(&pk, "prompt", r->prompt, r->prompt_len);
    if (r->nheaders > 0) {
        pack_key(&pk, "headers");
        msgpack_pack_map(&pk, r->nheaders);
        for (size_t i = 0; i < r->nheaders; i++)
            pack_str(&pk, r->headers[i].name, r->headers[i].value, strlen(r->headers[i].value));
    }
    if (r->endpoint != NULL)
        pack_str(&pk, "endpoint", r->endpoint, strlen(r->endpoint));
    if (r->policy_version != 0) {
        pack_key(&pk, "policy_version");
        msgpack_pack_uint64(&pk, r->policy_version);
    }
    if (r->decision != NULL)
        pack_str(&pk, "decision", r->decision, strlen(r->decision));
    if (r->reason != NULL)
        pack_str(&pk, "reason", r->reason, strlen(r->reason));
    if (r->scores != NULL)
        pack_str(&pk, "scores", r->scores, strlen(r->scores));
    if (r->shadow_version != 0) {
        pack_key(&pk, "shadow_version");
        msgpack_pack_uint64(&pk, r->shadow_version);
    }
    if (r->shadow_decision != NULL)
        pack_str(&pk, "shadow_decision", r->shadow_decision, strlen(r->shadow_decision));
    if (r->shadow_endpoint != NULL)
        pack_str(&pk, "shadow_endpoint", r->shadow_endpoint, strlen(r->shadow_endpoint));
    if (r->attempts != 0) {
        pack_key(&pk, "attempts");
        msgpack_pack_unsigned_int(&pk, r->attempts);
    }
    if (r->status != 0) {
        pack_key(&pk, "status");
        msgpack_pack_int(&pk, r->status);
    }
    if (r->ttft_ms >= 0) {
        pack_key(&pk, "ttft_ms");
        msgpack_pack_double(&pk, r->ttft_ms);
    }
    if (r->total_ms >= 0) {
        pack_key(&pk, "total_ms");
        msgpack_pack_double(&pk, r->total_ms);
    }
    return 0;
}

/* ---- decoding ---- */

struct atc_trace_reader {
    FILE *f;
    char *path;
    msgpack_unpacker u;
    msgpack_unpacked obj;
    bool eof;
    uint64_t size;    /* of the file; 0 when unknown (a pipe) */
    uint64_t skimmed; /* bytes walked by skim() */
    struct {
        uint64_t skip; /* payload bytes still to pass over (str, bin, ext) */
        unsigned char head[9];
        unsigned nhead, need; /* a token's header, split across reads */
    } skim;
    size_t nread; /* records returned */
    char *strings;
    size_t strings_cap;
    struct atc_trace_field headers[ATC_TRACE_HEADERS_MAX];
    uint64_t *blocks;
    size_t blocks_cap;
    char why[128];
};

static bool key_is(const msgpack_object *k, const char *name)
{
    size_t n = strlen(name);
    return k->type == MSGPACK_OBJECT_STR && k->via.str.size == n && memcmp(k->via.str.ptr, name, n) == 0;
}

/* A whole number >= 0 in *out; false when @p o is anything else. Floats with no fraction count. */
static bool get_u64(const msgpack_object *o, uint64_t *out)
{
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        *out = o->via.u64;
        return true;
    }
    if ((o->type == MSGPACK_OBJECT_FLOAT64 || o->type == MSGPACK_OBJECT_FLOAT32) && o->via.f64 >= 0 &&
        o->via.f64 < 1.8e19 && o->via.f64 == (double)(uint64_t)o->via.f64) {
        *out = (uint64_t)o->via.f64;
        return true;
    }
    return false;
}

static bool get_i64(const msgpack_object *o, int64_t *out)
{
    uint64_t u;
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        *out = o->via.i64;
        return true;
    }
    if (get_u64(o, &u) && u <= INT64_MAX) {
        *out = (int64_t)u;
        return true;
    }
    return false;
}

static bool get_double(const msgpack_object *o, double *out)
{
    int64_t i;
    if (o->type == MSGPACK_OBJECT_FLOAT64 || o->type == MSGPACK_OBJECT_FLOAT32) {
        *out = o->via.f64;
        return true;
    }
    if (get_i64(o, &i)) {
        *out = (double)i;
        return true;
    }
    return false;
}

/* The reader keeps record strings in one buffer, sized in a first pass so pointers stay put. */
static const char *take_str(struct atc_trace_reader *rd, size_t *used, const msgpack_object *o)
{
    char *s = rd->strings + *used;
    memcpy(s, o->via.str.ptr, o->via.str.size);
    s[o->via.str.size] = '\0';
    *used += o->via.str.size + 1;
    return s;
}

static int decode_header(const msgpack_object *o, struct atc_trace_header *h, const char **why)
{
    memset(h, 0, sizeof(*h));
    if (o->type != MSGPACK_OBJECT_MAP) {
        *why = "not an atc trace (it does not start with a header map)";
        return -1;
    }
    bool found = false;
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        const msgpack_object *k = &o->via.map.ptr[i].key, *v = &o->via.map.ptr[i].val;
        uint64_t u;
        if (key_is(k, "atc_trace") && get_u64(v, &u)) {
            h->version = (unsigned)(u > 1000000 ? 1000000 : u);
            found = true;
        } else if (key_is(k, "source") && v->type == MSGPACK_OBJECT_STR) {
            snprintf(h->source, sizeof(h->source), "%.*s", (int)v->via.str.size, v->via.str.ptr);
        } else if (key_is(k, "atc") && v->type == MSGPACK_OBJECT_STR) {
            snprintf(h->atc_version, sizeof(h->atc_version), "%.*s", (int)v->via.str.size, v->via.str.ptr);
        } else if (key_is(k, "created")) {
            get_double(v, &h->created);
        } else if (key_is(k, "text") && v->type == MSGPACK_OBJECT_BOOLEAN) {
            h->text = v->via.boolean;
        } else if (key_is(k, "start_unix_us")) {
            get_u64(v, &h->start_unix_us);
        }
    }
    if (!found) {
        *why = "not an atc trace (its header has no atc_trace version)";
        return -1;
    }
    return 0;
}

/* Fills @p r from map @p o. Returns 0, or -1 with the reason in *why. */
static int decode_record(struct atc_trace_reader *rd, const msgpack_object *o, struct atc_trace_record *r,
                         const char **why)
{
    atc_trace_record_init(r);
    if (o->type != MSGPACK_OBJECT_MAP) {
        *why = "a record must be a map";
        return -1;
    }
    size_t strbytes = 0;
    for (uint32_t i = 0; i < o->via.map.size; i++)
        if (o->via.map.ptr[i].val.type == MSGPACK_OBJECT_STR)
            strbytes += o->via.map.ptr[i].val.via.str.size + 1;
        else if (o->via.map.ptr[i].val.type == MSGPACK_OBJECT_MAP) /* headers: names and values */
            for (uint32_t j = 0; j < o->via.map.ptr[i].val.via.map.size; j++) {
                const msgpack_object_kv *kv = &o->via.map.ptr[i].val.via.map.ptr[j];
                strbytes += (kv->key.type == MSGPACK_OBJECT_STR ? kv->key.via.str.size : 0) +
                            (kv->val.type == MSGPACK_OBJECT_STR ? kv->val.via.str.size : 0) + 2;
            }
    if (strbytes > rd->strings_cap) {
        char *s = realloc(rd->strings, strbytes);
        if (s == NULL) {
            *why = "out of memory";
            return -1;
        }
        rd->strings = s;
        rd->strings_cap = strbytes;
    }
    size_t used = 0;
    bool have_at = false;
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        const msgpack_object *k = &o->via.map.ptr[i].key, *v = &o->via.map.ptr[i].val;
        uint64_t u;
        int64_t s64;
        bool is_str = v->type == MSGPACK_OBJECT_STR;
        if (k->type != MSGPACK_OBJECT_STR)
            continue;
        if (key_is(k, "at_us")) {
            if (!get_u64(v, &r->at_us))
                goto bad;
            have_at = true;
        } else if (key_is(k, "id") && is_str) {
            r->id = take_str(rd, &used, v);
        } else if (key_is(k, "model") && is_str) {
            r->model = take_str(rd, &used, v);
        } else if (key_is(k, "kind")) {
            if (!is_str || atc_request_kind_parse(v->via.str.ptr, v->via.str.size, &r->kind) < 0)
                goto bad;
        } else if (key_is(k, "prompt_tokens")) {
            if (!get_u64(v, &u) || u > UINT32_MAX)
                goto bad;
            r->prompt_tokens = (uint32_t)u;
        } else if (key_is(k, "max_tokens")) {
            if (!get_i64(v, &r->max_tokens))
                goto bad;
        } else if (key_is(k, "output_tokens")) {
            if (!get_i64(v, &r->output_tokens))
                goto bad;
        } else if (key_is(k, "priority")) {
            if (!get_i64(v, &s64) || s64 < 0 || s64 > 9)
                goto bad;
            r->priority = (int)s64;
        } else if (key_is(k, "tenant") && is_str) {
            r->tenant = take_str(rd, &used, v);
        } else if (key_is(k, "session") && is_str) {
            r->session = take_str(rd, &used, v);
        } else if (key_is(k, "stream")) {
            if (v->type != MSGPACK_OBJECT_BOOLEAN)
                goto bad;
            r->stream = v->via.boolean;
        } else if (key_is(k, "block_tokens")) {
            if (!get_u64(v, &u) || u > UINT32_MAX)
                goto bad;
            r->block_tokens = (uint32_t)u;
        } else if (key_is(k, "blocks")) {
            if (v->type != MSGPACK_OBJECT_ARRAY || v->via.array.size > ATC_TRACE_BLOCKS_MAX)
                goto bad;
            if (v->via.array.size > rd->blocks_cap) {
                uint64_t *b = realloc(rd->blocks, v->via.array.size * sizeof(uint64_t));
                if (b == NULL) {
                    *why = "out of memory";
                    return -1;
                }
                rd->blocks = b;
                rd->blocks_cap = v->via.array.size;
            }
            for (uint32_t j = 0; j < v->via.array.size; j++)
                if (!get_u64(&v->via.array.ptr[j], &rd->blocks[j]))
                    goto bad;
            r->blocks = rd->blocks;
            r->nblocks = v->via.array.size;
        } else if (key_is(k, "headers")) {
            if (v->type != MSGPACK_OBJECT_MAP || v->via.map.size > ATC_TRACE_HEADERS_MAX)
                goto bad;
            for (uint32_t j = 0; j < v->via.map.size; j++) {
                const msgpack_object_kv *kv = &v->via.map.ptr[j];
                if (kv->key.type != MSGPACK_OBJECT_STR || kv->val.type != MSGPACK_OBJECT_STR)
                    goto bad;
                rd->headers[j].name = take_str(rd, &used, &kv->key);
                rd->headers[j].value = take_str(rd, &used, &kv->val);
            }
            r->headers = rd->headers;
            r->nheaders = v->via.map.size;
        } else if (key_is(k, "prompt") && is_str) {
            r->prompt_len = v->via.str.size;
            r->prompt = take_str(rd, &used, v);
        } else if (key_is(k, "endpoint") && is_str) {
            r->endpoint = take_str(rd, &used, v);
        } else if (key_is(k, "policy_version")) {
            if (!get_u64(v, &r->policy_version))
                goto bad;
        } else if (key_is(k, "decision") && is_str) {
            r->decision = take_str(rd, &used, v);
        } else if (key_is(k, "reason") && is_str) {
            r->reason = take_str(rd, &used, v);
        } else if (key_is(k, "scores") && is_str) {
            r->scores = take_str(rd, &used, v);
        } else if (key_is(k, "shadow_version")) {
            if (!get_u64(v, &r->shadow_version))
                goto bad;
        } else if (key_is(k, "shadow_decision") && is_str) {
            r->shadow_decision = take_str(rd, &used, v);
        } else if (key_is(k, "shadow_endpoint") && is_str) {
            r->shadow_endpoint = take_str(rd, &used, v);
        } else if (key_is(k, "attempts")) {
            if (!get_u64(v, &u) || u > 1000)
                goto bad;
            r->attempts = (unsigned)u;
        } else if (key_is(k, "status")) {
            if (!get_u64(v, &u) || u > 999)
                goto bad;
            r->status = (int)u;
        } else if (key_is(k, "ttft_ms")) {
            if (!get_double(v, &r->ttft_ms))
                goto bad;
        } else if (key_is(k, "total_ms")) {
            if (!get_double(v, &r->total_ms))
                goto bad;
        }
        continue;
    bad:
        snprintf(rd->why, sizeof(rd->why), "field '%.*s' has the wrong type or is out of range",
                 (int)(k->via.str.size < 64 ? k->via.str.size : 64), k->via.str.ptr);
        *why = rd->why;
        return -1;
    }
    if (!have_at) {
        *why = "missing at_us";
        return -1;
    }
    if (r->nblocks > 0 && r->block_tokens == 0) {
        *why = "blocks without block_tokens";
        return -1;
    }
    return 0;
}

/* The header length of the MessagePack token starting with @p b (its first byte included). */
static unsigned token_head(unsigned char b)
{
    static const unsigned char c0[32] = {
        1, 1, 1, 1, 2, 3, 5, 3, 4, 6, 5, 9, 2, 3, 5, 9, /* 0xc0-0xcf */
        2, 3, 5, 9, 2, 2, 2, 2, 2, 2, 3, 5, 3, 5, 3, 5, /* 0xd0-0xdf */
    };
    return b >= 0xc0 && b <= 0xdf ? c0[b - 0xc0] : 1;
}

static uint64_t be(const unsigned char *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

/* msgpack-c allocates a container's elements when it reads the container's header, before they
 * arrive: a few bytes claiming 2^32 elements ask for 64 GiB or more. So every byte read is walked here
 * first, token by token (a container's elements are just the tokens after its header; str, bin and
 * ext payloads are passed over), and a container that claims more elements than there are bytes left
 * in the file (each element takes one at least) fails the read before msgpack sees it. */
static int skim(struct atc_trace_reader *rd, const unsigned char *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        if (rd->skim.skip > 0) {
            size_t k = rd->skim.skip < n - i ? (size_t)rd->skim.skip : n - i;
            rd->skim.skip -= k;
            i += k;
            continue;
        }
        if (rd->skim.nhead == 0)
            rd->skim.need = token_head(p[i]);
        while (rd->skim.nhead < rd->skim.need && i < n)
            rd->skim.head[rd->skim.nhead++] = p[i++];
        if (rd->skim.nhead < rd->skim.need)
            break;
        const unsigned char *h = rd->skim.head;
        uint64_t elements = 0;
        if (h[0] >= 0x80 && h[0] <= 0x8f)
            elements = 2u * (h[0] & 0x0fu);
        else if (h[0] >= 0x90 && h[0] <= 0x9f)
            elements = h[0] & 0x0fu;
        else if (h[0] == 0xdc || h[0] == 0xdd)
            elements = be(h + 1, h[0] == 0xdc ? 2 : 4);
        else if (h[0] == 0xde || h[0] == 0xdf)
            elements = 2 * be(h + 1, h[0] == 0xde ? 2 : 4);
        else if (h[0] >= 0xa0 && h[0] <= 0xbf)
            rd->skim.skip = h[0] & 0x1fu;
        else if (h[0] == 0xc4 || h[0] == 0xc5 || h[0] == 0xc6 || h[0] == 0xd9 || h[0] == 0xda || h[0] == 0xdb)
            rd->skim.skip = be(h + 1, rd->skim.need - 1);
        else if (h[0] == 0xc7 || h[0] == 0xc8 || h[0] == 0xc9)
            rd->skim.skip = be(h + 1, rd->skim.need - 2);
        else if (h[0] >= 0xd4 && h[0] <= 0xd8)
            rd->skim.skip = 1u << (h[0] - 0xd4);
        rd->skim.nhead = 0;
        uint64_t at = rd->skimmed + i; /* just past the header */
        if (rd->size > 0 && elements > (rd->size > at ? rd->size - at : 0)) {
            struct stat st; /* the file may have grown since it was opened (a trace being recorded) */
            if (fstat(fileno(rd->f), &st) == 0 && (uint64_t)st.st_size > rd->size)
                rd->size = (uint64_t)st.st_size;
            if (elements > (rd->size > at ? rd->size - at : 0))
                return -1;
        }
    }
    rd->skimmed += n;
    return 0;
}

/* Next object from the file; 1, 0 at a clean end, -1 (with *why) on a parse error or a truncated end. */
static int next_object(struct atc_trace_reader *rd, const char **why)
{
    for (;;) {
        msgpack_unpack_return ret = msgpack_unpacker_next(&rd->u, &rd->obj);
        if (ret == MSGPACK_UNPACK_SUCCESS)
            return 1;
        if (ret == MSGPACK_UNPACK_PARSE_ERROR) {
            *why = "not valid MessagePack";
            return -1;
        }
        if (ret == MSGPACK_UNPACK_NOMEM_ERROR) {
            *why = "out of memory";
            return -1;
        }
        if (rd->eof) {
            if (msgpack_unpacker_message_size(&rd->u) > msgpack_unpacker_parsed_size(&rd->u)) {
                *why = "truncated (the file ends in the middle of a record)";
                return -1;
            }
            return 0;
        }
        if (!msgpack_unpacker_reserve_buffer(&rd->u, READ_CHUNK)) {
            *why = "out of memory";
            return -1;
        }
        size_t n = fread(msgpack_unpacker_buffer(&rd->u), 1, READ_CHUNK, rd->f);
        if (n == 0) {
            if (ferror(rd->f)) {
                *why = strerror(errno);
                return -1;
            }
            rd->eof = true;
        }
        if (skim(rd, (const unsigned char *)msgpack_unpacker_buffer(&rd->u), n) < 0) {
            *why = "a container claims more elements than the file has bytes left";
            return -1;
        }
        msgpack_unpacker_buffer_consumed(&rd->u, n);
    }
}

void atc_trace_close(struct atc_trace_reader *rd)
{
    if (rd == NULL)
        return;
    if (rd->f != NULL)
        fclose(rd->f);
    msgpack_unpacked_destroy(&rd->obj);
    msgpack_unpacker_destroy(&rd->u);
    free(rd->strings);
    free(rd->blocks);
    free(rd->path);
    free(rd);
}

struct atc_trace_reader *atc_trace_open(const char *path, struct atc_trace_header *h, char **err)
{
    struct atc_trace_reader *rd = calloc(1, sizeof(*rd));
    const char *why;
    if (rd == NULL || (rd->path = strdup(path)) == NULL) {
        free(rd);
        *err = strdup("out of memory");
        return NULL;
    }
    msgpack_unpacked_init(&rd->obj);
    if (!msgpack_unpacker_init(&rd->u, READ_CHUNK)) {
        msgpack_unpacked_destroy(&rd->obj);
        free(rd->path);
        free(rd);
        *err = strdup("out of memory");
        return NULL;
    }
    if ((rd->f = fopen(path, "rb")) == NULL) {
        if (asprintf(err, "%s: cannot open: %s", path, strerror(errno)) < 0)
            *err = NULL;
        atc_trace_close(rd);
        return NULL;
    }
    struct stat st;
    if (fstat(fileno(rd->f), &st) == 0 && S_ISREG(st.st_mode))
        rd->size = (uint64_t)st.st_size;
    int rc = next_object(rd, &why);
    if (rc == 0)
        why = "empty file (no header)";
    if (rc <= 0 || decode_header(&rd->obj.data, h, &why) < 0) {
        if (asprintf(err, "%s: %s", path, rc < 0 ? "not an atc trace (not MessagePack)" : why) < 0)
            *err = NULL;
        atc_trace_close(rd);
        return NULL;
    }
    if (h->version > ATC_TRACE_VERSION) {
        if (asprintf(err, "%s: trace format version %u is newer than this atc's (%u)", path, h->version,
                     ATC_TRACE_VERSION) < 0)
            *err = NULL;
        atc_trace_close(rd);
        return NULL;
    }
    return rd;
}

int atc_trace_read(struct atc_trace_reader *rd, struct atc_trace_record *r, char **err)
{
    const char *why = NULL;
    size_t offset = msgpack_unpacker_parsed_size(&rd->u);
    int rc = next_object(rd, &why);
    if (rc == 0)
        return 0;
    if (rc > 0 && decode_record(rd, &rd->obj.data, r, &why) == 0) {
        rd->nread++;
        return 1;
    }
    if (asprintf(err, "%s: record %zu (byte %zu): %s", rd->path, rd->nread + 1, offset, why) < 0)
        *err = NULL;
    return -1;
}

/* ---- traces in memory ---- */

struct trace_arena {
    struct trace_arena *next;
    size_t used, size;
    _Alignas(8) char data[];
};

static void *arena_alloc(struct atc_trace *t, size_t n)
{
    n = (n + 7) & ~(size_t)7;
    struct trace_arena *a = t->arena;
    if (a == NULL || a->size - a->used < n) {
        size_t size = n > ARENA_CHUNK ? n : ARENA_CHUNK;
        struct trace_arena *b = malloc(sizeof(*b) + size);
        if (b == NULL)
            return NULL;
        b->next = a;
        b->used = 0;
        b->size = size;
        t->arena = a = b;
    }
    void *p = a->data + a->used;
    a->used += n;
    return p;
}

static const char *arena_str(struct atc_trace *t, const char *s, size_t len, bool *oom)
{
    if (s == NULL)
        return NULL;
    if (len == 0 && s[0] == '\0')
        return "";
    char *d = arena_alloc(t, len + 1);
    if (d == NULL) {
        *oom = true;
        return NULL;
    }
    memcpy(d, s, len);
    d[len] = '\0';
    return d;
}

struct atc_trace *atc_trace_new(const char *source)
{
    struct atc_trace *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return NULL;
    t->header.version = ATC_TRACE_VERSION;
    snprintf(t->header.source, sizeof(t->header.source), "%s", source);
    snprintf(t->header.atc_version, sizeof(t->header.atc_version), "%s", ATC_VERSION);
    struct timeval tv;
    gettimeofday(&tv, NULL);
    t->header.created = (double)tv.tv_sec + (double)tv.tv_usec / 1e6;
    return t;
}

void atc_trace_free(struct atc_trace *t)
{
    if (t == NULL)
        return;
    while (t->arena != NULL) {
        struct trace_arena *next = t->arena->next;
        free(t->arena);
        t->arena = next;
    }
    free(t->records);
    free(t);
}

int atc_trace_append(struct atc_trace *t, const struct atc_trace_record *r)
{
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 1024;
        struct atc_trace_record *v = realloc(t->records, cap * sizeof(*v));
        if (v == NULL)
            return -1;
        t->records = v;
        t->cap = cap;
    }
    bool oom = false;
    struct atc_trace_record c = *r;
    c.id = arena_str(t, r->id, r->id ? strlen(r->id) : 0, &oom);
    c.model = arena_str(t, r->model, strlen(r->model), &oom);
    c.tenant = arena_str(t, r->tenant, strlen(r->tenant), &oom);
    c.session = arena_str(t, r->session, strlen(r->session), &oom);
    c.prompt = arena_str(t, r->prompt, r->prompt_len, &oom);
    c.endpoint = arena_str(t, r->endpoint, r->endpoint ? strlen(r->endpoint) : 0, &oom);
    c.decision = arena_str(t, r->decision, r->decision ? strlen(r->decision) : 0, &oom);
    if (r->nheaders > 0) {
        struct atc_trace_field *h = arena_alloc(t, r->nheaders * sizeof(*h));
        if (h == NULL)
            return -1;
        for (size_t i = 0; i < r->nheaders; i++) {
            h[i].name = arena_str(t, r->headers[i].name, strlen(r->headers[i].name), &oom);
            h[i].value = arena_str(t, r->headers[i].value, strlen(r->headers[i].value), &oom);
        }
        c.headers = h;
    }
    c.reason = arena_str(t, r->reason, opt_len(r->reason), &oom);
    c.scores = arena_str(t, r->scores, opt_len(r->scores), &oom);
    c.shadow_decision = arena_str(t, r->shadow_decision, opt_len(r->shadow_decision), &oom);
    c.shadow_endpoint = arena_str(t, r->shadow_endpoint, opt_len(r->shadow_endpoint), &oom);
    if (r->nblocks > 0) {
        uint64_t *b = arena_alloc(t, r->nblocks * sizeof(uint64_t));
        if (b == NULL)
            return -1;
        memcpy(b, r->blocks, r->nblocks * sizeof(uint64_t));
        c.blocks = b;
    } else {
        c.blocks = NULL;
    }
    if (oom)
        return -1;
    t->records[t->n++] = c;
    return 0;
}

struct arrival {
    uint64_t at_us;
    size_t index;
};

static int by_arrival(const void *a, const void *b)
{
    const struct arrival *x = a, *y = b;
    if (x->at_us != y->at_us)
        return x->at_us < y->at_us ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index; /* stable: ties keep file order */
}

int atc_trace_normalize(struct atc_trace *t)
{
    bool sorted = true;
    for (size_t i = 1; i < t->n && sorted; i++)
        sorted = t->records[i - 1].at_us <= t->records[i].at_us;
    if (!sorted) {
        struct arrival *order = malloc(t->n * sizeof(*order));
        struct atc_trace_record *records = malloc(t->cap * sizeof(*records));
        if (order == NULL || records == NULL) {
            free(order);
            free(records);
            return -1;
        }
        for (size_t i = 0; i < t->n; i++)
            order[i] = (struct arrival){t->records[i].at_us, i};
        qsort(order, t->n, sizeof(*order), by_arrival);
        for (size_t i = 0; i < t->n; i++)
            records[i] = t->records[order[i].index];
        free(order);
        free(t->records);
        t->records = records;
    }
    if (t->n == 0)
        return 0;
    uint64_t t0 = t->records[0].at_us;
    if (t0 > 0 && t->header.start_unix_us != 0)
        t->header.start_unix_us += t0;
    for (size_t i = 0; i < t->n; i++)
        t->records[i].at_us -= t0;
    return 0;
}

int atc_trace_save(const struct atc_trace *t, const char *path, char **err)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL) {
        if (asprintf(err, "%s: cannot create: %s", path, strerror(errno)) < 0)
            *err = NULL;
        return -1;
    }
    struct atc_trace_buf b = {0};
    int rc = atc_trace_encode_header(&b, &t->header);
    for (size_t i = 0; i < t->n && rc == 0; i++) {
        rc = atc_trace_encode_record(&b, &t->records[i]);
        if (rc == 0 && b.len >= READ_CHUNK) {
            if (fwrite(b.data, 1, b.len, f) != b.len)
                rc = -2;
            b.len = 0;
        }
    }
    if (rc == 0 && b.len > 0 && fwrite(b.data, 1, b.len, f) != b.len)
        rc = -2;
    free(b.data);
    if (fclose(f) != 0 && rc == 0)
        rc = -2;
    if (rc < 0) {
        if (asprintf(err, "%s: %s", path, rc == -1 ? "out of memory" : strerror(errno)) < 0)
            *err = NULL;
        return -1;
    }
    return 0;
}

/* ---- JSON lines (atc trace dump) ---- */

static void json_key_str(FILE *out, const char *k, const char *v)
{
    fprintf(out, ",\"%s\":", k);
    atc_json_fwrite_string(out, v, strlen(v));
}

const char *atc_trace_record_header(const struct atc_trace_record *r, const char *name)
{
    for (size_t i = 0; i < r->nheaders; i++)
        if (strcasecmp(r->headers[i].name, name) == 0)
            return r->headers[i].value;
    return NULL;
}

void atc_trace_record_json(FILE *out, const struct atc_trace_record *r)
{
    fprintf(out, "{\"at_us\":%llu", (unsigned long long)r->at_us);
    if (r->id != NULL)
        json_key_str(out, "id", r->id);
    if (r->model[0] != '\0')
        json_key_str(out, "model", r->model);
    if (r->kind != ATC_KIND_CHAT)
        json_key_str(out, "kind", atc_request_kind_name(r->kind));
    fprintf(out, ",\"prompt_tokens\":%u", r->prompt_tokens);
    if (r->max_tokens >= 0)
        fprintf(out, ",\"max_tokens\":%lld", (long long)r->max_tokens);
    if (r->output_tokens >= 0)
        fprintf(out, ",\"output_tokens\":%lld", (long long)r->output_tokens);
    if (r->priority != 0)
        fprintf(out, ",\"priority\":%d", r->priority);
    if (r->tenant[0] != '\0')
        json_key_str(out, "tenant", r->tenant);
    if (r->session[0] != '\0')
        json_key_str(out, "session", r->session);
    if (r->stream)
        fputs(",\"stream\":true", out);
    if (r->nblocks > 0) {
        fprintf(out, ",\"block_tokens\":%u,\"blocks\":[", r->block_tokens);
        for (size_t i = 0; i < r->nblocks; i++)
            fprintf(out, "%s%llu", i ? "," : "", (unsigned long long)r->blocks[i]);
        fputc(']', out);
    }
    if (r->prompt != NULL) {
        fputs(",\"prompt\":", out);
        atc_json_fwrite_string(out, r->prompt, r->prompt_len);
    }
    if (r->nheaders > 0) {
        fputs(",\"headers\":{", out);
        for (size_t i = 0; i < r->nheaders; i++) {
            if (i > 0)
                fputc(',', out);
            atc_json_fwrite_string(out, r->headers[i].name, strlen(r->headers[i].name));
            fputc(':', out);
            atc_json_fwrite_string(out, r->headers[i].value, strlen(r->headers[i].value));
        }
        fputc('}', out);
    }
    if (r->endpoint != NULL)
        json_key_str(out, "endpoint", r->endpoint);
    if (r->policy_version != 0)
        fprintf(out, ",\"policy_version\":%llu", (unsigned long long)r->policy_version);
    if (r->decision != NULL)
        json_key_str(out, "decision", r->decision);
    if (r->reason != NULL)
        json_key_str(out, "reason", r->reason);
    if (r->scores != NULL)
        fprintf(out, ",\"scores\":%s", r->scores); /* JSON already */
    if (r->shadow_version != 0)
        fprintf(out, ",\"shadow_version\":%llu", (unsigned long long)r->shadow_version);
    if (r->shadow_decision != NULL)
        json_key_str(out, "shadow_decision", r->shadow_decision);
    if (r->shadow_endpoint != NULL)
        json_key_str(out, "shadow_endpoint", r->shadow_endpoint);
    if (r->attempts != 0)
        fprintf(out, ",\"attempts\":%u", r->attempts);
    if (r->status != 0)
        fprintf(out, ",\"status\":%d", r->status);
    if (r->ttft_ms >= 0)
        fprintf(out, ",\"ttft_ms\":%.3f", r->ttft_ms);
    if (r->total_ms >= 0)
        fprintf(out, ",\"total_ms\":%.3f", r->total_ms);
    fputs("}\n", out);
}
