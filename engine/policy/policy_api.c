/* What a policy sees: the request, the fleet and its endpoints as read-only views of the engine's
 * live state, and the host functions of the `atc` table. Every function here validates its arguments
 * before it changes anything: a Lua error longjmps out of it. */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <xxhash.h>

#include "fleet/affinity.h"
#include "fleet/balancer.h"
#include "fleet/endpoint.h"
#include "fleet/health.h"
#include "core/log.h"
#include "policy/policy_internal.h"

#define AFFINITY_DEFAULT_TTL_MS (10 * 60 * 1000)
#define LOG_LINES_PER_SECOND 20

static struct policy_version *version_of(lua_State *L)
{
    return lua_touserdata(L, lua_upvalueindex(1));
}

static const char *kind_name(enum atc_request_kind kind)
{
    switch (kind) {
    case ATC_KIND_CHAT:
        return "chat";
    case ATC_KIND_COMPLETION:
        return "completion";
    case ATC_KIND_EMBEDDING:
        return "embedding";
    }
    return "chat";
}

static struct atc_endpoint *endpoint_at(const struct policy_version *v, unsigned index)
{
    const struct atc_endpoint_table *t = v->rt->table;
    return t != NULL && index < t->nendpoints ? t->endpoints[index] : NULL;
}

bool policy_api_available(const struct policy_version *v, const struct atc_endpoint *ep)
{
    if (!atc_endpoint_available(ep, v->req != NULL ? v->req->tokens : 0))
        return false;
    if (v->req != NULL)
        for (size_t i = 0; i < v->req->ntried; i++)
            if (v->req->tried[i] == ep)
                return false;
    return true;
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
        return endpoint_at(v, (unsigned)index);
    if (lua_type(L, idx) == LUA_TSTRING && v->rt->table != NULL)
        return atc_endpoint_table_find(v->rt->table, lua_tostring(L, idx));
    return NULL;
}

/* Pushes the view of endpoint @p index (one table per endpoint, so views compare equal). */
static void push_endpoint(lua_State *L, const struct policy_version *v, unsigned index)
{
    lua_rawgeti(L, LUA_REGISTRYINDEX, v->endpoints_ref);
    lua_rawgeti(L, -1, (int)index + 1);
    lua_remove(L, -2);
}

/* The endpoint behind the view passed as self, or a Lua error. */
static const struct atc_endpoint *check_view(lua_State *L, struct policy_version *v, int idx)
{
    int index = policy_api_view_index(v, idx);
    const struct atc_endpoint *ep = index >= 0 ? endpoint_at(v, (unsigned)index) : NULL;
    if (ep == NULL)
        luaL_argerror(L, idx, "expected an endpoint");
    return ep;
}

static const struct atc_route_request *current_req(lua_State *L, struct policy_version *v)
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
    struct policy_version *v = version_of(L);
    const struct atc_endpoint *ep = check_view(L, v, 1);
    const char *tag = luaL_checkstring(L, 2);
    bool found = false;
    for (size_t i = 0; i < ep->ntags && !found; i++)
        found = strcmp(ep->tags[i], tag) == 0;
    lua_pushboolean(L, found);
    return 1;
}

/* Leading prefix blocks of the current request recently routed to @p ep. One pass over the blocks
 * answers for every endpoint; later calls in the decision reuse it. */
static unsigned endpoint_overlap(lua_State *L, struct policy_version *v, const struct atc_endpoint *ep)
{
    const struct atc_route_request *req = current_req(L, v);
    const struct atc_features *f = req->features;
    if (v->rt->prefix == NULL || f == NULL || f->nblocks == 0)
        return 0;
    if (!v->overlaps_ready) {
        atc_prefix_index_overlaps(v->rt->prefix, f->blocks, f->nblocks, v->overlaps,
                                  v->rt->table->nendpoints);
        v->overlaps_ready = true;
    }
    return v->overlaps[ep->index];
}

