/* vLLM's KV-cache event batches from msgpack (kv_event_decode.h): a bounds pass over the bytes, then
 * msgpack-c's unpacker, then a walk of its objects that accepts both of msgspec's encodings. */

#include "fleet/kv_event_decode.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

const char atc_kv_err_msgpack[] = "malformed msgpack";
const char atc_kv_err_shape[] = "not an EventBatch";
const char atc_kv_err_event[] = "malformed event";
const char atc_kv_err_hash[] = "block hash neither an integer nor bytes";
const char atc_kv_err_too_deep[] = "nested too deep";

#define MAX_DEPTH 24 /* a batch nests 5 deep (extra_keys: 6); msgpack-c's own stack holds 32 */

static uint64_t be(const uint8_t *p, size_t n)
{
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

/* Walks the msgpack value sequence of @p data without building anything: every length must fit in the
 * bytes left, every container's items must each have at least a byte left for them, and exactly one
 * value must fill the payload. msgpack-c allocates a container's items when it reads its header, so a
 * 5-byte array header claiming 2^32 items would otherwise cost 96 GiB before the first item is read. */
static const char *check_bounds(const uint8_t *data, size_t len)
{
    size_t pos = 0, pending = 1; /* values still to read */
    size_t depth_left[MAX_DEPTH + 1];
    size_t depth = 0;
    depth_left[0] = 1;
    while (pending > 0) {
        if (pos >= len)
            return atc_kv_err_msgpack;
        while (depth > 0 && depth_left[depth] == 0)
            depth--;
        depth_left[depth]--;
        pending--;
        uint8_t t = data[pos++];
        size_t skip = 0, items = 0, hdr = 0;
        if (t <= 0x7f || t >= 0xe0 || t == 0xc0 || t == 0xc2 || t == 0xc3) {
            skip = 0;
        } else if (t >= 0x80 && t <= 0x8f) {
            items = 2 * (size_t)(t & 0x0f);
        } else if (t >= 0x90 && t <= 0x9f) {
            items = t & 0x0f;
        } else if (t >= 0xa0 && t <= 0xbf) {
            skip = t & 0x1f;
        } else {
            switch (t) {
            case 0xc4:
            case 0xd9:
                hdr = 1;
                break; /* bin8, str8 */
            case 0xc5:
            case 0xda:
                hdr = 2;
                break;
            case 0xc6:
            case 0xdb:
                hdr = 4;
                break;
            case 0xc7:
                hdr = 1;
                skip = 1;
                break; /* ext8: length, type, data */
            case 0xc8:
                hdr = 2;
                skip = 1;
                break;
            case 0xc9:
                hdr = 4;
                skip = 1;
                break;
            case 0xca:
                skip = 4;
                break;
            case 0xcb:
                skip = 8;
                break;
            case 0xcc:
            case 0xd0:
                skip = 1;
                break;
            case 0xcd:
            case 0xd1:
                skip = 2;
                break;
            case 0xce:
            case 0xd2:
                skip = 4;
                break;
            case 0xcf:
            case 0xd3:
                skip = 8;
                break;
            case 0xd4:
                skip = 2;
                break; /* fixext: type + 1, 2, 4, 8, 16 bytes */
            case 0xd5:
                skip = 3;
                break;
            case 0xd6:
                skip = 5;
                break;
            case 0xd7:
                skip = 9;
                break;
            case 0xd8:
                skip = 17;
                break;
            case 0xdc:
            case 0xde:
                hdr = 2;
                break;
            case 0xdd:
            case 0xdf:
                hdr = 4;
                break;
            default:
                return atc_kv_err_msgpack; /* 0xc1: never used */
            }
            if (hdr > len - pos)
                return atc_kv_err_msgpack;
            uint64_t n = be(data + pos, hdr);
            pos += hdr;
            if (t == 0xdc || t == 0xdd)
                items = n;
            else if (t == 0xde || t == 0xdf)
                items = 2 * n; /* n < 2^32: no overflow */
            else if (hdr > 0)
                skip += n;
        }
        if (skip > len - pos)
            return atc_kv_err_msgpack;
        pos += skip;
        if (items > 0) {
            if (items > len - pos || pending + items > len - pos)
                return atc_kv_err_msgpack; /* each item needs a byte at least */
            if (depth == MAX_DEPTH)
                return atc_kv_err_too_deep;
            depth_left[++depth] = items;
            pending += items;
        }
    }
    return pos == len ? NULL : atc_kv_err_msgpack;
}

static bool str_is(const msgpack_object *o, const char *s)
{
    size_t n = strlen(s);
    return o->type == MSGPACK_OBJECT_STR && o->via.str.size == n && memcmp(o->via.str.ptr, s, n) == 0;
}

/* The field @p name of an event or batch: the map's value, or the array's @p index-th item; NULL when
 * absent (a trailing field omitted). */
static const msgpack_object *field(const msgpack_object *o, const char *name, size_t index)
{
    if (o->type == MSGPACK_OBJECT_ARRAY)
        return index < o->via.array.size ? &o->via.array.ptr[index] : NULL;
    for (size_t i = 0; i < o->via.map.size; i++)
        if (str_is(&o->via.map.ptr[i].key, name))
            return &o->via.map.ptr[i].val;
    return NULL;
}

static int hash_of(const msgpack_object *o, uint64_t *key)
{
    switch (o->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        *key = o->via.u64;
        return 0;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: /* SGLang: the digest's first 8 bytes as a signed int64 */
        *key = (uint64_t)o->via.i64;
        return 0;
    case MSGPACK_OBJECT_BIN: { /* low 64 bits of the big-endian value (vLLM's maybe_convert_block_hash) */
        size_t n = o->via.bin.size;
        if (n == 0)
            return -1;
        const uint8_t *p = (const uint8_t *)o->via.bin.ptr;
        *key = n > 8 ? be(p + n - 8, 8) : be(p, n);
        return 0;
    }
    default:
        return -1;
    }
}

static const char *decode_event(const msgpack_object *o, struct atc_kv_event *ev)
{
    const msgpack_object *tag;
    size_t base; /* array_like: fields start after the tag */
    if (o->type == MSGPACK_OBJECT_ARRAY && o->via.array.size >= 1) {
        tag = &o->via.array.ptr[0];
        base = 1;
    } else if (o->type == MSGPACK_OBJECT_MAP) {
        tag = field(o, "type", 0);
        base = 0;
    } else {
        return atc_kv_err_event;
    }
    if (!tag || tag->type != MSGPACK_OBJECT_STR)
        return atc_kv_err_event;
    const msgpack_object *medium;
    ev->block_size = -1;
    if (str_is(tag, "BlockStored")) {
        ev->type = ATC_KV_STORED;
        medium = field(o, "medium", base + 5);
        const msgpack_object *bs = field(o, "block_size", base + 3);
        if (bs && bs->type == MSGPACK_OBJECT_POSITIVE_INTEGER && bs->via.u64 <= INT64_MAX)
            ev->block_size = (int64_t)bs->via.u64;
    } else if (str_is(tag, "BlockRemoved")) {
        ev->type = ATC_KV_REMOVED;
        medium = field(o, "medium", base + 1);
    } else if (str_is(tag, "AllBlocksCleared")) {
        ev->type = ATC_KV_CLEARED;
        return NULL;
    } else {
        ev->type = ATC_KV_UNKNOWN;
        return NULL;
    }
    ev->tier = ATC_KV_GPU;
    if (medium && medium->type == MSGPACK_OBJECT_STR && !str_is(medium, "GPU"))
        ev->tier = ATC_KV_CPU;
    else if (medium && medium->type != MSGPACK_OBJECT_STR && medium->type != MSGPACK_OBJECT_NIL)
        return atc_kv_err_event;
    const msgpack_object *hashes = field(o, "block_hashes", base);
    if (!hashes || hashes->type != MSGPACK_OBJECT_ARRAY)
        return atc_kv_err_event;
    size_t n = hashes->via.array.size;
    if (n > 0 && !(ev->keys = malloc(n * sizeof *ev->keys)))
        return atc_kv_err_msgpack; /* (out of memory: the batch is dropped all the same) */
    for (size_t i = 0; i < n; i++)
        if (hash_of(&hashes->via.array.ptr[i], &ev->keys[ev->nkeys++]) < 0)
            return atc_kv_err_hash;
    return NULL;
}

static const char *decode_batch(const msgpack_object *root, struct atc_kv_batch *out)
{
    if ((root->type != MSGPACK_OBJECT_ARRAY || root->via.array.size < 2) && root->type != MSGPACK_OBJECT_MAP)
        return atc_kv_err_shape;
    const msgpack_object *ts = field(root, "ts", 0), *events = field(root, "events", 1),
                         *rank = field(root, "data_parallel_rank", 2);
    if (!ts || !events || events->type != MSGPACK_OBJECT_ARRAY)
        return atc_kv_err_shape;
    if (ts->type == MSGPACK_OBJECT_FLOAT64 || ts->type == MSGPACK_OBJECT_FLOAT32)
        out->ts = ts->via.f64;
    else if (ts->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
        out->ts = (double)ts->via.u64;
    else
        return atc_kv_err_shape;
    out->dp_rank = -1;
    if (rank && rank->type == MSGPACK_OBJECT_POSITIVE_INTEGER && rank->via.u64 <= INT64_MAX)
        out->dp_rank = (int64_t)rank->via.u64;
    size_t n = events->via.array.size;
    if (n > 0 && !(out->events = calloc(n, sizeof *out->events)))
        return atc_kv_err_msgpack;
    for (size_t i = 0; i < n; i++) {
        const char *e = decode_event(&events->via.array.ptr[i], &out->events[out->nevents++]);
        if (e)
            return e;
        out->unknown += out->events[i].type == ATC_KV_UNKNOWN;
    }
    return NULL;
}

int atc_kv_batch_decode(const void *data, size_t len, struct atc_kv_batch *out, const char **err)
{
    memset(out, 0, sizeof *out);
    const char *e = check_bounds(data, len);
    if (e) {
        *err = e;
        return -1;
    }
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    if (msgpack_unpack_next(&u, data, len, &off) != MSGPACK_UNPACK_SUCCESS || off != len)
        e = atc_kv_err_msgpack;
    else
        e = decode_batch(&u.data, out);
    msgpack_unpacked_destroy(&u);
    if (e) {
        atc_kv_batch_dispose(out);
        *err = e;
        return -1;
    }
    *err = NULL;
    return 0;
}

void atc_kv_batch_dispose(struct atc_kv_batch *b)
{
    for (size_t i = 0; i < b->nevents; i++)
        free(b->events[i].keys);
    free(b->events);
    memset(b, 0, sizeof *b);
}
