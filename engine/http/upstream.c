#include "http/upstream.h"

#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "base/clock.h"
#include "base/strbuf.h"
#include "base/log.h"
#include "http/http_parse.h"

/* A status line or header longer than this, or headers larger in total, is a protocol error. */
#define MAX_HEADER_BYTES (64 * 1024)
/* How long an idle keep-alive connection is kept (servers close theirs after 5-75 s). */
#define IDLE_KEEP_MS 30000
/* Most bytes taken from a socket per read (a bufferevent takes 4 KiB). */
#define READ_MAX (16 * 1024)

enum parse_state {
    PARSE_STATUS,
    PARSE_HEADERS,
    PARSE_BODY_LENGTH, /* the body states: the head has been parsed, on_headers called */
    PARSE_CHUNKED,
    PARSE_BODY_UNTIL_CLOSE,
    PARSE_DONE,
};

/* A connection is a socket with its own events and buffers rather than a bufferevent: a bufferevent asks
 * the kernel how much there is to read (an ioctl) before every read, and watches for writability to send
 * what a request adds, which a request that fits in the socket at once does not need. */
struct upstream_conn {
    struct atc_upstream_pool *pool;
    evutil_socket_t fd;
    struct event *rev; /* readable; persistent from the connect on, removed while paused */
    struct event *wev; /* writable: the connect, then output the socket did not take at once */
    struct event *timer;
    struct evbuffer *in, *out;
    struct atc_upstream_req *req; /* NULL while idle */
    TAILQ_ENTRY(upstream_conn) idle_link;
    bool connecting;
    bool connect_failed; /* connect() failed at once; the timer reports it from the loop */
    bool reused;
};

TAILQ_HEAD(conn_list, upstream_conn);

struct atc_upstream_pool {
    struct event_base *base;
    struct sockaddr_storage addr;
    socklen_t addrlen;
    char hostport[300];
    char head_mid[400]; /* " HTTP/1.1\r\nHost: ...\r\nContent-Type: ...\r\nContent-Length: " */
    size_t head_mid_len;
    struct atc_upstream_settings settings;
    struct timeval connect_tv, first_byte_tv, idle_tv, keep_tv; /* the settings as common timeouts */
    bool timeouts_ready; /* set on the first send: on the loop's own thread (a reload creates pools for
                          * every worker's loop from the main thread) */
    struct conn_list idle;
    size_t nidle;
};

struct atc_upstream_req {
    struct atc_upstream_pool *pool;
    struct upstream_conn *conn;
    const struct atc_upstream_callbacks *cb;
    void *arg;
    size_t headlen;
    const char *body;
    size_t bodylen;

    enum parse_state state;
    struct atc_upstream_response resp;
    char content_type[128];
    bool has_content_type;
    bool keepalive; /* the server allows reuse (HTTP/1.1 without "Connection: close") */
    bool chunked;
    uint64_t remaining;            /* of a content-length body */
    struct atc_http_chunked chunk; /* a chunked body's framing, decoded as it comes (http_parse.c) */
    size_t header_bytes;
    bool got_response; /* any byte of the status line arrived */
    /* an event stream's head came, its first event not yet (atc_upstream_first_event): the first-byte
     * timer still runs, and reads do not re-arm it */
    bool await_event;
    bool whole; /* its head is waited for within whole_tv, not first_byte_tv (atc_upstream_whole_answer) */
    struct timeval whole_tv;
    char *fwd; /* the end-to-end headers (resp.headers), malloc'd at the first */
    size_t fwd_len;
    char conn_names[256]; /* the names a Connection header lists, ",name,name," lowercased */
    size_t conn_names_len;
    bool stale_retried;
    bool unsent; /* the head and body wait for on_conn_writable, activated by hand */
    bool paused;
    int in_callback;
    bool cancelled;
    char head[]; /* request line and headers, kept for a transparent retry on a stale connection */
};

static void on_conn_readable(evutil_socket_t fd, short what, void *arg);
static void on_conn_writable(evutil_socket_t fd, short what, void *arg);
static void on_conn_timer(evutil_socket_t fd, short what, void *arg);

const char *atc_upstream_strerror(enum atc_upstream_error err)
{
    switch (err) {
    case ATC_UPSTREAM_ERR_CONNECT:
        return "connect failed";
    case ATC_UPSTREAM_ERR_CONNECT_TIMEOUT:
        return "connect timed out";
    case ATC_UPSTREAM_ERR_FIRST_BYTE_TIMEOUT:
        return "timed out waiting for the response";
    case ATC_UPSTREAM_ERR_IDLE_TIMEOUT:
        return "timed out in the middle of the response";
    case ATC_UPSTREAM_ERR_CLOSED:
        return "connection closed by the server";
    case ATC_UPSTREAM_ERR_PROTOCOL:
        return "invalid HTTP response";
    case ATC_UPSTREAM_ERR_BAD_STREAM:
        return "invalid event stream";
    }
    return "error";
}

