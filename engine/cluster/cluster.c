/* Replicas through Redis (cluster.h): hiredis's async contexts on the main thread's loop, a timer per
 * sync_interval, and a queue the workers fill. Keys: atc:load (a hash, a field per replica),
 * atc:pin:<key> (a pin, with its TTL), atc:lim:<tenant>:<r|t>:<minute> (a window's counter); channel
 * atc:pins:<db> (pins as they are set). */

#include <arpa/inet.h>
#include <assert.h>
#include <inttypes.h>
#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <hiredis/adapters/libevent.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#include "cluster/cluster.h"
#include "cluster/limits.h"
#include "cluster/load_share.h"
#include "base/clock.h"
#include "base/log.h"
#include "fleet/affinity.h"
#include "fleet/endpoint.h"
#include "base/json.h"

#define QUEUE_MAX 4096     /* pin operations waiting to be sent; more are dropped (and counted) */
#define REFILLS_MAX 64     /* lease refills sent per flush */
#define LIMIT_KEY_TTL_MS (2 * ATC_LIMITS_WINDOW_MS) /* a window's counter outlives its minute, then goes */
#define STALE_SYNCS 4      /* another replica's figures older than this many sync intervals are left out */
#define FORGET_MS 600000   /* a replica silent this long leaves the status */
#define HANG_MS_MIN 2000   /* a connection with an answer missing this long is dropped and made again */
/* Commands awaiting their answer on cmd; more are not sent (as if Redis were away). */
#define INFLIGHT_MAX 16384
/* What one sync reads of atc:load, whoever wrote it: values over ATC_LOAD_SHARE_TEXT_MAX, names over 63
 * bytes, fields beyond LOAD_FIELDS_MAX or beyond LOAD_READ_MAX bytes in all are left in Redis and
 * counted (oversized), never sent: a 64 MiB value read 64 times in flight took Redis from 13 MB to
 * 2.5 GB of output buffers in 10 s. */
#define LOAD_FIELDS_MAX (4 * ATC_LOAD_SHARE_REPLICAS)
#define LOAD_READ_MAX (4u << 20)

/* A connection to Redis, cmd's and sub's alike. The states and the moves allowed between them (checked by
 * link_set, as relay.c checks a relay's): */
enum link {
    LINK_DOWN,       /* none: not made yet, refused, lost, or dropped for hanging. cmd: local mode */
    LINK_CONNECTING, /* made, its socket not up yet. cmd: local mode */
    LINK_UP,         /* connected. cmd: no whole sync in time yet (local mode); sub: not confirmed yet */
    LINK_SHARED,     /* cmd: the last sync was whole and in time (shared mode); sub: subscribed, so other
                      * replicas' pins arrive */
    LINK_SLOW,       /* cmd: connected, an answer missing for more than sync_interval (local mode) */
};

#define LINK_IN(s) (1u << (s))
static const unsigned link_moves[] = {
    [LINK_DOWN] = LINK_IN(LINK_CONNECTING),
    [LINK_CONNECTING] = LINK_IN(LINK_UP) | LINK_IN(LINK_DOWN),
    [LINK_UP] = LINK_IN(LINK_SHARED) | LINK_IN(LINK_DOWN),
    [LINK_SHARED] = LINK_IN(LINK_SLOW) | LINK_IN(LINK_DOWN),
    [LINK_SLOW] = LINK_IN(LINK_SHARED) | LINK_IN(LINK_DOWN),
};

static void link_set(enum link *l, enum link to)
{
    assert(*l <= LINK_SLOW && (link_moves[*l] & LINK_IN(to)) != 0);
    (void)link_moves; /* (NDEBUG) */
    *l = to;
}

/* Connected: commands may be sent. */
static bool link_up(enum link l)
{
    return l == LINK_UP || l == LINK_SHARED || l == LINK_SLOW;
}

enum op_kind { OP_SET, OP_DEL, OP_MISS };

struct op {
    enum op_kind kind;
    uint64_t ttl_ms; /* OP_SET */
    char id[ATC_AFFINITY_ID_MAX + 1];
    size_t keylen;
    char key[ATC_AFFINITY_KEY_MAX];
};

enum reply_kind { R_IGNORE, R_LOAD, R_PIN, R_REFILL };

