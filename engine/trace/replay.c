/* Replay in virtual time (replay.h): the event loop, the simulated fleet, the policy's decisions and
 * what they cost; `atc replay` is in replay_cli.c, reports in replay_report.c, wall-time replay in
 * replay_live.c. */

#include "trace/replay.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fleet/affinity.h"
#include "fleet/balancer.h"
#include "config/config.h"
#include "config/config_endpoint.h"
#include "fleet/endpoint.h"
#include "fleet/kv_index.h"
#include "base/log.h"
#include "config/roles.h"
#include "sim/sim.h"
#include "sim/sim_disagg.h"
#include "trace/replay_oracle.h"
#include "trace/trace.h"
#include "trace/trace_import.h"
#include "base/clock.h"

#define DEFAULT_SAMPLES 240
/* A decision is stopped only at this many times its budget (and at least KILL_MIN_US): on a busy
 * machine a decision can be descheduled past its budget, and a replay's decisions must not depend on
 * the machine. Overruns are counted on the decision's own CPU time instead (the stop is wall-clock). */
#define KILL_FACTOR 100
#define KILL_MIN_US 100000

/* RS_PREFILL: a disaggregated model's request on its prefill server (its decode server's slot held) */
enum req_state { RS_PENDING, RS_QUEUED, RS_PREFILL, RS_RUNNING, RS_DONE, RS_REJECTED };

struct rp_req {
    uint64_t queued_at;
    uint64_t tokens;                    /* counted in its endpoint's inflight_tokens while running */
    struct atc_signal_ticket sig, psig; /* psig: on its prefill server */
    int ep;
    int prefill_ep; /* a disaggregated model's prefill server while RS_PREFILL */
    uint8_t state;
    bool around; /* sent around atc (o->around): atc's counts and signals never saw it */
    unsigned decisions;
};

/* A server's next event, kept with its index so that a sift reads only the heap's own array. */
struct heap_entry {
    uint64_t key; /* its model's next event (atc_sim_next_event_us) */
    size_t ep;
};

struct rp_endpoint {
    struct replay *rp;
    struct atc_endpoint *ep;
    struct atc_sim *sim;
    uint64_t requests;
    uint64_t tokens; /* prompt + output tokens of the requests sent to it */
    bool counted;    /* its model is one the trace asks for: it counts in the imbalance figures */
    uint64_t scraped_queries, scraped_hits; /* its prefix cache counters at the previous scrape */
    int kv_slot;      /* its endpoint number in rp->kv: it publishes KV events; -1: it does not */
    unsigned kv_caps; /* its KV blocks, the index's cap for it */
    struct atc_sim_params transfer; /* a decode server's KV transfer knobs (atc_sim_transfer_us) */
    struct atc_window window;       /* from: / until: (0: from the start / to the end) */
    uint64_t inflight_at_leave;     /* its requests in flight as it left (they finished there) */
};

struct outage_event {
    uint64_t at_us;
    unsigned ep;
    bool routable;
    bool restart; /* an engine restart (o->restarts), not a change of routable */
    int member;   /* +1: it joins the fleet (from:), -1: it leaves (until:); 0: neither */
};

struct replay {
    const struct atc_trace *trace;
    size_t n;
    const struct atc_replay_options *o;
    struct atc_replay_result *res;
    struct atc_endpoint_table *table; /* the fleet now: `all`, or those of it in their window (`in`) */
    struct atc_endpoint_table *all;   /* every server, each in its slot (owns the endpoints) */
    bool *in;                         /* by slot: in the fleet now (NULL: every server always is) */
    struct rp_endpoint *eps;
    size_t neps;
    struct heap_entry *heap; /* a binary min-heap of the servers on their next event */
    size_t *heap_pos;        /* server k's place in the heap */
    struct atc_policy_runtime *rt;
    bool oracle;        /* the oracle decides (ATC_REPLAY_ORACLE), not a policy */
    uint64_t budget_ns; /* CPU time a decision may use before it counts as an overrun */
    struct atc_affinity *affinity;
    struct atc_prefix_index *prefix;
    struct atc_kv_index *kv; /* the exact index, fed by the servers that publish KV events; NULL: none */
    uint64_t now;
    uint64_t rng;
    struct rp_req *reqs;
    size_t *queue; /* FIFO of record indices: a ring of n slots */
    size_t qhead, qlen;
    double *waits; /* ms each request that left the queue for an endpoint waited in it */
    size_t nwaits;
    bool drain; /* something finished or came back: try the queue */
    struct outage_event *outages;
    size_t noutages, next_outage;
    uint64_t last_completion;
    uint64_t seed_around; /* goes_around's and dispatch_around's draws */

    struct atc_features f;
    struct atc_features released; /* a finished request's blocks, for the prefix index */
    struct atc_route_request rreq;
    char id[40];

    size_t samples_cap;
    double imbalance_sum;
    size_t imbalance_n;
};

static double virtual_now_ms(void *ctx)
{
    const struct replay *rp = ctx;
    return (double)rp->now / 1000.0;
}

/* ---- the fleet ---- */

static int add_server(struct replay *rp, struct atc_endpoint *ep, const struct atc_sim_params *params,
                      uint64_t seed);

static void on_token(void *ctx, const struct atc_sim_token *tok);

/* The endpoint table of @p cfg plus its simulated servers, each endpoint with its model. */
static int build_fleet(struct replay *rp, const struct atc_config *cfg, char **err)
{
    rp->all = rp->table = atc_endpoint_table_create(cfg);
    if (rp->table == NULL)
        goto oom;
    size_t total = rp->table->nendpoints;
    for (size_t i = 0; i < cfg->nsimulate; i++)
        total += cfg->simulate[i].count;
    if (total == 0) {
        *err = strdup("the fleet has no endpoints");
        return -1;
    }
    if ((rp->eps = calloc(total, sizeof(*rp->eps))) == NULL ||
        (rp->heap = calloc(total, sizeof(*rp->heap))) == NULL ||
        (rp->heap_pos = calloc(total, sizeof(*rp->heap_pos))) == NULL)
        goto oom;
    uint64_t seed = rp->o->seed ? rp->o->seed : 1;
    /* Endpoints of real servers are simulated with the default server model. */
    size_t configured = rp->table->nendpoints;
    for (size_t i = 0; i < configured; i++) {
        struct atc_sim_params p;
        atc_sim_params_init(&p);
        int rc = add_server(rp, rp->table->endpoints[i], &p, seed * 1000003u + i);
        atc_sim_params_dispose(&p);
        if (rc < 0)
            goto oom;
        const struct atc_endpoint_config *ec = atc_config_endpoint(cfg, rp->table->endpoints[i]->id, NULL);
        rp->eps[rp->neps - 1].window = ec != NULL ? ec->window : (struct atc_window){0};
    }
    for (size_t i = 0; i < cfg->nsimulate; i++) {
        const struct atc_simulate_config *sc = &cfg->simulate[i];
        for (unsigned k = 0; k < sc->count; k++) {
            char id[300];
            struct atc_model *m =
                atc_endpoint_table_model(rp->table, sc->params.model, strlen(sc->params.model));
            snprintf(id, sizeof(id), "%s-sim-%zu", sc->params.model, m != NULL ? m->nendpoints + 1 : 1);
            struct atc_endpoint *ep =
                atc_endpoint_table_add(rp->table, sc->params.model, id, "127.0.0.1", 0,
                                       sc->capacity ? sc->capacity : sc->params.max_seqs);
            if (ep == NULL || add_server(rp, ep, &sc->params,
                                         (sc->params.seed + rp->neps) ^ (seed * 0x9E3779B97F4A7C15ull)) < 0)
                goto oom;
            rp->eps[rp->neps - 1].window = sc->window;
        }
    }
    return 0;
oom:
    *err = strdup("out of memory building the fleet");
    return -1;
}