static int ep_prefix_overlap(lua_State *L)
{
    struct policy_version *v = version_of(L);
    const struct atc_endpoint *ep = check_view(L, v, 1);
    luaL_checkudata(L, 2, POLICY_MT_REQ);
    lua_pushinteger(L, (lua_Integer)endpoint_overlap(L, v, ep));
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

/* An endpoint view is a table (static fields: id, model, version, capacity, weight, and the methods,
 * read at table speed) whose static part falls back to this function for the live fields. The view's
 * index is kept in the static table under a key no script can name. */
static const char view_index_key;

static int ep_live(lua_State *L)
{
    struct policy_version *v = version_of(L);
    lua_pushlightuserdata(L, (void *)&view_index_key);
    lua_rawget(L, 1);
    const struct atc_endpoint *ep =
        lua_isnumber(L, -1) ? endpoint_at(v, (unsigned)lua_tointeger(L, -1)) : NULL;
    size_t len;
    const char *k = lua_tolstring(L, 2, &len);
    if (ep == NULL || k == NULL) {
        lua_pushnil(L);
        return 1;
    }
    /* The common reads first; first letter and length tell them apart. */
    switch (k[0]) {
    case 'a':
        if (len == 9 && memcmp(k, "available", 9) == 0) {
            lua_pushboolean(L, policy_api_available(v, ep));
            return 1;
        }
        break;
    case 'i':
        if (len == 8 && memcmp(k, "inflight", 8) == 0) {
            lua_pushinteger(L, (lua_Integer)ep->inflight);
            return 1;
        }
        if (len == 15 && memcmp(k, "inflight_tokens", 15) == 0) {
            lua_pushnumber(L, (double)ep->inflight_tokens);
            return 1;
        }
        break;
    case 'l':
        if (len == 4 && memcmp(k, "load", 4) == 0) {
            unsigned cap = atc_endpoint_capacity_now(ep); /* less while slow-starting */
            lua_pushnumber(L, cap ? (double)ep->inflight / cap : 1.0);
            return 1;
        }
        if (len == 10 && memcmp(k, "last_error", 10) == 0) {
            char err[ATC_HEALTH_TEXT_WORDS * 8]; /* a copy: the main thread may rewrite it meanwhile */
            if (ep->health != NULL && atc_health_last_error(ep->health, err, sizeof(err)) > 0)
                lua_pushstring(L, err);
            else
                lua_pushnil(L);
            return 1;
        }
        if (len == 10 && memcmp(k, "last_check", 10) == 0) {
            double at = ep->health != NULL
                            ? atomic_load_explicit(&ep->health->last_check_ms, memory_order_relaxed)
                            : 0;
            if (at > 0)
                lua_pushnumber(L, at); /* atc.now()'s clock */
            else
                lua_pushnil(L);
            return 1;
        }
        break;
    case 't':
        if (len == 9 && memcmp(k, "ttft_ewma", 9) == 0) {
            double ttft = ep->ttft_ewma_ms;
            if (ttft > 0) /* 0: no answer measured yet */
                lua_pushnumber(L, ttft);
            else
                lua_pushnil(L);
            return 1;
        }
        if (len == 4 && memcmp(k, "tags", 4) == 0) {
            lua_createtable(L, (int)ep->ntags, 0);
            for (size_t i = 0; i < ep->ntags; i++) {
                lua_pushstring(L, ep->tags[i]);
                lua_rawseti(L, -2, (int)i + 1);
            }
            return 1;
        }
        break;
    case 'h':
        if (len == 6 && memcmp(k, "health", 6) == 0) {
            lua_pushstring(L, ep->health != NULL ? atc_health_state_name(atc_health_state_of(ep->health))
                              : ep->routable     ? "healthy"
                                                 : "draining");
            return 1;
        }
        break;
    case 's':
    case 'k':
    case 'r':
    case 'p': {
        /* The server's own load. With health checks, the last scrape of its /metrics (NaN: never
         * reported, so nil), as health publishes it to the workers (atomics); without (replay), what the
         * simulated server reports, always known. */
        const struct atc_endpoint_health *hl = ep->health;
        double x;
        if (len == 12 && memcmp(k, "server_queue", 12) == 0)
            x = hl != NULL ? atomic_load_explicit(&hl->waiting, memory_order_relaxed)
                           : (double)ep->server_queue;
        else if (len == 8 && memcmp(k, "kv_usage", 8) == 0)
            x = hl != NULL ? atomic_load_explicit(&hl->kv_usage, memory_order_relaxed) : ep->server_kv_usage;
        else if (len == 7 && memcmp(k, "running", 7) == 0)
            x = hl != NULL ? atomic_load_explicit(&hl->running, memory_order_relaxed) : NAN;
        else if (len == 15 && memcmp(k, "prefix_hit_rate", 15) == 0)
            x = hl != NULL ? atomic_load_explicit(&hl->prefix_hit_rate, memory_order_relaxed) : NAN;
        else
            break;
        if (isfinite(x))
            lua_pushnumber(L, x);
        else
            lua_pushnil(L);
        return 1;
    }
    case 'c':
        if (len == 20 && memcmp(k, "consecutive_failures", 20) == 0) {
            lua_pushinteger(L, ep->health != NULL
                                   ? (lua_Integer)atomic_load_explicit(&ep->health->consecutive_failures,
                                                                       memory_order_relaxed)
                                   : 0);
            return 1;
        }
        break;
    case 'e':
        if (len == 6 && memcmp(k, "errors", 6) == 0) {
            lua_pushnumber(L, (double)ep->errors_total);
            return 1;
        }
        break;
    }
    lua_pushnil(L);
    return 1;
}

static int ep_tostring(lua_State *L)
{
    struct policy_version *v = version_of(L);
    int index = policy_api_view_index(v, 1);
    const struct atc_endpoint *ep = index >= 0 ? endpoint_at(v, (unsigned)index) : NULL;
    lua_pushfstring(L, "endpoint %s", ep != NULL ? ep->id : "?");
    return 1;
}

/* ---- req ---- */

static int req_header(lua_State *L)
{
    struct policy_version *v = version_of(L);
    luaL_checkudata(L, 1, POLICY_MT_REQ);
    const char *name = luaL_checkstring(L, 2);
    const struct atc_route_request *req = current_req(L, v);
    push_opt_string(L, req->header != NULL ? req->header(req->header_ctx, name) : NULL);
    return 1;
}

static int req_index(lua_State *L)
{
    struct policy_version *v = version_of(L);
    const char *k = luaL_checkstring(L, 2);
    const struct atc_route_request *req = current_req(L, v);
    const struct atc_features *f = req->features;
    if (strcmp(k, "model") == 0)
        lua_pushstring(L, f->model);
    else if (strcmp(k, "priority") == 0)
        lua_pushinteger(L, req->priority);
    else if (strcmp(k, "session") == 0)
        push_known_string(L, req->session);
    else if (strcmp(k, "tenant") == 0)
        push_known_string(L, req->tenant);
    else if (strcmp(k, "prompt_tokens") == 0)
        lua_pushinteger(L, (lua_Integer)f->prompt_tokens);
    else if (strcmp(k, "max_tokens") == 0) {
        if (f->max_tokens >= 0)
            lua_pushnumber(L, (double)f->max_tokens);
        else
            lua_pushnil(L);
    } else if (strcmp(k, "stream") == 0)
        lua_pushboolean(L, f->stream);
    else if (strcmp(k, "id") == 0)
        lua_pushstring(L, req->id);
    else if (strcmp(k, "kind") == 0)
        lua_pushstring(L, kind_name(req->kind));
    else if (strcmp(k, "path") == 0)
        lua_pushstring(L, req->path);
    else if (strcmp(k, "attempt") == 0)
        lua_pushinteger(L, (lua_Integer)req->attempt);
    else if (strcmp(k, "blocks") == 0)
        lua_pushinteger(L, (lua_Integer)f->nblocks);
    else if (strcmp(k, "block_tokens") == 0)
        lua_pushinteger(L, req->block_tokens ? (lua_Integer)req->block_tokens : ATC_PREFIX_BLOCK_BYTES / 4);
    else if (strcmp(k, "tools") == 0)
        lua_pushboolean(L, f->has_tools);
    else if (strcmp(k, "header") == 0)
        lua_pushvalue(L, lua_upvalueindex(2));
    else
        lua_pushnil(L);
    return 1;
}

/* ---- fleet ---- */

static void push_endpoint_list(lua_State *L, struct policy_version *v, struct atc_endpoint *const *eps,
                               size_t n)
{
    lua_createtable(L, (int)n, 0);
    for (size_t i = 0; i < n; i++) {
        push_endpoint(L, v, eps[i]->index);
        lua_rawseti(L, -2, (int)i + 1);
    }
}

static int fleet_endpoints(lua_State *L)
{
    struct policy_version *v = version_of(L);
    luaL_checkudata(L, 1, POLICY_MT_FLEET);
    size_t len;
    const char *model = luaL_checklstring(L, 2, &len);
    const struct atc_model *m =
        v->rt->table != NULL ? atc_endpoint_table_model(v->rt->table, model, len) : NULL;
    if (m == NULL)
        lua_newtable(L);
    else
        push_endpoint_list(L, v, m->endpoints, m->nendpoints);
    return 1;
}

static int fleet_all(lua_State *L)
{
    struct policy_version *v = version_of(L);
    luaL_checkudata(L, 1, POLICY_MT_FLEET);
    const struct atc_endpoint_table *t = v->rt->table;
    if (t == NULL)
        lua_newtable(L);
    else
        push_endpoint_list(L, v, t->endpoints, t->nendpoints);
    return 1;
}

static int fleet_models(lua_State *L)
{
    struct policy_version *v = version_of(L);
    luaL_checkudata(L, 1, POLICY_MT_FLEET);
    const struct atc_endpoint_table *t = v->rt->table;
    lua_createtable(L, t != NULL ? (int)t->nmodels : 0, 0);
    for (size_t i = 0; t != NULL && i < t->nmodels; i++) {
        lua_pushstring(L, t->models[i].name);
        lua_rawseti(L, -2, (int)i + 1);
    }
    return 1;
}

static int fleet_endpoint(lua_State *L)
{
    struct policy_version *v = version_of(L);
    luaL_checkudata(L, 1, POLICY_MT_FLEET);
    const char *id = luaL_checkstring(L, 2);
    const struct atc_endpoint *ep = v->rt->table != NULL ? atc_endpoint_table_find(v->rt->table, id) : NULL;
    if (ep == NULL)
        lua_pushnil(L);
    else
        push_endpoint(L, v, ep->index);
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
    if (status < 400 || status > 599)
        return luaL_argerror(L, 1, "status must be 400-599");
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

static int verdict_index(lua_State *L)
{
    struct policy_verdict *vd = lua_touserdata(L, 1);
    const char *k = luaL_checkstring(L, 2);
    if (strcmp(k, "kind") == 0)
        lua_pushstring(L, vd->kind == ATC_DECISION_QUEUE ? "queue" : "reject");
    else if (strcmp(k, "status") == 0 && vd->kind == ATC_DECISION_REJECT)
        lua_pushinteger(L, vd->status);
    else if (strcmp(k, "message") == 0)
        lua_pushstring(L, vd->message);
    else
        lua_pushnil(L);
    return 1;
}

/* ---- host functions ---- */

static int atc_random(lua_State *L)
{
    struct policy_version *v = version_of(L);
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
    lua_pushnumber(L, policy_now_ms(version_of(L)->rt));
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

static int atc_log(lua_State *L)
{
    struct policy_version *v = version_of(L);
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
    lua_Debug ar;
    if (lua_getstack(L, 1, &ar) && lua_getinfo(L, "Sl", &ar))
        atc_info("policy v%llu %s:%d: %s", (unsigned long long)v->version, ar.short_src, ar.currentline,
                 line);
    else
        atc_info("policy v%llu: %s", (unsigned long long)v->version, line);
    return 0;
}

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
    const struct atc_endpoint *ep = index >= 0 ? endpoint_at(v, (unsigned)index) : NULL;
    if (ep != NULL) {
        c->available = policy_api_available(v, ep);
        c->inflight = ep->inflight;
        c->capacity = atc_endpoint_capacity_now(ep); /* less while slow-starting */
        c->load = c->capacity > 0 ? (double)ep->inflight / c->capacity : 1.0;
        c->tokens = (double)ep->inflight_tokens;
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

static int atc_least_loaded(lua_State *L)
{
    struct policy_version *v = version_of(L);
    luaL_checktype(L, 1, LUA_TTABLE);
    int n = (int)lua_objlen(L, 1), best = 0;
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
static int atc_p2c(lua_State *L)
{
    struct policy_version *v = version_of(L);
    luaL_checktype(L, 1, LUA_TTABLE);
    int n = (int)lua_objlen(L, 1);
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
static int atc_rendezvous(lua_State *L)
{
    struct policy_version *v = version_of(L);
    luaL_checktype(L, 1, LUA_TTABLE);
    size_t keylen;
    const char *key = luaL_checklstring(L, 2, &keylen);
    double c_bound = luaL_optnumber(L, 3, 0);
    if (lua_gettop(L) >= 3 && !lua_isnil(L, 3) && c_bound < 1)
        return luaL_argerror(L, 3, "c must be >= 1");
    uint64_t seed = XXH3_64bits(key, keylen);
    int n = (int)lua_objlen(L, 1), best = 0;
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
static int atc_prefix_pick(lua_State *L)
{
    static const char *const known[] = {"min_blocks", "balance_abs", "balance_rel", "skip", "load_weight"};
    struct policy_version *v = version_of(L);
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
    int n = (int)lua_objlen(L, 1), best = 0;
    double best_score = 0, best_load = 0, max_overlap = 0, lo = HUGE_VAL, hi = 0;
    for (int i = 1; i <= n; i++) {
        struct candidate c;
        read_candidate(L, v, 1, i, &c);
        if (!c.available)
            continue;
        lua_rawgeti(L, 1, i);
        int index = policy_api_view_index(v, -1);
        const struct atc_endpoint *ep = index >= 0 ? endpoint_at(v, (unsigned)index) : NULL;
        lo = c.inflight < lo ? c.inflight : lo;
        hi = c.inflight > hi ? c.inflight : hi;
        if (lua_rawequal(L, -1, 4)) {
            lua_pop(L, 1);
            continue;
        }
        double overlap;
        if (ep != NULL) {
            lua_pop(L, 1);
            overlap = endpoint_overlap(L, v, ep);
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

/* atc.cheapest(pool, load_weight [, queued, stamps, now_ms, drain_per_ms, queued_weight]): the available
 * endpoints of pool with the lowest cost = load_weight * ep.inflight_tokens + queued_weight * the work
 * queued there, as a new array (several when they tie; empty when none is available). The work queued on
 * ep is queued[ep] (a number) as of stamps[ep] (ms), drained at drain_per_ms since: atc.work's estimate,
 * computed here so that a decision does not loop over the fleet in Lua. */
static int atc_cheapest(lua_State *L)
{
    struct policy_version *v = version_of(L);
    luaL_checktype(L, 1, LUA_TTABLE);
    double load_weight = luaL_checknumber(L, 2), best = HUGE_VAL;
    bool queued = !lua_isnoneornil(L, 3);
    double now = 0, rate = 0, queued_weight = 0;
    if (queued) {
        luaL_checktype(L, 3, LUA_TTABLE);
        luaL_checktype(L, 4, LUA_TTABLE);
        now = luaL_checknumber(L, 5);
        rate = luaL_checknumber(L, 6);
        queued_weight = luaL_checknumber(L, 7);
    }
    int n = (int)lua_objlen(L, 1), ntied = 0;
    lua_createtable(L, 4, 0);
    int out = lua_gettop(L);
    for (int i = 1; i <= n; i++) {
        struct candidate c;
        read_candidate(L, v, 1, i, &c);
        if (!c.available)
            continue;
        lua_rawgeti(L, 1, i);
        double cost = load_weight * c.tokens;
        if (queued) {
            lua_pushvalue(L, -1);
            lua_rawget(L, 3);
            double w = lua_tonumber(L, -1);
            lua_pop(L, 1);
            if (w > 0) {
                lua_pushvalue(L, -1);
                lua_rawget(L, 4);
                double since = lua_tonumber(L, -1);
                lua_pop(L, 1);
                w -= (now > since ? now - since : 0) * rate;
                cost += queued_weight * (w > 0 ? w : 0);
            }
        }
        if (ntied == 0 || cost < best) {
            for (int k = ntied; k > 1; k--) { /* drop the old ties */
                lua_pushnil(L);
                lua_rawseti(L, out, k);
            }
            best = cost;
            ntied = 1;
            lua_rawseti(L, out, 1);
        } else if (cost == best) {
            lua_rawseti(L, out, ++ntied);
        } else {
            lua_pop(L, 1);
        }
    }
    return 1;
}

/* ---- affinity ---- */

static const char *affinity_target(lua_State *L, struct policy_version *v, int idx)
{
    const struct atc_endpoint *ep = policy_api_to_endpoint(v, idx);
    if (ep != NULL)
        return ep->id;
    if (lua_type(L, idx) == LUA_TSTRING)
        return lua_tostring(L, idx);
    if (lua_istable(L, idx)) {
        lua_getfield(L, idx, "id");
        const char *id = lua_tostring(L, -1);
        lua_pop(L, 1); /* still referenced by the table */
        if (id != NULL)
            return id;
    }
    luaL_argerror(L, idx, "expected an endpoint or an endpoint id");
    return NULL;
}

static int affinity_get(lua_State *L)
{
    struct policy_version *v = version_of(L);
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
    struct policy_version *v = version_of(L);
    size_t len;
    const char *key = luaL_checklstring(L, 1, &len);
    const char *id = affinity_target(L, v, 2);
    double ttl = luaL_optnumber(L, 3, AFFINITY_DEFAULT_TTL_MS);
    if (ttl <= 0)
        return luaL_argerror(L, 3, "ttl must be positive");
    if (v->rt->affinity != NULL)
        atc_affinity_set(v->rt->affinity, key, len, id, (uint64_t)(policy_now_ms(v->rt) + ttl));
    return 0;
}

static int affinity_del(lua_State *L)
{
    struct policy_version *v = version_of(L);
    size_t len;
    const char *key = luaL_checklstring(L, 1, &len);
    if (v->rt->affinity != NULL)
        atc_affinity_del(v->rt->affinity, key, len);
    return 0;
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

/* Builds one view table per endpoint of v->rt->table (see ep_live) into a registry table, index + 1 ->
 * view, and the view -> index lookup; replaces any previous ones. Raises only before it changes v. */
static void open_views(struct policy_version *v)
{
    lua_State *L = v->L;
    size_t n = v->rt->table != NULL ? v->rt->table->nendpoints : 0;
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
    if (v->endpoints_ref != 0 && v->endpoints_ref != LUA_NOREF)
        luaL_unref(L, LUA_REGISTRYINDEX, v->endpoints_ref);

    lua_createtable(L, (int)n, 0); /* index + 1 -> view */
    int views = lua_gettop(L);
    lua_createtable(L, 0, 1); /* the static parts' metatable */
    lua_pushlightuserdata(L, v);
    lua_pushcclosure(L, ep_live, 1);
    lua_setfield(L, -2, "__index");
    int live_mt = lua_gettop(L);
    lua_pushlightuserdata(L, v);
    lua_pushcclosure(L, ep_has_tag, 1);
    int has_tag = lua_gettop(L);
    lua_pushlightuserdata(L, v);
    lua_pushcclosure(L, ep_prefix_overlap, 1);
    int prefix_overlap = lua_gettop(L);
    for (size_t i = 0; i < n; i++) {
        const struct atc_endpoint *ep = v->rt->table->endpoints[i];
        lua_newtable(L);          /* the view */
        lua_createtable(L, 0, 8); /* its static part */
        lua_pushstring(L, ep->id);
        lua_setfield(L, -2, "id");
        lua_pushstring(L, ep->model);
        lua_setfield(L, -2, "model");
        if (ep->version != NULL) {
            lua_pushstring(L, ep->version);
            lua_setfield(L, -2, "version");
        }
        lua_pushinteger(L, (lua_Integer)ep->capacity);
        lua_setfield(L, -2, "capacity");
        lua_pushinteger(L, (lua_Integer)ep->weight);
        lua_setfield(L, -2, "weight");
        lua_pushvalue(L, has_tag);
        lua_setfield(L, -2, "has_tag");
        lua_pushvalue(L, prefix_overlap);
        lua_setfield(L, -2, "prefix_overlap");
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
    v->endpoints_ref = luaL_ref(L, LUA_REGISTRYINDEX);
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
    open_views(v);
    new_fleet(v);
}

void policy_api_open(struct policy_version *v)
{
    lua_State *L = v->L; /* the sandbox globals table is at -1 */
    open_views(v);

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
    set_closure(L, v, "endpoints", fleet_endpoints);
    set_closure(L, v, "all", fleet_all);
    set_closure(L, v, "models", fleet_models);
    set_closure(L, v, "endpoint", fleet_endpoint);
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
    lua_pushcfunction(L, atc_queue);
    lua_setfield(L, -2, "queue");
    lua_pushcfunction(L, atc_reject);
    lua_setfield(L, -2, "reject");
    lua_pushcfunction(L, atc_hash);
    lua_setfield(L, -2, "hash");
    set_closure(L, v, "random", atc_random);
    set_closure(L, v, "now", atc_now);
    set_closure(L, v, "log", atc_log);
    set_closure(L, v, "least_loaded", atc_least_loaded);
    set_closure(L, v, "p2c", atc_p2c);
    set_closure(L, v, "rendezvous", atc_rendezvous);
    set_closure(L, v, "prefix_pick", atc_prefix_pick);
    set_closure(L, v, "cheapest", atc_cheapest);
    if (v->rt->test_replay != NULL) /* atc test only: t.replay(...) runs a trace through a policy */
        set_closure(L, v, "replay", v->rt->test_replay);
    if (v->rt->test_route != NULL) /* atc test only: t.route(...) runs a decision on real views */
        set_closure(L, v, "test_route", v->rt->test_route);
    lua_newtable(L);
    set_closure(L, v, "get", affinity_get);
    set_closure(L, v, "set", affinity_set);
    set_closure(L, v, "del", affinity_del);
    make_readonly(L);
    lua_setfield(L, -2, "affinity");
    make_readonly(L);
    lua_setfield(L, -2, "atc");
}
