/* Reading a config file whole and handing it to the YAML walk (config.c); declared in config.h. Apart
 * from config.c so that the walk stays one file under the size the layout allows. */

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"

/* "PATH: WHAT: REASON" (REASON may be NULL), owned; NULL when out of memory. */
static char *file_error(const char *path, const char *what, const char *reason)
{
    size_t n = strlen(path) + strlen(what) + (reason ? strlen(reason) : 0) + 8;
    char *s = malloc(n);
    if (s != NULL)
        snprintf(s, n, "%s: %s%s%s", path, what, reason ? ": " : "", reason ? reason : "");
    return s;
}

static int load_file(const char *path, struct atc_config **out, char **errors, bool keep_partial)
{
    FILE *f;
    char *text = NULL, *dir = NULL, *slash;
    size_t len = 0, cap = 0, n;
    int rc = -1;

    *out = NULL;
    *errors = NULL;
    if (!(f = fopen(path, "rb"))) {
        *errors = file_error(path, "cannot open", strerror(errno));
        return -1;
    }
    do {
        if (cap - len < 4096) {
            char *t = realloc(text, cap = cap ? cap * 2 : 16384);
            if (!t) {
                *errors = file_error(path, "out of memory", NULL);
                goto error;
            }
            text = t;
        }
        len += n = fread(text + len, 1, cap - len, f);
    } while (n > 0);
    if (ferror(f)) {
        *errors = file_error(path, "cannot read", strerror(errno));
        goto error;
    }
    slash = strrchr(path, '/');
    dir = !slash ? strdup(".") : slash == path ? strdup("/") : strndup(path, (size_t)(slash - path));
    if (!dir) {
        *errors = file_error(path, "out of memory", NULL);
        goto error;
    }
    rc = keep_partial ? atc_config_parse_partial(text, len, path, dir, out, errors)
                      : atc_config_parse(text, len, path, dir, out, errors);
error:
    fclose(f);
    free(text);
    free(dir);
    return rc;
}

int atc_config_load(const char *path, struct atc_config **out, char **errors)
{
    return load_file(path, out, errors, false);
}

int atc_config_load_partial(const char *path, struct atc_config **out, char **errors)
{
    return load_file(path, out, errors, true);
}
