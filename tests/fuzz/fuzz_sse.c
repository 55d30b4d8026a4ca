/* The SSE framing atc reads while it relays a stream: relay.c counts events (an event ends with a blank
 * line, "\n\n") for its metrics and access log, chunk by chunk as the body arrives, without holding or
 * splitting events. relay.c is included for its statics.
 *
 * Input: byte 0 seeds how the stream is cut into the bodies the upstream hands to the relay (each one
 * made of several evbuffer chains, as libevent builds them), the rest is the stream. However it is
 * cut, the count must be the one over the whole stream: the blank-line terminators found left to
 * right, each "\n" ending at most one of them. */

#include "../../engine/http/relay.c"

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

    struct relay *r = calloc(1, sizeof(*r));
    CHECK(r != NULL);
    for (size_t i = 0; i < size;) {
        size_t n = 1 + next(&s) % 24;
        if (n > size - i)
            n = size - i;
        struct evbuffer *b = evbuffer_new();
        for (size_t k = 0; k < n;) { /* several chains per body */
            size_t m = 1 + next(&s) % 4;
            if (m > n - k)
                m = n - k;
            struct evbuffer *chain = evbuffer_new();
            evbuffer_add(chain, data + i + k, m);
            evbuffer_add_buffer(b, chain);
            evbuffer_free(chain);
            k += m;
        }
        count_events(r, b, n);
        evbuffer_free(b);
        i += n;
    }
    CHECK(r->sse_events == reference_count(data, size));
    free(r);
    return 0;
}
