/* atc.fastest(pool, req [, opts]): the available endpoint of pool where req would get its first token
 * soonest, by the engine's prediction, in C. It is most of the shipped policy's decision, and the part
 * that grows with the fleet, so it is built for a pool of hundreds:
 * - an engine list (fleet:endpoints, atc.pool: policy_fleet.c) is read from its record, without a Lua
 *   call per element, the endpoints prefetched a few ahead (struct atc_endpoint keeps what is read here in
 *   its first cache lines);
 * - what the first call of a decision reads is kept for its later calls over the same pool (a snapshot:
 *   the shipped policy asks two or three times a decision);
 * - the pool is kept as columns (one array per field), and as runs of alike endpoints (idle ones are),
 *   so that a call costs a few runs rather than every endpoint.
 * Like every function a policy calls, it validates its arguments before it changes anything (a Lua error
 * longjmps). */

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <lauxlib.h>

#include "fleet/endpoint.h"
#include "fleet/signals.h"
#include "policy/decision.h"
#include "policy/policy_api.h"
#include "policy/state.h"

/* The pool as atc.fastest reads it, one column per field, from the engine's endpoint behind each view or
 * from an atc.testing mock's fields (ep NULL), so that a policy's unit tests can use it too. */
struct fast_cols {
    double *queued, *uncached, *tps, *itl, *decoding;
    double *recent; /* < 0: not read yet (it decays, and only ties need it) */
    double *load;   /* in flight / capacity now (1 without capacity): breaks ties */
    bool *usable;   /* available (a skip is the call's: fast_skipped) */
    /* Each element's endpoint and view: an engine list's own arrays (nothing copied), else columns of
     * these (ep_own, views_own); views NULL when not kept (a pool read outside a snapshot). */
    const struct atc_endpoint *const *ep;
    const void *const *views;
    const struct atc_endpoint **ep_own;
    const void **views_own;
    /* Runs: elements in a row whose cost inputs (queued, uncached, decoding, recent work as read; the
     * rates too unless pooled) are equal, so that their costs are: a pool of idle endpoints is a few
     * runs. run[k] is the first element of run k (run[nruns] = n); champ[k] its usable element that a tie
     * goes to (the least recent work, then the lightest, then the first), -1 when none,
     * FAST_CHAMP_UNKNOWN until a call needs it. rates_vary: some run's elements have rates of their own
     * (tps, itl) that differ, so that the runs stand only for a pooled call (the pool's mean rates for
     * every element). recent_unread: some element's recent work was not read with it (it decays: read
     * when needed), so that the runs do not stand for a call that weighs it. */
    int *run, *champ;
    int nruns;
    bool rates_vary, recent_unread;
};

#define FAST_CHAMP_UNKNOWN (-2)

/* Bytes a pool of one element takes in a block carved by fast_cols_carve (+ 1 element: the runs'
 * sentinel). */
#define FAST_COL_BYTES (7 * sizeof(double) + 2 * sizeof(void *) + 2 * sizeof(int) + sizeof(bool))

/* Carves @p cap elements' columns out of @p block (double-aligned, room for cap + 1). */
static void fast_cols_carve(void *block, int cap, struct fast_cols *c)
{
    double *d = block;
    c->queued = d;
    c->uncached = d + cap;
    c->tps = d + 2 * cap;
    c->itl = d + 3 * cap;
    c->decoding = d + 4 * cap;
    c->recent = d + 5 * cap;
    c->load = d + 6 * cap;
    c->ep_own = (const struct atc_endpoint **)(d + 7 * cap);
    c->views_own = (const void **)(c->ep_own + cap);
    c->run = (int *)(c->views_own + cap);
    c->champ = c->run + cap + 1;
    c->usable = (bool *)(c->champ + cap + 1);
    c->ep = c->ep_own;
    c->views = NULL;
    c->nruns = 0;
    c->rates_vary = false;
    c->recent_unread = false;
}

/* The bits of @p x: two doubles with the same bits give the same results in every computation. */
static inline uint64_t bits_of(double x)
{
    uint64_t b;
    memcpy(&b, &x, sizeof(b));
    return b;
}

/* Element @p i (> 0) and the runs (the elements before it are in): 1 when it starts a run, 2 when it
 * continues one with rates of its own (they vary). Its inputs are compared bit for bit (no branch per
 * field: this runs for every element read). */