bool atc_upstream_is_timeout(enum atc_upstream_error err)
{
    return err == ATC_UPSTREAM_ERR_CONNECT_TIMEOUT || err == ATC_UPSTREAM_ERR_FIRST_BYTE_TIMEOUT ||
           err == ATC_UPSTREAM_ERR_IDLE_TIMEOUT;
}

static void arm_timer(struct upstream_conn *c, const struct timeval *tv)
{
    event_add(c->timer, tv);
}

/* How long the request's head may take, from the request written. */
static const struct timeval *head_timeout(const struct atc_upstream_req *req)
{
    return req->whole ? &req->whole_tv : &req->pool->first_byte_tv;
}

/* A libevent common timeout for @p ms: the connections' timers of one duration wait in one list, so that
 * re-arming one (every read of a body) is a list move rather than a timer heap update. */
static struct timeval common_timeout(struct event_base *base, uint64_t ms)
{
    struct timeval tv = atc_timeval_ms(ms);
    const struct timeval *common = event_base_init_common_timeout(base, &tv);
    return common != NULL ? *common : tv;
}

/* ---- pool ---- */

struct atc_upstream_pool *atc_upstream_pool_create(struct event_base *base, const char *host, uint16_t port,
                                                   const struct atc_upstream_settings *settings,
                                                   const char **err)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    char service[8];
    snprintf(service, sizeof(service), "%u", (unsigned)port);
    int rc = getaddrinfo(host, service, &hints, &res);
    if (rc != 0 || res == NULL) {
        *err = "cannot resolve host";
        return NULL;
    }
    struct atc_upstream_pool *pool = calloc(1, sizeof(*pool));
    if (pool == NULL) {
        freeaddrinfo(res);
        *err = "out of memory";
        return NULL;
    }
    memcpy(&pool->addr, res->ai_addr, res->ai_addrlen);
    pool->addrlen = res->ai_addrlen;
    freeaddrinfo(res);
    pool->base = base;
    pool->settings = *settings;
    snprintf(pool->hostport, sizeof(pool->hostport), "%s:%u", host, (unsigned)port);
    pool->head_mid_len = (size_t)snprintf(pool->head_mid, sizeof(pool->head_mid),
                                          " HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                                          "Content-Length: ",
                                          pool->hostport);
    TAILQ_INIT(&pool->idle);
    return pool;
}

/* Closes a connection that is in no list (also a half-made one). */
static void conn_close(struct upstream_conn *c)
{
    if (c->rev != NULL)
        event_free(c->rev);
    if (c->wev != NULL)
        event_free(c->wev);
    if (c->timer != NULL)
        event_free(c->timer);
    if (c->in != NULL)
        evbuffer_free(c->in);
    if (c->out != NULL)
        evbuffer_free(c->out);
    if (c->fd >= 0)
        close(c->fd);
    free(c);
}

static void conn_free(struct upstream_conn *c)
{
    if (c->req == NULL) {
        TAILQ_REMOVE(&c->pool->idle, c, idle_link);
        c->pool->nidle--;
    }
    conn_close(c);
}

void atc_upstream_pool_destroy(struct atc_upstream_pool *pool)
{
    if (pool == NULL)
        return;
    while (!TAILQ_EMPTY(&pool->idle))
        conn_free(TAILQ_FIRST(&pool->idle));
    free(pool);
}

size_t atc_upstream_pool_idle(const struct atc_upstream_pool *pool)
{
    return pool->nidle;
}

/* A connection not yet connected. Without a socket (out of descriptors) it is made all the same, and
 * its connect fails from the loop, as a refused one does. */
static struct upstream_conn *conn_new(struct atc_upstream_pool *pool)
{
    struct upstream_conn *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->pool = pool;
    c->fd = socket(pool->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    c->rev = event_new(pool->base, c->fd, EV_READ | EV_PERSIST, on_conn_readable, c);
    c->wev = event_new(pool->base, c->fd, EV_WRITE | EV_PERSIST, on_conn_writable, c);
    c->timer = evtimer_new(pool->base, on_conn_timer, c);
    c->in = evbuffer_new();
    c->out = evbuffer_new();
    if (c->rev == NULL || c->wev == NULL || c->timer == NULL || c->in == NULL || c->out == NULL) {
        conn_close(c);
        return NULL;
    }
    c->connecting = true;
    return c;
}

/* Puts a connection whose response was read completely back into the pool, or closes it. */
static void conn_release(struct upstream_conn *c, bool reusable)
{
    struct atc_upstream_pool *pool = c->pool;
    if (!reusable || pool->nidle >= pool->settings.keepalive) {
        conn_close(c);
        return;
    }
    c->req = NULL;
    c->reused = true;
    TAILQ_INSERT_HEAD(&pool->idle, c, idle_link); /* LIFO: the warmest connection is reused first */
    pool->nidle++;
    /* Still watched for reading: an idle connection that becomes readable was closed by the server (or
     * sent garbage), and on_conn_readable drops it. */
    event_add(c->rev, NULL);
    arm_timer(c, &pool->keep_tv);
}

/* ---- request ---- */

static void req_free(struct atc_upstream_req *req)
{
    free(req->fwd);
    free(req);
}

/* Ends the request with an error: closes its connection, then calls back. */
static void req_fail(struct atc_upstream_req *req, enum atc_upstream_error err)
{
    struct upstream_conn *c = req->conn;
    if (c != NULL) {
        c->req = NULL;
        req->conn = NULL;
        conn_close(c);
    }
    if (!req->cancelled)
        req->cb->on_error(req->arg, err, req->got_response);
    req_free(req);
}

/* Hands the request to the connection: with @p send, in one sendmsg of head and body when nothing is
 * pending before it; what the socket does not take waits in c->out (the body by reference). */
static void conn_write_request(struct upstream_conn *c, bool send)
{
    struct atc_upstream_req *req = c->req;
    size_t sent = 0;
    req->unsent = false;
    if (send && evbuffer_get_length(c->out) == 0) {
        struct iovec iov[2] = {{req->head, req->headlen}, {(void *)req->body, req->bodylen}};
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = req->bodylen > 0 ? 2 : 1};
        ssize_t n = sendmsg(c->fd, &msg, MSG_NOSIGNAL);
        sent = n > 0 ? (size_t)n : 0;
    }
    if (sent < req->headlen)
        evbuffer_add(c->out, req->head + sent, req->headlen - sent);
    size_t body_sent = sent > req->headlen ? sent - req->headlen : 0;
    if (body_sent < req->bodylen)
        evbuffer_add_reference(c->out, req->body + body_sent, req->bodylen - body_sent, NULL, NULL);
}

