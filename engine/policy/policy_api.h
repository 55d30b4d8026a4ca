#ifndef ATC_POLICY_API_H
#define ATC_POLICY_API_H

/* policy_api.c (the views: req, endpoints, verdicts, the atc table), policy_fleet.c (the fleet: its
 * methods, the engine lists, atc.pool and atc.find), policy_pick.c (the host functions over a pool, and
 * the routing signals of a view) and policy_fastest.c (atc.fastest): what the runtime calls and what the
 * four share. Private to engine/policy/; the contract a policy sees is stdlib/atc/contract.lua. Every
 * function runs on the thread of the policy version's Lua state and may raise a Lua error (longjmp). */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fleet/endpoint.h"
#include "policy/state.h"

struct lua_State;
struct policy_version;
struct atc_endpoint;
struct atc_route_request;

/** Installs the req, fleet and endpoint metatables and the atc table into the sandbox globals table at
 * the top of the stack; creates the persistent req / fleet userdata. */
void policy_api_open(struct policy_version *v);
/** Rebuilds the endpoint views of @p v for v->rt->table (views made before no longer resolve). May raise a
 * Lua error (out of memory) before it changes anything. */
void policy_api_set_table(struct policy_version *v);
/** The same after atc_endpoint_table_with (slots kept): the views of the endpoints that stayed are the
 * same tables, those of the endpoints that left read nil. Raises on allocation failure. */
void policy_api_update_views(struct policy_version *v);
/** Pushes the view of the endpoint in slot @p index (one table per endpoint, so views compare equal). */
void policy_api_push_view(struct lua_State *L, const struct policy_version *v, unsigned index);
/** The endpoint behind the value at @p idx (an endpoint view or an id string), or NULL. */
struct atc_endpoint *policy_api_to_endpoint(struct policy_version *v, int idx);
/** The endpoint index of the view at @p idx, or -1 when it is not an endpoint view. */
int policy_api_view_index(struct policy_version *v, int idx);
/** True when @p ep may take a request of @p tokens that already tried the @p ntried endpoints @p tried.
 * Inline: the loops over a pool ask it of every endpoint. */
static inline bool policy_api_available_for(const struct atc_endpoint *ep, uint64_t tokens,
                                            struct atc_endpoint *const *tried, size_t ntried)
{
    if (!atc_endpoint_available(ep, tokens))
        return false;
    for (size_t i = 0; i < ntried; i++)
        if (tried[i] == ep)
            return false;
    return true;
}
/** True when @p ep may take this request (routable, room, not tried). */
static inline bool policy_api_available(const struct policy_version *v, const struct atc_endpoint *ep)
{
    return v->req != NULL ? policy_api_available_for(ep, v->req->tokens, v->req->tried, v->req->ntried)
                          : policy_api_available_for(ep, 0, NULL, 0);
}

/** The version whose state runs the current C function (its first upvalue). */
struct policy_version *policy_api_version(struct lua_State *L);
/** The endpoint of @p index in the version's table, or NULL. */
struct atc_endpoint *policy_api_endpoint_at(const struct policy_version *v, unsigned index);
/** The endpoint behind the view at @p idx, or a Lua error. */
const struct atc_endpoint *policy_api_check_view(struct lua_State *L, struct policy_version *v, int idx);
/** The request being decided, or a Lua error outside a decision. */
const struct atc_route_request *policy_api_current_req(struct lua_State *L, struct policy_version *v);
/** Leading prefix blocks of the current request recently routed to @p ep (computed once a decision). */
unsigned policy_api_overlap(struct lua_State *L, struct policy_version *v, const struct atc_endpoint *ep);
/** The same for every endpoint at once: the array by endpoint slot (computed once a decision), or NULL
 * when the request has no prefix blocks or there is no prefix index (every overlap is 0). A Lua error
 * outside a decision. */
const uint16_t *policy_api_overlaps(struct lua_State *L, struct policy_version *v);

/* ---- policy_fleet.c ----
 * An engine list is an array of endpoint views the engine built and hands a policy: fleet:endpoints(model)
 * and fleet:all(), the same table on every call until the endpoint set changes, and atc.pool(list). A
 * policy must not change one (it is shared by every decision: the contract says so, and a list whose
 * length changed, or whose element a host function returns is another, raises). The host functions know
 * one by its address and read its endpoints from this record, in C, without reading the table. */
struct policy_list {
    const void *table; /* the Lua table's address, the key; anchored in the registry by ref */
    int ref;
    uint32_t n;
    struct atc_endpoint **eps; /* n: element i + 1's endpoint */
    const void **views;        /* n: element i + 1's view (its address) */
    uint32_t *at;              /* endpoint slot -> its place + 1 (0: not in it), made by atc.find; or NULL */
};

