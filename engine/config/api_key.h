#ifndef ATC_API_KEY_H
#define ATC_API_KEY_H

/* The keys atc sends to the servers it fronts (api_key_env: / api_key_file:), read when the config is.
 * A key is a secret: it is kept in memory only, wiped when freed, and never printed. */

#include <stdbool.h>

/** The key named by @p name: the environment variable @p name, or (@p from_file) the first line of
 * the file @p name, relative to @p dir. Returns an owned key (free it with atc_api_key_free), or NULL
 * with why not in *why (a static string; NULL when memory ran out). */
char *atc_api_key_load(const char *dir, bool from_file, const char *name, const char **why);

/** Wipes and frees @p key; NULL is fine. */
void atc_api_key_free(char *key);

#endif
