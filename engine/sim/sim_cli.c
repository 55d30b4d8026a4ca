/* `atc sim`: one simulated server as a process of its own, its flags, and a ready file (sim_cli.h). */

#include "sim/sim_cli.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>

#include "config/config.h"
#include "config/roles.h"
#include "base/config_value.h"
#include "base/log.h"
#include "sim/sim.h"
#include "sim/sim_kv_publish.h"
#include "sim/sim_server.h"

/* ---- atc sim ---- */

static const char usage[] =
    "usage: atc sim [flags]\n"
    "A simulated OpenAI-compatible inference server (one model; vLLM's timing, HTTP face and metrics by\n"
    "default, or another engine's with --engine).\n"
    "\n"
    "  --listen HOST:PORT        where to listen (default 127.0.0.1:9001; port 0 = any free port)\n"
    "  --engine NAME             vllm, sglang, llamacpp or tgi: whose headers timing, loading behaviour,\n"
    "                            errors, /health and /metrics names it shows (default vllm)\n"
    "  --model NAME              the model name served and checked in requests (default llama-3-8b)\n"
    "  --api-key KEY             answer 401 without 'Authorization: Bearer KEY' on the paths the engine\n"
    "                            protects (vllm: /v1/*; sglang: all but /health*, /metrics; llamacpp: all\n"
    "                            but /, /health, /v1/health, /models, /v1/models; tgi: its inference "
    "routes)\n"
    "  --max-seqs N              sequences decoded at once; more wait (default 1024, vLLM's on an H100)\n"
    "  --max-concurrent N        requests held at once past which a new one gets 429 'overloaded' (default\n"
    "                            128 for tgi, as its --max-concurrent-requests; no limit for the others)\n"
    "  --prefill-tps N           prompt tokens prefilled per second (default 15000)\n"
    "  --decode-ms MS            ms per output token at batch size 1 (default 12)\n"
    "  --decode-batch-factor X   decode step at a full batch, in units of --decode-ms (default 2.2)\n"
    "  --decode-batch-sat N      batch size where the decode step stops growing (default 64)\n"
    "  --max-batched-tokens N    tokens per engine iteration; longer prompts are chunked (default 8192)\n"
    "  --kv-blocks N             KV cache size in 16-token blocks (default 25000 = 400k tokens)\n"
    "  --output-min N            output length drawn when a request has no max_tokens: from N ... (16)\n"
    "  --output-max N            ... to N tokens (512)\n"
    "  --max-model-len N         context length: a prompt plus max_tokens past it gets vLLM's 400 (131072)\n"
    "  --error-rate P            share of requests answered 500 (tgi: 424) (default 0)\n"
    "  --hang-rate P             share of requests accepted and never answered (default 0)\n"
    "  --not-ready-for DURATION  loading for this long after start (250ms, 2s): vllm, sglang and tgi\n"
    "                            refuse connections (the port is bound, not listening); llamacpp answers\n"
    "                            503 'Loading model' (default 0)\n"
    "  --die-after N             the request after the Nth is cut (a stream after half its tokens), then\n"
    "                            the server closes everything and exits with status 1 (default 0 = never)\n"
    "  --role ROLE               prefill, decode or both (default): a server of a disaggregated fleet,\n"
    "                            speaking the protocol of its --engine (vllm: NixlConnector's\n"
    "                            kv_transfer_params; sglang: bootstrap rooms); GET /sim/disagg lists what\n"
    "                            the last requests carried\n"
    "  --kv-bytes-per-token N    KV bytes a decode server reads per prompt token (default 131072)\n"
    "  --transfer-gbps X         the KV transfer's bandwidth in GB/s (default 25): a decode server waits\n"
    "                            kv-bytes-per-token x prompt tokens / bandwidth before it decodes\n"
    "  --seed N                  seed of every draw: output lengths, words, faults (default 1)\n"
    "  --kv-events ENDPOINT      publish KV-cache events there as vLLM does (ZMQ PUB, e.g.\n"
    "                            tcp://127.0.0.1:5557; port * = any free one): stored, removed, cleared\n"
    "  --kv-events-replay ENDPOINT  its replay socket (ZMQ ROUTER, e.g. tcp://127.0.0.1:5558)\n"
    "  --kv-events-drop N        leave batch N out of the live socket (kept for replays): a gap, for tests\n"
    "  --kv-events-hash HASH     publish keys chained from /tokenize's token ids (sha256_cbor, xxhash_cbor,\n"
    "                            sglang), as an engine does, instead of atc's prompt-text hashes\n"
    "  --tokenize-delay-ms N     answer POST /tokenize N ms late (a slow tokenizer, for tests)\n"
    "  --ready-file PATH         once the port is bound, write {\"listen\":\"HOST:PORT\"} to PATH\n"
    "                            (and \"kv_events\", \"kv_events_replay\": the bound ZMQ addresses)\n"
    "  --help                    this text\n"
    "\n"
    "SIGTERM or SIGINT stops it with status 0.\n";

