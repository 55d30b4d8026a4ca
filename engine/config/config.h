#ifndef ATC_CONFIG_H
#define ATC_CONFIG_H

#define ATC_MAX_WORKERS 16        /* workers: at most; each holds a Lua state and a pool per endpoint */
#define ATC_RECORD_HEADERS_MAX 16 /* record.headers: names at most (trace.h's ATC_TRACE_HEADERS_MAX) */

/* The YAML configuration, parsed with libyaml into plain structs. The whole file is validated before
 * anything is applied; every error is reported as "file:line:col: message". */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "request/kv_keys.h" /* enum atc_kv_hash */
#include "config/signal_params.h"
#include "config/sim_params.h"

/* What atc does when every endpoint of a model is out (unhealthy or ejected; not draining or starting). */
enum atc_panic_mode {
    ATC_PANIC_ROUTE_ALL, /* "route_all": send traffic to all of them anyway (a check may be what is wrong) */
    ATC_PANIC_FAIL,      /* "fail": answer 503 */
};

/* One kind of active probe of an endpoint. */
struct atc_check_config {
    bool enabled;
    char *path;           /* request path, starting with '/' */
    uint64_t interval_ms; /* between the end of one probe and the start of the next, while settled up */
    uint64_t timeout_ms;  /* the whole probe: connect, answer and body */
};

/* health: at the top level, under a model and under an endpoint; each level starts from the one above
 * and overrides what it sets. Defaults in config_defaults.c (atc_config_new) and in docs/operating.md. */
struct atc_health_config {
    bool enabled;                   /* active checks (live, ready, deep) at all */
    struct atc_check_config live;   /* is the process answering: GET /health */
    struct atc_check_config ready;  /* can it serve the model: GET /v1/models lists it */
    struct atc_check_config deep;   /* can it generate: a real request with max_tokens 1 */
    struct atc_check_config scrape; /* server load: GET /metrics (Prometheus text) */
    unsigned failure_threshold;     /* consecutive failures that turn a check's verdict to failed */
    unsigned recovery_threshold;    /* consecutive successes that turn it back */
    uint64_t fast_interval_ms;      /* probe interval while a verdict is changing (or not known yet) */
    uint64_t down_interval_ms;      /* probe interval while a verdict is settled failed */
    double jitter;                  /* each wait is drawn in interval * [1 - jitter, 1 + jitter] */
    struct {
        unsigned consecutive_errors; /* passive: this many failed requests in a row eject; 0 = never */
        uint64_t base_time_ms;       /* first ejection; the n-th lasts n times as long ... */
        uint64_t max_time_ms;        /* ... up to this */
        double max_share;            /* model-wide: at most this share of a model's endpoints ejected */
    } eject;
    unsigned panic;            /* model-wide: enum atc_panic_mode */
    uint64_t slow_start_ms;    /* an endpoint back in rotation ramps up its capacity over this; 0 = off */
    uint64_t startup_grace_ms; /* until first healthy, for at most this long, a server that refuses
                                  connections (or says it is loading) is "starting"; 0 = off. The
                                  engine's profile sets the default (config/engine_profile.h) */
    unsigned set; /* ATC_HEALTH_SET_*: what the file set at this level or above (a profile leaves it) */
};

/* The settings of struct atc_health_config that an engine profile has defaults for. */
enum {
    ATC_HEALTH_SET_LIVE_PATH = 1u << 0,
    ATC_HEALTH_SET_LIVE_TIMEOUT = 1u << 1,
    ATC_HEALTH_SET_READY_PATH = 1u << 2,
    ATC_HEALTH_SET_STARTUP_GRACE = 1u << 3,
};

/* How atc speaks to a server: on a model (its endpoints inherit) or on an endpoint. */
struct atc_upstream_access {
    unsigned engine;            /* engine: an enum atc_engine (config/engine_profile.h); default openai */
    bool engine_set;            /* engine: was written at this level or above */
    char *api_key;              /* from api_key_env / api_key_file: sent as "Authorization: Bearer <it>"
                                   to this server; NULL = none. A secret: never printed anywhere */
    char *api_key_source;       /* "env NAME" or "file PATH" (what reports may show), NULL = none */
    bool forward_authorization; /* forward_authorization: the client's Authorization header goes to the
                                   server (when atc has no key of its own for it) */
};

/* kv_events: on a model (every endpoint's starting point) or an endpoint: the engine's KV-cache event
 * publisher (vLLM's --kv-events-config, publisher zmq), read by fleet/kv_events.c into the exact index. */
