/* The YAML configuration (config.h). The file is loaded whole with libyaml's document API so that every
 * check can point at the node it is about, and the walk carries on after an error so that one run of
 * `atc check` lists every mistake in the file, sorted by position. */

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <strings.h>

#include <yaml.h>

#include "config/config.h"
#include "config/roles.h"
#include "config/config_errors.h"
#include "config/config_keys.h"
#include "config/api_key.h"
#include "config/engine_profile.h"
#include "base/config_value.h"
#include "base/dns_message.h"

#define KEY_MAX 320 /* longest key path in a message ("models[3].endpoints[12].tags[0]"); longer is cut */

/* Names declared so far, to report a duplicate together with where the first one is. */
struct seen_list {
    struct {
        const char *name; /* borrowed from the config being built */
        yaml_mark_t mark;
    } * v;
    size_t n, cap;
};

struct parse {
    yaml_document_t *doc;
    const char *name; /* the file name in messages */
    struct atc_config *cfg;
    struct atc_config_errors errs; /* what is wrong, in the order found */
    struct seen_list models, ids;
    bool endpoint_level; /* parsing an endpoint's health: (model-wide settings are refused) */
    bool keep_partial;   /* atc_config_load_partial: an invalid file's config is handed out too */
};

/* Walks the pairs of a mapping, skipping (after reporting) keys that are not strings or are repeated. */
struct map_iter {
    yaml_node_t *map; /* NULL when there is nothing to walk */
    yaml_node_pair_t *pair;
    const char *prefix; /* key path of the mapping itself, "" at the top */
    const char *key;
    yaml_node_t *keynode, *value;
    char path[KEY_MAX]; /* prefix.key */
};

static yaml_node_t *node(struct parse *p, int index)
{
    return yaml_document_get_node(p->doc, index);
}

/* ---- the schema: config_keys.h ---- */

static const char *const expected[] = {
    [F_STR] = "a string",
    [F_OPTSTR] = "a string",
    [F_PATH] = "a path",
    [F_BOOL] = "true or false",
    [F_UINT] = "a whole number",
    [F_U64] = "a whole number",
    [F_MS] = "a duration such as 500us, 250ms, 2s, 1m or 1h",
    [F_US] = "a duration such as 500us, 250ms, 2s, 1m or 1h",
    [F_SIZE] = "a size such as 512KiB, 8MiB or 1GiB",
    [F_POSITIVE] = "a number",
    [F_NONNEG] = "a number",
    [F_SHARE] = "a number",
    [F_HOSTPORT] = "host:port",
    [F_URL] = "a URL",
    [F_URLPATH] = "a path such as /health",
    [F_CHOICE] = "a string",
};

/* ---- walking the document ---- */

