/* The value syntaxes of the config file and of the command lines (config_value.h): durations, sizes,
 * host:port and upstream URLs, and paths relative to the config file. */

#include "base/config_value.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *parse_hostport(const char *s, char **host, uint16_t *port);
static const char *parse_url(const char *s, char **host, uint16_t *port);

struct unit {
    const char *name;
    uint64_t scale;
};

static const struct unit duration_units[] = {
    {"us", 1}, {"ms", 1000}, {"s", 1000000}, {"m", 60000000}, {"h", 3600000000}, {NULL, 0},
};

static const struct unit size_units[] = {{"b", 1},
                                         {"kb", 1000},
                                         {"mb", 1000000},
                                         {"gb", 1000000000},
                                         {"tb", 1000000000000},
                                         {"kib", 1ull << 10},
                                         {"mib", 1ull << 20},
                                         {"gib", 1ull << 30},
                                         {"tib", 1ull << 40},
                                         {NULL, 0}};

/* "<digits>[.<digits>][ ]<unit>" → value * unit scale; a bare number uses @p plain. Only six decimals
 * count, which keeps frac * scale inside 64 bits for every unit above. */
static int parse_scaled(const char *s, const struct unit *units, uint64_t plain, uint64_t *out)
{
    uint64_t whole = 0, frac = 0, frac_scale = 1, scale = plain, v;
    const struct unit *u;

    if (!isdigit((unsigned char)*s))
        return -1;
    for (; isdigit((unsigned char)*s); s++) {
        unsigned d = (unsigned)(*s - '0');
        if (whole > (UINT64_MAX - d) / 10)
            return -1;
        whole = whole * 10 + d;
    }
    if (*s == '.') {
        if (!isdigit((unsigned char)*++s))
            return -1;
        for (; isdigit((unsigned char)*s); s++) {
            if (frac_scale < 1000000) {
                frac = frac * 10 + (uint64_t)(*s - '0');
                frac_scale *= 10;
            }
        }
    }
    while (*s == ' ')
        s++;
    if (*s) {
        for (u = units; u->name && strcasecmp(s, u->name); u++)
            ;
        if (!u->name)
            return -1;
        scale = u->scale;
    }
    if (whole > UINT64_MAX / scale)
        return -1;
    v = whole * scale;
    if (v > UINT64_MAX - frac * scale / frac_scale)
        return -1;
    *out = v + frac * scale / frac_scale;
    return 0;
}

int atc_parse_duration_us(const char *s, uint64_t *us)
{
    return parse_scaled(s, duration_units, 1000, us);
}

int atc_parse_duration_ms(const char *s, uint64_t *ms)
{
    uint64_t us;

    if (atc_parse_duration_us(s, &us) < 0)
        return -1;
    *ms = us / 1000 + (us % 1000 != 0);
    return 0;
}

int atc_parse_size(const char *s, size_t *bytes)
{
    uint64_t v;

    if (parse_scaled(s, size_units, 1, &v) < 0 || v > SIZE_MAX)
        return -1;
    *bytes = (size_t)v;
    return 0;
}

/* Splits "host:port", "[v6]:port", "host" or "[v6]" (URLs may leave the port out). *host is owned and
 * NULL when empty, *port -1 when absent. Returns NULL, or what is wrong. */
static const char *split_hostport(const char *s, size_t len, char **host, long *port)
{
    const char *end = s + len, *h = s, *hend, *c, *colon = NULL;
    long v = 0;

    *host = NULL;
    *port = -1;
    if (len > 0 && s[0] == '[') {
        if (!(hend = memchr(++h, ']', len - 1)))
            return "missing ']' after the IPv6 address";
        if (hend == h || strspn(h, "0123456789abcdefABCDEF:.") < (size_t)(hend - h))
            return "bad IPv6 address";
        if (hend + 1 < end && hend[1] != ':')
            return "expected ':' after ']'";
        colon = hend + 1 < end ? hend + 1 : NULL;
    } else {
        for (c = s; c < end; c++) {
            if (*c == ':' && colon)
                return "an IPv6 address must be written in brackets, as in [::1]:8080";
            if (*c == ':')
                colon = c;
            else if (!colon && !isalnum((unsigned char)*c) && *c != '.' && *c != '-' && *c != '_')
                return "bad character in the host name";
        }
        hend = colon ? colon : end;
    }
    if (colon) {
        if (colon + 1 == end)
            return "missing port number after ':'";
        for (c = colon + 1; c < end; c++) {
            if (!isdigit((unsigned char)*c) || (v = v * 10 + (*c - '0')) > 65535)
                return "the port must be a number from 0 to 65535";
        }
        *port = v;
    }
    if (hend > h && !(*host = strndup(h, (size_t)(hend - h))))
        return "out of memory";
    return NULL;
}

