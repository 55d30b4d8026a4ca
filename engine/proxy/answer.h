#ifndef ATC_ANSWER_H
#define ATC_ANSWER_H

/* What the relay makes of a server's answer before the client sees it: the server's headers that pass
 * on, error bodies in OpenAI's shape, and whether a stream's first event is an error. Pure functions
 * over bytes (no relay, no sockets), so that each is tested alone (tests/unit/test_relay.c). */

#include <stdbool.h>
#include <stddef.h>

struct evbuffer;

/** Copies to @p dst the lines of @p src ("Name: value\r\n", @p len bytes: the upstream's end-to-end
 * headers) but those atc writes itself: Date, x-request-id, x-atc-*, and Cache-Control when
 * @p event_stream (atc sets no-cache). @p dst has room for @p len + 1 bytes; it is NUL-terminated.
 * Returns the bytes copied. */
size_t atc_answer_pass_headers(char *dst, const char *src, size_t len, bool event_stream);

/** An error answer's body (@p status >= 400, @p len bytes) in OpenAI's shape,
 * {"error":{"message":..,"type":..,"param":null,"code":..}}, appended to @p out. A body of that shape
 * already is left alone (returns false, nothing appended); TGI's {"error":"msg","error_type":"x"}, any
 * other JSON and plain text are rewritten (returns true): the message is TGI's "error" string (or
 * "message", else the body's text, cut), the type follows the status, the code is TGI's error_type. */
bool atc_answer_error_body(struct evbuffer *out, int status, const char *body, size_t len);

/* Room for atc_answer_unknown_model's message with the longest model name a request may carry. */
#define ATC_ANSWER_UNKNOWN_MODEL_MAX 400

/** The message of the 404 (code "model_not_found") for @p model, which nothing serves, into @p buf
 * (@p size bytes, NUL-terminated, cut to fit); returns @p buf. One text whether the front answers it (no
 * policy) or the relay does (the policy fell back). */
const char *atc_answer_unknown_model(char *buf, size_t size, const char *model);

/** Whether the first "data:" event among the @p len held bytes of an event stream is an error (a JSON
 * object with an "error" member, as vLLM and TGI send one in a stream). When its error is not
 * OpenAI-shaped, the held bytes with that event rewritten (atc_answer_error_body) go to @p rewritten,
 * and *rewrote is set. */
bool atc_answer_first_event_error(const char *held, size_t len, struct evbuffer *rewritten, bool *rewrote);

#endif
