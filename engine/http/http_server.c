/* atc's HTTP/1.1 server (http_server.h).
 *
 * Why not evhttp: per small request it made 24 allocations (every header line malloc'd, then a calloc'd
 * node and two strdups), an ioctl(FIONREAD) before each read, stopped reading while a request was
 * handled and armed EV_WRITE to send each answer on the next loop turn (2.6 epoll_ctl per request),
 * and formatted every reply header with printf and the Date per response (docs/benchmarks.md, "Where
 * the time goes"). Here a connection is one allocation with its events embedded plus one input buffer made
 * at accept; a request costs no allocation on this side (its head is parsed in place, http_parse.c), the
 * read event stays registered, the answer goes out in one writev when it is given, the status line
 * and framing headers are copied from bytes made once, and the Date string is made once a second.
 *
 * A connection's life (enum conn_state, moved only by conn_set_state, which checks each move against
 * conn_moves): READING a request (under the deadline); the handler has it: HANDLING, STREAMING once the
 * answer's head went out, ANSWERED once the answer is whole and only its bytes are left to write (the
 * buffer does not move meanwhile: the handler holds slices of it; bytes of a pipelined request are read
 * behind it); DONE once written; then the next request, or LINGERING: after an answer that closes the
 * connection, our side is shut and what the client still sends is read and dropped (up to a short time),
 * so that its unread bytes do not make the kernel reset the connection before the client has read the
 * answer. Frees of a connection happen from the loop (its defer event), never under a callback of its
 * own. */
#include "http/http_server.h"

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <malloc.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/event_struct.h>

#include "base/clock.h"
#include "base/strbuf.h"
#include "base/log.h"
#include "base/json.h"
#include "http/http_util.h"

/* The input buffer made at accept: a small request and its answer's pipelined successor fit. */
#define INPUT_START 4096
/* Above this the buffer is given back once the connection is idle (a big body came once). */
#define INPUT_KEEP (16 * 1024)
/* How long a closing connection reads and drops what the client still sends. */
#define LINGER_MS 2000
/* Answers that are a few pieces go out in one writev of at most this many pieces. */
#define MAX_IOV 8

enum conn_state {
    CONN_READING,   /* waiting for a request to be whole */
    CONN_HANDLING,  /* the handler has it; nothing of its answer sent */
    CONN_STREAMING, /* the answer's head went out (or waits in c->held); its body follows */
    CONN_ANSWERED,  /* the answer is whole; bytes of it still wait in c->out */
    CONN_DONE,      /* answered and written; the next request is taken up from the loop */
    CONN_LINGERING, /* answered and closing: our side shut, reading to EOF */
    CONN_CLOSED,    /* socket closed, struct freed from the loop */
};

#define CONN_IN(s) (1u << (s))
/* A request is with its handler: its owner hears on_gone if the connection closes now. */
#define CONN_ANSWERING (CONN_IN(CONN_HANDLING) | CONN_IN(CONN_STREAMING) | CONN_IN(CONN_ANSWERED))
/* The moves conn_set_state allows: from each state, the states it may go to. Any state may close. */
static const unsigned conn_moves[] = {
    [CONN_READING] = CONN_IN(CONN_HANDLING) | CONN_IN(CONN_CLOSED),
    [CONN_HANDLING] = CONN_IN(CONN_STREAMING) | CONN_IN(CONN_CLOSED),
    [CONN_STREAMING] = CONN_IN(CONN_ANSWERED) | CONN_IN(CONN_CLOSED),
    [CONN_ANSWERED] = CONN_IN(CONN_DONE) | CONN_IN(CONN_CLOSED),
    [CONN_DONE] = CONN_IN(CONN_READING) | CONN_IN(CONN_LINGERING) | CONN_IN(CONN_CLOSED),
    [CONN_LINGERING] = CONN_IN(CONN_CLOSED),
    [CONN_CLOSED] = 0,
};

struct atc_http_req {
    struct http_conn *c;
    struct atc_http_head head;
    const char *body;
    size_t body_len;
    const struct atc_http_req_callbacks *cb;
    void *cb_arg;
    bool close_after;
    bool chunked; /* the body goes out chunked (else: Content-Length, or until close) */
};

struct http_conn {
    struct atc_http_server *s;
    evutil_socket_t fd;
    enum conn_state state;
    struct event rev, wev, timer, defer;
    struct event hup; /* the client's close, watched while reading stops for a full buffer (EV_CLOSED) */
    char *buf;
    size_t cap, len;
    size_t start;    /* where the request being read begins */
    size_t head_len; /* its head's length once parsed (0: not yet) */
    size_t body_out; /* chunked: decoded body bytes so far (at start + head_len) */
    size_t body_in;  /* chunked: raw bytes consumed */
    struct atc_http_chunked chunk;
    bool continue_sent;
    bool reading;         /* rev is added */
    bool eof;             /* the client closed its side */
    struct evbuffer *out; /* what the socket did not take (NULL until needed) */
    /* The head of a streamed answer waits here for its first piece of body, or for the end of the loop
     * turn that started it (wev made active): a client reads head and first event in one read, and a
     * stream costs one writev less. NULL when none waits. */
    char *held;
    size_t held_len;
    struct atc_http_req req;
    char peer[64];
    LIST_ENTRY(http_conn) link;
};