static int conn_start(struct atc_upstream_req *req)
{
    struct atc_upstream_pool *pool = req->pool;
    struct upstream_conn *c = TAILQ_FIRST(&pool->idle);
    if (c != NULL) {
        TAILQ_REMOVE(&pool->idle, c, idle_link);
        pool->nidle--;
    } else {
        if ((c = conn_new(pool)) == NULL)
            return -1;
    }
    c->req = req;
    req->conn = c;
    if (c->connecting) {
        conn_write_request(c, false);
        arm_timer(c, &pool->connect_tv);
        /* An immediate failure is reported from the loop, never from inside send. */
        if (c->fd < 0 ||
            (connect(c->fd, (struct sockaddr *)&pool->addr, pool->addrlen) < 0 && errno != EINPROGRESS)) {
            struct timeval now = {0, 0};
            c->connect_failed = true;
            event_add(c->timer, &now);
            return 0;
        }
        event_add(c->wev, NULL); /* writable: connected, or failed */
    } else {
        /* On an open connection the request goes out later in this loop turn, without waiting for the
         * socket to be reported writable (two epoll_ctl and a turn of the loop): the requests read in one
         * turn are sent together, which wakes a server once for several of them rather than once each. */
        arm_timer(c, head_timeout(req));
        req->unsent = true;
        event_active(c->wev, EV_WRITE, 1);
    }
    return 0;
}

struct atc_upstream_req *atc_upstream_send(struct atc_upstream_pool *pool, const char *method,
                                           const char *path, const char *extra_headers, const char *body,
                                           size_t len, const struct atc_upstream_callbacks *cb, void *arg)
{
    return atc_upstream_send_as(pool, method, path, extra_headers, NULL, body, len, cb, arg);
}

struct atc_upstream_req *atc_upstream_send_as(struct atc_upstream_pool *pool, const char *method,
                                              const char *path, const char *extra_headers,
                                              const char *authorization, const char *body, size_t len,
                                              const struct atc_upstream_callbacks *cb, void *arg)
{
    if (!pool->timeouts_ready) {
        pool->connect_tv = common_timeout(pool->base, pool->settings.connect_timeout_ms);
        pool->first_byte_tv = common_timeout(pool->base, pool->settings.first_byte_timeout_ms);
        pool->idle_tv = common_timeout(pool->base, pool->settings.idle_timeout_ms);
        pool->keep_tv = common_timeout(pool->base, IDLE_KEEP_MS);
        pool->timeouts_ready = true;
    }
    /* "METHOD PATH" + pool->head_mid + "LENGTH\r\n" + extra headers + "Authorization: ...\r\n" + "\r\n",
     * in the request's own allocation. */
    char num[24];
    struct atc_strbuf nb = atc_strbuf_init(num, sizeof(num));
    atc_strbuf_u64(&nb, len);
    const char *d = num;
    size_t ndigits = nb.len;
    size_t nmethod = strlen(method), npath = strlen(path), nextra = extra_headers ? strlen(extra_headers) : 0;
    static const char auth_name[] = "Authorization: ";
    size_t nauth = authorization != NULL ? sizeof(auth_name) - 1 + strlen(authorization) + 2 : 0;
    size_t headlen = nmethod + 1 + npath + pool->head_mid_len + ndigits + 2 + nextra + nauth + 2;
    struct atc_upstream_req *req = calloc(1, sizeof(*req) + headlen + 1);
    if (req == NULL)
        return NULL;
    char *p = req->head;
    p = mempcpy(p, method, nmethod);
    *p++ = ' ';
    p = mempcpy(p, path, npath);
    p = mempcpy(p, pool->head_mid, pool->head_mid_len);
    p = mempcpy(p, d, ndigits);
    p = mempcpy(p, "\r\n", 2);
    p = mempcpy(p, extra_headers ? extra_headers : "", nextra);
    if (authorization != NULL) {
        p = mempcpy(p, auth_name, sizeof(auth_name) - 1);
        p = mempcpy(p, authorization, nauth - (sizeof(auth_name) - 1) - 2);
        p = mempcpy(p, "\r\n", 2);
    }
    p = mempcpy(p, "\r\n", 3); /* with the NUL */
    req->headlen = headlen;
    req->pool = pool;
    req->cb = cb;
    req->arg = arg;
    req->body = body;
    req->bodylen = len;
    if (conn_start(req) < 0) {
        req_free(req);
        return NULL;
    }
    return req;
}

