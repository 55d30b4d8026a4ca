/* The host functions that choose among a pool (atc.least_loaded, p2c, rendezvous, prefix_pick,
 * fastest) and the routing signals an endpoint view shows (fleet/signals.h): the loops over a pool run
 * here, in C, so that a decision over hundreds of endpoints stays in microseconds. Like every function
 * a policy calls, each validates its arguments before it changes anything (a Lua error longjmps). */

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <lauxlib.h>
#include <xxhash.h>

#include "base/clock.h"
#include "fleet/balancer.h"
#include "fleet/endpoint.h"
#include "fleet/signals.h"
#include "policy/decision.h"
#include "policy/policy_api.h"
#include "policy/state.h"

/* A candidate for the C balancers: an endpoint view, or any table with the same fields (tests). */
struct candidate {
    bool available;
    double inflight, capacity;
    double load;
    double tokens; /* in flight: breaks ties of load */
    double weight;
    const char *id;
    size_t idlen;
};

/* A pool longer than any fleet: one C call over it could outlast a decision's budget (a loop in C is
 * never interrupted), so it is refused. */
#define POOL_MAX 4096

int policy_pick_pool_len(lua_State *L, int idx)
{
    luaL_checktype(L, idx, LUA_TTABLE);
    size_t n = lua_objlen(L, idx);
    if (n > POOL_MAX)
        luaL_argerror(L, idx, "a pool of more than 4096 endpoints");
    return (int)n;
}

double policy_pick_field(lua_State *L, int idx, const char *name, double dflt)
{
    lua_getfield(L, idx, name);
    double x = lua_isnumber(L, -1) ? lua_tonumber(L, -1) : dflt;
    lua_pop(L, 1);
    return x;
}

static void candidate_of(const struct policy_version *v, const struct atc_endpoint *ep, struct candidate *c)
{
    c->available = policy_api_available(v, ep);
    c->inflight = atc_endpoint_fleet_inflight(ep); /* every replica's (ep->remote) */
    c->capacity = atc_endpoint_capacity_now(ep);   /* less while slow-starting */
    c->load = c->capacity > 0 ? c->inflight / c->capacity : 1.0;
    c->tokens = (double)atc_endpoint_fleet_tokens(ep);
    c->weight = ep->weight;
    c->id = ep->id;
    c->idlen = strlen(ep->id);
}

/* Reads element @p i of the array at @p arr: from its engine list @p list (NULL: none) without reading
 * the table. Strings it returns stay valid while the element is in the array. */
static void read_candidate(lua_State *L, struct policy_version *v, const struct policy_list *list, int arr,
                           int i, struct candidate *c)
{
    if (list != NULL) {
        candidate_of(v, list->eps[i - 1], c);
        return;
    }
    lua_rawgeti(L, arr, i);
    int index = policy_api_view_index(v, -1);
    const struct atc_endpoint *ep = index >= 0 ? policy_api_endpoint_at(v, (unsigned)index) : NULL;
    if (ep != NULL) {
        candidate_of(v, ep, c);
    } else if (lua_istable(L, -1)) {
        int t = lua_gettop(L);
        double inflight = policy_pick_field(L, t, "inflight", 0),
               capacity = policy_pick_field(L, t, "capacity", 1);
        lua_getfield(L, t, "available");
        c->available = lua_isnil(L, -1) ? inflight < capacity : lua_toboolean(L, -1);
        lua_pop(L, 1);
        c->inflight = inflight;
        c->capacity = capacity;
        c->load = capacity > 0 ? inflight / capacity : 1.0;
        c->tokens = policy_pick_field(L, t, "inflight_tokens", 0);
        c->weight = policy_pick_field(L, t, "weight", 1);
        lua_getfield(L, t, "id");
        c->id = lua_tolstring(L, -1, &c->idlen);
        lua_pop(L, 1);
        if (c->id == NULL) {
            c->id = "";
            c->idlen = 0;
        }
    } else {
        luaL_error(L, "element %d is not an endpoint", i);
    }
    lua_pop(L, 1);
}

