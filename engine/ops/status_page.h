#ifndef ATC_STATUS_PAGE_H
#define ATC_STATUS_PAGE_H

/* The status page the admin port serves at GET / (ops/status_page.html, one self-contained file: its CSS
 * and script inline, nothing fetched from elsewhere). The build embeds the file as these bytes
 * (cmake/embed.cmake); there is no status_page.c in the tree. */

#include <stddef.h>

extern const unsigned char atc_status_page_html[];
extern const size_t atc_status_page_html_len;

#endif
