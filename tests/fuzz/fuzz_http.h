#ifndef ATC_FUZZ_HTTP_H
#define ATC_FUZZ_HTTP_H

/* Feeds raw bytes to an HTTP server as one client connection, in-process: the targets that fuzz a
 * server's request handling (front routes, admin API, simulated server) share it.
 *
 * The server accepts on a Unix socket (no TIME_WAIT, no ports used up at thousands of connections a
 * second). The client writes the input, then half-closes; the loop runs until the server has closed
 * the connection. A server that holds it open for FUZZ_HTTP_DEADLINE_S is a hang: abort. Everything
 * the server wrote is returned for the target to check. */

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "fuzz.h"

#define FUZZ_HTTP_DEADLINE_S 10

struct fuzz_http {
    struct event_base *base;
    struct sockaddr_un addr;
    socklen_t addrlen;
};

struct fuzz_http_client {
    struct event_base *base;
    int fd;
    const uint8_t *data;
    size_t len, sent;
    struct event *rd, *wr, *deadline;
    struct evbuffer *reply;
    bool closed;
};

/* A fresh abstract Unix socket, listening, for the server under test to accept on. */
static inline int fuzz_http_listen_fd(struct fuzz_http *fh, struct event_base *base)
{
    static unsigned seq;
    fh->base = base;
    memset(&fh->addr, 0, sizeof(fh->addr));
    fh->addr.sun_family = AF_UNIX;
    /* abstract namespace: sun_path[0] = 0, no file to clean up */
    int n = snprintf(fh->addr.sun_path + 1, sizeof(fh->addr.sun_path) - 1, "atc-fuzz-%d-%u", (int)getpid(),
                     seq++);
    fh->addrlen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    CHECK(fd >= 0);
    CHECK(bind(fd, (struct sockaddr *)&fh->addr, fh->addrlen) == 0);
    CHECK(listen(fd, 16) == 0);
    return fd;
}

static inline void fuzz_http_on_read(evutil_socket_t fd, short what, void *arg)
{
    struct fuzz_http_client *c = arg;
    char buf[16384];
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n > 0) {
            evbuffer_add(c->reply, buf, (size_t)n);
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return;
        c->closed = true; /* EOF, or reset: the server is done with us */
        event_base_loopbreak(c->base);
        return;
    }
}

static inline void fuzz_http_on_write(evutil_socket_t fd, short what, void *arg)
{
    struct fuzz_http_client *c = arg;
    while (c->sent < c->len) {
        ssize_t n = send(fd, c->data + c->sent, c->len - c->sent, MSG_NOSIGNAL);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return; /* the server is not reading (yet): wait for room */
        if (n < 0) {
            c->sent = c->len; /* the server closed early; what it answered is still read */
            break;
        }
        c->sent += (size_t)n;
    }
    event_del(c->wr);
    shutdown(fd, SHUT_WR);
}

static inline void fuzz_http_on_deadline(evutil_socket_t fd, short what, void *arg)
{
    struct fuzz_http_client *c = arg;
    fprintf(stderr,
            "fuzz_http: the server held the connection for %d s after the client's EOF (%zu of %zu "
            "bytes sent)\n",
            FUZZ_HTTP_DEADLINE_S, c->sent, c->len);
    abort();
}

/** Sends @p len bytes as one connection and returns what the server answered (caller frees), once the
 * server has closed the connection. */
static inline struct evbuffer *fuzz_http_exchange(struct fuzz_http *fh, const uint8_t *data, size_t len)
{
    struct fuzz_http_client c = {.base = fh->base, .data = data, .len = len, .reply = evbuffer_new()};
    c.fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(c.fd >= 0);
    CHECK(connect(c.fd, (struct sockaddr *)&fh->addr, fh->addrlen) == 0);
    CHECK(fcntl(c.fd, F_SETFL, O_NONBLOCK) == 0);
    c.rd = event_new(fh->base, c.fd, EV_READ | EV_PERSIST, fuzz_http_on_read, &c);
    c.wr = event_new(fh->base, c.fd, EV_WRITE | EV_PERSIST, fuzz_http_on_write, &c);
    c.deadline = evtimer_new(fh->base, fuzz_http_on_deadline, &c);
    struct timeval tv = {FUZZ_HTTP_DEADLINE_S, 0};
    event_add(c.rd, NULL);
    event_add(c.wr, NULL);
    event_add(c.deadline, &tv);
    while (!c.closed)
        event_base_dispatch(fh->base);
    event_free(c.rd);
    event_free(c.wr);
    event_free(c.deadline);
    close(c.fd);
    /* let the server finish what it deferred (frees after a closed connection) */
    event_base_loop(fh->base, EVLOOP_NONBLOCK);
    return c.reply;
}

/* Checks that @p reply is a sequence of HTTP/1.1 responses (status lines only: bodies are the target's
 * business); returns how many status lines it saw. */
static inline int fuzz_http_count_responses(struct evbuffer *reply)
{
    size_t len = evbuffer_get_length(reply);
    const char *s = (const char *)evbuffer_pullup(reply, -1);
    int n = 0;
    for (size_t i = 0; s != NULL && i + 12 <= len; i++) {
        if ((i == 0 || s[i - 1] == '\n') && memcmp(s + i, "HTTP/1.1 ", 9) == 0)
            n++;
    }
    return n;
}

#endif