/* Flags that set a field of struct atc_sim_params, parsed by kind. */
enum flag_kind { FLAG_NAME, FLAG_COUNT, FLAG_NUMBER, FLAG_SHARE, FLAG_DURATION, FLAG_U64, FLAG_ENGINE, FLAG_ROLE };

static const struct sim_flag {
    const char *name;
    enum flag_kind kind;
    size_t off; /* in struct atc_sim_params */
    double min; /* FLAG_COUNT, FLAG_NUMBER */
} flags[] = {
#define P(f) offsetof(struct atc_sim_params, f)
    {"model", FLAG_NAME, P(model), 0},
    {"engine", FLAG_ENGINE, P(engine), 0},
    {"api-key", FLAG_NAME, P(api_key), 0},
    {"kv-events", FLAG_NAME, P(kv_events), 0},
    {"kv-events-replay", FLAG_NAME, P(kv_events_replay), 0},
    {"kv-events-drop", FLAG_U64, P(kv_events_drop), 0},
    {"kv-events-hash", FLAG_NAME, P(kv_events_hash), 0},
    {"tokenize-delay-ms", FLAG_U64, P(tokenize_delay_ms), 0},
    {"max-seqs", FLAG_COUNT, P(max_seqs), 1},
    {"max-concurrent", FLAG_COUNT, P(max_concurrent), 1},
    {"prefill-tps", FLAG_NUMBER, P(prefill_tps), 1e-9},
    {"decode-ms", FLAG_NUMBER, P(decode_ms), 0},
    {"decode-batch-factor", FLAG_NUMBER, P(decode_batch_factor), 1},
    {"decode-batch-sat", FLAG_COUNT, P(decode_batch_sat), 1},
    {"max-batched-tokens", FLAG_COUNT, P(max_batched_tokens), 1},
    {"kv-blocks", FLAG_COUNT, P(kv_blocks), 1},
    {"output-min", FLAG_COUNT, P(output_min), 1},
    {"output-max", FLAG_COUNT, P(output_max), 1},
    {"max-model-len", FLAG_COUNT, P(max_model_len), 1},
    {"error-rate", FLAG_SHARE, P(error_rate), 0},
    {"hang-rate", FLAG_SHARE, P(hang_rate), 0},
    {"not-ready-for", FLAG_DURATION, P(not_ready_for_ms), 0},
    {"die-after", FLAG_COUNT, P(die_after), 0},
    {"seed", FLAG_U64, P(seed), 0},
    {"role", FLAG_ROLE, P(role), 0},
    {"kv-bytes-per-token", FLAG_NUMBER, P(kv_bytes_per_token), 1e-9},
    {"transfer-gbps", FLAG_NUMBER, P(transfer_gbps), 1e-9},
#undef P
};
#define NFLAGS (sizeof(flags) / sizeof(flags[0]))
enum { OPT_LISTEN = NFLAGS, OPT_READY_FILE, OPT_HELP };

