#ifndef ATC_TRACE_H
#define ATC_TRACE_H

/* Traces: requests as they arrived, for replaying them against policies and simulated fleets.
 *
 * The file format (version 1) is a stream of MessagePack objects:
 *
 *   1. a header map:  {"atc_trace": 1, "source": "record" | "mooncake" | "azure" | "jsonl",
 *                      "created": unix seconds (float), "atc": "0.1.0", "text": bool,
 *                      "start_unix_us": wall clock of at_us = 0 (recorded traces only)}
 *   2. one map per request, in arrival order, with these keys (every key but at_us is optional; an
 *      absent key takes the default in brackets; unknown keys are skipped, so later versions may add
 *      keys without breaking older readers):
 *        at_us          arrival, microseconds since the start of the trace
 *        id             request id [none]
 *        model          requested model [""]
 *        kind           "chat" | "completion" | "embedding" ["chat"]
 *        prompt_tokens  prompt length in tokens (an estimate for recorded traffic) [0]
 *        max_tokens     what the request asked for [absent]
 *        output_tokens  tokens the answer had [unknown]
 *        priority       0-9 [0];  tenant, session  [""];  stream  [false]
 *        block_tokens   tokens covered by one prefix block hash (64 for recorded traffic: 256 bytes of
 *                       prompt; 512 for Mooncake) [0 = no blocks]
 *        blocks         chained prefix block hashes (array of uint64: blocks[k] identifies the prompt's
 *                       first k+1 blocks, so two requests share a prefix exactly as far as their
 *                       leading hashes agree) [none]
 *        prompt         the prompt's raw JSON (messages / prompt / input), only with `record.text: true`
 *        headers        the request headers `record.headers` names, as a map of lower-case name ->
 *                       value (at most ATC_TRACE_HEADERS_MAX, values cut to ATC_TRACE_HEADER_VALUE_MAX
 *                       bytes) [none]; replay answers req:header(name) from it
 *      and for recorded live traffic, the decision and its outcome:
 *        endpoint       id of the endpoint that answered (the last one tried)
 *        policy_version policy version that decided (0: no policy, the C balancer)
 *        decision       "endpoint" | "queue" | "reject" | "fallback" (the policy failed: the built-in
 *                       balancer routed it) | "balancer" (no policy configured)
 *        reason         why a fallback fell back ("error", "overrun", "memory", "invalid_return"), or
 *                       a queue / reject verdict's message
 *        scores         what the policy attached with atc.explain: JSON text, an array of
 *                       {"endpoint", "score", "note"}
 *        shadow_version, shadow_decision, shadow_endpoint
 *                       the shadow policy's pick on the same request (policy.shadow), never acted on
 *        attempts       upstream attempts made
 *        status         HTTP status the client got (499: the client went away first)
 *        ttft_ms        time to the first byte of the answer's body, from the request's arrival
 *        total_ms       time to the end of the answer
 *
 * A version-1 reader refuses a header whose atc_trace is greater than 1. No prompt text is stored
 * unless asked for: block hashes are enough to replay prefix sharing. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "request/request_features.h"

#define ATC_TRACE_VERSION 1
#define ATC_TRACE_BLOCKS_MAX 65536     /* a record with more block hashes is refused as malformed */
#define ATC_TRACE_HEADERS_MAX 16       /* headers a record keeps (record.headers names at most this many) */
#define ATC_TRACE_HEADER_VALUE_MAX 256 /* bytes of a header's value kept; the rest is cut when recorded */

/* One recorded request header. */
struct atc_trace_field {
    const char *name; /* lower case */
    const char *value;
};

struct atc_trace_header {
    unsigned version;
    char source[32];        /* "record", "mooncake", "azure", "jsonl" */
    double created;         /* unix seconds */
    char atc_version[32];   /* of the atc that wrote it */
    bool text;              /* records may carry prompt text */
    uint64_t start_unix_us; /* wall clock of at_us = 0; 0 when unknown */
};

/* One request. Strings are never NULL when read ("" when absent) except id, prompt, endpoint and
 * decision, which are NULL when absent. */