static inline unsigned fast_run_of(const struct fast_cols *c, int i)
{
    uint64_t cost = (bits_of(c->queued[i]) ^ bits_of(c->queued[i - 1])) |
                    (bits_of(c->uncached[i]) ^ bits_of(c->uncached[i - 1])) |
                    (bits_of(c->decoding[i]) ^ bits_of(c->decoding[i - 1])) |
                    (bits_of(c->recent[i]) ^ bits_of(c->recent[i - 1]));
    uint64_t rates =
        (bits_of(c->tps[i]) ^ bits_of(c->tps[i - 1])) | (bits_of(c->itl[i]) ^ bits_of(c->itl[i - 1]));
    return (unsigned)(cost != 0) | (unsigned)(cost == 0 && rates != 0) << 1;
}

/* Closes the runs of @p n elements: their champions are not known yet. */
static void fast_runs_close(struct fast_cols *c, int n)
{
    c->run[c->nruns] = n;
    for (int k = 0; k < c->nruns; k++)
        c->champ[k] = FAST_CHAMP_UNKNOWN;
}

/* The pool's sums that atc.fastest's weights take. */
struct fast_sums {
    double tps, itl, queued, uncached_mean;
};

/* The priors of one call, so that a candidate without samples costs no division (atc_signals_itl_ms's). */
struct fast_priors {
    double tps, itl;
};

static struct fast_priors fast_priors_of(const struct atc_signal_params *p)
{
    return (struct fast_priors){.tps = p->prefill_tps, .itl = (double)p->itl_us / 1000.0};
}

/* The other replicas' part of an endpoint's signals (fleet/endpoint.h's remote; 0 without a cluster). */
static double remote_recent(const struct atc_endpoint *ep)
{
    return atomic_load_explicit(&ep->remote.recent_tokens, memory_order_relaxed);
}

/* What an engine endpoint's read needs of the request being decided, read once for a loop. */
struct fast_req {
    struct policy_uncached u;
    uint64_t tokens;
    struct atc_endpoint *const *tried;
    size_t ntried;
    uint64_t now_us; /* the decision's clock */
};

/* Element @p i, an engine endpoint, as atc.fastest reads it for the request being decided (@p r); its
 * uncached_mean into @p uncached_mean (for the pool's sums only). No Lua. The rates are
 * atc_signals_prefill_tps's and atc_signals_itl_ms's, with the priors @p pr computed once a call; the
 * uncached tokens policy_uncached_of's, by the prefix index's overlaps alone when @p exact is false (no KV
 * events: the loop then has no call in it). Token counts are far below 2^63: converted as signed integers
 * (the same double, in fewer instructions than an unsigned 64-bit conversion). */
static inline __attribute__((always_inline)) void read_ep(const struct fast_priors *pr,
                                                          const struct fast_req *r, bool exact,
                                                          const struct atc_endpoint *ep, struct fast_cols *c,
                                                          int i, double *uncached_mean)
{
    const struct atc_signals *s = &ep->sig;
    /* recent work breaks ties, which are common (idle endpoints): read now when it is none (one load),
     * else when a tie needs it (it decays: exp2) */
    c->recent[i] =
        atomic_load_explicit(&s->recent, memory_order_relaxed) >> 32 == 0 ? 0.0 + remote_recent(ep) : -1;
    c->usable[i] = policy_api_available_for(ep, r->tokens, r->tried, r->ntried);
    double tps = atomic_load_explicit(&s->prefill_tps_ewma, memory_order_relaxed);
    c->tps[i] = tps > 0 ? tps : pr->tps;
    c->queued[i] = atc_signals_queued(s, c->tps[i], r->now_us) +
                   (double)(int64_t)atomic_load_explicit(&ep->remote.prefill_tokens, memory_order_relaxed);
    uint64_t uncached =
        exact ? policy_uncached_of(&r->u, ep)
              : atc_signals_uncached(r->u.prompt_tokens, r->u.overlaps != NULL ? r->u.overlaps[ep->index] : 0,
                                     r->u.block_tokens);
    c->uncached[i] = (double)(int64_t)uncached;
    double itl = atomic_load_explicit(&s->itl_ms_ewma, memory_order_relaxed);
    c->itl[i] = itl > 0 ? itl : pr->itl;
    c->decoding[i] = (double)atomic_load_explicit(&s->decoding, memory_order_relaxed) +
                     (double)atomic_load_explicit(&ep->remote.decoding, memory_order_relaxed);
    *uncached_mean = atc_signals_uncached_mean(s);
    unsigned cap = atc_endpoint_capacity_now(ep);
    c->load[i] = cap ? (double)atc_endpoint_fleet_inflight(ep) / cap : 1.0;
}

