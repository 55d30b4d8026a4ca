#ifndef ATC_CONFIG_ERRORS_H
#define ATC_CONFIG_ERRORS_H

/* The errors of one config file, collected while the whole file is walked (so that one run of
 * `atc check` lists every mistake) and handed over sorted by position, one per line, each as
 * "file:line:col: key 'x': reason". Also how a YAML node reads in such a message. */

#include <stdbool.h>
#include <stddef.h>

#include <yaml.h>

struct atc_config_error {
    size_t line, col, seq; /* seq keeps errors at one position in the order they were found */
    char *text;            /* owned */
};

struct atc_config_errors {
    const char *name; /* the file name in messages (borrowed) */
    struct atc_config_error *v;
    size_t n, cap;
    bool oom; /* some message could not be kept: "out of memory" is added when joined */
};

/** Records "file:line:col: key '@p key': message" (no key part when @p key is NULL or empty); libyaml
 * marks are 0-based, messages 1-based. Control characters in the message are escaped. */
void atc_config_report(struct atc_config_errors *e, yaml_mark_t at, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/** Records libyaml's syntax error of @p y (or marks @p e out of memory). */
/** A formatted message in a new string the caller frees; NULL when out of memory. */
char *atc_config_format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

void atc_config_report_syntax(struct atc_config_errors *e, const yaml_parser_t *y);

/** True when anything was recorded (or memory ran out). */
bool atc_config_errors_any(const struct atc_config_errors *e);

/** Every error sorted by position and joined by newlines: an owned string (NULL when out of memory).
 * Frees what @p e holds; it is empty afterwards. */
char *atc_config_errors_join(struct atc_config_errors *e);

/** An empty value ("key:" with nothing after it) is a plain null scalar; it means "not set". */
bool atc_yaml_is_null(const yaml_node_t *n);

/** How @p n reads in a message: a scalar quoted (shortened, control characters hidden) in @p buf, else
 * its kind ("a mapping", "a list", "nothing"). Returns @p buf or a static string. */
const char *atc_yaml_describe(const yaml_node_t *n, char *buf, size_t size);

#endif
