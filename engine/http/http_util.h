#ifndef ATC_HTTP_UTIL_H
#define ATC_HTTP_UTIL_H

/* Small helpers shared by the HTTP server module, the admin API and the relay. */

#include <stddef.h>

struct evbuffer;

/** Appends @p s (@p len bytes) to @p out as the inside of a JSON string (no quotes). */
void atc_json_escape(struct evbuffer *out, const char *s, size_t len);
/** Appends "key":"value" (escaped), or "key":null when @p value is NULL. */
void atc_json_key_string(struct evbuffer *out, const char *key, const char *value);

/** The reason phrase for @p status ("Bad Gateway"). */
const char *atc_http_reason(int status);

#endif
