#ifndef ATC_POLICY_API_H
#define ATC_POLICY_API_H

/* policy_api.c (the views: req, fleet, endpoints, verdicts, the atc table) and policy_pick.c (the host
 * functions over a pool, and the routing signals of a view): what the runtime calls and what the two
 * share. Private to engine/policy/; the
 * contract a policy sees is stdlib/atc/contract.lua. Every function runs on the thread of the policy
 * version's Lua state and may raise a Lua error (longjmp). */

#include <stdbool.h>
#include <stddef.h>

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
/** The endpoint behind the value at @p idx (an endpoint view or an id string), or NULL. */
struct atc_endpoint *policy_api_to_endpoint(struct policy_version *v, int idx);
/** The endpoint index of the view at @p idx, or -1 when it is not an endpoint view. */
int policy_api_view_index(struct policy_version *v, int idx);
/** True when @p ep may take this request (routable, room, not tried). */
bool policy_api_available(const struct policy_version *v, const struct atc_endpoint *ep);

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

/** policy_pick.c: atc.least_loaded, atc.p2c, atc.rendezvous, atc.prefix_pick, atc.fastest (below) and
 * ep:predict_ttft (see stdlib/atc/contract.lua). */
int policy_pick_least_loaded(struct lua_State *L);
int policy_pick_p2c(struct lua_State *L);
int policy_pick_rendezvous(struct lua_State *L);
int policy_pick_prefix_pick(struct lua_State *L);
/** Pushes atc.fastest: a closure over @p v and the option names it reads (its upvalues). */
void policy_pick_push_fastest(struct lua_State *L, struct policy_version *v);
int policy_pick_predict_ttft(struct lua_State *L);
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

#endif