void policy_pick_push(lua_State *L, const struct policy_list *list, int i, const char *fn)
{
    if (list != NULL)
        policy_fleet_push_element(L, list, 1, i, fn);
    else
        lua_rawgeti(L, 1, i);
}

static bool lighter(const struct candidate *a, const struct candidate *b)
{
    return a->load < b->load || (a->load == b->load && a->tokens < b->tokens);
}

int policy_pick_least_loaded(lua_State *L)
{
    struct policy_version *v = policy_api_version(L);
    int n = policy_pick_pool_len(L, 1), best = 0;
    const struct policy_list *list = policy_fleet_list(L, v, 1, "atc.least_loaded");
    struct candidate c, best_c = {0};
    for (int i = 1; i <= n; i++) {
        read_candidate(L, v, list, 1, i, &c);
        if (c.available && (best == 0 || lighter(&c, &best_c))) {
            best = i;
            best_c = c;
        }
    }
    if (best == 0)
        lua_pushnil(L);
    else
        policy_pick_push(L, list, best, "atc.least_loaded");
    return 1;
}

struct p2c_ctx {
    const struct candidate *c;
};

static bool p2c_usable(void *arg, size_t i)
{
    return ((const struct p2c_ctx *)arg)->c[i].available;
}

static bool p2c_lighter(void *arg, size_t i, size_t j)
{
    const struct p2c_ctx *x = arg;
    return lighter(&x->c[i], &x->c[j]);
}

/* atc.p2c(eps): the built-in balancer's power of two choices (balancer.c) over eps, read once. */
int policy_pick_p2c(lua_State *L)
{
    struct policy_version *v = policy_api_version(L);
    int n = policy_pick_pool_len(L, 1);
    const struct policy_list *list = policy_fleet_list(L, v, 1, "atc.p2c");
    struct candidate small[64];
    /* A userdata for a large pool: collected by Lua, so nothing leaks if reading an element raises. */
    struct candidate *c = n <= 64 ? small : lua_newuserdata(L, (size_t)n * sizeof(*c));
    for (int i = 1; i <= n; i++)
        read_candidate(L, v, list, 1, i, &c[i - 1]);
    struct p2c_ctx x = {.c = c};
    long pick = atc_balancer_p2c((size_t)n, &v->rt->rng, p2c_usable, p2c_lighter, &x);
    if (pick < 0)
        lua_pushnil(L);
    else
        policy_pick_push(L, list, (int)pick + 1, "atc.p2c");
    return 1;
}

/* atc.rendezvous(eps, key [, c | opts]): weighted highest random weight hashing over the available
 * endpoints. With c (>= 1), consistent hashing with bounded loads: an endpoint is skipped when, with
 * this request counted, it would hold more than c times its capacity's share of the requests in flight
 * on the available endpoints (some endpoint is always under that bound). opts: c, and req with max_ttft
 * (ms): only the endpoints where req's first token would come within max_ttft (ep:predict_ttft) count, as
 * if eps held only those (the loop in C that the shipped affinity layer's session pins ran in Lua). */
static const char *const rendezvous_options[] = {"c", "req", "max_ttft"};

static double view_ttft(lua_State *L, struct policy_version *v, const struct atc_endpoint *ep);

/* Whether element @p i of the pool (its endpoint @p ep, NULL for a mock) is within @p max_ttft of req,
 * the value at @p req. */
static bool within_ttft(lua_State *L, struct policy_version *v, const struct atc_endpoint *ep, int i, int req,
                        double max_ttft)
{
    double ttft;
    if (ep != NULL) {
        if (luaL_testudata(L, req, POLICY_MT_REQ) == NULL)
            luaL_error(L, "atc.rendezvous: opts.req must be the request being decided");
        ttft = view_ttft(L, v, ep);
    } else { /* a test's mock: its own predict_ttft */
        lua_rawgeti(L, 1, i);
        lua_getfield(L, -1, "predict_ttft");
        lua_insert(L, -2);
        lua_pushvalue(L, req);
        lua_call(L, 2, 1);
        ttft = lua_tonumber(L, -1);
        lua_pop(L, 1);
    }
    return ttft <= max_ttft; /* NaN is not within */
}

