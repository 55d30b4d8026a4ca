/* The simulated server in-process on a fresh event_base, port 0, with raw client sockets: clients that
 * leave, a server stopped or dying with requests in flight. sim_server.c is included to reach its
 * request list; run under ATC_SANITIZE to catch use-after-free. */

#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "../../engine/sim/sim_server.c"

#define DEADLINE_US 3000000

struct fixture {
    struct event_base *base;
    struct atc_sim_server *srv;
    struct atc_sim_params p;
    int deaths;
};

static int setup(void **state)
{
    struct fixture *fx = calloc(1, sizeof(*fx));
    assert_non_null(fx);
    fx->base = event_base_new();
    assert_non_null(fx->base);
    atc_sim_params_init(&fx->p);
    fx->p.decode_ms = 5;
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *fx = *state;
    atc_sim_server_stop(fx->srv);
    atc_sim_params_dispose(&fx->p);
    event_base_free(fx->base);
    free(fx);
    return 0;
}

static void on_fixture_death(void *arg)
{
    struct fixture *fx = arg;
    fx->deaths++;
}

static void start(struct fixture *fx)
{
    const char *err = NULL;
    fx->srv = atc_sim_server_start(fx->base, &fx->p, "127.0.0.1", 0, &err);
    assert_non_null(fx->srv);
    assert_null(err);
    assert_int_not_equal(atc_sim_server_port(fx->srv), 0);
    atc_sim_server_set_on_death(fx->srv, on_fixture_death, fx);
}

static int connect_to(struct fixture *fx)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(atc_sim_server_port(fx->srv))};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_true(fd >= 0);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int post(struct fixture *fx, const char *body)
{
    char req[1024];
    int fd = connect_to(fx);
    assert_true(fd >= 0);
    int n = snprintf(req, sizeof(req),
                     "POST /v1/chat/completions HTTP/1.1\r\nHost: sim\r\nContent-Length: %zu\r\n\r\n%s",
                     strlen(body), body);
    assert_int_equal(send(fd, req, (size_t)n, 0), n);
    return fd;
}

/* What the client has received so far without blocking: >0 bytes, 0 at EOF, -1 when nothing yet. */
static ssize_t peek(int fd, char *buf, size_t len)
{
    ssize_t n = recv(fd, buf, len, MSG_DONTWAIT);
    if (n < 0 && errno == ECONNRESET)
        return 0;
    return n;
}

/* Turns the loop until @p cond holds; false after the deadline. */
#define RUN_UNTIL(fx, cond)                                                                                  \
    ({                                                                                                       \
        uint64_t end_ = atc_mono_us() + DEADLINE_US;                                                             \
        bool ok_;                                                                                            \
        while (!(ok_ = (cond)) && atc_mono_us() < end_) {                                                        \
            event_base_loop((fx)->base, EVLOOP_NONBLOCK);                                                    \
            usleep(500);                                                                                     \
        }                                                                                                    \
        ok_;                                                                                                 \
    })

static struct atc_sim_stats stats(struct fixture *fx)
{
    struct atc_sim_stats st;
    atc_sim_stats(fx->srv->sim, &st);
    return st;
}

static size_t held(struct fixture *fx)
{
    size_t n = 0;
    for (struct sim_req *r = fx->srv->reqs; r; r = r->next)
        n++;
    return n;
}

static const char *const long_stream =
    "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stream\":true,\"max_tokens\":100000}";
static const char *const long_whole =
    "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":100000}";

static void test_stream_disconnect_cancels(void **state)
{
    struct fixture *fx = *state;
    char buf[4096];
    start(fx);
    int fd = post(fx, long_stream);
    assert_true(RUN_UNTIL(fx, peek(fd, buf, sizeof(buf)) > 0));
    assert_int_equal(memcmp(buf, "HTTP/1.1 200", 12), 0);
    assert_int_equal(stats(fx).running, 1);
    close(fd);
    assert_true(RUN_UNTIL(fx, stats(fx).running == 0));
    assert_int_equal(held(fx), 0);
    assert_true(stats(fx).kv_usage == 0.0);
}

