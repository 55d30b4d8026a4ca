/* Vetting a client's bytes before evhttp parses them (request_vet.h). */

#include "http/request_vet.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/http.h>

/* The header that carries a refusal to the handler, in the request put in place of the refused one. */
#define REFUSAL_HEADER "x-atc-refused"
/* The part of a header line parsed for framing (Content-Length, Transfer-Encoding); longer lines are only
 * checked. */
#define LINE_PARSE_MAX 256

static const char refused_obs_fold[] = "obs_fold";
static const char refused_nul[] = "nul_in_header";

enum vet_state {
    VET_HEAD,       /* holding a head until its empty line */
    VET_BODY,       /* `left` bytes of a Content-Length body pass */
    VET_CHUNK_SIZE, /* a chunk-size line, extensions dropped */
    VET_CHUNK_DATA, /* `left` bytes of chunk data pass, then its CRLF line */
    VET_CHUNK_END,  /* the empty line after chunk data */
    VET_TRAILER,    /* trailer fields, dropped, up to the empty line */
    VET_PASS,       /* framing lost (evhttp will refuse): everything passes unvetted */
    VET_REFUSED,    /* the refused request was handed on: the rest is dropped */
};

struct atc_request_vet {
    struct evbuffer *in;            /* the connection's input: what evhttp reads */
    struct evbuffer_cb_entry *cb;
    struct evbuffer *work;          /* bytes taken from `in` to vet; a held head or line stays here */
    size_t vetted;                  /* bytes at the front of `in` already vetted */
    enum vet_state state;
    uint64_t left;
    size_t scanned;                 /* VET_HEAD: bytes of `work` whose lines were checked */
    bool head_line_seen;            /* VET_HEAD: the request line has been seen */
    bool no_body, chunked, have_length;
    bool framing_unknown;           /* a framing header too long to parse: the rest passes unvetted */
    uint64_t length;
    const char *refusal;
    bool busy;                      /* our own changes to `in` call our callback back */
};

/* Calls over the chains of @p b from byte @p start on: @p fn(base, len, offset of base, arg) until it
 * returns true; returns whether one did. */
static bool each_span(struct evbuffer *b, size_t start, bool (*fn)(const char *, size_t, size_t, void *),
                      void *arg)
{
    struct evbuffer_iovec stackv[32], *vec = stackv;
    int n = evbuffer_peek(b, -1, NULL, NULL, 0);
    if (n > 32 && (vec = malloc((size_t)n * sizeof(*vec))) == NULL)
        return false;
    n = evbuffer_peek(b, -1, NULL, vec, n);
    bool found = false;
    size_t off = 0;
    for (int i = 0; i < n && !found; i++) {
        size_t len = vec[i].iov_len;
        if (off + len > start) {
            size_t from = start > off ? start - off : 0;
            found = fn((const char *)vec[i].iov_base + from, len - from, off + from, arg);
        }
        off += len;
    }
    if (vec != stackv)
        free(vec);
    return found;
}

static bool find_lf(const char *s, size_t len, size_t at, void *arg)
{
    const char *lf = memchr(s, '\n', len);
    if (lf != NULL)
        *(size_t *)arg = at + (size_t)(lf - s);
    return lf != NULL;
}

/* A line of `work` from @p start: its length without the EOL (LF or CRLF, as evhttp reads lines) in
 * *len, with it in *total; false when it is not complete yet. */
static bool next_line(struct evbuffer *b, size_t start, size_t *len, size_t *total)
{
    size_t lf;
    if (!each_span(b, start, find_lf, &lf))
        return false;
    *total = lf + 1 - start;
    *len = *total - 1;
    char cr;
    struct evbuffer_ptr p;
    if (*len > 0 && evbuffer_ptr_set(b, &p, lf - 1, EVBUFFER_PTR_SET) == 0 &&
        evbuffer_copyout_from(b, &p, &cr, 1) == 1 && cr == '\r')
        (*len)--;
    return true;
}

struct span_end {
    size_t end;
};