static const char *const expected[] = {
    [FLAG_NAME] = "a non-empty name",
    [FLAG_COUNT] = "an integer",
    [FLAG_NUMBER] = "a number",
    [FLAG_SHARE] = "a share between 0 and 1",
    [FLAG_DURATION] = "a duration (250ms, 2s)",
    [FLAG_U64] = "an integer",
    [FLAG_ENGINE] = "vllm, sglang, llamacpp or tgi",
    [FLAG_ROLE] = "prefill, decode or both",
};

static int parse_u64(const char *s, uint64_t max, uint64_t *out)
{
    char *end;
    errno = 0;
    if (*s < '0' || *s > '9')
        return -1;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v > max)
        return -1;
    *out = v;
    return 0;
}

/* A finite number in [lo, hi]. */
static int parse_double(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static int set_flag(const struct sim_flag *f, const char *arg, struct atc_sim_params *p)
{
    char *field = (char *)p + f->off;
    uint64_t v;
    switch (f->kind) {
    case FLAG_NAME: {
        char *name = *arg ? strdup(arg) : NULL;
        if (!name)
            return -1;
        free(*(char **)field);
        *(char **)field = name;
        return 0;
    }
    case FLAG_COUNT:
        if (parse_u64(arg, UINT32_MAX, &v) < 0 || (double)v < f->min)
            return -1;
        *(unsigned *)field = (unsigned)v;
        return 0;
    case FLAG_NUMBER:
        return parse_double(arg, f->min, 1e12, (double *)field);
    case FLAG_SHARE:
        return parse_double(arg, 0, 1, (double *)field);
    case FLAG_DURATION:
        return atc_parse_duration_ms(arg, (uint64_t *)field);
    case FLAG_U64:
        return parse_u64(arg, UINT64_MAX, (uint64_t *)field);
    case FLAG_ENGINE: {
        int e = atc_sim_engine_parse(arg);
        if (e < 0)
            return -1;
        *(unsigned *)field = (unsigned)e;
        return 0;
    }
    case FLAG_ROLE:
        for (unsigned i = 0; atc_role_names[i] != NULL; i++)
            if (strcmp(arg, atc_role_names[i]) == 0) {
                *(unsigned *)field = i;
                return 0;
            }
        return -1;
    }
    return -1;
}

/* Written to a temporary name and renamed, so a watcher never reads half of it. */
static int write_ready_file(const char *path, const char *host, uint16_t port,
                            const struct atc_sim_kv_pub *kv)
{
    char pub[256] = "", replay[256] = "";
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= sizeof(tmp))
        return -1;
    FILE *f = fopen(tmp, "w");
    if (!f)
        return -1;
    bool v6 = strchr(host, ':') != NULL;
    fprintf(f, "{\"listen\":\"%s%s%s:%u\"", v6 ? "[" : "", host, v6 ? "]" : "", port);
    if (kv && atc_sim_kv_pub_endpoint(kv, 0, pub, sizeof(pub)) == 0)
        fprintf(f, ",\"kv_events\":\"%s\"", pub); /* a ZMQ address: no quote or backslash in it */
    if (kv && atc_sim_kv_pub_endpoint(kv, 1, replay, sizeof(replay)) == 0)
        fprintf(f, ",\"kv_events_replay\":\"%s\"", replay);
    fputs("}\n", f);
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

struct sim_main {
    struct event_base *base;
    int status;
};

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    struct sim_main *m = arg;
    atc_info("sim: signal %d, exiting", (int)sig);
    m->status = 0;
    event_base_loopbreak(m->base);
}

static void on_main_death(void *arg)
{
    struct sim_main *m = arg;
    m->status = 1;
    event_base_loopbreak(m->base);
}

