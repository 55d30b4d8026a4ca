#include "fleet/balancer.h"

#include <stdbool.h>

#include "config/roles.h"
#include "fleet/endpoint.h"

uint64_t atc_random_next(uint64_t *state)
{
    uint64_t x = *state ? *state : 0x9E3779B97F4A7C15ull;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * 0x2545F4914F6CDD1Dull;
}

long atc_balancer_p2c(size_t n, uint64_t *rng, bool (*usable)(void *ctx, size_t i),
                      bool (*lighter)(void *ctx, size_t a, size_t b), void *ctx)
{
    size_t nusable = 0;
    for (size_t i = 0; i < n; i++)
        nusable += usable(ctx, i);
    if (nusable == 0)
        return -1;
    /* The k-th and l-th usable candidates (k != l when there are two or more). */
    size_t k = (size_t)(atc_random_next(rng) % nusable);
    size_t l = nusable > 1 ? (k + 1 + (size_t)(atc_random_next(rng) % (nusable - 1))) % nusable : k;
    size_t first = 0, second = 0;
    for (size_t i = 0, seen = 0; i < n; i++) {
        if (!usable(ctx, i))
            continue;
        if (seen == k)
            first = i;
        if (seen == l)
            second = i;
        seen++;
    }
    return (long)(lighter(ctx, second, first) ? second : first);
}

struct pick_ctx {
    const struct atc_model *m;
    struct atc_endpoint *const *exclude;
    size_t nexclude;
    uint64_t tokens;
    unsigned stage; /* an enum atc_role: what the endpoint must take (config/roles.h atc_role_serves) */
};

static bool is_candidate(const struct pick_ctx *c, const struct atc_endpoint *ep,
                         struct atc_endpoint *const *exclude, size_t nexclude, uint64_t tokens)
{
    if (!atc_role_serves(ep->role, c->m->disaggregation, c->stage) || !atc_endpoint_available(ep, tokens))
        return false;
    for (size_t i = 0; i < nexclude; i++)
        if (exclude[i] == ep)
            return false;
    return true;
}

static bool pick_usable(void *arg, size_t i)
{
    const struct pick_ctx *c = arg;
    return is_candidate(c, c->m->endpoints[i], c->exclude, c->nexclude, c->tokens);
}

/* Load as a share of the capacity offered now (less while slow-starting), compared by
 * cross-multiplication to stay in integers. */
static bool pick_lighter(void *arg, size_t i, size_t j)
{
    const struct pick_ctx *c = arg;
    const struct atc_endpoint *a = c->m->endpoints[i], *b = c->m->endpoints[j];
    return (uint64_t)a->inflight * atc_endpoint_capacity_now(b) <
           (uint64_t)b->inflight * atc_endpoint_capacity_now(a);
}

struct atc_endpoint *atc_balancer_pick(const struct atc_model *m, uint64_t *rng,
                                       struct atc_endpoint *const *exclude, size_t nexclude, uint64_t tokens)
{
    return atc_balancer_pick_stage(m, rng, exclude, nexclude, tokens,
                                   m->disaggregation != ATC_DISAGG_NONE ? ATC_ROLE_DECODE : ATC_ROLE_BOTH);
}

struct atc_endpoint *atc_balancer_pick_stage(const struct atc_model *m, uint64_t *rng,
                                             struct atc_endpoint *const *exclude, size_t nexclude,
                                             uint64_t tokens, unsigned stage)
{
    struct pick_ctx c = {.m = m, .exclude = exclude, .nexclude = nexclude, .tokens = tokens, .stage = stage};
    long i = atc_balancer_p2c(m->nendpoints, rng, pick_usable, pick_lighter, &c);
    return i < 0 ? NULL : m->endpoints[i];
}
