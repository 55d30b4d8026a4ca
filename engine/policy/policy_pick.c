/* The host functions that choose among a pool (atc.least_loaded, p2c, rendezvous, prefix_pick,
 * fastest) and the routing signals an endpoint view shows (fleet/signals.h): the loops over a pool run
 * here, in C, so that a decision over hundreds of endpoints stays in microseconds. Like every function
 * a policy calls, each validates its arguments before it changes anything (a Lua error longjmps). */

#include <math.h>
#include <stdbool.h>
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

static int pool_len(lua_State *L, int idx)
{
    luaL_checktype(L, idx, LUA_TTABLE);
    size_t n = lua_objlen(L, idx);
    if (n > POOL_MAX)
        luaL_argerror(L, idx, "a pool of more than 4096 endpoints");
    return (int)n;
}

static double field_number(lua_State *L, int idx, const char *name, double dflt)
{
    lua_getfield(L, idx, name);
    double x = lua_isnumber(L, -1) ? lua_tonumber(L, -1) : dflt;
    lua_pop(L, 1);
    return x;
}

/* Reads element @p i of the array at @p arr. Strings it returns stay valid while the element is in
 * the array. */
static void read_candidate(lua_State *L, struct policy_version *v, int arr, int i, struct candidate *c)
{
    lua_rawgeti(L, arr, i);
    int index = policy_api_view_index(v, -1);
    const struct atc_endpoint *ep = index >= 0 ? policy_api_endpoint_at(v, (unsigned)index) : NULL;
    if (ep != NULL) {
        c->available = policy_api_available(v, ep);
        c->inflight = atc_endpoint_fleet_inflight(ep); /* every replica's (ep->remote) */
        c->capacity = atc_endpoint_capacity_now(ep);   /* less while slow-starting */
        c->load = c->capacity > 0 ? c->inflight / c->capacity : 1.0;
        c->tokens = (double)atc_endpoint_fleet_tokens(ep);
        c->weight = ep->weight;
        c->id = ep->id;
        c->idlen = strlen(ep->id);
    } else if (lua_istable(L, -1)) {
        int t = lua_gettop(L);
        double inflight = field_number(L, t, "inflight", 0), capacity = field_number(L, t, "capacity", 1);
        lua_getfield(L, t, "available");
        c->available = lua_isnil(L, -1) ? inflight < capacity : lua_toboolean(L, -1);
        lua_pop(L, 1);
        c->inflight = inflight;
        c->capacity = capacity;
        c->load = capacity > 0 ? inflight / capacity : 1.0;
        c->tokens = field_number(L, t, "inflight_tokens", 0);
        c->weight = field_number(L, t, "weight", 1);
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

static bool lighter(const struct candidate *a, const struct candidate *b)
{
    return a->load < b->load || (a->load == b->load && a->tokens < b->tokens);
}

int policy_pick_least_loaded(lua_State *L)
{
    struct policy_version *v = policy_api_version(L);
    int n = pool_len(L, 1), best = 0;
    struct candidate c, best_c = {0};
    for (int i = 1; i <= n; i++) {
        read_candidate(L, v, 1, i, &c);
        if (c.available && (best == 0 || lighter(&c, &best_c))) {
            best = i;
            best_c = c;
        }
    }
    if (best == 0)
        lua_pushnil(L);
    else
        lua_rawgeti(L, 1, best);
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
    int n = pool_len(L, 1);
    struct candidate small[64];
    /* A userdata for a large pool: collected by Lua, so nothing leaks if reading an element raises. */
    struct candidate *c = n <= 64 ? small : lua_newuserdata(L, (size_t)n * sizeof(*c));
    for (int i = 1; i <= n; i++)
        read_candidate(L, v, 1, i, &c[i - 1]);
    struct p2c_ctx x = {.c = c};
    long pick = atc_balancer_p2c((size_t)n, &v->rt->rng, p2c_usable, p2c_lighter, &x);
    if (pick < 0)
        lua_pushnil(L);
    else
        lua_rawgeti(L, 1, (int)pick + 1);
    return 1;
}

/* atc.rendezvous(eps, key [, c]): weighted highest random weight hashing over the available
 * endpoints. With c (>= 1), consistent hashing with bounded loads: an endpoint is skipped when, with
 * this request counted, it would hold more than c times its capacity's share of the requests in flight
 * on the available endpoints (some endpoint is always under that bound). */
int policy_pick_rendezvous(lua_State *L)
{
    struct policy_version *v = policy_api_version(L);
    size_t keylen;
    const char *key = luaL_checklstring(L, 2, &keylen);
    double c_bound = luaL_optnumber(L, 3, 0);
    if (lua_gettop(L) >= 3 && !lua_isnil(L, 3) && c_bound < 1)
        return luaL_argerror(L, 3, "c must be >= 1");
    uint64_t seed = XXH3_64bits(key, keylen);
    int n = pool_len(L, 1), best = 0;
    double best_score = 0, per_slot = HUGE_VAL;
    struct candidate c;
    if (c_bound >= 1) {
        double inflight = 0, capacity = 0;
        for (int i = 1; i <= n; i++) {
            read_candidate(L, v, 1, i, &c);
            if (c.available) {
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
        read_candidate(L, v, 1, i, &c);
        if (!c.available || c.weight <= 0 || c.inflight + 1 > ceil(per_slot * c.capacity))
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
        lua_rawgeti(L, 1, best);
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
        block_tokens = lua_isnumber(L, -1) ? lua_tonumber(L, -1) : ATC_PREFIX_BLOCK_BYTES / 4;
        lua_pop(L, 2);
    }
    int n = pool_len(L, 1), best = 0;
    double best_score = 0, best_load = 0, max_overlap = 0, lo = HUGE_VAL, hi = 0;
    for (int i = 1; i <= n; i++) {
        struct candidate c;
        read_candidate(L, v, 1, i, &c);
        if (!c.available)
            continue;
        lua_rawgeti(L, 1, i);
        int index = policy_api_view_index(v, -1);
        const struct atc_endpoint *ep = index >= 0 ? policy_api_endpoint_at(v, (unsigned)index) : NULL;
        lo = c.inflight < lo ? c.inflight : lo;
        hi = c.inflight > hi ? c.inflight : hi;
        if (lua_rawequal(L, -1, 4)) {
            lua_pop(L, 1);
            continue;
        }
        double overlap;
        if (ep != NULL) {
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
        lua_rawgeti(L, 1, best);
    return 1;
}

/* ---- routing signals (fleet/signals.h) ---- */

/* The signals' clock: the runtime's (virtual time under replay), as the relay's and the replay's. */
static uint64_t signals_now_us(const struct policy_version *v)
{
    return (uint64_t)(policy_now_ms(v->rt) * 1000.0);
}

static const struct atc_signal_params *signal_params(const struct policy_version *v)
{
    /* `atc test` runs unit tests without an endpoint table: the defaults then */
    static const struct atc_signal_params defaults = {
        .prefill_tps = 15000, .itl_us = 12000, .recent_half_life_ms = 2000};
    return v->rt->table != NULL ? &v->rt->table->signals : &defaults;
}

/* The current request's prompt tokens that @p ep would still have to prefill: by its KV events where it
 * publishes them (ep:cached_tokens), else by the prefix index's guess. */
static uint64_t uncached_at(lua_State *L, struct policy_version *v, const struct atc_endpoint *ep)
{
    const struct atc_route_request *req = policy_api_current_req(L, v);
    int64_t exact = req->cached_tokens != NULL ? req->cached_tokens(req->cached_ctx, ep) : -1;
    if (exact >= 0)
        return atc_signals_uncached(req->features->prompt_tokens, (uint64_t)exact, 1);
    uint32_t bt = req->block_tokens ? req->block_tokens : ATC_PREFIX_BLOCK_BYTES / 4;
    return atc_signals_uncached(req->features->prompt_tokens, policy_api_overlap(L, v, ep), bt);
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
int policy_pick_predict_ttft(lua_State *L)
{
    struct policy_version *v = policy_api_version(L);
    const struct atc_endpoint *ep = policy_api_check_view(L, v, 1);
    luaL_checkudata(L, 2, POLICY_MT_REQ);
    const struct atc_signal_params *p = signal_params(v);
    lua_pushnumber(L, atc_signals_predict_ttft_ms(&ep->sig, p, uncached_at(L, v, ep)) +
                          remote_prefill(ep) * 1000.0 / atc_signals_prefill_tps(&ep->sig, p));
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
    lua_pushnumber(L, atc_signals_recent(&ep->sig, signal_params(v), signals_now_us(v)) + remote_recent(ep));
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
    lua_pushnumber(L, atc_signals_prefill_tps(&ep->sig, signal_params(v)));
}
static void push_itl(lua_State *L, struct policy_version *v, const void *of)
{
    EP;
    lua_pushnumber(L, atc_signals_itl_ms(&ep->sig, signal_params(v)));
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
    uint64_t at = atomic_load_explicit(&ep->sig.scraped_at_us, memory_order_acquire), now = signals_now_us(v);
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

/* One element of atc.fastest's pool, read once: from the engine's endpoint behind a view, or from an
 * atc.testing mock's fields (ep = NULL), so a policy's unit tests can use it too. */
struct fast_cand {
    const struct atc_endpoint *ep;
    bool usable;                                               /* available, not skipped */
    double queued, uncached, tps, itl, decoding, recent, load; /* recent < 0: not read yet */
    double uncached_mean;
};

static void read_fast_cand(lua_State *L, struct policy_version *v, int el, struct fast_cand *c)
{
    const struct atc_signal_params *p = signal_params(v);
    int index = policy_api_view_index(v, el);
    const struct atc_endpoint *ep = index >= 0 ? policy_api_endpoint_at(v, (unsigned)index) : NULL;
    c->ep = ep;
    c->recent = -1;
    if (ep != NULL) {
        const struct atc_signals *s = &ep->sig;
        c->usable = policy_api_available(v, ep);
        c->queued =
            (double)atomic_load_explicit(&s->prefill_tokens, memory_order_relaxed) + remote_prefill(ep);
        c->uncached = (double)uncached_at(L, v, ep);
        c->tps = atc_signals_prefill_tps(s, p);
        c->itl = atc_signals_itl_ms(s, p);
        c->decoding = (double)atomic_load_explicit(&s->decoding, memory_order_relaxed) + remote_decoding(ep);
        c->uncached_mean = atc_signals_uncached_mean(s);
        unsigned cap = atc_endpoint_capacity_now(ep);
        c->load = cap ? (double)atc_endpoint_fleet_inflight(ep) / cap : 1.0;
        return;
    }
    if (!lua_istable(L, el))
        luaL_error(L, "atc.fastest: pool element is not an endpoint");
    double inflight = field_number(L, el, "inflight", 0), capacity = field_number(L, el, "capacity", 1);
    lua_getfield(L, el, "available");
    c->usable = lua_isnil(L, -1) ? inflight < capacity : lua_toboolean(L, -1);
    lua_pop(L, 1);
    c->queued = field_number(L, el, "prefill_tokens", 0);
    c->tps = field_number(L, el, "prefill_rate", p->prefill_tps);
    c->itl = field_number(L, el, "itl", (double)p->itl_us / 1000.0);
    c->decoding = field_number(L, el, "decoding", 0);
    c->recent = field_number(L, el, "recent_tokens", 0);
    c->uncached_mean = field_number(L, el, "uncached_mean", 0);
    c->load = capacity > 0 ? inflight / capacity : 1.0;

    double prompt = field_number(L, 2, "prompt_tokens", 0), bt = field_number(L, 2, "block_tokens", 64);
    double uncached = prompt;
    lua_getfield(L, el, "cached_tokens"); /* exact where the mock says so, as uncached_at */
    if (lua_isfunction(L, -1)) {
        lua_pushvalue(L, el);
        lua_pushvalue(L, 2);
        lua_call(L, 2, 1);
    }
    if (lua_isnumber(L, -1)) {
        uncached -= lua_tonumber(L, -1);
        lua_pop(L, 1);
    } else {
        lua_pop(L, 1);
        lua_getfield(L, el, "prefix_overlap");
        lua_pushvalue(L, el);
        lua_pushvalue(L, 2);
        lua_call(L, 2, 1);
        uncached -= lua_tonumber(L, -1) * bt;
        lua_pop(L, 1);
    }
    c->uncached = uncached > 1 ? uncached : 1;
}

static double fast_recent(struct fast_cand *c, const struct atc_signal_params *p, uint64_t now)
{
    if (c->recent < 0)
        c->recent = atc_signals_recent(&c->ep->sig, p, now) + remote_recent(c->ep);
    return c->recent;
}

#define FAST_STACK 32 /* candidates read into a C stack array; a larger pool takes a userdata */

/* The option names atc.fastest reads, kept as upvalues 2.. of its closure: a raw get with a string
 * already interned, where lua_getfield would hash and look up the C string on every call (6 of them were
 * an eighth of a decision of the shipped policy, callgrind). Raw: a policy cannot set metatables. */
enum {
    FAST_RECENT,
    FAST_DECODE,
    FAST_UNCACHED,
    FAST_CONGESTION,
    FAST_POOLED,
    FAST_SKIP,
    FAST_EXPLAIN,
    FAST_NOPTIONS
};
static const char *const fast_options[FAST_NOPTIONS] = {"recent", "decode", "uncached", "congestion",
                                                        "pooled", "skip",   "explain"};

/* Pushes option @p which of the options table (argument 3). */
static void fast_option_push(lua_State *L, int which)
{
    lua_pushvalue(L, lua_upvalueindex(2 + which));
    lua_rawget(L, 3);
}

static double fast_option(lua_State *L, int which, double dflt)
{
    fast_option_push(L, which);
    double x = lua_isnumber(L, -1) ? lua_tonumber(L, -1) : dflt;
    lua_pop(L, 1);
    return x;
}

/* atc.fastest(pool, req [, opts]): the available endpoint of pool where req would get its first token
 * soonest; returns it, its cost and its predicted TTFT (ms), or nil when none is available. The cost of
 * ep, in ms:
 *   (ep.prefill_tokens + w * the request's uncached tokens there) / rate + itl
 *   + opts.recent * ep.recent_tokens / rate + opts.decode * ep.decoding * itl
 * with rate = ep.prefill_rate and itl = ep.itl, or with opts.pooled the means of the pool's (the same
 * hardware's estimates compared, not their noise). w = opts.uncached (default 1: the predicted TTFT);
 * above 1 it values the cache a request leaves behind. opts.congestion (0) raises w with the pool's
 * queues: w = max(opts.uncached, 1 + congestion * mean prefill_tokens / mean uncached_mean), at most
 * CONGESTION_MAX. That is the marginal cost of work in a queue (M/M/1: 1 / (1 - utilisation), and the
 * mean queue is utilisation / (1 - utilisation) requests): near saturation every uncached token a
 * request brings delays the requests behind it too, so cache hits are worth more than their own TTFT.
 * opts.recent (0) spreads traffic that arrives one request at a time; opts.decode (0) weighs the decode
 * batch a request joins. opts.skip: an endpoint never chosen. Ties go to less recent work, then the
 * lower in-flight share. opts.explain: each usable candidate's cost goes to the decision record (as
 * atc.explain(ep, cost, "ttft .. ms, .. uncached")), the chosen one first, when someone reads the record
 * (else nothing is done: explaining costs one option read). The loop runs in C, so a decision at 512
 * endpoints stays in microseconds. */
#define CONGESTION_MAX 16.0

/* The weights and speeds of one call: with opts.pooled every candidate at the pool's mean speeds (tps and
 * itl > 0), else each at its own. */
struct fast_weights {
    double uncached, recent, decode;
    double tps, itl; /* 0: the candidate's own */
};

static double fast_cost(struct fast_cand *x, const struct fast_weights *w, const struct atc_signal_params *p,
                        uint64_t now, double *ttft)
{
    double tps = w->tps > 0 ? w->tps : x->tps, itl = w->tps > 0 ? w->itl : x->itl;
    *ttft = (x->queued + x->uncached) * 1000.0 / tps + itl;
    return *ttft + (w->uncached - 1) * x->uncached * 1000.0 / tps +
           (w->recent > 0 ? w->recent * fast_recent(x, p, now) * 1000.0 / tps : 0) +
           w->decode * x->decoding * itl;
}

/* The pool read by the last atc.fastest of the decision in progress. The shipped policy asks atc.fastest
 * two or three times a decision over the same pool (affinity's bound, priority's hold check, its pick):
 * the later calls reuse what the first read of each endpoint (availability, signals, the uncached tokens
 * by the prefix index) rather than reading it again, which was most of a decision at 512 endpoints. What
 * one decision sees is then one snapshot of the fleet, as the replay's virtual time already gave. The
 * snapshot holds the view of every element, and a later call uses it only if the pool still holds the
 * same views in the same order (a pool is a plain table a policy may change); pools with an element that
 * is not an engine view (a test's mock) are read every time. It lives in a userdata, an upvalue of the
 * atc.fastest closure, so the collector frees it with the state. */
struct fast_snap {
    uint64_t decision; /* v->serial when read: which decision */
    const struct atc_route_request *req;
    int n, cap;
    double pool_tps, pool_itl, pool_queued, pool_uncached; /* sums over the pool */
    const void **views;                                    /* n views, after c[cap] in the same block */
    bool *available;                                       /* n, before the call's skip */
    struct fast_cand c[]; /* n candidates; c[i].usable is the last call's (available and not skipped) */
};

#define FAST_SNAP_UPVALUE (2 + FAST_NOPTIONS)

/* The snapshot of this decision for the pool at index 1 (of @p n elements), or NULL when there is none.
 * On a match each candidate's usable is set again for this call's @p skip (a view's address, or NULL) and
 * its lazily read recent work is reset (read again at this call's clock). */
static struct fast_snap *fast_snap_find(lua_State *L, const struct policy_version *v, int n, const void *skip)
{
    struct fast_snap *s = lua_touserdata(L, lua_upvalueindex(FAST_SNAP_UPVALUE));
    if (s == NULL || v->req == NULL || s->req != v->req || s->decision != v->serial || s->n != n)
        return NULL;
    for (int i = 1; i <= n; i++) {
        lua_rawgeti(L, 1, i);
        const void *view = lua_topointer(L, -1);
        lua_pop(L, 1);
        if (view != s->views[i - 1])
            return NULL;
    }
    for (int i = 0; i < n; i++) {
        s->c[i].usable = s->available[i] && s->views[i] != skip;
        s->c[i].recent = -1;
    }
    return s;
}

/* A snapshot with room for @p n elements, not valid until the caller fills it and sets req, or NULL when
 * there can be none (no decision in progress, an empty pool). */
static struct fast_snap *fast_snap_make(lua_State *L, const struct policy_version *v, int n)
{
    if (v->req == NULL || n == 0)
        return NULL;
    struct fast_snap *s = lua_touserdata(L, lua_upvalueindex(FAST_SNAP_UPVALUE));
    if (s == NULL || s->cap < n) {
        int cap = n < 64 ? 64 : n;
        size_t size = sizeof(*s) + (size_t)cap * (sizeof(s->c[0]) + sizeof(s->views[0]) + sizeof(bool));
        s = lua_newuserdata(L, size); /* raises on no memory: nothing changed yet */
        s->cap = cap;
        s->views = (const void **)(s->c + cap);
        s->available = (bool *)(s->views + cap);
        lua_replace(L, lua_upvalueindex(FAST_SNAP_UPVALUE));
    }
    s->req = NULL; /* invalid until filled */
    s->n = n;
    return s;
}

/* opts.explain: the candidates' costs in the record, the chosen (best, 1-based) first. A mock (no
 * engine endpoint) has no id the record could name, and is left out. */
static void fast_explain(struct atc_explain *out, struct fast_cand *c, int n, int best,
                         const struct fast_weights *w, const struct atc_signal_params *p, uint64_t now)
{
    for (int k = 0; k <= n; k++) {
        int i = k == 0 ? best : k; /* best first, then the others in the pool's order */
        if ((k > 0 && i == best) || i == 0 || !c[i - 1].usable || c[i - 1].ep == NULL)
            continue;
        double ttft, cost = fast_cost(&c[i - 1], w, p, now, &ttft);
        char note[48];
        snprintf(note, sizeof(note), "ttft %.1f ms, %.0f uncached", ttft, c[i - 1].uncached);
        atc_explain_add(out, c[i - 1].ep->id, cost, note);
    }
}
static int policy_pick_fastest(lua_State *L)
{
    struct policy_version *v = policy_api_version(L);
    luaL_checktype(L, 1, LUA_TTABLE);
    luaL_checkany(L, 2);
    struct fast_weights w = {.uncached = 1};
    double w_congestion = 0;
    bool pooled = false, explain = false;
    if (!lua_isnoneornil(L, 3)) {
        luaL_checktype(L, 3, LUA_TTABLE);
        w.recent = fast_option(L, FAST_RECENT, 0);
        w.decode = fast_option(L, FAST_DECODE, 0);
        w.uncached = fast_option(L, FAST_UNCACHED, 1);
        w_congestion = fast_option(L, FAST_CONGESTION, 0);
        fast_option_push(L, FAST_POOLED);
        pooled = lua_toboolean(L, -1);
        lua_pop(L, 1);
        fast_option_push(L, FAST_EXPLAIN);
        explain = lua_toboolean(L, -1);
        lua_pop(L, 1);
        fast_option_push(L, FAST_SKIP);
    } else {
        lua_pushnil(L);
    }
    int skip = lua_gettop(L);
    const void *skip_view = lua_istable(L, skip) ? lua_topointer(L, skip) : NULL;
    const struct atc_signal_params *p = signal_params(v);
    uint64_t now = signals_now_us(v);
    int n = pool_len(L, 1), best = 0;
    /* One pass reads every element and the pool's mean speeds; the next finds the cheapest. The pool is
     * read once a decision into the snapshot (above); a pool with a mock, or outside a decision, is read
     * into a C stack array for up to FAST_STACK elements (no allocation and no garbage), else a userdata;
     * either way a Lua error raised while reading leaks nothing. */
    struct fast_cand stack[FAST_STACK], *c;
    double pool_tps = 0, pool_itl = 0, pool_queued = 0, pool_uncached = 0;
    struct fast_snap *snap = fast_snap_find(L, v, n, skip_view);
    if (snap != NULL) {
        c = snap->c;
        pool_tps = snap->pool_tps;
        pool_itl = snap->pool_itl;
        pool_queued = snap->pool_queued;
        pool_uncached = snap->pool_uncached;
    } else {
        snap = fast_snap_make(L, v, n);
        c = snap != NULL ? snap->c : n <= FAST_STACK ? stack : lua_newuserdata(L, (size_t)n * sizeof(*c));
        bool all_views = snap != NULL;
        for (int i = 1; i <= n; i++) {
            lua_rawgeti(L, 1, i);
            read_fast_cand(L, v, lua_gettop(L), &c[i - 1]);
            if (snap != NULL) {
                all_views = all_views && c[i - 1].ep != NULL;
                snap->views[i - 1] = lua_topointer(L, -1);
                snap->available[i - 1] = c[i - 1].usable;
            }
            c[i - 1].usable = c[i - 1].usable && !lua_rawequal(L, -1, skip);
            lua_pop(L, 1);
            pool_tps += c[i - 1].tps;
            pool_itl += c[i - 1].itl;
            pool_queued += c[i - 1].queued;
            pool_uncached += c[i - 1].uncached_mean;
        }
        if (all_views) { /* valid from now to the end of this decision */
            snap->pool_tps = pool_tps;
            snap->pool_itl = pool_itl;
            snap->pool_queued = pool_queued;
            snap->pool_uncached = pool_uncached;
            snap->decision = v->serial;
            snap->req = v->req;
        }
    }
    if (w_congestion > 0 && pool_uncached > 0) {
        double wc = 1 + w_congestion * pool_queued / pool_uncached;
        wc = wc < CONGESTION_MAX ? wc : CONGESTION_MAX;
        w.uncached = wc > w.uncached ? wc : w.uncached;
    }
    /* every endpoint at the pool's mean speeds: compare the work queued, not noisy rates */
    if (pooled && n > 0) {
        w.tps = pool_tps / n;
        w.itl = pool_itl / n;
    }
    double best_cost = 0, best_ttft = 0;
    for (int i = 1; i <= n; i++) {
        struct fast_cand *x = &c[i - 1];
        if (!x->usable)
            continue;
        double ttft, cost = fast_cost(x, &w, p, now, &ttft);
        bool better = best == 0 || cost < best_cost;
        if (!better && cost == best_cost) { /* a tie: less recent work, then the lighter */
            struct fast_cand *b = &c[best - 1];
            double r = fast_recent(x, p, now), rb = fast_recent(b, p, now);
            better = r < rb || (r == rb && x->load < b->load);
        }
        if (better) {
            best = i;
            best_cost = cost;
            best_ttft = ttft;
        }
    }
    if (explain && v->req != NULL && v->req->explain != NULL)
        fast_explain(v->req->explain, c, n, best, &w, p, now);
    if (best == 0) {
        lua_pushnil(L);
        return 1;
    }
    lua_rawgeti(L, 1, best);
    lua_pushnumber(L, best_cost);
    lua_pushnumber(L, best_ttft);
    return 3;
}

void policy_pick_push_fastest(lua_State *L, struct policy_version *v)
{
    lua_pushlightuserdata(L, v);
    for (int i = 0; i < FAST_NOPTIONS; i++)
        lua_pushstring(L, fast_options[i]);
    lua_pushnil(L); /* the snapshot (struct fast_snap), made by the first call in a decision */
    lua_pushcclosure(L, policy_pick_fastest, 1 + FAST_NOPTIONS + 1);
}
