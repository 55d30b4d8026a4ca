#ifndef ATC_BALANCER_H
#define ATC_BALANCER_H

/* The built-in C balancer: used when no policy is loaded, and as the fallback whenever a policy fails,
 * overruns its budget or returns nonsense. Power of two choices: of two random endpoints with free
 * capacity, the one with the lower in-flight share of its capacity. The same choice is what policies
 * call as atc.p2c (policy_api.c), over their own candidates. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct atc_model;
struct atc_endpoint;

/** Next value of a xorshift64* generator kept in *state (never 0). */
uint64_t atc_random_next(uint64_t *state);

/** Power of two choices over @p n candidates: draws two distinct random positions among those
 * @p usable accepts (the same one when only one is) and returns the one @p lighter prefers
 * (@p lighter(ctx, a, b): a carries less load than b; ties keep the first draw). Returns that position,
 * or -1 when no candidate is usable. Calls @p usable and @p lighter synchronously, nothing else. */
long atc_balancer_p2c(size_t n, uint64_t *rng, bool (*usable)(void *ctx, size_t i),
                      bool (*lighter)(void *ctx, size_t a, size_t b), void *ctx);

/** Picks an endpoint of @p m that is available for a request of @p tokens and not among the @p nexclude
 * endpoints in @p exclude: one that answers it, a decode server in a disaggregated model. Returns a
 * borrowed endpoint, or NULL when none can take the request. */
struct atc_endpoint *atc_balancer_pick(const struct atc_model *m, uint64_t *rng,
                                       struct atc_endpoint *const *exclude, size_t nexclude, uint64_t tokens);
/** The same for stage @p stage (an enum atc_role, config/roles.h): ATC_ROLE_PREFILL picks the prefill
 * server of a disaggregated model's pair (role prefill or both), ATC_ROLE_DECODE its decode server. */
struct atc_endpoint *atc_balancer_pick_stage(const struct atc_model *m, uint64_t *rng,
                                             struct atc_endpoint *const *exclude, size_t nexclude,
                                             uint64_t tokens, unsigned stage);

#endif