/* Element @p i, the value at @p el: an engine view, or a test's mock read by its fields. */
static void read_element(lua_State *L, struct policy_version *v, int el, struct fast_cols *c, int i,
                         double *uncached_mean)
{
    const struct atc_signal_params *p = policy_pick_params(v);
    int index = policy_api_view_index(v, el);
    const struct atc_endpoint *ep = index >= 0 ? policy_api_endpoint_at(v, (unsigned)index) : NULL;
    c->ep_own[i] = ep;
    if (ep != NULL) {
        struct fast_priors pr = fast_priors_of(p);
        const struct atc_route_request *req = policy_api_current_req(L, v);
        struct fast_req r = {.u = policy_pick_uncached_req(L, v),
                             .tokens = req->tokens,
                             .tried = req->tried,
                             .ntried = req->ntried,
                             .now_us = policy_pick_now_us(v)};
        read_ep(&pr, &r, true, ep, c, i, uncached_mean);
        return;
    }
    if (!lua_istable(L, el))
        luaL_error(L, "atc.fastest: pool element is not an endpoint");
    double inflight = policy_pick_field(L, el, "inflight", 0),
           capacity = policy_pick_field(L, el, "capacity", 1);
    lua_getfield(L, el, "available");
    c->usable[i] = lua_isnil(L, -1) ? inflight < capacity : lua_toboolean(L, -1);
    lua_pop(L, 1);
    c->queued[i] = policy_pick_field(L, el, "prefill_tokens", 0);
    c->tps[i] = policy_pick_field(L, el, "prefill_rate", p->prefill_tps);
    c->itl[i] = policy_pick_field(L, el, "itl", (double)p->itl_us / 1000.0);
    c->decoding[i] = policy_pick_field(L, el, "decoding", 0);
    c->recent[i] = policy_pick_field(L, el, "recent_tokens", 0);
    *uncached_mean = policy_pick_field(L, el, "uncached_mean", 0);
    c->load[i] = capacity > 0 ? inflight / capacity : 1.0;

    double prompt = policy_pick_field(L, 2, "prompt_tokens", 0),
           bt = policy_pick_field(L, 2, "block_tokens", 64);
    double uncached = prompt;
    lua_getfield(L, el, "cached_tokens"); /* exact where the mock says so, as policy_uncached_of */
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
    c->uncached[i] = uncached > 1 ? uncached : 1;
}

static inline __attribute__((always_inline)) double
fast_recent(struct fast_cols *c, int i, const struct atc_signal_params *p, uint64_t now)
{
    if (c->recent[i] < 0)
        c->recent[i] = atc_signals_recent(&c->ep[i]->sig, p, now) + remote_recent(c->ep[i]);
    return c->recent[i];
}

#define FAST_STACK 32 /* candidates read into a C stack block; a larger pool takes a userdata */

/* How far ahead of the read an engine list's endpoint is prefetched, and what of it: the cache lines of
 * the fields read_ep reads, which struct atc_endpoint keeps first (up to its signals' rates). */
#define FAST_PREFETCH 4
static inline void fast_prefetch(const struct atc_endpoint *ep)
{
    for (size_t off = 0; off < offsetof(struct atc_endpoint, sig.uncached_ewma) + 8; off += 64)
        __builtin_prefetch((const char *)ep + off);
}

/* Reads engine list @p list (n > 0 elements) into @p c for the request being decided (@p r): every
 * element, its run, the sums. Its running values (the sums, the runs, the columns' addresses) stay in
 * registers (kept in memory across the loop, they made each element wait for the last one's stores), and
 * it is made twice by the compiler, @p exact a constant: with KV events or without (no call in the loop:
 * fewer values to keep across one). */
