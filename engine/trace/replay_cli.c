/* `atc replay`: its arguments, the policies it compares, and the report it prints (replay_cli.h). */

#include "trace/replay_cli.h"

#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config/config.h"
#include "base/config_value.h"
#include "base/log.h"
#include "trace/replay.h"
#include "trace/replay_grid.h"
#include "trace/replay_ideal.h"
#include "trace/replay_live.h"
#include "trace/replay_oracle.h"
#include "trace/replay_report.h"
#include "trace/trace.h"
#include "trace/trace_import.h"

/* ---- atc replay ---- */

/* A recorded trace holds the live pick (endpoint) and the shadow's (shadow_endpoint): how often each
 * replayed policy picks what they picked (into each result, for the reports too), and what its picks cost
 * against the first policy's, so that a shadow's live agreement can be checked offline and its TTFT
 * priced under the simulated fleet. */
static void count_agreement(const struct atc_trace *t, struct atc_replay_result *res, size_t n)
{
    size_t live = 0, shadow = 0;
    for (size_t k = 0; k < t->n; k++) {
        live += t->records[k].endpoint != NULL;
        shadow += t->records[k].shadow_endpoint != NULL;
    }
    for (size_t i = 0; i < n; i++) {
        struct atc_replay_result *r = &res[i];
        r->recorded_live = live;
        r->recorded_shadow = shadow;
        r->agree_live = r->agree_shadow = 0;
        for (size_t k = 0; k < t->n && k < r->requests; k++) {
            const char *id = r->endpoint[k] >= 0 ? r->endpoints[r->endpoint[k]].id : NULL;
            const struct atc_trace_record *rec = &t->records[k];
            r->agree_live += id != NULL && rec->endpoint != NULL && strcmp(id, rec->endpoint) == 0;
            r->agree_shadow +=
                id != NULL && rec->shadow_endpoint != NULL && strcmp(id, rec->shadow_endpoint) == 0;
        }
    }
}

static void print_agreement(const struct atc_replay_result *res, size_t n)
{
    if (n == 0 || res[0].recorded_live == 0)
        return;
    printf("\n");
    for (size_t i = 0; i < n; i++) {
        const struct atc_replay_result *r = &res[i];
        printf("%s: agreement with the recorded live picks %zu/%zu (%.4f)", r->name, r->agree_live,
               r->recorded_live, (double)r->agree_live / (double)r->recorded_live);
        if (r->recorded_shadow > 0)
            printf(", with the recorded shadow picks %zu/%zu (%.4f)", r->agree_shadow, r->recorded_shadow,
                   (double)r->agree_shadow / (double)r->recorded_shadow);
        if (i > 0)
            printf("; TTFT p90 %+.1f ms against %s", r->ttft_p90_ms - res[0].ttft_p90_ms, res[0].name);
        printf("\n");
    }
}