struct atc_kv_events_config {
    char *endpoint;        /* its PUB socket, tcp://host:port or ipc://path; NULL: no subscriber */
    char *replay_endpoint; /* its ROUTER replay socket; NULL: a sequence gap clears the endpoint's entries */
    char *topic;           /* subscription prefix; NULL: every topic */
    unsigned hash;         /* enum atc_kv_hash: how the engine chains block keys (default sha256_cbor) */
    unsigned block_size;   /* tokens per block (default 16) */
    uint64_t seed;         /* the engine's PYTHONHASHSEED (default 0) */
    uint64_t max_blocks;   /* the exact index's cap for this endpoint, both tiers (default 65536) */
    /* tokenize: true: before a decision, the request's token ids from the engine's POST /tokenize become
     * block keys with hash, block_size and seed (proxy/tokenize.h); false (the default): the keys are
     * atc's prompt-text hashes (atc sim's stand-in without --kv-events-hash) */
    bool tokenize;
    uint64_t tokenize_timeout_ms; /* the budget of that call; past it the decision guesses (default 20) */
    size_t tokenize_min_bytes;    /* prompts (raw JSON) below this are not tokenized (default 2048) */
};

struct atc_weights {
    char **names;
    unsigned *weights;
    size_t n;
};

/* A tenant's budget per minute (limits:); 0: that kind is not limited. */
struct atc_limit_rule {
    uint64_t requests_per_minute;
    uint64_t tokens_per_minute; /* prompt estimate + max_tokens at admission, corrected by the usage */
};

/* from: / until: of an endpoint or a simulate: entry: when, in a replay's virtual time (from the trace's
 * first request), the server is in the fleet (trace/replay.h). atc serve ignores them and says so. */
struct atc_window {
    uint64_t from_ms;  /* joins then (0: from the start) */
    uint64_t until_ms; /* leaves then: its requests in flight finish, no new ones (0: never) */
};

struct atc_endpoint_config {
    char *id;
    char *url;     /* as written: http://host:port */
    char *host;    /* parsed from url */
    uint16_t port; /* parsed from url (default 80) */
    char *model;   /* the name of the model entry it is listed under */
    char *version; /* optional, NULL if absent */
    char **tags;   /* optional */
    size_t ntags;
    unsigned capacity;               /* max concurrent requests (default 64, must be > 0) */
    unsigned weight;                 /* default 1 */
    struct atc_health_config health; /* the model's, overridden by this endpoint's health: */
    uint64_t token_budget;           /* max prompt + max_tokens in flight; 0 = no limit */
    unsigned max_server_queue; /* full while its scraped queue (requests waiting) reaches this; 0 = ignore */
    uint64_t kv_tokens; /* the server's KV cache in tokens; 0 = read from its /metrics (when scraped) */
    struct atc_upstream_access access; /* the model's, overridden by this endpoint's */
    struct atc_kv_events_config kv_events; /* the model's, overridden by this endpoint's kv_events: */
    unsigned origin; /* enum atc_endpoint_origin: where it came from (config_endpoint.c) */
    unsigned role;           /* role: an enum atc_role (config/roles.h), default both */
    unsigned bootstrap_port; /* bootstrap_port: SGLang's bootstrap server of a prefill endpoint (8998) */
    struct atc_window window; /* from: / until: (replay only) */
};

/* discover: on a model: its endpoints are the A/AAAA records of a name, or the targets of its SRV records
 * (core/discovery.h). One of dns and srv is set. */
struct atc_discover_config {
    char *dns;            /* the name resolved; NULL without discover: or with srv: */
    char *srv;            /* the name whose SRV records are asked; NULL without discover: or with dns: */
    unsigned port;        /* dns: the servers' port (A records carry none); 0 with srv: (its records do) */
    uint64_t interval_ms; /* between resolutions; 0: the default, 5s */
    char *resolver;       /* resolver: host:port, its host; NULL: the system's (/etc/resolv.conf) */
    uint16_t rport;       /* and its port */
};

struct atc_model_config {
    char *name;
    struct atc_endpoint_config *endpoints; /* may be empty when simulate: or discover: provides them */
    size_t nendpoints;
    struct atc_health_config health;   /* the top level's, overridden by this model's health: */
    struct atc_upstream_access access; /* engine, api key, forward_authorization for its endpoints */
    struct atc_kv_events_config kv_events; /* kv_events: defaults for its endpoints */
    struct atc_discover_config discover;   /* discover: (dns and srv NULL without) */
    unsigned disaggregation;             /* disaggregation: an enum atc_disaggregation (roles.h); none */
    unsigned disagg_line, disagg_column; /* where disaggregation: is written, from 1, for atc check */
};

