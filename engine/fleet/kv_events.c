/* The engines' KV-cache events over ZMQ into the exact index (kv_events.h). */

#include "fleet/kv_events.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#include "base/clock.h"
#include "base/json.h"
#include "base/log.h"
#include "fleet/kv_event_decode.h"

#define KV_BURST 256              /* messages read per wakeup before the loop runs again */
#define KV_HWM 10000              /* messages libzmq queues per socket, then drops (a gap follows) */
#define KV_MAX_MESSAGE (16 << 20) /* bytes: a larger message is refused by libzmq */
#define KV_PENDING_MAX 4096       /* live batches held while a replay runs */
#define KV_REPLAY_TIMEOUT_MS 2000 /* a replay socket silent this long has failed */

enum problem { P_DECODE, P_FRAMES, P_GAP, P_RESTART, P_REPLAY_FAILED, P_OVERFLOW, P_UNKNOWN, P_COUNT };

struct pending {
    int64_t seq;
    void *data;
    size_t len;
};

struct sub {
    struct atc_kv_events *set;
    unsigned slot;
    char *id, *endpoint, *replay_endpoint;
    void *sock;            /* SUB */
    struct event *ev;      /* its ZMQ_FD */
    void *dealer;          /* replay requests; NULL until the first gap and after a replay times out */
    struct event *dev;     /* its ZMQ_FD */
    struct event *timeout; /* the replay's deadline */
    bool replaying, have_seq;
    int64_t last_seq;        /* the last batch applied (have_seq) */
    struct pending *pending; /* live batches that came during a replay, in order */
    size_t npending;
    bool logged[P_COUNT];
    /* counters */
    uint64_t batches, stored, removed, cleared, gaps, replays, replayed, replay_failures, decode_errors,
        unknown_events, restarts, dropped;
    double lag_ms; /* wall clock at the last batch applied minus its ts; 0 before one */
    struct atc_kv_tokenize tokenize; /* kv_events.tokenize's settings (has_tokenize) */
    bool has_tokenize;
};

struct atc_kv_events {
    struct event_base *base;
    void *ctx;
    struct atc_kv_index *index;
    struct sub *subs;
    unsigned nsubs;
    struct atc_kv_token_cache *tokens; /* the /tokenize step's cache and counters (its own lock) */
};

static void note(struct sub *s, enum problem p, const char *fmt, const char *detail)
{
    if (s->logged[p])
        return;
    s->logged[p] = true;
    atc_warn("kv_events %s (%s): %s%s%s (logged once; counted in /admin/endpoints)", s->id, s->endpoint, fmt,
             detail ? ": " : "", detail ? detail : "");
}

/* ---- applying batches ---- */

static void clear_entries(struct sub *s)
{
    atc_kv_index_clear(s->set->index, s->slot);
    s->cleared++;
}

static void apply(struct sub *s, int64_t seq, const void *data, size_t len)
{
    struct atc_kv_batch b;
    const char *err;
    s->have_seq = true;
    s->last_seq = seq;
    if (atc_kv_batch_decode(data, len, &b, &err) < 0) {
        s->decode_errors++;
        note(s, P_DECODE, "a batch did not decode", err);
        return;
    }
    s->batches++;
    s->lag_ms = (atc_wall_s() - b.ts) * 1000.0;
    for (size_t i = 0; i < b.nevents; i++) {
        const struct atc_kv_event *e = &b.events[i];
        switch (e->type) {
        case ATC_KV_STORED:
            for (size_t k = 0; k < e->nkeys; k++)
                s->stored += atc_kv_index_store(s->set->index, s->slot, e->keys[k], e->tier) == 1;
            break;
        case ATC_KV_REMOVED:
            for (size_t k = 0; k < e->nkeys; k++)
                s->removed += (uint64_t)atc_kv_index_remove(s->set->index, s->slot, e->keys[k], e->tier);
            break;
        case ATC_KV_CLEARED:
            clear_entries(s);
            break;
        case ATC_KV_UNKNOWN:
            s->unknown_events++;
            note(s, P_UNKNOWN, "an event of an unknown type was skipped", NULL);
            break;
        }
    }
    atc_kv_batch_dispose(&b);
}

static void start_replay(struct sub *s, int64_t from);