static const char usage_replay[] =
    "usage: atc replay -c FLEET.yaml --trace FILE [--policy P] [--vs P2 ...] [--speed LIST] [--servers "
    "LIST]\n"
    "       atc replay --live --speed X --trace FILE (--target HOST:PORT | -c CONFIG) [flags]\n"
    "\n"
    "Replays a trace through one or more policies against a simulated fleet, in virtual time: each\n"
    "simulate: entry and each endpoint of FLEET.yaml becomes a simulated server (the `atc sim` model:\n"
    "batching, prefill/decode timing, a prefix KV cache with eviction), and the policy decides in the\n"
    "production sandbox, seeing the simulated fleet's load. Prints one row per policy: time to first\n"
    "token, end-to-end latency, throughput, prefix cache hit rate, load imbalance, queue waits and policy\n"
    "failures, and beside them the ideal fleet on the same trace and fleet: the servers' KV caches pooled\n"
    "into one LRU cache, the servers as parallel prefill lanes, one central FIFO queue (TTFT = queue wait +\n"
    "prefill of the uncached tokens + one decode step), with each policy's TTFT p90 over the ideal's. It\n"
    "ignores decode interference, so it is a target, not a strict bound. Deterministic for a seed.\n"
    "\n"
    "  -c, --config FILE     the fleet; its policy: section gives the default policy, budget, memory and\n"
    "                        module path\n"
    "  -t, --trace FILE      an atc trace, or a Mooncake, Azure or JSON-lines file (imported on the fly)\n"
    "  -p, --policy P        the policy to replay (default: the config's policy.entry, or builtin without\n"
    "                        a policy: section): a .lua file, the name of one in examples/policies/\n"
    "                        (round_robin, least_loaded, sglang_cache_aware, llmd_weighted, dynamo_kv,\n"
    "                        vllm_loadaware),\n"
    "                        builtin (atc's C balancer), or oracle (a router that reads the simulated\n"
    "                        servers' own queues and caches, exactly: what better signals could win);\n"
    "                        NAME=P names its row\n"
    "      --vs P            another policy to compare, the same way (repeatable)\n"
    "      --seed N          seeds atc.random(), the fallback balancer and drawn output lengths (default 1)\n"
    "      --model NAME      send every request to this model (imported traces name llama-3-8b)\n"
    "      --limit N         replay only the first N requests\n"
    "      --from N          leave out the first N requests (the rest start at time 0): with --limit,\n"
    "                        any part of a trace, e.g. its second half to check knobs fitted on the first\n"
    "      --budget DURATION CPU time a decision may use (default: the config's policy.budget); one\n"
    "                        that uses more counts as an overrun, and the watchdog stops it (wall clock;\n"
    "                        routed by the built-in balancer) only at 100 times that, so a busy machine\n"
    "                        does not change decisions\n"
    "      --format FORMAT   the trace's format when not an atc trace: mooncake, qwen, azure, jsonl\n"
    "                        (default: by content and name)\n"
    "      --json            print JSON ({\"policies\": [...]}) instead of the table\n"
    "      --html FILE       also write a self-contained HTML report (TTFT distribution per policy, load\n"
    "                        per endpoint over time)\n"
    "      --no-progress     no progress bar (shown only when stderr is a terminal)\n"
    "      --speed LIST      compress the trace's arrivals in virtual time: 2 = twice the traffic\n"
    "                        (default 1); a list such as 1,2,4 replays each\n"
    "      --servers LIST    give every simulate: entry of the fleet this many servers; a list such as\n"
    "                        8,16,32 replays each. With more than one speed or server count, prints\n"
    "                        one grid: per cell the offered prefill load, the ideal fleet's TTFT p90\n"
    "                        and hit rate, each policy's TTFT p90, hit rate and ratio to the ideal,\n"
    "                        and the first policy's ratio to the best of the others (--json and\n"
    "                        --html write the grid)\n"
    "      --restart SERVER@TIME  that simulated server's engine restarts at TIME of virtual time (90s,\n"
    "                        1500ms): its prefix cache is emptied, its KV events say AllBlocksCleared,\n"
    "                        atc's guessed index is not told (repeatable)\n"
    "      --around SHARE    send this share of the trace's requests (0..1, drawn with the seed) around\n"
    "                        atc, straight to a server of their model drawn at random, as another\n"
    "                        client's: the servers' caches and KV events see them, atc's guess does not\n"
    "\n"
    "  wall-time replay against a running atc (also the benchmarks' load generator):\n"
    "      --live            send the trace to a running atc in wall time, --speed X times faster than\n"
    "                        recorded; prompts are synthesized from the block hashes, so shared\n"
    "                        prefixes are shared bytes; streams, and measures what clients see\n"
    "      --target HOST:PORT  atc's front door (default: -c CONFIG's listen:); implies --live\n"
    "      --max-inflight N  requests open at once (default 1024)\n"
    "      --timeout DURATION  per request (default 300s)\n"
    "  -h, --help            this text\n";

#define MAX_POLICIES 16
#define MAX_RESTARTS 64
#define MAX_CELLS 16

/* "1,2,4" into @p v (at most MAX_CELLS values, each > 0). Returns how many, or -1. */
static int parse_list(const char *s, double *v, bool whole)
{
    int n = 0;
    char *end;
    for (;;) {
        if (n == MAX_CELLS)
            return -1;
        v[n] = strtod(s, &end);
        if (end == s || !(v[n] > 0) || (whole && (v[n] != (double)(unsigned)v[n])))
            return -1;
        n++;
        if (*end == '\0')
            return n;
        if (*end != ',')
            return -1;
        s = end + 1;
    }
}