struct atc_http_server {
    struct event_base *base;
    struct atc_http_server_config cfg;
    atc_http_handler handler;
    void *arg;
    evutil_socket_t lfd;
    struct event *accept_ev;
    /* Accepting pauses (accept_ev deleted) at max_connections, or when accept fails for want of a
     * descriptor or of memory: then retry_ev tries again after ACCEPT_RETRY_MS, or a close does. Each
     * of the two is logged once when it starts and once when it ends. */
    bool accept_paused;
    bool at_cap;     /* an episode at max_connections: ends when the backlog is empty */
    bool starved;    /* an episode of failed accepts: ends with the next accept */
    uint64_t waits;  /* times accepting paused at max_connections in this episode */
    uint64_t failed; /* accepts failed in this episode */
    struct event retry_ev;
    uint16_t port;
    struct timeval timeout, linger; /* common timeouts */
    LIST_HEAD(, http_conn) conns;
    size_t nconns;
    size_t high;       /* the most connections open at once since memory was last given back */
    bool wave;         /* high reached TRIM_AT_LEAST: memory goes back as they close, down to none open */
    struct event trim; /* gives memory back a moment after a connection closed (give_back_memory) */
    time_t date_sec;
    char date[64]; /* "Date: Sun, 06 Nov 1994 08:49:37 GMT\r\n" */
    size_t date_len;
};

/* Checks that a callback runs in a state it expects (@p states: CONN_IN(...) | ...). */
static inline void conn_expect(const struct http_conn *c, unsigned states)
{
    assert(c->state <= CONN_CLOSED && (CONN_IN(c->state) & states) != 0);
    (void)c;
    (void)states; /* (NDEBUG) */
}

static void conn_set_state(struct http_conn *c, enum conn_state to)
{
    assert(c->state <= CONN_CLOSED && (conn_moves[c->state] & CONN_IN(to)) != 0);
    (void)conn_moves; /* (NDEBUG) */
    c->state = to;
}

static void conn_process(struct http_conn *c);
static void conn_close(struct http_conn *c, bool tell);
static void accept_resume(struct atc_http_server *s);

/* After an accept failed for want of a descriptor or memory, how long until the next try (a close tries
 * at once). */
#define ACCEPT_RETRY_MS 250

/* ---- small helpers ---- */

static const char *date_header(struct atc_http_server *s, size_t *len)
{
    struct timeval now;
    event_base_gettimeofday_cached(s->base, &now);
    if (now.tv_sec != s->date_sec) {
        struct tm tm;
        time_t t = now.tv_sec;
        gmtime_r(&t, &tm);
        s->date_len = strftime(s->date, sizeof(s->date), "Date: %a, %d %b %Y %H:%M:%S GMT\r\n", &tm);
        s->date_sec = now.tv_sec;
    }
    *len = s->date_len;
    return s->date;
}

/* ---- output ---- */

static size_t backlog(const struct http_conn *c)
{
    return (c->out != NULL ? evbuffer_get_length(c->out) : 0) + c->held_len;
}

static void arm_write_stall(struct http_conn *c)
{
    event_add(&c->wev, NULL);
    event_add(&c->timer, &c->s->timeout); /* no byte taken for client_timeout: dropped */
}

static void conn_write(struct http_conn *c, const struct iovec *iov, int n);

/* Sends the pieces, after a held head if one waits. */
static void conn_send(struct http_conn *c, const struct iovec *iov, int n)
{
    char *held = c->held;
    if (held == NULL || c->state == CONN_CLOSED) {
        conn_write(c, iov, n);
        return;
    }
    struct iovec all[MAX_IOV + 3]; /* the most pieces a call here sends is MAX_IOV + 2 */
    int k = n < MAX_IOV + 2 ? n : MAX_IOV + 2;
    all[0] = (struct iovec){held, c->held_len};
    for (int i = 0; i < k; i++)
        all[1 + i] = iov[i];
    c->held = NULL;
    c->held_len = 0;
    conn_write(c, all, k + 1);
    free(held);
    if (k < n)
        conn_write(c, iov + k, n - k);
}

/* Sends the pieces: at once when nothing waits before them, the rest kept for EV_WRITE. */
static void conn_write(struct http_conn *c, const struct iovec *iov, int n)
{
    if (c->state == CONN_CLOSED || n == 0)
        return;
    size_t total = 0, sent = 0;
    for (int i = 0; i < n; i++)
        total += iov[i].iov_len;
    if (backlog(c) == 0) {
        ssize_t w = writev(c->fd, iov, n);
        if (w < 0 && errno != EAGAIN && errno != EINTR) {
            conn_close(c, true); /* the client is gone: told to the request's owner */
            return;
        }
        sent = w > 0 ? (size_t)w : 0;
        if (sent == total)
            return;
    }
    if (c->out == NULL && (c->out = evbuffer_new()) == NULL) {
        conn_close(c, true);
        return;
    }
    bool was_empty = backlog(c) == 0;
    for (int i = 0; i < n; i++) {
        size_t len = iov[i].iov_len;
        if (sent >= len) {
            sent -= len;
            continue;
        }
        evbuffer_add(c->out, (const char *)iov[i].iov_base + sent, len - sent);
        sent = 0;
    }
    if (was_empty)
        arm_write_stall(c);
}

static void conn_answer_done(struct http_conn *c);

static void on_writable(evutil_socket_t fd, short what, void *arg)
{
    struct http_conn *c = arg;
    conn_expect(c, ~CONN_IN(CONN_CLOSED)); /* close deletes the event */
    if (c->held !=
        NULL) { /* the loop turn that started a stream ended before its first piece: the head alone */
        conn_send(c, NULL, 0);
        return;
    }
    if (!event_pending(&c->wev, EV_WRITE, NULL))
        return; /* made active for a held head that went out with its first piece since */
    int n = evbuffer_write(c->out, fd);
    if (n < 0 && errno != EAGAIN && errno != EINTR) {
        conn_close(c, true);
        return;
    }
    if (backlog(c) > 0) {
        if (n > 0)
            event_add(&c->timer, &c->s->timeout); /* progress: the stall clock starts again */
        return;
    }
    event_del(&c->wev);
    event_del(&c->timer);
    struct atc_http_req *r = &c->req;
    if (r->cb != NULL && r->cb->on_drained != NULL)
        r->cb->on_drained(r->cb_arg); /* may abort, end the answer, or clear the callbacks */
    if (c->state == CONN_ANSWERED && backlog(c) == 0)
        conn_answer_done(c);
}

