/* atc: the command line. Each command parses its own flags and returns the process's exit status. */

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "core/cli.h"
#include "core/discovery.h"
#include "config/config.h"
#include "base/event_memory.h"
#include "fleet/endpoint.h"
#include "base/log.h"
#include "core/admin.h"
#include "policy/policy.h"
#include "trace/replay_lua.h"
#include "core/rollout.h"
#include "core/server.h"
#include "core/kv_keys_cli.h"
#include "proxy/worker.h"
#include "trace/replay_cli.h"
#include "sim/sim_cli.h"
#include "trace/trace_cli.h"

static const char usage_main[] =
    "usage: atc <command> [flags]\n"
    "\n"
    "Routes OpenAI-style requests to a fleet of LLM inference servers.\n"
    "\n"
    "commands:\n"
    "  serve -c FILE    run the router described by FILE\n"
    "  check -c FILE    validate FILE and its policy; every error as file:line:col: message\n"
    "  sim [flags]      run one simulated inference server (see atc sim --help)\n"
    "  test [PATH...]   run policy unit tests in the sandbox (see atc test --help)\n"
    "  trace ...        import public traces, statistics of a trace (see atc trace --help)\n"
    "  replay ...       replay a trace through policies against a simulated fleet (atc replay --help)\n"
    "  status           endpoints, load and policy version of a running atc\n"
    "  reload           re-read a running atc's policy files (--yaml: its YAML, then the policy)\n"
    "  drain ID         stop new traffic to an endpoint; enable ID undoes it\n"
    "  policy ...       canary SHARE [WINDOW], promote, rollback, shadow FILE [SAMPLE], shadow clear:\n"
    "                   change a running atc's policy safely (see atc policy --help)\n"
    "  kv-keys TOKENS   the block keys an engine publishes for a token list (atc kv-keys --help)\n"
    "\n"
    "  atc --version    print the version\n"
    "  atc <command> --help\n";

static const char usage_serve[] =
    "usage: atc serve -c FILE [--ready-file PATH]\n"
    "\n"
    "Runs the router: the OpenAI-compatible front door on listen:, the admin API on admin:, and any\n"
    "simulated servers under simulate:. SIGTERM or SIGINT stops accepting and lets in-flight requests\n"
    "finish for up to drain_timeout, then exits 0.\n"
    "\n"
    "What each reload re-reads:\n"
    "  SIGHUP, POST /admin/config/reload, atc reload --yaml   the YAML file, then the policy's files\n"
    "      against the new fleet; a YAML error, or a change to listen, admin, workers, simulate,\n"
    "      admission, access_log or adding/removing policy: (those take a restart), is refused and\n"
    "      logged, and nothing changes\n"
    "  POST /admin/policy/reload, atc reload, a change of a .lua file (policy.watch, on by default)\n"
    "      the policy's files only; a failed compile or test changes nothing\n"
    "  SIGUSR1 reopens the access log.\n"
    "\n"
    "  -c, --config FILE     the YAML configuration (required)\n"
    "      --ready-file PATH once listening and the first health checks are in (at most one check\n"
    "                        timeout), write {\"listen\": \"host:port\", \"admin\": ..., \"pid\": N} to\n"
    "                        PATH (useful with port 0, which picks a free port)\n"
    "  -h, --help            this text\n";

static const char usage_check[] =
    "usage: atc check -c FILE\n"
    "\n"
    "Validates the configuration, then its policy against the fleet the file describes (the endpoints\n"
    "of simulate: included): the entry file exists, compiles, returns a route function and routes the\n"
    "synthetic requests within budget. A policy error is reported at the entry: key (file:line:col:).\n"
    "Exits 0 when both are valid, 1 with every error otherwise.\n"
    "\n"
    "  -c, --config FILE     the YAML configuration (required)\n"
    "  -h, --help            this text\n";

struct cli_opts {
    const char *config;
    const char *ready_file;
};

/* Parses the flags shared by serve and check; returns -1 on error, 1 for --help, 0 to go on. */
static int parse_opts(int argc, char **argv, const char *usage, struct cli_opts *o)
{
    static const struct option longopts[] = {
        {"config", required_argument, NULL, 'c'},
        {"ready-file", required_argument, NULL, 'r'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "c:h", longopts, NULL)) != -1) {
        switch (ch) {
        case 'c':
            o->config = optarg;
            break;
        case 'r':
            o->ready_file = optarg;
            break;
        case 'h':
            fputs(usage, stdout);
            return 1;
        default:
            fputs(usage, stderr);
            return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "atc %s: unexpected argument '%s'\n%s", argv[0], argv[optind], usage);
        return -1;
    }
    if (o->config == NULL) {
        fprintf(stderr, "atc %s: -c FILE is required\n%s", argv[0], usage);
        return -1;
    }
    return 0;
}

static struct atc_config *load_config(const char *path)
{
    struct atc_config *cfg = NULL;
    char *errors = NULL;
    if (atc_config_load(path, &cfg, &errors) < 0) {
        fprintf(stderr, "%s\n", errors != NULL ? errors : "cannot load config");
        free(errors);
        return NULL;
    }
    return cfg;
}

