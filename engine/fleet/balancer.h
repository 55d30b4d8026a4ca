#ifndef ATC_BALANCER_H
#define ATC_BALANCER_H

/* The built-in C balancer: used when no policy is loaded, and as the fallback whenever a policy fails,
 * overruns its budget or returns nonsense. Power of two choices: of two random endpoints with free
 * capacity, the one with the lower in-flight share of its capacity. */

#include <stddef.h>
#include <stdint.h>

struct atc_model;
struct atc_endpoint;

/** Next value of a xorshift64* generator kept in *state (never 0). */
uint64_t atc_random_next(uint64_t *state);

/** Picks an endpoint of @p m that is available for a request of @p tokens and not among the @p nexclude
 * endpoints in @p exclude. Returns a borrowed endpoint, or NULL when none can take the request. */
struct atc_endpoint *atc_balancer_pick(const struct atc_model *m, uint64_t *rng,
                                       struct atc_endpoint *const *exclude, size_t nexclude, uint64_t tokens);

#endif