struct pending {
    struct atc_cluster *c;
    enum reply_kind kind;
    struct atc_limit_refill refill; /* R_REFILL */
    size_t keylen;                  /* R_PIN */
    char key[ATC_AFFINITY_KEY_MAX];
};

struct atc_cluster {
    struct event_base *base;
    struct atc_endpoint_table *table;
    struct atc_affinity *aff;
    struct atc_limits *limits;
    struct atc_load_share *share;
    void (*wake)(void *ctx);
    void *wake_ctx;
    char name[64];
    char ip[INET6_ADDRSTRLEN];
    char where[320]; /* host:port/db, for messages */
    uint16_t port;
    unsigned db;
    char channel[32];
    uint64_t interval_ms;
    struct event *tick;

    /* main thread */
    redisAsyncContext *cmd, *sub;
    enum link link;       /* cmd's, and the mode: shared in LINK_SHARED only */
    enum link sub_link;   /* sub's: LINK_SHARED once Redis confirmed the subscription */
    bool outage_logged;   /* local mode was logged: once per outage, from the first failure to a sync */
    unsigned outstanding; /* answers awaited on cmd */
    bool sync_in_flight;  /* a sync round's read is awaited: the next round waits for it */
    uint64_t busy_since_ms, last_sync_ms, next_connect_ms, seq;
    unsigned replicas;   /* others summed at the last sync */
    uint64_t syncs, local_entries, pins_sent, pins_received, pins_fetched;
    uint64_t oversized; /* values in Redis left unread for their size (atc:load's fields, pins) */
    char last_error[160];

    /* the workers' queue */
    pthread_mutex_t mu;
    struct op *ops; /* [QUEUE_MAX] (mu) */
    size_t nops;    /* (mu) */
    uint64_t dropped; /* (mu) */
    atomic_bool wake_posted; /* one wake in flight at a time: set by whoever wakes, cleared by the flush */
};

static void go_local(struct atc_cluster *c, enum link to, const char *why);

static void wake_once(struct atc_cluster *c)
{
    if (c->wake != NULL && !atomic_exchange(&c->wake_posted, true))
        c->wake(c->wake_ctx);
}

/* ---- commands ---- */

static void on_reply(redisAsyncContext *ac, void *r, void *priv);

/* Sends a command whose answer goes to on_reply with @p p (owned; freed here when not sent). Returns 0, or
 * -1 when it was not sent (no connection, too many in flight, out of memory). */
static int send_argv(struct atc_cluster *c, struct pending *p, int argc, const char **argv,
                     const size_t *lens)
{
    if (p == NULL)
        return -1; /* out of memory: an answer without its pending would not be counted */
    if (c->cmd == NULL || !link_up(c->link) || c->outstanding >= INFLIGHT_MAX ||
        redisAsyncCommandArgv(c->cmd, on_reply, p, argc, argv, lens) != REDIS_OK) {
        if (p != NULL && p->kind == R_REFILL && c->limits != NULL)
            atc_limits_refilled(c->limits, &p->refill, -1);
        free(p);
        return -1;
    }
    if (c->outstanding++ == 0)
        c->busy_since_ms = atc_mono_ms();
    return 0;
}

static struct pending *pending_new(struct atc_cluster *c, enum reply_kind kind)
{
    struct pending *p = calloc(1, sizeof(*p));
    if (p != NULL) {
        p->c = c;
        p->kind = kind;
    }
    return p;
}

/* The answer of LOAD_SCRIPT: {oversized, field, value, field, value, ...}. */
static void on_load(struct atc_cluster *c, const redisReply *r)
{
    uint64_t now = atc_mono_ms();
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 1 || r->element[0]->type != REDIS_REPLY_INTEGER)
        return;
    c->oversized += r->element[0]->integer > 0 ? (uint64_t)r->element[0]->integer : 0;
    for (size_t i = 1; i + 1 < r->elements; i += 2) {
        const redisReply *k = r->element[i], *v = r->element[i + 1];
        if (k->type == REDIS_REPLY_STRING && v->type == REDIS_REPLY_STRING)
            atc_load_share_update(c->share, k->str, k->len, v->str, v->len, now);
    }
    c->replicas = atc_load_share_apply(c->share, c->table, now, STALE_SYNCS * c->interval_ms);
    c->last_sync_ms = now;
    c->syncs++;
    if (c->link != LINK_SHARED) {
        link_set(&c->link, LINK_SHARED);
        if (c->outage_logged)
            atc_info("cluster: Redis at %s answers again: shared mode (%u other replica(s))", c->where,
                     c->replicas);
        c->outage_logged = false;
    }
    if (c->limits != NULL)
        atc_limits_set_shared(c->limits, true, c->replicas + 1);
}