/* The endpoint of element @p i of the pool at index 1, NULL for a test's mock. */
static const struct atc_endpoint *element_ep(lua_State *L, struct policy_version *v,
                                             const struct policy_list *list, int i)
{
    if (list != NULL)
        return list->eps[i - 1];
    lua_rawgeti(L, 1, i);
    int index = policy_api_view_index(v, -1);
    lua_pop(L, 1);
    return index >= 0 ? policy_api_endpoint_at(v, (unsigned)index) : NULL;
}

int policy_pick_rendezvous(lua_State *L)
{
    struct policy_version *v = policy_api_version(L);
    size_t keylen;
    const char *key = luaL_checklstring(L, 2, &keylen);
    double c_bound = 0, max_ttft = HUGE_VAL;
    bool within = false;
    if (lua_istable(L, 3)) {
        lua_settop(L, 3);
        for (lua_pushnil(L); lua_next(L, 3) != 0; lua_pop(L, 1)) { /* a misspelt option is a bug: say so */
            const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
            bool ok = false;
            for (size_t i = 0; k != NULL && i < sizeof(rendezvous_options) / sizeof(rendezvous_options[0]);
                 i++)
                ok = ok || strcmp(k, rendezvous_options[i]) == 0;
            if (!ok)
                return luaL_error(L, "atc.rendezvous: unknown option '%s'",
                                  k != NULL ? k : luaL_typename(L, -2));
        }
        lua_getfield(L, 3, "c");
        if (!lua_isnil(L, -1) && (lua_type(L, -1) != LUA_TNUMBER || (c_bound = lua_tonumber(L, -1)) < 1))
            return luaL_error(L, "atc.rendezvous: c must be >= 1");
        lua_getfield(L, 3, "max_ttft");
        if (!lua_isnil(L, -1)) {
            if (lua_type(L, -1) != LUA_TNUMBER)
                return luaL_error(L, "atc.rendezvous: option 'max_ttft' must be a number (ms)");
            max_ttft = lua_tonumber(L, -1);
            within = true;
        }
        lua_pop(L, 2);
        lua_getfield(L, 3, "req"); /* index 4 */
        if (within && lua_isnil(L, 4))
            return luaL_error(L, "atc.rendezvous: option 'max_ttft' needs 'req'");
    } else {
        c_bound = luaL_optnumber(L, 3, 0);
        if (lua_gettop(L) >= 3 && !lua_isnil(L, 3) && c_bound < 1)
            return luaL_argerror(L, 3, "c must be >= 1");
    }
    uint64_t seed = XXH3_64bits(key, keylen);
    int n = policy_pick_pool_len(L, 1), best = 0;
    const struct policy_list *list = policy_fleet_list(L, v, 1, "atc.rendezvous");
    double best_score = 0, per_slot = HUGE_VAL;
    struct candidate c;
    if (c_bound >= 1) {
        double inflight = 0, capacity = 0;
        for (int i = 1; i <= n; i++) {
            read_candidate(L, v, list, 1, i, &c);
            if (c.available && (!within || within_ttft(L, v, element_ep(L, v, list, i), i, 4, max_ttft))) {
                inflight += c.inflight;
                capacity += c.capacity;
            }
        }
        if (capacity <= 0) {
            lua_pushnil(L);
            return 1;
        }
        per_slot = c_bound * (inflight + 1) / capacity;
    }
    for (int i = 1; i <= n; i++) {
        read_candidate(L, v, list, 1, i, &c);
        if (!c.available || c.weight <= 0 || c.inflight + 1 > ceil(per_slot * c.capacity))
            continue;
        if (within && !within_ttft(L, v, element_ep(L, v, list, i), i, 4, max_ttft))
            continue;
        /* score = -w / ln(u), u uniform in (0,1) from hash(key, id) */
        uint64_t h = XXH3_64bits_withSeed(c.id, c.idlen, seed);
        double u = ((double)(h >> 11) + 0.5) * 0x1.0p-53;
        double score = -c.weight / log(u);
        if (best == 0 || score > best_score) {
            best = i;
            best_score = score;
        }
    }
    if (best == 0)
        lua_pushnil(L);
    else
        policy_pick_push(L, list, best, "atc.rendezvous");
    return 1;
}