static const char *keyf(char *buf, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Builds a key path for a message into a KEY_MAX buffer (cut if longer). */
static const char *keyf(char *buf, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(buf, KEY_MAX, fmt, ap);
    va_end(ap);
    return buf;
}

/* The text of a scalar; NULL after reporting when @p n is something else. */
static const char *scalar(struct parse *p, const yaml_node_t *n, const char *key, const char *what)
{
    char d[64];

    if (n->type != YAML_SCALAR_NODE || atc_yaml_is_null(n)) {
        atc_config_report(&p->errs, n->start_mark, key, "expected %s, got %s", what,
                          atc_yaml_describe(n, d, sizeof d));
        return NULL;
    }
    if (strlen((const char *)n->data.scalar.value) != n->data.scalar.length) {
        atc_config_report(&p->errs, n->start_mark, key, "contains a NUL character");
        return NULL;
    }
    return (const char *)n->data.scalar.value;
}

static bool map_next(struct parse *p, struct map_iter *it)
{
    char d[64];

    for (; it->map && it->pair < it->map->data.mapping.pairs.top; it->pair++) {
        yaml_node_t *k = node(p, it->pair->key);
        const char *key;
        yaml_node_pair_t *q;

        if (k->type != YAML_SCALAR_NODE) {
            atc_config_report(&p->errs, k->start_mark, it->prefix, "expected a plain key, got %s",
                              atc_yaml_describe(k, d, sizeof d));
            continue;
        }
        key = (const char *)k->data.scalar.value;
        snprintf(it->path, sizeof it->path, "%s%s%s", it->prefix, *it->prefix ? "." : "", key);
        for (q = it->map->data.mapping.pairs.start; q < it->pair; q++) {
            yaml_node_t *first = node(p, q->key);
            if (first->type == YAML_SCALAR_NODE && !strcmp((const char *)first->data.scalar.value, key))
                break;
        }
        if (q < it->pair) {
            yaml_mark_t m = node(p, q->key)->start_mark;
            atc_config_report(&p->errs, k->start_mark, it->path, "duplicate key (first at %zu:%zu)",
                              m.line + 1, m.column + 1);
            continue;
        }
        it->key = key;
        it->keynode = k;
        it->value = node(p, it->pair->value);
        it->pair++;
        return true;
    }
    return false;
}

/* One zeroed element per item of list @p n (nothing is an empty list). Elements keep their YAML index, so
 * models[i] in a message is cfg->models[i]; an item that is not a mapping stays zeroed, and the parse fails
 * anyway. */
static void *alloc_items(struct parse *p, const yaml_node_t *n, const char *key, size_t size, size_t *count,
                         yaml_node_item_t **items)
{
    void *v = NULL;
    char d[64];

    *count = 0;
    if (n->type != YAML_SEQUENCE_NODE) {
        if (!atc_yaml_is_null(n))
            atc_config_report(&p->errs, n->start_mark, key, "expected a list, got %s",
                              atc_yaml_describe(n, d, sizeof d));
        return NULL;
    }
    *items = n->data.sequence.items.start;
    if ((*count = (size_t)(n->data.sequence.items.top - *items)) > 0 && !(v = calloc(*count, size))) {
        p->errs.oom = true;
        *count = 0;
    }
    return v;
}

/* Stores @p s (owned) at *at, or records that memory ran out. */
static void set_str(struct parse *p, char **at, char *s)
{
    if (!s) {
        p->errs.oom = true;
        return;
    }
    free(*at);
    *at = s;
}

/* Checks @p s as @p f's kind and stores it at base + f->off. Returns NULL, what is wrong with it, or ""
 * when it is not of that kind at all. */
static const char *set_value(struct parse *p, const struct field *f, const char *s, void *base, char *buf,
                             size_t size)
{
    char *at = (char *)base + f->off, *host;
    struct atc_endpoint_config *ep = base;
    const char *why;
    uint64_t u;
    double x;
    size_t bytes;

    switch (f->kind) {
    case F_STR:
    case F_OPTSTR:
    case F_PATH:
        if (!*s)
            return "must not be empty";
        set_str(p, (char **)at, f->kind == F_PATH ? atc_config_path(p->cfg->dir, s) : strdup(s));
        return NULL;
    case F_BOOL:
        if (!atc_parse_true(s) && !atc_parse_false(s))
            return "";
        *(bool *)at = atc_parse_true(s);
        return NULL;
    case F_UINT:
    case F_U64:
        if (atc_parse_u64(s, &u) < 0)
            return "";
        if (u < f->min && f->min == 1)
            return "must be greater than 0";
        if (u < f->min || u > f->max) {
            snprintf(buf, size, "must be from %" PRIu64 " to %" PRIu64, f->min, f->max);
            return buf;
        }
        if (f->kind == F_UINT)
            *(unsigned *)at = (unsigned)u;
        else
            *(uint64_t *)at = u;
        return NULL;
    case F_MS:
    case F_US:
        if (atc_bare_number(s))
            return "needs a unit: 500us, 250ms, 2s, 1m or 1h (a bare number could mean ms or s)";
        if (atc_parse_duration_us(s, &u) < 0)
            return "";
        if (u == 0 && f->min)
            return "must be greater than 0";
        *(uint64_t *)at = f->kind == F_US ? u : u / 1000 + (u % 1000 != 0);
        return NULL;
    case F_SIZE:
        if (atc_bare_number(s))
            return "needs a unit: 512B, 512KiB, 8MiB or 1GiB (a bare number could mean bytes or MiB)";
        if (atc_parse_size(s, &bytes) < 0)
            return "";
        if (bytes == 0)
            return "must be greater than 0";
        *(size_t *)at = bytes;
        return NULL;
    case F_POSITIVE:
    case F_NONNEG:
    case F_SHARE:
        if (atc_parse_real(s, &x) < 0)
            return "";
        if (f->kind == F_POSITIVE && !(x > 0))
            return "must be greater than 0";
        if (f->kind == F_NONNEG && x < 0)
            return "must not be negative";
        if (f->kind == F_SHARE && (x < 0 || x > 1))
            return "must be between 0 and 1";
        *(double *)at = x;
        return NULL;
    case F_HOSTPORT:
        /* port 0 is fine here: listen/admin on "pick a free port" (tests, several instances) */
        if (atc_parse_hostport(s, &host, (uint16_t *)((char *)base + f->aux), &why) < 0)
            return why;
        set_str(p, (char **)at, host);
        return NULL;
    case F_URLPATH:
        if (s[0] != '/')
            return "must start with '/'";
        for (const char *c = s; *c; c++)
            if (*c <= ' ' || *c == 0x7f)
                return "must not contain spaces or control characters";
        set_str(p, (char **)at, strdup(s));
        return NULL;
    case F_CHOICE: {
        size_t o = 0;
        for (u = 0; f->choices[u]; u++) {
            if (!strcmp(s, f->choices[u])) {
                *(unsigned *)at = (unsigned)u;
                return NULL;
            }
            o += (size_t)snprintf(buf + o, size > o ? size - o : 0, "%s%s",
                                  u ? ", " : "must be one of: ", f->choices[u]);
        }
        return buf;
    }
    case F_URL:
        if (atc_parse_url(s, &host, &ep->port, &why) < 0)
            return why;
        set_str(p, &ep->host, host);
        set_str(p, &ep->url, strdup(s));
        return NULL;
    default:
        return NULL;
    }
}

static int get_list(struct parse *p, const struct field *f, const yaml_node_t *n, const char *key,
                    void *base);
static int get_weights(struct parse *p, const struct field *f, yaml_node_t *n, const char *key, void *base);

/* Reads one value into base + f->off, or reports why not at the value's position and returns -1. */
static int get_field(struct parse *p, const struct field *f, const yaml_node_t *n, const char *key,
                     void *base)
{
    char buf[256], d[64];
    const char *s, *why;

    if (f->kind == F_STRS || f->kind == F_PATHS)
        return get_list(p, f, n, key, base);
    if (f->kind == F_WEIGHTS)
        return get_weights(p, f, (yaml_node_t *)n, key, base);
    if (f->kind == F_OPTSTR && atc_yaml_is_null(n))
        return 0;
    if (!(s = scalar(p, n, key, expected[f->kind])))
        return -1;
    if (!(why = set_value(p, f, s, base, buf, sizeof buf)))
        return 0;
    atc_yaml_describe(n, d, sizeof d);
    if (*why)
        atc_config_report(&p->errs, n->start_mark, key, "%s (got %s)", why, d);
    else if (s[0] == '-' && f->kind != F_BOOL) /* the common mistake with numbers gets its own message */
        atc_config_report(&p->errs, n->start_mark, key, "must not be negative (got %s)", d);
    else
        atc_config_report(&p->errs, n->start_mark, key, "expected %s, got %s", expected[f->kind], d);
    return -1;
}

static int get_list(struct parse *p, const struct field *f, const yaml_node_t *n, const char *key, void *base)
{
    char ***out = (char ***)((char *)base + f->off), k[KEY_MAX];
    size_t *nout = (size_t *)((char *)base + f->aux), count;
    const struct field item = {.kind = f->kind == F_PATHS ? F_PATH : F_STR};
    yaml_node_item_t *items = NULL;
    int rc = 0;

    *out = alloc_items(p, n, key, sizeof **out, &count, &items);
    for (size_t i = 0; i < count; i++) {
        if (get_field(p, &item, node(p, items[i]), keyf(k, "%s[%zu]", key, i), &(*out)[*nout]) == 0)
            (*nout)++;
        else
            rc = -1;
    }
    return rc;
}

/* {gold: 4, free: 1}: names with their weights. */
static int get_weights(struct parse *p, const struct field *f, yaml_node_t *n, const char *key, void *base)
{
    struct atc_weights *w = (struct atc_weights *)((char *)base + f->off);
    struct map_iter it = {.prefix = key};
    const struct field weight = {.kind = F_UINT, .min = 1, .max = 1000000};
    char d[64];
    int rc = 0;

    if (atc_yaml_is_null(n))
        return 0;
    if (n->type != YAML_MAPPING_NODE) {
        atc_config_report(&p->errs, n->start_mark, key, "expected a mapping of names to weights, got %s",
                          atc_yaml_describe(n, d, sizeof d));
        return -1;
    }
    size_t cap = (size_t)(n->data.mapping.pairs.top - n->data.mapping.pairs.start);
    w->names = calloc(cap ? cap : 1, sizeof *w->names);
    w->weights = calloc(cap ? cap : 1, sizeof *w->weights);
    if (!w->names || !w->weights) {
        p->errs.oom = true;
        return -1;
    }
    it.map = n;
    it.pair = n->data.mapping.pairs.start;
    while (map_next(p, &it)) {
        if (get_field(p, &weight, it.value, it.path, &w->weights[w->n]) < 0) {
            rc = -1;
            continue;
        }
        if (!(w->names[w->n] = strdup(it.key)))
            p->errs.oom = true;
        else
            w->n++;
    }
    return rc;
}

static void unknown_key(struct parse *p, const struct map_iter *it, const struct field *fields)
{
    char list[256] = "";
    size_t o = 0;
    for (; fields->key && o < sizeof list; fields++)
        o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", o ? ", " : "", fields->key);
    atc_config_report(&p->errs, it->keynode->start_mark, it->prefix, "unknown key '%s' (expected one of: %s)",
                      it->key, list);
}

/* Fills @p base from mapping @p n as @p fields describe; nothing (null) is an empty mapping when @p null_ok.
 * found[i] (if given, MAX_FIELDS long) receives the value node of fields[i] when the key is present.
 * Returns -1 when @p n is not a mapping. */
static int parse_section(struct parse *p, yaml_node_t *n, const char *key, bool null_ok,
                         const struct field *fields, void *base, yaml_node_t **found)
{
    yaml_node_t *seen[MAX_FIELDS] = {0};
    struct map_iter it = {.prefix = key};
    const struct field *f;
    char d[64];

    if (n->type != YAML_MAPPING_NODE) {
        if (null_ok && atc_yaml_is_null(n)) { /* an empty section: every field absent */
            if (found)
                memcpy(found, seen, sizeof seen);
            return 0;
        }
        atc_config_report(&p->errs, n->start_mark, key, "expected a mapping, got %s",
                          atc_yaml_describe(n, d, sizeof d));
        return -1;
    }
    it.map = n;
    it.pair = n->data.mapping.pairs.start;
    while (map_next(p, &it)) {
        for (f = fields; f->key && strcmp(f->key, it.key); f++)
            ;
        if (!f->key) {
            unknown_key(p, &it, fields);
            continue;
        }
        if (f->model_wide && p->endpoint_level) {
            atc_config_report(
                &p->errs, it.keynode->start_mark, it.path,
                "applies to a whole model: set it in the model's or the top-level health section");
            continue;
        }
        seen[f - fields] = it.value;
        if (f->kind == F_SECTION)
            parse_section(p, it.value, it.path, true, f->sub, base, NULL);
        else if (f->kind != F_NODE)
            get_field(p, f, it.value, it.path, base);
    }
    for (f = fields; f->key; f++)
        if (f->required && !seen[f - fields])
            atc_config_report(&p->errs, n->start_mark, key, "missing '%s'", f->key);
    if (found)
        memcpy(found, seen, sizeof seen);
    return 0;
}

static yaml_node_t *lookup(const struct field *fields, yaml_node_t *const *found, const char *key)
{
    for (size_t i = 0; fields[i].key; i++)
        if (!strcmp(fields[i].key, key))
            return found[i];
    return NULL;
}

/* Remembers @p name, or reports it as a duplicate of an earlier one. */
static void check_unique(struct parse *p, struct seen_list *l, const char *name, const yaml_node_t *n,
                         const char *key, const char *what)
{
    for (size_t i = 0; i < l->n; i++) {
        if (!strcmp(l->v[i].name, name)) {
            atc_config_report(&p->errs, n->start_mark, key, "duplicate %s '%s' (first declared at %zu:%zu)",
                              what, name, l->v[i].mark.line + 1, l->v[i].mark.column + 1);
            return;
        }
    }
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        void *v = realloc(l->v, cap * sizeof *l->v);
        if (!v) {
            p->errs.oom = true;
            return;
        }
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n].name = name;
    l->v[l->n].mark = n->start_mark;
    l->n++;
}