static int add_server(struct replay *rp, struct atc_endpoint *ep, const struct atc_sim_params *params,
                      uint64_t seed)
{
    struct rp_endpoint *e = &rp->eps[rp->neps];
    struct atc_sim_params p = *params;
    p.seed = seed;
    e->rp = rp;
    e->ep = ep;
    e->sim = atc_sim_create(&p, on_token, e);
    if (e->sim == NULL)
        return -1;
    /* simulate: kv_events: it publishes (build_kv feeds its events to the exact index) */
    e->kv_slot = params->kv_events != NULL ? 0 : -1;
    e->kv_caps = params->kv_blocks ? params->kv_blocks : ATC_SIM_DEFAULT_KV_BLOCKS;
    e->transfer.kv_bytes_per_token = params->kv_bytes_per_token;
    e->transfer.transfer_gbps = params->transfer_gbps;
    if (params->role != ATC_ROLE_BOTH) /* simulate: role: (a listed endpoint has its own role:) */
        ep->role = params->role;
    ep->kv_tokens = atc_sim_params_kv_tokens(&p); /* what vLLM's /metrics would tell */
    rp->heap_pos[rp->neps] = rp->neps;
    rp->heap[rp->neps] = (struct heap_entry){.key = UINT64_MAX, .ep = rp->neps};
    rp->neps++;
    return 0;
}

/* ---- KV events: what a publishing server's cache does goes into the exact index at once, in virtual
 * time (atc serve reads the same events over ZMQ, fleet/kv_events.c; no transport here) ---- */

static void on_kv(void *ctx, enum atc_sim_kv_op op, const uint64_t *hashes, size_t n)
{
    struct rp_endpoint *e = ctx;
    struct atc_kv_index *ix = e->rp->kv;
    unsigned slot = (unsigned)e->kv_slot;
    if (op == ATC_SIM_KV_CLEARED)
        atc_kv_index_clear(ix, slot);
    for (size_t i = 0; i < n; i++) {
        if (op == ATC_SIM_KV_STORED)
            atc_kv_index_store(ix, slot, hashes[i], ATC_KV_GPU);
        else
            atc_kv_index_remove(ix, slot, hashes[i], ATC_KV_GPU);
    }
}

/* The exact index over the servers that publish (at most ATC_KV_INDEX_MAX_ENDPOINTS of them; past that
 * the rest count as not publishing, which the replay's log says). 0, or -1 out of memory. */
static int build_kv(struct replay *rp)
{
    size_t caps[ATC_KV_INDEX_MAX_ENDPOINTS];
    unsigned n = 0;
    for (size_t k = 0; k < rp->neps; k++) {
        struct rp_endpoint *e = &rp->eps[k];
        if (e->kv_slot < 0)
            continue;
        if (n == ATC_KV_INDEX_MAX_ENDPOINTS) {
            atc_warn("replay: %s: more than %d servers publish KV events; it counts as not publishing",
                     e->ep->id, ATC_KV_INDEX_MAX_ENDPOINTS);
            e->kv_slot = -1;
            continue;
        }
        caps[n] = e->kv_caps;
        e->kv_slot = (int)n++;
    }
    if (n == 0)
        return 0;
    if ((rp->kv = atc_kv_index_create(caps, n)) == NULL)
        return -1;
    for (size_t k = 0; k < rp->neps; k++)
        if (rp->eps[k].kv_slot >= 0)
            atc_sim_set_kv_listener(rp->eps[k].sim, on_kv, &rp->eps[k]);
    return 0;
}

/* ep:cached_tokens in replay: the leading blocks of the request the index says @p ep holds. */
static int64_t replay_cached(void *ctx, const struct atc_endpoint *ep)
{
    const struct replay *rp = ctx;
    const struct rp_endpoint *e = &rp->eps[ep->index];
    if (e->kv_slot < 0)
        return -1;
    const struct atc_features *f = rp->rreq.features;
    size_t held =
        atc_kv_index_held_prefix(rp->kv, (unsigned)e->kv_slot, f->blocks, f->nblocks, 1u << ATC_KV_GPU);
    uint32_t bt = rp->rreq.block_tokens ? rp->rreq.block_tokens : ATC_SIM_KV_BLOCK_TOKENS;
    uint64_t tokens = (uint64_t)held * bt;
    return (int64_t)(tokens < f->prompt_tokens ? tokens : f->prompt_tokens);
}

static struct rp_endpoint *endpoint_of(struct replay *rp, const struct atc_endpoint *ep)
{
    return &rp->eps[ep->index];
}

/* ---- the next event: a heap of the servers by their next event, so that an event costs O(log servers)
 * and not a scan of the fleet ---- */

static uint64_t heap_key(const struct replay *rp, size_t pos)
{
    return rp->heap[pos].key;
}

/* Puts entry @p e at place @p i of the heap. */
static void heap_put(struct replay *rp, size_t i, struct heap_entry e)
{
    rp->heap[i] = e;
    rp->heap_pos[e.ep] = i;
}

/* Sets server k's next event to @p key and restores the heap: the entry moves up past every parent with
 * a later event, or down past every smaller child (the left one on a tie), each passed one moved into the
 * hole rather than swapped (the same heap as swapping, in half the writes). */
static void heap_fix(struct replay *rp, size_t k, uint64_t key)
{
    size_t i = rp->heap_pos[k];
    struct heap_entry e = {.key = key, .ep = k};
    while (i > 0 && heap_key(rp, (i - 1) / 2) > key) {
        heap_put(rp, i, rp->heap[(i - 1) / 2]);
        i = (i - 1) / 2;
    }
    for (;;) {
        size_t l = 2 * i + 1, m = l;
        if (l >= rp->neps)
            break;
        if (l + 1 < rp->neps && heap_key(rp, l + 1) < heap_key(rp, l))
            m = l + 1;
        if (!(heap_key(rp, m) < key))
            break;
        heap_put(rp, i, rp->heap[m]);
        i = m;
    }
    heap_put(rp, i, e);
}