/** atc.pool(list) and atc.find(pool, ep_or_id) (see stdlib/atc/contract.lua). */
int policy_fleet_pool(struct lua_State *L);
int policy_fleet_find(struct lua_State *L);
/** The engine list at @p idx, or NULL when that value is none (any other table, a mock's list). Raises,
 * naming @p fn, when the list's length is not what the engine built (a policy changed it); under `atc test`
 * when any element is not. */
const struct policy_list *policy_fleet_list(struct lua_State *L, struct policy_version *v, int idx,
                                            const char *fn);
/** Pushes element @p i (1-based) of engine list @p l, the table at @p idx; raises, naming @p fn, when it
 * is not the view the engine put there. */
void policy_fleet_push_element(struct lua_State *L, const struct policy_list *l, int idx, int i,
                               const char *fn);
/** The endpoint with id @p id (@p len bytes) in the version's table, or NULL (found by a hash built once
 * per view set). */
struct atc_endpoint *policy_fleet_by_id(struct policy_version *v, const char *id, size_t len);
/** Forgets every engine list and the id hash (their tables are unreferenced): the views are being
 * rebuilt. Never raises. */
void policy_fleet_reset(struct policy_version *v);
/** Frees what the lists hold in C, without the Lua state (it is closed or about to be). */
void policy_fleet_free(struct policy_version *v);

/** policy_pick.c: atc.least_loaded, atc.p2c, atc.rendezvous, atc.prefix_pick and ep:predict_ttft (see
 * stdlib/atc/contract.lua). */
int policy_pick_least_loaded(struct lua_State *L);
int policy_pick_p2c(struct lua_State *L);
int policy_pick_rendezvous(struct lua_State *L);
int policy_pick_prefix_pick(struct lua_State *L);
int policy_pick_predict_ttft(struct lua_State *L);
/** policy_fastest.c: pushes atc.fastest, a closure over @p v and the option names it reads (its upvalues). */
void policy_fastest_push(struct lua_State *L, struct policy_version *v);

/* policy_pick.c: what the host functions over a pool share (atc.fastest's file too). */
/** The length of the pool at @p idx (a table), or a Lua error (not a table; longer than any fleet). */
int policy_pick_pool_len(struct lua_State *L, int idx);
/** Field @p name of the table at @p idx as a number, @p dflt when it is not one (a test's mock). */
double policy_pick_field(struct lua_State *L, int idx, const char *name, double dflt);
/** Pushes element @p i of the pool at index 1, the pick of host function @p fn (checked against its
 * engine list @p list, when it is one: policy_fleet_push_element). */
void policy_pick_push(struct lua_State *L, const struct policy_list *list, int i, const char *fn);
/** The routing signals' clock, in µs: the runtime's (virtual time under replay). */
uint64_t policy_pick_now_us(const struct policy_version *v);
/** The signals' priors: the table's, or the defaults without one (`atc test`'s unit tests). */
const struct atc_signal_params *policy_pick_params(const struct policy_version *v);

/** What the uncached prompt tokens of the request being decided take, read once for a loop over a pool:
 * policy_pick_uncached_req (a Lua error outside a decision), then policy_uncached_of for each endpoint. */
struct policy_uncached {
    const struct atc_route_request *req;
    const uint16_t *overlaps; /* policy_api_overlaps: NULL when none */
    uint64_t prompt_tokens;
    uint32_t block_tokens;
};
struct policy_uncached policy_pick_uncached_req(struct lua_State *L, struct policy_version *v);
/** The request's prompt tokens that @p ep would still have to prefill: by its KV events where it publishes
 * them (ep:cached_tokens), else by the prefix index's guess. */
static inline uint64_t policy_uncached_of(const struct policy_uncached *r, const struct atc_endpoint *ep)
{
    int64_t exact = r->req->cached_tokens != NULL ? r->req->cached_tokens(r->req->cached_ctx, ep) : -1;
    if (exact >= 0)
        return atc_signals_uncached(r->prompt_tokens, (uint64_t)exact, 1);
    return atc_signals_uncached(r->prompt_tokens, r->overlaps != NULL ? r->overlaps[ep->index] : 0,
                                r->block_tokens);
}
/** One name a view or table offers a policy: a value pushed by @p push (of the request, endpoint or
 * verdict it is read from), or a @p method (pushed as a closure over the version). The views' reads and
 * the atc table's registration go through these tables only, so what the C side serves is exactly what
 * they list; tests/policy/contract_test.lua checks the lists against stdlib/atc/contract.lua both ways. */
struct policy_field {
    const char *name;
    void (*push)(struct lua_State *L, struct policy_version *v, const void *of);
    int (*method)(struct lua_State *L);
};
/** policy_pick.c: the routing-signal fields of an endpoint view, NULL-terminated. */
extern const struct policy_field policy_pick_signal_fields[];
/** policy_fleet.c: fleet's methods (endpoints, all, models, endpoint), NULL-terminated. */
extern const struct policy_field policy_fleet_methods[];

#endif
