/* What a policy sees: the request, the fleet and its endpoints as read-only views of the engine's
 * live state, and the host functions of the `atc` table. Every function here validates its arguments
 * before it changes anything: a Lua error longjmps out of it. */

#include <ctype.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <xxhash.h>

#include "config/roles.h"
#include "fleet/affinity.h"
#include "fleet/balancer.h"
#include "fleet/endpoint.h"
#include "fleet/health.h"
#include "base/log.h"
#include "policy/decision.h"
#include "policy/policy_api.h"
#include "policy/state.h"

#define AFFINITY_DEFAULT_TTL_MS (10 * 60 * 1000)
#define AFFINITY_MAX_TTL_MS (30.0 * 24 * 3600 * 1000)
#define LOG_LINES_PER_SECOND 20

struct policy_version *policy_api_version(lua_State *L)
{
    return lua_touserdata(L, lua_upvalueindex(1));
}

const struct atc_policy_settings *atc_policy_settings_of(lua_State *L)
{
    return &policy_api_version(L)->rt->s;
}

struct atc_endpoint *policy_api_endpoint_at(const struct policy_version *v, unsigned index)
{
    const struct atc_endpoint_table *t = v->rt->table;
    return t != NULL && index < t->nslots ? t->slots[index] : NULL; /* NULL: a removed endpoint's view */
}

/* Views are found by address (LuaJIT never moves a table, and the registry keeps views alive) in a
 * small open-addressing table: no Lua call on the hot path of the C balancers. */
static size_t view_slot(const void *p, size_t mask)
{
    return (size_t)(((uintptr_t)p >> 4) * 0x9E3779B97F4A7C15ull >> 32) & mask;
}

int policy_api_view_index(struct policy_version *v, int idx)
{
    if (v->view_slots == NULL || lua_type(v->L, idx) != LUA_TTABLE)
        return -1;
    const void *p = lua_topointer(v->L, idx);
    for (size_t i = view_slot(p, v->view_mask);; i = (i + 1) & v->view_mask) {
        if (v->view_slots[i].view == p)
            return (int)v->view_slots[i].index;
        if (v->view_slots[i].view == NULL)
            return -1;
    }
}

static void view_remember(struct policy_version *v, const void *p, unsigned index)
{
    size_t i = view_slot(p, v->view_mask);
    while (v->view_slots[i].view != NULL)
        i = (i + 1) & v->view_mask;
    v->view_slots[i].view = p;
    v->view_slots[i].index = index;
}

struct atc_endpoint *policy_api_to_endpoint(struct policy_version *v, int idx)
{
    lua_State *L = v->L;
    int index = policy_api_view_index(v, idx);
    if (index >= 0)
        return policy_api_endpoint_at(v, (unsigned)index);
    if (lua_type(L, idx) == LUA_TSTRING && v->rt->table != NULL) {
        size_t len;
        const char *id = lua_tolstring(L, idx, &len);
        return policy_fleet_by_id(v, id, len); /* "a\0junk" is no id */
    }
    return NULL;
}

void policy_api_push_view(lua_State *L, const struct policy_version *v, unsigned index)
{
    lua_rawgeti(L, LUA_REGISTRYINDEX, v->endpoints_ref);
    lua_rawgeti(L, -1, (int)index + 1);
    lua_remove(L, -2);
}

/* The endpoint behind the view passed as self, or a Lua error. */
const struct atc_endpoint *policy_api_check_view(lua_State *L, struct policy_version *v, int idx)
{
    int index = policy_api_view_index(v, idx);
    const struct atc_endpoint *ep = index >= 0 ? policy_api_endpoint_at(v, (unsigned)index) : NULL;
    if (ep == NULL)
        luaL_argerror(L, idx, "expected an endpoint");
    return ep;
}

const struct atc_route_request *policy_api_current_req(lua_State *L, struct policy_version *v)
{
    if (v->req == NULL)
        luaL_error(L, "req is only valid during its own decision");
    return v->req;
}

static int readonly_newindex(lua_State *L)
{
    return luaL_error(L, "attempt to modify a read-only table");
}

/* ---- endpoints ---- */

static int ep_has_tag(lua_State *L)
{
    struct policy_version *v = policy_api_version(L);
    const struct atc_endpoint *ep = policy_api_check_view(L, v, 1);
    const char *tag = luaL_checkstring(L, 2);
    bool found = false;
    for (size_t i = 0; i < ep->ntags && !found; i++)
        found = strcmp(ep->tags[i], tag) == 0;
    lua_pushboolean(L, found);
    return 1;
}

/* Leading prefix blocks of the current request recently routed to @p ep. One pass over the blocks
 * answers for every endpoint; later calls in the decision reuse it. */
unsigned policy_api_overlap(lua_State *L, struct policy_version *v, const struct atc_endpoint *ep)
{
    const struct atc_route_request *req = policy_api_current_req(L, v);
    const struct atc_features *f = req->features;
    if (v->rt->prefix == NULL || f == NULL || f->nblocks == 0)
        return 0;
    if (!v->overlaps_ready) {
        atc_prefix_index_overlaps(v->rt->prefix, f->blocks, f->nblocks, v->overlaps, v->rt->table->nslots);
        v->overlaps_ready = true;
    }
    return v->overlaps[ep->index];
}