/* What server k's /metrics would say now, as health scraping reads it from a real server: its model
 * changed (a request came in, an iteration ran), so its key in the heap and its scraped load too. */
static void server_changed(struct replay *rp, size_t k)
{
    struct rp_endpoint *e = &rp->eps[k];
    struct atc_sim_stats st;
    atc_sim_stats(e->sim, &st);
    uint64_t queries = st.prefix_queries - e->scraped_queries, hits = st.prefix_hits - e->scraped_hits;
    double hit_rate = queries > 0 ? (double)hits / (double)queries : NAN;
    if (queries > 0) {
        e->scraped_queries = st.prefix_queries;
        e->scraped_hits = st.prefix_hits;
    } else { /* nothing new looked up: the last rate stands */
        hit_rate = e->ep->sig.scraped_prefix_hit_rate;
    }
    /* Relaxed, as health.c publishes them: the replay is single-threaded, and a sequentially consistent
     * store (a fence each) after every iteration of every server was a tenth of a replay's time. */
    atomic_store_explicit(&e->ep->server_queue, (unsigned)st.waiting, memory_order_relaxed);
    atomic_store_explicit(&e->ep->server_kv_usage, st.kv_usage, memory_order_relaxed);
    atc_signals_scraped(&e->ep->sig, st.running, st.waiting, st.kv_usage, hit_rate, rp->now);
    heap_fix(rp, k, atc_sim_next_event_us(e->sim));
}

/* ---- requests ---- */

static void queue_push(struct replay *rp, size_t i)
{
    rp->queue[(rp->qhead + rp->qlen) % rp->n] = i;
    rp->qlen++;
}

static void queue_pop(struct replay *rp)
{
    rp->qhead = (rp->qhead + 1) % rp->n;
    rp->qlen--;
}

/* The guessed index's @p cached blocks of @p r on @p e, and the exact index's, against what the server
 * holds as the request arrives (what its usage's cached_tokens would say). */
static void guess_error(struct replay *rp, const struct rp_endpoint *e, const struct atc_trace_record *r,
                        size_t cached)
{
    struct atc_replay_result *res = rp->res;
    uint64_t bt = r->block_tokens ? r->block_tokens : ATC_SIM_KV_BLOCK_TOKENS;
    uint64_t actual = (uint64_t)atc_sim_prefix_cached(e->sim, r->blocks, r->nblocks) * bt;
    uint64_t guessed = (uint64_t)cached * rp->rreq.block_tokens; /* (policy_blocks') */
    res->guess_samples++;
    res->guessed_cached_tokens += guessed;
    res->actual_cached_tokens += actual;
    res->guess_error_tokens += guessed > actual ? guessed - actual : actual - guessed;
    if (e->kv_slot < 0)
        return;
    size_t held =
        atc_kv_index_held_prefix(rp->kv, (unsigned)e->kv_slot, r->blocks, r->nblocks, 1u << ATC_KV_GPU);
    uint64_t exact = (uint64_t)held * bt;
    res->exact_samples++;
    res->exact_error_tokens += exact > actual ? exact - actual : actual - exact;
}

/* Submits request @p i to server @p e at @p at: its whole generation, or (@p stage ATC_ROLE_PREFILL) the
 * prefill server's one token, or (ATC_ROLE_DECODE) the decode server's generation from a KV that arrives
 * then. False when the model is out of memory. */
static bool submit(struct replay *rp, size_t i, struct rp_endpoint *e, uint64_t at, unsigned stage)
{
    const struct atc_trace_record *r = &rp->trace->records[i];
    int64_t out = stage == ATC_ROLE_PREFILL ? 1 : r->output_tokens > 0 ? r->output_tokens : r->max_tokens;
    struct atc_sim_request sr = {
        .prompt_tokens = r->prompt_tokens,
        .max_tokens = out >= 0 ? out : -1,
        .blocks = r->blocks,
        .nblocks = r->nblocks,
        .block_tokens = r->block_tokens,
        .kv_arrives = stage == ATC_ROLE_DECODE,
    };
    if (atc_sim_submit(e->sim, at, &sr, (void *)(uintptr_t)(i + 1), NULL) == 0)
        return false;
    e->requests++;
    e->tokens += stage == ATC_ROLE_PREFILL  ? r->prompt_tokens
                 : stage == ATC_ROLE_DECODE ? (uint64_t)(out >= 0 ? out : 0)
                                            : r->prompt_tokens + (uint64_t)(out >= 0 ? out : 0);
    server_changed(rp, (size_t)(e - rp->eps));
    return true;
}

/* Sends request @p i around atc (o->around) to a server of its model drawn at random: the server and its
 * KV events see it, atc's counts, signals and guessed index do not. false: its model has no server. */
static bool dispatch_around(struct replay *rp, size_t i)
{
    const struct atc_trace_record *r = &rp->trace->records[i];
    const char *model = rp->o->model != NULL ? rp->o->model : r->model;
    const struct atc_model *m = atc_endpoint_table_model(rp->table, model, strlen(model));
    if (m == NULL || m->nendpoints == 0)
        return false;
    uint64_t draw = rp->seed_around ^ (i * 0x9E3779B97F4A7C15ull);
    struct rp_endpoint *e = endpoint_of(rp, m->endpoints[atc_sim_rand(&draw) % m->nendpoints]);
    struct rp_req *q = &rp->reqs[i];
    q->around = true;
    q->ep = (int)e->ep->index;
    q->prefill_ep = -1;
    q->state = RS_RUNNING;
    rp->res->around++;
    if (!submit(rp, i, e, rp->now, ATC_ROLE_BOTH)) {
        q->state = RS_REJECTED;
        rp->res->rejected++;
        return true;
    }
    rp->res->endpoint[i] = (int)e->ep->index;
    return true;
}

/* Is request @p i one of the share sent around atc? A draw of its own, so the share does not move the
 * policy's random numbers. */
static bool goes_around(const struct replay *rp, size_t i)
{
    if (rp->o->around <= 0)
        return false;
    uint64_t draw = rp->seed_around + i;
    return (double)(atc_sim_rand(&draw) >> 11) * 0x1.0p-53 < rp->o->around;
}

/* Starts request @p i on @p ep now; a disaggregated model's on prefill server @p pf first (NULL: none),
 * whose slot it takes too, as atc serve's relay (proxy/disagg.c) does. */
