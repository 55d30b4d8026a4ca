/* The fleet a policy sees (fleet:endpoints, fleet:all, fleet:models, fleet:endpoint) and the engine lists
 * behind it, with atc.pool and atc.find.
 *
 * An engine list is built once per set of endpoints (a config reload or an endpoint added or removed
 * makes new views, and every list is forgotten with the old ones): fleet:endpoints(model) returns the
 * same table on every call until then, and atc.pool(list) makes one of a policy's own list, which the
 * policy keeps. Each is anchored in the registry and recorded here by its address with its endpoints,
 * so that a host function over a pool (atc.fastest, atc.p2c, ...) reads the endpoints in C rather than
 * reading the table element by element and finding each view's endpoint: at 512 endpoints that reading
 * was most of a decision. The cost is a contract: an engine list is read-only, as the views in it are.
 * A change of its length raises in the next host function or fleet:endpoints that sees it, and so does
 * a host function whose pick is no longer the view the engine put there; `atc test` checks every element
 * on every use. Like every function a policy calls, each validates its arguments before it changes
 * anything (a Lua error longjmps). */

#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <xxhash.h>

#include "fleet/endpoint.h"
#include "policy/policy_api.h"
#include "policy/state.h"

/* A pool longer than any fleet: the host functions refuse it (policy_pick.c's POOL_MAX). */
#define LIST_MAX 4096
/* Lists atc.pool registers per set of endpoints; past it atc.pool returns plain copies, read per call.
 * A policy keeps a handful (the shipped one: a model's version sides); this bounds one that makes a new
 * list per request. */
#define POOLS_MAX 256

static const char all_key; /* fleet:all()'s list in the lists table */

/* ---- the records, by table address ---- */

static size_t list_slot(const void *p, size_t mask)
{
    return (size_t)(((uintptr_t)p >> 4) * 0x9E3779B97F4A7C15ull >> 32) & mask;
}

static struct policy_list *list_find(const struct policy_version *v, const void *table)
{
    if (v->nlists == 0)
        return NULL;
    for (size_t i = list_slot(table, v->lists_mask);; i = (i + 1) & v->lists_mask) {
        struct policy_list *l = v->lists[i];
        if (l == NULL || l->table == table)
            return l;
    }
}

/* Room for one more record, or a Lua error with nothing changed. */
static void lists_reserve(lua_State *L, struct policy_version *v)
{
    if (v->lists != NULL && 2 * (v->nlists + 1) <= v->lists_mask + 1)
        return;
    size_t mask = v->lists != NULL ? 2 * v->lists_mask + 1 : 15;
    struct policy_list **grown = calloc(mask + 1, sizeof(*grown));
    if (grown == NULL)
        luaL_error(L, "out of memory");
    for (size_t i = 0; v->lists != NULL && i <= v->lists_mask; i++) {
        struct policy_list *l = v->lists[i];
        if (l == NULL)
            continue;
        size_t k = list_slot(l->table, mask);
        while (grown[k] != NULL)
            k = (k + 1) & mask;
        grown[k] = l;
    }
    free(v->lists);
    v->lists = grown;
    v->lists_mask = mask;
}

/* Registers the table at -1, whose every element is a live view, as an engine list; leaves it there. */
static struct policy_list *list_register(lua_State *L, struct policy_version *v)
{
    int t = lua_gettop(L);
    size_t n = lua_objlen(L, t);
    lists_reserve(L, v);
    lua_pushvalue(L, t);
    int ref = luaL_ref(L, LUA_REGISTRYINDEX); /* may raise: nothing of ours is allocated yet */
    struct policy_list *l = malloc(sizeof(*l) + n * (sizeof(*l->eps) + sizeof(*l->views)));
    if (l == NULL) {
        luaL_unref(L, LUA_REGISTRYINDEX, ref);
        luaL_error(L, "out of memory");
    }
    l->table = lua_topointer(L, t);
    l->ref = ref;
    l->n = (uint32_t)n;
    l->at = NULL;
    l->eps = (struct atc_endpoint **)(l + 1);
    l->views = (const void **)(l->eps + n);
    for (size_t i = 0; i < n; i++) { /* no raise below: reads of a table and a lookup */
        lua_rawgeti(L, t, (int)i + 1);
        l->views[i] = lua_topointer(L, -1);
        l->eps[i] = policy_api_endpoint_at(v, (unsigned)policy_api_view_index(v, -1));
        lua_pop(L, 1);
    }
    size_t k = list_slot(l->table, v->lists_mask);
    while (v->lists[k] != NULL)
        k = (k + 1) & v->lists_mask;
    v->lists[k] = l;
    v->nlists++;
    return l;
}