/* ---- the connection's life ---- */

static void on_defer(evutil_socket_t fd, short what, void *arg);

static void conn_free(struct http_conn *c)
{
    if (c->out != NULL)
        evbuffer_free(c->out);
    free(c->held);
    free(c->buf);
    free(c);
}

/* After thousands of connections (held streams) have gone, glibc keeps the heap they freed: the
 * process stays at its peak RSS though nothing leaked (docs/benchmarks.md, "Where the time goes"). Each time
 * the open connections fall to a quarter of their high mark (once it passed TRIM_AT_LEAST), and when the last
 * has gone, the free memory is given back to the kernel (malloc_trim: a few ms of one walk over the heap, a
 * handful of times per wave of closes). What would keep many of those pages anyway, libevent's record of
 * every fd number it has watched, lives in a region of its own (base/event_memory.h). The trim runs
 * TRIM_DELAY_MS after the last close that called for one, not under it: a closing connection and the relay it
 * served are freed from the loop after the close, and the last closes of a wave come within a few ms of each
 * other (measured after 8,000 held streams: RSS 6.2 MiB before, 8.5 after with the trim under the close, 2.7
 * of it free pages; 7.1 with the trim 100 ms later). */
#define TRIM_AT_LEAST 256
#define TRIM_DELAY_MS 100

static void on_trim(evutil_socket_t fd, short what, void *arg)
{
    malloc_trim(0);
}

static void give_back_memory(struct atc_http_server *s)
{
    if (s->high >= TRIM_AT_LEAST)
        s->wave = true; /* until every connection has gone */
    if (!s->wave || (s->nconns > s->high / 4 && s->nconns > 0))
        return;
    s->high = s->nconns;
    s->wave = s->nconns > 0;
    struct timeval tv = atc_timeval_ms(TRIM_DELAY_MS);
    evtimer_add(&s->trim, &tv); /* a pending one moves later: the last closes of a wave come close together */
}

/* Closes the socket; the struct goes from the loop. @p tell: the owner of an unfinished answer hears
 * on_gone, from the loop too (a write that fails is under the owner's own call; it must not be freed
 * there): until then its calls on the request do nothing. */
static void conn_close(struct http_conn *c, bool tell)
{
    if (c->state == CONN_CLOSED)
        return;
    struct atc_http_req *r = &c->req;
    bool owed = (CONN_IN(c->state) & CONN_ANSWERING) || (r->cb != NULL && c->state == CONN_DONE);
    conn_set_state(c, CONN_CLOSED);
    event_del(&c->rev);
    event_del(&c->hup);
    event_del(&c->wev);
    event_del(&c->timer);
    evutil_closesocket(c->fd);
    c->fd = -1;
    LIST_REMOVE(c, link);
    c->s->nconns--;
    give_back_memory(c->s);
    accept_resume(c->s); /* a descriptor and a place under the cap are free */
    if (!tell || !owed)
        r->cb = NULL;
    event_active(&c->defer, EV_TIMEOUT, 1);
}

/* The owner of a closed connection's request hears that it went (if it still listens). */
static void conn_tell_gone(struct http_conn *c)
{
    struct atc_http_req *r = &c->req;
    const struct atc_http_req_callbacks *cb = r->cb;
    r->cb = NULL;
    if (cb != NULL && cb->on_gone != NULL)
        cb->on_gone(r->cb_arg);
}

static void on_defer(evutil_socket_t fd, short what, void *arg)
{
    struct http_conn *c = arg;
    if (c->state == CONN_CLOSED) {
        conn_tell_gone(c);
        conn_free(c);
        return;
    }
    if (c->state == CONN_DONE && c->req.cb == NULL)
        conn_process(c);
}

static void start_reading(struct http_conn *c)
{
    event_del(&c->hup);
    if (!c->reading && !c->eof) {
        event_add(&c->rev, NULL);
        c->reading = true;
    }
}

static void stop_reading(struct http_conn *c)
{
    if (c->reading) {
        event_del(&c->rev);
        c->reading = false;
    }
}

/* Our side is shut after the last answer; the client's bytes are dropped until it closes. */
static void conn_linger(struct http_conn *c)
{
    conn_set_state(c, CONN_LINGERING);
    shutdown(c->fd, SHUT_WR);
    if (c->eof) {
        conn_close(c, false);
        return;
    }
    start_reading(c);
    event_add(&c->timer, &c->s->linger);
}

static bool closing(const struct http_conn *c)
{
    const struct atc_http_req *r = &c->req;
    return r->close_after || !r->head.keep_alive || c->eof;
}

/* The answer is complete and written to the socket (or queued in c->out: then on_writable comes back).
 * The next request is taken up from the loop (the handler may be up the stack), and only once the owner
 * of this one has let go of it (cleared its callbacks): the request's struct is reused. */
static void conn_answer_done(struct http_conn *c)
{
    if (backlog(c) > 0)
        return;
    if (c->state != CONN_DONE) /* (set_callbacks(NULL) comes back to a DONE one) */
        conn_set_state(c, CONN_DONE);
    if (c->req.cb != NULL)
        return; /* atc_http_req_set_callbacks(NULL) comes back */
    if (closing(c))
        conn_linger(c);
    else
        event_active(&c->defer, EV_TIMEOUT, 1);
}

