#include "ops/access_log.h"

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "base/json.h"
#include "base/log.h"
#include "policy/decision.h"

#define FLUSH_MS 200
/* Past this much unwritten log, new lines are dropped (and counted) rather than growing memory. */
#define MAX_PENDING (16u * 1024 * 1024)
#define FLUSH_AT (64u * 1024)

struct atc_access_log {
    char *path;
    int fd;
    bool is_stderr;
    struct evbuffer *pending;
    struct event *timer;
    uint64_t write_errors;
    time_t when_sec; /* the second that when[] shows */
    char when[32];
};

static void flush(struct atc_access_log *log)
{
    while (evbuffer_get_length(log->pending) > 0) {
        int n = evbuffer_write(log->pending, log->fd);
        if (n > 0)
            continue;
        if (n < 0 && errno == EINTR)
            continue;
        /* A full disk or a broken file: keep routing, say so now and then, drop what cannot be written. */
        if (log->write_errors++ % 1000 == 0)
            atc_error("access log %s: write failed: %s", log->path, strerror(errno));
        if (evbuffer_get_length(log->pending) > MAX_PENDING)
            evbuffer_drain(log->pending, evbuffer_get_length(log->pending));
        return;
    }
}

static void on_flush(evutil_socket_t fd, short what, void *arg)
{
    flush(arg);
}

static int open_fd(const char *path)
{
    return open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
}

struct atc_access_log *atc_access_log_open(struct event_base *base, const char *path)
{
    struct atc_access_log *log = calloc(1, sizeof(*log));
    if (log == NULL)
        return NULL;
    log->is_stderr = strcmp(path, "stderr") == 0;
    log->fd = log->is_stderr ? STDERR_FILENO : open_fd(path);
    log->path = strdup(path);
    log->pending = evbuffer_new();
    log->timer = event_new(base, -1, EV_PERSIST, on_flush, log);
    if (log->fd < 0 || log->path == NULL || log->pending == NULL || log->timer == NULL) {
        int saved = errno;
        atc_access_log_close(log);
        errno = saved;
        return NULL;
    }
    struct timeval tv = {0, FLUSH_MS * 1000};
    event_add(log->timer, &tv);
    return log;
}

void atc_access_log_close(struct atc_access_log *log)
{
    if (log == NULL)
        return;
    if (log->pending != NULL && log->fd >= 0)
        flush(log);
    if (log->timer != NULL)
        event_free(log->timer);
    if (log->pending != NULL)
        evbuffer_free(log->pending);
    if (log->fd >= 0 && !log->is_stderr)
        close(log->fd);
    free(log->path);
    free(log);
}

/* A line is assembled in a buffer on the stack and added to the pending log in one piece: formatting
 * each field with evbuffer_add_printf cost about a microsecond per request. */
struct line {
    struct evbuffer *out;
    size_t len;
    char buf[1024];
};

static void line_flush(struct line *l)
{
    evbuffer_add(l->out, l->buf, l->len);
    l->len = 0;
}

static void line_put(struct line *l, const char *s, size_t n)
{
    if (l->len + n > sizeof(l->buf)) {
        line_flush(l);
        if (n > sizeof(l->buf)) {
            evbuffer_add(l->out, s, n);
            return;
        }
    }
    memcpy(l->buf + l->len, s, n);
    l->len += n;
}

#define LINE_LIT(l, s) line_put(l, s, sizeof(s) - 1)

static void line_u64(struct line *l, uint64_t v)
{
    char d[20], *p = d + sizeof(d);
    do
        *--p = (char)('0' + v % 10);
    while ((v /= 10) > 0);
    line_put(l, p, (size_t)(d + sizeof(d) - p));
}

static void line_i64(struct line *l, int64_t v)
{
    if (v < 0)
        LINE_LIT(l, "-");
    line_u64(l, v < 0 ? -(uint64_t)v : (uint64_t)v);
}

/* Milliseconds with three decimals, as "%.3f" writes them (the values here are whole microseconds). */
static void line_ms(struct line *l, double ms)
{
    if (!(ms >= 0 && ms < 1e15)) {
        char v[64];
        int n = snprintf(v, sizeof(v), "%.3f", ms);
        line_put(l, v, n > 0 ? (size_t)n : 0);
        return;
    }
    uint64_t us = (uint64_t)llround(ms * 1000);
    char frac[4] = {'.', (char)('0' + us / 100 % 10), (char)('0' + us / 10 % 10), (char)('0' + us % 10)};
    line_u64(l, us / 1000);
    line_put(l, frac, 4);
}

/* @p key is the literal text before the value (",\"name\":"); NULL or "" is written as null. */
static void json_field(struct line *l, const char *key, size_t keylen, const char *value)
{
    line_put(l, key, keylen);
    if (value == NULL || value[0] == '\0') {
        LINE_LIT(l, "null");
        return;
    }
    size_t n = strlen(value);
    bool plain = true; /* printable ASCII without quote or backslash: atc_json_escape leaves it as it is */
    for (size_t i = 0; i < n && plain; i++) {
        unsigned char c = (unsigned char)value[i];
        plain = c >= 0x20 && c < 0x80 && c != '"' && c != '\\';
    }
    LINE_LIT(l, "\"");
    if (plain) {
        line_put(l, value, n);
    } else {
        line_flush(l);
        atc_json_escape(l->out, value, n);
    }
    LINE_LIT(l, "\"");
}