/* A pin this replica asked for: {id or nil, pttl}; {nil, -3} when its value is too long to be an id. */
static void on_pin(struct atc_cluster *c, const struct pending *p, const redisReply *r)
{
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 && r->element[1]->type == REDIS_REPLY_INTEGER &&
        r->element[1]->integer == -3)
        c->oversized++;
    if (c->aff == NULL || r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_INTEGER ||
        r->element[1]->integer <= 0 || r->element[0]->len > ATC_AFFINITY_ID_MAX)
        return;
    if (atc_affinity_put(c->aff, p->key, p->keylen, r->element[0]->str,
                         atc_mono_ms() + (uint64_t)r->element[1]->integer) == 0)
        c->pins_fetched++;
}

static void on_reply(redisAsyncContext *ac, void *reply, void *priv)
{
    struct pending *p = priv;
    const redisReply *r = reply;
    if (p == NULL)
        return;
    struct atc_cluster *c = p->c;
    if (c->outstanding > 0 && --c->outstanding > 0)
        c->busy_since_ms = atc_mono_ms(); /* progress */
    if (r != NULL && r->type == REDIS_REPLY_ERROR) {
        snprintf(c->last_error, sizeof(c->last_error), "%s", r->str);
        r = NULL;
    }
    switch (p->kind) {
    case R_LOAD:
        c->sync_in_flight = false; /* answered, failed, or dropped with its connection */
        if (r != NULL)
            on_load(c, r);
        break;
    case R_PIN:
        if (r != NULL)
            on_pin(c, p, r);
        break;
    case R_REFILL:
        if (c->limits != NULL)
            atc_limits_refilled(c->limits, &p->refill,
                                r != NULL && r->type == REDIS_REPLY_INTEGER ? (int64_t)r->integer : -1);
        break;
    case R_IGNORE:
        break;
    }
    free(p);
}

/* ---- pins from the other replicas (the subscription) ---- */

/* "<replica>\n<ttl ms, -1: deleted>\n<endpoint id>\n<key>" */
static void on_pin_message(redisAsyncContext *ac, void *reply, void *priv)
{
    struct atc_cluster *c = priv;
    const redisReply *r = reply;
    if (r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
        r->element[0]->type == REDIS_REPLY_STRING && strcmp(r->element[0]->str, "subscribe") == 0 &&
        c->sub_link == LINK_UP)
        link_set(&c->sub_link, LINK_SHARED);
    if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements != 3 ||
        r->element[2]->type != REDIS_REPLY_STRING || c->aff == NULL)
        return;
    const char *s = r->element[2]->str, *end = s + r->element[2]->len;
    const char *a = memchr(s, '\n', (size_t)(end - s));
    const char *b = a != NULL ? memchr(a + 1, '\n', (size_t)(end - a - 1)) : NULL;
    const char *d = b != NULL ? memchr(b + 1, '\n', (size_t)(end - b - 1)) : NULL;
    if (d == NULL || ((size_t)(a - s) == strlen(c->name) && memcmp(s, c->name, (size_t)(a - s)) == 0))
        return; /* malformed, or our own */
    char id[ATC_AFFINITY_ID_MAX + 1];
    long long ttl = strtoll(a + 1, NULL, 10);
    size_t idlen = (size_t)(d - b - 1);
    if (idlen > ATC_AFFINITY_ID_MAX)
        return;
    memcpy(id, b + 1, idlen);
    id[idlen] = '\0';
    if (ttl < 0)
        atc_affinity_forget(c->aff, d + 1, (size_t)(end - d - 1));
    else if (idlen > 0 && atc_affinity_put(c->aff, d + 1, (size_t)(end - d - 1), id, atc_mono_ms() + (uint64_t)ttl) == 0)
        c->pins_received++;
}

/* ---- connections ---- */

