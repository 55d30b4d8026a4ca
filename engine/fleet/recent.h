#ifndef ATC_RECENT_H
#define ATC_RECENT_H

/* The last minute of one endpoint, as the status page shows it: attempts, errors and time to first byte
 * in one-second slots over the last ATC_RECENT_SECONDS seconds (rates an operator can compare with what
 * they see now; totals since start hide an incident behind hours of good traffic), and its last health
 * state changes. It lives in struct atc_endpoint, so it survives a config reload with the endpoint.
 *
 * Threads: the slots are written by every worker (atc_recent_record) and read by the admin API. Each
 * slot is one atomic word that packs its second with its count, so the first add of a new second
 * resets a slot last used a minute ago in the same compare-and-swap: no count is lost or lands in the
 * wrong second when two workers record across a second's boundary. The changes are the main thread's:
 * health.c writes them, the admin API reads them, both on the main thread's loop. */

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ATC_RECENT_SECONDS 60
#define ATC_RECENT_CHANGES 16

/* One health state change (the states are health.h's enum atc_health_state, as ints: this file sits
 * below health). */
struct atc_recent_change {
    uint64_t at_ms; /* monotonic ms (atc_mono_ms) */
    int from, to;
};

struct atc_recent {
    /* workers: (second mod 2^24) << 40 | value; a slot whose second is out of the window counts 0 */
    _Atomic uint64_t attempts[ATC_RECENT_SECONDS];
    _Atomic uint64_t errors[ATC_RECENT_SECONDS];
    _Atomic uint64_t ttft_n[ATC_RECENT_SECONDS];  /* attempts with a first byte timed */
    _Atomic uint64_t ttft_us[ATC_RECENT_SECONDS]; /* the sum of those times */
    /* config: when the endpoint joined the table (atc_mono_ms); nothing is known of it before */
    uint64_t since_ms;
    /* main thread */
    struct atc_recent_change changes[ATC_RECENT_CHANGES]; /* a ring: change k is at k % ATC_RECENT_CHANGES */
    uint64_t nchanges;                                    /* ever noted */
};

/* The sums over the window ending at some now. */
struct atc_recent_sum {
    uint64_t attempts, errors; /* errors: connection failures, timeouts, 5xx (as atc_endpoint_record) */
    uint64_t ttft_n;
    double ttft_ms; /* mean time to first byte of those ttft_n; NAN when none */
};

/** Counts one attempt that ended at @p now_ms (monotonic): @p ok false for an error; @p ttft_ms its
 * time to first byte when ok and known (< 0: not known). Any thread; lock-free. */
void atc_recent_record(struct atc_recent *r, uint64_t now_ms, bool ok, double ttft_ms);

/** Sums the attempts of the last ATC_RECENT_SECONDS seconds up to @p now_ms (the current second
 * included) into @p out. Any thread (each slot is read on its own, as the counters of endpoint.h). */
void atc_recent_sum(const struct atc_recent *r, uint64_t now_ms, struct atc_recent_sum *out);

/** Notes a health state change from @p from to @p to at @p now_ms; the oldest of more than
 * ATC_RECENT_CHANGES is forgotten. Main thread. */
void atc_recent_note_change(struct atc_recent *r, uint64_t now_ms, int from, int to);

/** Copies the changes kept, oldest first, into @p out (room for ATC_RECENT_CHANGES); returns how many.
 * Main thread. */
size_t atc_recent_changes(const struct atc_recent *r, struct atc_recent_change *out);

#endif
