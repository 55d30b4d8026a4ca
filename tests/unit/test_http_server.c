/* atc's HTTP/1.1 server (http_server.c) on a fresh event_base, port 0, with raw client sockets: what a
 * client sees on the wire for keep-alive, HTTP/1.0, pipelining, 100-continue, chunked bodies both ways,
 * the limits and their JSON errors, a client leaving, and the request deadline. */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "heap_rss.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>

#include "base/clock.h"
#include "http/http_server.h"

struct fixture {
    struct event_base *base;
    struct atc_http_server *srv;
    struct event *later;
    struct atc_http_req *pending; /* /later, /hold */
    int gone;
    int requests;
};

static void on_gone(void *arg)
{
    struct fixture *fx = arg;
    fx->gone++;
    fx->pending = NULL;
}

static const struct atc_http_req_callbacks hold_cb = {.on_gone = on_gone};

/* What a relay holds for a request (/big): freed when its client goes, from the loop, after the close. */
struct big {
    struct fixture *fx;
    char data[64 * 1024];
};

static void on_big_gone(void *arg)
{
    struct big *b = arg;
    b->fx->gone++;
    free(b);
}

static const struct atc_http_req_callbacks big_cb = {.on_gone = on_big_gone};

static void on_later(evutil_socket_t fd, short what, void *arg)
{
    struct fixture *fx = arg;
    struct atc_http_req *r = fx->pending;
    fx->pending = NULL;
    atc_http_req_set_callbacks(r, NULL, NULL);
    atc_http_reply(r, 200, "text/plain", NULL, "later", 5);
}

static void handler(struct atc_http_req *r, void *arg)
{
    struct fixture *fx = arg;
    fx->requests++;
    const char *path = atc_http_req_path(r);
    if (strcmp(path, "/hello") == 0) {
        const char *q = atc_http_req_query(r);
        char body[64];
        int n = snprintf(body, sizeof(body), "hello%s%s", q ? " " : "", q ? q : "");
        atc_http_reply(r, 200, "text/plain", "x-test: 1\r\n", body, (size_t)n);
    } else if (strcmp(path, "/header") == 0) {
        /* the value of the header the query names, whether it lies in the head just before the body (as
         * it does unless a moved buffer left it behind), the body's length and first bytes */
        const char *v = atc_http_req_header(r, atc_http_req_query(r));
        size_t len;
        const char *b = atc_http_req_body(r, &len);
        bool in_head = v != NULL && v < b && v > b - 8192;
        char out[2048];
        int n = snprintf(out, sizeof(out), "[%s] %s %zu %.*s", v ? v : "(none)",
                         in_head ? "in-head" : "elsewhere", len, (int)(len < 16 ? len : 16), b);
        atc_http_reply(r, 200, "text/plain", NULL, out, (size_t)n);
    } else if (strcmp(path, "/big") == 0) {
        struct big *b = malloc(sizeof(*b));
        assert_non_null(b);
        b->fx = fx;
        memset(b->data, 1, sizeof(b->data));
        atc_http_req_set_callbacks(r, &big_cb, b);
    } else if (strcmp(path, "/echo") == 0) {
        size_t len;
        const char *b = atc_http_req_body(r, &len);
        atc_http_reply(r, 200, "text/plain", NULL, b, len);
    } else if (strcmp(path, "/stream") == 0) {
        atc_http_reply_start(r, 200, "text/event-stream", NULL);
        atc_http_reply_chunk(r, "a", 1);
        atc_http_reply_chunk(r, "bc", 2);
        atc_http_reply_end(r);
    } else if (strcmp(path, "/later") == 0 || strcmp(path, "/hold") == 0) {
        fx->pending = r;
        atc_http_req_set_callbacks(r, &hold_cb, fx);
        if (strcmp(path, "/later") == 0) {
            struct timeval tv = {0, 20000};
            evtimer_add(fx->later, &tv);
        }
    } else {
        atc_http_reply_error(r, 404, "invalid_request_error", "not_found", "no such route", 0, NULL);
    }
}