/* An error the server answers itself; the connection closes after it. */
static void conn_error(struct http_conn *c, int status, const char *code, const char *message)
{
    struct atc_http_req *r = &c->req;
    r->c = c;
    r->cb = NULL;
    r->close_after = true;
    r->head.keep_alive = false;
    r->head.method = ATC_HTTP_GET;
    conn_set_state(c, CONN_HANDLING);
    stop_reading(c);
    event_del(&c->timer);
    atc_http_reply_error(r, status, status < 500 ? "invalid_request_error" : "server_error", code, message, 0,
                         NULL);
    if (c->s->cfg.on_refused != NULL && status != 500) /* not an out-of-memory: nothing to log it with */
        c->s->cfg.on_refused(c->s->arg, status, code, message);
}

static int reserve(struct http_conn *c, size_t need)
{
    if (need <= c->cap)
        return 0;
    size_t cap = c->cap * 2;
    while (cap < need)
        cap *= 2;
    /* a parsed head waiting for its body: its pointers become offsets, then pointers into the new buffer
     * (its header lines are offsets from h->base already) */
    struct atc_http_head *h = &c->req.head;
    bool rebase = c->head_len > 0;
    bool own_path = rebase && h->path >= c->buf && h->path < c->buf + c->len; /* not the static "/" */
    size_t off[5];
    if (rebase) {
        off[0] = (size_t)(h->base - c->buf);
        off[1] = (size_t)(h->method_name - c->buf);
        off[2] = (size_t)(h->target - c->buf);
        off[3] = own_path ? (size_t)(h->path - c->buf) : 0;
        off[4] = h->query != NULL ? (size_t)(h->query - c->buf) : 0;
    }
    char *b = realloc(c->buf, cap + 1); /* +1: a NUL may follow the last byte */
    if (b == NULL)
        return -1;
    c->buf = b;
    c->cap = cap;
    if (rebase) {
        h->base = b + off[0];
        h->method_name = b + off[1];
        h->target = b + off[2];
        if (own_path)
            h->path = b + off[3];
        if (h->query != NULL)
            h->query = b + off[4];
    }
    return 0;
}

/* The request at c->start is whole: hand it over. */
static void dispatch(struct http_conn *c, size_t body_len)
{
    struct atc_http_req *r = &c->req;
    event_del(&c->timer);
    r->c = c;
    r->cb = NULL;
    r->cb_arg = NULL;
    r->close_after = r->chunked = false;
    r->body = c->buf + c->start + c->head_len;
    r->body_len = body_len;
    conn_set_state(c, CONN_HANDLING);
    c->s->handler(r, c->s->arg);
}

/* Takes up the next request from the buffer: parse its head, wait for its body, dispatch. */
static void conn_process(struct http_conn *c)
{
    struct atc_http_server *s = c->s;
    if (c->state == CONN_DONE) {
        /* the last request is over: its bytes go, the next request's move to the front */
        size_t used = c->start + c->head_len + (c->req.head.chunked ? c->body_in : c->req.body_len);
        memmove(c->buf, c->buf + used, c->len - used);
        c->len -= used;
        c->start = c->head_len = c->body_in = c->body_out = 0;
        c->continue_sent = false;
        memset(&c->chunk, 0, sizeof(c->chunk));
        c->req.cb = NULL;
        conn_set_state(c, CONN_READING);
        if (c->len == 0 && c->cap > INPUT_KEEP) {
            char *b = realloc(c->buf, INPUT_START + 1);
            if (b != NULL) {
                c->buf = b;
                c->cap = INPUT_START;
            }
        }
        if (c->len == 0 && c->eof) {
            conn_close(c, false);
            return;
        }
        event_add(&c->timer, &s->timeout); /* the deadline of the next request */
        start_reading(c);
    }
    while (c->state == CONN_READING) {
        struct atc_http_head *h = &c->req.head;
        if (c->head_len == 0) {
            int rc = atc_http_parse_request(c->buf + c->start, c->len - c->start, s->cfg.max_head, h);
            if (rc == 0) {
                if (c->eof)
                    conn_close(c, false);
                else if (c->len == c->cap && reserve(c, c->cap + 1) < 0)
                    conn_error(c, 500, "out_of_memory", "out of memory");
                return;
            }
            if (rc < 0) {
                if (rc == -431)
                    conn_error(c, 431, "headers_too_many", "too many header lines");
                else if (rc == -501)
                    conn_error(c, 501, "not_implemented", "transfer coding not supported");
                else if (h->refused != NULL)
                    conn_error(c, 400, h->refused->code, h->refused->message);
                else
                    conn_error(c, 400, "bad_request", "malformed request");
                return;
            }
            c->head_len = (size_t)rc;
            if ((h->method & s->cfg.methods) == 0) {
                conn_error(c, 501, "not_implemented", "method not implemented");
                return;
            }
            /* Two Content-Length values that differ: where this body ends is a matter of opinion, and a
             * proxy that takes one while the next hop takes the other is how requests are smuggled. */
            if (h->conflicting_lengths) {
                conn_error(c, 400, "conflicting_content_length", "two Content-Length headers that differ");
                return;
            }
            if (h->content_length > 0 && (uint64_t)h->content_length > s->cfg.max_body) {
                conn_error(c, 413, "request_too_large", "request body over the server's limit");
                return;
            }
            if (h->expect_continue && h->minor == 1 && (h->chunked || h->content_length > 0) &&
                !c->continue_sent && c->len - c->start == c->head_len) {
                static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
                struct iovec v = {(void *)cont, sizeof(cont) - 1};
                c->continue_sent = true;
                conn_send(c, &v, 1);
                if (c->state == CONN_CLOSED)
                    return;
            }
        }
        size_t body_at = c->start + c->head_len;
        if (!h->chunked) {
            size_t want = h->content_length > 0 ? (size_t)h->content_length : 0;
            if (c->len - body_at < want) {
                if (c->eof) {
                    conn_close(c, false);
                    return;
                }
                if (reserve(c, body_at + want) < 0)
                    conn_error(c, 500, "out_of_memory", "out of memory");
                return;
            }
            dispatch(c, want);
            return;
        }
        size_t pos = body_at + c->body_in, out = body_at + c->body_out;
        c->chunk.max_body = s->cfg.max_body;
        int rc = atc_http_chunked_decode(&c->chunk, c->buf, c->len, &pos, &out);
        /* The framing consumed (sizes, extensions, trailers, CRLFs) goes now: only the decoded body and
         * the bytes not parsed yet stay, so what a client sends beyond its body costs no memory (an endless
         * extension or trailer line, a run of leading zeros, was kept 1:1 until client_timeout). */
        memmove(c->buf + out, c->buf + pos, c->len - pos);
        c->len -= pos - out;
        c->body_in = c->body_out = out - body_at;
        if (rc == -2 || c->body_out > s->cfg.max_body) {
            conn_error(c, 413, "request_too_large", "request body over the server's limit");
            return;
        }
        if (rc < 0) {
            conn_error(c, 400, "bad_chunked_framing", "malformed chunked request body");
            return;
        }
        if (rc == 0) {
            if (c->eof)
                conn_close(c, false);
            else if (c->len == c->cap && reserve(c, c->cap + 1) < 0)
                conn_error(c, 500, "out_of_memory", "out of memory");
            return;
        }
        /* the decoded body sits at body_at; what followed the chunked body (a pipelined request) is at
         * pos: the request's bytes are counted to pos (body_in), its body is body_out long */
        dispatch(c, c->body_out);
        return;
    }
}