static void dispatch(struct replay *rp, size_t i, struct atc_endpoint *ep, struct atc_endpoint *pf)
{
    const struct atc_trace_record *r = &rp->trace->records[i];
    struct rp_req *q = &rp->reqs[i];
    q->tokens = atc_request_tokens(r->prompt_tokens, r->max_tokens, 1);
    q->ep = (int)ep->index;
    q->prefill_ep = pf != NULL ? (int)pf->index : -1;
    q->state = pf != NULL ? RS_PREFILL : RS_RUNNING;
    atc_endpoint_acquire(ep, q->tokens);
    if (pf != NULL)
        atc_endpoint_acquire(pf, q->tokens);
    /* the prefix index learns where these blocks went (the server that computes the prompt), and says
     * what that server likely has cached */
    struct atc_endpoint *computes = pf != NULL ? pf : ep;
    q->sig.streamed = q->psig.streamed = true; /* (the replay sees every first token) */
    size_t cached = rp->rt != NULL ? atc_policy_routed(rp->rt, &rp->rreq, computes) : 0;
    guess_error(rp, endpoint_of(rp, computes), r, cached);
    if (pf != NULL) {
        atc_signals_sent(&ep->sig, &rp->table->signals, &q->sig, 0, rp->now);
        atc_signals_sent_guessed(&pf->sig, &rp->table->signals, &q->psig, r->prompt_tokens, cached,
                                 rp->rreq.block_tokens, rp->now);
    } else {
        atc_signals_sent_guessed(&ep->sig, &rp->table->signals, &q->sig, r->prompt_tokens, cached,
                                 rp->rreq.block_tokens, rp->now);
    }
    if (!submit(rp, i, endpoint_of(rp, computes), rp->now, pf != NULL ? ATC_ROLE_PREFILL : ATC_ROLE_BOTH)) {
        /* out of memory in the model: the request is lost, not the replay */
        atc_signals_done(&ep->sig, &q->sig, rp->now, 0);
        atc_endpoint_release(ep, q->tokens);
        if (pf != NULL) {
            atc_signals_done(&pf->sig, &q->psig, rp->now, 0);
            atc_endpoint_release(pf, q->tokens);
        }
        q->state = RS_REJECTED;
        rp->res->rejected++;
        return;
    }
    rp->res->endpoint[i] = (int)ep->index;
}

/* Request @p i, which held its prompt's blocks and @p output_tokens more on @p ep, ended there: the prefix
 * index takes them for the most recently used there now. */
/* The blocks of @p r the policy and the prefix index see, into @p f; returns the tokens each covers. Live
 * requests hash blocks of ATC_PREFIX_BLOCK_TOKENS, at most ATC_PREFIX_BLOCKS_MAX of them (32k tokens); a
 * trace of smaller blocks (Qwen's 16 tokens) is seen every k-th block to span as much: a chained hash
 * names the whole prefix up to its block, so every k-th one is a chain too. */
static uint32_t policy_blocks(const struct atc_trace_record *r, struct atc_features *f)
{
    uint32_t bt = r->block_tokens,
             k = bt > 0 && bt < ATC_PREFIX_BLOCK_TOKENS ? ATC_PREFIX_BLOCK_TOKENS / bt : 1;
    size_t n = r->nblocks / k < ATC_PREFIX_BLOCKS_MAX ? r->nblocks / k : ATC_PREFIX_BLOCKS_MAX;
    for (size_t j = 0; j < n; j++)
        f->blocks[j] = r->blocks[(j + 1) * k - 1];
    f->nblocks = n;
    return bt * k;
}

static void released(struct replay *rp, size_t i, const struct atc_endpoint *ep, uint64_t output_tokens)
{
    const struct atc_trace_record *r = &rp->trace->records[i];
    if (rp->rt == NULL)
        return;
    struct atc_features *f = &rp->released; /* (rp->f may be a decision's, up the stack) */
    f->prompt_tokens = r->prompt_tokens;
    atc_policy_released(rp->rt, f, policy_blocks(r, f), ep, output_tokens);
}

/* Request @p i's prefill server produced its one token at @p at: its slot is freed and the KV moves to the
 * decode server, which starts once it has arrived (kv_bytes_per_token x prompt / transfer_gbps). */
static void prefilled(struct replay *rp, size_t i, struct rp_endpoint *pf, uint64_t at)
{
    struct rp_req *q = &rp->reqs[i];
    struct rp_endpoint *d = &rp->eps[q->ep];
    atc_signals_first_byte(&pf->ep->sig, &rp->table->signals, &q->psig, at, true);
    atc_signals_done(&pf->ep->sig, &q->psig, at, 1);
    released(rp, i, pf->ep, 0); /* (disagg.c release_prefill) */
    atc_endpoint_release(pf->ep, q->tokens);
    q->prefill_ep = -1;
    q->state = RS_RUNNING;
    rp->drain = true; /* a prefill slot is free */
    uint64_t transfer = atc_sim_transfer_us(&d->transfer, rp->trace->records[i].prompt_tokens);
    if (!submit(rp, i, d, at + transfer, ATC_ROLE_DECODE)) {
        atc_signals_done(&d->ep->sig, &q->sig, at, 0);
        atc_endpoint_release(d->ep, q->tokens);
        q->state = RS_REJECTED;
        rp->res->rejected++;
    }
}

static void on_token(void *ctx, const struct atc_sim_token *tok)
{
    struct rp_endpoint *e = ctx;
    struct replay *rp = e->rp;
    size_t i = (size_t)(uintptr_t)tok->user - 1;
    const struct atc_trace_record *r = &rp->trace->records[i];
    struct atc_replay_result *res = rp->res;
    if (rp->reqs[i].state == RS_PREFILL) { /* its prefill server's token: the decode stage's turn */
        if (tok->last)
            prefilled(rp, i, e, tok->at_us);
        return;
    }
    bool around = rp->reqs[i].around;
    if (tok->index == 0) {
        res->ttft_ms[i] = (double)(tok->at_us - r->at_us) / 1000.0;
        if (around)
            goto first_done;
        atc_endpoint_record(e->ep, true, res->ttft_ms[i]);
        atc_signals_first_byte(&e->ep->sig, &rp->table->signals, &rp->reqs[i].sig, tok->at_us, true);
        /* its prefill is done: the endpoint's prefill queue shrank, which a policy that binds late (a
         * queue verdict until some endpoint can start a prefill soon) waits for, as atc serve's relay
         * kicks its admission queue at a first byte */
        rp->drain = true;
    }
first_done:
    if (!tok->last)
        return;
    res->e2e_ms[i] = (double)(tok->at_us - r->at_us) / 1000.0;
    if (tok->index > 0) /* its mean inter-token latency: first to last token */
        res->itl_ms[i] = (res->e2e_ms[i] - res->ttft_ms[i]) / tok->index;
    res->output_tokens += tok->index + 1;
    res->completed++;
    rp->reqs[i].state = RS_DONE;
    if (!around) {
        released(rp, i, e->ep, tok->index + 1); /* (relay.c release_endpoint) */
        atc_signals_done(&e->ep->sig, &rp->reqs[i].sig, tok->at_us, tok->index + 1);
        atc_endpoint_release(e->ep, rp->reqs[i].tokens);
    }
    if (tok->at_us > rp->last_completion)
        rp->last_completion = tok->at_us;
    rp->drain = true;
}