int atc_sim_main(int argc, char **argv)
{
    struct atc_sim_params p;
    struct sim_main m = {.status = 1};
    struct atc_sim_server *srv = NULL;
    struct event *sigterm = NULL, *sigint = NULL;
    char *listen = NULL, *host = NULL;
    const char *ready_file = NULL, *err = NULL;
    uint16_t port = 0;
    struct option options[NFLAGS + 4] = {
        [OPT_LISTEN] = {"listen", required_argument, NULL, OPT_LISTEN},
        [OPT_READY_FILE] = {"ready-file", required_argument, NULL, OPT_READY_FILE},
        [OPT_HELP] = {"help", no_argument, NULL, OPT_HELP},
    };
    int opt;

    for (size_t i = 0; i < NFLAGS; i++)
        options[i] = (struct option){flags[i].name, required_argument, NULL, (int)i};
    atc_sim_params_init(&p);
    opterr = 0;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "", options, NULL)) != -1) {
        if (opt == OPT_HELP) {
            fputs(usage, stdout);
            m.status = 0;
            goto out;
        }
        if (opt == '?' || opt == ':') {
            fprintf(stderr, "atc sim: unknown flag or missing value: %s\n%s", argv[optind - 1], usage);
            m.status = 2;
            goto out;
        }
        if (opt == OPT_LISTEN) {
            free(listen);
            if (!(listen = strdup(optarg)))
                goto out;
        } else if (opt == OPT_READY_FILE) {
            ready_file = optarg;
        } else if (set_flag(&flags[opt], optarg, &p) < 0) {
            fprintf(stderr, "atc sim: --%s %s: expected %s\n", flags[opt].name, optarg,
                    expected[flags[opt].kind]);
            m.status = 2;
            goto out;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "atc sim: unexpected argument '%s'\n%s", argv[optind], usage);
        m.status = 2;
        goto out;
    }
    if (p.output_min && p.output_max && p.output_max < p.output_min) {
        fprintf(stderr, "atc sim: --output-max is below --output-min\n");
        m.status = 2;
        goto out;
    }
    if (atc_parse_hostport(listen ? listen : "127.0.0.1:9001", &host, &port, NULL) < 0) {
        fprintf(stderr, "atc sim: --listen %s: expected HOST:PORT\n", listen);
        m.status = 2;
        goto out;
    }

    signal(SIGPIPE, SIG_IGN); /* a client gone mid-stream is an error return, not a dead process */
    if (!(m.base = event_base_new())) {
        fprintf(stderr, "atc sim: cannot create an event loop\n");
        goto out;
    }
    if (!(srv = atc_sim_server_start(m.base, &p, host, port, &err))) {
        fprintf(stderr, "atc sim: %s:%u: %s\n", host, port, err);
        goto out;
    }
    atc_sim_server_set_on_death(srv, on_main_death, &m);
    sigterm = evsignal_new(m.base, SIGTERM, on_signal, &m);
    sigint = evsignal_new(m.base, SIGINT, on_signal, &m);
    if (!sigterm || !sigint || evsignal_add(sigterm, NULL) < 0 || evsignal_add(sigint, NULL) < 0) {
        fprintf(stderr, "atc sim: cannot watch signals\n");
        goto out;
    }
    port = atc_sim_server_port(srv);
    if (ready_file && write_ready_file(ready_file, host, port, atc_sim_server_kv_pub(srv)) < 0) {
        fprintf(stderr, "atc sim: --ready-file %s: %s\n", ready_file, strerror(errno));
        goto out;
    }
    atc_info("sim: %s model %s on %s:%u%s", atc_sim_engine_names[p.engine], p.model, host, port,
             p.not_ready_for_ms ? " (loading)" : "");
    event_base_dispatch(m.base);

out:
    if (sigterm)
        event_free(sigterm);
    if (sigint)
        event_free(sigint);
    atc_sim_server_stop(srv);
    if (m.base)
        event_base_free(m.base);
    free(listen);
    free(host);
    atc_sim_params_dispose(&p);
    return m.status;
}