/* A batch from the live socket. */
static void on_live(struct sub *s, int64_t seq, const void *data, size_t len)
{
    if (s->replaying) {
        if (s->npending == KV_PENDING_MAX) {
            s->dropped++; /* the replay's end finds the gap and clears */
            note(s, P_OVERFLOW, "live batches dropped while a replay ran", NULL);
            return;
        }
        void *copy = malloc(len ? len : 1);
        if (!copy) {
            s->dropped++;
            return;
        }
        memcpy(copy, data, len);
        s->pending[s->npending++] = (struct pending){.seq = seq, .data = copy, .len = len};
        return;
    }
    if (s->have_seq && seq <= s->last_seq) {
        s->restarts++;
        note(s, P_RESTART, "the sequence went back (an engine restart): its entries are cleared", NULL);
        clear_entries(s);
    } else if (s->have_seq && seq > s->last_seq + 1) {
        s->gaps++;
        if (s->replay_endpoint) {
            start_replay(s, s->last_seq + 1);
            on_live(s, seq, data, len); /* held until the replay ends */
            return;
        }
        note(s, P_GAP, "a sequence gap with no replay_endpoint: its entries are cleared", NULL);
        clear_entries(s);
    }
    apply(s, seq, data, len);
}

/* ---- the replay socket ---- */

static void close_dealer(struct sub *s)
{
    if (s->dev) {
        event_free(s->dev);
        s->dev = NULL;
    }
    if (s->dealer) {
        zmq_close(s->dealer);
        s->dealer = NULL;
    }
}

static void end_replay(struct sub *s, bool ok)
{
    evtimer_del(s->timeout);
    s->replaying = false;
    size_t first = 0; /* the first live batch the replay did not cover */
    while (first < s->npending && s->have_seq && s->pending[first].seq <= s->last_seq)
        first++;
    if (!ok || (s->have_seq && first < s->npending && s->pending[first].seq > s->last_seq + 1)) {
        s->replay_failures++;
        note(s, P_REPLAY_FAILED,
             ok ? "the replay no longer had the missing batches: entries cleared"
                : "the replay socket did not answer in time: entries cleared",
             NULL);
        clear_entries(s);
        s->have_seq = false; /* the next batch starts afresh */
    }
    if (!ok)
        close_dealer(s); /* a late answer must not be read as the next replay's */
    /* The held batches go through on_live again, which may start another replay and hold some anew. */
    struct pending *held = s->pending;
    size_t n = s->npending;
    s->npending = 0;
    if (!(s->pending = malloc(KV_PENDING_MAX * sizeof *s->pending))) {
        s->pending = held;
        for (size_t i = 0; i < n; i++)
            free(held[i].data);
        s->dropped += n;
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (s->replaying || !s->have_seq || held[i].seq > s->last_seq)
            on_live(s, held[i].seq, held[i].data, held[i].len);
        free(held[i].data);
    }
    free(held);
}

static void on_replay_timeout(evutil_socket_t fd, short what, void *arg)
{
    end_replay(arg, false);
}

static int64_t be64(const void *p)
{
    const uint8_t *b = p;
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | b[i];
    return (int64_t)v;
}

/* Reads one multipart message of at most @p max frames into @p frames (initialised here; the caller
 * closes [0, *n)). 1: read, 0: none waiting, -1: error. Frames past @p max are read and dropped. */
static int read_message(void *sock, zmq_msg_t *frames, size_t max, size_t *n)
{
    *n = 0;
    for (;;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            return *n == 0 && errno == EAGAIN ? 0 : -1;
        }
        bool more = zmq_msg_more(&m);
        if (*n < max)
            frames[(*n)++] = m;
        else {
            zmq_msg_close(&m);
            (*n)++;
            if (*n == SIZE_MAX)
                *n = max + 1;
        }
        if (!more)
            return 1;
    }
}

static bool readable(void *sock)
{
    int events = 0;
    size_t size = sizeof events;
    return sock && zmq_getsockopt(sock, ZMQ_EVENTS, &events, &size) == 0 && (events & ZMQ_POLLIN);
}