const uint16_t *policy_api_overlaps(lua_State *L, struct policy_version *v)
{
    const struct atc_route_request *req = policy_api_current_req(L, v);
    const struct atc_features *f = req->features;
    if (v->rt->prefix == NULL || f == NULL || f->nblocks == 0)
        return NULL;
    if (!v->overlaps_ready) {
        atc_prefix_index_overlaps(v->rt->prefix, f->blocks, f->nblocks, v->overlaps, v->rt->table->nslots);
        v->overlaps_ready = true;
    }
    return v->overlaps;
}

static int ep_prefix_overlap(lua_State *L)
{
    struct policy_version *v = policy_api_version(L);
    const struct atc_endpoint *ep = policy_api_check_view(L, v, 1);
    luaL_checkudata(L, 2, POLICY_MT_REQ);
    lua_pushinteger(L, (lua_Integer)policy_api_overlap(L, v, ep));
    return 1;
}

/* The exact figure, from the endpoint's KV events, or nil where it publishes none. */
static int ep_cached_tokens(lua_State *L)
{
    struct policy_version *v = policy_api_version(L);
    const struct atc_endpoint *ep = policy_api_check_view(L, v, 1);
    luaL_checkudata(L, 2, POLICY_MT_REQ);
    const struct atc_route_request *req = policy_api_current_req(L, v);
    int64_t n = req->cached_tokens != NULL ? req->cached_tokens(req->cached_ctx, ep) : -1;
    if (n >= 0)
        lua_pushinteger(L, (lua_Integer)n);
    else
        lua_pushnil(L);
    return 1;
}

static void push_opt_string(lua_State *L, const char *s)
{
    if (s != NULL)
        lua_pushstring(L, s);
    else
        lua_pushnil(L);
}

/* A string, or nil when not known: NULL and "" both mean absent (the relay and replay keep an absent
 * session or tenant as ""). */
static void push_known_string(lua_State *L, const char *s)
{
    push_opt_string(L, s != NULL && s[0] != '\0' ? s : NULL);
}

/* ---- field tables ----
 * A view's reads go through one table of its fields (struct policy_field). The live reads are found by
 * open addressing over the name's length and first and last letters, built once per process: a read
 * costs a hash and usually one compare, as the first-letter switch it replaced. */

#define FIELD_SLOTS 64 /* a power of two, above twice the fields of the largest view */

struct field_index {
    const struct policy_field *slot[FIELD_SLOTS];
};

static unsigned field_hash(const char *k, size_t len)
{
    return (unsigned)(len * 7 + (unsigned char)k[0] * 3 + (unsigned char)k[len - 1]) & (FIELD_SLOTS - 1);
}

static void field_index_add(struct field_index *ix, const struct policy_field *f)
{
    for (; f->name != NULL; f++) {
        unsigned h = field_hash(f->name, strlen(f->name));
        while (ix->slot[h] != NULL)
            h = (h + 1) & (FIELD_SLOTS - 1);
        ix->slot[h] = f;
    }
}

static const struct policy_field *field_find(const struct field_index *ix, const char *k, size_t len)
{
    if (len == 0)
        return NULL;
    for (unsigned h = field_hash(k, len);; h = (h + 1) & (FIELD_SLOTS - 1)) {
        const struct policy_field *f = ix->slot[h];
        if (f == NULL || (strncmp(f->name, k, len) == 0 && f->name[len] == '\0'))
            return f;
    }
}

/* ---- endpoint views ----
 * An endpoint view is a table (static fields: id, model, version, capacity, weight, and the methods,
 * read at table speed) whose static part falls back to ep_live for the live fields. The view's index is
 * kept in the static table under a key no script can name. */