static inline __attribute__((always_inline)) void read_list_as(const struct policy_list *list,
                                                               const struct fast_req *r,
                                                               const struct fast_priors *pr, bool exact,
                                                               struct fast_cols *c, struct fast_sums *sums)
{
    int n = (int)list->n, nruns = 1;
    unsigned vary = 0;
    bool unread = false;
    double tps = 0, itl = 0, queued = 0, uncached_mean = 0;
    struct fast_cols col = *c; /* (a local copy: the columns' addresses stay in registers) */
    struct atc_endpoint *const *eps = list->eps;
    col.run[0] = 0;
    for (int i = 0; i < n; i++) {
        if (i + FAST_PREFETCH < n) /* the endpoints are apart in memory: ask for one ahead */
            fast_prefetch(eps[i + FAST_PREFETCH]);
        double mean;
        read_ep(pr, r, exact, eps[i], &col, i, &mean);
        unread |= col.recent[i] < 0;
        if (i > 0) {
            unsigned run = fast_run_of(&col, i);
            col.run[nruns] = i;
            nruns += (int)(run & 1);
            vary |= run;
        }
        tps += col.tps[i];
        itl += col.itl[i];
        queued += col.queued[i];
        uncached_mean += mean;
    }
    c->nruns = nruns;
    c->rates_vary = (vary & 2) != 0;
    c->recent_unread = unread;
    *sums = (struct fast_sums){.tps = tps, .itl = itl, .queued = queued, .uncached_mean = uncached_mean};
}

static __attribute__((noinline)) void read_list(const struct policy_list *list, const struct fast_req *r,
                                                const struct fast_priors *pr, struct fast_cols *c,
                                                struct fast_sums *sums)
{
    if (r->u.req->cached_tokens == NULL)
        read_list_as(list, r, pr, false, c, sums);
    else
        read_list_as(list, r, pr, true, c, sums);
}

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
    FAST_STEP,
    FAST_NOPTIONS
};
static const char *const fast_options[FAST_NOPTIONS] = {"recent", "decode",  "uncached", "congestion",
                                                        "pooled", "skip",    "explain",  "step_tokens"};

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

/* The cost of ep, in ms:
 *   (the prefill queued there + w * the request's uncached tokens there) / rate + itl
 * (the prefill queued: ep.prefill_tokens less what the server did of it since the last first token there,
 * atc_signals_queued; a test's mock: its prefill_tokens)
 *   + opts.recent * ep.recent_tokens / rate + opts.decode * ep.decoding * itl
 * with rate = ep.prefill_rate and itl = ep.itl, or with opts.pooled the means of the pool's (the same
 * hardware's estimates compared, not their noise). w = opts.uncached (default 1: the predicted TTFT);
 * above 1 it values the cache a request leaves behind. opts.congestion (0) raises w with the pool's
 * queues: w = max(opts.uncached, 1 + congestion * mean queued prefill / mean uncached_mean), at most
 * CONGESTION_MAX. That is the marginal cost of work in a queue (M/M/1: 1 / (1 - utilisation), and the
 * mean queue is utilisation / (1 - utilisation) requests): near saturation every uncached token a
 * request brings delays the requests behind it too, so cache hits are worth more than their own TTFT.
 * opts.recent (0) spreads traffic that arrives one request at a time; opts.decode (0) weighs the decode
 * batch a request joins. opts.step_tokens (0: not weighed) is the engine's iteration token budget (vLLM's
 * max_num_batched_tokens, SGLang's chunked_prefill_size): an engine fills an iteration's budget with the
 * next waiting prompt once the prompts ahead are scheduled, so a request sent where prefill is queued
 * shares the last iteration of the prompt ahead of it, whose first token then waits for up to
 * min(uncached, step_tokens) more tokens of prefill (that prompt's delay, not this one's: sent once it
 * is done, the same request starts in the next iteration and gets its first token no later); that delay
 * counts in the cost. opts.skip: an endpoint never chosen. Ties go to less recent work, then the
 * lower in-flight share, then the first. opts.explain: each usable candidate's cost goes to the decision
 * record (as atc.explain(ep, cost, "ttft .. ms, .. uncached")), the chosen one first, when someone reads
 * the record (else nothing is done: explaining costs one option read). */
#define CONGESTION_MAX 16.0

/* The weights and speeds of one call: with opts.pooled every candidate at the pool's mean speeds (tps and
 * itl > 0), else each at its own. */
struct fast_weights {
    double uncached, recent, decode, step;
    double tps, itl; /* 0: the candidate's own */
};