static void test_waiting_disconnect_cancels(void **state)
{
    struct fixture *fx = *state;
    char buf[4096];
    fx->p.max_seqs = 1;
    start(fx);
    int running = post(fx, long_stream);
    assert_true(RUN_UNTIL(fx, peek(running, buf, sizeof(buf)) > 0));
    int waiting = post(fx, long_whole);
    assert_true(RUN_UNTIL(fx, stats(fx).waiting == 1));
    /* No byte of its answer was written: only the socket watch can see it leave. */
    close(waiting);
    assert_true(RUN_UNTIL(fx, stats(fx).waiting == 0));
    assert_int_equal(stats(fx).running, 1);
    assert_int_equal(held(fx), 1);
    close(running);
    assert_true(RUN_UNTIL(fx, held(fx) == 0));
}

static void test_stop_with_requests_in_flight(void **state)
{
    struct fixture *fx = *state;
    char buf[4096];
    fx->p.max_seqs = 1;
    start(fx);
    int fds[3] = {post(fx, long_stream), post(fx, long_whole), post(fx, long_stream)};
    assert_true(RUN_UNTIL(fx, peek(fds[0], buf, sizeof(buf)) > 0 && stats(fx).waiting == 2));
    atc_sim_server_stop(fx->srv);
    fx->srv = NULL;
    for (int i = 0; i < 3; i++) {
        /* Every client sees its connection closed (after whatever was already sent). */
        ssize_t n;
        while ((n = peek(fds[i], buf, sizeof(buf))) > 0)
            ;
        assert_int_equal(n, 0);
        close(fds[i]);
    }
}

static void test_die_after_closes_everything(void **state)
{
    struct fixture *fx = *state;
    char buf[8192];
    fx->p.die_after = 1;
    start(fx);
    int idle = connect_to(fx);
    int first = post(fx, "{\"messages\":[],\"max_tokens\":2}");
    assert_true(RUN_UNTIL(fx, peek(first, buf, sizeof(buf)) > 0));
    assert_int_equal(memcmp(buf, "HTTP/1.1 200", 12), 0);
    int second = post(fx, "{\"messages\":[],\"max_tokens\":2}");
    assert_true(RUN_UNTIL(fx, fx->deaths == 1));
    /* The second was never answered; every connection, idle ones too, is closed; nobody listens. */
    assert_int_equal(peek(second, buf, sizeof(buf)), 0);
    assert_int_equal(peek(idle, buf, sizeof(buf)), 0);
    assert_int_equal(connect_to(fx), -1);
    assert_int_equal(held(fx), 0);
    close(first);
    close(second);
    close(idle);
}

static void test_error_and_hang_rates(void **state)
{
    struct fixture *fx = *state;
    char buf[4096];
    fx->p.error_rate = 1;
    start(fx);
    int fd = post(fx, "{\"messages\":[],\"max_tokens\":2}");
    assert_true(RUN_UNTIL(fx, peek(fd, buf, sizeof(buf)) > 0));
    assert_int_equal(memcmp(buf, "HTTP/1.1 500", 12), 0);
    close(fd);
    atc_sim_server_stop(fx->srv);

    fx->p.error_rate = 0;
    fx->p.hang_rate = 1;
    start(fx);
    fd = post(fx, "{\"messages\":[],\"max_tokens\":2}");
    assert_true(RUN_UNTIL(fx, held(fx) == 1));
    uint64_t end = atc_mono_us() + 200000;
    assert_true(RUN_UNTIL(fx, atc_mono_us() > end));
    assert_int_equal(peek(fd, buf, sizeof(buf)), -1); /* no answer, and the connection is open */
    assert_int_equal(stats(fx).running, 0);           /* it never reached the model */
    close(fd);
    assert_true(RUN_UNTIL(fx, held(fx) == 0));
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_stream_disconnect_cancels, setup, teardown),
        cmocka_unit_test_setup_teardown(test_waiting_disconnect_cancels, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_with_requests_in_flight, setup, teardown),
        cmocka_unit_test_setup_teardown(test_die_after_closes_everything, setup, teardown),
        cmocka_unit_test_setup_teardown(test_error_and_hang_rates, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