static void on_readable(evutil_socket_t fd, short what, void *arg)
{
    struct http_conn *c = arg;
    conn_expect(c, ~CONN_IN(CONN_CLOSED)); /* close deletes the event */
    if (c->state == CONN_LINGERING) {
        char drop[4096];
        ssize_t n = recv(fd, drop, sizeof(drop), 0);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
            conn_close(c, false);
        return;
    }
    if (c->len == c->cap) {
        /* full: a request being answered holds slices of the buffer, which must not move */
        if (c->state != CONN_READING) {
            /* Pipelined bytes filled it while a request is answered: stop taking them, but keep watching
             * for the client's close, or a held request would never hear that its client left. */
            stop_reading(c);
            event_add(&c->hup, NULL);
            return;
        }
        if (reserve(c, c->cap + 1) < 0) {
            conn_close(c, true);
            return;
        }
    }
    ssize_t n = recv(fd, c->buf + c->len, c->cap - c->len, 0);
    if (n < 0) {
        if (errno == EAGAIN || errno == EINTR)
            return;
        conn_close(c, true); /* reset */
        return;
    }
    if (n == 0) {
        c->eof = true;
        stop_reading(c);
        if (c->state == CONN_READING)
            conn_process(c); /* a whole request may still be there; else it closes */
        else if (CONN_IN(c->state) & CONN_ANSWERING)
            conn_close(c, true); /* the client left before its answer: its owner cancels the work */
        return;
    }
    c->len += (size_t)n;
    if (c->state == CONN_READING)
        conn_process(c);
}

/* The client closed while its bytes wait unread behind a request being answered (on_readable). */
static void on_hangup(evutil_socket_t fd, short what, void *arg)
{
    struct http_conn *c = arg;
    conn_expect(c, ~CONN_IN(CONN_CLOSED)); /* close deletes the event */
    c->eof = true;
    if (CONN_IN(c->state) & CONN_ANSWERING)
        conn_close(c, true); /* its owner cancels the work */
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    struct http_conn *c = arg;
    conn_expect(c, ~CONN_IN(CONN_CLOSED)); /* close deletes the event */
    if (c->state == CONN_READING)
        atc_debug("client %s: no complete request within client_timeout: closing", c->peer);
    else if (c->state != CONN_LINGERING)
        atc_debug("client %s: took no byte of its answer for client_timeout: closing", c->peer);
    conn_close(c, true);
}

/* ---- accepting, paused at the cap and when descriptors run out ---- */

static void accept_pause(struct atc_http_server *s)
{
    if (!s->accept_paused && s->accept_ev != NULL)
        event_del(s->accept_ev);
    s->accept_paused = true;
}

/* Watches the listener again if it was paused and there is room. */
static void accept_resume(struct atc_http_server *s)
{
    size_t cap = s->cfg.max_connections;
    if (!s->accept_paused || s->accept_ev == NULL || (cap > 0 && s->nconns >= cap))
        return;
    s->accept_paused = false;
    event_del(&s->retry_ev);
    event_add(s->accept_ev, NULL);
}

static void on_accept_retry(evutil_socket_t fd, short what, void *arg)
{
    accept_resume(arg);
}

/* accept failed with @p err for want of a descriptor (EMFILE, ENFILE) or of memory (ENOBUFS, ENOMEM):
 * the listener stays readable, so watching it would spin (and log each try). Paused until a timer or
 * a close; one line when it starts. */
static void accept_starved(struct atc_http_server *s, int err)
{
    s->failed++;
    if (!s->starved) {
        s->starved = true;
        atc_warn("listener :%u: accept: %s with %zu connections open: not accepting for a while",
                 (unsigned)s->port, strerror(err), s->nconns);
    }
    accept_pause(s);
    struct timeval tv = atc_timeval_ms(ACCEPT_RETRY_MS);
    event_add(&s->retry_ev, &tv);
}