/* req:header(name) under replay: the headers the trace recorded (record.headers), else nothing. */
static const char *trace_header(void *ctx, const char *name)
{
    return atc_trace_record_header(ctx, name);
}

static const char *const kind_paths[] = {
    [ATC_KIND_CHAT] = "/v1/chat/completions",
    [ATC_KIND_COMPLETION] = "/v1/completions",
    [ATC_KIND_EMBEDDING] = "/v1/embeddings",
};

/* What the policy sees of record @p i: its features and the route request. */
static void prepare(struct replay *rp, size_t i)
{
    const struct atc_trace_record *r = &rp->trace->records[i];
    struct atc_features *f = &rp->f;
    const char *model = rp->o->model != NULL ? rp->o->model : r->model;
    snprintf(f->model, sizeof(f->model), "%s", model);
    f->has_model = true;
    f->stream = r->stream;
    f->has_tools = false;
    f->max_tokens = r->max_tokens;
    f->choices = 1; /* traces record no n */
    snprintf(f->user, sizeof(f->user), "%s", r->session);
    f->prompt = NULL;
    f->prompt_len = 0;
    f->prompt_tokens = r->prompt_tokens;
    uint32_t block_tokens = policy_blocks(r, f);
    if (r->id != NULL)
        snprintf(rp->id, sizeof(rp->id), "%s", r->id);
    else
        snprintf(rp->id, sizeof(rp->id), "r%zu", i + 1);
    rp->rreq = (struct atc_route_request){
        .id = rp->id,
        .path = kind_paths[r->kind],
        .kind = r->kind,
        .features = f,
        .priority = r->priority,
        .tenant = r->tenant,
        .session = r->session,
        .attempt = 1,
        .header = trace_header,
        .header_ctx = (void *)r,
        .block_tokens = block_tokens,
        .tokens = atc_request_tokens(r->prompt_tokens, r->max_tokens, 1),
        .cached_tokens = rp->kv != NULL ? replay_cached : NULL,
        .cached_ctx = rp,
    };
}

enum outcome { DISPATCHED, QUEUED, REJECTED };

/* Decides where request @p i goes now and acts on it. */
static struct atc_sim *sim_of(void *ctx, const struct atc_endpoint *ep)
{
    return endpoint_of(ctx, ep)->sim;
}

static void oracle_decide(struct replay *rp, size_t i, struct atc_decision *d)
{
    const struct atc_model *m = atc_endpoint_table_model(rp->table, rp->f.model, strlen(rp->f.model));
    *d = (struct atc_decision){.kind = ATC_DECISION_REJECT, .status = 404};
    if (m == NULL)
        return;
    /* a disaggregated model: the prefill server (the C balancer picks the decode one, as for a policy) */
    unsigned stage = m->disaggregation != ATC_DISAGG_NONE ? ATC_ROLE_PREFILL : ATC_ROLE_BOTH;
    struct atc_endpoint *ep =
        atc_replay_oracle_pick(m, &rp->trace->records[i], rp->rreq.tokens, rp->now, stage, sim_of, rp);
    *(stage == ATC_ROLE_PREFILL ? &d->prefill : &d->endpoint) = ep;
    d->kind = ep != NULL ? ATC_DECISION_ENDPOINT : ATC_DECISION_QUEUE;
}

static enum outcome decide(struct replay *rp, size_t i)
{
    struct rp_req *q = &rp->reqs[i];
    struct atc_replay_result *res = rp->res;
    struct atc_decision d;
    prepare(rp, i);
    uint64_t cpu = atc_thread_cpu_ns();
    if (rp->rt != NULL) {
        atc_policy_route(rp->rt, &rp->rreq, &d);
    } else if (rp->oracle) {
        oracle_decide(rp, i, &d);
    } else { /* no policy: the built-in balancer decides, as atc serve without a policy: section */
        memset(&d, 0, sizeof(d));
        d.kind = ATC_DECISION_FALLBACK;
    }
    cpu = atc_thread_cpu_ns() - cpu;
    q->decisions++;
    res->decisions++;
    struct atc_endpoint *ep = NULL;
    enum outcome result;
    bool stopped = d.kind == ATC_DECISION_FALLBACK && d.reason == atc_policy_fallback_budget;
    if (cpu > rp->budget_ns || stopped)
        res->budget_overruns++;
    if (d.kind == ATC_DECISION_FALLBACK) {
        if (rp->rt != NULL) {
            res->fallbacks++;
            if (!stopped)
                res->policy_errors++;
        }
        const struct atc_model *m = atc_endpoint_table_model(rp->table, rp->f.model, strlen(rp->f.model));
        if (m == NULL) {
            d.kind = ATC_DECISION_REJECT;
            d.status = 404;
        } else {
            ep = atc_balancer_pick(m, &rp->rng, NULL, 0, rp->rreq.tokens);
        }
    } else if (d.kind == ATC_DECISION_ENDPOINT) {
        ep = d.endpoint;
        if (ep == NULL) { /* the policy named a prefill server only: the C balancer picks the decode one */
            const struct atc_endpoint *p = d.prefill;
            ep = atc_balancer_pick(atc_endpoint_table_model(rp->table, p->model, strlen(p->model)), &rp->rng,
                                   NULL, 0, rp->rreq.tokens);
        }
    }
    /* A disaggregated model: the policy's prefill server, else the C balancer's (proxy/disagg.c
     * pick_prefill); none free, the pair waits in the queue (atc serve answers 503 at once). */
    const struct atc_model *dm =
        ep != NULL ? atc_endpoint_table_model(rp->table, ep->model, strlen(ep->model)) : NULL;
    struct atc_endpoint *pf = NULL;
    if (dm != NULL && dm->disaggregation != ATC_DISAGG_NONE) {
        pf = d.kind == ATC_DECISION_ENDPOINT && d.prefill != NULL &&
                     atc_endpoint_available(d.prefill, rp->rreq.tokens)
                 ? d.prefill
                 : atc_balancer_pick_stage(dm, &rp->rng, NULL, 0, rp->rreq.tokens, ATC_ROLE_PREFILL);
        ep = pf != NULL ? ep : NULL;
    }
    if (rp->o->on_decision != NULL) {
        struct atc_replay_decision rd = {
            .record = i,
            .at_us = rp->now,
            .attempt = q->decisions,
            .kind = d.kind,
            .reason = d.reason,
            .endpoint = ep,
            .inflight = ep != NULL ? ep->inflight : 0,
            .capacity = ep != NULL ? ep->capacity : 0,
            .status = d.status,
            .table = rp->table,
        };
        rp->o->on_decision(rp->o->ctx, &rd);
    }
    if (ep != NULL) {
        dispatch(rp, i, ep, pf);
        result = DISPATCHED;
    } else if (d.kind == ATC_DECISION_REJECT) {
        q->state = RS_REJECTED;
        res->rejected++;
        result = REJECTED;
    } else { /* a queue verdict, or a fallback with nothing available */
        result = QUEUED;
    }
    return result;
}

