#ifndef ATC_TRACE_IMPORT_H
#define ATC_TRACE_IMPORT_H

/* Loading traces of any format into memory: atc traces (a file or a recording's directory) through
 * trace.h's reader, and the public text formats (Mooncake, Azure, JSON lines) parsed here. */

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct atc_trace;

/* What atc_trace_load and the importers read. */
enum atc_trace_format {
    ATC_TRACE_AUTO,     /* by content: an atc trace, else by the file name (.csv: azure, else jsonl) */
    ATC_TRACE_NATIVE,   /* the format above */
    ATC_TRACE_MOONCAKE, /* JSON lines: timestamp (ms), input_length, output_length, hash_ids */
    ATC_TRACE_AZURE,    /* CSV: TIMESTAMP, ContextTokens, GeneratedTokens; or BurstGPT's Timestamp (s),
                         * Request tokens, Response tokens (the header says which) */
    ATC_TRACE_JSONL,    /* JSON lines with this format's record keys (what `atc trace dump` prints) */
    ATC_TRACE_QWEN,     /* JSON lines: chat_id, parent_chat_id, timestamp (s), input_length, output_length,
                         * hash_ids (16 tokens each): Alibaba's qwen-bailian-usagetraces-anon */
};

struct atc_trace_import_options {
    enum atc_trace_format format;
    const char *model;     /* model of records that name none (default "llama-3-8b") */
    uint32_t block_tokens; /* tokens per hash id (default: Mooncake's 512, Qwen's 16) */
    size_t max_errors;     /* give up after this many malformed lines (default 100; 0 = default) */
    FILE *errors;          /* where malformed lines are reported as PATH:LINE: reason (NULL: not shown) */
};

/** Parses "mooncake", "qwen", "azure", "jsonl", "atc" / "native", "auto"; -1 when unknown. */
int atc_trace_format_parse(const char *name, enum atc_trace_format *out);

/** Loads @p path whole. Malformed lines of text formats are reported (see options), counted in
 * *bad_lines (may be NULL) and skipped; more than max_errors of them, an unreadable file or a broken
 * atc trace fail the load. Records come out normalized (sorted, first at 0). Returns 0 and an owned
 * trace in *out, or -1 and an owned message in *err. */
int atc_trace_load(const char *path, const struct atc_trace_import_options *o, struct atc_trace **out,
                   size_t *bad_lines, char **err);

/** Reads a text trace (mooncake, azure, jsonl) into @p t. Same contract as atc_trace_load. */
int atc_trace_import_text(const char *path, const struct atc_trace_import_options *o, struct atc_trace *t,
                          size_t *bad_lines, char **err);

#endif
