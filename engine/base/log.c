#include "base/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static enum atc_log_level min_level = ATC_LOG_INFO;
static int level_from_env = -1;

static const char *const level_names[] = {"debug", "info", "warn", "error"};

void atc_log_set_level(enum atc_log_level level)
{
    min_level = level;
}

static void read_env_level(void)
{
    const char *env = getenv("ATC_LOG");
    level_from_env = 0;
    if (env == NULL)
        return;
    for (int i = 0; i < 4; i++)
        if (strcasecmp(env, level_names[i]) == 0)
            min_level = (enum atc_log_level)i;
}

void atc_log_write(enum atc_log_level level, const char *file, int line, const char *fmt, ...)
{
    if (level_from_env < 0)
        read_env_level();
    if (level < min_level)
        return;

    /* Log the path relative to the source tree: "engine/x.c", not the build machine's absolute path. */
    const char *rel = strstr(file, "engine/");
    if (rel != NULL)
        file = rel;

    char buf[2048];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s:%d: ", tm.tm_year + 1900,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
                     level_names[level], file, line);
    if (n < 0 || (size_t)n >= sizeof(buf))
        return;
    char msg[1536];
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (m < 0)
        return;
    /* One event, one line: control characters in the message (a policy's atc.log text or error, a
     * client's header) are shown escaped, so that none forges a line or reaches a terminal raw. */
    static const char hex[] = "0123456789abcdef";
    for (const unsigned char *p = (const unsigned char *)msg; *p != '\0' && (size_t)n < sizeof(buf) - 5; p++) {
        if (*p >= 0x20 && *p != 0x7f) {
            buf[n++] = (char)*p;
        } else if (*p == '\n' || *p == '\t' || *p == '\r') {
            buf[n++] = '\\';
            buf[n++] = *p == '\n' ? 'n' : *p == '\t' ? 't' : 'r';
        } else {
            buf[n++] = '\\';
            buf[n++] = 'x';
            buf[n++] = hex[*p >> 4];
            buf[n++] = hex[*p & 15];
        }
    }
    buf[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, buf, (size_t)n);
    (void)w;
}