struct policy_arg {
    char name[128];
    char path[4096];
};

static bool is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* "FILE", "NAME" (examples/policies/NAME.lua, here or in the source tree), "builtin" (the C balancer:
 * an empty path) or "LABEL=any of those". */
static int resolve_policy(const char *arg, struct policy_arg *p)
{
    const char *eq = strchr(arg, '=');
    const char *spec = eq != NULL ? eq + 1 : arg;
    if (strcmp(spec, "builtin") == 0 || strcmp(spec, "oracle") == 0) {
        bool builtin = spec[0] == 'b';
        snprintf(p->path, sizeof(p->path), "%s", builtin ? "" : ATC_REPLAY_ORACLE);
        snprintf(p->name, sizeof(p->name), "%.*s", eq != NULL ? (int)(eq - arg) : (int)strlen(spec),
                 eq != NULL ? arg : spec);
        return 0;
    }
    char source[4096];
    snprintf(source, sizeof(source), "%s", ATC_SOURCE_STDLIB);
    char *slash = strrchr(source, '/');
    if (slash != NULL)
        *slash = '\0';
    if (is_file(spec))
        snprintf(p->path, sizeof(p->path), "%s", spec);
    else if (snprintf(p->path, sizeof(p->path), "examples/policies/%s.lua", spec) > 0 && is_file(p->path))
        ;
    else if (snprintf(p->path, sizeof(p->path), "%s/examples/policies/%s.lua", source, spec) > 0 &&
             is_file(p->path))
        ;
    else
        return -1;
    if (eq != NULL) {
        snprintf(p->name, sizeof(p->name), "%.*s", (int)(eq - arg), arg);
        return 0;
    }
    /* The file's stem; "scripts/policy" for an entry called policy.lua. */
    const char *base = strrchr(p->path, '/');
    base = base != NULL ? base + 1 : p->path;
    size_t len = strlen(base);
    if (len > 4 && strcmp(base + len - 4, ".lua") == 0)
        len -= 4;
    if (len == 6 && memcmp(base, "policy", 6) == 0 && base != p->path) {
        const char *dir = base - 1, *start = dir;
        while (start > p->path && start[-1] != '/')
            start--;
        snprintf(p->name, sizeof(p->name), "%.*s/policy", (int)(dir - start), start);
    } else {
        snprintf(p->name, sizeof(p->name), "%.*s", (int)len, base);
    }
    return 0;
}