void policy_fleet_free(struct policy_version *v)
{
    for (size_t i = 0; v->lists != NULL && i <= v->lists_mask; i++)
        if (v->lists[i] != NULL) {
            free(v->lists[i]->at);
            free(v->lists[i]);
        }
    free(v->lists);
    v->lists = NULL;
    v->lists_mask = v->nlists = v->npools = 0;
    free(v->ids);
    v->ids = NULL;
    v->ids_mask = 0;
}

void policy_fleet_reset(struct policy_version *v)
{
    lua_State *L = v->L;
    for (size_t i = 0; v->lists != NULL && i <= v->lists_mask; i++)
        if (v->lists[i] != NULL)
            luaL_unref(L, LUA_REGISTRYINDEX, v->lists[i]->ref);
    if (v->lists_ref != 0 && v->lists_ref != LUA_NOREF)
        luaL_unref(L, LUA_REGISTRYINDEX, v->lists_ref);
    v->lists_ref = LUA_NOREF;
    policy_fleet_free(v);
}

static int modified(lua_State *L, const char *fn)
{
    return luaL_error(L,
                      "%s: a list from fleet:endpoints, fleet:all or atc.pool was changed; those lists are "
                      "shared by every decision and read-only (copy one into a new table to change it)",
                      fn);
}

const struct policy_list *policy_fleet_list(lua_State *L, struct policy_version *v, int idx, const char *fn)
{
    struct policy_list *l = list_find(v, lua_topointer(L, idx));
    if (l == NULL)
        return NULL;
    if (lua_objlen(L, idx) != l->n)
        modified(L, fn);
    if (v->rt->test_mode) /* atc test: every element, so that a policy's tests catch any change */
        for (uint32_t i = 0; i < l->n; i++) {
            lua_rawgeti(L, idx, (int)i + 1);
            bool same = lua_topointer(L, -1) == l->views[i];
            lua_pop(L, 1);
            if (!same)
                modified(L, fn);
        }
    return l;
}

void policy_fleet_push_element(lua_State *L, const struct policy_list *l, int idx, int i, const char *fn)
{
    lua_rawgeti(L, idx, i);
    if (lua_topointer(L, -1) != l->views[i - 1])
        modified(L, fn);
}

/* ---- ids ---- */

static size_t id_slot(const char *id, size_t len, size_t mask)
{
    return (size_t)XXH3_64bits(id, len) & mask;
}

struct atc_endpoint *policy_fleet_by_id(struct policy_version *v, const char *id, size_t len)
{
    const struct atc_endpoint_table *t = v->rt->table;
    if (t == NULL || strlen(id) != len)
        return NULL;
    if (v->ids == NULL) { /* built on the first lookup of a set of views */
        size_t mask = 15;
        while (mask < 2 * t->nslots)
            mask = mask * 2 + 1;
        if ((v->ids = calloc(mask + 1, sizeof(*v->ids))) == NULL)
            return atc_endpoint_table_find(t, id); /* no memory for the hash: the scan it saves */
        v->ids_mask = mask;
        for (size_t s = 0; s < t->nslots; s++) {
            if (t->slots[s] == NULL)
                continue;
            size_t k = id_slot(t->slots[s]->id, strlen(t->slots[s]->id), mask);
            while (v->ids[k] != 0)
                k = (k + 1) & mask;
            v->ids[k] = (unsigned)s + 1;
        }
    }
    for (size_t k = id_slot(id, len, v->ids_mask);; k = (k + 1) & v->ids_mask) {
        if (v->ids[k] == 0)
            return NULL;
        struct atc_endpoint *ep = t->slots[v->ids[k] - 1];
        if (strcmp(ep->id, id) == 0)
            return ep;
    }
}

