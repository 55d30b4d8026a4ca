/* The admin API (admin.c) over any bytes a client may send on one connection: routes, methods,
 * query strings, bodies and the bearer token (admin_token is set), with the shipped policy loaded (so
 * /admin/policy/reload really reloads).
 * Any request line that parses gets an answer; nothing may crash, leak or hang. */

#include <stdint.h>

#include "fuzz_http.h"
#include "http/http_server.h"
#include "fuzz_server.h"

static struct event_base *base;
static struct atc_server *srv;
static struct fuzz_http fh;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    base = event_base_new();
    CHECK(base != NULL);
    srv = fuzz_server_start(base);
    CHECK(atc_http_server_listen(srv->admin, fuzz_http_listen_fd(&fh, base)) == 0);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct evbuffer *reply = fuzz_http_exchange(&fh, data, size);
    /* a well-formed first request line of a known route always gets its answer */
    static const char known[] = "GET /admin/endpoints HTTP/1.1\r\nHost: a\r\n"
                                "Authorization: Bearer fuzz-token\r\n\r\n";
    if (size >= sizeof(known) - 1 && memcmp(data, known, sizeof(known) - 1) == 0)
        CHECK(fuzz_http_count_responses(reply) >= 1);
    fuzz_server_check_idle(srv);
    evbuffer_free(reply);
    return 0;
}