#define EP const struct atc_endpoint *ep = of
static void push_ep_id(lua_State *L, struct policy_version *v, const void *of)
{
    EP;
    (void)v;
    lua_pushstring(L, ep->id);
}
static void push_ep_model(lua_State *L, struct policy_version *v, const void *of)
{
    EP;
    (void)v;
    lua_pushstring(L, ep->model);
}
static void push_ep_version(lua_State *L, struct policy_version *v, const void *of)
{
    EP;
    (void)v;
    push_opt_string(L, ep->version);
}
static void push_ep_capacity(lua_State *L, struct policy_version *v, const void *of)
{
    EP;
    (void)v;
    lua_pushinteger(L, (lua_Integer)ep->capacity);
}
static void push_ep_weight(lua_State *L, struct policy_version *v, const void *of)
{
    EP;
    (void)v;
    lua_pushinteger(L, (lua_Integer)ep->weight);
}
static void push_ep_role(lua_State *L, struct policy_version *v, const void *of)
{
    EP;
    (void)v;
    lua_pushstring(L, ep->role < 3 ? atc_role_names[ep->role] : "both");
}
static void push_ep_available(lua_State *L, struct policy_version *v, const void *of)
{
    lua_pushboolean(L, policy_api_available(v, of));
}
static void push_ep_inflight(lua_State *L, struct policy_version *v, const void *of)
{
    (void)v;
    lua_pushinteger(L, (lua_Integer)atc_endpoint_fleet_inflight(of)); /* every replica's */
}
static void push_ep_inflight_tokens(lua_State *L, struct policy_version *v, const void *of)
{
    (void)v;
    lua_pushnumber(L, (double)atc_endpoint_fleet_tokens(of));
}
static void push_ep_load(lua_State *L, struct policy_version *v, const void *of)
{
    (void)v;
    unsigned cap = atc_endpoint_capacity_now(of); /* less while slow-starting */
    lua_pushnumber(L, cap ? (double)atc_endpoint_fleet_inflight(of) / cap : 1.0);
}
static void push_ep_last_error(lua_State *L, struct policy_version *v, const void *of)
{
    EP;
    (void)v;
    char err[ATC_HEALTH_TEXT_WORDS * 8]; /* a copy: the main thread may rewrite it meanwhile */
    if (ep->health != NULL && atc_health_last_error(ep->health, err, sizeof(err)) > 0)
        lua_pushstring(L, err);
    else
        lua_pushnil(L);
}
static void push_ep_last_check(lua_State *L, struct policy_version *v, const void *of)
{
    EP;
    (void)v;
    double at =
        ep->health != NULL ? atomic_load_explicit(&ep->health->last_check_ms, memory_order_relaxed) : 0;
    if (at > 0)
        lua_pushnumber(L, at); /* atc.now()'s clock */
    else
        lua_pushnil(L);
}
static void push_ep_ttft_ewma(lua_State *L, struct policy_version *v, const void *of)
{
    EP;
    (void)v;
    if (ep->ttft_ewma_ms > 0) /* 0: no answer measured yet */
        lua_pushnumber(L, ep->ttft_ewma_ms);
    else
        lua_pushnil(L);
}
static void push_ep_tags(lua_State *L, struct policy_version *v, const void *of)
{
    EP;
    (void)v;
    lua_createtable(L, (int)ep->ntags, 0);
    for (size_t i = 0; i < ep->ntags; i++) {
        lua_pushstring(L, ep->tags[i]);
        lua_rawseti(L, -2, (int)i + 1);
    }
}
static void push_ep_health(lua_State *L, struct policy_version *v, const void *of)
{
    EP;
    (void)v;
    lua_pushstring(L, ep->health != NULL ? atc_health_state_name(atc_health_state_of(ep->health))
                      : ep->routable     ? "healthy"
                                         : "draining");
}
static void push_ep_consecutive_failures(lua_State *L, struct policy_version *v, const void *of)
{
    EP;
    (void)v;
    lua_pushinteger(L, ep->health != NULL ? (lua_Integer)atomic_load_explicit(
                                                &ep->health->consecutive_failures, memory_order_relaxed)
                                          : 0);
}
static void push_ep_errors(lua_State *L, struct policy_version *v, const void *of)
{
    EP;
    (void)v;
    lua_pushnumber(L, (double)ep->errors_total);
}
#undef EP

/* Set in each view's static part when the views are built (a version's table does not change). */
static const struct policy_field ep_static_fields[] = {
    {"id", push_ep_id, NULL},
    {"model", push_ep_model, NULL},
    {"version", push_ep_version, NULL},
    {"capacity", push_ep_capacity, NULL},
    {"weight", push_ep_weight, NULL},
    {"role", push_ep_role, NULL},
    {"has_tag", NULL, ep_has_tag},
    {"prefix_overlap", NULL, ep_prefix_overlap},
    {"cached_tokens", NULL, ep_cached_tokens},
    {"predict_ttft", NULL, policy_pick_predict_ttft},
    {NULL, NULL, NULL},
};

/* Read at each access (with policy_pick.c's policy_pick_signal_fields). */
static const struct policy_field ep_live_fields[] = {
    {"available", push_ep_available, NULL},
    {"inflight", push_ep_inflight, NULL},
    {"inflight_tokens", push_ep_inflight_tokens, NULL},
    {"load", push_ep_load, NULL},
    {"last_error", push_ep_last_error, NULL},
    {"last_check", push_ep_last_check, NULL},
    {"ttft_ewma", push_ep_ttft_ewma, NULL},
    {"tags", push_ep_tags, NULL},
    {"health", push_ep_health, NULL},
    {"consecutive_failures", push_ep_consecutive_failures, NULL},
    {"errors", push_ep_errors, NULL},
    {NULL, NULL, NULL},
};

static const char view_index_key;

static struct field_index ep_index, req_index_of; /* built by build_indexes, read-only after */

static int ep_live(lua_State *L)
{
    struct policy_version *v = policy_api_version(L);
    lua_pushlightuserdata(L, (void *)&view_index_key);
    lua_rawget(L, 1);
    const struct atc_endpoint *ep =
        lua_isnumber(L, -1) ? policy_api_endpoint_at(v, (unsigned)lua_tointeger(L, -1)) : NULL;
    size_t len;
    const char *k = lua_tolstring(L, 2, &len);
    const struct policy_field *f = ep != NULL && k != NULL ? field_find(&ep_index, k, len) : NULL;
    if (f != NULL)
        f->push(L, v, ep);
    else
        lua_pushnil(L);
    return 1;
}

static int ep_tostring(lua_State *L)
{
    struct policy_version *v = policy_api_version(L);
    int index = policy_api_view_index(v, 1);
    const struct atc_endpoint *ep = index >= 0 ? policy_api_endpoint_at(v, (unsigned)index) : NULL;
    lua_pushfstring(L, "endpoint %s", ep != NULL ? ep->id : "?");
    return 1;
}

/* ---- req ---- */

static int req_header(lua_State *L)
{
    struct policy_version *v = policy_api_version(L);
    luaL_checkudata(L, 1, POLICY_MT_REQ);
    const char *name = luaL_checkstring(L, 2);
    const struct atc_route_request *req = policy_api_current_req(L, v);
    push_opt_string(L, req->header != NULL ? req->header(req->header_ctx, name) : NULL);
    return 1;
}