static int setup(void **state)
{
    struct fixture *fx = calloc(1, sizeof(*fx));
    fx->base = event_base_new();
    struct atc_http_server_config cfg = {
        .max_head = 8192, .max_body = 1000, .timeout_ms = 300,
        .methods = ATC_HTTP_GET | ATC_HTTP_HEAD | ATC_HTTP_POST};
    fx->srv = atc_http_server_create(fx->base, &cfg, handler, fx);
    const char *err = NULL;
    assert_int_equal(atc_http_server_bind(fx->srv, "127.0.0.1", 0, &err), 0);
    assert_int_not_equal(atc_http_server_port(fx->srv), 0);
    fx->later = evtimer_new(fx->base, on_later, fx);
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *fx = *state;
    atc_http_server_destroy(fx->srv);
    event_free(fx->later);
    event_base_free(fx->base);
    free(fx);
    return 0;
}

static int client(struct fixture *fx)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atc_http_server_port(fx->srv)),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    fcntl(fd, F_SETFL, O_NONBLOCK);
    return fd;
}

static void send_all(int fd, const char *s)
{
    size_t len = strlen(s);
    assert_int_equal(send(fd, s, len, MSG_NOSIGNAL), (ssize_t)len);
}

struct reply {
    char data[16384];
    size_t len;
    bool closed;
};

/* Runs the loop until @p want appears @p times in what came back, or the server closes, or @p ms pass. */
static void wait_reply(struct fixture *fx, int fd, struct reply *rp, const char *want, int times, int ms)
{
    uint64_t end = atc_mono_us() + (uint64_t)ms * 1000;
    while (atc_mono_us() < end) {
        event_base_loop(fx->base, EVLOOP_NONBLOCK);
        ssize_t n = recv(fd, rp->data + rp->len, sizeof(rp->data) - 1 - rp->len, 0);
        if (n == 0) {
            rp->closed = true;
            return;
        }
        if (n > 0) {
            rp->len += (size_t)n;
            rp->data[rp->len] = '\0';
        } else if (errno == ECONNRESET) {
            rp->closed = true;
            return;
        }
        if (want != NULL) {
            int seen = 0;
            for (const char *p = rp->data; (p = strstr(p, want)) != NULL; p++)
                seen++;
            if (seen >= times)
                return;
        }
        usleep(200);
    }
}

static void test_keep_alive_and_query(void **state)
{
    struct fixture *fx = *state;
    int fd = client(fx);
    struct reply rp = {0};
    send_all(fd, "GET /hello?x=1 HTTP/1.1\r\nHost: a\r\n\r\n");
    wait_reply(fx, fd, &rp, "hello x=1", 1, 2000);
    assert_non_null(strstr(rp.data, "HTTP/1.1 200 OK\r\n"));
    assert_non_null(strstr(rp.data, "Content-Length: 9\r\n"));
    assert_non_null(strstr(rp.data, "x-test: 1\r\n"));
    assert_non_null(strstr(rp.data, "Date: "));
    send_all(fd, "GET /hello HTTP/1.1\r\nHost: t\r\n\r\n");
    wait_reply(fx, fd, &rp, "HTTP/1.1 200", 2, 2000);
    assert_false(rp.closed);
    assert_int_equal(fx->requests, 2);
    close(fd);
}

static void test_pipelined_answers_in_order(void **state)
{
    struct fixture *fx = *state;
    int fd = client(fx);
    struct reply rp = {0};
    /* the first is answered 20 ms later, the second at once: the second still comes second */
    send_all(fd, "GET /later HTTP/1.1\r\nHost: t\r\n\r\nGET /hello HTTP/1.1\r\nHost: t\r\n\r\nPOST /echo HTTP/1.1\r\nHost: t\r\n"
                 "Content-Length: 3\r\n\r\nabc");
    wait_reply(fx, fd, &rp, "HTTP/1.1 200", 3, 2000);
    char *a = strstr(rp.data, "later"), *b = strstr(rp.data, "hello"), *c = strstr(rp.data, "\r\n\r\nabc");
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    assert_true(a < b && b < c);
    close(fd);
}