/* The cost of candidate @p i, and its predicted TTFT into @p ttft. A term whose weight is 0 (or the
 * uncached one's 1) adds exactly 0, and is left out. (The weights by value: in a loop the compiler keeps
 * them in registers.) */
static inline __attribute__((always_inline)) double fast_cost(struct fast_cols *c, int i,
                                                              struct fast_weights w,
                                                              const struct atc_signal_params *p, uint64_t now,
                                                              double *ttft)
{
    double tps = w.tps > 0 ? w.tps : c->tps[i], itl = w.tps > 0 ? w.itl : c->itl[i];
    *ttft = (c->queued[i] + c->uncached[i]) * 1000.0 / tps + itl;
    double cost = *ttft;
    if (w.uncached != 1)
        cost += (w.uncached - 1) * c->uncached[i] * 1000.0 / tps;
    if (w.recent > 0)
        cost += w.recent * fast_recent(c, i, p, now) * 1000.0 / tps;
    if (w.decode != 0)
        cost += w.decode * c->decoding[i] * itl;
    if (w.step > 0 && c->queued[i] > 0)
        cost += fmin(c->uncached[i], w.step) * 1000.0 / tps;
    return cost;
}

/* Whether candidate @p i is one this call may choose: available, and not the call's skip (@p skip: a
 * view's address; a pool read without its views had the skip left out as it was read). */
static inline bool fast_choosable(const struct fast_cols *c, int i, const void *skip)
{
    return c->usable[i] && (skip == NULL || c->views == NULL || c->views[i] != skip);
}

/* The pool read by the last atc.fastest of the decision in progress. The shipped policy asks atc.fastest
 * two or three times a decision over the same pool (affinity's bound, priority's hold check, its pick):
 * the later calls reuse what the first read of each endpoint (availability, signals, the uncached tokens
 * by the prefix index) rather than reading it again. What one decision sees is then one snapshot of the
 * fleet, as the replay's virtual time already gave. The snapshot holds the view of every element, and a
 * later call uses it only if the pool still holds the same views in the same order (a plain table may
 * have changed; an engine list does not); pools with an element that is not an engine view (a test's
 * mock) are read every time. It lives in a userdata, an upvalue of the atc.fastest closure, so the
 * collector frees it with the state. A call takes it out of the upvalue onto its own stack for as long
 * as it runs and puts it back when it has read the pool: a mock's cached_tokens or prefix_overlap is Lua,
 * and may call atc.fastest again; that nested call then sees no snapshot and reads into its own columns,
 * so that it can neither write into the outer call's columns nor let the collector free them. */
struct fast_snap {
    uint64_t decision; /* v->serial when read: which decision */
    const struct atc_route_request *req;
    const struct policy_list *list; /* the engine list read, NULL for a plain table */
    uint32_t recent_ms;             /* the clock (ms) of the candidates' recent work read so far */
    int n, cap;
    double pool_tps, pool_itl, pool_queued, pool_uncached; /* sums over the pool */
    struct fast_cols c;                                    /* n candidates */
    double block[];                                        /* the columns */
};

#define FAST_SNAP_UPVALUE (2 + FAST_NOPTIONS)

/* The snapshot of this decision for the pool at index 1 (of @p n elements; its engine list @p list, or
 * NULL), or NULL when there is none. On a match its lazily read recent work is reset (read again at this
 * call's clock @p now_us) unless the clock is in the same millisecond (recent work reads the same then). An
 * engine list is compared without reading the table (a policy does not change one). The snapshot is the
 * one the call took (fast_snap_take) at stack index @p at. */
static struct fast_snap *fast_snap_find(lua_State *L, int at, const struct policy_version *v,
                                        const struct policy_list *list, int n, uint64_t now_us)
{
    struct fast_snap *s = lua_touserdata(L, at);
    if (s == NULL || v->req == NULL || s->req != v->req || s->decision != v->serial || s->n != n)
        return NULL;
    if (list != NULL) {
        if (s->list != list && memcmp(s->c.views, list->views, (size_t)n * sizeof(*s->c.views)) != 0)
            return NULL;
    } else {
        for (int i = 1; i <= n; i++) {
            lua_rawgeti(L, 1, i);
            const void *view = lua_topointer(L, -1);
            lua_pop(L, 1);
            if (view != s->c.views[i - 1])
                return NULL;
        }
    }
    if (s->recent_ms != (uint32_t)(now_us / 1000u)) { /* recent work and the champions found by it */
        for (int i = 0; i < n; i++)
            s->c.recent[i] = s->c.ep[i] != NULL ? -1 : s->c.recent[i];
        s->c.recent_unread = true;
        fast_runs_close(&s->c, n);
        s->recent_ms = (uint32_t)(now_us / 1000u);
    }
    return s;
}

