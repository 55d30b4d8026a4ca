/* One DNS question over UDP on the main loop (dns_query.h). */

#include "core/dns_query.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/util.h>

#include "base/clock.h"
#include "base/dns_message.h"

#define RECV_MAX 65536 /* a datagram of any size is read whole, so a long one is not half a message */

struct atc_dns_query {
    evutil_socket_t fd;
    struct event *readable, *timer;
    uint8_t query[ATC_DNS_QUERY_MAX];
    size_t query_len;
    uint16_t id;
    uint16_t qtype;
    char qname[ATC_DNS_NAME_MAX]; /* as the answer spells it back: lower case, no final dot */
    uint64_t timeout_ms;
    unsigned tries_left;
    atc_dns_query_cb cb;
    void *arg;
    struct atc_dns_answer *answer;
    uint8_t *buf; /* RECV_MAX */
};

static void query_free(struct atc_dns_query *q)
{
    if (q->readable != NULL)
        event_free(q->readable);
    if (q->timer != NULL)
        event_free(q->timer);
    if (q->fd >= 0)
        evutil_closesocket(q->fd);
    free(q->answer);
    free(q->buf);
    free(q);
}

/* Frees @p q, then tells its owner (who may start another query, or free what @p q pointed into). */
static void finish(struct atc_dns_query *q, const char *err)
{
    atc_dns_query_cb cb = q->cb;
    void *arg = q->arg;
    struct atc_dns_answer *answer = err == NULL ? q->answer : NULL;
    if (err == NULL)
        q->answer = NULL;
    query_free(q);
    cb(err, answer, arg);
    free(answer);
}

/* One try: the query out, and its timer. A send that fails (no route yet) counts as a try that timed
 * out, so a network that comes back is asked again. */
static void try_once(struct atc_dns_query *q)
{
    struct timeval tv = atc_timeval_ms(q->timeout_ms);
    q->tries_left--;
    (void)send(q->fd, q->query, q->query_len, 0);
    evtimer_add(q->timer, &tv);
}

static void on_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct atc_dns_query *q = arg;
    if (q->tries_left == 0)
        finish(q, "timed out");
    else
        try_once(q);
}

/* An answer for another question (a late one from an earlier query on a reused port, a forgery that
 * guessed nothing) is not ours: it is dropped and the query waits on. */
static void on_readable(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct atc_dns_query *q = arg;
    for (;;) {
        ssize_t n = recv(fd, q->buf, RECV_MAX, 0);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return;
        if (n < 0) { /* ECONNREFUSED: an ICMP port unreachable, nothing listens there */
            finish(q, errno == ECONNREFUSED ? "connection refused (no DNS server at that address)"
                                            : "receiving the answer failed");
            return;
        }
        const char *why = NULL;
        if ((size_t)n < 2 || ((q->buf[0] << 8) | q->buf[1]) != q->id)
            continue;
        if (atc_dns_answer_parse(q->buf, (size_t)n, q->answer, &why) < 0) {
            finish(q, why);
            return;
        }
        if (q->answer->qname[0] != '\0' &&
            (strcmp(q->answer->qname, q->qname) != 0 || q->answer->qtype != q->qtype))
            continue;
        if (q->answer->rcode != ATC_DNS_RCODE_NOERROR)
            finish(q, atc_dns_rcode_text(q->answer->rcode));
        else if (q->answer->qname[0] == '\0')
            finish(q, "malformed answer: no question");
        else if (q->answer->truncated)
            finish(q, "answer truncated: more records than fit in 4096 bytes (atc does not ask over TCP)");
        else
            finish(q, NULL);
        return;
    }
}

struct atc_dns_query *atc_dns_query_start(struct event_base *base, const struct sockaddr *ns, socklen_t nslen,
                                          const char *name, uint16_t qtype, uint64_t timeout_ms,
                                          unsigned attempts, atc_dns_query_cb cb, void *arg, const char **err)
{
    struct atc_dns_query *q = calloc(1, sizeof(*q));
    if (q == NULL) {
        *err = "out of memory";
        return NULL;
    }
    q->fd = -1;
    q->cb = cb;
    q->arg = arg;
    q->qtype = qtype;
    q->timeout_ms = timeout_ms ? timeout_ms : 1;
    q->tries_left = attempts ? attempts : 1;
    evutil_secure_rng_get_bytes(&q->id, sizeof(q->id));
    int len = atc_dns_query_encode(q->query, q->id, name, qtype, err);
    if (len < 0)
        goto error;
    q->query_len = (size_t)len;
    /* the name as an answer spells it: lower case, without the final dot */
    size_t n = strlen(name) - (name[strlen(name) - 1] == '.');
    for (size_t i = 0; i < n; i++)
        q->qname[i] = (char)(name[i] >= 'A' && name[i] <= 'Z' ? name[i] + ('a' - 'A') : name[i]);
    *err = "out of memory";
    if ((q->answer = malloc(sizeof(*q->answer))) == NULL || (q->buf = malloc(RECV_MAX)) == NULL)
        goto error;
    *err = "no socket for the DNS query";
    q->fd = socket(ns->sa_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (q->fd < 0 || connect(q->fd, ns, nslen) < 0) /* UDP: no packet; it sets where replies come from */
        goto error;
    *err = "out of memory";
    if ((q->readable = event_new(base, q->fd, EV_READ | EV_PERSIST, on_readable, q)) == NULL ||
        (q->timer = evtimer_new(base, on_timeout, q)) == NULL || event_add(q->readable, NULL) < 0)
        goto error;
    *err = NULL;
    try_once(q);
    return q;
error:
    query_free(q);
    return NULL;
}

void atc_dns_query_cancel(struct atc_dns_query *q)
{
    if (q != NULL)
        query_free(q);
}