static void on_connect(const redisAsyncContext *ac, int status)
{
    struct atc_cluster *c = ac->data;
    bool is_cmd = ac == c->cmd;
    if (status != REDIS_OK) { /* hiredis frees the context after this returns */
        snprintf(c->last_error, sizeof(c->last_error), "%s", ac->errstr);
        if (is_cmd) {
            c->cmd = NULL;
            go_local(c, LINK_DOWN, ac->errstr);
        } else {
            c->sub = NULL;
            link_set(&c->sub_link, LINK_DOWN);
        }
        return;
    }
    link_set(is_cmd ? &c->link : &c->sub_link, LINK_UP);
}

static void on_disconnect(const redisAsyncContext *ac, int status)
{
    struct atc_cluster *c = ac->data;
    if (ac == c->cmd) {
        c->cmd = NULL;
        c->outstanding = 0;
        c->sync_in_flight = false;
        go_local(c, LINK_DOWN, status == REDIS_OK ? "disconnected" : ac->errstr);
    } else if (ac == c->sub) {
        c->sub = NULL;
        link_set(&c->sub_link, LINK_DOWN);
    }
}

static redisAsyncContext *connect_one(struct atc_cluster *c)
{
    redisAsyncContext *ac = redisAsyncConnect(c->ip, c->port);
    if (ac == NULL)
        return NULL;
    if (ac->err) {
        snprintf(c->last_error, sizeof(c->last_error), "%s", ac->errstr);
        redisAsyncFree(ac);
        return NULL;
    }
    ac->data = c;
    redisLibeventAttach(ac, c->base);
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    return ac;
}

static void connect_all(struct atc_cluster *c, uint64_t now)
{
    if (now < c->next_connect_ms)
        return;
    uint64_t backoff = c->interval_ms * 4 < 1000 ? c->interval_ms * 4 : 1000;
    c->next_connect_ms = now + backoff;
    char db[16];
    snprintf(db, sizeof(db), "%u", c->db);
    if (c->cmd == NULL && (c->cmd = connect_one(c)) != NULL) {
        link_set(&c->link, LINK_CONNECTING);
        /* hiredis queues commands until the socket connects: SELECT goes first, the only one sent before */
        struct pending *p = pending_new(c, R_IGNORE);
        const char *argv[] = {"SELECT", db};
        if (p != NULL && redisAsyncCommandArgv(c->cmd, on_reply, p, 2, argv, NULL) == REDIS_OK) {
            if (c->outstanding++ == 0)
                c->busy_since_ms = atc_mono_ms();
        } else {
            free(p);
        }
    }
    if (c->sub == NULL && (c->sub = connect_one(c)) != NULL) {
        link_set(&c->sub_link, LINK_CONNECTING);
        const char *argv[] = {"SUBSCRIBE", c->channel};
        redisAsyncCommandArgv(c->sub, on_pin_message, c, 2, argv, NULL);
    }
}

/* cmd's link goes to @p to (LINK_DOWN, or LINK_SLOW from shared mode), and the replica to local mode. */
static void go_local(struct atc_cluster *c, enum link to, const char *why)
{
    if (!c->outage_logged)
        atc_warn("cluster: Redis at %s %s: local mode (each replica its own load, pins and limits) until "
                 "it answers again",
                 c->where, why);
    c->outage_logged = true;
    c->local_entries += c->link == LINK_SHARED;
    if (c->link != to)
        link_set(&c->link, to);
    atc_load_share_clear(c->table);
    if (c->limits != NULL)
        atc_limits_set_shared(c->limits, false, 1);
}

/* ---- the queue and the tick ---- */