/* The value of @p key in mapping @p n, or NULL (also when @p n is NULL or not a mapping). */
static yaml_node_t *child(struct parse *p, const yaml_node_t *n, const char *key)
{
    for (yaml_node_pair_t *q = n && n->type == YAML_MAPPING_NODE ? n->data.mapping.pairs.start : NULL;
         q != NULL && q < n->data.mapping.pairs.top; q++) {
        const yaml_node_t *k = node(p, q->key);
        if (k->type == YAML_SCALAR_NODE && !strcmp((const char *)k->data.scalar.value, key))
            return node(p, q->value);
    }
    return NULL;
}

/* A health: mapping @p n over @p h, which already holds the level above's settings. */
static void parse_health(struct parse *p, yaml_node_t *n, const char *key, struct atc_health_config *h,
                         bool endpoint_level)
{
    yaml_node_t *live = child(p, n, "live");
    h->set |= (child(p, live, "path") ? ATC_HEALTH_SET_LIVE_PATH : 0u) |
              (child(p, live, "timeout") ? ATC_HEALTH_SET_LIVE_TIMEOUT : 0u) |
              (child(p, child(p, n, "ready"), "path") ? ATC_HEALTH_SET_READY_PATH : 0u) |
              (child(p, n, "startup_grace") ? ATC_HEALTH_SET_STARTUP_GRACE : 0u);
    p->endpoint_level = endpoint_level;
    if (parse_section(p, n, key, true, atc_config_health_fields, h, NULL) == 0 &&
        h->eject.base_time_ms > h->eject.max_time_ms)
        atc_config_report(&p->errs, n->start_mark, key,
                          "eject.base_time (%" PRIu64 "ms) must not exceed eject.max_time (%" PRIu64 "ms)",
                          h->eject.base_time_ms, h->eject.max_time_ms);
    p->endpoint_level = false;
}

