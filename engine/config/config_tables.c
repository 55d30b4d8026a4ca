/* The config file's schema: the tables config_keys.h declares (a file of its own, not of that header's
 * stem, because the tables need config.h's structs and config.c walks them). */

#include "config/config_keys.h"

#include <limits.h>
#include <stddef.h>

#include "config/config.h"
#include "config/engine_profile.h"
#include "config/roles.h"

/* Per-endpoint ceilings: far above any real server, low enough that sums over a fleet cannot overflow. */
#define CAPACITY_MAX 1000000u
#define WEIGHT_MAX 1000000u
#define SIMULATE_COUNT_MAX 1024u /* the prefix index is exact up to ATC_PREFIX_INDEX_ENDPOINTS_MAX */

#define CFG(m) offsetof(struct atc_config, m)
#define MODEL(m) offsetof(struct atc_model_config, m)
#define EP(m) offsetof(struct atc_endpoint_config, m)
#define SIM(m) offsetof(struct atc_simulate_config, m)
#define HC(m) offsetof(struct atc_health_config, m)

static const struct field shadow_fields[] = {
    {.key = "entry", .kind = F_PATH, .off = CFG(policy.shadow_entry)},
    {.key = "sample", .kind = F_SHARE, .off = CFG(policy.shadow_sample)},
    {.key = NULL},
};

static const struct field canary_fields[] = {
    {.key = "error_rate", .kind = F_SHARE, .off = CFG(policy.canary.error_rate)},
    {.key = "fallback_rate", .kind = F_SHARE, .off = CFG(policy.canary.fallback_rate)},
    {.key = "overrun_rate", .kind = F_SHARE, .off = CFG(policy.canary.overrun_rate)},
    {.key = "ttft_p90", .kind = F_POSITIVE, .off = CFG(policy.canary.ttft_p90)},
    {.key = "min_requests", .kind = F_UINT, .off = CFG(policy.canary.min_requests), .max = 1000000},
    {.key = NULL},
};

static const struct field policy_fields[] = {
    {.key = "entry", .kind = F_PATH, .off = CFG(policy.entry)},
    {.key = "path", .kind = F_PATHS, .off = CFG(policy.path), .aux = CFG(policy.npath)},
    {.key = "budget", .kind = F_US, .off = CFG(policy.budget_us), .min = 1},
    {.key = "memory", .kind = F_SIZE, .off = CFG(policy.memory)},
    {.key = "jit", .kind = F_BOOL, .off = CFG(policy.jit)},
    {.key = "rollback_after", .kind = F_UINT, .off = CFG(policy.rollback_after), .max = 1000000},
    {.key = "watch", .kind = F_BOOL, .off = CFG(policy.watch)},
    {.key = "explain", .kind = F_BOOL, .off = CFG(policy.explain)},
    {.key = "shadow", .kind = F_SECTION, .sub = shadow_fields},
    {.key = "canary", .kind = F_SECTION, .sub = canary_fields},
    {.key = NULL},
};

static const struct field upstream_fields[] = {
    {.key = "connect_timeout", .kind = F_MS, .off = CFG(upstream.connect_timeout_ms), .min = 1},
    {.key = "first_byte_timeout", .kind = F_MS, .off = CFG(upstream.first_byte_timeout_ms), .min = 1},
    {.key = "idle_timeout", .kind = F_MS, .off = CFG(upstream.idle_timeout_ms), .min = 1},
    {.key = "token_timeout", .kind = F_MS, .off = CFG(upstream.token_timeout_ms)},
    {.key = "tries", .kind = F_UINT, .off = CFG(upstream.tries), .min = 1, .max = 100},
    {.key = "keepalive", .kind = F_UINT, .off = CFG(upstream.keepalive), .max = 100000},
    {.key = NULL},
};

/* health: the same table at the top level, under a model and under an endpoint (parse_health). */
#define CHECK_FIELDS(c)                                                                                      \
    {.key = "enabled", .kind = F_BOOL, .off = HC(c.enabled)},                                                \
        {.key = "path", .kind = F_URLPATH, .off = HC(c.path)},                                               \
        {.key = "interval", .kind = F_MS, .off = HC(c.interval_ms), .min = 1},                               \
        {.key = "timeout", .kind = F_MS, .off = HC(c.timeout_ms), .min = 1},

static const struct field live_fields[] = {CHECK_FIELDS(live){.key = NULL}};
static const struct field ready_fields[] = {CHECK_FIELDS(ready){.key = NULL}};
static const struct field deep_fields[] = {CHECK_FIELDS(deep){.key = NULL}};
static const struct field scrape_fields[] = {CHECK_FIELDS(scrape){.key = NULL}};

