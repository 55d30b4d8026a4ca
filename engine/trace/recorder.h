#ifndef ATC_RECORDER_H
#define ATC_RECORDER_H

/* The recorder (config `record:`): live traffic written to trace files (trace.h) without blocking the
 * event loop. The loop encodes each finished request into a memory buffer (a few hundred bytes, no
 * I/O); a writer thread takes the buffer every 200 ms (sooner when it fills) and appends it to the
 * current file, starting a new one past rotate_size bytes or rotate_interval. When the buffer is full
 * (the disk is slower than the traffic) records are dropped and counted; when a file cannot be
 * created or written (a full disk, an unwritable directory) the batch is dropped, the error counted and
 * logged (at most once a minute), and the next batch tries a new file. Routing never waits for it and
 * never fails because of it.
 *
 * Files: DIR/PREFIX-YYYYMMDDTHHMMSSZ-N.atct, each a complete trace (header, then records); the records
 * of one recorder share one time base (at_us since the recorder started, start_unix_us in every header),
 * so the files of a run can be read one after another as one trace. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct atc_trace_field;
struct atc_trace_record;
struct evbuffer;

struct atc_recorder_settings {
    const char *dir;
    const char *prefix;
    size_t rotate_size;
    uint64_t rotate_interval_ms;
    bool text;                  /* keep prompt text (the record's prompt field) */
    size_t buffer;              /* bytes of records waiting for the writer, at most */
    double sample;              /* share of requests recorded */
    const char *const *headers; /* request headers each record keeps (record.headers), at most 16 */
    size_t nheaders;
};

struct atc_recorder_stats {
    uint64_t recorded;     /* records handed to the writer */
    uint64_t written;      /* records in files */
    uint64_t dropped;      /* lost: the buffer was full, or their batch could not be written */
    uint64_t sampled_out;  /* not recorded because of record.sample */
    uint64_t write_errors; /* files that could not be created or written */
    uint64_t files;        /* files started */
    uint64_t bytes;        /* bytes written */
};

struct atc_recorder;

/** Starts the writer thread. Creates nothing on disk until the first record (an unwritable directory
 * is then logged and counted, not fatal). Strings are copied. Returns NULL when memory or a thread
 * cannot be had. */
struct atc_recorder *atc_recorder_create(const struct atc_recorder_settings *s);

/** Writes what is buffered, stops the thread and frees the recorder. NULL is fine. */
void atc_recorder_destroy(struct atc_recorder *rec);

/** From the event loop: records @p r (copied; its at_us is ignored and @p arrival_unix_us used). Never
 * blocks on I/O. */
void atc_recorder_add(struct atc_recorder *rec, const struct atc_trace_record *r, uint64_t arrival_unix_us);

/** From any thread (the names are fixed at creation): the record.headers of request @p ctx that
 * @p find answers (a lookup by name, as evhttp_find_header), packed in one owned block of "name\0value\0"
 * pairs (values cut to ATC_TRACE_HEADER_VALUE_MAX bytes) with their count in *n; NULL when the request
 * has none of them, none are configured, or memory ran out. The caller frees it. */
char *atc_recorder_capture(const struct atc_recorder *rec, const char *(*find)(void *ctx, const char *name),
                           void *ctx, size_t *n);

/** Points @p out[0..n) into @p block (from atc_recorder_capture, borrowed), for a record's headers. */
void atc_recorder_fields(const char *block, size_t n, struct atc_trace_field *out);

/** True when records should carry prompt text. */
bool atc_recorder_text(const struct atc_recorder *rec);

void atc_recorder_stats(struct atc_recorder *rec, struct atc_recorder_stats *st);

/* What the relay notes about an answer as it passes, for its record. */
struct atc_record_marks {
    /* monotonic; the first token: the first "data:" line of a stream (the relay sets it when that event
     * is whole); 0 until then, and for an answer that is not streamed (its first token is not seen) */
    uint64_t first_byte_us;
    uint32_t events;           /* SSE "data:" events relayed */
    bool done_event;           /* the stream ended with data: [DONE] */
    /* from a usage object in the answer (the last chunk of a stream, a JSON body's "usage"), -1 if none
     * seen: prompt_tokens, completion_tokens, prompt_tokens_details.cached_tokens */
    int64_t prompt_tokens, completion_tokens, cached_tokens;
    uint32_t empty_events; /* events with no text ("delta":{} or "text":""): a finish chunk of its own */
};

/** Resets @p m (before the first attempt). */
void atc_record_marks_init(struct atc_record_marks *m);

/** Notes the answer bytes in @p data (not consumed) at monotonic time @p now_us: when @p streaming, the
 * time of the first "data:" line and the SSE events; a usage object's counts. */
void atc_record_marks_observe(struct atc_record_marks *m, const struct evbuffer *data, bool streaming,
                              uint64_t now_us);
/** The same for the @p len bytes at @p data (borrowed). */
void atc_record_marks_observe_bytes(struct atc_record_marks *m, const char *data, size_t len, bool streaming,
                                    uint64_t now_us);

/** Output tokens an answer had, as far as the marks tell: the usage object's count, else for a chat
 * stream its content events (role and finish events and [DONE] not counted; an estimate, since a server
 * may pack several tokens in one event); -1 when unknown. */
int64_t atc_record_marks_output_tokens(const struct atc_record_marks *m, bool chat);

#endif