#define REQ const struct atc_route_request *req = of
static void push_req_model(lua_State *L, struct policy_version *v, const void *of)
{
    REQ;
    (void)v;
    lua_pushstring(L, req->features->model);
}
static void push_req_priority(lua_State *L, struct policy_version *v, const void *of)
{
    REQ;
    (void)v;
    lua_pushinteger(L, req->priority);
}
static void push_req_session(lua_State *L, struct policy_version *v, const void *of)
{
    REQ;
    (void)v;
    push_known_string(L, req->session);
}
static void push_req_tenant(lua_State *L, struct policy_version *v, const void *of)
{
    REQ;
    (void)v;
    push_known_string(L, req->tenant);
}
static void push_req_prompt_tokens(lua_State *L, struct policy_version *v, const void *of)
{
    REQ;
    (void)v;
    lua_pushinteger(L, (lua_Integer)req->features->prompt_tokens);
}
static void push_req_max_tokens(lua_State *L, struct policy_version *v, const void *of)
{
    REQ;
    (void)v;
    if (req->features->max_tokens >= 0)
        lua_pushnumber(L, (double)req->features->max_tokens);
    else
        lua_pushnil(L);
}
static void push_req_n(lua_State *L, struct policy_version *v, const void *of)
{
    REQ;
    (void)v;
    lua_pushinteger(L, (lua_Integer)req->features->choices);
}
static void push_req_stream(lua_State *L, struct policy_version *v, const void *of)
{
    REQ;
    (void)v;
    lua_pushboolean(L, req->features->stream);
}
static void push_req_id(lua_State *L, struct policy_version *v, const void *of)
{
    REQ;
    (void)v;
    lua_pushstring(L, req->id);
}
static void push_req_kind(lua_State *L, struct policy_version *v, const void *of)
{
    REQ;
    (void)v;
    lua_pushstring(L, atc_request_kind_name(req->kind));
}
static void push_req_path(lua_State *L, struct policy_version *v, const void *of)
{
    REQ;
    (void)v;
    lua_pushstring(L, req->path);
}
static void push_req_attempt(lua_State *L, struct policy_version *v, const void *of)
{
    REQ;
    (void)v;
    lua_pushinteger(L, (lua_Integer)req->attempt);
}
static void push_req_blocks(lua_State *L, struct policy_version *v, const void *of)
{
    REQ;
    (void)v;
    lua_pushinteger(L, (lua_Integer)req->features->nblocks);
}
static void push_req_block_tokens(lua_State *L, struct policy_version *v, const void *of)
{
    REQ;
    (void)v;
    lua_pushinteger(L, atc_block_tokens(req->block_tokens));
}
static void push_req_tools(lua_State *L, struct policy_version *v, const void *of)
{
    REQ;
    (void)v;
    lua_pushboolean(L, req->features->has_tools);
}
#undef REQ

static const struct policy_field req_fields[] = {
    {"id", push_req_id, NULL},
    {"model", push_req_model, NULL},
    {"kind", push_req_kind, NULL},
    {"path", push_req_path, NULL},
    {"priority", push_req_priority, NULL},
    {"tenant", push_req_tenant, NULL},
    {"session", push_req_session, NULL},
    {"stream", push_req_stream, NULL},
    {"prompt_tokens", push_req_prompt_tokens, NULL},
    {"max_tokens", push_req_max_tokens, NULL},
    {"n", push_req_n, NULL},
    {"attempt", push_req_attempt, NULL},
    {"blocks", push_req_blocks, NULL},
    {"block_tokens", push_req_block_tokens, NULL},
    {"tools", push_req_tools, NULL},
    {"header", NULL, req_header}, /* one closure, req_index's second upvalue */
    {NULL, NULL, NULL},
};

static pthread_once_t indexes_once = PTHREAD_ONCE_INIT;

static void build_indexes(void)
{
    field_index_add(&ep_index, ep_live_fields);
    field_index_add(&ep_index, policy_pick_signal_fields);
    field_index_add(&req_index_of, req_fields);
}

static int req_index(lua_State *L)
{
    struct policy_version *v = policy_api_version(L);
    size_t len;
    const char *k = luaL_checklstring(L, 2, &len);
    const struct atc_route_request *req = policy_api_current_req(L, v);
    const struct policy_field *f = field_find(&req_index_of, k, len);
    if (f == NULL)
        lua_pushnil(L);
    else if (f->method != NULL)
        lua_pushvalue(L, lua_upvalueindex(2));
    else
        f->push(L, v, req);
    return 1;
}

/* ---- verdicts ---- */

static struct policy_verdict *push_verdict(lua_State *L, enum atc_decision_kind kind)
{
    struct policy_verdict *vd = lua_newuserdata(L, sizeof(*vd));
    memset(vd, 0, sizeof(*vd));
    vd->kind = kind;
    luaL_getmetatable(L, POLICY_MT_VERDICT);
    lua_setmetatable(L, -2);
    return vd;
}

static int atc_queue(lua_State *L)
{
    const char *reason = luaL_optstring(L, 1, "waiting for capacity");
    struct policy_verdict *vd = push_verdict(L, ATC_DECISION_QUEUE);
    snprintf(vd->message, sizeof(vd->message), "%s", reason);
    return 1;
}