void atc_upstream_pause(struct atc_upstream_req *req)
{
    if (req->paused || req->conn == NULL)
        return;
    req->paused = true;
    event_del(req->conn->rev);
    event_del(req->conn->timer);
}

void atc_upstream_whole_answer(struct atc_upstream_req *req, int64_t max_tokens)
{
    const struct atc_upstream_settings *s = &req->pool->settings;
    uint64_t tokens = max_tokens < 0                                   ? ATC_UPSTREAM_WHOLE_ANSWER_TOKENS
                      : (uint64_t)max_tokens > ATC_UPSTREAM_CONTEXT_MAX ? ATC_UPSTREAM_CONTEXT_MAX
                                                                        : (uint64_t)max_tokens;
    uint64_t per = s->token_timeout_ms < 60000 ? s->token_timeout_ms : 60000; /* (no overflow below) */
    uint64_t ms = s->first_byte_timeout_ms + tokens * per; /* (its own timer: not a common timeout) */
    req->whole_tv = (struct timeval){.tv_sec = (time_t)(ms / 1000), .tv_usec = (suseconds_t)(ms % 1000) * 1000};
    req->whole = true;
    if (req->conn != NULL && !req->conn->connecting)
        arm_timer(req->conn, &req->whole_tv);
}

void atc_upstream_first_event(struct atc_upstream_req *req)
{
    if (!req->await_event)
        return;
    req->await_event = false;
    if (req->conn != NULL && !req->paused)
        arm_timer(req->conn, &req->pool->idle_tv);
}

void atc_upstream_resume(struct atc_upstream_req *req)
{
    if (!req->paused || req->conn == NULL)
        return;
    req->paused = false;
    event_add(req->conn->rev, NULL);
    /* (a stream paused before its first event, which the relay does not do, gets a whole new wait) */
    arm_timer(req->conn, req->await_event ? &req->pool->first_byte_tv : &req->pool->idle_tv);
    /* Bytes may already wait in the input buffer: parse them from the loop, not from this caller (an
     * activation without EV_READ parses without reading). */
    if (evbuffer_get_length(req->conn->in) > 0)
        event_active(req->conn->rev, EV_TIMEOUT, 1);
}

void atc_upstream_cancel(struct atc_upstream_req *req)
{
    req->cancelled = true;
    if (req->in_callback > 0)
        return; /* the parser finishes the job once the callback returns */
    req_fail(req, ATC_UPSTREAM_ERR_CLOSED);
}

/* ---- response parsing ---- */

static bool header_is(const char *line, size_t namelen, const char *name)
{
    return strlen(name) == namelen && strncasecmp(line, name, namelen) == 0;
}

static bool value_has_token(const char *value, const char *token)
{
    /* "Connection: keep-alive, close" style lists: a case-insensitive substring is enough here. */
    return strcasestr(value, token) != NULL;
}

