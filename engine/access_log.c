#include "access_log.h"

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "http_util.h"
#include "log.h"

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
    uint64_t dropped, write_errors;
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

void atc_access_log_write(struct atc_access_log *log, struct evbuffer *line)
{
    if (evbuffer_get_length(log->pending) > MAX_PENDING) {
        log->dropped++;
        evbuffer_drain(line, evbuffer_get_length(line));
        return;
    }
    evbuffer_add_buffer(log->pending, line);
    evbuffer_add(log->pending, "\n", 1);
    if (evbuffer_get_length(log->pending) > FLUSH_AT)
        flush(log);
}

static void json_field(struct evbuffer *b, const char *key, const char *value)
{
    evbuffer_add_printf(b, ",\"%s\":", key);
    if (value == NULL || value[0] == '\0') {
        evbuffer_add(b, "null", 4);
        return;
    }
    evbuffer_add(b, "\"", 1);
    atc_json_escape(b, value, strlen(value));
    evbuffer_add(b, "\"", 1);
}

void atc_access_log_request(struct atc_access_log *log, const struct atc_access_record *r)
{
    struct evbuffer *b = evbuffer_new();
    if (b == NULL)
        return;
    char when[40];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
    evbuffer_add_printf(b, "{\"time\":\"%s.%03ldZ\"", when, ts.tv_nsec / 1000000);
    json_field(b, "id", r->id);
    json_field(b, "model", r->model);
    evbuffer_add_printf(b, ",\"priority\":%d", r->priority);
    json_field(b, "tenant", r->tenant);
    json_field(b, "session", r->session);
    json_field(b, "endpoint", r->endpoint);
    evbuffer_add_printf(b, ",\"policy_version\":%llu,\"status\":%d,\"stream\":%s",
                        (unsigned long long)r->policy_version, r->status, r->stream ? "true" : "false");
    if (r->ttft_ms >= 0)
        evbuffer_add_printf(b, ",\"ttft_ms\":%.3f", r->ttft_ms);
    else
        evbuffer_add_printf(b, ",\"ttft_ms\":null");
    evbuffer_add_printf(b, ",\"total_ms\":%.3f,\"prompt_tokens\":%u,\"max_tokens\":", r->total_ms, r->prompt_tokens);
    if (r->max_tokens >= 0)
        evbuffer_add_printf(b, "%lld", (long long)r->max_tokens);
    else
        evbuffer_add(b, "null", 4);
    evbuffer_add_printf(b, ",\"retries\":%u,\"bytes\":%llu,\"sse_events\":%llu", r->retries,
                        (unsigned long long)r->bytes, (unsigned long long)r->sse_events);
    json_field(b, "error", r->error);
    evbuffer_add(b, "}", 1);
    atc_access_log_write(log, b);
    evbuffer_free(b);
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

uint64_t atc_access_log_dropped(const struct atc_access_log *log)
{
    return log->dropped;
}