static void arrive(struct replay *rp, size_t i)
{
    if (goes_around(rp, i) && dispatch_around(rp, i))
        return;
    if (decide(rp, i) != QUEUED)
        return;
    rp->reqs[i].state = RS_QUEUED;
    rp->reqs[i].queued_at = rp->now;
    rp->res->queued++;
    queue_push(rp, i);
}

/* Decides the queue's head again while it gets somewhere: FIFO, nobody overtakes the head. */
static void drain_queue(struct replay *rp)
{
    rp->drain = false;
    while (rp->qlen > 0) {
        size_t i = rp->queue[rp->qhead];
        enum outcome oc = decide(rp, i);
        if (oc == QUEUED)
            return;
        if (oc == DISPATCHED)
            rp->waits[rp->nwaits++] = (double)(rp->now - rp->reqs[i].queued_at) / 1000.0;
        queue_pop(rp);
    }
}

/* ---- samples: load over time ---- */

static void take_sample(struct replay *rp, uint64_t at)
{
    struct atc_replay_result *res = rp->res;
    if (res->nsamples == rp->samples_cap) {
        size_t cap = rp->samples_cap ? rp->samples_cap * 2 : 256;
        double *t = realloc(res->sample_s, cap * sizeof(double));
        if (t != NULL)
            res->sample_s = t;
        unsigned *v = realloc(res->sample_inflight, cap * rp->neps * sizeof(unsigned));
        if (v != NULL)
            res->sample_inflight = v;
        if (t == NULL || v == NULL)
            return;
        rp->samples_cap = cap;
    }
    unsigned *row = res->sample_inflight + res->nsamples * rp->neps, max = 0, total = 0, counted = 0;
    for (size_t k = 0; k < rp->neps; k++) {
        row[k] = rp->eps[k].ep->inflight;
        if (!rp->eps[k].counted || (rp->in != NULL && !rp->in[k])) /* (out of the fleet now) */
            continue;
        counted++;
        total += row[k];
        max = row[k] > max ? row[k] : max;
    }
    res->sample_s[res->nsamples++] = (double)at / 1e6;
    if (total > 0) {
        double ratio = (double)max / ((double)total / (double)counted);
        rp->imbalance_sum += ratio;
        rp->imbalance_n++;
        if (ratio > res->imbalance_max)
            res->imbalance_max = ratio;
    }
}

/* Marks the endpoints whose model the replayed requests ask for (--model, else the trace's), so that
 * the imbalance figures are not diluted by the idle servers of another model (a two-model fleet read
 * about half as imbalanced as it was). When none matches (a trace of aliases the policy maps), every
 * endpoint counts. */
static void mark_counted(struct replay *rp)
{
    size_t any = 0;
    for (size_t k = 0; k < rp->neps; k++) {
        const char *m = rp->eps[k].ep->model;
        bool asked = false;
        for (size_t j = 0; j < k && !asked; j++) /* a model seen already: the same answer */
            if (strcmp(rp->eps[j].ep->model, m) == 0) {
                rp->eps[k].counted = rp->eps[j].counted;
                goto next;
            }
        if (rp->o->model != NULL)
            asked = strcmp(rp->o->model, m) == 0;
        for (size_t i = 0; rp->o->model == NULL && i < rp->n && !asked; i++)
            asked = strcmp(rp->trace->records[i].model, m) == 0;
        rp->eps[k].counted = asked;
    next:
        any += rp->eps[k].counted;
    }
    for (size_t k = 0; any == 0 && k < rp->neps; k++)
        rp->eps[k].counted = true;
}

/* ---- the run ---- */

static int by_time(const void *a, const void *b)
{
    const struct outage_event *x = a, *y = b;
    if (x->at_us != y->at_us)
        return x->at_us < y->at_us ? -1 : 1;
    if (x->member != y->member || x->routable != y->routable) /* leaves, then outages, then joins */
        return x->member != y->member ? x->member - y->member : (int)x->routable - (int)y->routable;
    return x->ep < y->ep ? -1 : x->ep > y->ep;
}

/* ---- servers that join and leave the fleet (from: / until:) ---- */

/* The fleet is now the servers in their window: a new table for the decisions and the policy's views
 * (proxy/table_swap.h does the same live, for an endpoint added or removed). */
static int refleet(struct replay *rp)
{
    struct atc_endpoint_table *t = atc_endpoint_table_only(rp->all, rp->in);
    if (t == NULL)
        return -1;
    char *err = NULL;
    if (rp->rt != NULL && atc_policy_update_table(rp->rt, t, &err) == 0)
        atc_warn("replay: the policy did not take the new fleet (%s): the C balancer decides",
                 err ? err : "?");
    free(err);
    if (rp->table != rp->all)
        atc_endpoint_table_free_shell(rp->table);
    rp->table = t;
    return 0;
}

/* Servers with a from: are out of the fleet at the start. */
static int start_windows(struct replay *rp, char **err)
{
    if ((rp->in = calloc(rp->all->nslots ? rp->all->nslots : 1, sizeof(bool))) == NULL) {
        *err = strdup("out of memory");
        return -1;
    }
    for (size_t k = 0; k < rp->neps; k++)
        rp->in[rp->eps[k].ep->index] = rp->eps[k].window.from_ms == 0;
    if (refleet(rp) < 0) {
        *err = strdup("out of memory");
        return -1;
    }
    return 0;
}

/* Server k joins (@p member +1) or leaves (-1) the fleet now. One that leaves gets no new request; those
 * in flight there finish; the prefix index, the affinity table and the exact index forget it. */
static void member_event(struct replay *rp, unsigned k, int member)
{
    struct rp_endpoint *e = &rp->eps[k];
    rp->in[e->ep->index] = member > 0;
    if (member < 0) {
        e->inflight_at_leave = e->ep->inflight;
        atc_prefix_index_forget(rp->prefix, e->ep->index);
        atc_affinity_forget_endpoint(rp->affinity, e->ep->id);
        if (e->kv_slot >= 0)
            atc_kv_index_clear(rp->kv, (unsigned)e->kv_slot);
    }
    if (refleet(rp) < 0)
        atc_warn("replay: out of memory: %s %s the fleet late", e->ep->id, member > 0 ? "joins" : "leaves");
    rp->drain |= member > 0;
}