static bool find_nul(const char *s, size_t len, size_t at, void *arg)
{
    size_t end = ((struct span_end *)arg)->end;
    if (at >= end)
        return false;
    return memchr(s, '\0', len < end - at ? len : end - at) != NULL;
}

static bool has_nul(struct evbuffer *b, size_t start, size_t len)
{
    struct span_end e = {start + len};
    return len > 0 && each_span(b, start, find_nul, &e);
}

/* Trims spaces and tabs at both ends of [*s, *s + *n). */
static void trim(const char **s, size_t *n)
{
    while (*n > 0 && (**s == ' ' || **s == '\t'))
        (*s)++, (*n)--;
    while (*n > 0 && ((*s)[*n - 1] == ' ' || (*s)[*n - 1] == '\t'))
        (*n)--;
}

/* One header line of the held head: refusals, and the framing evhttp will use (the first Content-Length,
 * the first Transfer-Encoding, as evhttp_find_header finds them). */
static void head_line(struct atc_request_vet *v, size_t start, size_t len)
{
    if (has_nul(v->work, start, len)) {
        v->refusal = refused_nul;
        return;
    }
    char line[LINE_PARSE_MAX];
    size_t n = len < sizeof(line) ? len : sizeof(line);
    struct evbuffer_ptr p;
    evbuffer_ptr_set(v->work, &p, start, EVBUFFER_PTR_SET);
    evbuffer_copyout_from(v->work, &p, line, n);
    if (n < len) { /* too long to parse: only what it is */
        if (v->head_line_seen && (line[0] == ' ' || line[0] == '\t'))
            v->refusal = refused_obs_fold;
        else if (v->head_line_seen && (strncasecmp(line, "Content-Length", 14) == 0 ||
                                       strncasecmp(line, "Transfer-Encoding", 17) == 0))
            v->framing_unknown = true; /* padded past what is parsed: let evhttp judge the rest */
        v->head_line_seen = true;
        return;
    }
    if (!v->head_line_seen) { /* the request line: HEAD has no body */
        v->head_line_seen = true;
        v->no_body = n >= 5 && memcmp(line, "HEAD ", 5) == 0;
        return;
    }
    if (line[0] == ' ' || line[0] == '\t') {
        v->refusal = refused_obs_fold;
        return;
    }
    const char *colon = memchr(line, ':', n);
    if (colon == NULL)
        return;
    size_t klen = (size_t)(colon - line);
    const char *val = colon + 1;
    size_t vlen = n - klen - 1;
    trim(&val, &vlen);
    if (klen == 14 && strncasecmp(line, "Content-Length", 14) == 0 && !v->have_length) {
        uint64_t x = 0;
        bool ok = vlen > 0 && vlen <= 19;
        for (size_t i = 0; ok && i < vlen; i++) {
            ok = val[i] >= '0' && val[i] <= '9';
            x = x * 10 + (uint64_t)(val[i] - '0');
        }
        v->have_length = true;
        v->length = ok ? x : 0;
    } else if (klen == 17 && strncasecmp(line, "Transfer-Encoding", 17) == 0 && !v->chunked) {
        v->chunked = vlen == 7 && strncasecmp(val, "chunked", 7) == 0;
    }
}

static void reset_head(struct atc_request_vet *v)
{
    v->state = VET_HEAD;
    v->scanned = 0;
    v->head_line_seen = v->no_body = v->chunked = v->have_length = v->framing_unknown = false;
    v->length = 0;
}

/* Hands the first @p n bytes of `work` to evhttp. */
static void pass(struct atc_request_vet *v, size_t n)
{
    evbuffer_remove_buffer(v->work, v->in, n);
}