/* Takes the snapshot out of the closure's upvalue and pushes it (nil when there is none): the call's own
 * until fast_snap_give_back, referenced by its stack, so that a nested call (a mock's function) neither
 * reuses nor replaces it. Returns its stack index. */
static int fast_snap_take(lua_State *L)
{
    lua_pushvalue(L, lua_upvalueindex(FAST_SNAP_UPVALUE));
    lua_pushnil(L);
    lua_replace(L, lua_upvalueindex(FAST_SNAP_UPVALUE));
    return lua_gettop(L);
}

/* Puts the snapshot at stack index @p at (fast_snap_take's, or fast_snap_make's) back into the upvalue
 * for the decision's later calls. (Raises nothing; when a Lua error skips it the snapshot is dropped,
 * and the next call makes another.) */
static void fast_snap_give_back(lua_State *L, int at)
{
    lua_pushvalue(L, at);
    lua_replace(L, lua_upvalueindex(FAST_SNAP_UPVALUE));
}

/* A snapshot with room for @p n elements, not valid until the caller fills it and sets req, or NULL when
 * there can be none (no decision in progress, an empty pool): the taken one at stack index @p at, else
 * one made in its place. */
static struct fast_snap *fast_snap_make(lua_State *L, int at, const struct policy_version *v, int n)
{
    if (v->req == NULL || n == 0)
        return NULL;
    struct fast_snap *s = lua_touserdata(L, at);
    if (s == NULL || s->cap < n) {
        int cap = n < 64 ? 64 : n;
        s = lua_newuserdata(L, sizeof(*s) + (size_t)(cap + 1) * FAST_COL_BYTES);
        s->cap = cap; /* (lua_newuserdata raises on no memory: nothing changed yet) */
        lua_replace(L, at);
    }
    fast_cols_carve(s->block, s->cap, &s->c);
    s->req = NULL; /* invalid until filled */
    s->n = n;
    return s;
}

/* opts.explain: the candidates' costs in the record, the chosen (best, 0-based; -1: none) first. A mock
 * (no engine endpoint) has no id the record could name, and is left out. */
static void fast_explain(struct atc_explain *out, struct fast_cols *c, int n, int best, const void *skip,
                         struct fast_weights w, const struct atc_signal_params *p, uint64_t now)
{
    for (int k = -1; k < n; k++) {
        int i = k < 0 ? best : k; /* best first, then the others in the pool's order */
        if ((k >= 0 && i == best) || i < 0 || !fast_choosable(c, i, skip) || c->ep[i] == NULL)
            continue;
        double ttft, cost = fast_cost(c, i, w, p, now, &ttft);
        char note[48];
        snprintf(note, sizeof(note), "ttft %.1f ms, %.0f uncached", ttft, c->uncached[i]);
        atc_explain_add(out, c->ep[i]->id, cost, note);
    }
}

/* The cheapest choosable candidate of @p c (0-based; -1: none), its cost and predicted TTFT, one candidate
 * at a time: ties go to less recent work, then the lighter, then the first. */
static int fast_best_each(struct fast_cols *c, int n, const void *skip, struct fast_weights w,
                          const struct atc_signal_params *p, uint64_t now, double *best_cost,
                          double *best_ttft)
{
    const double *restrict load = c->load;
    int best = -1;
    double b_cost = 0, b_ttft = 0, best_load = 0, best_recent = -1; /* -1: not read yet */
    for (int i = 0; i < n; i++) {
        if (!fast_choosable(c, i, skip))
            continue;
        double ttft, cost = fast_cost(c, i, w, p, now, &ttft);
        bool better = best < 0 || cost < b_cost;
        double r = -1;                   /* i's recent work, when a tie read it */
        if (!better && cost == b_cost) { /* a tie: less recent work, then the lighter */
            r = fast_recent(c, i, p, now);
            if (best_recent < 0)
                best_recent = fast_recent(c, best, p, now);
            better = r < best_recent || (r == best_recent && load[i] < best_load);
        }
        if (better) {
            best = i;
            b_cost = cost;
            b_ttft = ttft;
            best_load = load[i];
            best_recent = r;
        }
    }
    *best_cost = b_cost;
    *best_ttft = b_ttft;
    return best;
}