static void send_op(struct atc_cluster *c, const struct op *o)
{
    char key[ATC_AFFINITY_KEY_MAX + 16], ttl[24], msg[ATC_AFFINITY_KEY_MAX + ATC_AFFINITY_ID_MAX + 96];
    size_t klen = (size_t)snprintf(key, sizeof(key), "atc:pin:");
    memcpy(key + klen, o->key, o->keylen);
    klen += o->keylen;
    if (o->kind == OP_MISS) {
        /* STRLEN first: a value too long to be an id is not sent */
        static const char script[] =
            "if redis.call('STRLEN', KEYS[1]) > tonumber(ARGV[1]) then return {false, -3} end "
            "return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}";
        struct pending *p = pending_new(c, R_PIN);
        if (p == NULL)
            return;
        memcpy(p->key, o->key, o->keylen);
        p->keylen = o->keylen;
        char idmax[16];
        snprintf(idmax, sizeof(idmax), "%d", ATC_AFFINITY_ID_MAX);
        const char *argv[] = {"EVAL", script, "1", key, idmax};
        size_t lens[] = {4, sizeof(script) - 1, 1, klen, strlen(idmax)};
        send_argv(c, p, 5, argv, lens);
        return;
    }
    snprintf(ttl, sizeof(ttl), "%" PRIu64, o->kind == OP_SET ? o->ttl_ms : 0);
    if (o->kind == OP_SET) {
        const char *argv[] = {"SET", key, o->id, "PX", ttl};
        size_t lens[] = {3, klen, strlen(o->id), 2, strlen(ttl)};
        send_argv(c, pending_new(c, R_IGNORE), 5, argv, lens);
    } else {
        const char *argv[] = {"DEL", key};
        size_t lens[] = {3, klen};
        send_argv(c, pending_new(c, R_IGNORE), 2, argv, lens);
    }
    int n = snprintf(msg, sizeof(msg), "%s\n%s\n%s\n", c->name, o->kind == OP_SET ? ttl : "-1",
                     o->kind == OP_SET ? o->id : "");
    memcpy(msg + n, o->key, o->keylen);
    const char *argv[] = {"PUBLISH", c->channel, msg};
    size_t lens[] = {7, strlen(c->channel), (size_t)n + o->keylen};
    send_argv(c, pending_new(c, R_IGNORE), 3, argv, lens);
    c->pins_sent++;
}

void atc_cluster_flush(struct atc_cluster *c)
{
    atomic_store(&c->wake_posted, false);
    struct op *ops = NULL;
    size_t n = 0;
    pthread_mutex_lock(&c->mu);
    if (c->nops > 0 && (ops = malloc(c->nops * sizeof(*ops))) != NULL) {
        memcpy(ops, c->ops, c->nops * sizeof(*ops));
        n = c->nops;
    }
    c->nops = 0;
    pthread_mutex_unlock(&c->mu);
    for (size_t i = 0; i < n && c->link == LINK_SHARED; i++) /* in local mode pins stay local */
        send_op(c, &ops[i]);
    free(ops);
    if (c->limits == NULL || c->link != LINK_SHARED)
        return;
    struct atc_limit_refill rf[REFILLS_MAX];
    size_t nr = atc_limits_refills(c->limits, atc_wall_us() / 1000, rf, REFILLS_MAX);
    for (size_t i = 0; i < nr; i++) {
        char key[ATC_LIMITS_TENANT_MAX + 64], amount[24];
        int klen = snprintf(key, sizeof(key), "atc:lim:%s:%c:%" PRIu64, rf[i].tenant,
                            rf[i].kind == ATC_LIMIT_REQUESTS ? 'r' : 't', rf[i].window);
        snprintf(amount, sizeof(amount), "%" PRIu64, rf[i].amount);
        struct pending *p = pending_new(c, R_REFILL);
        if (p == NULL) {
            atc_limits_refilled(c->limits, &rf[i], -1);
            continue;
        }
        p->refill = rf[i];
        const char *incr[] = {"INCRBY", key, amount};
        size_t ilens[] = {6, (size_t)klen, strlen(amount)};
        send_argv(c, p, 3, incr, ilens);
        char ttl[24];
        snprintf(ttl, sizeof(ttl), "%d", LIMIT_KEY_TTL_MS);
        const char *exp[] = {"PEXPIRE", key, ttl};
        size_t elens[] = {7, (size_t)klen, strlen(ttl)};
        send_argv(c, pending_new(c, R_IGNORE), 3, exp, elens);
    }
}

/* Reads the other replicas' fields of atc:load within the bounds above: Redis checks each length
 * (HSTRLEN) before it sends a value, so an oversized one costs neither Redis's output buffers nor this
 * replica's memory. Our own field is not read back. */