static const struct field eject_fields[] = {
    {.key = "consecutive_errors", .kind = F_UINT, .off = HC(eject.consecutive_errors), .max = 1000},
    {.key = "base_time", .kind = F_MS, .off = HC(eject.base_time_ms), .min = 1},
    {.key = "max_time", .kind = F_MS, .off = HC(eject.max_time_ms), .min = 1},
    {.key = "max_share", .kind = F_SHARE, .off = HC(eject.max_share), .model_wide = true},
    {.key = NULL},
};

static const char *const panic_modes[] = {"route_all", "fail", NULL};

const struct field atc_config_health_fields[] = {
    {.key = "enabled", .kind = F_BOOL, .off = HC(enabled)},
    {.key = "live", .kind = F_SECTION, .sub = live_fields},
    {.key = "ready", .kind = F_SECTION, .sub = ready_fields},
    {.key = "deep", .kind = F_SECTION, .sub = deep_fields},
    {.key = "scrape", .kind = F_SECTION, .sub = scrape_fields},
    {.key = "failure_threshold", .kind = F_UINT, .off = HC(failure_threshold), .min = 1, .max = 100},
    {.key = "recovery_threshold", .kind = F_UINT, .off = HC(recovery_threshold), .min = 1, .max = 100},
    {.key = "fast_interval", .kind = F_MS, .off = HC(fast_interval_ms), .min = 1},
    {.key = "down_interval", .kind = F_MS, .off = HC(down_interval_ms), .min = 1},
    {.key = "jitter", .kind = F_SHARE, .off = HC(jitter)},
    {.key = "eject", .kind = F_SECTION, .sub = eject_fields},
    {.key = "panic", .kind = F_CHOICE, .off = HC(panic), .choices = panic_modes, .model_wide = true},
    {.key = "slow_start", .kind = F_MS, .off = HC(slow_start_ms)},
    {.key = "startup_grace", .kind = F_MS, .off = HC(startup_grace_ms)},
    {.key = NULL},
};

const struct field atc_config_record_fields[] = {
    {.key = "dir", .kind = F_PATH, .off = CFG(record.dir)},
    {.key = "prefix", .kind = F_STR, .off = CFG(record.prefix)},
    {.key = "rotate_size", .kind = F_SIZE, .off = CFG(record.rotate_size)},
    {.key = "rotate_interval", .kind = F_MS, .off = CFG(record.rotate_interval_ms), .min = 1},
    {.key = "text", .kind = F_BOOL, .off = CFG(record.text)},
    {.key = "buffer", .kind = F_SIZE, .off = CFG(record.buffer)},
    {.key = "sample", .kind = F_SHARE, .off = CFG(record.sample)},
    {.key = "headers", .kind = F_STRS, .off = CFG(record.headers), .aux = CFG(record.nheaders)},
    {.key = NULL},
};

static const struct field admission_fields[] = {
    {.key = "queue", .kind = F_UINT, .off = CFG(admission.queue), .max = 1000000},
    {.key = "deadline", .kind = F_MS, .off = CFG(admission.deadline_ms), .min = 1},
    {.key = "max_deadline", .kind = F_MS, .off = CFG(admission.max_deadline_ms), .min = 1},
    {.key = "aging", .kind = F_MS, .off = CFG(admission.aging_ms)},
    {.key = "tenant_weights", .kind = F_WEIGHTS, .off = CFG(admission.tenant_weights)},
    {.key = NULL},
};

static const struct field signals_fields[] = {
    {.key = "prefill_rate", .kind = F_POSITIVE, .off = CFG(signals.prefill_tps)},
    {.key = "itl", .kind = F_US, .off = CFG(signals.itl_us), .min = 1},
    {.key = "recent_half_life", .kind = F_MS, .off = CFG(signals.recent_half_life_ms), .min = 1},
    {.key = NULL},
};

const struct field atc_config_cluster_fields[] = {
    {.key = "redis", .kind = F_STR, .off = CFG(cluster.redis), .required = true},
    {.key = "name", .kind = F_STR, .off = CFG(cluster.name)},
    {.key = "sync_interval", .kind = F_MS, .off = CFG(cluster.sync_interval_ms), .min = 1},
    {.key = NULL},
};

#define LIM(m) offsetof(struct atc_limit_rule, m)
const struct field atc_config_rule_fields[] = {
    {.key = "requests_per_minute", .kind = F_U64, .off = LIM(requests_per_minute), .max = UINT32_MAX},
    {.key = "tokens_per_minute", .kind = F_U64, .off = LIM(tokens_per_minute), .max = UINT32_MAX * 1024ull},
    {.key = NULL},
};
const struct field atc_config_limits_fields[] = {
    {.key = "tenants", .kind = F_NODE}, {.key = "default", .kind = F_NODE}, {.key = NULL}};

