#ifndef ATC_SSE_LINE_H
#define ATC_SSE_LINE_H

/* The relay's check of an event stream's lines (proxy/relay.c, sse_scan), apart so that the relay stays
 * under the size limit. Pure, any thread. */

#include <stdbool.h>
#include <stddef.h>

/** Whether the start of an SSE line (@p n bytes of it, the whole line when @p complete) can be what an
 * inference server sends: a field (data, event, id, retry) or a comment. */
bool atc_sse_line_ok(const char *head, size_t n, bool complete);

#endif
