#ifndef ATC_DNS_QUERY_H
#define ATC_DNS_QUERY_H

/* One DNS question over UDP on an event loop, for `discover: {srv: ...}` (core/discovery.c): evdns cannot
 * ask for SRV records (base/dns_message.h says why the message code is atc's own). The socket is
 * connected to the one nameserver, so the kernel drops datagrams from anyone else; an answer counts only
 * with the query's random id and its question. Each try waits timeout_ms, then the query is sent again,
 * up to `attempts` tries. UDP only: an answer with TC set (records that did not fit in
 * ATC_DNS_UDP_SIZE bytes) is an error, not asked again over TCP. One thread: the loop's. */

#include <stdint.h>
#include <sys/socket.h>

struct event_base;
struct atc_dns_answer;
struct atc_dns_query;

/** The end of a query, called once from the loop, never from atc_dns_query_start: @p err NULL and
 * @p answer (rcode NOERROR, not truncated; borrowed for the call), or a fixed message in @p err ("timed
 * out", an rcode's text from atc_dns_rcode_text, "answer truncated ...", "malformed answer: ...", a
 * socket error) and @p answer NULL. The query is already freed: the callback may do anything. */
typedef void (*atc_dns_query_cb)(const char *err, const struct atc_dns_answer *answer, void *arg);

/** Asks nameserver @p ns for the records of type @p qtype of @p name (atc_dns_query_encode's syntax).
 * Returns the query (the loop's until @p cb or atc_dns_query_cancel), or NULL with a fixed message in
 * *err (a bad name, no socket, out of memory). */
struct atc_dns_query *atc_dns_query_start(struct event_base *base, const struct sockaddr *ns, socklen_t nslen,
                                          const char *name, uint16_t qtype, uint64_t timeout_ms,
                                          unsigned attempts, atc_dns_query_cb cb, void *arg,
                                          const char **err);

/** Stops @p q and frees it; its callback is not called. */
void atc_dns_query_cancel(struct atc_dns_query *q);

#endif
