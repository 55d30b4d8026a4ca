/* The recorder (recorder.h): records encoded on the worker threads' event loops, written to rotating
 * trace files by a thread of its own. */

#include "trace/recorder.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>

#include "config/config.h"
#include "base/log.h"
#include "trace/trace.h"
#include "base/clock.h"

#define WRITE_INTERVAL_MS 200   /* the writer takes the buffer at least this often */
#define WAKE_BYTES (256 * 1024) /* ... and as soon as this much is waiting */
#define ERROR_LOG_INTERVAL_S 60 /* write errors are logged at most this often (all are counted) */
#define RETRY_OPEN_INTERVAL_S 1 /* after a failed open, batches are dropped for this long */

struct atc_recorder {
    struct atc_recorder_settings s; /* strings owned */
    uint64_t start_unix_us;         /* time base of every record's at_us */
    _Atomic uint64_t rng;           /* sampling: a splitmix64 counter, so any thread draws without a lock */

    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct atc_trace_buf pending; /* encoded records waiting for the writer (mu) */
    uint64_t pending_records;     /* (mu) */
    bool stop;                    /* (mu) */

    /* writer thread only */
    int fd;
    uint64_t file_bytes;
    uint64_t file_opened_us;
    unsigned file_seq;
    char path[4096];
    time_t last_error_log, last_open_failure;

    _Atomic uint64_t recorded, written, dropped, sampled_out, write_errors, files, bytes;
    char headers[ATC_TRACE_HEADERS_MAX][64]; /* record.headers, lower case; fixed at creation */
    size_t nheaders;
};

_Static_assert(ATC_RECORD_HEADERS_MAX <= ATC_TRACE_HEADERS_MAX, "a record keeps every record.headers");

/* ---- the writer thread ---- */

/* mkdir -p for the recording directory. */
static int make_dirs(const char *dir)
{
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s", dir);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(tmp, 0755) < 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    return mkdir(tmp, 0755) < 0 && errno != EEXIST ? -1 : 0;
}

static void write_error(struct atc_recorder *rec, const char *what, int err, uint64_t lost)
{
    atomic_fetch_add(&rec->write_errors, 1);
    atomic_fetch_add(&rec->dropped, lost);
    time_t now = time(NULL);
    if (rec->last_error_log == 0 || now - rec->last_error_log >= ERROR_LOG_INTERVAL_S) {
        rec->last_error_log = now;
        atc_error("record: %s %s: %s (%llu write errors, %llu records lost so far; routing goes on)", what,
                  rec->path, strerror(err), (unsigned long long)atomic_load(&rec->write_errors),
                  (unsigned long long)atomic_load(&rec->dropped));
    }
}