/* Run @p k's champion (struct fast_cols), found on first use and kept with the runs; -3 when a value it
 * compares is not a number (the runs then decide nothing). */
static int fast_champ(struct fast_cols *c, int k, const struct atc_signal_params *p, uint64_t now)
{
    if (c->champ[k] != FAST_CHAMP_UNKNOWN)
        return c->champ[k];
    int champ = -1;
    double best_recent = 0, best_load = 0;
    for (int i = c->run[k]; i < c->run[k + 1]; i++) {
        if (!c->usable[i])
            continue;
        double r = fast_recent(c, i, p, now), load = c->load[i];
        if (isnan(r) || isnan(load))
            return -3;
        if (champ < 0 || r < best_recent || (r == best_recent && load < best_load)) {
            champ = i;
            best_recent = r;
            best_load = load;
        }
    }
    return c->champ[k] = champ;
}

/* The same as fast_best_each, run by run: a run's elements cost the same, so the cheapest is the
 * champion of a cheapest run (and of the earlier run on a tie of their champions' recent work and load,
 * its elements being the earlier ones): the first element of the least (cost, recent work, load) in the
 * pool, as fast_best_each finds it, as long as none of those is not a number (then it is asked). The
 * champions are found once a decision (the snapshot keeps them), so that a pool of idle endpoints costs
 * a few runs a call instead of every endpoint. Only without a skip (the champions are of the available
 * elements), with recent work weighed only when every element's was read (none was), and with the rates
 * pooled unless every run's are the same. */
static int fast_best(struct fast_cols *c, int n, const void *skip, struct fast_weights w,
                     const struct atc_signal_params *p, uint64_t now, double *best_cost, double *best_ttft)
{
    if (skip != NULL || (w.recent > 0 && c->recent_unread) || (c->rates_vary && !(w.tps > 0)) ||
        2 * c->nruns > n) /* (most runs of one: one at a time is as quick) */
        return fast_best_each(c, n, skip, w, p, now, best_cost, best_ttft);
    int best = -1;
    double b_cost = 0, b_ttft = 0, b_recent = 0, b_load = 0;
    for (int k = 0; k < c->nruns; k++) {
        int i = c->run[k];
        double ttft, cost = fast_cost(c, i, w, p, now, &ttft);
        if (isnan(cost))
            return fast_best_each(c, n, skip, w, p, now, best_cost, best_ttft);
        if (best >= 0 && cost > b_cost)
            continue;
        int champ = fast_champ(c, k, p, now);
        if (champ == -3)
            return fast_best_each(c, n, skip, w, p, now, best_cost, best_ttft);
        if (champ < 0)
            continue;
        double r = c->recent[champ], load = c->load[champ];
        if (best < 0 || cost < b_cost || r < b_recent || (r == b_recent && load < b_load)) {
            best = champ;
            b_cost = cost;
            b_ttft = ttft;
            b_recent = r;
            b_load = load;
        }
    }
    *best_cost = b_cost;
    *best_ttft = b_ttft;
    return best;
}

