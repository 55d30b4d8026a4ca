/* The simulated server's request handling (sim_server.c, included for its HTTP server) over any bytes a
 * client may send on one connection. The model runs with tiny latencies; a request still generating
 * when the client's EOF arrives is cancelled, as for a client that hangs up. Nothing may crash, leak or
 * hang, and once the connection is closed the server holds no request. */

#include "../../engine/sim/sim_server.c"

#include <stdint.h>

#include "fuzz_http.h"

static struct event_base *base;
static struct atc_sim_server *sim;
static struct fuzz_http fh;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    struct atc_sim_params p;
    const char *err;
    base = event_base_new();
    CHECK(base != NULL);
    atc_log_set_level(ATC_LOG_ERROR);
    atc_sim_params_init(&p);
    p.decode_ms = 0.01;
    p.prefill_tps = 1e9;
    p.output_max = 64;
    sim = atc_sim_server_start(base, &p, "127.0.0.1", 0, &err);
    CHECK(sim != NULL);
    atc_sim_params_dispose(&p);
    CHECK(atc_http_server_listen(sim->http, fuzz_http_listen_fd(&fh, base)) == 0);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct evbuffer *reply = fuzz_http_exchange(&fh, data, size);
    CHECK(sim->reqs == NULL);
    evbuffer_free(reply);
    return 0;
}