static void test_http10(void **state)
{
    struct fixture *fx = *state;
    int fd = client(fx);
    struct reply rp = {0};
    send_all(fd, "GET /hello HTTP/1.0\r\n\r\n");
    wait_reply(fx, fd, &rp, NULL, 0, 2000);
    assert_true(rp.closed);
    assert_non_null(strstr(rp.data, "Connection: close\r\n"));
    close(fd);
    fd = client(fx);
    memset(&rp, 0, sizeof(rp));
    send_all(fd, "GET /hello HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    wait_reply(fx, fd, &rp, "hello", 1, 2000);
    assert_non_null(strstr(rp.data, "Connection: keep-alive\r\n"));
    wait_reply(fx, fd, &rp, NULL, 0, 50);
    assert_false(rp.closed);
    /* a streamed answer to HTTP/1.0 is not chunked: it ends with the connection */
    send_all(fd, "GET /stream HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    wait_reply(fx, fd, &rp, NULL, 0, 2000);
    assert_true(rp.closed);
    assert_non_null(strstr(rp.data, "\r\n\r\nabc"));
    close(fd);
}

static void test_chunked_both_ways(void **state)
{
    struct fixture *fx = *state;
    int fd = client(fx);
    struct reply rp = {0};
    send_all(fd, "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                 "5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nTrailer: x\r\n\r\n");
    wait_reply(fx, fd, &rp, "hello world", 1, 2000);
    assert_non_null(strstr(rp.data, "Content-Length: 11\r\n\r\nhello world"));
    send_all(fd, "GET /stream HTTP/1.1\r\nHost: t\r\n\r\n");
    wait_reply(fx, fd, &rp, "0\r\n\r\n", 1, 2000);
    assert_non_null(strstr(rp.data, "Transfer-Encoding: chunked\r\n\r\n1\r\na\r\n2\r\nbc\r\n0\r\n\r\n"));
    close(fd);
}

static void test_expect_continue(void **state)
{
    struct fixture *fx = *state;
    int fd = client(fx);
    struct reply rp = {0};
    send_all(fd, "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n");
    wait_reply(fx, fd, &rp, "HTTP/1.1 100 Continue\r\n\r\n", 1, 2000);
    assert_int_equal(fx->requests, 0);
    send_all(fd, "ping");
    wait_reply(fx, fd, &rp, "ping", 1, 2000);
    assert_non_null(strstr(rp.data, "HTTP/1.1 200 OK"));
    close(fd);
}

/* Sends @p req on a new connection; the status line and the JSON error code that came back, closed. */
static void expect_error(struct fixture *fx, const char *req, const char *status, const char *code)
{
    int fd = client(fx);
    struct reply rp = {0};
    send_all(fd, req);
    wait_reply(fx, fd, &rp, NULL, 0, 2000);
    assert_true(rp.closed);
    assert_non_null(strstr(rp.data, status));
    assert_non_null(strstr(rp.data, "Content-Type: application/json"));
    assert_non_null(strstr(rp.data, code));
    close(fd);
}

static void test_limits_and_errors(void **state)
{
    struct fixture *fx = *state;
    char many[8192];
    size_t n = (size_t)snprintf(many, sizeof(many), "GET /hello HTTP/1.1\r\nHost: t\r\n");
    for (int i = 0; i < 101; i++)
        n += (size_t)snprintf(many + n, sizeof(many) - n, "X-%d: v\r\n", i);
    snprintf(many + n, sizeof(many) - n, "\r\n");
    expect_error(fx, many, "HTTP/1.1 431 ", "\"code\":\"headers_too_many\"");
    expect_error(fx, "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1001\r\n\r\n", "HTTP/1.1 413 ",
                 "\"code\":\"request_too_large\"");
    expect_error(fx, "GET /hello HTTP/9.9\r\n\r\n", "HTTP/1.1 400 ", "\"code\":\"bad_request\"");
    expect_error(fx, "GET / HTTP/1.1\r\nHost: t\r\nX: a\r\n b\r\n\r\n", "HTTP/1.1 400 ", "\"code\":\"obs_fold\"");
    expect_error(fx, "DELETE /hello HTTP/1.1\r\nHost: t\r\n\r\n", "HTTP/1.1 501 ", "\"code\":\"not_implemented\"");
    expect_error(fx, "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "HTTP/1.1 400 ",
                 "\"code\":\"bad_chunked_framing\"");
    char big[9000];
    memset(big, 'a', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    memcpy(big, "GET /", 5);
    expect_error(fx, big, "HTTP/1.1 400 ", "\"code\":\"bad_request\"");
    /* a route error from the handler: JSON, and the connection stays */
    int fd = client(fx);
    struct reply rp = {0};
    send_all(fd, "GET /nope HTTP/1.1\r\nHost: t\r\n\r\n");
    wait_reply(fx, fd, &rp, "}}\n", 1, 2000);
    assert_non_null(strstr(rp.data, "HTTP/1.1 404 Not Found"));
    assert_non_null(strstr(rp.data, "{\"error\":{\"message\":\"no such route\",\"type\":\"invalid_request_error\","
                                     "\"param\":null,\"code\":\"not_found\"}}"));
    assert_false(rp.closed);
    close(fd);
}

/* A head of @p nlines lines "X-<i>: value-<i>-" and @p pad dots (at most 32), and a Content-Length when
 * @p body_len > 0. */
static size_t many_lines(char *out, size_t size, const char *line, int nlines, int pad, size_t body_len)
{
    size_t n = (size_t)snprintf(out, size, "%s", line);
    for (int i = 0; i < nlines; i++)
        n += (size_t)snprintf(out + n, size - n, "X-%d: value-%d-%.*s\r\n", i, i, pad,
                              "................................");
    if (body_len > 0)
        n += (size_t)snprintf(out + n, size - n, "Content-Length: %zu\r\n", body_len);
    n += (size_t)snprintf(out + n, size - n, "\r\n");
    return n;
}

/* Every header line of a head is found by name: the last of ATC_HTTP_MAX_HEADERS (one more is 431,
 * test_limits_and_errors), and after the body that follows a head made the connection's buffer move (the
 * head's slices are rebased). */
static void test_header_lines(void **state)
{
    struct fixture *fx = *state;
    int fd = client(fx);
    struct reply rp = {0};
    char head[8192];
    size_t n = many_lines(head, sizeof(head), "GET /header?X-99 HTTP/1.0\r\n", 100, 32, 0);
    assert_true(n > 4096); /* past the buffer a connection starts with, too */
    send_all(fd, head);
    wait_reply(fx, fd, &rp, "]", 1, 2000);
    assert_non_null(strstr(rp.data, "HTTP/1.1 200 OK\r\n"));
    assert_non_null(strstr(rp.data, "[value-99-................................] in-head 0"));
    close(fd);
    /* a fresh connection: the head fits its 4 KiB, and is parsed; the body that follows does not fit */
    fd = client(fx);
    memset(&rp, 0, sizeof(rp));
    n = many_lines(head, sizeof(head), "POST /header?x-7 HTTP/1.0\r\n", 99, 16, 1000);
    assert_true(n < 4096 && n + 1000 > 4096);
    send_all(fd, head);
    wait_reply(fx, fd, &rp, "HTTP/1.1", 1, 50);
    char body[1001];
    memset(body, 'b', 1000);
    body[1000] = '\0';
    send_all(fd, body);
    wait_reply(fx, fd, &rp, "]", 1, 2000);
    assert_non_null(strstr(rp.data, "[value-7-................] in-head 1000 bbbbbbbbbbbbbbbb"));
    assert_false(rp.closed);
    close(fd);
}

/* A wave of connections, each holding 64 KiB in its handler's hands, all closed at once: what the
 * handlers free after the closes (as relays do, from the loop) goes back to the kernel too. */
static void test_memory_goes_back_after_a_wave(void **state)
{
#if defined(__SANITIZE_ADDRESS__)
    skip(); /* ASan's allocator keeps freed blocks in quarantine: no RSS to compare */
#endif
    struct fixture *fx = *state;
    enum { N = 300 }; /* past the server's TRIM_AT_LEAST */
    static int fds[N];
    long before = heap_rss_kib();
    for (int i = 0; i < N; i++) {
        fds[i] = client(fx);
        send_all(fds[i], "GET /big HTTP/1.1\r\nHost: t\r\n\r\n");
    }
    uint64_t end = atc_mono_us() + 5000000;
    while (fx->requests < N && atc_mono_us() < end)
        event_base_loop(fx->base, EVLOOP_NONBLOCK);
    assert_int_equal(fx->requests, N);
    char *fence = malloc(1024); /* above them all: the heap's top cannot shrink, only malloc_trim helps */
    assert_non_null(fence);
    memset(fence, 1, 1024);
    long peak = heap_rss_kib();
    for (int i = 0; i < N; i++)
        close(fds[i]);
    end = atc_mono_us() + 5000000;
    while (fx->gone < N && atc_mono_us() < end)
        event_base_loop(fx->base, EVLOOP_NONBLOCK);
    assert_int_equal(fx->gone, N);
    end = atc_mono_us() + 300000; /* the trim comes a moment after the last close */
    while (atc_mono_us() < end) {
        event_base_loop(fx->base, EVLOOP_NONBLOCK);
        usleep(1000);
    }
    long after = heap_rss_kib();
    print_message("heap RSS before %ld KiB, peak %ld KiB, after %ld KiB\n", before, peak, after);
    assert_true(peak - before >= N * 64 / 2);
    assert_true(after - before < (peak - before) / 4);
    free(fence);
}

static void test_client_leaving_is_told(void **state)
{
    struct fixture *fx = *state;
    int fd = client(fx);
    struct reply rp = {0};
    send_all(fd, "GET /hold HTTP/1.1\r\nHost: t\r\n\r\n");
    wait_reply(fx, fd, &rp, NULL, 0, 50);
    assert_non_null(fx->pending);
    shutdown(fd, SHUT_WR);
    uint64_t end = atc_mono_us() + 2000000;
    while (fx->gone == 0 && atc_mono_us() < end)
        event_base_loop(fx->base, EVLOOP_NONBLOCK);
    assert_int_equal(fx->gone, 1);
    assert_null(fx->pending);
    close(fd);
}

static void test_request_deadline(void **state)
{
    struct fixture *fx = *state;
    int fd = client(fx);
    struct reply rp = {0};
    uint64_t t0 = atc_mono_us();
    send_all(fd, "GET /hello HTTP/1.1\r\nHost: t\r\nX-Slow: a");
    wait_reply(fx, fd, &rp, NULL, 0, 2000);
    uint64_t took = atc_mono_us() - t0;
    assert_true(rp.closed);
    assert_int_equal(rp.len, 0); /* closed without an answer */
    assert_true(took >= 250000 && took < 1500000);
    assert_int_equal(atc_http_server_connections(fx->srv), 0);
    close(fd);
}

static void test_parse_forms(void **state)
{
    (void)state;
    char a[] = "GET http://example.com/v1/models?x HTTP/1.1\r\nHost: example.com\r\n\r\n";
    struct atc_http_head h;
    assert_int_equal(atc_http_parse_request(a, strlen(a), 1024, &h), (int)strlen(a));
    assert_string_equal(h.path, "/v1/models");
    assert_string_equal(h.query, "x");
    assert_string_equal(atc_http_head_find(&h, "host"), "example.com");
    char b[] = "GET / HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n";
    assert_true(atc_http_parse_request(b, strlen(b), 1024, &h) > 0);
    assert_true(h.conflicting_lengths);
    char c[] = "GET / HTTP/1.1\r\nHost: x\r\n";
    assert_int_equal(atc_http_parse_request(c, strlen(c), 1024, &h), 0); /* not complete yet */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_keep_alive_and_query, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pipelined_answers_in_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_http10, setup, teardown),
        cmocka_unit_test_setup_teardown(test_chunked_both_ways, setup, teardown),
        cmocka_unit_test_setup_teardown(test_expect_continue, setup, teardown),
        cmocka_unit_test_setup_teardown(test_limits_and_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_header_lines, setup, teardown),
        cmocka_unit_test_setup_teardown(test_memory_goes_back_after_a_wave, setup, teardown),
        cmocka_unit_test_setup_teardown(test_client_leaving_is_told, setup, teardown),
        cmocka_unit_test_setup_teardown(test_request_deadline, setup, teardown),
        cmocka_unit_test(test_parse_forms),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
