#ifndef ATC_DISCOVERY_H
#define ATC_DISCOVERY_H

/* discover: on a model: its endpoints are the addresses a DNS name resolves to (dns: A and AAAA records,
 * with discover:'s port), asked every interval with libevent's evdns on the main loop, or the targets of
 * its SRV records (srv:, each with its record's port; the SRV question goes over UDP by core/dns_query.c,
 * a target's addresses come from the answer's additional section, else from evdns). Each address and
 * port becomes an endpoint of the model (id "<model>-<address>-<port>", origin dns, the model's settings:
 * config/config_endpoint.h) that
 * joins through `starting` and its health checks (atc_server_add_endpoint); an address missing from two
 * good resolutions in a row leaves by draining (atc_server_remove_endpoint). A failed or empty
 * resolution keeps the last good set: one log line when it starts failing, one when it recovers, and
 * the failures in /metrics and in /admin/endpoints' "discovery". A YAML reload that removes a model's
 * discover: (or changes it) drains the endpoints it found. Main thread only. */

#include <stdbool.h>

struct atc_server;
struct evbuffer;

/** Starts resolving for every model of the config in force with discover: (none: nothing to do, and
 * it still follows reloads). Sets srv->discovery and srv->on_config_reloaded. 0, or -1 out of memory. */
int atc_discovery_start(struct atc_server *srv);

/** Stops every resolution and frees what atc_discovery_start made (before atc_server_destroy). */
void atc_discovery_stop(struct atc_server *srv);

/** Appends ,"discovery":[{model, dns, srv, port, interval_ms, resolver, addresses, resolutions_total,
 * failures_total, failing, last_error, last_ok_age_ms, last_attempt_age_ms}, ...] to @p out. */
void atc_discovery_json(const struct atc_server *srv, struct evbuffer *out);

/** Appends the Prometheus lines atc_discovery_resolutions_total, atc_discovery_failures_total and
 * atc_discovery_addresses (per model) to @p out; nothing without discover:. */
void atc_discovery_metrics(const struct atc_server *srv, struct evbuffer *out);

#endif
