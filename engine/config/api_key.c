/* Loading the servers' keys (api_key.h). */

#include "config/api_key.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/config_value.h"

/* A key goes into an HTTP header line: printable ASCII without spaces. */
static bool key_ok(const char *s)
{
    for (; *s; s++)
        if (*s <= ' ' || *s >= 0x7f)
            return false;
    return true;
}

/* The first line of file @p path, without its end. */
static char *read_first_line(const char *path, const char **why)
{
    char buf[4096];
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        *why = strerror(errno);
        return NULL;
    }
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    buf[strcspn(buf, "\r\n")] = '\0';
    char *line = strdup(buf);
    explicit_bzero(buf, sizeof buf);
    *why = NULL;
    return line;
}

char *atc_api_key_load(const char *dir, bool from_file, const char *name, const char **why)
{
    char *key = NULL;
    *why = NULL;
    if (!from_file) {
        const char *v = getenv(name);
        if (v == NULL || *v == '\0') {
            *why = "is not set in atc's environment (or is empty)";
            return NULL;
        }
        key = strdup(v);
    } else {
        char *path = atc_config_path(dir, name);
        if (path != NULL)
            key = read_first_line(path, why);
        free(path);
        if (key != NULL && key[0] == '\0')
            *why = "its first line is empty";
    }
    if (key != NULL && *why == NULL && !key_ok(key))
        *why = "the key has spaces or control characters";
    if (*why != NULL) {
        atc_api_key_free(key);
        return NULL;
    }
    return key;
}

void atc_api_key_free(char *key)
{
    if (key != NULL)
        explicit_bzero(key, strlen(key));
    free(key);
}
