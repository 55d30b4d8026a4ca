/* atc's HTTP/1.1 server (http_server.c) over any bytes one client connection may send, split at any
 * points: the input's first byte says how many splits, the next bytes where; each piece is sent and the
 * loop runs before the next, so every parse state meets a read boundary. The handler answers in each of
 * the ways the server offers (at once, streamed, from a timer, never until the client goes), chosen by
 * the path. Nothing may crash, leak or hang; every request handed over is answered or told its client
 * left; once the client has closed, the server holds no connection. */

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <event2/event.h>

#include "base/log.h"
#include "fuzz.h"
#include "http/http_server.h"

static struct event_base *base;
static struct atc_http_server *srv;
static struct sockaddr_un addr;
static socklen_t addrlen;
static struct event *later;
static struct atc_http_req *pending;
static int handed, settled; /* requests handed to the handler; answered or gone */

static void on_gone(void *arg)
{
    (void)arg;
    pending = NULL;
    settled++;
}

static const struct atc_http_req_callbacks cbs = {.on_gone = on_gone};

static void on_later(evutil_socket_t fd, short what, void *arg)
{
    struct atc_http_req *r = pending;
    pending = NULL;
    if (r == NULL)
        return;
    atc_http_req_set_callbacks(r, NULL, NULL);
    settled++;
    atc_http_reply_start(r, 200, "text/event-stream", NULL);
    atc_http_reply_chunk(r, "data: x\n\n", 9);
    atc_http_reply_end(r);
}

static void handler(struct atc_http_req *r, void *arg)
{
    (void)arg;
    handed++;
    const char *p = atc_http_req_path(r);
    size_t len;
    const char *body = atc_http_req_body(r, &len);
    CHECK(body != NULL);
    const struct atc_http_head *h = atc_http_req_head(r);
    for (unsigned i = 0; i < h->nheaders; i++) /* every line's slices inside the head, found again by name */
        CHECK(atc_http_header_name(h, i) < atc_http_header_value(h, i) &&
              atc_http_head_find(h, atc_http_header_name(h, i)) != NULL);
    if (strncmp(p, "/later", 6) == 0 && pending == NULL) {
        pending = r;
        atc_http_req_set_callbacks(r, &cbs, NULL);
        struct timeval tv = {0, 0};
        evtimer_add(later, &tv);
        return;
    }
    if (strncmp(p, "/hold", 5) == 0 && pending == NULL) {
        pending = r; /* answered by the timer if one is armed, else told when the client goes */
        atc_http_req_set_callbacks(r, &cbs, NULL);
        return;
    }
    settled++;
    if (strncmp(p, "/stream", 7) == 0) {
        atc_http_reply_start(r, 200, "text/plain", "x-a: b\r\n");
        atc_http_reply_chunk(r, body, len);
        atc_http_reply_end(r);
    } else if (strncmp(p, "/abort", 6) == 0) {
        atc_http_req_abort(r);
    } else if (strncmp(p, "/close", 6) == 0) {
        atc_http_req_close_after(r);
        atc_http_reply(r, 200, "text/plain", NULL, body, len);
    } else {
        atc_http_reply_error(r, 404, "invalid_request_error", "not_found", p, 0, NULL);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    base = event_base_new();
    CHECK(base != NULL);
    atc_log_set_level(ATC_LOG_ERROR);
    struct atc_http_server_config cfg = {.max_head = 2048, .max_body = 4096, .timeout_ms = 2000,
                                         .methods = ATC_HTTP_GET | ATC_HTTP_HEAD | ATC_HTTP_POST};
    srv = atc_http_server_create(base, &cfg, handler, NULL);
    CHECK(srv != NULL);
    later = evtimer_new(base, on_later, NULL);
    addr.sun_family = AF_UNIX;
    int n = snprintf(addr.sun_path + 1, sizeof(addr.sun_path) - 1, "atc-fuzz-http-%d", (int)getpid());
    addrlen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    CHECK(fd >= 0);
    CHECK(bind(fd, (struct sockaddr *)&addr, addrlen) == 0);
    CHECK(listen(fd, 16) == 0);
    CHECK(atc_http_server_listen(srv, fd) == 0);
    return 0;
}

static void drain_replies(int fd, bool *closed)
{
    char buf[16384];
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n > 0)
            continue;
        if (n == 0 || (errno != EAGAIN && errno != EINTR))
            *closed = true;
        return;
    }
}

static void spin(int fd, bool *closed, int turns)
{
    for (int i = 0; i < turns && !*closed; i++) {
        event_base_loop(base, EVLOOP_NONBLOCK);
        drain_replies(fd, closed);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    unsigned nsplit = data[0] % 8;
    data++;
    size--;
    size_t cuts[8];
    unsigned ncuts = 0;
    for (unsigned i = 0; i < nsplit && size > 0; i++) {
        cuts[ncuts++] = data[0];
        data++;
        size--;
    }
    handed = settled = 0;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(fd >= 0);
    CHECK(connect(fd, (struct sockaddr *)&addr, addrlen) == 0);
    CHECK(fcntl(fd, F_SETFL, O_NONBLOCK) == 0);
    bool closed = false;
    spin(fd, &closed, 2); /* accepted */
    size_t at = 0;
    for (unsigned i = 0; i <= ncuts && !closed; i++) {
        size_t piece = i < ncuts ? cuts[i] * (size / 256 + 1) : size - at;
        if (piece > size - at)
            piece = size - at;
        size_t sent = 0;
        while (sent < piece && !closed) {
            ssize_t n = send(fd, data + at + sent, piece - sent, MSG_NOSIGNAL);
            if (n > 0)
                sent += (size_t)n;
            else if (n < 0 && errno != EAGAIN && errno != EINTR)
                closed = true;
            spin(fd, &closed, 1);
        }
        at += sent;
        spin(fd, &closed, 3);
    }
    shutdown(fd, SHUT_WR);
    for (int turns = 0; !closed; turns++) {
        CHECK(turns < 200000); /* the server must close once the client has: else a hang */
        spin(fd, &closed, 1);
        if (turns > 100)
            usleep(10);
    }
    close(fd);
    /* a lingering close sees our EOF, then frees from the loop */
    for (int turns = 0; atc_http_server_connections(srv) > 0; turns++) {
        CHECK(turns < 10000);
        event_base_loop(base, EVLOOP_NONBLOCK);
    }
    event_base_loop(base, EVLOOP_NONBLOCK);
    CHECK(pending == NULL);
    CHECK(handed == settled);
    return 0;
}
