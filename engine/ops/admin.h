#ifndef ATC_ADMIN_H
#define ATC_ADMIN_H

/* The admin API on its own port (loopback by default): endpoint state as JSON, atc's own health. */

struct evhttp_request;

/** evhttp generic callback of the admin server; @p arg is the struct atc_server. */
void atc_admin_handle(struct evhttp_request *req, void *arg);

#endif
