/* The front routes (http_front.c, relay.c) over any bytes a client may send on one connection:
 * evhttp parses the request, atc reads its headers and body, the shipped policy routes it, and the
 * relay tries endpoints that refuse the connection. Besides not crashing, leaking or hanging, every
 * connection must leave nothing behind once it is closed (no active request, no in-flight slot). */

#include <stdint.h>

#include "fuzz_http.h"
#include "fuzz_server.h"

static struct event_base *base;
static struct atc_server *srv;
static struct fuzz_http fh;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    base = event_base_new();
    CHECK(base != NULL);
    srv = fuzz_server_start(base);
    fuzz_http_listen(&fh, base, srv->group.workers[0].front);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct evbuffer *reply = fuzz_http_exchange(&fh, data, size);
    fuzz_server_check_idle(srv);
    evbuffer_free(reply);
    return 0;
}
