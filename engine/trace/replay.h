#ifndef ATC_REPLAY_H
#define ATC_REPLAY_H

/* Replay: a trace's requests routed by a policy to a simulated fleet, in virtual time.
 *
 * The fleet comes from a config: every simulate: entry becomes `count` simulated servers (ids
 * <model>-sim-N, as under `atc serve`), and every endpoint listed under models: is simulated with the
 * default server model (sim.h). A server with from: / until: (struct atc_window) joins the fleet then and
 * leaves it then: the policy's views, the C balancer and traffic around atc see it only in its window;
 * its requests in flight as it leaves finish there, and the prefix index, the affinity table and the
 * exact index forget it (as the live endpoint set changes of proxy/table_swap.h, which keep slots).
 * Each server is the same model `atc sim` runs: continuous batching,
 * prefill/decode timing, a batching limit and a per-server prefix KV cache with eviction. Requests carry
 * the trace's prefix block hashes with the trace's block size, so shared prefixes hit that cache.
 *
 * Time is virtual: the replay jumps from event to event (an arrival, the end of a server's iteration),
 * so a trace of an hour replays in seconds. The policy runs in the production runtime (sandbox,
 * budget), with atc.now() reading virtual time and atc.random() seeded; it sees the simulated fleet's
 * in-flight counts, server queues and KV usage as they are at that virtual moment. A queue verdict
 * waits in a FIFO queue in front of the fleet and is decided again whenever a request finishes; a
 * failed decision falls back to the built-in C balancer, as live. The same trace, fleet, policy and seed
 * give the same results: an overrun is counted on the decision's own CPU time, and the (wall-clock)
 * watchdog stops a decision only at 100 times its budget, so a busy machine's preemptions do not change
 * what the policy decides. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "policy/policy.h"

struct atc_config;
struct atc_trace;
struct atc_endpoint;
struct atc_endpoint_table;

/* An endpoint out of routing (as when drained or unhealthy) from from_us to to_us of virtual time;
 * its requests in flight finish. */
struct atc_replay_outage {
    const char *endpoint;
    uint64_t from_us, to_us;
};

/* A simulated server's engine restarts at at_us of virtual time: its prefix cache is emptied (what running
 * requests pin stays), and if it publishes KV events the exact index hears AllBlocksCleared; atc's
 * guessed index is not told, as live. Combine with an outage for the time it is down. */
struct atc_replay_restart {
    const char *endpoint;
    uint64_t at_us;
};

/* One decision, as reported to on_decision. */
struct atc_replay_decision {
    size_t record;    /* index in the trace */
    uint64_t at_us;   /* virtual time of the decision */
    unsigned attempt; /* 1 on arrival; more when decided again from the queue */
    enum atc_decision_kind kind;
    const char *reason;                  /* fallbacks: why the policy failed */
    const struct atc_endpoint *endpoint; /* where it went (policy or fallback balancer), or NULL */
    unsigned inflight;                   /* that endpoint's requests in flight before this one */
    unsigned capacity;
    int status;                             /* rejections */
    const struct atc_endpoint_table *table; /* the fleet as it is at this moment */
};

struct atc_replay_options {
    uint64_t seed;                  /* atc.random(), the C balancer and drawn output lengths (0: 1) */
    const char *model;              /* send every request to this model (NULL: the trace's) */
    size_t limit;                   /* replay only the first N requests (0: all) */
    uint64_t budget_us;             /* per decision, on its CPU time (0: the config's policy.budget) */
    bool progress;                  /* a progress bar on stderr */
    unsigned samples;               /* load samples over the trace's duration (0: 240) */
    const char *const *module_path; /* extra module directories (policy.path of the config otherwise) */
    size_t nmodule_path;
    const struct atc_replay_outage *outages;
    size_t noutages;
    const struct atc_replay_restart *restarts;
    size_t nrestarts;
    /* traffic around atc: this share (0..1) of the trace's requests, drawn with the seed, goes straight to
     * a server of its model drawn at random, as another client or router's would: no decision, atc's
     * in-flight counts and its guessed index never see it; the server's cache, load and KV events do */
    double around;
    void (*on_decision)(void *ctx, const struct atc_replay_decision *d);
    void *ctx;
    void (*log)(void *ctx, const char *line); /* the policy's atc.log lines (NULL: the log) */
    void *log_ctx;
};

struct atc_replay_endpoint_result {
    char *id;
    uint64_t requests;      /* dispatched to it */
    uint64_t prefix_blocks; /* looked up in its KV cache, and found */
    uint64_t prefix_block_hits;
    uint64_t preemptions;
    uint64_t from_ms, until_ms; /* its window in the fleet (from: / until:; 0: the start / the end) */
    uint64_t inflight_at_leave; /* its requests in flight as it left, which finished there */
};

