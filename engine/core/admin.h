#ifndef ATC_ADMIN_H
#define ATC_ADMIN_H

/* The admin API on its own port (loopback by default): endpoint state as JSON, atc's own health. */

struct atc_http_req;

/** The admin port's request handler (an atc_http_handler); @p arg is the struct atc_server. */
void atc_admin_handle(struct atc_http_req *req, void *arg);

#endif
