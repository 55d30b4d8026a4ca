#ifndef ATC_HTTP_PARSE_H
#define ATC_HTTP_PARSE_H

/* HTTP/1.x request heads and chunked bodies, parsed in place over one contiguous buffer.
 *
 * No allocation and no callbacks: the request line and every header are slices of the caller's
 * buffer, and each slice is NUL-terminated in place (the byte after it is a delimiter the parse has
 * consumed), so the server hands out plain C strings without copying. Why this is hand-written rather
 * than Debian's libhttp-parser: see the measurement in http_parse.c. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Most header lines in one request; one more is answered 431. */
#define ATC_HTTP_MAX_HEADERS 100
/* Most empty lines before a request line (RFC 9112 2.2 asks a server to skip at least one); a stream of
 * them is refused (-400) rather than buffered. */
#define ATC_HTTP_MAX_EMPTY_LINES 4
/* Longest chunk-size line (size, leading zeros, OWS, extensions, CRLF), and longest trailer section of a
 * chunked body: what framing may cost a peer beyond the body, the rest is refused as malformed. */
#define ATC_HTTP_MAX_CHUNK_LINE 4096
#define ATC_HTTP_MAX_TRAILERS (16 * 1024)

enum atc_http_method {
    ATC_HTTP_GET = 1 << 0,
    ATC_HTTP_HEAD = 1 << 1,
    ATC_HTTP_POST = 1 << 2,
    ATC_HTTP_PUT = 1 << 3,
    ATC_HTTP_DELETE = 1 << 4,
    ATC_HTTP_OPTIONS = 1 << 5,
    ATC_HTTP_PATCH = 1 << 6,
    ATC_HTTP_OTHER = 1 << 7, /* a well-formed token no one here serves (CONNECT, TRACE, BREW, ...) */
};

/* One header line: where its name and its value (without surrounding OWS) begin, counted from the
 * head's first byte (atc_http_head.base); both are NUL-terminated in place. Offsets rather than two
 * pointers and two lengths: 8 bytes a line instead of 32, and a connection keeps a table of
 * ATC_HTTP_MAX_HEADERS of them for as long as its request is served (a held stream: minutes), so the
 * table is 0.8 KiB rather than 3.2. A buffer that moves needs only base rebased. Read them with
 * atc_http_header_name / _value. */
struct atc_http_header {
    uint32_t name, value;
};

struct atc_http_head {
    const char *base; /* the head's first byte (what was passed to atc_http_parse_request) */
    enum atc_http_method method;
    const char *method_name;
    const char *target; /* as sent (origin-form "/p", or absolute-form), up to any '?', NUL-terminated */
    const char *path;   /* the path alone ("/" for an absolute-form target without one), NUL-terminated */
    const char *query;  /* what followed '?' in the target, NUL-terminated, or NULL */
    int minor;          /* HTTP/1.<minor>: 0 or 1 */
    struct atc_http_header headers[ATC_HTTP_MAX_HEADERS];
    unsigned nheaders;
    /* framing, from the headers */
    int64_t content_length; /* -1: none */
    bool chunked;
    bool keep_alive; /* HTTP/1.1 unless "Connection: close"; HTTP/1.0 only with "keep-alive" */
    bool expect_continue;
    bool conflicting_lengths; /* two Content-Length values that differ */
    bool host;                /* a Host header line was seen */
    const struct atc_http_refusal *refused; /* after -400: what was refused when it has a code of its own
                                               (one of atc_http_refused_*), else NULL */
};

/* A request head refused with a code of its own: the error code and what the client is told. */
struct atc_http_refusal {
    const char *code, *message;
};
extern const struct atc_http_refusal atc_http_refused_empty_lines, atc_http_refused_nul_in_header,
    atc_http_refused_obs_fold, atc_http_refused_missing_host, atc_http_refused_two_hosts;

/** Parses the request head at the start of @p buf (@p len bytes, at most @p max_head of which may be the
 * head, after at most ATC_HTTP_MAX_EMPTY_LINES empty lines). Returns the head's length in bytes, the empty
 * lines before it included (its slices in @p h point into @p buf, which it modifies: NULs after each
 * slice; h->base is @p buf), 0 when the head is not complete yet (nothing is modified), or -status when it
 * is not acceptable: -400 (malformed, longer than @p max_head, more empty lines before it, or HTTP/1.1
 * without Host: then h->refused says which when it has a code of its own), -431 (too many headers), -501
 * (a transfer coding other than chunked). */
int atc_http_parse_request(char *buf, size_t len, size_t max_head, struct atc_http_head *h);

/** The value of header @p name (case-insensitive) of @p h, or NULL. The first one when repeated. */
const char *atc_http_head_find(const struct atc_http_head *h, const char *name);

/** Header line @p i (< h->nheaders) of @p h: its name, its value; NUL-terminated slices of the buffer. */
static inline const char *atc_http_header_name(const struct atc_http_head *h, unsigned i)
{
    return h->base + h->headers[i].name;
}
static inline const char *atc_http_header_value(const struct atc_http_head *h, unsigned i)
{
    return h->base + h->headers[i].value;
}

/* A chunked body being decoded in place. Zero it to start; then set max_body if the body has a limit. */
struct atc_http_chunked {
    uint64_t max_body; /* the caller's: a chunk size that takes the body past this is refused (0: none) */
    uint64_t body;     /* data bytes announced by the chunk sizes so far */
    uint64_t left;     /* bytes of the current chunk's data still to come */
    uint32_t line;     /* bytes of the current size line, or of the trailer section, so far */
    int state;
    unsigned size_digits;
    bool done;
};

/** Decodes the chunked bytes at @p buf[*@p pos .. @p len): data moves down to @p buf[*@p out ..], so the
 * decoded body stays contiguous. Advances *@p pos over what it consumed and *@p out over the data kept;
 * the bytes between the two may be dropped by the caller (framing, decoded already). Returns 1 when the
 * body (its last chunk and trailers) is complete, with *@p pos just past it; 0 when more bytes are needed;
 * -1 on a framing error (a size line over ATC_HTTP_MAX_CHUNK_LINE, trailers over ATC_HTTP_MAX_TRAILERS, a
 * bare CR, a size over 64 bits, ...); -2 as soon as a chunk's size takes the body past c->max_body, before
 * its data comes. After an error the data decoded before it is in place and counted in *@p out all the
 * same. Chunk extensions and trailer fields are skipped. */
int atc_http_chunked_decode(struct atc_http_chunked *c, char *buf, size_t len, size_t *pos, size_t *out);

/** Whether the comma-separated header value @p v holds @p token (case-insensitive). */
bool atc_http_has_token(const char *v, const char *token);

#endif