/* Hop-by-hop headers (RFC 9110 7.6.1), and the framing a reader makes again: never passed on. */
static bool hop_by_hop(const char *name, size_t n)
{
    static const char *const names[] = {"connection", "keep-alive", "transfer-encoding", "te",
                                        "trailer",    "upgrade",    "content-length"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (header_is(name, n, names[i]))
            return true;
    return n >= 6 && strncasecmp(name, "proxy-", 6) == 0;
}

/* Notes the names a Connection header lists (",a,b," lowercased): those headers are hop-by-hop too. */
static void connection_names(struct atc_upstream_req *req, const char *value)
{
    for (const char *p = value; *p != '\0';) {
        while (*p == ',' || *p == ' ' || *p == '\t')
            p++;
        size_t n = strcspn(p, ", \t");
        if (n > 0 && req->conn_names_len + n + 2 < sizeof(req->conn_names)) {
            if (req->conn_names_len == 0)
                req->conn_names[req->conn_names_len++] = ',';
            for (size_t i = 0; i < n; i++)
                req->conn_names[req->conn_names_len++] = (char)tolower((unsigned char)p[i]);
            req->conn_names[req->conn_names_len++] = ',';
            req->conn_names[req->conn_names_len] = '\0';
        }
        p += n;
    }
}

/* Appends "name: value\r\n" to the headers to pass on, when it fits in ATC_UPSTREAM_HEADERS_MAX. */
static void keep_header(struct atc_upstream_req *req, const char *name, size_t n, const char *value)
{
    size_t v = strlen(value);
    while (v > 0 && (value[v - 1] == ' ' || value[v - 1] == '\t'))
        v--;
    if (req->fwd_len + n + v + 5 > ATC_UPSTREAM_HEADERS_MAX)
        return;
    if (req->fwd == NULL && (req->fwd = malloc(ATC_UPSTREAM_HEADERS_MAX)) == NULL)
        return;
    char *p = req->fwd + req->fwd_len;
    p = mempcpy(p, name, n);
    p = mempcpy(p, ": ", 2);
    p = mempcpy(p, value, v);
    p = mempcpy(p, "\r\n", 3); /* with a NUL, not counted */
    req->fwd_len += n + v + 4;
}

/* At the end of the head: drops the headers a Connection header named, and hands the rest over. */
static void forwarded_headers(struct atc_upstream_req *req)
{
    size_t out = 0;
    for (size_t at = 0; req->conn_names_len > 0 && req->fwd != NULL && at < req->fwd_len;) {
        const char *line = req->fwd + at;
        size_t len = (size_t)((const char *)memchr(line, '\n', req->fwd_len - at) + 1 - line);
        size_t n = (size_t)((const char *)memchr(line, ':', len) - line);
        bool named = false;
        for (const char *q = req->conn_names; !named && (q = strchr(q, ',')) != NULL && q[1] != '\0'; q++)
            named = strncasecmp(q + 1, line, n) == 0 && q[1 + n] == ',';
        if (!named) {
            memmove(req->fwd + out, line, len);
            out += len;
        }
        at += len;
    }
    if (req->conn_names_len > 0 && req->fwd != NULL) {
        req->fwd_len = out;
        req->fwd[out] = '\0';
    }
    req->resp.headers = req->fwd_len > 0 ? req->fwd : NULL;
    req->resp.headers_len = req->fwd_len;
}

/* Parses one header line; returns -1 on a malformed line. */
static int parse_header(struct atc_upstream_req *req, char *line)
{
    char *colon = strchr(line, ':');
    if (colon == NULL || colon == line)
        return -1;
    size_t namelen = (size_t)(colon - line);
    char *value = colon + 1;
    while (*value == ' ' || *value == '\t')
        value++;
    if (header_is(line, namelen, "content-length")) {
        /* digits only: strtoull alone would take " -5" (as 2^64 - 5), "+5" and "5abc" */
        char *end;
        errno = 0;
        unsigned long long v = strtoull(value, &end, 10);
        if (errno != 0 || !isdigit((unsigned char)*value) || v > INT64_MAX)
            return -1;
        while (*end == ' ' || *end == '\t')
            end++;
        if (*end != '\0')
            return -1;
        req->resp.content_length = (int64_t)v;
    } else if (header_is(line, namelen, "transfer-encoding")) {
        req->chunked = value_has_token(value, "chunked");
    } else if (header_is(line, namelen, "connection")) {
        if (value_has_token(value, "close"))
            req->keepalive = false;
        connection_names(req, value);
    } else if (!hop_by_hop(line, namelen) && !header_is(line, namelen, "content-type")) {
        keep_header(req, line, namelen, value);
    }
    if (header_is(line, namelen, "content-type")) {
        size_t len = strnlen(value, sizeof(req->content_type) - 1); /* a longer one is cut */
        memcpy(req->content_type, value, len);
        req->content_type[len] = '\0';
        req->has_content_type = true;
        req->resp.event_stream = strncasecmp(value, "text/event-stream", 17) == 0;
    }
    return 0;
}

/* Reads the decimal digits at *p (at most @p max of them) into *out; returns how many there were. */
static int digits(const char **p, int max, int *out)
{
    int n = 0, v = 0;
    for (; n < max && isdigit((unsigned char)**p); n++, (*p)++)
        v = v * 10 + (**p - '0');
    *out = v;
    return n;
}

/* "HTTP/1.x NNN reason". (Leaner than sscanf, which is a visible part of a small request's cost.) */
static int parse_status(struct atc_upstream_req *req, const char *line)
{
    int major, minor, status;
    const char *p = line + 5;
    if (strncmp(line, "HTTP/", 5) != 0 || digits(&p, 9, &major) == 0 || major != 1 || *p++ != '.' ||
        digits(&p, 9, &minor) == 0 || *p != ' ')
        return -1;
    while (*p == ' ')
        p++;
    if (digits(&p, 3, &status) != 3 || status < 100 || status > 599)
        return -1;
    req->resp.status = status;
    req->resp.content_length = -1;
    req->resp.event_stream = false;
    req->has_content_type = false;
    req->chunked = false;
    req->keepalive = minor >= 1;
    req->fwd_len = 0; /* (a 1xx's headers are not the answer's) */
    req->conn_names_len = 0;
    return 0;
}

/* Calls a user callback with the request marked busy, so that a cancel from inside it is deferred. */
#define CALL_USER(req, call)                                                                                 \
    do {                                                                                                     \
        (req)->in_callback++;                                                                                \
        call;                                                                                                \
        (req)->in_callback--;                                                                                \
    } while (0)

static void finish(struct atc_upstream_req *req)
{
    struct upstream_conn *c = req->conn;
    /* Not when bytes of the request are still unsent (the server answered early) or extra bytes came. */
    bool reusable = req->keepalive && req->state == PARSE_DONE && evbuffer_get_length(c->in) == 0 &&
                    evbuffer_get_length(c->out) == 0;
    event_del(c->timer);
    c->req = NULL;
    req->conn = NULL;
    conn_release(c, reusable);
    CALL_USER(req, req->cb->on_done(req->arg));
    req_free(req);
}

/* The next line of @p in (CRLF or LF), NUL-terminated in place of its end of line, without copying
 * unless it spans two chunks of the buffer; *n is its length and *size the bytes to drain after it (with
 * the end of line). NULL while the line is incomplete. */
static char *peek_line(struct evbuffer *in, size_t *n, size_t *size)
{
    size_t eol = 0;
    struct evbuffer_ptr p = evbuffer_search_eol(in, NULL, &eol, EVBUFFER_EOL_CRLF);
    if (p.pos < 0)
        return NULL;
    *n = (size_t)p.pos;
    *size = *n + eol;
    if (*n > MAX_HEADER_BYTES)
        return NULL; /* refused by the caller: not worth making contiguous */
    char *line = (char *)evbuffer_pullup(in, (ev_ssize_t)*size);
    if (line != NULL)
        line[*n] = '\0';
    return line;
}

/* One line of the head, NUL-terminated in place of its end of line (@p n bytes). Returns 1 when it was
 * the empty line that ends the head (on_headers called: the state is then a body state or PARSE_DONE), 0
 * when more lines are needed, -1 on a protocol error, -2 when the user cancelled from on_headers. */
static int head_line(struct atc_upstream_req *req, char *line, size_t n)
{
    req->header_bytes += n;
    if (req->state == PARSE_STATUS) {
        req->got_response = true;
        if (parse_status(req, line) < 0)
            return -1;
        req->state = PARSE_HEADERS;
        return 0;
    }
    if (req->header_bytes > MAX_HEADER_BYTES)
        return -1;
    /* A control byte in a header line (a bare CR: its end of line was taken off already; a NUL that
     * would cut it short) is a broken answer: a 502, never a value passed on to the client, whose parser
     * may split the line there. */
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)line[i] < 0x20 && line[i] != '\t') || line[i] == 0x7f)
            return -1;
    if (n > 0)
        return parse_header(req, line) < 0 ? -1 : 0;
    if (req->resp.status < 200) { /* 100 Continue and friends: the real answer follows */
        req->state = PARSE_STATUS;
        return 0;
    }
    forwarded_headers(req);
    /* Transfer-Encoding overrides Content-Length (RFC 9112 6.3): a chunked body's length is unknown,
     * whatever the server also claimed. */
    if (req->chunked)
        req->resp.content_length = -1;
    req->resp.content_type = req->has_content_type ? req->content_type : NULL;
    /* An event stream's head is not its first token: the first-byte timeout waits on for its first
     * event (vLLM, SGLang and TGI send the head at once and the first event after prefill). */
    req->await_event = req->resp.event_stream;
    if (!req->await_event)
        arm_timer(req->conn, &req->pool->idle_tv);
    CALL_USER(req, req->cb->on_headers(req->arg, &req->resp));
    if (req->cancelled)
        return -2;
    if (req->resp.status == 204 || req->resp.status == 304) {
        req->state = PARSE_DONE;
    } else if (req->chunked) {
        memset(&req->chunk, 0, sizeof(req->chunk));
        req->state = PARSE_CHUNKED;
    } else if (req->resp.content_length >= 0) {
        req->remaining = (uint64_t)req->resp.content_length;
        req->state = req->remaining > 0 ? PARSE_BODY_LENGTH : PARSE_DONE;
    } else {
        req->keepalive = false;
        req->state = PARSE_BODY_UNTIL_CLOSE;
    }
    return 1;
}

