/* What an SSE line may start with (sse_line.h). */

#include "proxy/sse_line.h"

#include <string.h>

/* Whether the start of an SSE line (@p n bytes of it, the whole line when @p complete) can be what an
 * inference server sends: a field (data, event, id, retry) or a comment. */
bool atc_sse_line_ok(const char *head, size_t n, bool complete)
{
    static const char *const fields[] = {"data", "event", "id", "retry"};
    if (n == 0 || head[0] == ':')
        return true;
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        size_t f = strlen(fields[i]);
        if (n > f && memcmp(head, fields[i], f) == 0 && head[f] == ':')
            return true;
        if (n == f && complete && memcmp(head, fields[i], f) == 0)
            return true;
        if (n < f + 1 && !complete && memcmp(head, fields[i], n) == 0)
            return true; /* too early to tell */
    }
    return false;
}