/* The whole head is held (its empty line ends at @p end): hand it on, or the request that replaces it. */
static void end_head(struct atc_request_vet *v, size_t end)
{
    if (v->refusal != NULL) {
        evbuffer_drain(v->work, evbuffer_get_length(v->work));
        evbuffer_add_printf(v->in,
                            "GET / HTTP/1.1\r\nHost: atc\r\n" REFUSAL_HEADER ": %s\r\nConnection: close\r\n\r\n",
                            v->refusal);
        v->state = VET_REFUSED;
        return;
    }
    pass(v, end);
    bool chunked = v->chunked, body = !v->no_body, unknown = v->framing_unknown;
    uint64_t length = v->length;
    reset_head(v);
    if (unknown) {
        v->state = VET_PASS;
    } else if (body && chunked) {
        v->state = VET_CHUNK_SIZE;
    } else if (body && length > 0) {
        v->state = VET_BODY;
        v->left = length;
    }
}

/* A chunk-size line: "1a;name=value" becomes "1a". Returns false when it is not one (evhttp refuses it). */
static bool chunk_size_line(struct atc_request_vet *v, size_t len, size_t total)
{
    char line[LINE_PARSE_MAX];
    if (len >= sizeof(line) || has_nul(v->work, 0, len))
        return false;
    evbuffer_copyout(v->work, line, len);
    size_t digits = 0;
    uint64_t size = 0;
    while (digits < len && digits < 16 && line[digits] != '\0' && strchr("0123456789abcdefABCDEF", line[digits])) {
        char c = line[digits++];
        size = size * 16 + (uint64_t)(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    size_t rest = digits;
    while (rest < len && (line[rest] == ' ' || line[rest] == '\t'))
        rest++;
    if (digits == 0 || (rest < len && line[rest] != ';'))
        return false;
    evbuffer_drain(v->work, total);
    evbuffer_add(v->in, line, digits);
    evbuffer_add(v->in, "\r\n", 2);
    if (size == 0) {
        v->state = VET_TRAILER;
    } else {
        v->state = VET_CHUNK_DATA;
        v->left = size;
    }
    return true;
}

/* Vets what `work` holds; leaves there only an incomplete line or head. */
static void vet(struct atc_request_vet *v)
{
    size_t last_avail = SIZE_MAX;
    enum vet_state last_state = v->state;
    for (;;) {
        size_t avail = evbuffer_get_length(v->work);
        size_t len, total;
        if (avail == last_avail && v->state == last_state) /* no progress (evhttp's buffer refused bytes) */
            return;
        last_avail = avail;
        last_state = v->state;
        switch (v->state) {
        case VET_PASS:
            pass(v, avail);
            return;
        case VET_REFUSED:
            evbuffer_drain(v->work, avail);
            return;
        case VET_BODY:
        case VET_CHUNK_DATA: {
            size_t n = avail < v->left ? avail : (size_t)v->left;
            if (n == 0)
                return;
            pass(v, n);
            v->left -= n;
            if (v->left == 0)
                v->state = v->state == VET_BODY ? VET_HEAD : VET_CHUNK_END;
            if (v->state == VET_HEAD)
                reset_head(v);
            break;
        }
        case VET_HEAD:
            while (v->refusal == NULL && next_line(v->work, v->scanned, &len, &total)) {
                if (len == 0 && v->head_line_seen) {
                    end_head(v, v->scanned + total);
                    goto next;
                }
                if (len > 0 || v->head_line_seen) /* empty lines before a request line are skipped */
                    head_line(v, v->scanned, len);
                v->scanned += total;
            }
            if (v->refusal != NULL) { /* the rest of the connection does not matter */
                end_head(v, 0);
                break;
            }
            if (avail > ATC_VET_HEAD_MAX) { /* too long: evhttp refuses it */
                v->state = VET_PASS;
                break;
            }
            return;
        case VET_CHUNK_SIZE:
            if (!next_line(v->work, 0, &len, &total)) {
                if (avail <= LINE_PARSE_MAX)
                    return;
                v->state = VET_PASS;
                break;
            }
            if (len == 0) { /* as evhttp does, an empty line here is skipped */
                pass(v, total);
                break;
            }
            if (!chunk_size_line(v, len, total))
                v->state = VET_PASS;
            break;
        case VET_CHUNK_END:
            if (!next_line(v->work, 0, &len, &total))
                return;
            if (len != 0) {
                v->state = VET_PASS;
                break;
            }
            pass(v, total);
            v->state = VET_CHUNK_SIZE;
            break;
        case VET_TRAILER:
            if (!next_line(v->work, 0, &len, &total)) {
                if (avail <= ATC_VET_HEAD_MAX)
                    return;
                v->state = VET_PASS;
                break;
            }
            if (len > 0) { /* a trailer field: dropped */
                evbuffer_drain(v->work, total);
                break;
            }
            pass(v, total);
            reset_head(v);
            break;
        }
    next:;
    }
}

static void on_input(struct evbuffer *in, const struct evbuffer_cb_info *info, void *arg)
{
    struct atc_request_vet *v = arg;
    if (v->busy)
        return;
    /* evhttp consumed vetted bytes from the front; anything added is new, at the end. */
    v->vetted -= info->n_deleted < v->vetted ? info->n_deleted : v->vetted;
    size_t len = evbuffer_get_length(in);
    if (len <= v->vetted)
        return;
    v->busy = true;
    /* A socket bufferevent keeps the end of its input frozen but while it reads into it; this is called
     * from that read, or when a vet starts (outside it). Frozen again after: as it is between reads. */
    evbuffer_unfreeze(in, 0);
    /* The new bytes are at the end of `in`, which gives up bytes only from the front: take everything,
     * put the vetted part back. */
    struct evbuffer *tmp = evbuffer_new();
    if (tmp == NULL) {
        evbuffer_freeze(in, 0);
        v->busy = false;
        return;
    }
    evbuffer_add_buffer(tmp, in);
    evbuffer_remove_buffer(tmp, in, v->vetted);
    char small[4096];
    size_t n = evbuffer_get_length(tmp);
    if (n <= sizeof(small)) /* a copy into the last chain: a head sent a byte at a time stays one chain */
        evbuffer_add(v->work, small, (size_t)evbuffer_remove(tmp, small, n));
    else
        evbuffer_add_buffer(v->work, tmp);
    evbuffer_free(tmp);
    vet(v);
    v->vetted = evbuffer_get_length(in);
    evbuffer_freeze(in, 0);
    v->busy = false;
}

struct atc_request_vet *atc_request_vet_start(struct bufferevent *bev)
{
    struct atc_request_vet *v = calloc(1, sizeof(*v));
    if (v == NULL)
        return NULL;
    v->in = bufferevent_get_input(bev);
    if ((v->work = evbuffer_new()) == NULL || (v->cb = evbuffer_add_cb(v->in, on_input, v)) == NULL) {
        if (v->work != NULL)
            evbuffer_free(v->work);
        free(v);
        return NULL;
    }
    reset_head(v);
    struct evbuffer_cb_info info = {.orig_size = 0, .n_added = evbuffer_get_length(v->in), .n_deleted = 0};
    on_input(v->in, &info, v); /* what is there already starts a request */
    return v;
}

void atc_request_vet_stop(struct atc_request_vet *v)
{
    if (v == NULL)
        return;
    evbuffer_remove_cb_entry(v->in, v->cb);
    if (v->state != VET_REFUSED && evbuffer_get_length(v->work) > 0) {
        evbuffer_unfreeze(v->in, 0); /* as in on_input */
        evbuffer_add_buffer(v->in, v->work);
        evbuffer_freeze(v->in, 0);
    }
    evbuffer_free(v->work);
    free(v);
}

const char *atc_request_vet_refusal(struct evhttp_request *req)
{
    const char *r = evhttp_find_header(evhttp_request_get_input_headers(req), REFUSAL_HEADER);
    if (r == NULL)
        return NULL;
    if (strcmp(r, refused_obs_fold) == 0)
        return refused_obs_fold;
    if (strcmp(r, refused_nul) == 0)
        return refused_nul;
    return NULL; /* a client's own header of that name: not ours */
}

const char *atc_request_vet_message(const char *refusal)
{
    if (refusal == refused_obs_fold)
        return "a header line starts with a space or tab (obs-fold); send each header on one line";
    return "a header contains a NUL byte";
}