/* api_key_env: / api_key_file: found in a model's or an endpoint's mapping, into @p a (which holds what
 * the level above said). The key is read now, so that atc check finds a missing one. */
static void parse_api_key(struct parse *p, const struct field *fields, yaml_node_t *const *found,
                          const char *key, struct atc_upstream_access *a)
{
    yaml_node_t *env = lookup(fields, found, "api_key_env"), *file = lookup(fields, found, "api_key_file");
    yaml_node_t *n = file ? file : env;
    const char *s, *why;
    char k[KEY_MAX], *secret;
    if (env && file)
        atc_config_report(&p->errs, file->start_mark, keyf(k, "%s.api_key_file", key),
                          "set api_key_env or api_key_file, not both");
    if (n == NULL || (env && file))
        return;
    keyf(k, "%s.%s", key, file ? "api_key_file" : "api_key_env");
    if (!(s = scalar(p, n, k, file ? "a path" : "an environment variable name")))
        return;
    if (!(secret = atc_api_key_load(p->cfg->dir, file != NULL, s, &why))) {
        if (why == NULL)
            p->errs.oom = true;
        else
            atc_config_report(&p->errs, n->start_mark, k, "%s '%s' %s", file ? "file" : "variable", s, why);
        return;
    }
    atc_api_key_free(a->api_key);
    a->api_key = secret;
    set_str(p, &a->api_key_source, atc_config_format("%s %s", file ? "file" : "env", s));
}