/* Reads option @p name of the options table at @p idx: a number, @p dflt when absent; a Lua error
 * (nothing is changed yet) when it is not a number or below @p min. */
static double opt_number(lua_State *L, int idx, const char *name, double dflt, double min)
{
    lua_getfield(L, idx, name);
    double x = dflt;
    if (!lua_isnil(L, -1)) {
        if (lua_type(L, -1) != LUA_TNUMBER)
            luaL_error(L, "atc.prefix_pick: option '%s' must be a number", name);
        x = lua_tonumber(L, -1);
        if (x < min)
            luaL_error(L, "atc.prefix_pick: option '%s' must be >= %f", name, min);
    }
    lua_pop(L, 1);
    return x;
}

/* atc.prefix_pick(pool, req [, opts]): the hot loop of prefix affinity, in C. opts (all optional):
 * min_blocks (1), balance_abs and balance_rel (no imbalance guard), skip (an endpoint never chosen),
 * load_weight (0). nil when no available endpoint (but skip) has at least min_blocks of the prompt's
 * leading blocks, or when the pool is imbalanced (max - min in-flight > balance_abs and max >
 * balance_rel * min, as SGLang's cache-aware router). Otherwise, with load_weight 0, the available
 * endpoint with the longest overlap (ties: the lighter); with load_weight > 0, the one with the lowest
 * cost = prompt tokens it would still have to prefill (prompt_tokens - overlap * block_tokens) +
 * load_weight * its tokens in flight (ties: the lighter): a cache hit weighed against the work already
 * queued there. */