static void on_accept(evutil_socket_t lfd, short what, void *arg)
{
    struct atc_http_server *s = arg;
    for (int i = 0; i < 64; i++) {
        if (s->cfg.max_connections > 0 && s->nconns >= s->cfg.max_connections) {
            if (!s->at_cap)
                atc_warn(
                    "listener :%u: %zu connections open, max_connections: new ones wait until some close",
                    (unsigned)s->port, s->nconns);
            s->at_cap = true;
            s->waits++;
            accept_pause(s);
            return;
        }
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        evutil_socket_t fd = accept4(lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            int err = errno;
            if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
                accept_starved(s, err);
            } else if (err == EAGAIN && (s->at_cap || s->starved)) {
                /* An episode ends when no client waits any more: one line, not one per close (each lets
                 * one more in and the next accept pause again while clients wait). */
                if (s->starved)
                    atc_info(
                        "listener :%u: every waiting client accepted, after %llu accepts failed for want "
                        "of a descriptor or memory",
                        (unsigned)s->port, (unsigned long long)s->failed);
                else
                    atc_info("listener :%u: every waiting client accepted (%llu times at max_connections)",
                             (unsigned)s->port, (unsigned long long)s->waits);
                s->at_cap = s->starved = false;
                s->waits = s->failed = 0;
            } else if (err != EAGAIN && err != EWOULDBLOCK && err != EINTR && err != ECONNABORTED)
                atc_warn("accept: %s", strerror(err));
            return;
        }

        struct http_conn *c = calloc(1, sizeof(*c));
        char *buf = c != NULL ? malloc(INPUT_START + 1) : NULL;
        if (buf == NULL) {
            free(c);
            evutil_closesocket(fd);
            continue;
        }
        if (ss.ss_family == AF_INET || ss.ss_family == AF_INET6) {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        }
        c->s = s;
        c->fd = fd;
        c->buf = buf;
        c->cap = INPUT_START;
        c->state = CONN_READING;
        c->req.c = c;
        event_assign(&c->rev, s->base, fd, EV_READ | EV_PERSIST, on_readable, c);
        event_assign(&c->wev, s->base, fd, EV_WRITE | EV_PERSIST, on_writable, c);
        event_assign(&c->hup, s->base, fd, EV_CLOSED, on_hangup, c);
        evtimer_assign(&c->timer, s->base, on_timer, c);
        event_assign(&c->defer, s->base, -1, 0, on_defer, c);
        if (ss.ss_family == AF_INET) {
            struct sockaddr_in *a = (struct sockaddr_in *)&ss;
            char ip[INET_ADDRSTRLEN];
            inet_ntop(AF_INET, &a->sin_addr, ip, sizeof(ip));
            snprintf(c->peer, sizeof(c->peer), "%s:%u", ip, (unsigned)ntohs(a->sin_port));
        } else if (ss.ss_family == AF_INET6) {
            struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
            char ip[INET6_ADDRSTRLEN];
            inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof(ip));
            snprintf(c->peer, sizeof(c->peer), "[%s]:%u", ip, (unsigned)ntohs(a->sin6_port));
        } else {
            snprintf(c->peer, sizeof(c->peer), "local");
        }
        LIST_INSERT_HEAD(&s->conns, c, link);
        if (++s->nconns > s->high)
            s->high = s->nconns;
        start_reading(c);
        event_add(&c->timer, &s->timeout);
    }
}

/* ---- the server ---- */

struct atc_http_server *atc_http_server_create(struct event_base *base,
                                               const struct atc_http_server_config *cfg,
                                               atc_http_handler handler, void *arg)
{
    struct atc_http_server *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    s->base = base;
    s->cfg = *cfg;
    if (s->cfg.max_head == 0)
        s->cfg.max_head = 64 * 1024;
    if (s->cfg.max_body == 0)
        s->cfg.max_body = 1 << 20;
    if (s->cfg.timeout_ms == 0)
        s->cfg.timeout_ms = 60000;
    s->handler = handler;
    s->arg = arg;
    s->lfd = -1;
    s->date_sec = -1;
    struct timeval tv = atc_timeval_ms(s->cfg.timeout_ms);
    /* every connection waits the same time: common timeouts keep them in a list, not the timer heap */
    const struct timeval *common = event_base_init_common_timeout(base, &tv);
    s->timeout = common != NULL ? *common : tv;
    tv = atc_timeval_ms(LINGER_MS);
    common = event_base_init_common_timeout(base, &tv);
    s->linger = common != NULL ? *common : tv;
    LIST_INIT(&s->conns);
    evtimer_assign(&s->trim, base, on_trim, s);
    evtimer_assign(&s->retry_ev, base, on_accept_retry, s);
    return s;
}

int atc_http_server_listen(struct atc_http_server *s, evutil_socket_t fd)
{
    evutil_make_socket_nonblocking(fd);
    s->accept_ev = event_new(s->base, fd, EV_READ | EV_PERSIST, on_accept, s);
    if (s->accept_ev == NULL || event_add(s->accept_ev, NULL) < 0) {
        evutil_closesocket(fd);
        return -1;
    }
    s->lfd = fd;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET)
            s->port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        else if (ss.ss_family == AF_INET6)
            s->port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    }
    return 0;
}

int atc_http_server_bind(struct atc_http_server *s, const char *host, uint16_t port, const char **err)
{
    struct evutil_addrinfo hints = {.ai_family = AF_UNSPEC,
                                    .ai_socktype = SOCK_STREAM,
                                    .ai_flags = EVUTIL_AI_PASSIVE | EVUTIL_AI_NUMERICHOST};
    struct evutil_addrinfo *ai = NULL;
    char ps[8];
    snprintf(ps, sizeof(ps), "%u", (unsigned)port);
    if (evutil_getaddrinfo(host, ps, &hints, &ai) != 0 || ai == NULL) {
        *err = "cannot resolve the listen address";
        return -1;
    }
    evutil_socket_t fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
        bind(fd, ai->ai_addr, (socklen_t)ai->ai_addrlen) < 0 || listen(fd, 4096) < 0) {
        *err = "cannot listen on the address";
        if (fd >= 0)
            evutil_closesocket(fd);
        evutil_freeaddrinfo(ai);
        return -1;
    }
    evutil_freeaddrinfo(ai);
    if (atc_http_server_listen(s, fd) < 0) {
        *err = "out of memory";
        return -1;
    }
    return 0;
}

