#ifndef ATC_LOG_H
#define ATC_LOG_H

/* Logging to stderr: one line per event, "time level file:line: message".
 * Thread-safe (a single write(2) per line). */

enum atc_log_level { ATC_LOG_DEBUG, ATC_LOG_INFO, ATC_LOG_WARN, ATC_LOG_ERROR };

/** Lines below this level are dropped. Default ATC_LOG_INFO; ATC_LOG env var ("debug", "warn", ...). */
void atc_log_set_level(enum atc_log_level level);

void atc_log_write(enum atc_log_level level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define atc_debug(...) atc_log_write(ATC_LOG_DEBUG, __FILE__, __LINE__, __VA_ARGS__)
#define atc_info(...) atc_log_write(ATC_LOG_INFO, __FILE__, __LINE__, __VA_ARGS__)
#define atc_warn(...) atc_log_write(ATC_LOG_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define atc_error(...) atc_log_write(ATC_LOG_ERROR, __FILE__, __LINE__, __VA_ARGS__)

#endif