/* TTFT of one tenant's or one priority's requests. */
struct atc_replay_group {
    char *name; /* the tenant ("(none)": no tenant, "(other)": the tenants past the busiest), or "0".."9" */
    size_t requests, completed;
    double ttft_p50_ms, ttft_p90_ms, ttft_p99_ms;
};

#define ATC_REPLAY_GROUPS_MAX 20 /* tenants shown one by one (a client may name thousands) */

struct atc_replay_result {
    char *name;                                     /* of the policy */
    char *entry;                                    /* its file */
    size_t requests, completed, rejected, unserved; /* unserved: still queued when nothing was left */
    size_t queued;                                  /* requests that waited in the queue */
    uint64_t decisions, fallbacks, policy_errors;
    uint64_t budget_overruns; /* decisions that used more CPU than the budget (or were stopped) */
    double ttft_p50_ms, ttft_p90_ms, ttft_p99_ms, ttft_mean_ms;
    double e2e_p50_ms, e2e_p99_ms;
    double itl_p50_ms, itl_p90_ms; /* over the requests of two tokens or more: each one's mean
                                      inter-token latency, (end - first token) / (tokens - 1) */
    double queue_wait_p50_ms, queue_wait_p99_ms, queue_wait_max_ms; /* over the requests that waited */
    double duration_s; /* first arrival to last completion, virtual */
    double throughput_rps, output_tps;
    uint64_t output_tokens, prefix_blocks, prefix_block_hits, preemptions;
    double cache_hit_rate; /* prefix blocks found in the server's cache / prefix blocks requested */
    double imbalance;      /* mean over time of max / mean in-flight across the endpoints of the models
                              the requests ask for (1 = even) */
    double imbalance_max;
    double work_imbalance; /* max / mean over endpoints of the tokens (prompt + output) sent to each */
    double wall_s; /* real time the replay took (not deterministic: kept out of --json) */
    /* against a recorded trace's picks (replay_cli.c): how many of the recorded live picks / shadow picks
     * this policy made too; recorded_*: how many the trace holds (0: none recorded) */
    size_t agree_live, agree_shadow, recorded_live, recorded_shadow;
    size_t around; /* requests sent around atc (o->around) */
    /* the guess's error, over the requests the policy routed (live: usage's cached_tokens): prompt tokens
     * the guessed index said the chosen server held, the server really held as the request arrived, and
     * |guessed - actual| summed; exact_error_tokens: the same for the exact index (servers that publish) */
    uint64_t guess_samples, guessed_cached_tokens, actual_cached_tokens, guess_error_tokens;
    uint64_t exact_samples, exact_error_tokens;
    bool live;     /* --speed: measured at the client; the fleet's cache and load are unknown */

    /* per request (index = trace record); NaN when the request did not complete */
    double *ttft_ms, *e2e_ms, *itl_ms;
    int *endpoint; /* index into endpoints, -1 when it never ran */

    struct atc_replay_endpoint_result *endpoints;
    size_t nendpoints;
    /* TTFT per tenant (the busiest ATC_REPLAY_GROUPS_MAX; none when the trace has no tenants) and per
     * priority (those the trace has; none when every request is priority 0), in name order */
    struct atc_replay_group *tenants, *priorities;
    size_t ntenants, npriorities;
    /* load over time: nsamples rows of nendpoints in-flight counts */
    double *sample_s;
    unsigned *sample_inflight;
    size_t nsamples;
};

/** Replays @p trace through the policy in @p entry (NULL: the built-in C balancer; named @p name in
 * reports) against the fleet of @p cfg. Returns 0 and fills @p out (free with atc_replay_result_dispose), or
 * -1 with an owned message in *err (the policy does not load, the fleet is empty, out of memory). Calls
 * on_decision for every decision, in order. */
int atc_replay_run(const struct atc_config *cfg, const struct atc_trace *trace, const char *entry,
                   const char *name, const struct atc_replay_options *o, struct atc_replay_result *out,
                   char **err);

void atc_replay_result_dispose(struct atc_replay_result *r);

/** Fills @p r's tenants and priorities from r->ttft_ms and records [0..n) of @p t. 0, or -1 when
 * memory ran out (what was filled stays, for atc_replay_result_dispose). */
int atc_replay_groups(struct atc_replay_result *r, const struct atc_trace *t, size_t n);

/** Fills @p r's TTFT and end-to-end percentiles (and the TTFT mean) from r->ttft_ms and r->e2e_ms[0..n)
 * (NaN: did not complete). Leaves them as they are when out of memory. */
void atc_replay_latencies(struct atc_replay_result *r, size_t n);
/** Sorts @p v ascending, for atc_replay_percentile. */
void atc_replay_sort(double *v, size_t n);
/** The @p p-th percentile (nearest rank) of the @p n sorted values @p v; 0 when there are none. */
double atc_replay_percentile(const double *v, size_t n, double p);

#endif