/* Parses the status line and the headers that have arrived in @p in, and calls on_headers once they are
 * complete. Returns 1 when they are (the state is then a body state, or PARSE_DONE), 0 when more is
 * needed, -1 on a protocol error, -2 when the user cancelled from on_headers. */
static int parse_head(struct atc_upstream_req *req, struct evbuffer *in)
{
    while (req->state < PARSE_BODY_LENGTH) {
        size_t n = 0, size = 0;
        char *line = peek_line(in, &n, &size);
        /* A line this long is refused whether it arrived in one read or in many. */
        if (n > MAX_HEADER_BYTES)
            return -1;
        if (line == NULL)
            return evbuffer_get_length(in) > MAX_HEADER_BYTES ? -1 : 0;
        int rc = head_line(req, line, n);
        evbuffer_drain(in, size);
        if (rc != 0)
            return rc;
    }
    return 1;
}

/* The end of a whole head at the start of @p buf[0..n) (just past its empty line), or 0 when the head
 * does not end there. Lines end in LF, with or without a CR before it, as peek_line takes them. */
static size_t head_end(const char *buf, size_t n)
{
    for (const char *p = buf, *end = buf + n; (p = memchr(p, '\n', (size_t)(end - p))) != NULL;) {
        p++;
        if (p < end && *p == '\n')
            return (size_t)(p + 1 - buf);
        if (p + 1 < end && p[0] == '\r' && p[1] == '\n')
            return (size_t)(p + 2 - buf);
    }
    return 0;
}

