#ifndef ATC_REPLAY_REPORT_H
#define ATC_REPLAY_REPORT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct atc_replay_result;
struct atc_replay_ideal;

/** The comparison as a terminal table, as JSON (the `ideal` object and the `policies` array), and as a
 * self-contained HTML page with SVG charts. @p title names the trace and the fleet. @p ideal (NULL: none,
 * as for a live replay) is the ideal fleet on the same trace and fleet (replay_ideal.h): a row of its own,
 * and each policy's TTFT p90 over its (`ttft_p90_vs_ideal`). */
void atc_replay_report_table(FILE *out, const char *title, const struct atc_replay_result *r, size_t n,
                             const struct atc_replay_ideal *ideal);
void atc_replay_report_json(FILE *out, const char *trace, const char *fleet, uint64_t seed,
                            const struct atc_replay_result *r, size_t n, const struct atc_replay_ideal *ideal);
/** The `policies` array alone, the ideal's object (null for NULL), and a JSON string (null for NULL): for
 * reports built around them. */
void atc_replay_report_json_policies(FILE *out, const struct atc_replay_result *r, size_t n,
                                     const struct atc_replay_ideal *ideal);
void atc_replay_report_json_ideal(FILE *out, const struct atc_replay_ideal *ideal);
/** @p r's TTFT p90 over @p ideal's; 0 when either is unknown (no ideal, a live replay). */
double atc_replay_vs_ideal(const struct atc_replay_result *r, const struct atc_replay_ideal *ideal);
void atc_replay_report_json_string(FILE *out, const char *s);
/** @p s escaped as HTML text. */
void atc_replay_report_html_text(FILE *out, const char *s);
int atc_replay_report_html(const char *path, const char *title, const struct atc_replay_result *r, size_t n,
                           const struct atc_replay_ideal *ideal, char **err);

#endif