static void send_load_read(struct atc_cluster *c)
{
    static const char script[] =
        "local key, vmax, nmax = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]) "
        "local total, self = tonumber(ARGV[3]), ARGV[4] "
        "local n = redis.call('HLEN', key) "
        "if n > nmax then return {n} end "
        "local out, skipped = {0}, 0 "
        "for _, f in ipairs(redis.call('HKEYS', key)) do "
        "  if f ~= self then "
        "    local len = redis.call('HSTRLEN', key, f) "
        "    if #f > 63 or len > vmax or len > total then skipped = skipped + 1 "
        "    else total = total - len; out[#out + 1] = f; out[#out + 1] = redis.call('HGET', key, f) end "
        "  end "
        "end "
        "out[1] = skipped "
        "return out";
    char vmax[24], nmax[24], total[24];
    snprintf(vmax, sizeof(vmax), "%d", ATC_LOAD_SHARE_TEXT_MAX);
    snprintf(nmax, sizeof(nmax), "%d", LOAD_FIELDS_MAX);
    snprintf(total, sizeof(total), "%u", LOAD_READ_MAX);
    struct pending *p = pending_new(c, R_LOAD);
    const char *argv[] = {"EVAL", script, "1", "atc:load", vmax, nmax, total, c->name};
    size_t lens[] = {4, sizeof(script) - 1, 1, 8, strlen(vmax), strlen(nmax), strlen(total), strlen(c->name)};
    if (p != NULL && send_argv(c, p, 8, argv, lens) == 0)
        c->sync_in_flight = true; /* until on_reply, which runs for every command sent */
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    struct atc_cluster *c = arg;
    uint64_t now = atc_mono_ms();
    if (link_up(c->link) && c->outstanding > 0 && now - c->busy_since_ms > c->interval_ms) {
        /* Slow counts as down: a decision must not lean on figures this old. */
        if (c->link == LINK_SHARED)
            go_local(c, LINK_SLOW, "is slow to answer");
        uint64_t hang = c->interval_ms * 20 > HANG_MS_MIN ? c->interval_ms * 20 : HANG_MS_MIN;
        if (now - c->busy_since_ms > hang) {
            redisAsyncContext *ac = c->cmd; /* pending callbacks get NULL: refills are given back */
            c->cmd = NULL;
            link_set(&c->link, LINK_DOWN); /* from LINK_UP or LINK_SLOW: local mode already */
            redisAsyncFree(ac);
            c->outstanding = 0;
            c->sync_in_flight = false;
            if (c->sub != NULL) {
                ac = c->sub;
                c->sub = NULL;
                link_set(&c->sub_link, LINK_DOWN);
                redisAsyncFree(ac);
            }
        }
    }
    if (c->cmd == NULL || c->sub == NULL)
        connect_all(c, now);
    if (link_up(c->link) && !c->sync_in_flight) { /* one round at a time: a slow Redis is not sent more */
        size_t len;
        char *text = atc_load_share_encode(c->table, ++c->seq, atc_mono_us(), &len);
        if (text != NULL) {
            const char *hset[] = {"HSET", "atc:load", c->name, text};
            size_t hlens[] = {4, 8, strlen(c->name), len};
            send_argv(c, pending_new(c, R_IGNORE), 4, hset, hlens);
            free(text);
        }
        send_load_read(c);
    }
    atc_cluster_flush(c);
}

/* ---- what the workers call ---- */

static void on_affinity(void *ctx, enum atc_affinity_event ev, const char *key, size_t keylen, const char *id,
                        uint64_t expires_at_ms)
{
    struct atc_cluster *c = ctx;
    if (keylen > ATC_AFFINITY_KEY_MAX)
        return;
    uint64_t now = atc_mono_ms();
    pthread_mutex_lock(&c->mu);
    if (c->nops == QUEUE_MAX) {
        c->dropped++;
        pthread_mutex_unlock(&c->mu);
        return;
    }
    struct op *o = &c->ops[c->nops++];
    o->kind = ev == ATC_AFFINITY_SET ? OP_SET : ev == ATC_AFFINITY_DEL ? OP_DEL : OP_MISS;
    o->ttl_ms = expires_at_ms > now ? expires_at_ms - now : 1;
    snprintf(o->id, sizeof(o->id), "%s", id != NULL ? id : "");
    memcpy(o->key, key, keylen);
    o->keylen = keylen;
    pthread_mutex_unlock(&c->mu);
    wake_once(c);
}

static void on_limits_low(void *ctx)
{
    wake_once(ctx);
}

/* ---- life ---- */

