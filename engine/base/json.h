#ifndef ATC_JSON_H
#define ATC_JSON_H

/* Reading small JSON documents with jsmn (strict mode): admin API answers (`atc status`), servers'
 * model lists and probe answers (health), trace lines (trace_import). A document is parsed into tokens
 * once; values are then named by token index (0 is the top value; -1 is "none", which every function
 * takes and answers with "not found" / false). The request path has its own scanner
 * (request/request_features.c), which checks more and allocates nothing per request. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define ATC_JSON_MAX_DEPTH 64 /* deeper documents are refused before jsmn sees them (see json.c) */

enum atc_json_type {
    ATC_JSON_NONE, /* no such token (index -1 or past the end) */
    ATC_JSON_OBJECT,
    ATC_JSON_ARRAY,
    ATC_JSON_STRING,
    ATC_JSON_PRIMITIVE, /* a number, true, false or null */
};

/* One parsed document. Zero-initialize before the first atc_json_parse; parse again to reuse the
 * token array (trace_import parses millions of lines with one); atc_json_dispose frees it. */
struct atc_json {
    const char *js; /* the text of the last parse (borrowed: it must outlive the lookups) */
    size_t len;
    void *tokens; /* jsmntok_t[cap], owned */
    unsigned cap;
    int n; /* tokens of the last parse */
};

/** Tokenizes @p len bytes of @p js, which must hold exactly one JSON value (surrounding white space
 * aside). Returns 0, or -1 with a static reason in *err ("invalid JSON", "JSON nested too deeply",
 * "out of memory"); @p err may be NULL. */
int atc_json_parse(struct atc_json *j, const char *js, size_t len, const char **err);

/** Frees the tokens; @p j may be parsed again afterwards. */
void atc_json_dispose(struct atc_json *j);

enum atc_json_type atc_json_type(const struct atc_json *j, int i);

/** Members of the object or items of the array at @p i (0 for anything else). */
int atc_json_count(const struct atc_json *j, int i);

/** The index just past the value at @p i and everything nested in it: the next item of an array, or
 * (from a key) the next key of an object. Never past the last token. */
int atc_json_next(const struct atc_json *j, int i);

/** The value of member @p key of the object at @p obj, or -1. */
int atc_json_get(const struct atc_json *j, int obj, const char *key);

/** True when the token at @p i is the string @p s (as written: escapes are not decoded). */
bool atc_json_is(const struct atc_json *j, int i, const char *s);

/** The token's text as written in the document (a string without its quotes) and its length in
 * *len; NULL (and *len 0) when there is no token @p i. Borrowed from the document. */
const char *atc_json_raw(const struct atc_json *j, int i, size_t *len);

/** Decodes the string at @p i into @p out (at most @p size - 1 bytes, NUL-terminated; \uXXXX beyond
 * ASCII becomes UTF-8) and its length into *len (may be NULL). Returns 0, or -1 when it is not a
 * string, does not fit or has a bad escape. At most 3 bytes of @p out per byte of the token. */
int atc_json_string(const struct atc_json *j, int i, char *out, size_t size, size_t *len);

/** A finite number. */
bool atc_json_number(const struct atc_json *j, int i, double *out);

/** A whole number in [0, @p max], written without sign, fraction or exponent: exact up to 2^64 - 1. */
bool atc_json_uint(const struct atc_json *j, int i, uint64_t max, uint64_t *out);

/** true or false. */
bool atc_json_bool(const struct atc_json *j, int i, bool *out);

struct evbuffer;

/** Appends @p s (@p len bytes) to @p out as the inside of a JSON string (no quotes); bytes that are not
 * well-formed UTF-8 become U+FFFD. */
void atc_json_escape(struct evbuffer *out, const char *s, size_t len);
/** Appends NUL-terminated @p s to @p out as a JSON string, quotes included (escaped as above). */
void atc_json_write_string(struct evbuffer *out, const char *s);
/** Writes @p s (@p len bytes) to @p out as a JSON string, quotes included (escaped as above). */
void atc_json_fwrite_string(FILE *out, const char *s, size_t len);
/** Appends "key":"value" (escaped), or "key":null when @p value is NULL. */
void atc_json_key_string(struct evbuffer *out, const char *key, const char *value);

#endif