struct atc_trace_record {
    uint64_t at_us;
    const char *id;
    const char *model;
    enum atc_request_kind kind;
    uint32_t prompt_tokens;
    int64_t max_tokens;    /* -1: absent */
    int64_t output_tokens; /* -1: unknown */
    int priority;
    const char *tenant;
    const char *session;
    bool stream;
    uint32_t block_tokens;
    const uint64_t *blocks;
    size_t nblocks;
    const char *prompt;
    size_t prompt_len;
    const struct atc_trace_field *headers; /* the headers record.headers named that the request had */
    size_t nheaders;

    const char *endpoint;
    uint64_t policy_version;
    const char *decision;
    const char *reason; /* NULL: none */
    const char *scores; /* JSON text; NULL: none */
    uint64_t shadow_version; /* 0: no shadow ran */
    const char *shadow_decision, *shadow_endpoint; /* NULL: none */
    unsigned attempts;
    int status;      /* 0: unknown */
    double ttft_ms;  /* < 0: unknown */
    double total_ms; /* < 0: unknown */
};

/** A record with every field at its "absent" value. */
void atc_trace_record_init(struct atc_trace_record *r);

/* A growable byte buffer that encoders append to. */
struct atc_trace_buf {
    char *data;
    size_t len, cap;
};

/** Appends the MessagePack encoding of @p h (with version ATC_TRACE_VERSION) / of @p r to @p out.
 * Returns 0, or -1 when memory ran out (out->len is then unchanged). */
int atc_trace_encode_header(struct atc_trace_buf *out, const struct atc_trace_header *h);
int atc_trace_encode_record(struct atc_trace_buf *out, const struct atc_trace_record *r);

/* ---- reading a file record by record ---- */

struct atc_trace_reader;

/** Opens @p path and reads its header into @p h. Returns the reader, or NULL with an owned message in
 * *err ("PATH: not an atc trace (...)", "PATH: trace format version 2 is newer than this atc's (1)"). */
struct atc_trace_reader *atc_trace_open(const char *path, struct atc_trace_header *h, char **err);

/** Reads the next record into @p r; its strings and blocks are borrowed until the next call.
 * Returns 1, 0 at the end, or -1 with an owned message in *err naming the record's number and byte
 * offset (a truncated last record, as a crash leaves, is such an error). */
int atc_trace_read(struct atc_trace_reader *rd, struct atc_trace_record *r, char **err);

/** Closes the reader. NULL is fine. */
void atc_trace_close(struct atc_trace_reader *rd);

/* ---- a whole trace in memory ---- */

struct atc_trace {
    struct atc_trace_header header;
    struct atc_trace_record *records; /* in arrival order; strings and blocks owned by the trace */
    size_t n;
    size_t cap;
    struct trace_arena *arena;
};

/** An empty trace with @p source in its header. Returns NULL when memory runs out. */
struct atc_trace *atc_trace_new(const char *source);
/** Appends a copy of @p r (strings and blocks copied). Returns 0 or -1 (out of memory). */
int atc_trace_append(struct atc_trace *t, const struct atc_trace_record *r);
/** Sorts the records by arrival (stable) and shifts times so that the first arrives at 0. 0 or -1 (out
 * of memory: the trace is unchanged). */
int atc_trace_normalize(struct atc_trace *t);
void atc_trace_free(struct atc_trace *t);

/** Writes @p t to @p path (header, then every record). Returns 0, or -1 with an owned message. */
int atc_trace_save(const struct atc_trace *t, const char *path, char **err);

/** The value of recorded header @p name in @p r (case-insensitive), or NULL. */
const char *atc_trace_record_header(const struct atc_trace_record *r, const char *name);

/** Writes @p r as one JSON object on one line (the keys of the format above). */
void atc_trace_record_json(FILE *out, const struct atc_trace_record *r);

/* ---- helpers for the importers (trace_import.c) ---- */

/** The chained 64-bit hash for block @p id after the chain value @p prev (0 for the first block). */
uint64_t atc_trace_chain(uint64_t prev, uint64_t id);

#endif