static int fastest(lua_State *L)
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
        w.step = fast_option(L, FAST_STEP, 0);
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
    const struct atc_signal_params *p = policy_pick_params(v);
    uint64_t now = policy_pick_now_us(v);
    int n = policy_pick_pool_len(L, 1);
    const struct policy_list *list = policy_fleet_list(L, v, 1, "atc.fastest");
    /* One pass reads every element and the pool's mean speeds; the next finds the cheapest. The pool is
     * read once a decision into the snapshot (above); a pool with a mock, or outside a decision, is read
     * into a C stack block for up to FAST_STACK elements (no allocation and no garbage), else a userdata;
     * either way a Lua error raised while reading leaks nothing. An engine list is read from its record,
     * in C alone. */
    double stack[(FAST_STACK + 1) * FAST_COL_BYTES / sizeof(double) + 1];
    struct fast_cols own, *c;
    double pool_tps = 0, pool_itl = 0, pool_queued = 0, pool_uncached = 0;
    int snap_at = fast_snap_take(L);
    struct fast_snap *snap = fast_snap_find(L, snap_at, v, list, n, now);
    if (snap != NULL) {
        c = &snap->c;
        pool_tps = snap->pool_tps;
        pool_itl = snap->pool_itl;
        pool_queued = snap->pool_queued;
        pool_uncached = snap->pool_uncached;
    } else {
        snap = fast_snap_make(L, snap_at, v, n);
        if (snap != NULL) {
            c = &snap->c;
        } else {
            fast_cols_carve(n <= FAST_STACK ? stack : lua_newuserdata(L, (size_t)(n + 1) * FAST_COL_BYTES), n,
                            &own);
            c = &own;
        }
        bool all_views = snap != NULL;
        if (list != NULL && n > 0) {
            /* (policy_api_current_req: outside a decision, the error every read of an element raises) */
            const struct atc_route_request *req = policy_api_current_req(L, v);
            struct fast_req r = {.u = policy_pick_uncached_req(L, v),
                                 .tokens = req->tokens,
                                 .tried = req->tried,
                                 .ntried = req->ntried,
                                 .now_us = policy_pick_now_us(v)};
            struct fast_priors pr = fast_priors_of(p);
            struct fast_sums sums;
            c->ep = (const struct atc_endpoint *const *)list->eps; /* the list's own arrays */
            c->views = list->views;
            read_list(list, &r, &pr, c, &sums);
            pool_tps = sums.tps;
            pool_itl = sums.itl;
            pool_queued = sums.queued;
            pool_uncached = sums.uncached_mean;
        }
        if (list == NULL && snap != NULL)
            c->views = (const void *const *)c->views_own;
        for (int i = 0; list == NULL && i < n; i++) {
            lua_rawgeti(L, 1, i + 1);
            double uncached_mean;
            read_element(L, v, lua_gettop(L), c, i, &uncached_mean);
            if (snap != NULL) {
                all_views = all_views && c->ep[i] != NULL;
                c->views_own[i] = lua_topointer(L, -1);
            } else if (lua_rawequal(L, -1, skip)) { /* (no views kept: the skip left out now) */
                c->usable[i] = false;
            }
            lua_pop(L, 1);
            unsigned run = i == 0 ? 1 : fast_run_of(c, i);
            c->run[c->nruns] = i;
            c->nruns += (int)(run & 1);
            c->rates_vary |= (run & 2) != 0;
            c->recent_unread |= c->recent[i] < 0;
            pool_tps += c->tps[i];
            pool_itl += c->itl[i];
            pool_queued += c->queued[i];
            pool_uncached += uncached_mean;
        }
        fast_runs_close(c, n);
        if (all_views) { /* valid from now to the end of this decision */
            snap->pool_tps = pool_tps;
            snap->pool_itl = pool_itl;
            snap->pool_queued = pool_queued;
            snap->pool_uncached = pool_uncached;
            snap->decision = v->serial;
            snap->req = v->req;
            snap->list = list;
            snap->recent_ms = (uint32_t)(now / 1000u);
        }
    }
    fast_snap_give_back(L, snap_at); /* (no Lua is called from here on) */
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
    const void *skipping = c->views != NULL ? skip_view : NULL; /* (else left out as read) */
    double best_cost, best_ttft;
    int best = fast_best(c, n, skipping, w, p, now, &best_cost, &best_ttft);
    if (explain && v->req != NULL && v->req->explain != NULL)
        fast_explain(v->req->explain, c, n, best, skipping, w, p, now);
    if (best < 0) {
        lua_pushnil(L);
        return 1;
    }
    policy_pick_push(L, list, best + 1, "atc.fastest");
    lua_pushnumber(L, best_cost);
    lua_pushnumber(L, best_ttft);
    return 3;
}

void policy_fastest_push(lua_State *L, struct policy_version *v)
{
    lua_pushlightuserdata(L, v);
    for (int i = 0; i < FAST_NOPTIONS; i++)
        lua_pushstring(L, fast_options[i]);
    lua_pushnil(L); /* the snapshot (struct fast_snap), made by the first call in a decision */
    lua_pushcclosure(L, fastest, 1 + FAST_NOPTIONS + 1);
}
