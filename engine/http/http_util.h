#ifndef ATC_HTTP_UTIL_H
#define ATC_HTTP_UTIL_H

/* Small helpers shared by the HTTP front, the admin API and the relay. */

#include <stddef.h>

struct evbuffer;
struct evhttp_request;

/** Appends @p s (@p len bytes) to @p out as the inside of a JSON string (no quotes). */
void atc_json_escape(struct evbuffer *out, const char *s, size_t len);

/** Answers @p req with an OpenAI-style error body {"error": {"message", "type", "param", "code"}}.
 * @p code is the machine-readable string ("model_not_found"; NULL: "error"); @p retry_after_s > 0 adds a
 * Retry-After header. */
void atc_http_send_error(struct evhttp_request *req, int status, const char *type, const char *code,
                         const char *message, int retry_after_s);

/** Answers @p req with status 200 and the JSON in @p body (taken: drained). */
void atc_http_send_json(struct evhttp_request *req, int status, struct evbuffer *body);

/** The reason phrase for @p status ("Bad Gateway"). */
const char *atc_http_reason(int status);

#endif