static void check_window(struct parse *p, const yaml_node_t *u, const char *key, const struct atc_window *w)
{
    char k[KEY_MAX]; /* (from: and until: are durations into the trace a replay reads) */
    if (u != NULL && w->until_ms > 0 && w->until_ms <= w->from_ms) /* (0: refused already) */
        atc_config_report(&p->errs, u->start_mark, keyf(k, "%s.until", key), "must be later than from:");
}

static char *dup_or_null(struct parse *p, const char *s)
{
    char *d = s ? strdup(s) : NULL;
    p->errs.oom |= s && !d;
    return d;
}

static void parse_endpoint(struct parse *p, yaml_node_t *n, const char *key, struct atc_endpoint_config *ep,
                           const char *model, const struct atc_health_config *model_health,
                           const struct atc_upstream_access *model_access,
                           const struct atc_kv_events_config *model_kv)
{
    yaml_node_t *found[MAX_FIELDS];
    char k[KEY_MAX];

    ep->capacity = 64;
    ep->weight = 1;
    ep->bootstrap_port = ATC_SGLANG_BOOTSTRAP_PORT;
    if (atc_health_config_copy(&ep->health, model_health) < 0 ||
        atc_upstream_access_copy(&ep->access, model_access) < 0)
        p->errs.oom = true;
    ep->kv_events = *model_kv;
    ep->kv_events.endpoint = dup_or_null(p, model_kv->endpoint);
    ep->kv_events.replay_endpoint = dup_or_null(p, model_kv->replay_endpoint);
    ep->kv_events.topic = dup_or_null(p, model_kv->topic);
    if (parse_section(p, n, key, false, atc_config_endpoint_fields, ep, found) < 0)
        return;
    parse_api_key(p, atc_config_endpoint_fields, found, key, &ep->access);
    ep->access.engine_set |= lookup(atc_config_endpoint_fields, found, "engine") != NULL;
    if (lookup(atc_config_endpoint_fields, found, "health"))
        parse_health(p, lookup(atc_config_endpoint_fields, found, "health"), keyf(k, "%s.health", key),
                     &ep->health, true);
    if (atc_health_config_apply_engine(&ep->health, &p->cfg->health, ep->access.engine) < 0)
        p->errs.oom = true;
    if (ep->id)
        check_unique(p, &p->ids, ep->id, lookup(atc_config_endpoint_fields, found, "id"),
                     keyf(k, "%s.id", key), "endpoint id");
    check_window(p, lookup(atc_config_endpoint_fields, found, "until"), key, &ep->window);
    if (model && !(ep->model = strdup(model)))
        p->errs.oom = true;
}

/* discover: names A/AAAA records and the servers' port (dns:, port:) or SRV records, which carry it. */
static void check_discover(struct parse *p, yaml_node_t *n, const char *key, const char *srv_name)
{
    yaml_node_t *dns = child(p, n, "dns"), *srv = child(p, n, "srv"), *port = child(p, n, "port");
    const char *why = NULL;
    char k[KEY_MAX];
    if (!dns && !srv)
        atc_config_report(&p->errs, n->start_mark, key, "missing 'dns' (A records) or 'srv' (SRV records)");
    else if (dns && !srv && !port)
        atc_config_report(&p->errs, n->start_mark, key, "missing 'port' (A records carry none)");
    if (dns && srv)
        atc_config_report(&p->errs, srv->start_mark, keyf(k, "%s.srv", key), "set dns: or srv:, not both");
    if (srv && port && !dns)
        atc_config_report(&p->errs, port->start_mark, keyf(k, "%s.port", key), "SRV records carry the port");
    if (srv_name && atc_dns_name_check(srv_name, &why) < 0)
        atc_config_report(&p->errs, srv->start_mark, keyf(k, "%s.srv", key), "not a DNS name: %s", why);
}

static void parse_model(struct parse *p, yaml_node_t *n, const char *key, struct atc_model_config *m)
{
    yaml_node_t *found[MAX_FIELDS], *eps, *health, *dis;
    yaml_node_item_t *items = NULL;
    char k[KEY_MAX];

    if (atc_health_config_copy(&m->health, &p->cfg->health) < 0)
        p->errs.oom = true;
    m->kv_events = (struct atc_kv_events_config){
        .block_size = 16, .max_blocks = 65536, .tokenize_timeout_ms = 20, .tokenize_min_bytes = 2048};
    if (parse_section(p, n, key, false, atc_config_model_fields, m, found) < 0)
        return;
    parse_api_key(p, atc_config_model_fields, found, key, &m->access);
    m->access.engine_set = lookup(atc_config_model_fields, found, "engine") != NULL;
    if ((dis = lookup(atc_config_model_fields, found, "disaggregation"))) {
        m->disagg_line = (unsigned)dis->start_mark.line + 1;
        m->disagg_column = (unsigned)dis->start_mark.column + 1;
    }
    if ((health = lookup(atc_config_model_fields, found, "health")))
        parse_health(p, health, keyf(k, "%s.health", key), &m->health, false);
    if ((dis = lookup(atc_config_model_fields, found, "discover")) && dis->type == YAML_MAPPING_NODE)
        check_discover(p, dis, keyf(k, "%s.discover", key), m->discover.srv);
    if (atc_health_config_apply_engine(&m->health, &p->cfg->health, m->access.engine) < 0)
        p->errs.oom = true;
    if (m->name)
        check_unique(p, &p->models, m->name, lookup(atc_config_model_fields, found, "name"),
                     keyf(k, "%s.name", key), "model");
    if (!(eps = lookup(atc_config_model_fields, found, "endpoints")))
        return;
    m->endpoints =
        alloc_items(p, eps, keyf(k, "%s.endpoints", key), sizeof *m->endpoints, &m->nendpoints, &items);
    for (size_t i = 0; i < m->nendpoints; i++)
        parse_endpoint(p, node(p, items[i]), keyf(k, "%s.endpoints[%zu]", key, i), &m->endpoints[i], m->name,
                       &m->health, &m->access, &m->kv_events);
}