/* ---- fleet's methods ---- */

/* The lists table of the current views (model name -> list), pushed; made on first use. */
static void push_lists(lua_State *L, struct policy_version *v)
{
    if (v->lists_ref == 0 || v->lists_ref == LUA_NOREF) {
        lua_newtable(L);
        lua_pushvalue(L, -1);
        v->lists_ref = luaL_ref(L, LUA_REGISTRYINDEX);
        return;
    }
    lua_rawgeti(L, LUA_REGISTRYINDEX, v->lists_ref);
}

/* Pushes the engine list of @p eps (@p n), kept in the lists table under the value at @p key: built on
 * the first call, the same table after. */
static void push_engine_list(lua_State *L, struct policy_version *v, int key, struct atc_endpoint *const *eps,
                             size_t n, const char *fn)
{
    push_lists(L, v);
    int lists = lua_gettop(L);
    lua_pushvalue(L, key);
    lua_rawget(L, lists);
    if (!lua_isnil(L, -1)) {
        policy_fleet_list(L, v, lua_gettop(L), fn); /* changed by the policy: say so */
        lua_remove(L, lists);
        return;
    }
    lua_pop(L, 1);
    lua_createtable(L, (int)n, 0);
    for (size_t i = 0; i < n; i++) {
        policy_api_push_view(L, v, eps[i]->index);
        lua_rawseti(L, -2, (int)i + 1);
    }
    list_register(L, v);
    lua_pushvalue(L, key);
    lua_pushvalue(L, -2);
    lua_rawset(L, lists);
    lua_remove(L, lists);
}

static int fleet_endpoints(lua_State *L)
{
    struct policy_version *v = policy_api_version(L);
    luaL_checkudata(L, 1, POLICY_MT_FLEET);
    size_t len;
    const char *model = luaL_checklstring(L, 2, &len);
    lua_settop(L, 2);
    const struct atc_model *m =
        v->rt->table != NULL ? atc_endpoint_table_model(v->rt->table, model, len) : NULL;
    if (m == NULL)
        lua_newtable(L); /* an unknown model: an empty table of its own */
    else
        push_engine_list(L, v, 2, m->endpoints, m->nendpoints, "fleet:endpoints");
    return 1;
}

static int fleet_all(lua_State *L)
{
    struct policy_version *v = policy_api_version(L);
    luaL_checkudata(L, 1, POLICY_MT_FLEET);
    const struct atc_endpoint_table *t = v->rt->table;
    lua_settop(L, 1);
    if (t == NULL) {
        lua_newtable(L);
        return 1;
    }
    lua_pushlightuserdata(L, (void *)&all_key);
    push_engine_list(L, v, 2, t->endpoints, t->nendpoints, "fleet:all");
    return 1;
}

static int fleet_models(lua_State *L)
{
    struct policy_version *v = policy_api_version(L);
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
    struct policy_version *v = policy_api_version(L);
    luaL_checkudata(L, 1, POLICY_MT_FLEET);
    size_t len;
    const char *id = luaL_checklstring(L, 2, &len);
    const struct atc_endpoint *ep = policy_fleet_by_id(v, id, len);
    if (ep == NULL)
        lua_pushnil(L);
    else
        policy_api_push_view(L, v, ep->index);
    return 1;
}

const struct policy_field policy_fleet_methods[] = {
    {"endpoints", NULL, fleet_endpoints}, {"all", NULL, fleet_all}, {"models", NULL, fleet_models},
    {"endpoint", NULL, fleet_endpoint},   {NULL, NULL, NULL},
};

