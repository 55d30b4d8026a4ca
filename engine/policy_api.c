/* What a policy sees: the request, the fleet and its endpoints as read-only views of the engine's
 * live state, and the host functions of the `atc` table. Every function here validates its arguments
 * before it changes anything: a Lua error longjmps out of it. */

#include <math.h>
#include <stdio.h>
#include <string.h>

#include <lauxlib.h>
#include <xxhash.h>

#include "affinity.h"
#include "balancer.h"
#include "endpoint.h"
#include "log.h"
#include "policy_internal.h"

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
    if (!atc_endpoint_available(ep))
        return false;
    if (v->req != NULL)
        for (size_t i = 0; i < v->req->ntried; i++)
            if (v->req->tried[i] == ep)
                return false;
    return true;
}

struct atc_endpoint *policy_api_to_endpoint(struct policy_version *v, int idx)
{
    lua_State *L = v->L;
    struct policy_endpoint_ud *u = luaL_testudata(L, idx, POLICY_MT_ENDPOINT);
    if (u != NULL)
        return endpoint_at(v, u->index);
    if (lua_type(L, idx) == LUA_TSTRING && v->rt->table != NULL)
        return atc_endpoint_table_find(v->rt->table, lua_tostring(L, idx));
    return NULL;
}

/* Pushes the view of endpoint @p index (one userdata per endpoint, so views compare equal). */
static void push_endpoint(lua_State *L, const struct policy_version *v, unsigned index)
{
    lua_rawgeti(L, LUA_REGISTRYINDEX, v->endpoints_ref);
    lua_rawgeti(L, -1, (int)index + 1);
    lua_remove(L, -2);
}

static const struct atc_route_request *current_req(lua_State *L, struct policy_version *v)
{
    if (v->req == NULL)
        luaL_error(L, "req is only valid during its own decision");
    return v->req;
}

/* ---- endpoints ---- */

static int ep_has_tag(lua_State *L)
{
    struct policy_version *v = version_of(L);
    struct policy_endpoint_ud *u = luaL_checkudata(L, 1, POLICY_MT_ENDPOINT);
    const char *tag = luaL_checkstring(L, 2);
    const struct atc_endpoint *ep = endpoint_at(v, u->index);
    bool found = false;
    for (size_t i = 0; ep != NULL && i < ep->ntags && !found; i++)
        found = strcmp(ep->tags[i], tag) == 0;
    lua_pushboolean(L, found);
    return 1;
}

static int ep_prefix_overlap(lua_State *L)
{
    struct policy_version *v = version_of(L);
    struct policy_endpoint_ud *u = luaL_checkudata(L, 1, POLICY_MT_ENDPOINT);
    luaL_checkudata(L, 2, POLICY_MT_REQ);
    const struct atc_route_request *req = current_req(L, v);
    const struct atc_features *f = req->features;
    if (v->rt->prefix == NULL || f == NULL || f->nblocks == 0) {
        lua_pushinteger(L, 0);
        return 1;
    }
    /* One pass over the blocks answers for every endpoint; later calls in the decision reuse it. */
    if (!v->overlaps_ready) {
        atc_prefix_index_overlaps(v->rt->prefix, f->blocks, f->nblocks, v->overlaps,
                                  v->rt->table->nendpoints);
        v->overlaps_ready = true;
    }
    lua_pushinteger(L, u->index < v->rt->table->nendpoints ? v->overlaps[u->index] : 0);
    return 1;
}

static void push_opt_string(lua_State *L, const char *s)
{
    if (s != NULL)
        lua_pushstring(L, s);
    else
        lua_pushnil(L);
}

/* Endpoint fields, looked up by length first: this runs for every field a policy reads. */
enum ep_field {
    EPF_NONE,
    EPF_ID,
    EPF_MODEL,
    EPF_INFLIGHT,
    EPF_CAPACITY,
    EPF_AVAILABLE,
    EPF_LOAD,
    EPF_TOKENS,
    EPF_WEIGHT,
    EPF_VERSION,
    EPF_TTFT,
    EPF_HEALTH,
    EPF_QUEUE,
    EPF_KV,
    EPF_ERRORS,
    EPF_TAGS,
    EPF_HAS_TAG,
    EPF_OVERLAP,
};