struct atc_cluster *atc_cluster_create(struct event_base *base, const struct atc_cluster_settings *s,
                                       struct atc_endpoint_table *table, struct atc_affinity *aff,
                                       struct atc_limits *limits, void (*wake)(void *ctx), void *wake_ctx,
                                       const char **err)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(s->host, NULL, &hints, &ai) != 0 || ai == NULL) {
        *err = "cluster.redis: cannot resolve the host";
        return NULL;
    }
    struct atc_cluster *c = calloc(1, sizeof(*c));
    if (c == NULL || (c->ops = calloc(QUEUE_MAX, sizeof(*c->ops))) == NULL) {
        freeaddrinfo(ai);
        free(c);
        *err = "out of memory";
        return NULL;
    }
    const void *addr = ai->ai_family == AF_INET6 ? (const void *)&((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr
                                                 : (const void *)&((struct sockaddr_in *)ai->ai_addr)->sin_addr;
    inet_ntop(ai->ai_family, addr, c->ip, sizeof(c->ip));
    freeaddrinfo(ai);
    c->base = base;
    c->table = table;
    c->aff = aff;
    c->limits = limits;
    c->wake = wake;
    c->wake_ctx = wake_ctx;
    c->port = s->port;
    c->db = s->db;
    c->interval_ms = s->sync_interval_ms;
    snprintf(c->where, sizeof(c->where), "%s:%u/%u", s->host, (unsigned)s->port, s->db);
    snprintf(c->channel, sizeof(c->channel), "atc:pins:%u", s->db);
    if (s->name != NULL) {
        snprintf(c->name, sizeof(c->name), "%s", s->name);
    } else {
        char host[48] = "atc";
        gethostname(host, sizeof(host) - 1);
        snprintf(c->name, sizeof(c->name), "%s:%d", host, (int)getpid());
    }
    pthread_mutex_init(&c->mu, NULL);
    c->link = c->sub_link = LINK_DOWN;
    if ((c->share = atc_load_share_create(c->name)) == NULL ||
        (c->tick = event_new(base, -1, EV_PERSIST, on_tick, c)) == NULL) {
        atc_cluster_destroy(c);
        *err = "out of memory";
        return NULL;
    }
    struct timeval tv = atc_timeval_ms(c->interval_ms);
    event_add(c->tick, &tv);
    if (aff != NULL)
        atc_affinity_observe(aff, on_affinity, c);
    if (limits != NULL)
        atc_limits_on_low(limits, on_limits_low, c);
    connect_all(c, atc_mono_ms());
    atc_info("cluster: replica '%s', Redis at %s, sync every %" PRIu64 "ms", c->name, c->where, c->interval_ms);
    return c;
}

void atc_cluster_destroy(struct atc_cluster *c)
{
    if (c == NULL)
        return;
    if (c->tick != NULL)
        event_free(c->tick);
    if (c->aff != NULL)
        atc_affinity_observe(c->aff, NULL, NULL);
    if (c->limits != NULL)
        atc_limits_on_low(c->limits, NULL, NULL);
    c->limits = NULL; /* pending refills need not be given back */
    redisAsyncContext *ac = c->cmd;
    c->cmd = NULL;
    if (ac != NULL)
        redisAsyncFree(ac);
    ac = c->sub;
    c->sub = NULL;
    if (ac != NULL)
        redisAsyncFree(ac);
    atc_load_share_destroy(c->share);
    pthread_mutex_destroy(&c->mu);
    free(c->ops);
    free(c);
}

void atc_cluster_set_table(struct atc_cluster *c, struct atc_endpoint_table *table)
{
    c->table = table;
}

/* ---- what operators read ---- */

static const char *state_of(const struct atc_cluster *c)
{
    switch (c->link) {
    case LINK_SHARED:
        return "connected";
    case LINK_UP: /* no whole sync in time yet */
    case LINK_SLOW:
        return c->outstanding > 0 ? "slow" : "connecting";
    case LINK_DOWN:
    case LINK_CONNECTING:
        break;
    }
    return "down";
}

struct each_ctx {
    struct evbuffer *out;
    unsigned n;
};

static void replica_json(void *ctx, const char *name, uint64_t age_ms)
{
    struct each_ctx *e = ctx;
    evbuffer_add_printf(e->out, "%s{\"name\": \"", e->n++ ? ", " : "");
    atc_json_escape(e->out, name, strlen(name));
    evbuffer_add_printf(e->out, "\", \"last_sync_ms_ago\": %" PRIu64 "}", age_ms);
}

void atc_cluster_json(struct atc_cluster *c, struct evbuffer *out)
{
    uint64_t now = atc_mono_ms();
    evbuffer_add_printf(out, "{\"name\": \"");
    atc_json_escape(out, c->name, strlen(c->name));
    evbuffer_add_printf(out, "\", \"redis\": \"");
    atc_json_escape(out, c->where, strlen(c->where));
    evbuffer_add_printf(
        out,
        "\", \"state\": \"%s\", \"mode\": \"%s\", \"pins_subscribed\": %s, \"sync_interval_ms\": %" PRIu64,
        state_of(c), c->link == LINK_SHARED ? "shared" : "local",
        c->sub_link == LINK_SHARED ? "true" : "false", c->interval_ms);
    if (c->last_sync_ms > 0)
        evbuffer_add_printf(out, ", \"last_sync_ms_ago\": %" PRIu64, now - c->last_sync_ms);
    else
        evbuffer_add_printf(out, ", \"last_sync_ms_ago\": null");
    evbuffer_add_printf(
        out,
        ", \"syncs_total\": %" PRIu64 ", \"local_mode_total\": %" PRIu64 ", \"pins_sent_total\": %" PRIu64
        ", \"pins_received_total\": %" PRIu64 ", \"pins_fetched_total\": %" PRIu64
        ", \"oversized_total\": %" PRIu64 ", \"last_error\": \"",
        c->syncs, c->local_entries, c->pins_sent, c->pins_received, c->pins_fetched, c->oversized);
    atc_json_escape(out, c->last_error, strlen(c->last_error));
    evbuffer_add_printf(out, "\", \"replicas\": [");
    struct each_ctx e = {.out = out};
    atc_load_share_each(c->share, now, FORGET_MS, replica_json, &e);
    evbuffer_add_printf(out, "]}");
}

void atc_cluster_metrics(struct atc_cluster *c, struct evbuffer *out)
{
    uint64_t now = atc_mono_ms();
    pthread_mutex_lock(&c->mu);
    uint64_t dropped = c->dropped;
    pthread_mutex_unlock(&c->mu);
    evbuffer_add_printf(
        out,
        "# HELP atc_cluster_shared 1 while this replica shares state through Redis, 0 in local mode.\n"
        "# TYPE atc_cluster_shared gauge\natc_cluster_shared %d\n"
        "# HELP atc_cluster_redis_up 1 while the connection to Redis is up.\n"
        "# TYPE atc_cluster_redis_up gauge\natc_cluster_redis_up %d\n"
        "# HELP atc_cluster_replicas Other replicas whose load was summed at the last sync.\n"
        "# TYPE atc_cluster_replicas gauge\natc_cluster_replicas %u\n"
        "# HELP atc_cluster_last_sync_age_seconds Since the last whole sync with Redis (-1: never).\n"
        "# TYPE atc_cluster_last_sync_age_seconds gauge\natc_cluster_last_sync_age_seconds %.3f\n"
        "# HELP atc_cluster_syncs_total Whole syncs with Redis.\n"
        "# TYPE atc_cluster_syncs_total counter\natc_cluster_syncs_total %" PRIu64 "\n"
        "# HELP atc_cluster_local_mode_total Times this replica fell back to local mode.\n"
        "# TYPE atc_cluster_local_mode_total counter\natc_cluster_local_mode_total %" PRIu64 "\n"
        "# HELP atc_cluster_pins_total Session pins written to Redis (sent), learnt from other replicas "
        "(received, fetched), or dropped (queue full).\n# TYPE atc_cluster_pins_total counter\n"
        "atc_cluster_pins_total{op=\"sent\"} %" PRIu64 "\natc_cluster_pins_total{op=\"received\"} %" PRIu64
        "\natc_cluster_pins_total{op=\"fetched\"} %" PRIu64
        "\natc_cluster_pins_total{op=\"dropped\"} %" PRIu64
        "\n# HELP atc_cluster_oversized_total Values in Redis left unread for their size (other replicas' "
        "load over the bound, pins too long to be an id).\n# TYPE atc_cluster_oversized_total counter\n"
        "atc_cluster_oversized_total %" PRIu64 "\n",
        c->link == LINK_SHARED ? 1 : 0, link_up(c->link) ? 1 : 0, c->replicas,
        c->last_sync_ms ? (double)(now - c->last_sync_ms) / 1000.0 : -1.0, c->syncs, c->local_entries,
        c->pins_sent, c->pins_received, c->pins_fetched, dropped, c->oversized);
}
