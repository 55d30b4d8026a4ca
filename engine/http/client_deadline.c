/* The request deadline (client_deadline.h).
 *
 * libevent 2.1 has no hook on a new server connection and no total timeout, so a guard follows each
 * connection while it reads a request:
 *   - evhttp makes the connection's bufferevent through our bufferevent callback; a guard takes a
 *     reference on it and, once evhttp has finished setting the connection up (the next loop turn),
 *     finds the connection as the bufferevent's callback argument;
 *   - from then on the guard owns the connection's close callback, so it learns when the connection
 *     goes, and its timer closes the connection when the deadline passes;
 *   - when a request is complete (evhttp calls the handler) the guard is freed first, so that the
 *     handler (relay.c) may own the close callback while it answers; it is found by the socket, which
 *     is unique among open connections;
 *   - when the answer is written, a new guard starts the deadline of the next request on the connection.
 * A guard per request would be two allocations per request; freed guards are kept (up to SPARE_MAX) with
 * their timers and used again.
 */
#include "http/client_deadline.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>

#include "core/log.h"
#include "http/request_vet.h"

/* Freed guards kept for reuse: enough for the connections that finish a request in one loop turn. */
#define SPARE_MAX 256

struct guard {
    struct atc_client_deadline *d;
    struct evhttp_connection *conn; /* NULL while adopting a just-accepted connection */
    struct bufferevent *bev;        /* referenced while adopting */
    struct event *timer;            /* adopt (at once), then the deadline */
    int fd;                         /* its slot in d->by_fd, or -1 */
    struct atc_request_vet *vet;    /* what the client sends, vetted while a request is read */
    TAILQ_ENTRY(guard) link;
};

struct atc_client_deadline {
    struct event_base *base;
    struct timeval timeout;
    void (*handler)(struct evhttp_request *, void *);
    void *arg;
    struct guard **by_fd; /* the guard of each connection reading a request, by its socket */
    size_t cap;
    TAILQ_HEAD(guard_list, guard) guards;
    struct guard_list spare; /* freed guards, their timers not pending */
    size_t nspare;
};

static void guard_dispose(struct guard *g)
{
    event_free(g->timer);
    free(g);
}

static void guard_free(struct guard *g)
{
    struct atc_client_deadline *d = g->d;
    TAILQ_REMOVE(&d->guards, g, link);
    if (g->fd >= 0 && (size_t)g->fd < d->cap && d->by_fd[g->fd] == g)
        d->by_fd[g->fd] = NULL;
    atc_request_vet_stop(g->vet); /* the connection's bufferevent is still there (in its close callback too) */
    g->vet = NULL;
    if (g->conn != NULL)
        evhttp_connection_set_closecb(g->conn, NULL, NULL);
    if (g->bev != NULL)
        bufferevent_decref(g->bev);
    if (d->nspare >= SPARE_MAX) {
        guard_dispose(g);
        return;
    }
    event_del(g->timer);
    TAILQ_INSERT_HEAD(&d->spare, g, link);
    d->nspare++;
}

static void on_close(struct evhttp_connection *conn, void *arg)
{
    guard_free(arg); /* the connection is going: nothing left to time */
}

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
    struct guard *g = arg;
    struct evhttp_connection *conn = g->conn;
    char *peer = NULL;
    uint16_t port = 0;
    evhttp_connection_get_peer(conn, &peer, &port);
    atc_debug("client %s:%u: no complete request within client_timeout: closing", peer ? peer : "?",
              (unsigned)port);
    guard_free(g);
    evhttp_connection_free(conn); /* with the half-read request; not from within evhttp: safe */
}

/* Makes room in by_fd for @p fd. */
static int reserve(struct atc_client_deadline *d, int fd)
{
    if ((size_t)fd < d->cap)
        return 0;
    size_t cap = d->cap ? d->cap : 1024;
    while (cap <= (size_t)fd)
        cap *= 2;
    struct guard **v = realloc(d->by_fd, cap * sizeof(*v));
    if (v == NULL)
        return -1;
    memset(v + d->cap, 0, (cap - d->cap) * sizeof(*v));
    d->by_fd = v;
    d->cap = cap;
    return 0;
}

static struct guard *guard_new(struct atc_client_deadline *d, void (*cb)(evutil_socket_t, short, void *))
{
    struct guard *g = TAILQ_FIRST(&d->spare);
    if (g != NULL) {
        TAILQ_REMOVE(&d->spare, g, link);
        d->nspare--;
        struct event *timer = g->timer;
        *g = (struct guard){.timer = timer};
        evtimer_assign(timer, d->base, cb, g);
    } else {
        if ((g = calloc(1, sizeof(*g))) == NULL)
            return NULL;
        if ((g->timer = evtimer_new(d->base, cb, g)) == NULL) {
            free(g);
            return NULL;
        }
    }
    g->d = d;
    g->fd = -1;
    TAILQ_INSERT_TAIL(&d->guards, g, link);
    return g;
}