int policy_pick_prefix_pick(lua_State *L)
{
    static const char *const known[] = {"min_blocks", "balance_abs", "balance_rel", "skip", "load_weight"};
    struct policy_version *v = policy_api_version(L);
    luaL_checktype(L, 1, LUA_TTABLE);
    if (lua_isnoneornil(L, 3)) {
        lua_settop(L, 2);
        lua_newtable(L);
    }
    luaL_checktype(L, 3, LUA_TTABLE);
    lua_settop(L, 3);
    for (lua_pushnil(L); lua_next(L, 3) != 0; lua_pop(L, 1)) { /* a misspelt option is a bug: say so */
        const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
        bool ok = false;
        for (size_t i = 0; k != NULL && i < sizeof(known) / sizeof(known[0]) && !ok; i++)
            ok = strcmp(k, known[i]) == 0;
        if (!ok)
            return luaL_error(L, "atc.prefix_pick: unknown option '%s'",
                              k != NULL ? k : luaL_typename(L, -2));
    }
    double min_blocks = opt_number(L, 3, "min_blocks", 1, 0),
           abs_gap = opt_number(L, 3, "balance_abs", HUGE_VAL, 0),
           rel = opt_number(L, 3, "balance_rel", 0, 0), load_weight = opt_number(L, 3, "load_weight", 0, 0);
    lua_getfield(L, 3, "skip"); /* index 4 */
    double prompt = 0, block_tokens = 0;
    if (load_weight > 0) { /* read through the request's own accessors: engine requests and test ones */
        lua_getfield(L, 2, "prompt_tokens");
        lua_getfield(L, 2, "block_tokens");
        prompt = lua_tonumber(L, -2);
        block_tokens = lua_isnumber(L, -1) ? lua_tonumber(L, -1) : ATC_PREFIX_BLOCK_TOKENS;
        lua_pop(L, 2);
    }
    int n = policy_pick_pool_len(L, 1), best = 0;
    const struct policy_list *list = policy_fleet_list(L, v, 1, "atc.prefix_pick");
    const void *skip = lua_istable(L, 4) ? lua_topointer(L, 4) : NULL;
    double best_score = 0, best_load = 0, max_overlap = 0, lo = HUGE_VAL, hi = 0;
    for (int i = 1; i <= n; i++) {
        struct candidate c;
        read_candidate(L, v, list, 1, i, &c);
        if (!c.available)
            continue;
        lo = c.inflight < lo ? c.inflight : lo;
        hi = c.inflight > hi ? c.inflight : hi;
        const struct atc_endpoint *ep;
        if (list != NULL) {
            if (list->views[i - 1] == skip)
                continue;
            ep = list->eps[i - 1];
        } else {
            lua_rawgeti(L, 1, i);
            int index = policy_api_view_index(v, -1);
            ep = index >= 0 ? policy_api_endpoint_at(v, (unsigned)index) : NULL;
            if (lua_rawequal(L, -1, 4)) {
                lua_pop(L, 1);
                continue;
            }
        }
        double overlap;
        if (ep != NULL) {
            if (list == NULL)
                lua_pop(L, 1);
            overlap = policy_api_overlap(L, v, ep);
        } else { /* a test fleet's element: ask its method */
            lua_getfield(L, -1, "prefix_overlap");
            lua_insert(L, -2);
            lua_pushvalue(L, 2);
            lua_call(L, 2, 1);
            overlap = lua_tonumber(L, -1);
            lua_pop(L, 1);
        }
        max_overlap = overlap > max_overlap ? overlap : max_overlap;
        /* Higher scores win: the overlap itself, or the negated cost. */
        double score = overlap;
        if (load_weight > 0) {
            double uncached = prompt - overlap * block_tokens;
            score = -((uncached > 0 ? uncached : 0) + load_weight * c.tokens);
        } else if (overlap < min_blocks) {
            continue;
        }
        if (best == 0 || score > best_score || (score == best_score && c.load < best_load)) {
            best = i;
            best_score = score;
            best_load = c.load;
        }
    }
    if (best == 0 || max_overlap < min_blocks || (hi - lo > abs_gap && hi > rel * lo))
        lua_pushnil(L);
    else
        policy_pick_push(L, list, best, "atc.prefix_pick");
    return 1;
}

/* ---- routing signals (fleet/signals.h) ---- */

/* The signals' clock: the runtime's (virtual time under replay), as the relay's and the replay's. */
uint64_t policy_pick_now_us(const struct policy_version *v)
{
    return (uint64_t)(policy_now_ms(v->rt) * 1000.0);
}

const struct atc_signal_params *policy_pick_params(const struct policy_version *v)
{
    /* `atc test` runs unit tests without an endpoint table: the defaults then */
    static const struct atc_signal_params defaults = {
        .prefill_tps = 15000, .itl_us = 12000, .recent_half_life_ms = 2000};
    return v->rt->table != NULL ? &v->rt->table->signals : &defaults;
}

struct policy_uncached policy_pick_uncached_req(lua_State *L, struct policy_version *v)
{
    const struct atc_route_request *req = policy_api_current_req(L, v);
    return (struct policy_uncached){
        .req = req,
        .overlaps = policy_api_overlaps(L, v),
        .prompt_tokens = req->features->prompt_tokens,
        .block_tokens = atc_block_tokens(req->block_tokens),
    };
}

/* The current request's prompt tokens that @p ep would still have to prefill (policy_uncached_of). */
static uint64_t uncached_at(lua_State *L, struct policy_version *v, const struct atc_endpoint *ep)
{
    struct policy_uncached r = policy_pick_uncached_req(L, v);
    return policy_uncached_of(&r, ep);
}

/* The other replicas' part of an endpoint's signals (fleet/endpoint.h's remote; 0 without a cluster). */
static double remote_prefill(const struct atc_endpoint *ep)
{
    return (double)atomic_load_explicit(&ep->remote.prefill_tokens, memory_order_relaxed);
}
static double remote_decoding(const struct atc_endpoint *ep)
{
    return (double)atomic_load_explicit(&ep->remote.decoding, memory_order_relaxed);
}
static double remote_recent(const struct atc_endpoint *ep)
{
    return atomic_load_explicit(&ep->remote.recent_tokens, memory_order_relaxed);
}