const struct field atc_config_root_fields[] = {
    {.key = "listen", .kind = F_HOSTPORT, .off = CFG(listen_host), .aux = CFG(listen_port)},
    {.key = "admin", .kind = F_HOSTPORT, .off = CFG(admin_host), .aux = CFG(admin_port)},
    {.key = "policy", .kind = F_SECTION, .sub = policy_fields},
    {.key = "upstream", .kind = F_SECTION, .sub = upstream_fields},
    {.key = "admission", .kind = F_SECTION, .sub = admission_fields},
    {.key = "signals", .kind = F_SECTION, .sub = signals_fields},
    {.key = "max_body", .kind = F_SIZE, .off = CFG(max_body)},
    {.key = "drain_timeout", .kind = F_MS, .off = CFG(drain_timeout_ms)},
    {.key = "access_log", .kind = F_STR, .off = CFG(access_log)},
    {.key = "admin_token", .kind = F_STR, .off = CFG(admin_token)},
    {.key = "client_timeout", .kind = F_MS, .off = CFG(client_timeout_ms), .min = 1},
    {.key = "workers", .kind = F_UINT, .off = CFG(workers), .min = 1, .max = ATC_MAX_WORKERS},
    {.key = "max_connections", .kind = F_UINT, .off = CFG(max_connections), .min = 1, .max = 1u << 24},
    {.key = "health", .kind = F_NODE},
    {.key = "models", .kind = F_NODE},
    {.key = "simulate", .kind = F_NODE},
    {.key = "record", .kind = F_NODE},
    {.key = "cluster", .kind = F_NODE},
    {.key = "limits", .kind = F_NODE},
    {.key = NULL},
};

/* engine:, api_key_env:, api_key_file:, forward_authorization: on a model and on an endpoint. */
#define ACCESS_FIELDS(at)                                                                                    \
    {.key = "engine", .kind = F_CHOICE, .off = at(access.engine), .choices = atc_engine_names},              \
        {.key = "api_key_env", .kind = F_NODE}, {.key = "api_key_file", .kind = F_NODE},                     \
        {.key = "forward_authorization", .kind = F_BOOL, .off = at(access.forward_authorization)},
static const char *const kv_hashes[] = {"sha256_cbor", "xxhash_cbor", "sglang", NULL};
#define KV_FIELDS(at)                                                                                        \
    {.key = "endpoint", .kind = F_STR, .off = at(kv_events.endpoint)},                                       \
        {.key = "replay_endpoint", .kind = F_STR, .off = at(kv_events.replay_endpoint)},                     \
        {.key = "topic", .kind = F_STR, .off = at(kv_events.topic)},                                         \
        {.key = "hash", .kind = F_CHOICE, .off = at(kv_events.hash), .choices = kv_hashes},                  \
        {.key = "block_size", .kind = F_UINT, .off = at(kv_events.block_size), .min = 1, .max = 65536},      \
        {.key = "seed", .kind = F_U64, .off = at(kv_events.seed), .max = UINT64_MAX},                        \
        {.key = "max_blocks", .kind = F_U64, .off = at(kv_events.max_blocks), .min = 1, .max = 1u << 26},    \
        {.key = "tokenize", .kind = F_BOOL, .off = at(kv_events.tokenize)},                                  \
        {.key = "tokenize_timeout", .kind = F_MS, .off = at(kv_events.tokenize_timeout_ms), .min = 1},       \
        {.key = "tokenize_min_bytes", .kind = F_SIZE, .off = at(kv_events.tokenize_min_bytes)},
#define WINDOW_FIELDS(at)                                                                                    \
    {.key = "from", .kind = F_MS, .off = at(window.from_ms)},                                                \
        {.key = "until", .kind = F_MS, .off = at(window.until_ms), .min = 1},
static const struct field model_kv_fields[] = {KV_FIELDS(MODEL){.key = NULL}};
static const struct field endpoint_kv_fields[] = {KV_FIELDS(EP){.key = NULL}};

static const struct field discover_fields[] = {
    {.key = "dns", .kind = F_STR, .off = MODEL(discover.dns)},
    {.key = "srv", .kind = F_STR, .off = MODEL(discover.srv)},
    {.key = "port", .kind = F_UINT, .off = MODEL(discover.port), .min = 1, .max = 65535},
    {.key = "interval", .kind = F_MS, .off = MODEL(discover.interval_ms), .min = 1},
    {.key = "resolver", .kind = F_HOSTPORT, .off = MODEL(discover.resolver), .aux = MODEL(discover.rport)},
    {.key = NULL},
};
const struct field atc_config_model_fields[] = {
    {.key = "name", .kind = F_STR, .off = MODEL(name), .required = true},
    {.key = "endpoints", .kind = F_NODE},
    {.key = "discover", .kind = F_SECTION, .sub = discover_fields},
    {.key = "health", .kind = F_NODE},
    ACCESS_FIELDS(MODEL){.key = "kv_events", .kind = F_SECTION, .sub = model_kv_fields},
    {.key = "disaggregation", .kind = F_CHOICE, .off = MODEL(disaggregation), .choices = atc_disagg_names},
    {.key = NULL},
};