static enum ep_field ep_field_of(const char *k, size_t len)
{
    static const struct {
        const char *name;
        enum ep_field field;
    } fields[] = {
        {"id", EPF_ID},
        {"model", EPF_MODEL},
        {"inflight", EPF_INFLIGHT},
        {"capacity", EPF_CAPACITY},
        {"available", EPF_AVAILABLE},
        {"load", EPF_LOAD},
        {"inflight_tokens", EPF_TOKENS},
        {"weight", EPF_WEIGHT},
        {"version", EPF_VERSION},
        {"ttft_ewma", EPF_TTFT},
        {"health", EPF_HEALTH},
        {"queue", EPF_QUEUE},
        {"kv_usage", EPF_KV},
        {"errors", EPF_ERRORS},
        {"tags", EPF_TAGS},
        {"has_tag", EPF_HAS_TAG},
        {"prefix_overlap", EPF_OVERLAP},
    };
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
        if (fields[i].name[0] == k[0] && strlen(fields[i].name) == len && memcmp(fields[i].name, k, len) == 0)
            return fields[i].field;
    return EPF_NONE;
}

static int ep_index(lua_State *L)
{
    struct policy_version *v = version_of(L);
    struct policy_endpoint_ud *u = lua_touserdata(L, 1);
    size_t len;
    const char *k = luaL_checklstring(L, 2, &len);
    const struct atc_endpoint *ep = endpoint_at(v, u->index);
    if (ep == NULL)
        return luaL_error(L, "endpoint no longer exists");
    switch (ep_field_of(k, len)) {
    case EPF_ID:
        lua_pushstring(L, ep->id);
        break;
    case EPF_MODEL:
        lua_pushstring(L, ep->model);
        break;
    case EPF_INFLIGHT:
        lua_pushinteger(L, (lua_Integer)ep->inflight);
        break;
    case EPF_CAPACITY:
        lua_pushinteger(L, (lua_Integer)ep->capacity);
        break;
    case EPF_AVAILABLE:
        lua_pushboolean(L, policy_api_available(v, ep));
        break;
    case EPF_LOAD:
        lua_pushnumber(L, ep->capacity ? (double)ep->inflight / ep->capacity : 1.0);
        break;
    case EPF_TOKENS:
        lua_pushnumber(L, (double)ep->inflight_tokens);
        break;
    case EPF_WEIGHT:
        lua_pushinteger(L, (lua_Integer)ep->weight);
        break;
    case EPF_VERSION:
        push_opt_string(L, ep->version);
        break;
    case EPF_TTFT:
        lua_pushnumber(L, ep->ttft_ewma_ms);
        break;
    case EPF_HEALTH:
        lua_pushstring(L, ep->routable ? "healthy" : "draining");
        break;
    case EPF_QUEUE:
    case EPF_KV:
        lua_pushnumber(L, 0); /* server-reported load: filled once health scraping lands */
        break;
    case EPF_ERRORS:
        lua_pushnumber(L, (double)ep->errors_total);
        break;
    case EPF_TAGS:
        lua_createtable(L, (int)ep->ntags, 0);
        for (size_t i = 0; i < ep->ntags; i++) {
            lua_pushstring(L, ep->tags[i]);
            lua_rawseti(L, -2, (int)i + 1);
        }
        break;
    case EPF_HAS_TAG:
        lua_pushvalue(L, lua_upvalueindex(2));
        break;
    case EPF_OVERLAP:
        lua_pushvalue(L, lua_upvalueindex(3));
        break;
    case EPF_NONE:
        lua_pushnil(L);
        break;
    }
    return 1;
}