static int plan_outages(struct replay *rp, char **err)
{
    const struct atc_replay_options *o = rp->o;
    size_t windows = 0;
    for (size_t k = 0; k < rp->neps; k++)
        windows += (rp->eps[k].window.from_ms > 0) + (rp->eps[k].window.until_ms > 0);
    if (o->noutages == 0 && o->nrestarts == 0 && windows == 0)
        return 0;
    if ((rp->outages = calloc(o->noutages * 2 + o->nrestarts + windows, sizeof(*rp->outages))) == NULL) {
        *err = strdup("out of memory");
        return -1;
    }
    for (size_t i = 0; i < o->noutages; i++) {
        const struct atc_endpoint *ep = atc_endpoint_table_find(rp->table, o->outages[i].endpoint);
        if (ep == NULL) {
            if (asprintf(err, "outage of unknown endpoint '%s'", o->outages[i].endpoint) < 0)
                *err = NULL;
            return -1;
        }
        rp->outages[rp->noutages++] =
            (struct outage_event){o->outages[i].from_us, ep->index, false, false, 0};
        rp->outages[rp->noutages++] = (struct outage_event){o->outages[i].to_us, ep->index, true, false, 0};
    }
    for (size_t i = 0; i < o->nrestarts; i++) {
        const struct atc_endpoint *ep = atc_endpoint_table_find(rp->table, o->restarts[i].endpoint);
        if (ep == NULL) {
            if (asprintf(err, "restart of unknown endpoint '%s'", o->restarts[i].endpoint) < 0)
                *err = NULL;
            return -1;
        }
        rp->outages[rp->noutages++] = (struct outage_event){o->restarts[i].at_us, ep->index, true, true, 0};
    }
    for (size_t k = 0; k < rp->neps; k++) { /* from: / until: (each server's own slot is k) */
        const struct atc_window *w = &rp->eps[k].window;
        if (w->from_ms > 0)
            rp->outages[rp->noutages++] =
                (struct outage_event){w->from_ms * 1000, (unsigned)k, false, false, +1};
        if (w->until_ms > 0)
            rp->outages[rp->noutages++] =
                (struct outage_event){w->until_ms * 1000, (unsigned)k, false, false, -1};
    }
    qsort(rp->outages, rp->noutages, sizeof(*rp->outages), by_time);
    return windows > 0 ? start_windows(rp, err) : 0;
}

static void progress(const struct replay *rp, const char *name, size_t done, int *shown)
{
    int pct_done = rp->n ? (int)(100 * done / rp->n) : 100;
    if (pct_done == *shown)
        return;
    *shown = pct_done;
    char bar[41];
    int full = pct_done * 40 / 100;
    for (int k = 0; k < 40; k++)
        bar[k] = k < full ? '=' : k == full ? '>' : ' ';
    bar[40] = '\0';
    fprintf(stderr, "\r  %-28.28s [%s] %3d%%", name, bar, pct_done);
    if (pct_done == 100)
        fputs("\r\033[K", stderr);
    fflush(stderr);
}

static void loop(struct replay *rp, const char *name)
{
    size_t next = 0;
    int shown = -1;
    uint64_t last_arrival = rp->n ? rp->trace->records[rp->n - 1].at_us : 0;
    uint64_t interval = last_arrival / (rp->o->samples ? rp->o->samples : DEFAULT_SAMPLES);
    uint64_t next_sample = 0;
    if (interval < 1000)
        interval = 1000;
    for (;;) {
        uint64_t t_arr = next < rp->n ? rp->trace->records[next].at_us : UINT64_MAX;
        uint64_t t_out = rp->next_outage < rp->noutages ? rp->outages[rp->next_outage].at_us : UINT64_MAX;
        uint64_t t_sim = rp->neps > 0 ? heap_key(rp, 0) : UINT64_MAX;
        uint64_t t = t_arr < t_out ? t_arr : t_out;
        t = t_sim < t ? t_sim : t;
        if (t == UINT64_MAX)
            break;
        while (next_sample <= t) {
            take_sample(rp, next_sample);
            next_sample += interval;
        }
        rp->now = t;
        /* At one instant: arrivals first (so requests arriving together are batched together), then
         * outages, then the servers' iterations. */
        if (t_arr == t) {
            arrive(rp, next++);
            if (rp->o->progress)
                progress(rp, name, next, &shown);
            continue;
        }
        if (t_out == t) {
            const struct outage_event *ev = &rp->outages[rp->next_outage++];
            if (ev->member != 0) {
                member_event(rp, ev->ep, ev->member);
            } else if (ev->restart) {
                atc_sim_restart(rp->eps[ev->ep].sim);
                server_changed(rp, ev->ep);
            } else {
                rp->eps[ev->ep].ep->routable = ev->routable;
                rp->drain |= ev->routable;
            }
        } else {
            while (heap_key(rp, 0) <= t) {
                size_t k = rp->heap[0].ep;
                atc_sim_advance(rp->eps[k].sim, t);
                server_changed(rp, k);
            }
        }
        if (rp->drain)
            drain_queue(rp);
    }
    take_sample(rp, rp->now);
    if (rp->o->progress && shown != 100)
        progress(rp, name, rp->n, &shown);
}

static void summarize(struct replay *rp)
{
    struct atc_replay_result *res = rp->res;
    atc_replay_latencies(res, rp->n);
    /* Queue waits: arrival to dispatch of the requests that waited (the server's own queue is part of
     * their ttft, not of this). */
    atc_replay_sort(rp->waits, rp->nwaits);
    res->queue_wait_p50_ms = atc_replay_percentile(rp->waits, rp->nwaits, 50);
    res->queue_wait_p99_ms = atc_replay_percentile(rp->waits, rp->nwaits, 99);
    res->queue_wait_max_ms = rp->nwaits ? rp->waits[rp->nwaits - 1] : 0;

    uint64_t first = rp->n ? rp->trace->records[0].at_us : 0;
    res->duration_s = rp->last_completion > first ? (double)(rp->last_completion - first) / 1e6 : 0;
    res->throughput_rps = res->duration_s > 0 ? (double)res->completed / res->duration_s : 0;
    res->output_tps = res->duration_s > 0 ? (double)res->output_tokens / res->duration_s : 0;
    for (size_t k = 0; k < rp->neps; k++) {
        struct atc_sim_stats st;
        atc_sim_stats(rp->eps[k].sim, &st);
        struct atc_replay_endpoint_result *er = &res->endpoints[k];
        er->requests = rp->eps[k].requests;
        er->prefix_blocks = st.prefix_blocks;
        er->prefix_block_hits = st.prefix_block_hits;
        er->preemptions = st.preemptions;
        er->from_ms = rp->eps[k].window.from_ms;
        er->until_ms = rp->eps[k].window.until_ms;
        er->inflight_at_leave = rp->eps[k].inflight_at_leave;
        res->prefix_blocks += st.prefix_blocks;
        res->prefix_block_hits += st.prefix_block_hits;
        res->preemptions += st.preemptions;
    }
    res->cache_hit_rate =
        res->prefix_blocks ? (double)res->prefix_block_hits / (double)res->prefix_blocks : 0;
    res->imbalance = rp->imbalance_n ? rp->imbalance_sum / (double)rp->imbalance_n : 1.0;
    uint64_t most = 0, all = 0;
    size_t counted = 0;
    for (size_t k = 0; k < rp->neps; k++) {
        if (!rp->eps[k].counted)
            continue;
        counted++;
        most = rp->eps[k].tokens > most ? rp->eps[k].tokens : most;
        all += rp->eps[k].tokens;
    }
    res->work_imbalance = all > 0 ? (double)most * (double)counted / (double)all : 1.0;
    if (atc_replay_groups(res, rp->trace, rp->n) < 0)
        atc_warn("replay: out of memory for the per-tenant and per-priority figures");
    if (res->imbalance_max < 1.0)
        res->imbalance_max = 1.0;
}

