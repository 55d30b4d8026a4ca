#include "fleet/balancer.h"

#include <stdbool.h>

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

static bool is_candidate(const struct atc_endpoint *ep, struct atc_endpoint *const *exclude, size_t nexclude,
                         uint64_t tokens)
{
    if (!atc_endpoint_available(ep, tokens))
        return false;
    for (size_t i = 0; i < nexclude; i++)
        if (exclude[i] == ep)
            return false;
    return true;
}

/* Load as a share of the capacity offered now (less while slow-starting), compared by
 * cross-multiplication to stay in integers. */
static bool less_loaded(const struct atc_endpoint *a, const struct atc_endpoint *b)
{
    return (uint64_t)a->inflight * atc_endpoint_capacity_now(b) <
           (uint64_t)b->inflight * atc_endpoint_capacity_now(a);
}

struct atc_endpoint *atc_balancer_pick(const struct atc_model *m, uint64_t *rng,
                                       struct atc_endpoint *const *exclude, size_t nexclude, uint64_t tokens)
{
    size_t n = 0;
    for (size_t i = 0; i < m->nendpoints; i++)
        n += is_candidate(m->endpoints[i], exclude, nexclude, tokens);
    if (n == 0)
        return NULL;

    /* The k-th and l-th candidates (k != l when there are two or more). */
    size_t k = (size_t)(atc_random_next(rng) % n);
    size_t l = n > 1 ? (k + 1 + (size_t)(atc_random_next(rng) % (n - 1))) % n : k;
    struct atc_endpoint *first = NULL, *second = NULL;
    for (size_t i = 0, seen = 0; i < m->nendpoints; i++) {
        struct atc_endpoint *ep = m->endpoints[i];
        if (!is_candidate(ep, exclude, nexclude, tokens))
            continue;
        if (seen == k)
            first = ep;
        if (seen == l)
            second = ep;
        seen++;
    }
    return less_loaded(second, first) ? second : first;
}