uint16_t atc_http_server_port(const struct atc_http_server *s)
{
    return s->port;
}

void atc_http_server_stop_listening(struct atc_http_server *s)
{
    event_del(&s->retry_ev);
    if (s->accept_ev != NULL)
        event_free(s->accept_ev);
    s->accept_ev = NULL;
    if (s->lfd >= 0)
        evutil_closesocket(s->lfd);
    s->lfd = -1;
}

size_t atc_http_server_connections(const struct atc_http_server *s)
{
    return s->nconns;
}

void atc_http_server_destroy(struct atc_http_server *s)
{
    if (s == NULL)
        return;
    atc_http_server_stop_listening(s);
    struct http_conn *c;
    while ((c = LIST_FIRST(&s->conns)) != NULL) {
        conn_close(c, true);
        event_del(&c->defer);
        conn_tell_gone(c);
        conn_free(c);
    }
    event_del(&s->trim);
    free(s); /* connections closed earlier free themselves from the loop; they do not touch the server */
}

/* ---- requests ---- */

enum atc_http_method atc_http_req_method(const struct atc_http_req *r)
{
    return r->head.method;
}

const char *atc_http_req_path(const struct atc_http_req *r)
{
    return r->head.path;
}

const char *atc_http_req_query(const struct atc_http_req *r)
{
    return r->head.query;
}

const char *atc_http_req_header(const struct atc_http_req *r, const char *name)
{
    return atc_http_head_find(&r->head, name);
}

const struct atc_http_head *atc_http_req_head(const struct atc_http_req *r)
{
    return &r->head;
}

const char *atc_http_req_body(const struct atc_http_req *r, size_t *len)
{
    *len = r->body_len;
    return r->body;
}

void atc_http_req_set_callbacks(struct atc_http_req *r, const struct atc_http_req_callbacks *cb, void *arg)
{
    struct http_conn *c = r->c;
    if (c->state == CONN_CLOSED && cb != NULL)
        return; /* gone already: nothing more will be heard */
    r->cb = cb;
    r->cb_arg = arg;
    if (cb == NULL && c->state == CONN_DONE)
        conn_answer_done(c); /* it waited for its owner to let go */
}

void atc_http_req_close_after(struct atc_http_req *r)
{
    r->close_after = true;
}

size_t atc_http_req_backlog(const struct atc_http_req *r)
{
    return r->c->state == CONN_CLOSED ? 0 : backlog(r->c);
}

/* The status line, headers and framing of an answer into @p dst (2 KiB); its length, or 0 if too long. */
static size_t build_head(struct atc_http_req *r, char *dst, size_t size, int status, const char *content_type,
                         const char *headers, int64_t length)
{
    struct http_conn *c = r->c;
    bool close = r->close_after || !r->head.keep_alive;
    if (close)
        r->close_after = true;
    const char *reason = atc_http_reason(status);
    size_t rlen = strlen(reason), tlen = content_type ? strlen(content_type) : 0,
           hlen = headers ? strlen(headers) : 0, dlen;
    const char *date = date_header(c->s, &dlen);
    if (rlen + tlen + hlen + dlen + 128 > size)
        return 0;
    struct atc_strbuf b = atc_strbuf_init(dst, size);
    char code[4] = {(char)('0' + status / 100 % 10), (char)('0' + status / 10 % 10),
                    (char)('0' + status % 10), ' '};
    atc_strbuf_addn(&b, "HTTP/1.1 ", 9);
    atc_strbuf_addn(&b, code, 4);
    atc_strbuf_addn(&b, reason, rlen);
    atc_strbuf_addn(&b, "\r\n", 2);
    atc_strbuf_addn(&b, date, dlen);
    if (content_type != NULL) {
        atc_strbuf_addn(&b, "Content-Type: ", 14);
        atc_strbuf_addn(&b, content_type, tlen);
        atc_strbuf_addn(&b, "\r\n", 2);
    }
    atc_strbuf_addn(&b, headers != NULL ? headers : "", hlen);
    if (length >= 0) {
        atc_strbuf_addn(&b, "Content-Length: ", 16);
        atc_strbuf_u64(&b, (uint64_t)length);
        atc_strbuf_addn(&b, "\r\n", 2);
    } else if (r->head.minor == 1) {
        r->chunked = true;
        atc_strbuf_addn(&b, "Transfer-Encoding: chunked\r\n", 28);
    } else {
        r->close_after = close = true; /* HTTP/1.0: the body ends with the connection */
    }
    if (close)
        atc_strbuf_addn(&b, "Connection: close\r\n", 19);
    else if (r->head.minor == 0)
        atc_strbuf_addn(&b, "Connection: keep-alive\r\n", 24);
    atc_strbuf_addn(&b, "\r\n", 2);
    return b.len;
}

static void send_head_and(struct atc_http_req *r, int status, const char *content_type, const char *headers,
                          int64_t length, const void *body, size_t len)
{
    char head[2048];
    conn_set_state(r->c, CONN_STREAMING);
    size_t n = build_head(r, head, sizeof(head), status, content_type, headers, length);
    if (n == 0) { /* headers too long for the stack buffer: an exceptional answer, built in an evbuffer */
        char *big =
            malloc((headers ? strlen(headers) : 0) + (content_type ? strlen(content_type) : 0) + 4096);
        if (big == NULL) {
            atc_http_req_abort(r);
            return;
        }
        n = build_head(r, big, SIZE_MAX, status, content_type, headers, length);
        struct iovec v[2] = {{big, n}, {(void *)body, len}};
        conn_send(r->c, v, len > 0 ? 2 : 1);
        free(big);
        return;
    }
    struct iovec v[2] = {{head, n}, {(void *)body, len}};
    conn_send(r->c, v, len > 0 ? 2 : 1);
}