static void replay_dispose(struct replay *rp)
{
    atc_policy_runtime_destroy(rp->rt);
    for (size_t k = 0; k < rp->neps; k++)
        atc_sim_destroy(rp->eps[k].sim);
    free(rp->eps);
    free(rp->heap);
    free(rp->heap_pos);
    if (rp->table != rp->all)
        atc_endpoint_table_free_shell(rp->table);
    atc_endpoint_table_destroy(rp->all);
    free(rp->in);
    atc_affinity_destroy(rp->affinity);
    atc_prefix_index_destroy(rp->prefix);
    atc_kv_index_destroy(rp->kv);
    free(rp->reqs);
    free(rp->queue);
    free(rp->waits);
    free(rp->outages);
}

int atc_replay_run(const struct atc_config *cfg, const struct atc_trace *trace, const char *entry,
                   const char *name, const struct atc_replay_options *o, struct atc_replay_result *out,
                   char **err)
{
    struct replay rp = {.trace = trace, .o = o, .res = out};
    double started = (double)atc_mono_ns() / 1e9;
    *err = NULL;
    memset(out, 0, sizeof(*out));
    rp.n = o->limit && o->limit < trace->n ? o->limit : trace->n;
    rp.rng = o->seed ? o->seed : 1;
    rp.seed_around = rp.rng * 0xD1B54A32D192ED03ull;
    out->name = strdup(name);
    out->entry = strdup(entry != NULL ? entry : "(built-in balancer)");
    out->requests = rp.n;
    out->ttft_ms = malloc((rp.n ? rp.n : 1) * sizeof(double));
    out->e2e_ms = malloc((rp.n ? rp.n : 1) * sizeof(double));
    out->itl_ms = malloc((rp.n ? rp.n : 1) * sizeof(double));
    out->endpoint = malloc((rp.n ? rp.n : 1) * sizeof(int));
    rp.reqs = calloc(rp.n ? rp.n : 1, sizeof(*rp.reqs));
    rp.queue = malloc((rp.n ? rp.n : 1) * sizeof(size_t));
    rp.waits = malloc((rp.n ? rp.n : 1) * sizeof(double));
    rp.affinity = atc_affinity_create(0);
    rp.prefix = atc_prefix_index_create(0);
    if (out->name == NULL || out->entry == NULL || out->ttft_ms == NULL || out->e2e_ms == NULL ||
        out->itl_ms == NULL || out->endpoint == NULL || rp.reqs == NULL || rp.queue == NULL ||
        rp.waits == NULL || rp.affinity == NULL || rp.prefix == NULL) {
        *err = strdup("out of memory");
        goto error;
    }
    for (size_t i = 0; i < rp.n; i++) {
        out->ttft_ms[i] = out->e2e_ms[i] = out->itl_ms[i] = NAN;
        out->endpoint[i] = -1;
    }
    if (build_fleet(&rp, cfg, err) < 0 || plan_outages(&rp, err) < 0)
        goto error;
    if (build_kv(&rp) < 0) {
        *err = strdup("out of memory");
        goto error;
    }
    mark_counted(&rp);
    if ((out->endpoints = calloc(rp.neps, sizeof(*out->endpoints))) == NULL) {
        *err = strdup("out of memory");
        goto error;
    }
    out->nendpoints = rp.neps;
    for (size_t k = 0; k < rp.neps; k++)
        out->endpoints[k].id = strdup(rp.eps[k].ep->id);

    uint64_t budget_us = o->budget_us ? o->budget_us : cfg->policy.budget_us;
    rp.budget_ns = budget_us * 1000;
    struct atc_policy_settings ps = {
        .entry = entry,
        .path = o->nmodule_path ? o->module_path : (const char *const *)cfg->policy.path,
        .npath = o->nmodule_path ? o->nmodule_path : cfg->policy.npath,
        .stdlib_dir = atc_policy_stdlib_dir(),
        .budget_us = budget_us * KILL_FACTOR > KILL_MIN_US ? budget_us * KILL_FACTOR : KILL_MIN_US,
        .now_ms = virtual_now_ms,
        .now_ctx = &rp,
        .seed = o->seed ? o->seed : 1,
        .memory = cfg->policy.memory,
        .jit = cfg->policy.jit,
        .log = o->log,
        .log_ctx = o->log_ctx,
    };
    char *perr = NULL;
    rp.oracle = entry != NULL && strcmp(entry, ATC_REPLAY_ORACLE) == 0;
    if (entry != NULL && !rp.oracle &&
        (rp.rt = atc_policy_runtime_create(&ps, rp.table, rp.affinity, rp.prefix, &perr)) == NULL) {
        if (asprintf(err, "policy %s: %s", name, perr != NULL ? perr : "cannot load") < 0)
            *err = NULL;
        free(perr);
        goto error;
    }

    loop(&rp, name);

    /* Requests still queued when nothing was left to free capacity never ran. */
    out->unserved = rp.qlen;
    summarize(&rp);
    out->wall_s = (double)atc_mono_ns() / 1e9 - started;
    replay_dispose(&rp);
    return 0;
error:
    replay_dispose(&rp);
    atc_replay_result_dispose(out);
    return -1;
}

void atc_replay_result_dispose(struct atc_replay_result *r)
{
    free(r->name);
    free(r->entry);
    free(r->ttft_ms);
    free(r->e2e_ms);
    free(r->itl_ms);
    free(r->endpoint);
    for (size_t k = 0; k < r->nendpoints; k++)
        free(r->endpoints[k].id);
    free(r->endpoints);
    free(r->sample_s);
    free(r->sample_inflight);
    for (size_t k = 0; k < r->ntenants; k++)
        free(r->tenants[k].name);
    free(r->tenants);
    for (size_t k = 0; k < r->npriorities; k++)
        free(r->priorities[k].name);
    free(r->priorities);
    memset(r, 0, sizeof(*r));
}
