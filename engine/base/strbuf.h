#ifndef ATC_STRBUF_H
#define ATC_STRBUF_H

/* Bounded strings built by appending, for the request path. snprintf costs about 800 instructions a
 * call however short its output (callgrind on the chat load: 17 calls and 13k of the 55k instructions
 * of a small proxied request went to it); these copy bytes. Output is cut at the buffer's size and
 * always NUL-terminated, as snprintf's is. */

#include <stdint.h>
#include <string.h>

struct atc_strbuf {
    char *p;
    size_t len, size; /* size > 0: room for at least the terminating NUL */
};

static inline struct atc_strbuf atc_strbuf_init(char *p, size_t size)
{
    p[0] = '\0';
    return (struct atc_strbuf){.p = p, .len = 0, .size = size};
}

/** Appends @p n bytes of @p s, as many as fit. */
static inline void atc_strbuf_addn(struct atc_strbuf *b, const char *s, size_t n)
{
    size_t room = b->size - 1 - b->len;
    n = n < room ? n : room;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static inline void atc_strbuf_add(struct atc_strbuf *b, const char *s)
{
    atc_strbuf_addn(b, s, strlen(s));
}

/** Appends @p v in decimal. */
static inline void atc_strbuf_u64(struct atc_strbuf *b, uint64_t v)
{
    char digits[20];
    size_t n = 0;
    do
        digits[sizeof(digits) - ++n] = (char)('0' + v % 10);
    while ((v /= 10) != 0);
    atc_strbuf_addn(b, digits + sizeof(digits) - n, n);
}

/** Appends @p v in lowercase hex, at least @p width digits (zeros before). */
static inline void atc_strbuf_hex(struct atc_strbuf *b, uint64_t v, unsigned width)
{
    static const char hex[] = "0123456789abcdef";
    char digits[16];
    size_t n = 0;
    do
        digits[sizeof(digits) - ++n] = hex[v & 15];
    while ((v >>= 4) != 0);
    while (n < width && n < sizeof(digits))
        digits[sizeof(digits) - ++n] = '0';
    atc_strbuf_addn(b, digits + sizeof(digits) - n, n);
}

/** Copies @p src (NULL: "") into @p dst of @p size bytes, cut to fit: snprintf(dst, size, "%s", src). */
/* Appends "name: value suffix\r\n" when the whole line fits, else nothing: a line cut short would run
 * into the next header (an endpoint's id has no length limit). */
static inline void atc_strbuf_header(struct atc_strbuf *b, const char *name, const char *value,
                                     const char *suffix)
{
    size_t n = strlen(name), v = strlen(value), x = strlen(suffix);
    if (b->len + n + v + x + 4 >= b->size)
        return;
    atc_strbuf_addn(b, name, n);
    atc_strbuf_addn(b, ": ", 2);
    atc_strbuf_addn(b, value, v);
    atc_strbuf_addn(b, suffix, x);
    atc_strbuf_addn(b, "\r\n", 2);
}

static inline void atc_strlcpy(char *dst, size_t size, const char *src)
{
    struct atc_strbuf b = atc_strbuf_init(dst, size);
    if (src != NULL)
        atc_strbuf_addn(&b, src, strnlen(src, size - 1));
}

#endif