struct atc_simulate_config {
    struct atc_sim_params params; /* params.model is the model entry it adds endpoints to */
    unsigned count;               /* how many simulated servers (default 1) */
    unsigned capacity;            /* capacity of each resulting endpoint (default: params.max_seqs) */
    unsigned engine; /* the profile of its endpoints, an enum atc_engine: its model's engine:, else the
                        engine: of the model's simulate entries (params.engine), else openai */
    struct atc_window window; /* from: / until: of each of its servers (replay only) */
};

struct atc_config {
    char *path;        /* the file it was read from */
    char *dir;         /* its directory: relative paths in the file are relative to it */
    char *listen_host; /* listen: (default 127.0.0.1:8080) */
    uint16_t listen_port;
    char *admin_host; /* admin: (default 127.0.0.1:8081); port 0 means pick a free one */
    uint16_t admin_port;

    struct {
        char *entry; /* policy.entry, resolved against dir (default scripts/policy.lua) */
        unsigned entry_line, entry_column; /* where policy.entry (else policy:) is written, from 1 */
        char **path;                       /* policy.path: extra module directories, resolved against dir */
        size_t npath;
        uint64_t budget_us; /* policy.budget (default 1ms) */
        size_t memory;      /* policy.memory in bytes (default 64 MiB) */
        bool jit;           /* policy.jit (default false) */
        bool watch;         /* policy.watch: reload when a .lua file changes (default true) */
        bool explain;       /* policy.explain: a client's x-atc-explain: 1 gets the decision record */
        char *shadow_entry; /* policy.shadow.entry: a candidate run beside the live policy (NULL: none) */
        double shadow_sample; /* policy.shadow.sample: share of decisions it sees (default 1) */
        /* policy.canary: how far a canary may be from the current version and still be promoted */
        struct {
            double error_rate, fallback_rate, overrun_rate; /* absolute, above the current's (0.01) */
            double ttft_p90;  /* ratio to the current's TTFT p90 (1.25) */
            unsigned min_requests; /* fewer canary requests in the window: rolled back (default 20) */
        } canary;
        bool enabled;       /* the file has a policy: section; without one the C balancer routes */
        unsigned
            rollback_after; /* policy.rollback_after: consecutive failures of a new version (default 20) */
    } policy;

    struct {
        uint64_t connect_timeout_ms;    /* upstream.connect_timeout (default 2s) */
        uint64_t first_byte_timeout_ms; /* upstream.first_byte_timeout (default 60s) */
        uint64_t idle_timeout_ms;       /* upstream.idle_timeout: max gap between bytes (default 60s) */
        uint64_t token_timeout_ms; /* upstream.token_timeout: a whole answer's extra wait per token (100ms) */
        unsigned tries;                 /* upstream.tries: attempts per request incl. the first (default 2) */
        unsigned keepalive; /* upstream.keepalive: idle connections kept per endpoint (default 32) */
    } upstream;

    struct {
        unsigned queue;       /* admission.queue: waiting requests per model (default 1024; 0: 503 at once) */
        uint64_t deadline_ms; /* admission.deadline: default wait (default 30s) */
        uint64_t max_deadline_ms; /* admission.max_deadline: the most x-atc-deadline may ask (default 120s) */
        uint64_t aging_ms; /* admission.aging: one priority level per this much waiting (default 10s) */
        struct atc_weights tenant_weights; /* admission.tenant_weights: {tenant: weight}, others 1 */
    } admission;

    char *admin_token; /* admin_token: when set, the admin API needs "Authorization: Bearer <it>" */
    char *access_log;  /* access_log: a file (relative to dir) or "stderr"; NULL = off */

    struct {
        bool enabled;       /* the file has a record: section: live traffic is written to trace files */
        char *dir;          /* record.dir: where, resolved against dir (default traces) */
        char *prefix;       /* record.prefix: file names start with it (default atc; [A-Za-z0-9._-]) */
        size_t rotate_size; /* record.rotate_size: a new file past this size (default 256 MiB) */
        uint64_t rotate_interval_ms; /* record.rotate_interval: ... or after this long (default 1h) */
        bool text;      /* record.text: store prompt text too (default false: block hashes only) */
        size_t buffer;  /* record.buffer: records not yet written past this are dropped (default 8 MiB) */
        double sample;  /* record.sample: share of requests recorded, 0..1 (default 1) */
        char **headers; /* record.headers: request headers stored in each record (at most 16 names) */
        size_t nheaders;
    } record;

    size_t max_body;            /* max_body: request body limit (default 8 MiB) */
    uint64_t drain_timeout_ms;  /* drain_timeout: on SIGTERM, how long in-flight requests may finish (default
                                   10s) */
    uint64_t client_timeout_ms; /* client_timeout: reading a request from a client (default 30s) */
    unsigned workers;           /* workers: threads serving clients (default: one per core, at most 16) */
    unsigned max_connections;   /* max_connections: client connections open at once on the front port, all
                                   workers together (default: half of RLIMIT_NOFILE, less 16) */