/* The servers of a simulate: entry that names an engine are checked as that engine, unless their model
 * names one (config_defaults.c, atc_model_config_take_sim_engine). */
static void simulate_engine(struct parse *p, const yaml_node_t *engine, const char *key,
                            struct atc_model_config *m, const struct atc_simulate_config *s)
{
    char k[KEY_MAX];
    unsigned was = m->access.engine;
    int rc = atc_model_config_take_sim_engine(m, &p->cfg->health, s->params.engine);
    if (rc < 0)
        p->errs.oom = true;
    else if (rc > 0)
        atc_config_report(&p->errs, engine->start_mark, keyf(k, "%s.engine", key),
                          "another simulate entry of model '%s' is %s: set engine: on the model to check "
                          "its servers alike",
                          m->name, atc_engine_names[was]);
}

static void parse_simulate(struct parse *p, yaml_node_t *n, const char *key, struct atc_simulate_config *s)
{
    yaml_node_t *found[MAX_FIELDS];
    char k[KEY_MAX];

    atc_sim_params_init(&s->params);
    /* The entry must name its model; the library default would hide a missing one. */
    free(s->params.model);
    s->params.model = NULL;
    s->count = 1;
    if (parse_section(p, n, key, false, atc_config_simulate_fields, s, found) < 0)
        return;
    /* capacity follows a max_seqs given here; else it is an endpoint's default (64), not the sim's
     * max_seqs default (vLLM's 1024), so a simulated endpoint is routed to as a configured one is. */
    if (!lookup(atc_config_simulate_fields, found, "capacity"))
        s->capacity = lookup(atc_config_simulate_fields, found, "max_seqs") ? s->params.max_seqs : 64;
    struct atc_model_config *m = s->params.model ? atc_config_model(p->cfg, s->params.model) : NULL;
    if (s->params.model && m == NULL)
        atc_config_report(&p->errs, lookup(atc_config_simulate_fields, found, "model")->start_mark,
                          keyf(k, "%s.model", key), "no model named '%s' is declared under 'models'",
                          s->params.model);
    if (m != NULL && lookup(atc_config_simulate_fields, found, "engine"))
        simulate_engine(p, lookup(atc_config_simulate_fields, found, "engine"), key, m, s);
    check_window(p, lookup(atc_config_simulate_fields, found, "until"), key, &s->window);
}

