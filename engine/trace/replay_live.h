#ifndef ATC_REPLAY_LIVE_H
#define ATC_REPLAY_LIVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct atc_trace;
struct atc_replay_result;

/* `atc replay --speed X`: the trace sent to a running atc in wall time. */
struct atc_replay_live_options {
    const char *host; /* atc's front door */
    uint16_t port;
    double speed;      /* 2 = twice as fast as recorded */
    const char *model; /* NULL: the trace's */
    size_t limit;
    unsigned max_inflight; /* requests open at once (0: 1024); more wait, and their wait counts */
    uint64_t timeout_ms;   /* per request (0: 300 s) */
    bool progress;
};

/** Sends @p t's requests (prompt text synthesized from the block hashes, so shared
 * prefixes are shared bytes) and measures what clients see. Fills the latency, throughput and count
 * fields of @p out (not the fleet's: cache hits and load are the servers'). 0, or -1 with *err. */
int atc_replay_live(const struct atc_trace *t, const struct atc_replay_live_options *o,
                    struct atc_replay_result *out, char **err);

#endif
