#ifndef ATC_HTTP_FRONT_H
#define ATC_HTTP_FRONT_H

/* The OpenAI-compatible front door: routes, body limits, request features, OpenAI-style errors. */

struct atc_http_req;

/** The front port's request handler (an atc_http_handler); @p arg is the struct atc_worker it serves on. */
void atc_http_front_handle(struct atc_http_req *req, void *arg);
/** The server refused a request before the front saw it (http_server.h on_refused): counted and logged. */
void atc_http_front_refused(void *arg, int status, const char *code, const char *message);

#endif