/* record: (trace recording); its file name prefix becomes part of paths, so it is checked here. */
static void parse_record(struct parse *p, yaml_node_t *n)
{
    yaml_node_t *found[MAX_FIELDS], *prefix;

    p->cfg->record.enabled = true;
    if (parse_section(p, n, "record", true, atc_config_record_fields, p->cfg, found) < 0)
        return;
    prefix = lookup(atc_config_record_fields, found, "prefix");
    if (prefix && p->cfg->record.prefix &&
        strspn(p->cfg->record.prefix, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") !=
            strlen(p->cfg->record.prefix))
        atc_config_report(&p->errs, prefix->start_mark, "record.prefix",
                          "only letters, digits, '.', '_' and '-' may name files");
    yaml_node_t *headers = lookup(atc_config_record_fields, found, "headers");
    const struct atc_config *c = p->cfg;
    if (headers && c->record.nheaders > ATC_RECORD_HEADERS_MAX) /* each record stays small */
        atc_config_report(&p->errs, headers->start_mark, "record.headers", "at most 16 headers");
    for (size_t i = 0; headers && i < c->record.nheaders; i++)
        if (c->record.headers[i][0] == '\0' || strlen(c->record.headers[i]) > 63 ||
            strspn(c->record.headers[i],
                   "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_") !=
                strlen(c->record.headers[i]))
            atc_config_report(&p->errs, headers->start_mark, "record.headers",
                              "a header name is 1-63 letters, digits, '-' or '_'");
}

/* cluster: (replicas sharing state through Redis) and limits: (per-tenant budgets). */
static void parse_cluster(struct parse *p, yaml_node_t *n)
{
    yaml_node_t *found[MAX_FIELDS], *url;
    const char *why;

    p->cfg->cluster.enabled = true;
    if (parse_section(p, n, "cluster", false, atc_config_cluster_fields, p->cfg, found) < 0)
        return;
    if ((url = lookup(atc_config_cluster_fields, found, "redis")) && p->cfg->cluster.redis &&
        atc_parse_redis_url(p->cfg->cluster.redis, &p->cfg->cluster.host, &p->cfg->cluster.port,
                            &p->cfg->cluster.db, &why) < 0)
        atc_config_report(&p->errs, url->start_mark, "cluster.redis", "%s", why);
}

static void parse_limits(struct parse *p, yaml_node_t *n)
{
    struct atc_config *cfg = p->cfg;
    yaml_node_t *found[MAX_FIELDS], *t;
    struct map_iter it = {.prefix = "limits.tenants"};

    cfg->limits.enabled = true;
    if (parse_section(p, n, "limits", true, atc_config_limits_fields, cfg, found) < 0)
        return;
    if ((t = lookup(atc_config_limits_fields, found, "default")))
        parse_section(p, t, "limits.default", false, atc_config_rule_fields, &cfg->limits.dflt, NULL);
    if (!(t = lookup(atc_config_limits_fields, found, "tenants")) || atc_yaml_is_null(t))
        return;
    if (t->type != YAML_MAPPING_NODE) {
        atc_config_report(&p->errs, t->start_mark, "limits.tenants", "expected a mapping of tenant names");
        return;
    }
    size_t cap = (size_t)(t->data.mapping.pairs.top - t->data.mapping.pairs.start) + 1;
    if (!(cfg->limits.tenants = calloc(cap, sizeof(char *))) ||
        !(cfg->limits.rules = calloc(cap, sizeof(struct atc_limit_rule)))) {
        p->errs.oom = true;
        return;
    }
    it.map = t;
    it.pair = t->data.mapping.pairs.start;
    while (map_next(p, &it)) {
        if (parse_section(p, it.value, it.path, false, atc_config_rule_fields,
                          &cfg->limits.rules[cfg->limits.ntenants], NULL) < 0)
            continue;
        if (!(cfg->limits.tenants[cfg->limits.ntenants] = strdup(it.key)))
            p->errs.oom = true;
        else
            cfg->limits.ntenants++;
    }
}

/* Where atc check reports what is wrong with the policy: at the entry: value, or at the policy:
 * section when the entry is the default. */
static void mark_policy_entry(struct parse *p, const yaml_node_t *policy)
{
    const yaml_node_t *entry = child(p, policy, "entry");
    yaml_mark_t at = entry != NULL ? entry->start_mark : policy->start_mark;
    p->cfg->policy.entry_line = (unsigned)at.line + 1;
    p->cfg->policy.entry_column = (unsigned)at.column + 1;
}

static void parse_root(struct parse *p, yaml_node_t *root)
{
    struct atc_config *cfg = p->cfg;
    yaml_node_t *found[MAX_FIELDS], *models, *simulate, *admin, *health;
    yaml_node_item_t *items = NULL;
    char k[KEY_MAX];

    if (parse_section(p, root, "", false, atc_config_root_fields, cfg, found) < 0)
        return;
    cfg->policy.enabled = lookup(atc_config_root_fields, found, "policy") != NULL;
    if (cfg->policy.enabled)
        mark_policy_entry(p, lookup(atc_config_root_fields, found, "policy"));
    if (lookup(atc_config_root_fields, found, "record"))
        parse_record(p, lookup(atc_config_root_fields, found, "record"));
    if (lookup(atc_config_root_fields, found, "cluster"))
        parse_cluster(p, lookup(atc_config_root_fields, found, "cluster"));
    if (lookup(atc_config_root_fields, found, "limits"))
        parse_limits(p, lookup(atc_config_root_fields, found, "limits"));
    /* One address for both would only fail at bind time; say so now, at whichever of them the file sets. */
    admin = lookup(atc_config_root_fields, found, "admin");
    if (cfg->admin_port != 0 && cfg->admin_port == cfg->listen_port &&
        !strcmp(cfg->admin_host, cfg->listen_host))
        atc_config_report(&p->errs,
                          (admin ? admin : lookup(atc_config_root_fields, found, "listen"))->start_mark,
                          admin ? "admin" : "listen", "must differ from '%s'", admin ? "listen" : "admin");

    /* Without a token the admin API (drain, reload, config) is safe only where nobody else reaches it. */
    const char *ah = cfg->admin_host;
    if (cfg->admin_token == NULL && strcasecmp(ah, "localhost") != 0 && strncmp(ah, "127.", 4) != 0 &&
        strcmp(ah, "::1") != 0)
        atc_config_report(&p->errs, (admin ? admin : root)->start_mark, "admin",
                          "'%s' is not a loopback address: without admin_token the admin API (drain, reload, "
                          "config) must listen on 127.0.0.1, ::1 or localhost; set admin_token to serve it "
                          "elsewhere",
                          ah);

    /* Models start from the top-level health settings, so those are read first. */
    if ((health = lookup(atc_config_root_fields, found, "health")))
        parse_health(p, health, "health", &cfg->health, false);

    /* simulate: names models, so it is read after them whatever their order in the file. */
    models = lookup(atc_config_root_fields, found, "models");
    if (!models || atc_yaml_is_null(models) ||
        (models->type == YAML_SEQUENCE_NODE &&
         models->data.sequence.items.top == models->data.sequence.items.start))
        atc_config_report(&p->errs, (models ? models : root)->start_mark, "models",
                          "at least one model is required");
    else
        cfg->models = alloc_items(p, models, "models", sizeof *cfg->models, &cfg->nmodels, &items);
    for (size_t i = 0; i < cfg->nmodels; i++)
        parse_model(p, node(p, items[i]), keyf(k, "models[%zu]", i), &cfg->models[i]);
    if ((simulate = lookup(atc_config_root_fields, found, "simulate")))
        cfg->simulate = alloc_items(p, simulate, "simulate", sizeof *cfg->simulate, &cfg->nsimulate, &items);
    for (size_t i = 0; i < cfg->nsimulate; i++)
        parse_simulate(p, node(p, items[i]), keyf(k, "simulate[%zu]", i), &cfg->simulate[i]);
    for (size_t i = 0; i < cfg->nsimulate; i++) /* once every entry has had its say */
        if (cfg->simulate[i].params.model && atc_config_model(cfg, cfg->simulate[i].params.model))
            cfg->simulate[i].engine = atc_config_model(cfg, cfg->simulate[i].params.model)->access.engine;

    /* Each model needs somewhere to send requests: its own endpoints or simulated ones. */
    for (size_t i = 0; i < cfg->nmodels; i++) {
        const char *name = cfg->models[i].name;
        if (name && cfg->models[i].nendpoints == 0 && !cfg->models[i].discover.dns &&
            !cfg->models[i].discover.srv && !atc_config_simulated(cfg, name))
            atc_config_report(&p->errs, node(p, models->data.sequence.items.start[i])->start_mark,
                              keyf(k, "models[%zu]", i),
                              "model '%s' has no endpoints, no discover: and no simulate entry", name);
        const char *missing = atc_roles_missing(cfg, &cfg->models[i]); /* (a disaggregated model) */
        yaml_mark_t at = {.line = cfg->models[i].disagg_line - 1, .column = cfg->models[i].disagg_column - 1};
        if (missing != NULL)
            atc_config_report(
                &p->errs, at, keyf(k, "models[%zu].disaggregation", i),
                "model '%s' has no %s server: give an endpoint or a simulate entry role: %s or both", name,
                missing, missing);
    }
}

/* Hands over the config, or joins the sorted errors into one owned string and frees the config. */
static int finish(struct parse *p, struct atc_config **out, char **errors)
{
    if (!atc_config_errors_any(&p->errs)) {
        *out = p->cfg;
        return 0;
    }
    *errors = atc_config_errors_join(&p->errs);
    if (p->keep_partial)
        *out = p->cfg;
    else
        atc_config_free(p->cfg);
    p->cfg = NULL;
    return -1;
}

static void parse_stream(struct parse *p, yaml_parser_t *parser, yaml_document_t *doc)
{
    yaml_node_t *root = yaml_document_get_root_node(doc);
    yaml_document_t extra;

    p->doc = doc;
    if (!root) {
        atc_config_report(&p->errs, (yaml_mark_t){0}, NULL,
                          "the file is empty (at least one model is required)");
        return;
    }
    parse_root(p, root);
    /* A second document is almost always a stray '---'; ignoring it would silently drop settings. */
    if (!yaml_parser_load(parser, &extra)) {
        atc_config_report_syntax(&p->errs, parser);
        return;
    }
    if ((root = yaml_document_get_root_node(&extra)))
        atc_config_report(&p->errs, root->start_mark, NULL, "only one YAML document per file is supported");
    yaml_document_delete(&extra);
}

static int parse_text(const char *text, size_t len, const char *name, const char *dir, struct atc_config **out,
                      char **errors, bool keep_partial)
{
    struct parse p = {.errs.name = name ? name : "<config>", .keep_partial = keep_partial};
    yaml_parser_t parser;
    yaml_document_t doc;
    bool loaded = false;

    *out = NULL;
    *errors = NULL;
    if (!yaml_parser_initialize(&parser)) {
        *errors = strdup("out of memory");
        return -1;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    if (!(p.cfg = atc_config_new(p.errs.name, dir)))
        p.errs.oom = true;
    else if (!(loaded = yaml_parser_load(&parser, &doc)))
        atc_config_report_syntax(&p.errs, &parser);
    else
        parse_stream(&p, &parser, &doc);
    int rc = finish(&p, out, errors);
    if (loaded)
        yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    free(p.models.v);
    free(p.ids.v);
    return rc;
}

int atc_config_parse(const char *text, size_t len, const char *name, const char *dir, struct atc_config **out,
                     char **errors)
{
    return parse_text(text, len, name, dir, out, errors, false);
}

int atc_config_parse_partial(const char *text, size_t len, const char *name, const char *dir,
                             struct atc_config **out, char **errors)
{
    return parse_text(text, len, name, dir, out, errors, true);
}