const struct field atc_config_endpoint_fields[] = {
    {.key = "id", .kind = F_STR, .off = EP(id), .required = true},
    {.key = "url", .kind = F_URL, .required = true},
    {.key = "capacity", .kind = F_UINT, .off = EP(capacity), .min = 1, .max = CAPACITY_MAX},
    {.key = "weight", .kind = F_UINT, .off = EP(weight), .min = 1, .max = WEIGHT_MAX},
    {.key = "token_budget", .kind = F_U64, .off = EP(token_budget), .max = UINT64_MAX},
    {.key = "max_server_queue", .kind = F_UINT, .off = EP(max_server_queue), .max = 1000000},
    {.key = "kv_tokens", .kind = F_U64, .off = EP(kv_tokens), .max = UINT64_C(1000000000000)},
    {.key = "version", .kind = F_OPTSTR, .off = EP(version)},
    {.key = "tags", .kind = F_STRS, .off = EP(tags), .aux = EP(ntags)},
    {.key = "health", .kind = F_NODE},
    ACCESS_FIELDS(EP){.key = "kv_events", .kind = F_SECTION, .sub = endpoint_kv_fields},
    {.key = "role", .kind = F_CHOICE, .off = EP(role), .choices = atc_role_names},
    {.key = "bootstrap_port", .kind = F_UINT, .off = EP(bootstrap_port), .min = 1, .max = 65535},
    WINDOW_FIELDS(EP){.key = NULL},
};

const struct field atc_config_simulate_fields[] = {
    {.key = "model", .kind = F_STR, .off = SIM(params.model), .required = true},
    {.key = "count", .kind = F_UINT, .off = SIM(count), .min = 1, .max = SIMULATE_COUNT_MAX},
    {.key = "capacity", .kind = F_UINT, .off = SIM(capacity), .min = 1, .max = CAPACITY_MAX},
    {.key = "max_seqs", .kind = F_UINT, .off = SIM(params.max_seqs), .min = 1, .max = CAPACITY_MAX},
    {.key = "prefill_tps", .kind = F_POSITIVE, .off = SIM(params.prefill_tps)},
    {.key = "decode_ms", .kind = F_NONNEG, .off = SIM(params.decode_ms)},
    {.key = "kv_blocks", .kind = F_UINT, .off = SIM(params.kv_blocks), .min = 1, .max = UINT_MAX},
    {.key = "error_rate", .kind = F_SHARE, .off = SIM(params.error_rate)},
    {.key = "hang_rate", .kind = F_SHARE, .off = SIM(params.hang_rate)},
    {.key = "not_ready_for", .kind = F_MS, .off = SIM(params.not_ready_for_ms)},
    {.key = "die_after", .kind = F_UINT, .off = SIM(params.die_after), .max = UINT_MAX},
    {.key = "seed", .kind = F_U64, .off = SIM(params.seed), .max = UINT64_MAX},
    {.key = "decode_batch_factor", .kind = F_POSITIVE, .off = SIM(params.decode_batch_factor)},
    {.key = "decode_batch_sat",
     .kind = F_UINT,
     .off = SIM(params.decode_batch_sat),
     .min = 1,
     .max = CAPACITY_MAX},
    {.key = "max_batched_tokens",
     .kind = F_UINT,
     .off = SIM(params.max_batched_tokens),
     .min = 1,
     .max = UINT_MAX},
    {.key = "output_min", .kind = F_UINT, .off = SIM(params.output_min), .min = 1, .max = UINT_MAX},
    {.key = "output_max", .kind = F_UINT, .off = SIM(params.output_max), .min = 1, .max = UINT_MAX},
    {.key = "max_model_len", .kind = F_UINT, .off = SIM(params.max_model_len), .min = 1, .max = UINT_MAX},
    {.key = "engine", .kind = F_CHOICE, .off = SIM(params.engine), .choices = atc_sim_engine_names},
    {.key = "api_key", .kind = F_STR, .off = SIM(params.api_key)},
    {.key = "kv_events", .kind = F_STR, .off = SIM(params.kv_events)},
    {.key = "max_concurrent", .kind = F_UINT, .off = SIM(params.max_concurrent), .min = 1, .max = UINT_MAX},
    {.key = "role", .kind = F_CHOICE, .off = SIM(params.role), .choices = atc_role_names},
    {.key = "kv_bytes_per_token", .kind = F_POSITIVE, .off = SIM(params.kv_bytes_per_token)},
    {.key = "transfer_gbps", .kind = F_POSITIVE, .off = SIM(params.transfer_gbps)},
    WINDOW_FIELDS(SIM){.key = NULL},
};