int atc_parse_hostport(const char *s, char **host, uint16_t *port, const char **err)
{
    const char *why = parse_hostport(s, host, port);
    if (err != NULL)
        *err = why;
    return why != NULL ? -1 : 0;
}

int atc_parse_url(const char *s, char **host, uint16_t *port, const char **err)
{
    const char *why = parse_url(s, host, port);
    if (err != NULL)
        *err = why;
    return why != NULL ? -1 : 0;
}

static const char *parse_hostport(const char *s, char **host, uint16_t *port)
{
    const char *why;
    char *h;
    long pt;

    if ((why = split_hostport(s, strlen(s), &h, &pt)))
        return why;
    if (pt < 0) {
        free(h);
        return "missing ':port' (expected host:port such as 127.0.0.1:8080 or [::1]:8080)";
    }
    if (!h && !(h = strdup("127.0.0.1")))
        return "out of memory";
    *host = h;
    *port = (uint16_t)pt;
    return NULL;
}

/* "http://host[:port][/]" → host and port (default 80). A base path is refused rather than ignored:
 * atc forwards the client's request path unchanged, so "/v1" here would silently not apply. */
static const char *parse_url(const char *s, char **host, uint16_t *port)
{
    const char *auth = s + 7, *end, *why;
    char *h;
    long pt;

    if (!strncasecmp(s, "https://", 8))
        return "https is not supported, use http:// (atc speaks plain HTTP to upstream servers; terminate "
               "TLS "
               "next to the server)";
    if (strncasecmp(s, "http://", 7))
        return "expected a URL of the form http://host:port";
    end = auth + strcspn(auth, "/?#");
    if (*end && strcmp(end, "/"))
        return "a path, query or fragment is not supported (atc forwards the client's request path)";
    if (memchr(auth, '@', (size_t)(end - auth)))
        return "user info in the URL is not supported";
    if ((why = split_hostport(auth, (size_t)(end - auth), &h, &pt)))
        return why;
    if (!h)
        return "missing host";
    if (pt == 0) {
        free(h);
        return "the port must be from 1 to 65535";
    }
    *host = h;
    *port = pt < 0 ? 80 : (uint16_t)pt;
    return NULL;
}

int atc_parse_redis_url(const char *s, char **host, uint16_t *port, unsigned *db, const char **err)
{
    const char *auth = s + 8, *end, *why = NULL;
    char *h = NULL;
    long pt = -1;

    *db = 0;
    if (strncasecmp(s, "redis://", 8))
        why = "expected a URL of the form redis://host:port/db";
    else if (memchr(auth, '@', (end = auth + strcspn(auth, "/")) - auth))
        why = "user info in the URL is not supported";
    else if ((why = split_hostport(auth, (size_t)(end - auth), &h, &pt)) == NULL && h == NULL)
        why = "missing host";
    else if (why == NULL && *end == '/' && end[1] != '\0') {
        char *stop;
        unsigned long d = strtoul(end + 1, &stop, 10);
        if (*stop != '\0' || d > 15 || !isdigit((unsigned char)end[1]))
            why = "the database must be a number from 0 to 15";
        *db = (unsigned)d;
    }
    if (why == NULL && pt == 0)
        why = "the port must be from 1 to 65535";
    if (why != NULL) {
        free(h);
        *err = why;
        return -1;
    }
    *host = h;
    *port = pt < 0 ? 6379 : (uint16_t)pt;
    return 0;
}

char *atc_config_path(const char *dir, const char *path)
{
    size_t n = strlen(dir);
    char *s;

    if (path[0] == '/' || n == 0)
        return strdup(path);
    if (asprintf(&s, "%s%s%s", dir, dir[n - 1] == '/' ? "" : "/", path) < 0)
        return NULL;
    return s;
}

int atc_parse_u64(const char *s, uint64_t *out)
{
    char *end;

    errno = 0;
    *out = strtoull(s, &end, 10);
    return !isdigit((unsigned char)*s) || *end || errno ? -1 : 0;
}

int atc_parse_real(const char *s, double *out)
{
    char *end;

    errno = 0;
    *out = strtod(s, &end);
    return end == s || *end || errno || !isfinite(*out) || isspace((unsigned char)*s) ? -1 : 0;
}

bool atc_parse_true(const char *s)
{
    return !strcasecmp(s, "true") || !strcasecmp(s, "yes") || !strcasecmp(s, "on");
}

bool atc_parse_false(const char *s)
{
    return !strcasecmp(s, "false") || !strcasecmp(s, "no") || !strcasecmp(s, "off");
}

bool atc_bare_number(const char *s)
{
    size_t n = strspn(s, "0123456789.");
    return n > 0 && s[n] == '\0' && strspn(s, "0.") != n;
}
