#ifndef ATC_REPLAY_ORACLE_H
#define ATC_REPLAY_ORACLE_H

/* The oracle router (`atc replay --vs oracle`): a policy that reads the simulated servers themselves, which
 * no router in front of real engines can: how long until each could start a new prefill (the iteration in
 * progress, then its unscheduled prefill) and what its KV cache holds now, exactly. It sends a request
 * where its prefill would end soonest, its uncached tokens counted twice (its own prefill, and the work
 * it adds there for those behind it); ties go to the smaller decode batch, then the emptier cache. It is
 * not a bound (a simple greedy rule: bursty traffic without shared prefixes, where holding requests in
 * atc's queue pays, it loses to the shipped policy), but it shows what exact signals give a plain rule:
 * on the second half of Mooncake's trace at load 1.24 it comes within 1.19-1.21x the ideal fleet, the
 * rest being what no router in front of these servers avoids (decode steps in every prefill iteration,
 * prompts that share the step where another finishes, one cache per server). */
#define ATC_REPLAY_ORACLE "(oracle)" /* the policy entry that names it */

#include <stdint.h>

struct atc_endpoint;
struct atc_model;
struct atc_sim;
struct atc_trace_record;

/** The available endpoint of @p m taking stage @p stage (config/roles.h: ATC_ROLE_BOTH, or a
 * disaggregated model's ATC_ROLE_PREFILL) that the oracle sends @p r to at @p now_us (@p tokens: its
 * in-flight estimate), each one's simulated server by @p sim_of; NULL when none is available. */
struct atc_endpoint *atc_replay_oracle_pick(const struct atc_model *m, const struct atc_trace_record *r,
                                            uint64_t tokens, uint64_t now_us, unsigned stage,
                                            struct atc_sim *(*sim_of)(void *ctx, const struct atc_endpoint *ep),
                                            void *ctx);

#endif