/* ep:predict_ttft(req): ms to the first token of req if it were sent to ep now, behind the prefill
 * backlog every replica sent there. */
static double view_ttft(lua_State *L, struct policy_version *v, const struct atc_endpoint *ep)
{
    const struct atc_signal_params *p = policy_pick_params(v);
    return atc_signals_predict_ttft_ms(&ep->sig, p, uncached_at(L, v, ep), policy_pick_now_us(v)) +
           remote_prefill(ep) * 1000.0 / atc_signals_prefill_tps(&ep->sig, p);
}

int policy_pick_predict_ttft(lua_State *L)
{
    struct policy_version *v = policy_api_version(L);
    const struct atc_endpoint *ep = policy_api_check_view(L, v, 1);
    luaL_checkudata(L, 2, POLICY_MT_REQ);
    lua_pushnumber(L, view_ttft(L, v, ep));
    return 1;
}

/* The signal fields of an endpoint view (policy_api.c's ep_fields reads this table). The server's own
 * load (running, server_queue, kv_usage, prefix_hit_rate) is what the last scrape of its /metrics said
 * (health.c), or what the simulated server reports (replay); nil until the first scrape, and for what the
 * server does not report. */
#define EP const struct atc_endpoint *ep = of
static void push_positive(lua_State *L, double x)
{
    if (x > 0)
        lua_pushnumber(L, x);
    else
        lua_pushnil(L);
}
static void push_prefill_tokens(lua_State *L, struct policy_version *v, const void *of)
{
    EP;
    (void)v;
    lua_pushnumber(L, (double)atomic_load_explicit(&ep->sig.prefill_tokens, memory_order_relaxed) +
                          remote_prefill(ep));
}
static void push_prefilling(lua_State *L, struct policy_version *v, const void *of)
{
    EP;
    (void)v;
    lua_pushinteger(L, (lua_Integer)(atomic_load_explicit(&ep->sig.prefilling, memory_order_relaxed) +
                                     atomic_load_explicit(&ep->remote.prefilling, memory_order_relaxed)));
}
static void push_decoding(lua_State *L, struct policy_version *v, const void *of)
{
    EP;
    (void)v;
    lua_pushinteger(L, (lua_Integer)atomic_load_explicit(&ep->sig.decoding, memory_order_relaxed) +
                           (lua_Integer)remote_decoding(ep));
}
static void push_recent_tokens(lua_State *L, struct policy_version *v, const void *of)
{
    EP;
    lua_pushnumber(L, atc_signals_recent(&ep->sig, policy_pick_params(v), policy_pick_now_us(v)) +
                          remote_recent(ep));
}
static void push_remote_inflight(lua_State *L, struct policy_version *v, const void *of)
{
    EP;
    (void)v;
    lua_pushinteger(L, (lua_Integer)atomic_load_explicit(&ep->remote.inflight, memory_order_relaxed));
}
static void push_remote_tokens(lua_State *L, struct policy_version *v, const void *of)
{
    EP;
    (void)v;
    lua_pushnumber(L, (double)atomic_load_explicit(&ep->remote.tokens, memory_order_relaxed));
}
static void push_remote_prefill_tokens(lua_State *L, struct policy_version *v, const void *of)
{
    (void)v;
    lua_pushnumber(L, remote_prefill(of));
}
static void push_remote_age(lua_State *L, struct policy_version *v, const void *of)
{
    EP;
    (void)v;
    uint64_t at = atomic_load_explicit(&ep->remote.at_ms, memory_order_relaxed), now = atc_mono_ms();
    if (at > 0) /* the cluster's clock is the monotonic one, not the runtime's (no cluster in replay) */
        lua_pushnumber(L, now > at ? (double)(now - at) : 0);
    else
        lua_pushnil(L);
}
static void push_prefill_rate(lua_State *L, struct policy_version *v, const void *of)
{
    EP;
    lua_pushnumber(L, atc_signals_prefill_tps(&ep->sig, policy_pick_params(v)));
}
static void push_itl(lua_State *L, struct policy_version *v, const void *of)
{
    EP;
    lua_pushnumber(L, atc_signals_itl_ms(&ep->sig, policy_pick_params(v)));
}
static void push_uncached_mean(lua_State *L, struct policy_version *v, const void *of)
{
    EP;
    (void)v;
    push_positive(L, atc_signals_uncached_mean(&ep->sig));
}
static void push_kv_tokens(lua_State *L, struct policy_version *v, const void *of)
{
    EP;
    (void)v;
    push_positive(L, (double)atomic_load_explicit(&ep->kv_tokens, memory_order_relaxed));
}
/* One scraped value: nil before the first scrape and for what the server does not report (NaN). */
static void push_scraped(lua_State *L, const struct atc_endpoint *ep, const _Atomic double *x)
{
    double value = atomic_load_explicit(&ep->sig.scraped_at_us, memory_order_acquire) != 0 ? *x : NAN;
    if (isfinite(value))
        lua_pushnumber(L, value);
    else
        lua_pushnil(L);
}
static void push_running(lua_State *L, struct policy_version *v, const void *of)
{
    EP;
    (void)v;
    push_scraped(L, ep, &ep->sig.scraped_running);
}
static void push_prefix_hit_rate(lua_State *L, struct policy_version *v, const void *of)
{
    EP;
    (void)v;
    push_scraped(L, ep, &ep->sig.scraped_prefix_hit_rate);
}
/* The engine's own count of cached prompt tokens (usage.prompt_tokens_details.cached_tokens): nil until
 * an answer of the endpoint reported one. */