/* Parses a head that arrived whole in one read, in place in @p buf (the read's buffer on the stack): no
 * copy into the input buffer and no search of it line by line, which were a tenth of a small proxied
 * request's instructions (callgrind). @p len is head_end's. Same result as parse_head on those bytes. */
static int parse_head_in_place(struct atc_upstream_req *req, char *buf, size_t len)
{
    for (char *line = buf, *end = buf + len; line < end;) {
        char *lf = memchr(line, '\n', (size_t)(end - line));
        size_t n = (size_t)(lf - line);
        if (n > 0 && lf[-1] == '\r')
            n--;
        line[n] = '\0';
        int rc = head_line(req, line, n);
        if (rc != 0)
            return rc;
        line = lf + 1;
    }
    return 0; /* a 1xx's head: the real answer's follows */
}

/* Takes body bytes @p buf[0..n) (one read from the socket, or what the input buffer held) and hands the
 * body among them to on_body as one piece. A chunked body's framing is decoded in place (@p buf is
 * rewritten), so the events of one read reach the client in one write, without a copy or an allocation
 * on the way: on a stream this runs once per read, the cost that counts per relayed event. Bytes after
 * the end of the response go back to the front of the input buffer, where they keep the connection from
 * being reused. Returns 1 when the response is complete, 0 when more is needed, -1 on a protocol error,
 * -2 when the user cancelled from on_body. */
static int take_body(struct upstream_conn *c, char *buf, size_t n)
{
    struct atc_upstream_req *req = c->req;
    size_t used = n, body = n;
    int rc = 0;
    switch (req->state) {
    case PARSE_BODY_LENGTH:
        used = body = n < req->remaining ? n : (size_t)req->remaining;
        req->remaining -= used;
        rc = req->remaining == 0;
        break;
    case PARSE_CHUNKED:
        used = body = 0;
        rc = atc_http_chunked_decode(&req->chunk, buf, n, &used, &body);
        break;
    case PARSE_BODY_UNTIL_CLOSE:
        break;
    default: /* PARSE_DONE: nothing more belongs to this response */
        used = body = 0;
        rc = 1;
        break;
    }
    if (rc == 1)
        req->state = PARSE_DONE;
    if (rc >= 0 && used < n && evbuffer_prepend(c->in, buf + used, n - used) < 0)
        return -1;
    if (body > 0) { /* also before a framing fault: what was decoded before it, as an earlier read would */
        CALL_USER(req, req->cb->on_body(req->arg, buf, body));
        if (req->cancelled)
            return -2;
    }
    return rc;
}

/* Body bytes that wait in the input buffer (those that came with the head, or were left while paused):
 * through a buffer on the stack, as a read would bring them. */
static int take_buffered_body(struct upstream_conn *c)
{
    char buf[READ_MAX];
    int n = evbuffer_remove(c->in, buf, sizeof(buf));
    return n > 0 ? take_body(c, buf, (size_t)n) : -1;
}

/* What the parse of some bytes came to: @p rc as take_body returns it. */
static void conn_parsed(struct atc_upstream_req *req, int rc)
{
    if (rc == -2) {
        req_fail(req, ATC_UPSTREAM_ERR_CLOSED);
    } else if (rc == -1) {
        atc_warn("upstream %s: invalid HTTP response", req->pool->hostport);
        req_fail(req, ATC_UPSTREAM_ERR_PROTOCOL);
    } else if (rc == 1) {
        finish(req);
    }
}

/* The server closed the connection (@p eof) or it failed, before the response was complete. */
static void conn_broken(struct upstream_conn *c, bool eof);

/* Parses what waits in the input buffer of an active connection. */
static void conn_parse(struct upstream_conn *c)
{
    struct atc_upstream_req *req = c->req;
    if (req->state >= PARSE_BODY_LENGTH && !req->paused && !req->await_event)
        arm_timer(c, &req->pool->idle_tv);
    int rc = req->state < PARSE_BODY_LENGTH ? parse_head(req, c->in) : 1;
    if (rc == 1) {
        rc = req->state == PARSE_DONE ? 1 : 0;
        while (rc == 0 && !req->paused && evbuffer_get_length(c->in) > 0)
            rc = take_buffered_body(c);
    }
    conn_parsed(req, rc);
}

/* Takes the bytes of one read, @p buf[0..n) (up to READ_MAX, rewritten in place). A body's bytes are
 * handed on from that buffer when nothing waits before them (the common case: every read of a stream),
 * and so is a head that arrived whole; the input buffer holds the rest: a head in pieces, what comes
 * after a paused answer. */
