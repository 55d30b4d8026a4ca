#ifndef ATC_HTTP_UTIL_H
#define ATC_HTTP_UTIL_H

/* What an HTTP answer needs beside its body (the JSON writer is base/json.h). */

#include <stddef.h>

/** The reason phrase for @p status ("Bad Gateway"). */
const char *atc_http_reason(int status);

#endif
