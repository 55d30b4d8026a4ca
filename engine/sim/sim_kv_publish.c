/* atc sim's KV-cache events over ZMQ, in vLLM's wire format (sim_kv_publish.h). */
#include "sim/sim_kv_publish.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include <msgpack.h>
#include <zmq.h>

#include "base/log.h"

#define KV_PUB_HWM 100000 /* messages libzmq queues per subscriber before it drops (vLLM: 100000) */

struct held_batch {
    int64_t seq;
    void *data;
    size_t len;
};

struct atc_sim_kv_pub {
    struct event_base *base;
    void *ctx, *pub, *router;
    struct event *router_ev; /* the ROUTER's ZMQ_FD */
    struct event *flush_ev;  /* sends the batch at the loop's next turn */
    uint32_t block_size;
    uint64_t drop;
    int64_t next_seq;
    /* the batch being built: events already encoded, and the one still open (consecutive changes of
     * the same kind join one event, as a scheduler step's blocks do) */
    msgpack_sbuffer events;
    size_t nevents;
    enum atc_sim_kv_op open_op;
    uint64_t *open_keys;
    size_t nopen, open_cap;
    bool open;
    struct held_batch ring[ATC_SIM_KV_REPLAY_BATCHES]; /* the last batches, by seq modulo the size */
    uint64_t batches, replays;
    /* --kv-events-hash: each prompt-text block hash's engine-style key (atc_sim_kv_pub_alias), direct
     * mapped by the hash (a later block in the same place replaces it; a block without its key is
     * published under its text hash: a miss for a router, no more). NULL: never aliased. */
    struct {
        uint64_t hash, key;
    } * alias;
};

#define ALIAS_SLOTS (1u << 16)

static void close_event(struct atc_sim_kv_pub *p)
{
    if (!p->open)
        return;
    msgpack_packer pk;
    msgpack_packer_init(&pk, &p->events, msgpack_sbuffer_write);
    if (p->open_op == ATC_SIM_KV_CLEARED) {
        msgpack_pack_array(&pk, 1);
        msgpack_pack_str_with_body(&pk, "AllBlocksCleared", 16);
    } else if (p->open_op == ATC_SIM_KV_STORED) {
        /* block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name */
        msgpack_pack_array(&pk, 8);
        msgpack_pack_str_with_body(&pk, "BlockStored", 11);
        msgpack_pack_array(&pk, (uint32_t)p->nopen);
        for (size_t i = 0; i < p->nopen; i++)
            msgpack_pack_uint64(&pk, p->open_keys[i]);
        msgpack_pack_nil(&pk); /* the parent is not known here (the cache reports blocks one by one) */
        msgpack_pack_array(&pk, 0);
        msgpack_pack_uint32(&pk, p->block_size);
        msgpack_pack_nil(&pk);
        msgpack_pack_str_with_body(&pk, "GPU", 3);
        msgpack_pack_nil(&pk);
    } else {
        msgpack_pack_array(&pk, 3);
        msgpack_pack_str_with_body(&pk, "BlockRemoved", 12);
        msgpack_pack_array(&pk, (uint32_t)p->nopen);
        for (size_t i = 0; i < p->nopen; i++)
            msgpack_pack_uint64(&pk, p->open_keys[i]);
        msgpack_pack_str_with_body(&pk, "GPU", 3);
    }
    p->nevents++;
    p->nopen = 0;
    p->open = false;
}