#define JSON_FIELD(l, name, value) json_field(l, ",\"" name "\":", sizeof(",\"" name "\":") - 1, value)

void atc_access_log_request(struct atc_access_log *log, const struct atc_access_record *r)
{
    if (evbuffer_get_length(log->pending) > MAX_PENDING)
        return; /* the disk does not keep up: the line is dropped rather than memory grown */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (ts.tv_sec != log->when_sec || log->when[0] == '\0') { /* the date changes once a second */
        struct tm tm;
        gmtime_r(&ts.tv_sec, &tm);
        strftime(log->when, sizeof(log->when), "%Y-%m-%dT%H:%M:%S", &tm);
        log->when_sec = ts.tv_sec;
    }
    long msec = ts.tv_nsec / 1000000;
    char ms[5] = {'.', (char)('0' + msec / 100), (char)('0' + msec / 10 % 10), (char)('0' + msec % 10), 'Z'};
    struct line l = {.out = log->pending};
    LINE_LIT(&l, "{\"time\":\"");
    line_put(&l, log->when, strlen(log->when));
    line_put(&l, ms, sizeof(ms));
    LINE_LIT(&l, "\"");
    JSON_FIELD(&l, "id", r->id);
    JSON_FIELD(&l, "model", r->model);
    LINE_LIT(&l, ",\"priority\":");
    line_i64(&l, r->priority);
    JSON_FIELD(&l, "tenant", r->tenant);
    JSON_FIELD(&l, "session", r->session);
    JSON_FIELD(&l, "endpoint", r->endpoint);
    LINE_LIT(&l, ",\"policy_version\":");
    line_u64(&l, r->policy_version);
    LINE_LIT(&l, ",\"status\":");
    line_i64(&l, r->status);
    if (r->stream)
        LINE_LIT(&l, ",\"stream\":true,\"ttft_ms\":");
    else
        LINE_LIT(&l, ",\"stream\":false,\"ttft_ms\":");
    if (r->ttft_ms >= 0)
        line_ms(&l, r->ttft_ms);
    else
        LINE_LIT(&l, "null");
    if (r->prefill_endpoint != NULL) {
        JSON_FIELD(&l, "prefill_endpoint", r->prefill_endpoint);
        LINE_LIT(&l, ",\"prefill_ms\":");
        r->prefill_ms >= 0 ? line_ms(&l, r->prefill_ms) : LINE_LIT(&l, "null");
        LINE_LIT(&l, ",\"decode_first_ms\":");
        r->decode_first_ms >= 0 ? line_ms(&l, r->decode_first_ms) : LINE_LIT(&l, "null");
    }
    LINE_LIT(&l, ",\"total_ms\":");
    line_ms(&l, r->total_ms);
    LINE_LIT(&l, ",\"prompt_tokens\":");
    line_u64(&l, r->prompt_tokens);
    LINE_LIT(&l, ",\"max_tokens\":");
    if (r->max_tokens >= 0)
        line_i64(&l, r->max_tokens);
    else
        LINE_LIT(&l, "null");
    LINE_LIT(&l, ",\"retries\":");
    line_u64(&l, r->retries);
    LINE_LIT(&l, ",\"bytes\":");
    line_u64(&l, r->bytes);
    LINE_LIT(&l, ",\"sse_events\":");
    line_u64(&l, r->sse_events);
    if (!r->usage) {
        LINE_LIT(&l, ",\"usage\":null");
    } else {
        static const char *const keys[] = {
            "{\"prompt_tokens\":", ",\"completion_tokens\":", ",\"cached_tokens\":"};
        const int64_t v[] = {r->usage_prompt_tokens, r->usage_completion_tokens, r->usage_cached_tokens};
        LINE_LIT(&l, ",\"usage\":");
        for (int i = 0; i < 3; i++) {
            line_put(&l, keys[i], strlen(keys[i]));
            if (v[i] >= 0)
                line_i64(&l, v[i]);
            else
                LINE_LIT(&l, "null");
        }
        LINE_LIT(&l, "}");
    }
    JSON_FIELD(&l, "error", r->error);
    const struct atc_decision_record *d = r->decision;
    if (d != NULL) {
        JSON_FIELD(&l, "decision", d->kind);
        JSON_FIELD(&l, "reason", d->reason);
        if (d->scores != NULL || d->shadow_version != 0) {
            LINE_LIT(&l, ",\"explain\":");
            line_flush(&l);
            atc_decision_record_json(d, l.out);
        }
    }
    LINE_LIT(&l, "}\n");
    line_flush(&l);
    if (evbuffer_get_length(log->pending) > FLUSH_AT)
        flush(log);
}

int atc_access_log_reopen(struct atc_access_log *log)
{
    if (log->is_stderr)
        return 0;
    flush(log);
    int fd = open_fd(log->path);
    if (fd < 0) {
        atc_error("access log %s: cannot reopen: %s (still writing to the old file)", log->path,
                  strerror(errno));
        return -1;
    }
    close(log->fd);
    log->fd = fd;
    atc_info("access log %s reopened", log->path);
    return 0;
}