static int atc_reject(lua_State *L)
{
    lua_Integer status = luaL_checkinteger(L, 1);
    const char *message = luaL_optstring(L, 2, "rejected by policy");
    if (status < 400 || status > 599) /* (named: `return atc.reject(...)` is a tail call, which has none) */
        return luaL_error(L, "atc.reject: status must be 400-599, got %d", (int)status);
    struct policy_verdict *vd = push_verdict(L, ATC_DECISION_REJECT);
    vd->status = (int)status;
    snprintf(vd->message, sizeof(vd->message), "%s", message);
    return 1;
}

static int verdict_tostring(lua_State *L)
{
    struct policy_verdict *vd = lua_touserdata(L, 1);
    if (vd->kind == ATC_DECISION_QUEUE)
        lua_pushfstring(L, "queue (%s)", vd->message);
    else
        lua_pushfstring(L, "reject %d (%s)", vd->status, vd->message);
    return 1;
}

static void push_verdict_kind(lua_State *L, struct policy_version *v, const void *of)
{
    (void)v;
    lua_pushstring(L, ((const struct policy_verdict *)of)->kind == ATC_DECISION_QUEUE ? "queue" : "reject");
}
static void push_verdict_status(lua_State *L, struct policy_version *v, const void *of)
{
    const struct policy_verdict *vd = of;
    (void)v;
    if (vd->kind == ATC_DECISION_REJECT)
        lua_pushinteger(L, vd->status);
    else
        lua_pushnil(L);
}
static void push_verdict_message(lua_State *L, struct policy_version *v, const void *of)
{
    (void)v;
    lua_pushstring(L, ((const struct policy_verdict *)of)->message);
}

static const struct policy_field verdict_fields[] = {
    {"kind", push_verdict_kind, NULL},
    {"status", push_verdict_status, NULL},
    {"message", push_verdict_message, NULL},
    {NULL, NULL, NULL},
};

static int verdict_index(lua_State *L)
{
    struct policy_verdict *vd = lua_touserdata(L, 1);
    const char *k = luaL_checkstring(L, 2);
    for (const struct policy_field *f = verdict_fields; f->name != NULL; f++)
        if (strcmp(k, f->name) == 0) {
            f->push(L, NULL, vd);
            return 1;
        }
    lua_pushnil(L);
    return 1;
}

/* ---- host functions ---- */

static int atc_random(lua_State *L)
{
    struct policy_version *v = policy_api_version(L);
    double u = (double)(atc_random_next(&v->rt->rng) >> 11) * 0x1.0p-53;
    if (lua_isnoneornil(L, 1)) {
        lua_pushnumber(L, u);
        return 1;
    }
    lua_Integer n = luaL_checkinteger(L, 1);
    if (n < 1)
        return luaL_argerror(L, 1, "must be at least 1");
    lua_pushinteger(L, 1 + (lua_Integer)(u * (double)n));
    return 1;
}

static int atc_now(lua_State *L)
{
    lua_pushnumber(L, policy_now_ms(policy_api_version(L)->rt));
    return 1;
}

static int atc_hash(lua_State *L)
{
    size_t len;
    const char *s = luaL_checklstring(L, 1, &len);
    /* 52 bits: exact in a Lua number, so hashes compare and divide without surprises. */
    lua_pushnumber(L, (double)(XXH3_64bits(s, len) & ((1ull << 52) - 1)));
    return 1;
}

/* The length of a script position the line starts with ("capability.lua:16: ", as error(msg, level) writes
 * it), else 0: such a line is about that place (an alias init checks), not about the atc.log call. */
static size_t leading_position(const char *line)
{
    const char *colon = strstr(line, ".lua:");
    if (colon == NULL || memchr(line, ' ', (size_t)(colon - line)) != NULL)
        return 0;
    const char *p = colon + 5;
    if (!isdigit((unsigned char)*p))
        return 0;
    while (isdigit((unsigned char)*p))
        p++;
    return p[0] == ':' && p[1] == ' ' ? (size_t)(p + 2 - line) : 0;
}

static int atc_log(lua_State *L)
{
    struct policy_version *v = policy_api_version(L);
    double now = policy_now_ms(v->rt) / 1000.0;
    if (now - v->log_window_start >= 1.0) {
        v->log_window_start = now;
        v->log_count = 0;
    }
    if (++v->log_count > LOG_LINES_PER_SECOND)
        return 0;
    char line[1024];
    size_t n = 0;
    int top = lua_gettop(L);
    for (int i = 1; i <= top && n < sizeof(line) - 1; i++) {
        const char *s = lua_isstring(L, i) ? lua_tostring(L, i) : luaL_typename(L, i);
        n += (size_t)snprintf(line + n, sizeof(line) - n, "%s%s", i > 1 ? " " : "", s);
    }
    if (v->rt->s.quiet && (v->req == NULL || strcmp(v->req->id, "atc-reload-check") == 0))
        return 0; /* init() on a worker that repeats the leader's load: the leader said it */
    lua_Debug ar;
    bool where = leading_position(line) == 0 && lua_getstack(L, 1, &ar) && lua_getinfo(L, "Sl", &ar);
    if (v->rt->s.log != NULL && v->req != NULL && strcmp(v->req->id, "atc-reload-check") == 0)
        return 0;               /* atc test: the load's made-up requests are not the test's traffic */
    if (v->rt->s.log != NULL) { /* atc test: the line belongs to the test that runs */
        char out[1400];
        if (where)
            snprintf(out, sizeof(out), "%s:%d: %s", ar.short_src, ar.currentline, line);
        else
            snprintf(out, sizeof(out), "%s", line);
        v->rt->s.log(v->rt->s.log_ctx, out);
    } else if (where)
        atc_info("policy v%llu %s:%d: %s", (unsigned long long)v->version, ar.short_src, ar.currentline,
                 line);
    else
        atc_info("policy v%llu: %s", (unsigned long long)v->version, line);
    return 0;
}