static void on_dealer(evutil_socket_t fd, short what, void *arg)
{
    struct sub *s = arg;
    /* ZMQ_FD is edge-triggered: read until ZMQ_EVENTS says nothing is left, or hand back to the loop. */
    for (int burst = 0; s->dealer && readable(s->dealer); burst++) {
        if (burst == KV_BURST) {
            event_active(s->dev, EV_READ, 0);
            return;
        }
        zmq_msg_t f[3];
        size_t n;
        int rc = read_message(s->dealer, f, 3, &n);
        if (rc <= 0)
            break;
        size_t got = n < 3 ? n : 3;
        bool ok = n == 3 && zmq_msg_size(&f[0]) == 0 && zmq_msg_size(&f[1]) == 8;
        int64_t seq = ok ? be64(zmq_msg_data(&f[1])) : 0;
        if (ok && s->replaying && seq == -1) {
            for (size_t i = 0; i < got; i++)
                zmq_msg_close(&f[i]);
            end_replay(s, true);
            continue;
        }
        if (!ok) {
            s->decode_errors++;
            note(s, P_FRAMES, "a replay message was not [empty, seq, payload]", NULL);
        } else if (s->replaying && seq > s->last_seq) {
            if (seq == s->last_seq + 1) {
                s->replayed++;
                apply(s, seq, zmq_msg_data(&f[2]), zmq_msg_size(&f[2]));
            } /* else: the buffer no longer holds the gap; the end marker finds it */
        }
        for (size_t i = 0; i < got; i++)
            zmq_msg_close(&f[i]);
    }
}

