#ifndef ATC_REPLAY_REPORT_H
#define ATC_REPLAY_REPORT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct atc_replay_result;

/** The comparison as a terminal table, as JSON (the `policies` array), and as a
 * self-contained HTML page with SVG charts. @p title names the trace and the fleet. */
void atc_replay_report_table(FILE *out, const char *title, const struct atc_replay_result *r, size_t n);
void atc_replay_report_json(FILE *out, const char *trace, const char *fleet, uint64_t seed,
                            const struct atc_replay_result *r, size_t n);
/** The `policies` array alone, and a JSON string (null for NULL): for reports built around them. */
void atc_replay_report_json_policies(FILE *out, const struct atc_replay_result *r, size_t n);
void atc_replay_report_json_string(FILE *out, const char *s);
/** @p s escaped as HTML text. */
void atc_replay_report_html_text(FILE *out, const char *s);
int atc_replay_report_html(const char *path, const char *title, const struct atc_replay_result *r, size_t n,
                           char **err);

#endif