/* atc.explain(ep, score [, note]): a candidate's score for the decision record. Checked always, kept only
 * when someone reads the record (the request's explain is set), so that explaining costs nothing then. */
static int atc_explain(lua_State *L)
{
    struct policy_version *v = lua_touserdata(L, lua_upvalueindex(1));
    const struct atc_endpoint *ep = policy_api_to_endpoint(v, 1);
    int t = lua_type(L, 1); /* without a table (atc test's mocks), any table or id passes */
    if (ep == NULL && (v->rt->table != NULL || (t != LUA_TTABLE && t != LUA_TSTRING)))
        luaL_argerror(L, 1, "expected an endpoint or an endpoint id");
    double score = luaL_checknumber(L, 2);
    const char *note = luaL_optstring(L, 3, NULL);
    if (ep != NULL && v->req != NULL && v->req->explain != NULL)
        atc_explain_add(v->req->explain, ep->id, score, note);
    return 0;
}

/* ---- affinity ---- */

static const char *affinity_target(lua_State *L, struct policy_version *v, int idx)
{
    const struct atc_endpoint *ep = policy_api_to_endpoint(v, idx);
    if (ep != NULL)
        return ep->id;
    size_t len;
    if (lua_type(L, idx) == LUA_TSTRING) {
        const char *id = lua_tolstring(L, idx, &len);
        if (strlen(id) == len)
            return id;
    } else if (lua_istable(L, idx)) {
        lua_getfield(L, idx, "id");
        /* only a string the table holds: a number converted here would be a string nothing keeps */
        const char *id = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &len) : NULL;
        lua_pop(L, 1); /* still referenced by the table */
        if (id != NULL && strlen(id) == len)
            return id;
    }
    luaL_argerror(L, idx, "expected an endpoint or an endpoint id");
    return NULL;
}

static int affinity_get(lua_State *L)
{
    struct policy_version *v = policy_api_version(L);
    size_t len;
    const char *key = luaL_checklstring(L, 1, &len);
    char id[ATC_AFFINITY_ID_MAX + 1];
    size_t idlen = v->rt->affinity != NULL ? atc_affinity_get(v->rt->affinity, key, len,
                                                              (uint64_t)policy_now_ms(v->rt), id, sizeof(id))
                                           : 0;
    if (idlen > 0)
        lua_pushlstring(L, id, idlen);
    else
        lua_pushnil(L);
    return 1;
}

static int affinity_set(lua_State *L)
{
    struct policy_version *v = policy_api_version(L);
    size_t len;
    const char *key = luaL_checklstring(L, 1, &len);
    const char *id = affinity_target(L, v, 2);
    double ttl = luaL_optnumber(L, 3, AFFINITY_DEFAULT_TTL_MS);
    if (!(ttl > 0 && ttl <= AFFINITY_MAX_TTL_MS)) /* also NaN: no float-to-integer conversion of it */
        return luaL_argerror(L, 3, "ttl must be a number of ms in (0, 30 days]");
    if (v->rt->affinity != NULL)
        atc_affinity_set(v->rt->affinity, key, len, id, (uint64_t)(policy_now_ms(v->rt) + ttl));
    return 0;
}

static int affinity_del(lua_State *L)
{
    struct policy_version *v = policy_api_version(L);
    size_t len;
    const char *key = luaL_checklstring(L, 1, &len);
    if (v->rt->affinity != NULL)
        atc_affinity_del(v->rt->affinity, key, len);
    return 0;
}

/* ---- the tables a policy calls ---- */

/* atc.fastest is registered beside these (policy_fastest_push: a closure with more upvalues). */
static const struct policy_field atc_functions[] = {
    {"queue", NULL, atc_queue},
    {"reject", NULL, atc_reject},
    {"random", NULL, atc_random},
    {"now", NULL, atc_now},
    {"hash", NULL, atc_hash},
    {"log", NULL, atc_log},
    {"explain", NULL, atc_explain},
    {"least_loaded", NULL, policy_pick_least_loaded},
    {"p2c", NULL, policy_pick_p2c},
    {"rendezvous", NULL, policy_pick_rendezvous},
    {"prefix_pick", NULL, policy_pick_prefix_pick},
    {"pool", NULL, policy_fleet_pool},
    {"find", NULL, policy_fleet_find},
    {NULL, NULL, NULL},
};

static const struct policy_field affinity_functions[] = {
    {"get", NULL, affinity_get},
    {"set", NULL, affinity_set},
    {"del", NULL, affinity_del},
    {NULL, NULL, NULL},
};

static void push_names(lua_State *L, const char *prefix, const struct policy_field *f, int *n)
{
    for (; f->name != NULL; f++) {
        lua_pushfstring(L, "%s%s", prefix, f->name);
        lua_rawseti(L, -2, ++*n);
    }
}

/* atc.test_contract() (atc test only): the names the tables above serve, by contract section, for
 * tests/policy/contract_test.lua to compare with stdlib/atc/contract.lua. */
