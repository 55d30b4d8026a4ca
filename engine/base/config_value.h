#ifndef ATC_CONFIG_VALUE_H
#define ATC_CONFIG_VALUE_H

/* The syntaxes of single values, shared by the config file (config.c) and the command lines. */

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>

/** A whole decimal number (digits only) into *out; 0, or -1 when @p s is not one or overflows. */
int atc_parse_u64(const char *s, uint64_t *out);
/** A finite number into *out; 0, or -1 when @p s is not one (no leading space, nothing after it). */
int atc_parse_real(const char *s, double *out);
/** YAML 1.1's spellings of true (true/yes/on) and of false (false/no/off), any case. */
bool atc_parse_true(const char *s);
bool atc_parse_false(const char *s);
/** A number without a unit, other than 0 (which is 0 in any unit). Durations and sizes need one in the
 * config: `connect_timeout: 2` meant 2 ms, where its reader saw 2 s. */
bool atc_bare_number(const char *s);

/** "250ms", "2s", "1m", "1h", "1500us", "1.5s", plain integer = ms. Returns 0 and *ms, or -1. A duration
 * below a millisecond rounds up ("1500us" is 2 ms), so a non-zero value never becomes 0. */
int atc_parse_duration_ms(const char *s, uint64_t *ms);
/** The same syntax in microseconds, for settings finer than a millisecond (policy.budget: "500us"). */
int atc_parse_duration_us(const char *s, uint64_t *us);
/** "8MiB", "512KiB", "1GiB", "64MB", "1.5GiB", plain integer = bytes (B, KB, MB, GB, TB: powers of 1000;
 * KiB, MiB, GiB, TiB: powers of 1024; any case). Returns 0 and *bytes, or -1. */
int atc_parse_size(const char *s, size_t *bytes);
/** "host:port" (host may be empty = 127.0.0.1, or [v6]). Returns 0 and an owned *host, or -1 and, when
 * @p err is not NULL, a static reason in *err. */
int atc_parse_hostport(const char *s, char **host, uint16_t *port, const char **err);
/** "http://host[:port][/]" (port 80 when absent; https, a path, a query or user info are refused).
 * Returns 0 and an owned *host, or -1 and, when @p err is not NULL, a static reason in *err. */
int atc_parse_url(const char *s, char **host, uint16_t *port, const char **err);
/** "redis://host[:port][/db]" -> an owned host, the port (default 6379) and the database (default 0).
 * 0, or -1 with a static reason in *err. */
int atc_parse_redis_url(const char *s, char **host, uint16_t *port, unsigned *db, const char **err);
/** @p path as written in a config file in directory @p dir: relative to the file, not to wherever atc
 * was started. Returns an owned string, or NULL when out of memory. */
char *atc_config_path(const char *dir, const char *path);

#endif
