#ifndef ATC_CLOCK_H
#define ATC_CLOCK_H

/* The engine's clocks, in one place. Monotonic time measures durations and arms timers; wall time
 * stamps what leaves the process (traces, logs, /admin timestamps); thread CPU time charges a replayed
 * decision only for its own work, so a busy machine does not change what replay decides. */

#include <stdint.h>
#include <sys/time.h>
#include <time.h>

static inline uint64_t atc_clock_ns(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/** Monotonic time in nanoseconds, microseconds, milliseconds. */
static inline uint64_t atc_mono_ns(void) { return atc_clock_ns(CLOCK_MONOTONIC); }
static inline uint64_t atc_mono_us(void) { return atc_mono_ns() / 1000u; }
static inline uint64_t atc_mono_ms(void) { return atc_mono_ns() / 1000000u; }

/** Wall-clock (UNIX) time in microseconds and in seconds. */
static inline uint64_t atc_wall_us(void) { return atc_clock_ns(CLOCK_REALTIME) / 1000u; }
static inline double atc_wall_s(void) { return (double)atc_clock_ns(CLOCK_REALTIME) / 1e9; }

/** A duration in microseconds, or in milliseconds, as the struct timeval libevent's timers take. */
static inline struct timeval atc_timeval_us(uint64_t us)
{
    return (struct timeval){.tv_sec = (time_t)(us / 1000000u), .tv_usec = (suseconds_t)(us % 1000000u)};
}
static inline struct timeval atc_timeval_ms(uint64_t ms)
{
    return atc_timeval_us(ms * 1000u);
}

/** CPU time the calling thread has used, in nanoseconds. */
static inline uint64_t atc_thread_cpu_ns(void) { return atc_clock_ns(CLOCK_THREAD_CPUTIME_ID); }

#endif