static int atc_test_contract(lua_State *L)
{
    int n;
    lua_createtable(L, 0, 5);
    lua_newtable(L);
    n = 0;
    push_names(L, "", req_fields, &n);
    lua_setfield(L, -2, "req");
    lua_newtable(L);
    n = 0;
    push_names(L, "", ep_static_fields, &n);
    push_names(L, "", ep_live_fields, &n);
    push_names(L, "", policy_pick_signal_fields, &n);
    lua_setfield(L, -2, "ep");
    lua_newtable(L);
    n = 0;
    push_names(L, "", policy_fleet_methods, &n);
    lua_setfield(L, -2, "fleet");
    lua_newtable(L);
    n = 0;
    push_names(L, "", verdict_fields, &n);
    lua_setfield(L, -2, "verdict");
    lua_newtable(L);
    n = 0;
    push_names(L, "", atc_functions, &n);
    lua_pushstring(L, "fastest");
    lua_rawseti(L, -2, ++n);
    push_names(L, "affinity.", affinity_functions, &n);
    lua_setfield(L, -2, "atc");
    return 1;
}

/* ---- installing it all ---- */

/* Creates metatable @p name with __index = a closure of @p index over (v, extra upvalues at the top),
 * __metatable locked. Pops the extra upvalues. */
static void new_metatable(lua_State *L, struct policy_version *v, const char *name, lua_CFunction index,
                          int nextra)
{
    luaL_newmetatable(L, name);
    lua_insert(L, -1 - nextra);
    lua_pushlightuserdata(L, v);
    lua_insert(L, -1 - nextra);
    lua_pushcclosure(L, index, 1 + nextra);
    lua_setfield(L, -2, "__index");
    lua_pushboolean(L, 0);
    lua_setfield(L, -2, "__metatable");
}

static void set_closure(lua_State *L, struct policy_version *v, const char *name, lua_CFunction fn)
{
    lua_pushlightuserdata(L, v);
    lua_pushcclosure(L, fn, 1);
    lua_setfield(L, -2, name);
}

static void register_methods(lua_State *L, struct policy_version *v, const struct policy_field *f)
{
    for (; f->name != NULL; f++)
        set_closure(L, v, f->name, f->method);
}

/* A read-only view of the table at -1, replacing it. */
static void make_readonly(lua_State *L)
{
    lua_newtable(L);
    lua_createtable(L, 0, 2);
    lua_pushvalue(L, -3);
    lua_setfield(L, -2, "__index");
    lua_pushboolean(L, 0);
    lua_setfield(L, -2, "__metatable");
    lua_pushcfunction(L, readonly_newindex);
    lua_setfield(L, -2, "__newindex");
    lua_setmetatable(L, -2);
    lua_remove(L, -2);
}

/* A view whose endpoint left the table: its live fields read nil from now on, and it is no view any more
 * (policy_api_view_index). Its static fields (id, model, ...) stay, so that a policy can still name it. */
static void kill_view(lua_State *L, int view)
{
    if (!lua_getmetatable(L, view))
        return;
    lua_getfield(L, -1, "__index"); /* its static part */
    if (lua_istable(L, -1)) {
        lua_pushlightuserdata(L, (void *)&view_index_key);
        lua_pushnil(L);
        lua_rawset(L, -3);
    }
    lua_pop(L, 2);
}

/* Builds one view table per endpoint of v->rt->table (see ep_live) into a registry table, slot + 1 ->
 * view, and the view -> slot lookup; replaces any previous ones. With @p keep, the views of endpoints
 * still in their slots stay the same tables (a policy may hold them across decisions: that table was
 * renumbered by atc_endpoint_table_with, which keeps slots) and the views of endpoints that left are
 * killed (kill_view). Raises only before it changes v. */