static int ep_tostring(lua_State *L)
{
    struct policy_version *v = version_of(L);
    struct policy_endpoint_ud *u = lua_touserdata(L, 1);
    const struct atc_endpoint *ep = endpoint_at(v, u->index);
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
        lua_pushstring(L, req->session != NULL ? req->session : "");
    else if (strcmp(k, "tenant") == 0)
        lua_pushstring(L, req->tenant != NULL ? req->tenant : "");
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
    struct policy_endpoint_ud *u = luaL_testudata(L, -1, POLICY_MT_ENDPOINT);
    const struct atc_endpoint *ep = u != NULL ? endpoint_at(v, u->index) : NULL;
    if (ep != NULL) {
        c->available = policy_api_available(v, ep);
        c->load = ep->capacity ? (double)ep->inflight / ep->capacity : 1.0;
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

static int atc_p2c(lua_State *L)
{
    struct policy_version *v = version_of(L);
    luaL_checktype(L, 1, LUA_TTABLE);
    int n = (int)lua_objlen(L, 1), navail = 0;
    struct candidate c;
    for (int i = 1; i <= n; i++) {
        read_candidate(L, v, 1, i, &c);
        navail += c.available;
    }
    if (navail == 0) {
        lua_pushnil(L);
        return 1;
    }
    /* The k-th and l-th available ones (distinct when there are two), the less loaded wins. */
    int k = (int)(atc_random_next(&v->rt->rng) % (uint64_t)navail);
    int l = navail > 1 ? (k + 1 + (int)(atc_random_next(&v->rt->rng) % (uint64_t)(navail - 1))) % navail : k;
    int pick_k = 0, pick_l = 0;
    struct candidate ck = {0}, cl = {0};
    for (int i = 1, seen = 0; i <= n; i++) {
        read_candidate(L, v, 1, i, &c);
        if (!c.available)
            continue;
        if (seen == k) {
            pick_k = i;
            ck = c;
        }
        if (seen == l) {
            pick_l = i;
            cl = c;
        }
        seen++;
    }
    lua_rawgeti(L, 1, lighter(&cl, &ck) ? pick_l : pick_k);
    return 1;
}

static int atc_rendezvous(lua_State *L)
{
    struct policy_version *v = version_of(L);
    luaL_checktype(L, 1, LUA_TTABLE);
    size_t keylen;
    const char *key = luaL_checklstring(L, 2, &keylen);
    uint64_t seed = XXH3_64bits(key, keylen);
    int n = (int)lua_objlen(L, 1), best = 0;
    double best_score = 0;
    for (int i = 1; i <= n; i++) {
        struct candidate c;
        read_candidate(L, v, 1, i, &c);
        if (!c.available || c.weight <= 0)
            continue;
        /* Weighted highest random weight: score = -w / ln(u), u uniform in (0,1) from hash(key, id). */
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
    const char *id = v->rt->affinity != NULL
                         ? atc_affinity_get(v->rt->affinity, key, len, (uint64_t)policy_now_ms(v->rt))
                         : NULL;
    push_opt_string(L, id);
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

static int readonly_newindex(lua_State *L)
{
    return luaL_error(L, "attempt to modify a read-only table");
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

void policy_api_open(struct policy_version *v)
{
    lua_State *L = v->L; /* the sandbox globals table is at -1 */

    /* endpoints */
    lua_pushlightuserdata(L, v);
    lua_pushcclosure(L, ep_has_tag, 1);
    lua_pushlightuserdata(L, v);
    lua_pushcclosure(L, ep_prefix_overlap, 1);
    new_metatable(L, v, POLICY_MT_ENDPOINT, ep_index, 2);
    set_closure(L, v, "__tostring", ep_tostring);
    lua_pop(L, 1);
    size_t n = v->rt->table != NULL ? v->rt->table->nendpoints : 0;
    lua_createtable(L, (int)n, 0);
    for (size_t i = 0; i < n; i++) {
        struct policy_endpoint_ud *u = lua_newuserdata(L, sizeof(*u));
        u->index = (unsigned)i;
        luaL_getmetatable(L, POLICY_MT_ENDPOINT);
        lua_setmetatable(L, -2);
        lua_rawseti(L, -2, (int)i + 1);
    }
    v->endpoints_ref = luaL_ref(L, LUA_REGISTRYINDEX);

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
    lua_newuserdata(L, 1);
    luaL_getmetatable(L, POLICY_MT_FLEET);
    lua_setmetatable(L, -2);
    v->fleet_ref = luaL_ref(L, LUA_REGISTRYINDEX);

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
    lua_newtable(L);
    set_closure(L, v, "get", affinity_get);
    set_closure(L, v, "set", affinity_set);
    set_closure(L, v, "del", affinity_del);
    make_readonly(L);
    lua_setfield(L, -2, "affinity");
    make_readonly(L);
    lua_setfield(L, -2, "atc");
}