void atc_http_reply(struct atc_http_req *r, int status, const char *content_type, const char *headers,
                    const void *body, size_t len)
{
    struct http_conn *c = r->c;
    if (c->state != CONN_HANDLING)
        return;
    bool head_only = r->head.method == ATC_HTTP_HEAD;
    send_head_and(r, status, content_type, headers, (int64_t)len, head_only ? NULL : body,
                  head_only ? 0 : len);
    if (c->state == CONN_CLOSED)
        return; /* the owner heard on_gone */
    conn_set_state(c, CONN_ANSWERED);
    conn_answer_done(c);
}

void atc_http_reply_start(struct atc_http_req *r, int status, const char *content_type, const char *headers)
{
    struct http_conn *c = r->c;
    if (c->state != CONN_HANDLING)
        return;
    char head[2048];
    size_t n = build_head(r, head, sizeof(head), status, content_type, headers, -1);
    if (n == 0 || backlog(c) > 0 || (c->held = malloc(n)) == NULL) {
        send_head_and(r, status, content_type, headers, -1, NULL, 0);
        return;
    }
    conn_set_state(c, CONN_STREAMING);
    memcpy(c->held, head, n);
    c->held_len = n;
    event_active(&c->wev, EV_WRITE, 1); /* sent at the end of this loop turn if no piece comes first */
}

void atc_http_reply_chunk(struct atc_http_req *r, const void *data, size_t len)
{
    struct http_conn *c = r->c;
    if (c->state != CONN_STREAMING || len == 0 || r->head.method == ATC_HTTP_HEAD)
        return;
    if (!r->chunked) {
        struct iovec v = {(void *)data, len};
        conn_send(c, &v, 1);
        return;
    }
    char size[24];
    struct atc_strbuf b = atc_strbuf_init(size, sizeof(size));
    atc_strbuf_hex(&b, len, 0);
    atc_strbuf_addn(&b, "\r\n", 2);
    struct iovec v[3] = {{size, b.len}, {(void *)data, len}, {"\r\n", 2}};
    conn_send(c, v, 3);
}

void atc_http_reply_chunk_buffer(struct atc_http_req *r, struct evbuffer *b)
{
    size_t len = evbuffer_get_length(b);
    struct evbuffer_iovec vec[MAX_IOV];
    int n = evbuffer_peek(b, -1, NULL, vec, MAX_IOV);
    if (len == 0 || n <= 0 || r->c->state != CONN_STREAMING || r->head.method == ATC_HTTP_HEAD) {
        evbuffer_drain(b, len);
        return;
    }
    if (n > MAX_IOV) { /* many small pieces: made one */
        atc_http_reply_chunk(r, evbuffer_pullup(b, -1), len);
        evbuffer_drain(b, len);
        return;
    }
    char size[24];
    struct iovec v[MAX_IOV + 2];
    int k = 0;
    if (r->chunked)
        v[k++] = (struct iovec){size, (size_t)snprintf(size, sizeof(size), "%zx\r\n", len)};
    for (int i = 0; i < n; i++)
        v[k++] = (struct iovec){vec[i].iov_base, vec[i].iov_len};
    if (r->chunked)
        v[k++] = (struct iovec){"\r\n", 2};
    conn_send(r->c, v, k);
    evbuffer_drain(b, len);
}

void atc_http_reply_end(struct atc_http_req *r)
{
    struct http_conn *c = r->c;
    if (c->state != CONN_STREAMING)
        return;
    conn_set_state(c, CONN_ANSWERED);
    if (r->chunked && r->head.method != ATC_HTTP_HEAD) {
        struct iovec v = {"0\r\n\r\n", 5};
        conn_send(c, &v, 1);
    } else {
        conn_send(c, NULL, 0); /* a held head */
    }
    if (c->state == CONN_CLOSED)
        return;
    conn_answer_done(c);
}

void atc_http_req_abort(struct atc_http_req *r)
{
    struct http_conn *c = r->c;
    r->cb = NULL;
    if (c->state != CONN_CLOSED)
        conn_close(c, false);
}

void atc_http_reply_error(struct atc_http_req *r, int status, const char *type, const char *code,
                          const char *message, int retry_after_s, const char *headers)
{
    struct evbuffer *b = evbuffer_new();
    if (b == NULL) {
        atc_http_req_abort(r);
        return;
    }
    evbuffer_add(b, "{\"error\":{\"message\":\"", 21);
    atc_json_escape(b, message, strlen(message));
    /* the code a string, as OpenAI's: clients switch on it, and a number there breaks their parsers */
    evbuffer_add_printf(b, "\",\"type\":\"%s\",\"param\":null,\"code\":\"%s\"}}\n", type,
                        code != NULL ? code : "error");
    /* Retry-After after the caller's lines (which may be long: a decision record) */
    char stack[512], *extra = NULL;
    const char *h = headers;
    if (retry_after_s > 0) {
        size_t size = (headers != NULL ? strlen(headers) : 0) + 32;
        extra = size <= sizeof(stack) ? stack : malloc(size);
        if (extra != NULL) {
            snprintf(extra, size, "%sRetry-After: %d\r\n", headers != NULL ? headers : "", retry_after_s);
            h = extra;
        }
    }
    size_t len = evbuffer_get_length(b);
    atc_http_reply(r, status, "application/json", h, evbuffer_pullup(b, -1), len);
    if (extra != stack)
        free(extra);
    evbuffer_free(b);
}

void atc_http_reply_json(struct atc_http_req *r, int status, struct evbuffer *body)
{
    size_t len = evbuffer_get_length(body);
    atc_http_reply(r, status, "application/json", NULL, evbuffer_pullup(body, -1), len);
    evbuffer_drain(body, len);
}