/* The endpoints that simulate: will start, at port 0 (never contacted), named as atc serve names them
 * (server.c start_sims): the policy's init() then sees the fleet it will route, and does not warn that
 * the simulated models are not served. */
static int add_simulated(struct atc_endpoint_table *table, const struct atc_config *cfg)
{
    for (size_t i = 0; i < cfg->nsimulate; i++) {
        const struct atc_simulate_config *sc = &cfg->simulate[i];
        const struct atc_sim_params *p = &sc->params;
        for (unsigned k = 0; p->model != NULL && k < sc->count; k++) {
            char id[300];
            struct atc_model *m = atc_endpoint_table_model(table, p->model, strlen(p->model));
            snprintf(id, sizeof(id), "%s-sim-%zu", p->model, m != NULL ? m->nendpoints + 1 : 1);
            if (atc_endpoint_table_add(table, p->model, id, "127.0.0.1", 0,
                                       sc->capacity ? sc->capacity : p->max_seqs) == NULL)
                return -1;
        }
    }
    return 0;
}

/* The endpoints of a config that may be invalid (atc check): those whose model, id and address were
 * read; the policy's init() then sees as much of the fleet as the file gives. */
static struct atc_endpoint_table *check_table(const struct atc_config *cfg, bool valid)
{
    if (valid)
        return atc_endpoint_table_create(cfg);
    /* A copy of the models that were read, each with the endpoints that were: borrowed, not owned. */
    struct atc_config part = *cfg;
    struct atc_model_config *models = calloc(cfg->nmodels + 1, sizeof(*models));
    struct atc_endpoint_config **eps = calloc(cfg->nmodels + 1, sizeof(*eps));
    struct atc_endpoint_table *t = NULL;
    if (models == NULL || eps == NULL)
        goto done;
    part.models = models;
    part.nmodels = 0;
    for (size_t i = 0; i < cfg->nmodels; i++) {
        const struct atc_model_config *mc = &cfg->models[i];
        if (mc->name == NULL)
            continue;
        struct atc_model_config *m = &models[part.nmodels];
        *m = *mc;
        m->nendpoints = 0;
        if ((m->endpoints = eps[part.nmodels++] = calloc(mc->nendpoints + 1, sizeof(*m->endpoints))) == NULL)
            goto done;
        for (size_t j = 0; j < mc->nendpoints; j++)
            if (mc->endpoints[j].id != NULL && mc->endpoints[j].host != NULL)
                m->endpoints[m->nendpoints++] = mc->endpoints[j];
    }
    t = atc_endpoint_table_create(&part);
done:
    for (size_t i = 0; eps != NULL && i < cfg->nmodels; i++)
        free(eps[i]);
    free(eps);
    free(models);
    return t;
}

static int cmd_check(int argc, char **argv)
{
    struct cli_opts o = {0};
    int rc = parse_opts(argc, argv, usage_check, &o);
    if (rc != 0)
        return rc > 0 ? 0 : 2;
    /* Every error in one run: the YAML's, then, when the file was read far enough to name a policy, the
     * policy's too (an error elsewhere in the YAML does not hide a broken policy). */
    struct atc_config *cfg = NULL;
    char *yaml_errors = NULL;
    bool valid = atc_config_load_partial(o.config, &cfg, &yaml_errors) == 0;
    if (!valid)
        fprintf(stderr, "%s\n", yaml_errors != NULL ? yaml_errors : "cannot load config");
    free(yaml_errors);
    if (cfg == NULL)
        return 1;
    size_t neps = 0;
    for (size_t i = 0; i < cfg->nmodels; i++)
        neps += cfg->models[i].nendpoints;
    for (size_t i = 0; i < cfg->nsimulate; i++)
        neps += cfg->simulate[i].count;
    int rc_policy = valid ? 0 : 1;
    if (cfg->policy.enabled && cfg->policy.entry != NULL) {
        struct atc_endpoint_table *table = check_table(cfg, valid);
        if (table != NULL && add_simulated(table, cfg) < 0) {
            atc_endpoint_table_destroy(table);
            table = NULL;
        }
        struct atc_policy_settings ps = {
            .entry = cfg->policy.entry,
            .path = (const char *const *)cfg->policy.path,
            .npath = cfg->policy.npath,
            .stdlib_dir = atc_policy_stdlib_dir(),
            .budget_us = cfg->policy.budget_us,
            .memory = cfg->policy.memory,
            .jit = cfg->policy.jit,
        };
        char *err = NULL;
        struct atc_policy_runtime *rt =
            table != NULL ? atc_policy_runtime_create(&ps, table, NULL, NULL, &err) : NULL;
        if (rt == NULL) {
            /* In the YAML's own format, at the entry: key: one report, whichever part is wrong. */
            fprintf(stderr, "%s:%u:%u: key 'policy.entry': %s\n", cfg->path, cfg->policy.entry_line,
                    cfg->policy.entry_column, err != NULL ? err : "cannot load the policy");
            rc_policy = 1;
        }
        free(err);
        atc_policy_runtime_destroy(rt);
        atc_endpoint_table_destroy(table);
    }
    if (rc_policy == 0 && valid)
        printf("%s: ok (%zu model(s), %zu endpoint(s)%s)\n", o.config, cfg->nmodels, neps,
               cfg->policy.enabled ? ", policy compiled" : "");
    atc_config_free(cfg);
    return rc_policy;
}