static void send_frames(void *sock, const void *id, size_t id_len, int64_t seq, const void *data, size_t len)
{
    unsigned char be[8];
    for (int i = 0; i < 8; i++)
        be[i] = (unsigned char)((uint64_t)seq >> (56 - 8 * i));
    if (id != NULL && zmq_send(sock, id, id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
        return;
    /* PUB: the topic; ROUTER: the empty delimiter. Both are empty. */
    if (zmq_send(sock, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(sock, be, sizeof(be), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
        return;
    zmq_send(sock, data, len, ZMQ_DONTWAIT);
}

static void on_flush(evutil_socket_t fd, short what, void *arg)
{
    struct atc_sim_kv_pub *p = arg;
    close_event(p);
    if (p->nevents == 0)
        return;
    struct timeval tv;
    gettimeofday(&tv, NULL);
    msgpack_sbuffer out;
    msgpack_sbuffer_init(&out);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &out, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 3);
    msgpack_pack_double(&pk, (double)tv.tv_sec + (double)tv.tv_usec / 1e6);
    msgpack_pack_array(&pk, (uint32_t)p->nevents);
    msgpack_sbuffer_write(&out, p->events.data, p->events.size);
    msgpack_pack_int64(&pk, 0);
    msgpack_sbuffer_clear(&p->events);
    p->nevents = 0;
    if (out.data == NULL) {
        atc_warn("sim: kv_events: out of memory, a batch is lost");
        return;
    }
    int64_t seq = p->next_seq++;
    if ((uint64_t)seq != p->drop || p->drop == 0)
        send_frames(p->pub, NULL, 0, seq, out.data, out.size);
    struct held_batch *h = &p->ring[(uint64_t)seq % ATC_SIM_KV_REPLAY_BATCHES];
    free(h->data);
    *h = (struct held_batch){.seq = seq, .data = out.data, .len = out.size}; /* takes the bytes */
    p->batches++;
}

static void queue(struct atc_sim_kv_pub *p)
{
    event_active(p->flush_ev, EV_TIMEOUT, 0);
}

void atc_sim_kv_pub_on_kv(void *ctx, enum atc_sim_kv_op op, const uint64_t *hashes, size_t n)
{
    struct atc_sim_kv_pub *p = ctx;
    if (p->open && (p->open_op != op || op == ATC_SIM_KV_CLEARED))
        close_event(p);
    if (p->nopen + n > p->open_cap) {
        size_t cap = p->open_cap ? p->open_cap * 2 : 64;
        while (cap < p->nopen + n)
            cap *= 2;
        uint64_t *k = realloc(p->open_keys, cap * sizeof(*k));
        if (k == NULL) {
            atc_warn("sim: kv_events: out of memory, %zu blocks not published", n);
            return;
        }
        p->open_keys = k;
        p->open_cap = cap;
    }
    for (size_t i = 0; i < n; i++) {
        uint64_t h = hashes[i];
        bool aliased = p->alias != NULL && p->alias[h % ALIAS_SLOTS].hash == h;
        p->open_keys[p->nopen + i] = aliased ? p->alias[h % ALIAS_SLOTS].key : h;
    }
    p->nopen += n;
    p->open_op = op;
    p->open = true;
    queue(p);
}

/* ---- the replay socket ---- */

static void answer_replay(struct atc_sim_kv_pub *p, const zmq_msg_t *id, int64_t start)
{
    int64_t first = p->next_seq - ATC_SIM_KV_REPLAY_BATCHES;
    if (start < first)
        start = first;
    if (start < 0)
        start = 0;
    for (int64_t s = start; s < p->next_seq; s++) {
        const struct held_batch *h = &p->ring[(uint64_t)s % ATC_SIM_KV_REPLAY_BATCHES];
        if (h->data != NULL && h->seq == s)
            send_frames(p->router, zmq_msg_data((zmq_msg_t *)id), zmq_msg_size((zmq_msg_t *)id), s, h->data,
                        h->len);
    }
    send_frames(p->router, zmq_msg_data((zmq_msg_t *)id), zmq_msg_size((zmq_msg_t *)id), -1, "", 0);
    p->replays++;
}

/* ZMQ_FD is edge-triggered: read until ZMQ_EVENTS says nothing more is waiting. */
static void on_router(evutil_socket_t fd, short what, void *arg)
{
    struct atc_sim_kv_pub *p = arg;
    for (;;) {
        int events = 0;
        size_t sz = sizeof(events);
        if (zmq_getsockopt(p->router, ZMQ_EVENTS, &events, &sz) < 0 || !(events & ZMQ_POLLIN))
            return;
        zmq_msg_t parts[4];
        int nparts = 0, more = 1;
        while (more) {
            zmq_msg_t m;
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, p->router, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&m);
                break;
            }
            more = zmq_msg_more(&m);
            if (nparts < 4)
                parts[nparts++] = m;
            else
                zmq_msg_close(&m);
        }
        /* [identity, empty, start_seq as 8 bytes big-endian]; anything else is ignored, as vLLM does */
        if (nparts == 3 && zmq_msg_size(&parts[1]) == 0 && zmq_msg_size(&parts[2]) == 8) {
            const unsigned char *b = zmq_msg_data(&parts[2]);
            uint64_t v = 0;
            for (int i = 0; i < 8; i++)
                v = v << 8 | b[i];
            answer_replay(p, &parts[0], (int64_t)v);
        }
        for (int i = 0; i < nparts; i++)
            zmq_msg_close(&parts[i]);
    }
}

/* ---- life ---- */

static void *bind_socket(struct atc_sim_kv_pub *p, int type, const char *endpoint)
{
    void *s = zmq_socket(p->ctx, type);
    int linger = 0, hwm = KV_PUB_HWM;
    if (s == NULL || zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger)) < 0 ||
        zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof(hwm)) < 0 || zmq_bind(s, endpoint) < 0) {
        if (s)
            zmq_close(s);
        return NULL;
    }
    return s;
}

