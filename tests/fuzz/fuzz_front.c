/* The front routes (http_front.c, relay.c) over any bytes a client may send on one connection:
 * atc's HTTP server (http_server.c) parses the request, the front reads its headers and body, the
 * shipped policy routes it, and the relay tries endpoints that refuse the connection. Besides not crashing, leaking or hanging, every
 * connection must leave nothing behind once it is closed (no active request, no in-flight slot). */

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
    /* worker 0's front serves the fuzzer's Unix socket instead of its TCP port */
    struct atc_http_server *front = srv->group.workers[0].front;
    atc_http_server_stop_listening(front);
    CHECK(atc_http_server_listen(front, fuzz_http_listen_fd(&fh, base)) == 0);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct evbuffer *reply = fuzz_http_exchange(&fh, data, size);
    fuzz_server_check_idle(srv);
    evbuffer_free(reply);
    return 0;
}