    struct atc_health_config health;  /* health: the top-level settings */
    struct atc_signal_params signals; /* signals: priors of the routing signals (config/signal_params.h) */

    struct {
        bool enabled;      /* the file has a cluster: section: replicas share state through Redis */
        char *redis;       /* cluster.redis: redis://host:port/db (required) */
        char *host;        /* parsed from it */
        uint16_t port;     /* (default 6379) */
        unsigned db;       /* (default 0) */
        char *name;        /* cluster.name: this replica's name (default hostname:pid) */
        uint64_t sync_interval_ms; /* cluster.sync_interval (default 50ms) */
    } cluster;

    struct {
        bool enabled;                /* the file has a limits: section */
        char **tenants;              /* limits.tenants: names ... */
        struct atc_limit_rule *rules; /* ... and their budgets */
        size_t ntenants;
        struct atc_limit_rule dflt;  /* limits.default: every other tenant's (0, 0: unlimited) */
    } limits;

    struct atc_model_config *models;
    size_t nmodels;
    struct atc_simulate_config *simulate;
    size_t nsimulate;
};

/** Reads and validates @p path. Returns 0 and an owned config in *out, or -1 and an owned,
 * newline-separated list of every error ("file:line:col: message") in *errors. */
int atc_config_load(const char *path, struct atc_config **out, char **errors);
/** Same, but an invalid file's config, as far as it was read, is in *out too (owned; NULL when the file
 * could not be read or parsed): `atc check` checks its policy as well. Fields may be NULL or defaults. */
int atc_config_load_partial(const char *path, struct atc_config **out, char **errors);

/** Same, from a buffer; @p name is used in error messages and @p dir to resolve relative paths. */
int atc_config_parse(const char *text, size_t len, const char *name, const char *dir, struct atc_config **out,
                     char **errors);
/** Same, keeping an invalid buffer's config as atc_config_load_partial does. */
int atc_config_parse_partial(const char *text, size_t len, const char *name, const char *dir,
                             struct atc_config **out, char **errors);

/** A config read from file @p name in @p dir (relative paths resolve against it) with every setting at
 * its default, before the file is read (config_defaults.c). Owned, or NULL when out of memory. */
struct atc_config *atc_config_new(const char *name, const char *dir);

/** *dst = *src with its own copies of the strings (config_defaults.c). 0, or -1 when out of memory
 * (then dst owns what was copied: free it as part of its config). */
int atc_health_config_copy(struct atc_health_config *dst, const struct atc_health_config *src);
int atc_upstream_access_copy(struct atc_upstream_access *dst, const struct atc_upstream_access *src);

/** Sets the settings of @p h that the profile of @p engine (config/engine_profile.h) has defaults for
 * and the file does not set (its `set` bits): the profile's value, else @p top's (the top level
 * health:, atc's default where the file does not set it). 0, or -1 when out of memory. */
int atc_health_config_apply_engine(struct atc_health_config *h, const struct atc_health_config *top,
                                   unsigned engine);
/** The servers of a simulate: entry of engine @p sim (enum atc_sim_engine) are checked as that engine
 * unless model @p m names one: health reads a simulated endpoint's profile from its model (fleet/health.c
 * config_for), so @p m takes the profile and its health defaults over @p top (its own endpoints, read
 * before, keep theirs). Returns 0, 1 when another entry gave @p m another engine (nothing changes: the
 * model must name one), -1 out of memory. */
int atc_model_config_take_sim_engine(struct atc_model_config *m, const struct atc_health_config *top,
                                     unsigned sim);

/** Frees what @p ec owns (config_defaults.c), not @p ec itself. */
void atc_endpoint_config_dispose(struct atc_endpoint_config *ec);
/** The model called @p name in @p cfg, or NULL (config_defaults.c, as the two below). */
struct atc_model_config *atc_config_model(const struct atc_config *cfg, const char *name);
/** Whether a simulate: entry of @p cfg adds servers to model @p name. */
bool atc_config_simulated(const struct atc_config *cfg, const char *name);
/** Whether a stage of @p m (disaggregated: config/roles.h) has no server: its endpoints' roles and those of
 * the simulate: entries of @p cfg for it, "both" counting for either. Returns the missing role's name
 * ("prefill" or "decode"), or NULL when both have one (or @p m is not disaggregated). */
const char *atc_roles_missing(const struct atc_config *cfg, const struct atc_model_config *m);

/** Frees a config returned by the functions above (config_defaults.c); NULL is fine. */
void atc_config_free(struct atc_config *cfg);
#endif