static void start_replay(struct sub *s, int64_t from)
{
    s->replays++;
    if (!s->dealer) {
        int linger = 0, hwm = KV_HWM;
        int64_t max = KV_MAX_MESSAGE;
        evutil_socket_t fd;
        size_t size = sizeof fd;
        if (!(s->dealer = zmq_socket(s->set->ctx, ZMQ_DEALER)) ||
            zmq_setsockopt(s->dealer, ZMQ_LINGER, &linger, sizeof linger) < 0 ||
            zmq_setsockopt(s->dealer, ZMQ_RCVHWM, &hwm, sizeof hwm) < 0 ||
            zmq_setsockopt(s->dealer, ZMQ_MAXMSGSIZE, &max, sizeof max) < 0 ||
            zmq_connect(s->dealer, s->replay_endpoint) < 0 ||
            zmq_getsockopt(s->dealer, ZMQ_FD, &fd, &size) < 0 ||
            !(s->dev = event_new(s->set->base, fd, EV_READ | EV_PERSIST, on_dealer, s)) ||
            event_add(s->dev, NULL) < 0) {
            note(s, P_REPLAY_FAILED, "the replay socket cannot be opened", zmq_strerror(errno));
            close_dealer(s);
            s->replaying = true; /* ended at once, as failed */
            end_replay(s, false);
            return;
        }
    }
    uint8_t start[8];
    for (int i = 0; i < 8; i++)
        start[i] = (uint8_t)((uint64_t)from >> (56 - 8 * i));
    s->replaying = true;
    struct timeval tv = {KV_REPLAY_TIMEOUT_MS / 1000, (KV_REPLAY_TIMEOUT_MS % 1000) * 1000};
    evtimer_add(s->timeout, &tv);
    if (zmq_send(s->dealer, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(s->dealer, start, 8, ZMQ_DONTWAIT) < 0)
        note(s, P_REPLAY_FAILED, "a replay request could not be sent", zmq_strerror(errno));
    event_active(s->dev, EV_READ, 0); /* a send may change ZMQ_EVENTS without an edge on the fd */
}

/* ---- the live socket ---- */

static void on_sub(evutil_socket_t fd, short what, void *arg)
{
    struct sub *s = arg;
    for (int burst = 0; readable(s->sock); burst++) {
        if (burst == KV_BURST) { /* a flood: let the loop run, then go on */
            event_active(s->ev, EV_READ, 0);
            return;
        }
        zmq_msg_t f[3];
        size_t n;
        if (read_message(s->sock, f, 3, &n) <= 0)
            break;
        size_t got = n < 3 ? n : 3;
        if (n != 3 || zmq_msg_size(&f[1]) != 8) {
            s->decode_errors++;
            note(s, P_FRAMES, "a message was not [topic, 8-byte seq, payload]", NULL);
        } else {
            on_live(s, be64(zmq_msg_data(&f[1])), zmq_msg_data(&f[2]), zmq_msg_size(&f[2]));
        }
        for (size_t i = 0; i < got; i++)
            zmq_msg_close(&f[i]);
    }
}

/* ---- the set ---- */

static int start_sub(struct atc_kv_events *kv, struct sub *s, const struct atc_endpoint_config *ec,
                     char **err)
{
    const struct atc_kv_events_config *c = &ec->kv_events;
    int hwm = KV_HWM;
    int64_t max = KV_MAX_MESSAGE;
    const char *topic = c->topic ? c->topic : "";
    evutil_socket_t fd;
    size_t size = sizeof fd;
    s->set = kv;
    s->has_tokenize = c->tokenize && atc_kv_keyer_init(&s->tokenize.keyer, c->hash, c->block_size, c->seed) == 0;
    s->tokenize.timeout_ms = c->tokenize_timeout_ms;
    s->tokenize.min_bytes = c->tokenize_min_bytes;
    if (!(s->id = strdup(ec->id)) || !(s->endpoint = strdup(c->endpoint)) ||
        (c->replay_endpoint && !(s->replay_endpoint = strdup(c->replay_endpoint))) ||
        !(s->pending = malloc(KV_PENDING_MAX * sizeof *s->pending)) ||
        !(s->timeout = evtimer_new(kv->base, on_replay_timeout, s)))
        goto oom;
    if (!(s->sock = zmq_socket(kv->ctx, ZMQ_SUB)) ||
        zmq_setsockopt(s->sock, ZMQ_RCVHWM, &hwm, sizeof hwm) < 0 ||
        zmq_setsockopt(s->sock, ZMQ_MAXMSGSIZE, &max, sizeof max) < 0 ||
        zmq_setsockopt(s->sock, ZMQ_SUBSCRIBE, topic, strlen(topic)) < 0 ||
        zmq_connect(s->sock, c->endpoint) < 0) {
        if (asprintf(err, "endpoint '%s': kv_events.endpoint '%s': %s", ec->id, c->endpoint,
                     zmq_strerror(errno)) < 0)
            *err = NULL;
        return -1;
    }
    if (zmq_getsockopt(s->sock, ZMQ_FD, &fd, &size) < 0 ||
        !(s->ev = event_new(kv->base, fd, EV_READ | EV_PERSIST, on_sub, s)) || event_add(s->ev, NULL) < 0)
        goto oom;
    event_active(s->ev, EV_READ, 0);
    return 0;
oom:
    *err = NULL;
    return -1;
}

struct atc_kv_events *atc_kv_events_create(struct event_base *base, const struct atc_config *cfg, char **err)
{
    *err = NULL;
    unsigned n = 0;
    for (size_t i = 0; i < cfg->nmodels; i++)
        for (size_t j = 0; j < cfg->models[i].nendpoints; j++)
            n += cfg->models[i].endpoints[j].kv_events.endpoint != NULL;
    if (n == 0)
        return NULL;
    if (n > ATC_KV_INDEX_MAX_ENDPOINTS) {
        if (asprintf(err, "kv_events: %u endpoints publish events; at most %d can", n,
                     ATC_KV_INDEX_MAX_ENDPOINTS) < 0)
            *err = NULL;
        return NULL;
    }
    struct atc_kv_events *kv = calloc(1, sizeof *kv);
    size_t caps[ATC_KV_INDEX_MAX_ENDPOINTS];
    if (!kv || !(kv->subs = calloc(n, sizeof *kv->subs)) || !(kv->ctx = zmq_ctx_new()))
        goto error;
    kv->base = base;
    for (size_t i = 0; i < cfg->nmodels; i++)
        for (size_t j = 0; j < cfg->models[i].nendpoints; j++)
            if (cfg->models[i].endpoints[j].kv_events.endpoint)
                caps[kv->nsubs++] = (size_t)cfg->models[i].endpoints[j].kv_events.max_blocks;
    if (!(kv->index = atc_kv_index_create(caps, n)) || !(kv->tokens = atc_kv_token_cache_create()))
        goto error;
    unsigned k = 0;
    for (size_t i = 0; i < cfg->nmodels; i++)
        for (size_t j = 0; j < cfg->models[i].nendpoints; j++) {
            const struct atc_endpoint_config *ec = &cfg->models[i].endpoints[j];
            if (!ec->kv_events.endpoint)
                continue;
            kv->subs[k].slot = k;
            if (start_sub(kv, &kv->subs[k], ec, err) < 0)
                goto error;
            atc_info("kv_events %s: subscribed to %s%s%s", ec->id, ec->kv_events.endpoint,
                     ec->kv_events.replay_endpoint ? ", replay " : "",
                     ec->kv_events.replay_endpoint ? ec->kv_events.replay_endpoint : "");
            k++;
        }
    return kv;
error:
    atc_kv_events_destroy(kv);
    return NULL;
}

void atc_kv_events_destroy(struct atc_kv_events *kv)
{
    if (!kv)
        return;
    atc_kv_token_cache_destroy(kv->tokens);
    for (unsigned i = 0; i < kv->nsubs && kv->subs; i++) {
        struct sub *s = &kv->subs[i];
        close_dealer(s);
        if (s->ev)
            event_free(s->ev);
        if (s->sock)
            zmq_close(s->sock);
        if (s->timeout)
            event_free(s->timeout);
        for (size_t p = 0; p < s->npending; p++)
            free(s->pending[p].data);
        free(s->pending);
        free(s->id);
        free(s->endpoint);
        free(s->replay_endpoint);
    }
    /* every socket was closed with linger 0 or never sent: zmq_ctx_term does not wait */
    if (kv->ctx)
        zmq_ctx_term(kv->ctx);
    atc_kv_index_destroy(kv->index);
    free(kv->subs);
    free(kv);
}

const struct atc_kv_index *atc_kv_events_index(const struct atc_kv_events *kv)
{
    return kv ? kv->index : NULL;
}

static const struct sub *find_sub(const struct atc_kv_events *kv, const char *id)
{
    for (unsigned i = 0; kv && i < kv->nsubs; i++)
        if (kv->subs[i].id && strcmp(kv->subs[i].id, id) == 0)
            return &kv->subs[i];
    return NULL;
}

int atc_kv_events_slot(const struct atc_kv_events *kv, const char *id)
{
    const struct sub *s = find_sub(kv, id);
    return s ? (int)s->slot : -1;
}

void atc_kv_events_endpoint_json(const struct atc_kv_events *kv, const char *id, struct evbuffer *out)
{
    const struct sub *s = find_sub(kv, id);
    if (!s)
        return;
    evbuffer_add_printf(out, ",\"kv_events\":{");
    atc_json_key_string(out, "endpoint", s->endpoint);
    evbuffer_add_printf(
        out,
        ",\"blocks_gpu\":%zu,\"blocks_cpu\":%zu,\"batches\":%llu,\"blocks_stored\":%llu,"
        "\"blocks_removed\":%llu,\"blocks_evicted\":%llu,\"cleared\":%llu,\"gaps\":%llu,\"replays\":%llu,"
        "\"replayed_batches\":%llu,\"replay_failures\":%llu,\"decode_errors\":%llu,\"unknown_events\":%llu,"
        "\"restarts\":%llu,\"dropped\":%llu,\"replaying\":%s,\"last_seq\":",
        atc_kv_index_blocks(kv->index, s->slot, ATC_KV_GPU),
        atc_kv_index_blocks(kv->index, s->slot, ATC_KV_CPU), (unsigned long long)s->batches,
        (unsigned long long)s->stored, (unsigned long long)s->removed,
        (unsigned long long)atc_kv_index_evicted(kv->index, s->slot), (unsigned long long)s->cleared,
        (unsigned long long)s->gaps, (unsigned long long)s->replays, (unsigned long long)s->replayed,
        (unsigned long long)s->replay_failures, (unsigned long long)s->decode_errors,
        (unsigned long long)s->unknown_events, (unsigned long long)s->restarts,
        (unsigned long long)s->dropped, s->replaying ? "true" : "false");
    if (s->have_seq)
        evbuffer_add_printf(out, "%lld", (long long)s->last_seq);
    else
        evbuffer_add_printf(out, "null");
    if (s->batches > 0)
        evbuffer_add_printf(out, ",\"lag_ms\":%.3f}", s->lag_ms);
    else
        evbuffer_add_printf(out, ",\"lag_ms\":null}");
}

void atc_kv_events_metrics(const struct atc_kv_events *kv, struct evbuffer *out)
{
    if (!kv)
        return;
    atc_kv_token_cache_metrics(kv->tokens, out);
    static const struct {
        const char *name, *help;
        size_t off;
    } counters[] = {
        {"batches", "event batches applied", offsetof(struct sub, batches)},
        {"blocks_stored", "blocks newly held, from BlockStored events", offsetof(struct sub, stored)},
        {"blocks_removed", "blocks let go, from BlockRemoved events", offsetof(struct sub, removed)},
        {"cleared", "times the endpoint's entries were all cleared", offsetof(struct sub, cleared)},
        {"gaps", "sequence gaps seen", offsetof(struct sub, gaps)},
        {"replays", "replay requests sent", offsetof(struct sub, replays)},
        {"replayed_batches", "batches applied from the replay socket", offsetof(struct sub, replayed)},
        {"replay_failures", "gaps the replay could not fill", offsetof(struct sub, replay_failures)},
        {"decode_errors", "messages or payloads that did not decode", offsetof(struct sub, decode_errors)},
        {"unknown_events", "events of an unknown type skipped", offsetof(struct sub, unknown_events)},
        {"restarts", "sequence numbers that went back (engine restarts)", offsetof(struct sub, restarts)},
    };
    for (size_t c = 0; c < sizeof counters / sizeof counters[0]; c++) {
        evbuffer_add_printf(out, "# HELP atc_kv_events_%s_total %s\n# TYPE atc_kv_events_%s_total counter\n",
                            counters[c].name, counters[c].help, counters[c].name);
        for (unsigned i = 0; i < kv->nsubs; i++) {
            const struct sub *s = &kv->subs[i];
            uint64_t v;
            memcpy(&v, (const char *)s + counters[c].off, sizeof v);
            evbuffer_add_printf(out, "atc_kv_events_%s_total{endpoint=\"", counters[c].name);
            atc_json_escape(out, s->id, strlen(s->id)); /* ids are plain names; escaped all the same */
            evbuffer_add_printf(out, "\"} %llu\n", (unsigned long long)v);
        }
    }
    evbuffer_add_printf(out, "# HELP atc_kv_events_blocks blocks held by the exact index\n"
                             "# TYPE atc_kv_events_blocks gauge\n");
    for (unsigned i = 0; i < kv->nsubs; i++)
        for (int t = 0; t < 2; t++) {
            evbuffer_add_printf(out, "atc_kv_events_blocks{endpoint=\"");
            atc_json_escape(out, kv->subs[i].id, strlen(kv->subs[i].id));
            evbuffer_add_printf(out, "\",tier=\"%s\"} %zu\n", t ? "cpu" : "gpu",
                                atc_kv_index_blocks(kv->index, kv->subs[i].slot, (enum atc_kv_tier)t));
        }
    evbuffer_add_printf(out, "# HELP atc_kv_events_last_seq the last sequence number applied\n"
                             "# TYPE atc_kv_events_last_seq gauge\n"
                             "# HELP atc_kv_events_lag_seconds wall clock at the last batch minus its ts\n"
                             "# TYPE atc_kv_events_lag_seconds gauge\n");
    for (unsigned i = 0; i < kv->nsubs; i++) {
        const struct sub *s = &kv->subs[i];
        evbuffer_add_printf(out, "atc_kv_events_last_seq{endpoint=\"");
        atc_json_escape(out, s->id, strlen(s->id));
        evbuffer_add_printf(out, "\"} %lld\natc_kv_events_lag_seconds{endpoint=\"",
                            s->have_seq ? (long long)s->last_seq : -1LL);
        atc_json_escape(out, s->id, strlen(s->id));
        evbuffer_add_printf(out, "\"} %.6f\n", s->lag_ms / 1000.0);
    }
}

const struct atc_kv_tokenize *atc_kv_events_tokenize(const struct atc_kv_events *kv, unsigned slot)
{
    return slot < kv->nsubs && kv->subs[slot].has_tokenize ? &kv->subs[slot].tokenize : NULL;
}

struct atc_kv_token_cache *atc_kv_events_token_cache(const struct atc_kv_events *kv)
{
    return kv->tokens;
}
