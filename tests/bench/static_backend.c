/* The fastest backend the proxy benchmarks can have: one thread, epoll, HTTP/1.1 keep-alive, and the same
 * canned non-streaming chat completion for every request (but GET /v1/models and GET /metrics, which atc's
 * health checks read: without a models list an endpoint never becomes ready and atc routes nothing to it).
 * Not an inference server and not a test: it exists so that in tests/bench/run the proxies under test, not
 * the backend, take the machine's few cores (an `atc sim` spends about 18 µs of CPU on a small request — JSON
 * scan, the latency model, a timer — this about 6, nearly all of it in the kernel's recv and send).
 *
 *   static_backend [--listen 127.0.0.1:0] [--ready-file PATH]
 *
 * It reads requests with Content-Length bodies (what every proxy here sends), answers each one in order,
 * and honours "Connection: close". Anything it cannot parse closes the connection. SIGTERM/SIGINT exit 0.
 * The ready file gets {"listen":"HOST:PORT"} once it listens, like `atc sim --ready-file`. */

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define IN_MAX (64 * 1024) /* a request head plus body larger than this is not a benchmark request */
#define MAX_EVENTS 256

static const char BODY[] =
    "{\"id\":\"chatcmpl-static\",\"object\":\"chat.completion\",\"created\":0,\"model\":\"llama-3-8b\","
    "\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"Hello\"},"
    "\"finish_reason\":\"length\"}],"
    "\"usage\":{\"prompt_tokens\":8,\"completion_tokens\":1,\"total_tokens\":9}}";

static const char MODELS[] =
    "{\"object\":\"list\",\"data\":[{\"id\":\"llama-3-8b\",\"object\":\"model\",\"created\":0,"
    "\"owned_by\":\"static\"}]}";

/* The canned answers, by what request_length says a request is. */
enum answer { ANSWER_COMPLETION, ANSWER_MODELS, ANSWER_METRICS, NANSWERS };
static char responses[NANSWERS][512];
static size_t response_lens[NANSWERS];

struct conn {
    int fd;
    size_t in_len;
    char in[IN_MAX];
    char *out; /* replies not yet written (only when the socket was full) */
    size_t out_len, out_off;
    bool close_after;
};

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
    stop = 1;
}

static void conn_close(int ep, struct conn *c)
{
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    free(c->out);
    free(c);
}

/* Length of the first complete request in buf (head and body), 0 while incomplete, -1 if malformed. Sets
 * *close_conn when the request asks for the connection to close, and *answer to what it gets. */
static long request_length(const char *buf, size_t len, bool *close_conn, enum answer *answer)
{
    const char *end = memmem(buf, len, "\r\n\r\n", 4);
    if (end == NULL)
        return len >= IN_MAX ? -1 : 0;
    size_t head = (size_t)(end - buf) + 4;
    size_t body = 0;
    *close_conn = false;
    if (strncmp(buf, "GET /v1/models ", 15) == 0)
        *answer = ANSWER_MODELS;
    else if (strncmp(buf, "GET /metrics ", 13) == 0)
        *answer = ANSWER_METRICS;
    else
        *answer = ANSWER_COMPLETION;
    for (const char *line = memchr(buf, '\n', head); line != NULL && line + 1 < end;
         line = memchr(line + 1, '\n', (size_t)(end - line - 1))) {
        const char *h = line + 1;
        if (strncasecmp(h, "content-length:", 15) == 0)
            body = strtoul(h + 15, NULL, 10);
        else if (strncasecmp(h, "transfer-encoding:", 18) == 0)
            return -1; /* chunked uploads: not something a benchmark client sends */
        else if (strncasecmp(h, "connection:", 11) == 0) {
            const char *v = h + 11;
            while (*v == ' ')
                v++;
            *close_conn = strncasecmp(v, "close", 5) == 0;
        }
    }
    if (head + body > IN_MAX)
        return -1;
    return head + body <= len ? (long)(head + body) : 0;
}

/* Writes what is queued; returns -1 when the connection is dead. */
static int flush_out(int ep, struct conn *c)
{
    while (c->out_off < c->out_len) {
        ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
                epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
                return 0;
            }
            if (errno == EINTR)
                continue;
            return -1;
        }
        c->out_off += (size_t)n;
    }
    c->out_len = c->out_off = 0;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
    return c->close_after ? -1 : 0;
}

static int queue_reply(struct conn *c, enum answer a)
{
    char *out = realloc(c->out, c->out_len + response_lens[a]);
    if (out == NULL)
        return -1;
    c->out = out;
    memcpy(c->out + c->out_len, responses[a], response_lens[a]);
    c->out_len += response_lens[a];
    return 0;
}