static void open_views(struct policy_version *v, bool keep)
{
    lua_State *L = v->L;
    const struct atc_endpoint_table *t = v->rt->table;
    size_t n = t != NULL ? t->nslots : 0;
    size_t mask = 15;
    while (mask < 2 * n)
        mask = mask * 2 + 1;
    void *slots = calloc(mask + 1, sizeof(*v->view_slots));
    uint16_t *overlaps = calloc(n ? n : 1, sizeof(*overlaps));
    if (slots == NULL || overlaps == NULL) {
        free(slots);
        free(overlaps);
        luaL_error(L, "out of memory");
    }
    free(v->view_slots);
    v->view_slots = slots;
    v->view_mask = mask;
    free(v->overlaps);
    v->overlaps = overlaps;
    v->overlaps_ready = false;
    policy_fleet_reset(v); /* the engine lists hold the old views */
    int old = 0; /* the previous views, kept */
    if (v->endpoints_ref != 0 && v->endpoints_ref != LUA_NOREF) {
        if (keep) {
            lua_rawgeti(L, LUA_REGISTRYINDEX, v->endpoints_ref);
            old = lua_gettop(L);
        }
        luaL_unref(L, LUA_REGISTRYINDEX, v->endpoints_ref);
    }

    lua_createtable(L, (int)n, 0); /* slot + 1 -> view */
    int views = lua_gettop(L);
    lua_createtable(L, 0, 1); /* the static parts' metatable */
    lua_pushlightuserdata(L, v);
    lua_pushcclosure(L, ep_live, 1);
    lua_setfield(L, -2, "__index");
    int live_mt = lua_gettop(L);
    int methods = lua_gettop(L) + 1; /* ep_static_fields' methods, one closure each for every view */
    for (const struct policy_field *f = ep_static_fields; f->name != NULL; f++)
        if (f->method != NULL) {
            lua_pushlightuserdata(L, v);
            lua_pushcclosure(L, f->method, 1);
        }
    for (size_t i = 0; i < n; i++) {
        const struct atc_endpoint *ep = t->slots[i];
        if (ep == NULL)
            continue;
        if (old != 0) {
            lua_rawgeti(L, old, (int)i + 1);
            if (!lua_isnil(L, -1)) {
                view_remember(v, lua_topointer(L, -1), (unsigned)i);
                lua_rawseti(L, views, (int)i + 1);
                continue;
            }
            lua_pop(L, 1);
        }
        lua_newtable(L);          /* the view */
        lua_createtable(L, 0, 8); /* its static part */
        int m = methods;
        for (const struct policy_field *f = ep_static_fields; f->name != NULL; f++) {
            if (f->method != NULL)
                lua_pushvalue(L, m++);
            else
                f->push(L, v, ep);
            lua_setfield(L, -2, f->name); /* a nil (no version) sets nothing */
        }
        lua_pushlightuserdata(L, (void *)&view_index_key);
        lua_pushinteger(L, (lua_Integer)i);
        lua_rawset(L, -3);
        lua_pushvalue(L, live_mt);
        lua_setmetatable(L, -2);
        lua_createtable(L, 0, 4); /* the view's metatable */
        lua_insert(L, -2);
        lua_setfield(L, -2, "__index");
        lua_pushcfunction(L, readonly_newindex);
        lua_setfield(L, -2, "__newindex");
        lua_pushboolean(L, 0);
        lua_setfield(L, -2, "__metatable");
        set_closure(L, v, "__tostring", ep_tostring);
        lua_setmetatable(L, -2);
        view_remember(v, lua_topointer(L, -1), (unsigned)i);
        lua_rawseti(L, views, (int)i + 1);
    }
    lua_settop(L, views);
    if (old != 0) { /* the views of endpoints that left */
        lua_pushnil(L);
        while (lua_next(L, old) != 0) {
            lua_Integer slot = lua_tointeger(L, -2) - 1;
            if (slot < 0 || (size_t)slot >= n || t->slots[slot] == NULL)
                kill_view(L, lua_gettop(L));
            lua_pop(L, 1);
        }
    }
    v->endpoints_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    if (old != 0)
        lua_remove(L, old);
}

/* The fleet userdata (its metatable made by policy_api_open). A new table gets a new one, as a new
 * version would: a policy may cache per fleet what it built from the old table's views. */
static void new_fleet(struct policy_version *v)
{
    lua_State *L = v->L;
    lua_newuserdata(L, 1);
    luaL_getmetatable(L, POLICY_MT_FLEET);
    lua_setmetatable(L, -2);
    if (v->fleet_ref != 0 && v->fleet_ref != LUA_NOREF)
        luaL_unref(L, LUA_REGISTRYINDEX, v->fleet_ref);
    v->fleet_ref = luaL_ref(L, LUA_REGISTRYINDEX);
}

void policy_api_set_table(struct policy_version *v)
{
    open_views(v, false);
    new_fleet(v);
}

void policy_api_update_views(struct policy_version *v)
{
    open_views(v, true);
    new_fleet(v);
}

void policy_api_open(struct policy_version *v)
{
    lua_State *L = v->L; /* the sandbox globals table is at -1 */
    pthread_once(&indexes_once, build_indexes);
    open_views(v, false);

    /* req: one userdata, pointed at the request of the decision in progress */
    lua_pushlightuserdata(L, v);
    lua_pushcclosure(L, req_header, 1);
    new_metatable(L, v, POLICY_MT_REQ, req_index, 1);
    lua_pop(L, 1);
    lua_newuserdata(L, 1);
    luaL_getmetatable(L, POLICY_MT_REQ);
    lua_setmetatable(L, -2);
    v->req_ref = luaL_ref(L, LUA_REGISTRYINDEX);

    /* fleet: methods only */
    luaL_newmetatable(L, POLICY_MT_FLEET);
    lua_newtable(L);
    register_methods(L, v, policy_fleet_methods);
    lua_setfield(L, -2, "__index");
    lua_pushboolean(L, 0);
    lua_setfield(L, -2, "__metatable");
    lua_pop(L, 1);
    new_fleet(v);

    /* verdicts */
    new_metatable(L, v, POLICY_MT_VERDICT, verdict_index, 0);
    set_closure(L, v, "__tostring", verdict_tostring);
    lua_pop(L, 1);

    /* the atc table */
    lua_newtable(L);
    register_methods(L, v, atc_functions);
    policy_fastest_push(L, v);
    lua_setfield(L, -2, "fastest");
    if (v->rt->test_replay != NULL) /* atc test only: t.replay(...) runs a trace through a policy */
        set_closure(L, v, "replay", v->rt->test_replay);
    if (v->rt->test_route != NULL) { /* atc test only: t.route(...) runs a decision on real views */
        set_closure(L, v, "test_route", v->rt->test_route);
        set_closure(L, v, "test_contract", atc_test_contract);
    }
    lua_newtable(L);
    register_methods(L, v, affinity_functions);
    make_readonly(L);
    lua_setfield(L, -2, "affinity");
    make_readonly(L);
    lua_setfield(L, -2, "atc");
}