static void push_cached_token_share(lua_State *L, struct policy_version *v, const void *of)
{
    EP;
    (void)v;
    double share = atc_signals_cached_share(&ep->sig);
    if (share >= 0)
        lua_pushnumber(L, share);
    else
        lua_pushnil(L);
}
static void push_kv_usage(lua_State *L, struct policy_version *v, const void *of)
{
    EP;
    (void)v;
    push_scraped(L, ep, &ep->sig.scraped_kv_usage);
}
static void push_server_queue(lua_State *L, struct policy_version *v, const void *of)
{
    EP;
    (void)v;
    push_scraped(L, ep, &ep->sig.scraped_waiting);
}
static void push_scrape_age(lua_State *L, struct policy_version *v, const void *of)
{
    EP;
    uint64_t at = atomic_load_explicit(&ep->sig.scraped_at_us, memory_order_acquire),
             now = policy_pick_now_us(v);
    if (at != 0)
        lua_pushnumber(L, now > at ? (double)(now - at) / 1000.0 : 0);
    else
        lua_pushnil(L);
}
#undef EP

const struct policy_field policy_pick_signal_fields[] = {
    {"prefill_tokens", push_prefill_tokens, NULL},
    {"prefilling", push_prefilling, NULL},
    {"decoding", push_decoding, NULL},
    {"recent_tokens", push_recent_tokens, NULL},
    {"remote_inflight", push_remote_inflight, NULL},
    {"remote_tokens", push_remote_tokens, NULL},
    {"remote_prefill_tokens", push_remote_prefill_tokens, NULL},
    {"remote_age", push_remote_age, NULL},
    {"prefill_rate", push_prefill_rate, NULL},
    {"itl", push_itl, NULL},
    {"uncached_mean", push_uncached_mean, NULL},
    {"kv_tokens", push_kv_tokens, NULL},
    {"running", push_running, NULL},
    {"prefix_hit_rate", push_prefix_hit_rate, NULL},
    {"cached_token_share", push_cached_token_share, NULL},
    {"kv_usage", push_kv_usage, NULL},
    {"server_queue", push_server_queue, NULL},
    {"scrape_age", push_scrape_age, NULL},
    {NULL, NULL, NULL},
};