struct atc_sim_kv_pub *atc_sim_kv_pub_create(struct event_base *base, const char *endpoint,
                                             const char *replay_endpoint, uint32_t block_size, uint64_t drop,
                                             const char **err)
{
    struct atc_sim_kv_pub *p = calloc(1, sizeof(*p));
    *err = "out of memory";
    if (p == NULL)
        return NULL;
    p->base = base;
    p->block_size = block_size;
    p->drop = drop;
    msgpack_sbuffer_init(&p->events);
    if ((p->ctx = zmq_ctx_new()) == NULL || (p->flush_ev = event_new(base, -1, 0, on_flush, p)) == NULL)
        goto error;
    *err = "cannot bind the KV events socket (a ZMQ address such as tcp://127.0.0.1:5557)";
    if ((p->pub = bind_socket(p, ZMQ_PUB, endpoint)) == NULL)
        goto error;
    if (replay_endpoint != NULL) {
        *err = "cannot bind the KV events replay socket (a ZMQ address such as tcp://127.0.0.1:5558)";
        if ((p->router = bind_socket(p, ZMQ_ROUTER, replay_endpoint)) == NULL)
            goto error;
        int fd;
        size_t sz = sizeof(fd);
        *err = "out of memory";
        if (zmq_getsockopt(p->router, ZMQ_FD, &fd, &sz) < 0 ||
            (p->router_ev = event_new(base, fd, EV_READ | EV_PERSIST, on_router, p)) == NULL ||
            event_add(p->router_ev, NULL) < 0)
            goto error;
    }
    atc_sim_kv_pub_on_kv(p, ATC_SIM_KV_CLEARED, NULL, 0); /* seq 0: this server starts empty */
    *err = NULL;
    return p;
error:
    atc_sim_kv_pub_destroy(p);
    return NULL;
}

void atc_sim_kv_pub_destroy(struct atc_sim_kv_pub *p)
{
    if (p == NULL)
        return;
    free(p->alias);
    if (p->router_ev)
        event_free(p->router_ev);
    if (p->flush_ev)
        event_free(p->flush_ev);
    if (p->router)
        zmq_close(p->router);
    if (p->pub)
        zmq_close(p->pub);
    if (p->ctx)
        zmq_ctx_term(p->ctx);
    for (size_t i = 0; i < ATC_SIM_KV_REPLAY_BATCHES; i++)
        free(p->ring[i].data);
    msgpack_sbuffer_destroy(&p->events);
    free(p->open_keys);
    free(p);
}

int atc_sim_kv_pub_endpoint(const struct atc_sim_kv_pub *p, int replay, char *out, size_t len)
{
    void *s = replay ? p->router : p->pub;
    size_t sz = len;
    if (s == NULL || zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, out, &sz) < 0)
        return -1;
    return 0;
}

uint64_t atc_sim_kv_pub_batches(const struct atc_sim_kv_pub *p)
{
    return p->batches;
}

uint64_t atc_sim_kv_pub_replays(const struct atc_sim_kv_pub *p)
{
    return p->replays;
}

void atc_sim_kv_pub_alias(struct atc_sim_kv_pub *p, const uint64_t *hashes, const uint64_t *keys, size_t n)
{
    if (p->alias == NULL && (p->alias = calloc(ALIAS_SLOTS, sizeof *p->alias)) == NULL)
        return; /* published under the text hashes: misses, not errors */
    for (size_t i = 0; i < n; i++) {
        p->alias[hashes[i] % ALIAS_SLOTS].hash = hashes[i];
        p->alias[hashes[i] % ALIAS_SLOTS].key = keys[i];
    }
}