static void close_file(struct atc_recorder *rec)
{
    if (rec->fd >= 0)
        close(rec->fd);
    rec->fd = -1;
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            if (w == 0)
                errno = EIO;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* A new file with its header. 0, or -1 (counted, logged). */
static int open_file(struct atc_recorder *rec, uint64_t lost_if_failed)
{
    time_t now = time(NULL);
    if (rec->last_open_failure != 0 && now - rec->last_open_failure < RETRY_OPEN_INTERVAL_S) {
        atomic_fetch_add(&rec->dropped, lost_if_failed); /* the last try just failed: do not hammer */
        return -1;
    }
    struct tm tm;
    gmtime_r(&now, &tm);
    make_dirs(rec->s.dir); /* its failure shows as the open's */
    /* A name already taken (a restart within the same second) moves on to the next number. */
    for (int tries = 0; tries < 100; tries++) {
        snprintf(rec->path, sizeof(rec->path), "%s/%s-%04d%02d%02dT%02d%02d%02dZ-%u.atct", rec->s.dir,
                 rec->s.prefix, tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                 tm.tm_sec, ++rec->file_seq);
        rec->fd = open(rec->path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
        if (rec->fd >= 0 || errno != EEXIST)
            break;
    }
    if (rec->fd < 0) {
        rec->last_open_failure = now;
        write_error(rec, "cannot create", errno, lost_if_failed);
        return -1;
    }
    struct atc_trace_header h = {
        .version = ATC_TRACE_VERSION, .text = rec->s.text, .start_unix_us = rec->start_unix_us};
    snprintf(h.source, sizeof(h.source), "record");
    snprintf(h.atc_version, sizeof(h.atc_version), "%s", ATC_VERSION);
    h.created = (double)atc_wall_us() / 1e6;
    struct atc_trace_buf b = {0};
    if (atc_trace_encode_header(&b, &h) < 0 || write_all(rec->fd, b.data, b.len) < 0) {
        int err = b.data == NULL ? ENOMEM : errno;
        free(b.data);
        close_file(rec);
        rec->last_open_failure = now;
        write_error(rec, "cannot write", err, lost_if_failed);
        return -1;
    }
    rec->last_open_failure = 0;
    rec->file_bytes = b.len;
    rec->file_opened_us = atc_wall_us();
    atomic_fetch_add(&rec->files, 1);
    atomic_fetch_add(&rec->bytes, b.len);
    free(b.data);
    atc_info("record: writing %s", rec->path);
    return 0;
}

/* Appends a batch of whole records to the current file, rotating first if it is due. */
static void write_batch(struct atc_recorder *rec, const struct atc_trace_buf *batch, uint64_t records)
{
    if (batch->len == 0)
        return;
    if (rec->fd >= 0 && (rec->file_bytes + batch->len > rec->s.rotate_size ||
                         atc_wall_us() - rec->file_opened_us >= rec->s.rotate_interval_ms * 1000))
        close_file(rec);
    if (rec->fd < 0 && open_file(rec, records) < 0)
        return;
    if (write_all(rec->fd, batch->data, batch->len) < 0) {
        /* The file may now end in a partial record, which readers report; the next batch starts a new
         * file rather than appending after it. */
        write_error(rec, "cannot write", errno, records);
        close_file(rec);
        return;
    }
    rec->file_bytes += batch->len;
    atomic_fetch_add(&rec->bytes, batch->len);
    atomic_fetch_add(&rec->written, records);
}

static void *writer_main(void *arg)
{
    struct atc_recorder *rec = arg;
    struct atc_trace_buf batch = {0};
    for (;;) {
        pthread_mutex_lock(&rec->mu);
        if (!rec->stop && rec->pending.len < WAKE_BYTES) {
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_nsec += WRITE_INTERVAL_MS * 1000000L;
            if (until.tv_nsec >= 1000000000L) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&rec->cv, &rec->mu, &until);
        }
        /* Swap buffers: the loop keeps appending to the (emptied) other one while this one is written. */
        struct atc_trace_buf t = rec->pending;
        rec->pending = batch;
        batch = t;
        uint64_t records = rec->pending_records;
        rec->pending_records = 0;
        bool stop = rec->stop;
        pthread_mutex_unlock(&rec->mu);
        write_batch(rec, &batch, records);
        batch.len = 0;
        if (stop)
            break;
    }
    free(batch.data);
    close_file(rec);
    return NULL;
}

/* ---- the loop's side ---- */

struct atc_recorder *atc_recorder_create(const struct atc_recorder_settings *s)
{
    struct atc_recorder *rec = calloc(1, sizeof(*rec));
    if (rec == NULL)
        return NULL;
    rec->s = *s;
    rec->s.dir = strdup(s->dir);
    rec->s.prefix = strdup(s->prefix);
    rec->fd = -1;
    rec->start_unix_us = atc_wall_us();
    for (size_t i = 0; i < s->nheaders && rec->nheaders < ATC_TRACE_HEADERS_MAX; i++) {
        char *h = rec->headers[rec->nheaders++];
        snprintf(h, sizeof(rec->headers[0]), "%s", s->headers[i]);
        for (; *h; h++)
            *h = (char)tolower((unsigned char)*h);
    }
    rec->s.headers = NULL; /* not kept: copied above */
    rec->s.nheaders = 0;
    atomic_init(&rec->rng, rec->start_unix_us);
    if (rec->s.dir == NULL || rec->s.prefix == NULL) {
        free((char *)rec->s.dir);
        free((char *)rec->s.prefix);
        free(rec);
        return NULL;
    }
    pthread_mutex_init(&rec->mu, NULL);
    pthread_cond_init(&rec->cv, NULL);
    if (pthread_create(&rec->thread, NULL, writer_main, rec) != 0) {
        pthread_mutex_destroy(&rec->mu);
        pthread_cond_destroy(&rec->cv);
        free((char *)rec->s.dir);
        free((char *)rec->s.prefix);
        free(rec);
        return NULL;
    }
    atc_info("record: tracing requests into %s/%s-*.atct (rotate at %zu bytes or %llu ms%s)", rec->s.dir,
             rec->s.prefix, rec->s.rotate_size, (unsigned long long)rec->s.rotate_interval_ms,
             rec->s.text ? ", with prompt text" : "");
    return rec;
}

void atc_recorder_destroy(struct atc_recorder *rec)
{
    if (rec == NULL)
        return;
    pthread_mutex_lock(&rec->mu);
    rec->stop = true;
    pthread_cond_signal(&rec->cv);
    pthread_mutex_unlock(&rec->mu);
    pthread_join(rec->thread, NULL);
    pthread_mutex_destroy(&rec->mu);
    pthread_cond_destroy(&rec->cv);
    free(rec->pending.data);
    free((char *)rec->s.dir);
    free((char *)rec->s.prefix);
    free(rec);
}

char *atc_recorder_capture(const struct atc_recorder *rec, const char *(*find)(void *ctx, const char *name),
                           void *ctx, size_t *n)
{
    const char *values[ATC_TRACE_HEADERS_MAX];
    size_t size = 0;
    *n = 0;
    for (size_t i = 0; i < rec->nheaders; i++) {
        values[i] = find(ctx, rec->headers[i]);
        if (values[i] != NULL)
            size += strlen(rec->headers[i]) + strnlen(values[i], ATC_TRACE_HEADER_VALUE_MAX) + 2;
    }
    char *block = size > 0 ? malloc(size) : NULL;
    if (block == NULL)
        return NULL;
    char *p = block;
    for (size_t i = 0; i < rec->nheaders; i++) {
        if (values[i] == NULL)
            continue;
        size_t a = strlen(rec->headers[i]), b = strnlen(values[i], ATC_TRACE_HEADER_VALUE_MAX);
        memcpy(p, rec->headers[i], a + 1);
        p += a + 1;
        memcpy(p, values[i], b); /* cut at the bound: a record stays small whatever a client sends */
        p[b] = '\0';
        p += b + 1;
        (*n)++;
    }
    return block;
}

void atc_recorder_fields(const char *block, size_t n, struct atc_trace_field *out)
{
    for (size_t i = 0; i < n; i++) {
        out[i].name = block;
        block += strlen(block) + 1;
        out[i].value = block;
        block += strlen(block) + 1;
    }
}

bool atc_recorder_text(const struct atc_recorder *rec)
{
    return rec->s.text;
}

/* A uniform draw in [0, 1) from any thread: splitmix64, whose state is a counter (one atomic add) and
 * whose output is a mix of it. */
static double sample_draw(struct atc_recorder *rec)
{
    uint64_t x = atomic_fetch_add_explicit(&rec->rng, UINT64_C(0x9e3779b97f4a7c15), memory_order_relaxed) +
                 UINT64_C(0x9e3779b97f4a7c15);
    x = (x ^ (x >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    x = (x ^ (x >> 27)) * UINT64_C(0x94d049bb133111eb);
    x ^= x >> 31;
    return (double)(x >> 11) * 0x1.0p-53;
}

void atc_recorder_add(struct atc_recorder *rec, const struct atc_trace_record *r, uint64_t arrival_unix_us)
{
    if (rec->s.sample < 1 && sample_draw(rec) >= rec->s.sample) {
        atomic_fetch_add(&rec->sampled_out, 1);
        return;
    }
    struct atc_trace_record c = *r;
    c.at_us = arrival_unix_us > rec->start_unix_us ? arrival_unix_us - rec->start_unix_us : 0;
    if (!rec->s.text) {
        c.prompt = NULL;
        c.prompt_len = 0;
    }
    /* Encoded into a buffer of this call's, outside the lock: workers encode in parallel and hold the
     * mutex (which the writer takes only to swap buffers) just for the copy. */
    struct atc_trace_buf enc = {0};
    if (atc_trace_encode_record(&enc, &c) < 0) {
        free(enc.data);
        atomic_fetch_add(&rec->dropped, 1);
        return;
    }
    bool kept = false;
    pthread_mutex_lock(&rec->mu);
    if (rec->pending.len + enc.len <= rec->s.buffer) {
        size_t need = rec->pending.len + enc.len;
        if (need > rec->pending.cap) {
            size_t cap = rec->pending.cap ? rec->pending.cap : 64 * 1024;
            while (cap < need)
                cap *= 2;
            char *d = realloc(rec->pending.data, cap);
            if (d != NULL) {
                rec->pending.data = d;
                rec->pending.cap = cap;
            }
        }
        if (need <= rec->pending.cap) {
            memcpy(rec->pending.data + rec->pending.len, enc.data, enc.len);
            rec->pending.len = need;
            rec->pending_records++;
            kept = true;
        }
    }
    if (rec->pending.len >= WAKE_BYTES)
        pthread_cond_signal(&rec->cv);
    pthread_mutex_unlock(&rec->mu);
    free(enc.data);
    atomic_fetch_add(kept ? &rec->recorded : &rec->dropped, 1);
}

void atc_recorder_stats(struct atc_recorder *rec, struct atc_recorder_stats *st)
{
    *st = (struct atc_recorder_stats){
        .recorded = atomic_load(&rec->recorded),
        .written = atomic_load(&rec->written),
        .dropped = atomic_load(&rec->dropped),
        .sampled_out = atomic_load(&rec->sampled_out),
        .write_errors = atomic_load(&rec->write_errors),
        .files = atomic_load(&rec->files),
        .bytes = atomic_load(&rec->bytes),
    };
}

/* ---- what the relay notes ---- */

void atc_record_marks_init(struct atc_record_marks *m)
{
    *m = (struct atc_record_marks){.prompt_tokens = -1, .completion_tokens = -1, .cached_tokens = -1};
}

/* The whole number after @p key in @p p[0..end) (the first occurrence), into *out; left alone when the
 * key is not there or no digits follow it. */
static void usage_count(const char *p, const char *end, const char *key, size_t keylen, int64_t *out)
{
    const char *u = memmem(p, (size_t)(end - p), key, keylen);
    if (u == NULL)
        return;
    u += keylen;
    while (u < end && *u == ' ')
        u++;
    int64_t v = 0;
    bool digits = false;
    for (; u < end && *u >= '0' && *u <= '9' && v < INT64_MAX / 10; u++, digits = true)
        v = v * 10 + (*u - '0');
    if (digits)
        *out = v;
}

void atc_record_marks_observe_bytes(struct atc_record_marks *m, const char *p, size_t len, bool streaming,
                                    uint64_t now_us)
{
#define KEY(s) s, sizeof(s) - 1
    const char *end = p + len;
    /* Events and the usage object seldom straddle two pieces; when they do, this undercounts. */
    for (const char *q = p; streaming && (q = memmem(q, (size_t)(end - q), "data:", 5)) != NULL; q += 5) {
        if (q == p || q[-1] == '\n') {
            m->events++;
            if (m->first_byte_us == 0)
                m->first_byte_us = now_us;
            if ((size_t)(end - q) >= 11 && memcmp(q + 5, " [DONE]", 7) == 0)
                m->done_event = true;
            /* vLLM puts finish_reason on the last content chunk; llama.cpp and others send it alone */
            const char *eol = memchr(q, '\n', (size_t)(end - q));
            size_t n = (size_t)((eol ? eol : end) - q);
            if (memmem(q, n, "\"delta\":{}", 10) || memmem(q, n, "\"text\":\"\"", 9))
                m->empty_events++;
        }
    }
    /* "usage" comes once, in the last chunk of a stream or the body of an answer; what follows its key
     * are its counts (vLLM, SGLang and TGI write them in this order; the details object after). */
    const char *u = memmem(p, len, "\"usage\"", 7);
    if (u != NULL) {
        usage_count(u, end, KEY("\"prompt_tokens\":"), &m->prompt_tokens);
        usage_count(u, end, KEY("\"completion_tokens\":"), &m->completion_tokens);
        usage_count(u, end, KEY("\"cached_tokens\":"), &m->cached_tokens);
    }
#undef KEY
}

void atc_record_marks_observe(struct atc_record_marks *m, const struct evbuffer *data, bool streaming,
                              uint64_t now_us)
{
    struct evbuffer_iovec vec[16];
    int n = evbuffer_peek((struct evbuffer *)data, -1, NULL, vec, 16);
    for (int i = 0; i < n && i < 16; i++)
        atc_record_marks_observe_bytes(m, vec[i].iov_base, vec[i].iov_len, streaming, now_us);
}

int64_t atc_record_marks_output_tokens(const struct atc_record_marks *m, bool chat)
{
    if (m->completion_tokens >= 0)
        return m->completion_tokens;
    if (m->events == 0)
        return -1;
    /* less the role event (chat), [DONE] and finish events without text */
    int64_t n = (int64_t)m->events - (m->done_event ? 1 : 0) - m->empty_events - (chat ? 1 : 0);
    return n > 0 ? n : 0;
}
