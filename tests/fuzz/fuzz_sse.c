/* The SSE framing atc reads while it relays a stream: relay.c (sse_scan) checks that every line is a
 * field or a comment and counts events (an event ends with a blank line, "\n\n") for its metrics and
 * access log, piece by piece as the body arrives (one piece per read from the server), without holding
 * or splitting events. relay.c is included for its statics.
 *
 * Input: byte 0 seeds how the stream is cut into pieces, the rest is the stream. However it is cut, the
 * verdict must be the one over the whole stream in one piece, and for a well-formed stream the count
 * must be the blank-line terminators found left to right, each "\n" ending at most one of them. */

#include "../../engine/proxy/relay.c"

#include <stdint.h>

#include "fuzz.h"

static uint64_t reference_count(const uint8_t *s, size_t n)
{
    uint64_t events = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        if (s[i] == '\n' && s[i + 1] == '\n') {
            events++;
            i++;
        }
    }
    return events;
}

static uint32_t next(uint32_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return *s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint32_t s = 0x2545f491u ^ data[0];
    data++;
    size--;

    struct relay *whole = calloc(1, sizeof(*whole)), *r = calloc(1, sizeof(*r));
    CHECK(whole != NULL && r != NULL);
    bool ok = sse_scan(whole, (const char *)data, size), cut_ok = true;
    for (size_t i = 0; i < size && cut_ok;) {
        size_t n = 1 + next(&s) % 24;
        if (n > size - i)
            n = size - i;
        char *piece = malloc(n); /* its own allocation: a read past it is caught by ASan */
        CHECK(piece != NULL);
        memcpy(piece, data + i, n);
        cut_ok = sse_scan(r, piece, n);
        free(piece);
        i += n;
    }
    CHECK(ok == cut_ok);
    if (ok) {
        CHECK(r->sse_events == reference_count(data, size));
        CHECK(whole->sse_events == r->sse_events);
    }
    free(whole);
    free(r);
    return 0;
}
