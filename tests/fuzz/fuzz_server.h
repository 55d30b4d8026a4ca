#ifndef ATC_FUZZ_SERVER_H
#define ATC_FUZZ_SERVER_H

/* A whole atc server in the fuzz process, built from an inline config, for the targets that fuzz its
 * front and admin routes. Its endpoints point at closed loopback ports: a proxied request fails fast
 * (or is cancelled when the fuzz client's EOF reads as a hang-up), and nothing leaves the machine. */

#include <string.h>

#include <event2/event.h>

#include "config/config.h"
#include "fleet/endpoint.h"
#include "fuzz.h"
#include "base/log.h"
#include "core/admin.h"
#include "core/server.h"
#include "proxy/worker.h"

/* The shipped policy, so that fuzzed requests run through the real Lua layers and req:header(). */
#define FUZZ_SCRIPTS ATC_SOURCE_STDLIB "/../scripts"

static const char fuzz_server_yaml[] = "listen: 127.0.0.1:0\n"
                                       "admin: 127.0.0.1:0\n"
                                       "admin_token: fuzz-token\n"
                                       "workers: 1\n" /* the fuzz loop drives the main thread's base */
                                       "max_body: 64KiB\n"
                                       "client_timeout: 2s\n"
                                       "policy:\n"
                                       "  entry: " FUZZ_SCRIPTS "/policy.lua\n"
                                       "  watch: false\n"
                                       "upstream:\n"
                                       "  connect_timeout: 1s\n"
                                       "  tries: 2\n"
                                       "models:\n"
                                       "  - name: llama-3-8b\n"
                                       "    endpoints:\n"
                                       "      - id: small-a\n"
                                       "        url: http://127.0.0.1:1\n"
                                       "        tags: [small, \"q\\\"uote\"]\n"
                                       "      - id: small-b\n"
                                       "        url: http://127.0.0.1:2\n"
                                       "        version: v2\n"
                                       "  - name: llama-3-70b\n"
                                       "    endpoints:\n"
                                       "      - id: large-a\n"
                                       "        url: http://127.0.0.1:3\n"
                                       "        capacity: 1\n";

static inline struct atc_server *fuzz_server_start(struct event_base *base)
{
    struct atc_config *cfg = NULL;
    char *errors = NULL;
    atc_log_set_level(
        ATC_LOG_ERROR); /* a line per fuzzed request (reloads, retries) would be most of the time */
    if (atc_config_parse(fuzz_server_yaml, strlen(fuzz_server_yaml), "fuzz.yaml", FUZZ_SCRIPTS, &cfg,
                         &errors) < 0) {
        fprintf(stderr, "fuzz config: %s\n", errors);
        abort();
    }
    char *err = NULL;
    struct atc_server *srv = atc_server_create(base, cfg, atc_admin_handle, &err);
    if (srv == NULL) {
        fprintf(stderr, "fuzz server: %s\n", err);
        abort();
    }
    return srv;
}

/* After a connection is over, nothing of it may be left: no request counted active, no slot held. */
static inline void fuzz_server_check_idle(const struct atc_server *srv)
{
    CHECK(srv->group.workers[0].active == 0);
    for (size_t i = 0; i < srv->table->nendpoints; i++) {
        CHECK(srv->table->endpoints[i]->inflight == 0);
        CHECK(srv->table->endpoints[i]->inflight_tokens == 0);
    }
}

#endif