/* ---- atc.pool, atc.find ---- */

/* atc.pool(list): an engine list of list's endpoints, in its order: list itself when it is one; a new one
 * when every element is an endpoint view (the policy keeps it, and must not change it); otherwise (an
 * element that is no view, such as a test's mock, or POOLS_MAX lists made already) a plain copy. */
int policy_fleet_pool(lua_State *L)
{
    struct policy_version *v = policy_api_version(L);
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_settop(L, 1);
    size_t n = lua_objlen(L, 1);
    if (n > LIST_MAX)
        return luaL_argerror(L, 1, "a pool of more than 4096 endpoints");
    if (policy_fleet_list(L, v, 1, "atc.pool") != NULL)
        return 1;
    bool views = v->npools < POOLS_MAX;
    lua_createtable(L, (int)n, 0);
    for (size_t i = 1; i <= n; i++) {
        lua_rawgeti(L, 1, (int)i);
        int index = policy_api_view_index(v, -1);
        views = views && index >= 0 && policy_api_endpoint_at(v, (unsigned)index) != NULL;
        lua_rawseti(L, 2, (int)i);
    }
    if (views) {
        list_register(L, v);
        v->npools++;
    }
    return 1;
}

/* atc.find(pool, ep_or_id): the element of pool that is that endpoint (a view, or an id), and its place;
 * nil when pool does not hold it. A test's mock matches itself, or an id equal to its id field. */
int policy_fleet_find(lua_State *L)
{
    struct policy_version *v = policy_api_version(L);
    luaL_checktype(L, 1, LUA_TTABLE);
    luaL_checkany(L, 2);
    lua_settop(L, 2);
    size_t n = lua_objlen(L, 1);
    if (n > LIST_MAX)
        return luaL_argerror(L, 1, "a pool of more than 4096 endpoints");
    const struct atc_endpoint *want = policy_api_to_endpoint(v, 2);
    const char *id = lua_type(L, 2) == LUA_TSTRING ? lua_tostring(L, 2) : NULL;
    struct policy_list *l = (struct policy_list *)policy_fleet_list(L, v, 1, "atc.find");
    int at = 0;
    if (l != NULL) {
        size_t nslots = v->rt->table != NULL ? v->rt->table->nslots : 0;
        if (l->at == NULL && nslots > 0 && (l->at = calloc(nslots, sizeof(*l->at))) != NULL)
            for (uint32_t i = l->n; i-- > 0;) /* (backwards: an endpoint twice in it is found first) */
                l->at[l->eps[i]->index] = i + 1;
        if (want != NULL && l->at != NULL)
            at = want->index < nslots ? (int)l->at[want->index] : 0;
        for (uint32_t i = 0; want != NULL && l->at == NULL && i < l->n && at == 0; i++) /* (no memory) */
            if (l->eps[i] == want)
                at = (int)i + 1;
        if (at == 0) {
            lua_pushnil(L);
            return 1;
        }
        policy_fleet_push_element(L, l, 1, at, "atc.find");
        lua_pushinteger(L, at);
        return 2;
    }
    for (size_t i = 1; i <= n && at == 0; i++) {
        lua_rawgeti(L, 1, (int)i);
        int index = policy_api_view_index(v, -1);
        if (index >= 0) {
            at = want != NULL && policy_api_endpoint_at(v, (unsigned)index) == want ? (int)i : 0;
        } else if (lua_rawequal(L, -1, 2)) {
            at = (int)i;
        } else if (id != NULL && lua_istable(L, -1)) { /* a mock: by its id */
            lua_getfield(L, -1, "id");
            at = lua_type(L, -1) == LUA_TSTRING && strcmp(lua_tostring(L, -1), id) == 0 ? (int)i : 0;
            lua_pop(L, 1);
        }
        if (at == 0)
            lua_pop(L, 1);
    }
    if (at == 0) {
        lua_pushnil(L);
        return 1;
    }
    lua_pushinteger(L, at);
    return 2;
}