static void conn_took(struct upstream_conn *c, char *buf, size_t n)
{
    struct atc_upstream_req *req = c->req;
    if (req->state >= PARSE_BODY_LENGTH && req->state < PARSE_DONE && evbuffer_get_length(c->in) == 0) {
        if (!req->await_event) /* (reading: not paused) */
            arm_timer(c, &req->pool->idle_tv);
        conn_parsed(req, take_body(c, buf, n));
        return;
    }
    size_t head = req->state == PARSE_STATUS && evbuffer_get_length(c->in) == 0 ? head_end(buf, n) : 0;
    if (head > 0) { /* the common answer: its whole head, often its body too, in one read */
        int rc = parse_head_in_place(req, buf, head);
        if (rc < 0) {
            conn_parsed(req, rc);
            return;
        }
        buf += head;
        n -= head;
        if (rc == 1 && req->state != PARSE_DONE && !req->paused && n > 0) {
            conn_parsed(req, take_body(c, buf, n));
            return;
        }
    }
    /* the rest waits in the input buffer: a head in pieces, a 1xx's answer, a paused answer's body */
    if (n > 0 && evbuffer_add(c->in, buf, n) < 0) {
        conn_broken(c, false);
        return;
    }
    conn_parse(c);
}

/* Reads what the socket has (one read per readiness, as a bufferevent does), then takes it. Also run
 * without EV_READ by atc_upstream_resume, to parse what is buffered. */
static void on_conn_readable(evutil_socket_t fd, short what, void *arg)
{
    struct upstream_conn *c = arg;
    struct atc_upstream_req *req = c->req;
    if (req == NULL) { /* idle: closed by the server, or garbage */
        conn_free(c);
        return;
    }
    if (!(what & EV_READ)) {
        conn_parse(c);
        return;
    }
    char buf[READ_MAX];
    ssize_t n = recv(c->fd, buf, sizeof(buf), 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    if (n <= 0) {
        conn_broken(c, n == 0);
        return;
    }
    conn_took(c, buf, (size_t)n);
}

/* Writes what is pending: after the connect, and what a send left. */
static void on_conn_writable(evutil_socket_t fd, short what, void *arg)
{
    struct upstream_conn *c = arg;
    if (c->connecting) {
        int err = 0;
        socklen_t len = sizeof(err);
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
            err = errno;
        if (err == EINPROGRESS || err == EINTR)
            return;
        if (err != 0) {
            req_fail(c->req, ATC_UPSTREAM_ERR_CONNECT);
            return;
        }
        c->connecting = false;
        arm_timer(c, c->req != NULL ? head_timeout(c->req) : &c->pool->first_byte_tv);
        event_add(c->rev, NULL);
    }
    if (c->req != NULL && c->req->unsent) {
        conn_write_request(c, true); /* a send error shows in the next write, from the loop */
    } else if (evbuffer_get_length(c->out) > 0 && evbuffer_write(c->out, fd) < 0 && errno != EAGAIN &&
               errno != EWOULDBLOCK && errno != EINTR) {
        conn_broken(c, false);
        return;
    }
    /* Watched for writability only while output waits (also after an activation by hand). */
    if (evbuffer_get_length(c->out) > 0)
        event_add(c->wev, NULL);
    else
        event_del(c->wev);
}

/* A keep-alive connection the server closed while idle fails before any byte of the answer: send the
 * request again on a fresh connection, once, without counting it against the server. */
static bool retry_stale(struct atc_upstream_req *req)
{
    struct upstream_conn *c = req->conn;
    if (!c->reused || req->got_response || req->stale_retried)
        return false;
    req->stale_retried = true;
    c->req = NULL;
    req->conn = NULL;
    conn_close(c);
    return conn_start(req) == 0;
}

static void conn_broken(struct upstream_conn *c, bool eof)
{
    struct atc_upstream_req *req = c->req;
    if (eof && req->state == PARSE_BODY_UNTIL_CLOSE) { /* the end of such a body */
        int rc = 0;
        while (rc == 0 && evbuffer_get_length(c->in) > 0)
            rc = take_buffered_body(c);
        if (rc == 0)
            req->state = PARSE_DONE;
        conn_parsed(req, rc == 0 ? 1 : rc);
        return;
    }
    if (retry_stale(req))
        return;
    req_fail(req, ATC_UPSTREAM_ERR_CLOSED);
}

static void on_conn_timer(evutil_socket_t fd, short what, void *arg)
{
    struct upstream_conn *c = arg;
    struct atc_upstream_req *req = c->req;
    if (req == NULL) { /* idle too long */
        conn_free(c);
        return;
    }
    if (c->connecting) {
        req_fail(req, c->connect_failed ? ATC_UPSTREAM_ERR_CONNECT : ATC_UPSTREAM_ERR_CONNECT_TIMEOUT);
        return;
    }
    bool first = !req->got_response || req->state < PARSE_BODY_LENGTH || req->await_event;
    req_fail(req, first ? ATC_UPSTREAM_ERR_FIRST_BYTE_TIMEOUT : ATC_UPSTREAM_ERR_IDLE_TIMEOUT);
}
