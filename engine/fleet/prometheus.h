#ifndef ATC_PROMETHEUS_H
#define ATC_PROMETHEUS_H

/* A parser of the Prometheus text exposition format (version 0.0.4, and the OpenMetrics text that
 * inference servers actually serve): what atc reads from each server's /metrics.
 *
 * Accepted: "# HELP name text" and "# TYPE name type" lines (checked), other "#" comments (ignored),
 * blank lines, "# EOF" (the end), and samples
 *
 *     name{label="value",...} value [timestamp]
 *
 * with label values escaped as \\ \" \n, an optional trailing comma in the label set, values as Go
 * writes them (1, -2.5e-3, NaN, +Inf, -Inf, Inf) and an optional integer timestamp in milliseconds.
 * Prometheus 3's quoted names are accepted too: {"name.with.dots", "label.x"="v"} value.
 * Lines may end in \n or \r\n. Anything else is malformed: the parse stops and says where and why. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct atc_prom_label {
    const char *name; /* borrowed, not NUL-terminated: use the lengths */
    size_t name_len;
    const char *value; /* unescaped */
    size_t value_len;
};

struct atc_prom_sample {
    const char *name; /* borrowed, not NUL-terminated */
    size_t name_len;
    const struct atc_prom_label *labels;
    size_t nlabels;
    double value; /* may be NaN or ±infinity */
    bool has_timestamp;
    int64_t timestamp_ms;
};

/** Called for each sample; everything in @p s is valid during the call only. Return 0 to go on, any
 * other value to stop the parse (atc_prom_parse then returns it). */
typedef int (*atc_prom_on_sample)(void *arg, const struct atc_prom_sample *s);

struct atc_prom_error {
    size_t line;     /* 1-based */
    const char *msg; /* static */
};

/** Parses the @p len bytes of @p text (NUL bytes are malformed), calling @p on_sample for each
 * sample in order. Returns 0 when the page was well-formed to its end; -1 with @p err filled when it
 * was not (samples before the bad line have been reported); or the callback's nonzero value. Never
 * reads outside @p text; allocates only scratch space, freed before it returns (-1 with msg
 * "out of memory" if that fails). */
int atc_prom_parse(const char *text, size_t len, atc_prom_on_sample on_sample, void *arg,
                   struct atc_prom_error *err);

/** True when label @p name of @p s exists and equals @p value (NUL-terminated). */
bool atc_prom_label_is(const struct atc_prom_sample *s, const char *name, const char *value);

/** Whether @p s is named @p name (NUL-terminated). */
bool atc_prom_name_is(const struct atc_prom_sample *s, const char *name);

#endif