int atc_replay_main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"config", required_argument, NULL, 'c'},
        {"trace", required_argument, NULL, 't'},
        {"policy", required_argument, NULL, 'p'},
        {"vs", required_argument, NULL, 'v'},
        {"seed", required_argument, NULL, 's'},
        {"model", required_argument, NULL, 'm'},
        {"limit", required_argument, NULL, 'l'},
        {"budget", required_argument, NULL, 'b'},
        {"format", required_argument, NULL, 'f'},
        {"json", no_argument, NULL, 'j'},
        {"html", required_argument, NULL, 'H'},
        {"no-progress", no_argument, NULL, 'n'},
        {"speed", required_argument, NULL, 'S'},
        {"servers", required_argument, NULL, 'N'},
        {"from", required_argument, NULL, 'F'},
        {"live", no_argument, NULL, 'L'},
        {"target", required_argument, NULL, 'T'},
        {"max-inflight", required_argument, NULL, 'M'},
        {"timeout", required_argument, NULL, 'o'},
        {"restart", required_argument, NULL, 'R'},
        {"around", required_argument, NULL, 'A'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *config = NULL, *trace_path = NULL, *html = NULL, *target = NULL;
    const char *policy_args[MAX_POLICIES];
    size_t npolicies = 0;
    bool json = false, no_progress = false, have_policy = false, live = false;
    double speeds[MAX_CELLS], server_list[MAX_CELLS];
    unsigned servers[MAX_CELLS];
    int nspeeds = 0, nservers = 0;
    size_t from = 0;
    struct atc_replay_options o = {.seed = 1};
    struct atc_replay_restart restarts[MAX_RESTARTS];
    o.restarts = restarts;
    struct atc_trace_import_options io = {0};
    struct atc_replay_live_options lo = {0};
    char *end;
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "c:t:p:h", longopts, NULL)) != -1) {
        switch (ch) {
        case 'c':
            config = optarg;
            break;
        case 't':
            trace_path = optarg;
            break;
        case 'p':
        case 'v':
            if (npolicies == MAX_POLICIES - 1) {
                fprintf(stderr, "atc replay: at most %d policies\n", MAX_POLICIES);
                return 2;
            }
            if (ch == 'p') {
                if (have_policy) {
                    fprintf(stderr, "atc replay: one --policy; compare others with --vs\n");
                    return 2;
                }
                have_policy = true;
                memmove(policy_args + 1, policy_args, npolicies * sizeof(*policy_args));
                policy_args[0] = optarg;
                npolicies++;
            } else {
                policy_args[npolicies++] = optarg;
            }
            break;
        case 's':
            o.seed = strtoull(optarg, &end, 10);
            if (*end != '\0' || *optarg == '\0') {
                fprintf(stderr, "atc replay: --seed must be a whole number\n");
                return 2;
            }
            break;
        case 'm':
            o.model = lo.model = optarg;
            break;
        case 'l':
            o.limit = lo.limit = strtoul(optarg, &end, 10);
            if (*end != '\0' || o.limit == 0) {
                fprintf(stderr, "atc replay: --limit must be a whole number > 0\n");
                return 2;
            }
            break;
        case 'b':
            if (atc_parse_duration_us(optarg, &o.budget_us) < 0 || o.budget_us == 0) {
                fprintf(stderr, "atc replay: invalid --budget '%s'\n", optarg);
                return 2;
            }
            break;
        case 'f':
            if (atc_trace_format_parse(optarg, &io.format) < 0) {
                fprintf(stderr, "atc replay: unknown --format '%s'\n", optarg);
                return 2;
            }
            break;
        case 'j':
            json = true;
            break;
        case 'H':
            html = optarg;
            break;
        case 'n':
            no_progress = true;
            break;
        case 'S':
            if ((nspeeds = parse_list(optarg, speeds, false)) < 0) {
                fprintf(stderr,
                        "atc replay: --speed must be a number > 0, or a list such as 1,2,4 (at most %d)\n",
                        MAX_CELLS);
                return 2;
            }
            break;
        case 'N':
            if ((nservers = parse_list(optarg, server_list, true)) < 0) {
                fprintf(stderr,
                        "atc replay: --servers must be a whole number > 0, or a list such as 8,16,32 "
                        "(at most %d)\n",
                        MAX_CELLS);
                return 2;
            }
            for (int i = 0; i < nservers; i++)
                servers[i] = (unsigned)server_list[i];
            break;
        case 'L':
            live = true;
            break;
        case 'F':
            from = strtoul(optarg, &end, 10);
            if (*end != '\0' || *optarg == '\0') {
                fprintf(stderr, "atc replay: --from must be a whole number\n");
                return 2;
            }
            break;
        case 'T':
            target = optarg;
            live = true;
            break;
        case 'M':
            lo.max_inflight = (unsigned)strtoul(optarg, &end, 10);
            if (*end != '\0' || lo.max_inflight == 0) {
                fprintf(stderr, "atc replay: --max-inflight must be a whole number > 0\n");
                return 2;
            }
            break;
        case 'o':
            if (atc_parse_duration_ms(optarg, &lo.timeout_ms) < 0 || lo.timeout_ms == 0) {
                fprintf(stderr, "atc replay: invalid --timeout '%s'\n", optarg);
                return 2;
            }
            break;
        case 'R': { /* ID@TIME: a simulated server's engine restarts at that virtual time */
            char *at = strrchr(optarg, '@'); /* argv's own bytes: cut there, nothing to free */
            if (o.nrestarts == MAX_RESTARTS) {
                fprintf(stderr, "atc replay: at most %d --restart\n", MAX_RESTARTS);
                return 2;
            }
            if (at == NULL || at == optarg ||
                atc_parse_duration_us(at + 1, &restarts[o.nrestarts].at_us) < 0) {
                fprintf(stderr, "atc replay: --restart wants SERVER@TIME, such as llama-3-8b-sim-2@90s\n");
                return 2;
            }
            *at = '\0';
            restarts[o.nrestarts++].endpoint = optarg;
            break;
        }
        case 'A':
            o.around = strtod(optarg, &end);
            if (*end != '\0' || *optarg == '\0' || !(o.around >= 0 && o.around <= 1)) {
                fprintf(stderr, "atc replay: --around must be a share in [0, 1], such as 0.1\n");
                return 2;
            }
            break;
        case 'h':
            fputs(usage_replay, stdout);
            return 0;
        default:
            fputs(usage_replay, stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "atc replay: unexpected argument '%s'\n%s", argv[optind], usage_replay);
        return 2;
    }
    if (trace_path == NULL || (config == NULL && target == NULL)) {
        fprintf(stderr, "atc replay: %s is required\n%s", trace_path == NULL ? "--trace FILE" : "-c FILE",
                usage_replay);
        return 2;
    }
    if (live) {
        if (nspeeds != 1 || nservers > 0) {
            fprintf(stderr,
                    "atc replay: --live replays at one --speed X against a running atc (no --servers)\n");
            return 2;
        }
        lo.speed = speeds[0];
    }
    if (getenv("ATC_LOG") == NULL)
        atc_log_set_level(ATC_LOG_WARN); /* the policy runtime's "loaded" lines would clutter the table */

    struct atc_config *cfg = NULL;
    char *errors = NULL;
    if (config != NULL && atc_config_load(config, &cfg, &errors) < 0) {
        fprintf(stderr, "%s\n", errors != NULL ? errors : "cannot load the config");
        free(errors);
        return 1;
    }
    struct atc_trace *trace = NULL;
    size_t bad = 0;
    io.errors = stderr;
    char *err = NULL;
    if (atc_trace_load(trace_path, &io, &trace, &bad, &err) < 0) {
        fprintf(stderr, "%s\n", err != NULL ? err : "cannot load the trace");
        free(err);
        atc_config_free(cfg);
        return 1;
    }
    if (bad > 0)
        fprintf(stderr, "%s: %zu malformed line(s) skipped\n", trace_path, bad);
    if (from > 0) { /* the records from `from` on, as if the trace began there */
        if (from >= trace->n) {
            fprintf(stderr, "atc replay: --from %zu: the trace has %zu requests\n", from, trace->n);
            atc_trace_free(trace);
            atc_config_free(cfg);
            return 2;
        }
        memmove(trace->records, trace->records + from, (trace->n - from) * sizeof(*trace->records));
        trace->n -= from;
        uint64_t t0 = trace->records[0].at_us;
        for (size_t i = 0; i < trace->n; i++)
            trace->records[i].at_us -= t0;
    }
    bool progress = !no_progress && !json && isatty(STDERR_FILENO);
    o.progress = lo.progress = progress;
    int rc = 0;
    struct atc_replay_result results[MAX_POLICIES];
    size_t nresults = 0;
    struct policy_arg pargs[MAX_POLICIES];
    struct atc_replay_grid_policy gpolicies[MAX_POLICIES];
    struct atc_replay_grid grid = {0};
    struct atc_replay_ideal ideal = {0}; /* of a single cell (a grid holds one per cell) */
    bool have_ideal = false;
    char title[8192];

    if (lo.speed > 0) {
        char *host = NULL;
        if (target != NULL) {
            if (atc_parse_hostport(target, &host, &lo.port, NULL) < 0) {
                fprintf(stderr, "atc replay: --target: expected HOST:PORT, got '%s'\n", target);
                rc = 2;
                goto done;
            }
        } else {
            host = strdup(cfg->listen_host);
            lo.port = cfg->listen_port;
        }
        lo.host = host;
        snprintf(title, sizeof(title), "%s: %zu requests at %gx speed against atc at %s:%u", trace_path,
                 o.limit && o.limit < trace->n ? o.limit : trace->n, lo.speed, host, (unsigned)lo.port);
        if (atc_replay_live(trace, &lo, &results[0], &err) < 0) {
            fprintf(stderr, "atc replay: %s\n", err != NULL ? err : "failed");
            free(err);
            free(host);
            rc = 1;
            goto done;
        }
        free(host);
        nresults = 1;
    } else {
        if (!have_policy) { /* the config's policy first, then the --vs ones */
            memmove(policy_args + 1, policy_args, npolicies * sizeof(*policy_args));
            policy_args[0] = cfg->policy.enabled ? cfg->policy.entry : "builtin"; /* as atc serve would */
            npolicies++;
        }
        for (size_t i = 0; i < npolicies; i++) {
            if (resolve_policy(policy_args[i], &pargs[i]) < 0) {
                fprintf(stderr, "atc replay: no policy '%s' (a .lua file, or a name in examples/policies/)\n",
                        policy_args[i]);
                rc = 2;
                goto done;
            }
            gpolicies[i].name = pargs[i].name;
            gpolicies[i].path = pargs[i].path[0] != '\0' ? pargs[i].path : NULL;
        }
        grid = (struct atc_replay_grid){.trace_path = trace_path,
                                        .fleet_path = config,
                                        .seed = o.seed,
                                        .policies = gpolicies,
                                        .npolicies = npolicies};
        if (atc_replay_grid_run(cfg, trace, &grid, speeds, (size_t)nspeeds, servers, (size_t)nservers, &o,
                                &err) < 0) {
            fprintf(stderr, "atc replay: %s\n", err != NULL ? err : "failed");
            free(err);
            err = NULL;
            rc = 1;
            goto done;
        }
        if (grid.ncells > 1) {
            if (json)
                atc_replay_grid_json(stdout, &grid);
            else
                atc_replay_grid_table(stdout, &grid);
            if (html != NULL && atc_replay_grid_html(html, &grid, &err) < 0) {
                fprintf(stderr, "atc replay: %s\n", err != NULL ? err : "cannot write the report");
                free(err);
                rc = 1;
            }
            goto done;
        }
        /* One cell: the per-policy report, its results and its ideal fleet moved out of the grid. */
        for (size_t i = 0; i < npolicies; i++)
            results[nresults++] = grid.cells[0].results[i];
        ideal = grid.cells[0].ideal;
        have_ideal = true;
        grid.ncells = 0;
        free(grid.cells[0].results);
        size_t neps = results[0].nendpoints;
        double speed = nspeeds ? speeds[0] : 1;
        snprintf(title, sizeof(title), "%s%s: %zu requests over %.1f s; fleet %s: %zu endpoints; seed %llu",
                 trace_path, speed != 1 ? " (time-compressed)" : "", results[0].requests,
                 results[0].requests ? (double)trace->records[results[0].requests - 1].at_us / 1e6 / speed
                                     : 0.0,
                 config, neps, (unsigned long long)o.seed);
    }
    count_agreement(trace, results, nresults);
    if (json)
        atc_replay_report_json(stdout, trace_path, config, o.seed, results, nresults,
                               have_ideal ? &ideal : NULL);
    else
        atc_replay_report_table(stdout, title, results, nresults, have_ideal ? &ideal : NULL);
    if (html != NULL &&
        atc_replay_report_html(html, title, results, nresults, have_ideal ? &ideal : NULL, &err) < 0) {
        fprintf(stderr, "atc replay: %s\n", err != NULL ? err : "cannot write the report");
        free(err);
        rc = 1;
    }
    if (!json)
        print_agreement(results, nresults);
    for (size_t i = 0; i < nresults; i++)
        if (results[i].rejected == results[i].requests && results[i].requests > 0)
            fprintf(stderr,
                    "atc replay: %s rejected every request: does the fleet serve the trace's model? "
                    "(--model NAME sends them all to one)\n",
                    results[i].name);
done:
    atc_replay_grid_dispose(&grid);
    atc_replay_ideal_dispose(&ideal);
    for (size_t i = 0; i < nresults; i++)
        atc_replay_result_dispose(&results[i]);
    atc_trace_free(trace);
    atc_config_free(cfg);
    return rc;
}