/* Reads what there is and answers every complete request; returns -1 when the connection is done. */
static int on_readable(int ep, struct conn *c)
{
    for (;;) {
        size_t room = IN_MAX - c->in_len;
        ssize_t n = recv(c->fd, c->in + c->in_len, room, 0);
        if (n == 0)
            return -1;
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            if (errno == EINTR)
                continue;
            return -1;
        }
        c->in_len += (size_t)n;
        unsigned answered = 0;
        size_t off = 0;
        enum answer first = ANSWER_COMPLETION;
        for (;;) {
            bool close_conn = false;
            enum answer a;
            long len = request_length(c->in + off, c->in_len - off, &close_conn, &a);
            if (len < 0)
                return -1;
            if (len == 0)
                break;
            off += (size_t)len;
            answered++;
            /* Common case: one request and an empty queue, sent below without a copy. A second request
             * queues the first one's reply after all. */
            if (answered == 2 && c->out_len == 0 && queue_reply(c, first) < 0)
                return -1;
            if (answered == 1 && c->out_len == 0)
                first = a;
            else if (queue_reply(c, a) < 0)
                return -1;
            if (close_conn) {
                c->close_after = true;
                break;
            }
        }
        memmove(c->in, c->in + off, c->in_len - off);
        c->in_len -= off;
        if (answered > 0) {
            if (c->out_len == 0) { /* one request: the reply goes out in one send */
                ssize_t w = send(c->fd, responses[first], response_lens[first], MSG_NOSIGNAL);
                if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
                    return -1;
                if (w < (ssize_t)response_lens[first]) {
                    if (queue_reply(c, first) < 0)
                        return -1;
                    c->out_off = w > 0 ? (size_t)w : 0;
                }
            }
            if (c->out_len > 0) {
                if (flush_out(ep, c) < 0)
                    return -1;
                if (c->out_len > 0)
                    break; /* the socket is full: read more once it drained */
            }
        }
        if (c->close_after)
            return -1;
        /* A short read emptied the socket: epoll (level-triggered) says when there is more, which saves
         * the recv that would only return EAGAIN. */
        if ((size_t)n < room)
            break;
    }
    return 0;
}

static int listen_on(const char *listen_addr, char *bound, size_t boundlen)
{
    char host[64];
    const char *colon = strrchr(listen_addr, ':');
    if (colon == NULL || (size_t)(colon - listen_addr) >= sizeof(host)) {
        fprintf(stderr, "static_backend: --listen wants HOST:PORT\n");
        return -1;
    }
    memcpy(host, listen_addr, (size_t)(colon - listen_addr));
    host[colon - listen_addr] = '\0';
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        fprintf(stderr, "static_backend: not an IPv4 address: %s\n", host);
        return -1;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 4096) < 0) {
        perror("static_backend: listen");
        return -1;
    }
    socklen_t slen = sizeof(sa);
    getsockname(fd, (struct sockaddr *)&sa, &slen);
    snprintf(bound, boundlen, "%s:%u", host, (unsigned)ntohs(sa.sin_port));
    return fd;
}

int main(int argc, char **argv)
{
    const char *listen_addr = "127.0.0.1:0", *ready = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--listen") == 0 && i + 1 < argc)
            listen_addr = argv[++i];
        else if (strcmp(argv[i], "--ready-file") == 0 && i + 1 < argc)
            ready = argv[++i];
        else {
            fprintf(stderr, "usage: static_backend [--listen HOST:PORT] [--ready-file PATH]\n");
            return 2;
        }
    }
    static const char *const types[NANSWERS] = {"application/json", "application/json",
                                                "text/plain; version=0.0.4"};
    static const char *const bodies[NANSWERS] = {BODY, MODELS, ""}; /* an empty metrics page is valid */
    for (int a = 0; a < NANSWERS; a++)
        response_lens[a] =
            (size_t)snprintf(responses[a], sizeof(responses[a]),
                             "HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %zu\r\n\r\n%s", types[a],
                             strlen(bodies[a]), bodies[a]);

    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    char bound[96];
    int lfd = listen_on(listen_addr, bound, sizeof(bound));
    if (lfd < 0)
        return 1;
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event lev = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &lev);
    if (ready != NULL) {
        /* Written to a temporary name and renamed, so a reader never sees half of it. */
        char tmp[4096];
        snprintf(tmp, sizeof(tmp), "%s.tmp", ready);
        FILE *f = fopen(tmp, "w");
        if (f == NULL || fprintf(f, "{\"listen\":\"%s\"}\n", bound) < 0 || fclose(f) != 0 ||
            rename(tmp, ready) < 0) {
            perror("static_backend: ready file");
            return 1;
        }
    }

    struct epoll_event events[MAX_EVENTS];
    while (!stop) {
        int n = epoll_wait(ep, events, MAX_EVENTS, -1);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            perror("static_backend: epoll_wait");
            return 1;
        }
        for (int i = 0; i < n; i++) {
            struct conn *c = events[i].data.ptr;
            if (c == NULL) {
                int fd;
                while ((fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
                    int one = 1;
                    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
                    struct conn *nc = calloc(1, sizeof(*nc));
                    if (nc == NULL) {
                        close(fd);
                        continue;
                    }
                    nc->fd = fd;
                    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = nc};
                    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
                }
                continue;
            }
            int rc = 0;
            if (events[i].events & EPOLLOUT)
                rc = flush_out(ep, c);
            if (rc == 0 && (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)))
                rc = on_readable(ep, c);
            if (rc < 0)
                conn_close(ep, c);
        }
    }
    return 0;
}
