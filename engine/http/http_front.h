#ifndef ATC_HTTP_FRONT_H
#define ATC_HTTP_FRONT_H

/* The OpenAI-compatible front door: routes, body limits, request features, OpenAI-style errors. */

struct evhttp_request;

/** evhttp generic callback of the front server; @p arg is the struct atc_worker it serves on. */
void atc_http_front_handle(struct evhttp_request *req, void *arg);

#endif