/* Starts the deadline of the next request on @p conn, and the vetting of its bytes (@p vet: the one that
 * began at the accept, taken; NULL: a new one, the next request starting at the front of the input).
 * Without memory the connection goes untimed and unvetted, as evhttp alone would leave it (its idle
 * timeout still holds). */
static void watch_connection(struct atc_client_deadline *d, struct evhttp_connection *conn,
                             struct atc_request_vet *vet)
{
    struct bufferevent *bev = evhttp_connection_get_bufferevent(conn);
    if (vet == NULL)
        vet = atc_request_vet_start(bev);
    int fd = bufferevent_getfd(bev);
    struct guard *g = NULL;
    if (fd < 0 || reserve(d, fd) < 0 || (g = guard_new(d, on_deadline)) == NULL) {
        atc_request_vet_stop(vet);
        return;
    }
    g->vet = vet;
    if (d->by_fd[fd] != NULL) { /* cannot happen (closed connections release theirs); never leave two */
        d->by_fd[fd]->conn = NULL;
        guard_free(d->by_fd[fd]);
    }
    g->conn = conn;
    g->fd = fd;
    d->by_fd[fd] = g;
    evhttp_connection_set_closecb(conn, on_close, g);
    evtimer_add(g->timer, &d->timeout);
}

/* One loop turn after the accept: evhttp has set the connection up (or dropped it). */
static void on_adopt(evutil_socket_t fd, short what, void *arg)
{
    struct guard *g = arg;
    struct atc_client_deadline *d = g->d;
    void *conn = NULL;
    bufferevent_getcb(g->bev, NULL, NULL, NULL, &conn); /* evhttp's callback argument: the connection */
    struct atc_request_vet *vet = NULL;
    if (conn != NULL) { /* the vet goes on with the connection (else it stops with the guard) */
        vet = g->vet;
        g->vet = NULL;
    }
    guard_free(g); /* drops our reference: the connection holds its own */
    if (conn != NULL)
        watch_connection(d, conn, vet);
}

static struct bufferevent *on_new_bufferevent(struct event_base *base, void *arg)
{
    struct atc_client_deadline *d = arg;
    struct bufferevent *bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
    struct guard *g;
    if (bev == NULL || (g = guard_new(d, on_adopt)) == NULL)
        return bev;
    bufferevent_incref(bev); /* valid when on_adopt runs, even if evhttp dropped it meanwhile */
    g->bev = bev;
    g->vet = atc_request_vet_start(bev); /* from the first byte */
    event_active(g->timer, EV_TIMEOUT, 1);
    return bev;
}

static void on_answer_sent(struct evhttp_request *req, void *arg)
{
    struct evhttp_connection *conn = evhttp_request_get_connection(req);
    if (conn != NULL)
        watch_connection(arg, conn, NULL); /* freed with it if evhttp closes it now (Connection: close) */
}

static void on_request(struct evhttp_request *req, void *arg)
{
    struct atc_client_deadline *d = arg;
    struct evhttp_connection *conn = evhttp_request_get_connection(req);
    if (conn != NULL) {
        int fd = bufferevent_getfd(evhttp_connection_get_bufferevent(conn));
        if (fd >= 0 && (size_t)fd < d->cap && d->by_fd[fd] != NULL && d->by_fd[fd]->conn == conn)
            guard_free(d->by_fd[fd]); /* complete in time; the close callback is the handler's now */
        evhttp_request_set_on_complete_cb(req, on_answer_sent, d);
    }
    d->handler(req, d->arg);
}

struct atc_client_deadline *atc_client_deadline_attach(struct evhttp *http, struct event_base *base,
                                                       uint64_t timeout_ms,
                                                       void (*handler)(struct evhttp_request *, void *),
                                                       void *arg)
{
    struct atc_client_deadline *d = calloc(1, sizeof(*d));
    if (d == NULL)
        return NULL;
    d->base = base;
    struct timeval tv = {.tv_sec = (time_t)(timeout_ms / 1000),
                         .tv_usec = (suseconds_t)(timeout_ms % 1000) * 1000};
    /* Every guard waits the same time: a common timeout keeps them in a list, not the timer heap. */
    const struct timeval *common = event_base_init_common_timeout(base, &tv);
    d->timeout = common != NULL ? *common : tv;
    d->handler = handler;
    d->arg = arg;
    TAILQ_INIT(&d->guards);
    TAILQ_INIT(&d->spare);
    evhttp_set_bevcb(http, on_new_bufferevent, d);
    evhttp_set_gencb(http, on_request, d);
    return d;
}

void atc_client_deadline_destroy(struct atc_client_deadline *d)
{
    if (d == NULL)
        return;
    struct guard *g;
    while ((g = TAILQ_FIRST(&d->guards)) != NULL) {
        g->conn = NULL; /* evhttp_free has freed the connections */
        guard_free(g);
    }
    while ((g = TAILQ_FIRST(&d->spare)) != NULL) {
        TAILQ_REMOVE(&d->spare, g, link);
        guard_dispose(g);
    }
    free(d->by_fd);
    free(d);
}