struct ready_file {
    struct atc_server *srv;
    const char *path;
    bool failed;
};

/* Once the first health checks are in, the endpoints that are up take traffic: say "ready" then. */
static void on_ready(void *arg)
{
    struct ready_file *rf = arg;
    if (atc_server_write_ready_file(rf->srv, rf->path) < 0) {
        atc_error("cannot write ready file %s", rf->path);
        rf->failed = true;
        event_base_loopexit(rf->srv->base, NULL);
    }
}

/* from: / until: (config.h, struct atc_window) are a replay's: say so for each entry that has them. */
static void warn_replay_windows(const struct atc_config *cfg)
{
    const char *why = "from:/until: are read by atc replay and atc test only; atc serve ignores them and "
                      "serves it from the start (add and remove servers live with /admin/endpoints)";
    for (size_t i = 0; i < cfg->nmodels; i++)
        for (size_t j = 0; j < cfg->models[i].nendpoints; j++) {
            const struct atc_endpoint_config *ec = &cfg->models[i].endpoints[j];
            if (ec->window.from_ms > 0 || ec->window.until_ms > 0)
                atc_warn("%s: endpoint %s: %s", cfg->path, ec->id, why);
        }
    for (size_t i = 0; i < cfg->nsimulate; i++)
        if (cfg->simulate[i].window.from_ms > 0 || cfg->simulate[i].window.until_ms > 0)
            atc_warn("%s: simulate[%zu] (model %s): %s", cfg->path, i, cfg->simulate[i].params.model, why);
}

static int cmd_serve(int argc, char **argv)
{
    struct cli_opts o = {0};
    int rc = parse_opts(argc, argv, usage_serve, &o);
    if (rc != 0)
        return rc > 0 ? 0 : 2;
    struct atc_config *cfg = load_config(o.config);
    if (cfg == NULL)
        return 1;
    warn_replay_windows(cfg);
    struct event_base *base = atc_event_base_new();
    if (base == NULL) {
        atc_error("cannot create the event loop");
        atc_config_free(cfg);
        return 1;
    }
    char *err = NULL;
    struct atc_server *srv = atc_server_create(base, cfg, atc_admin_handle, &err);
    if (srv == NULL) {
        atc_error("%s: %s", o.config, err != NULL ? err : "out of memory");
        free(err);
        event_base_free(base);
        return 1;
    }
    atc_rollout_start(srv); /* policy.shadow */
    if (atc_discovery_start(srv) < 0) /* discover: */
        atc_error("discover: out of memory: no model is discovered");
    struct ready_file rf = {.srv = srv, .path = o.ready_file};
    if (o.ready_file != NULL)
        atc_server_when_ready(srv, on_ready, &rf);
    event_base_dispatch(base);
    atc_info("stopped");
    atc_discovery_stop(srv);
    atc_server_destroy(srv);
    event_base_free(base);
    return rf.failed ? 1 : 0;
}

int main(int argc, char **argv)
{
    /* Before any libevent call: its per-fd records go to a region of their own, so that the heap pages
     * of thousands of closed connections can go back to the kernel (event_memory.h). Without it, atc
     * runs as before, only keeping more memory after a wave of connections. */
    if (atc_event_memory_install() < 0)
        atc_warn("cannot reserve the region for libevent's small allocations: they go to malloc");
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        fputs(usage_main, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0) {
        printf("atc %s\n", ATC_VERSION);
        return 0;
    }
    if (strcmp(argv[1], "serve") == 0)
        return cmd_serve(argc - 1, argv + 1);
    if (strcmp(argv[1], "check") == 0)
        return cmd_check(argc - 1, argv + 1);
    if (strcmp(argv[1], "sim") == 0)
        return atc_sim_main(argc - 1, argv + 1);
    if (strcmp(argv[1], "test") == 0)
        return atc_policy_test_main(argc - 1, argv + 1, atc_replay_lua);
    if (strcmp(argv[1], "trace") == 0)
        return atc_trace_main(argc - 1, argv + 1);
    if (strcmp(argv[1], "kv-keys") == 0)
        return atc_kv_keys_main(argc - 1, argv + 1);
    if (strcmp(argv[1], "replay") == 0)
        return atc_replay_main(argc - 1, argv + 1);
    if (strcmp(argv[1], "status") == 0 || strcmp(argv[1], "reload") == 0 || strcmp(argv[1], "drain") == 0 ||
        strcmp(argv[1], "policy") == 0 || strcmp(argv[1], "enable") == 0)
        return atc_cli_main(argc - 1, argv + 1);
    fprintf(stderr, "atc: unknown command '%s'\n%s", argv[1], usage_main);
    return 2;
}
