/* The operator's commands that talk to a running atc through its admin API: atc status, atc reload,
 * atc drain, atc enable. A small blocking HTTP/1.0 client: these run once and exit. */

#include "core/cli.h"

#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "config/config.h"
#include "base/config_value.h"
#include "base/json.h"

static const char usage_admin[] =
    "usage: atc status  [-c FILE | --admin HOST:PORT] [--token TOKEN]\n"
    "       atc reload  [-c FILE | --admin HOST:PORT] [--token TOKEN] [--yaml]\n"
    "       atc drain ID  [-c FILE | --admin HOST:PORT] [--token TOKEN]\n"
    "       atc enable ID [-c FILE | --admin HOST:PORT] [--token TOKEN]\n"
    "       atc policy canary SHARE [WINDOW] | promote | rollback | shadow FILE [SAMPLE] | shadow clear\n"
    "\n"
    "Talk to a running atc through its admin API.\n"
    "  status   a table of endpoints (state, load, errors), who waits per model, the policy version\n"
    "  reload   re-read the policy's .lua files (POST /admin/policy/reload); the YAML is not read\n"
    "           with --yaml: re-read the YAML file atc was started with, then the policy's files\n"
    "           against the new fleet (POST /admin/config/reload; SIGHUP does the same). A change\n"
    "           to listen, admin, workers, simulate, admission, access_log, record, cluster,\n"
    "           limits or adding/removing policy: is refused (it takes a restart) and nothing\n"
    "           changes. Exit 1 if refused. policy.watch turned on or off takes effect.\n"
    "  drain    stop new traffic to endpoint ID; its in-flight requests finish\n"
    "  enable   undo drain\n"
    "  policy   canary: reload the policy's files as a canary deciding SHARE (0-1] of the requests,\n"
    "           sticky per session, judged after WINDOW (default 5m) against policy.canary's guards;\n"
    "           with policy.watch on (the default) it is armed: edit the files after it, and the\n"
    "           change loads as the canary (atc policy rollback disarms it);\n"
    "           promote / rollback: end it now; shadow: run FILE beside the live policy on SAMPLE\n"
    "           (default 1) of the decisions, never acted on; shadow clear: stop it\n"
    "\n"
    "  -c, --config FILE     find the admin address and token in this config (it is not what --yaml\n"
    "                        re-reads: atc re-reads the file it was started with)\n"
    "      --admin HOST:PORT the admin address (default 127.0.0.1:8081)\n"
    "      --token TOKEN     the admin token (default: the config's, or $ATC_ADMIN_TOKEN)\n"
    "      --yaml            (reload) re-read the YAML configuration, then the policy\n"
    "  -h, --help            this text\n";

static const char usage_policy[] =
    "usage: atc policy canary SHARE [WINDOW]  [-c FILE | --admin HOST:PORT] [--token TOKEN]\n"
    "       atc policy promote | rollback\n"
    "       atc policy shadow FILE [SAMPLE] | shadow clear\n"
    "\n"
    "Change a running atc's policy safely (docs/policies.md, \"Changing a policy safely\").\n"
    "  canary   a new version of the policy's files decides SHARE (0-1] of the requests, sticky per\n"
    "           session, and is judged after WINDOW (default 5m) against policy.canary's guards:\n"
    "           promoted, or rolled back. With policy.watch on (the default) the canary is armed:\n"
    "           edit the files after this command and the change loads as the canary, while the\n"
    "           current version keeps routing the rest. With watch: false the files load at once.\n"
    "  promote  end the canary now: it decides every request from now on\n"
    "  rollback end the canary now (or disarm one waiting for the files): the current version stays\n"
    "  shadow   FILE decides beside the live policy on SAMPLE (default 1) of the requests, counted\n"
    "           and recorded, never acted on; shadow clear stops it\n"
    "\n"
    "  -c, --config FILE     find the admin address and token in this config\n"
    "      --admin HOST:PORT the admin address (default 127.0.0.1:8081)\n"
    "      --token TOKEN     the admin token (default: the config's, or $ATC_ADMIN_TOKEN)\n"
    "  -h, --help            this text\n";

struct admin_target {
    char host[256];
    unsigned port;
    char token[512];
};

/* One request; returns the status (or -1) and the body in *body (owned). */
static int admin_call_with(const struct admin_target *t, const char *method, const char *path,
                           const char *send, char **body);
static void print_rollout(const struct atc_json *pj);

static int admin_call(const struct admin_target *t, const char *method, const char *path, char **body)
{
    return admin_call_with(t, method, path, "", body);
}

/* One admin request with @p send as its body; the status, and the answer's body in *body (owned). */
static int admin_call_with(const struct admin_target *t, const char *method, const char *path,
                           const char *send, char **body)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    char port[8];
    snprintf(port, sizeof(port), "%u", t->port);
    if (getaddrinfo(t->host, port, &hints, &res) != 0 || res == NULL) {
        fprintf(stderr, "atc: cannot resolve %s\n", t->host);
        return -1;
    }
    int fd = socket(res->ai_family, SOCK_STREAM, 0);
    struct timeval tv = {.tv_sec = 10};
    if (fd >= 0) {
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    }
    if (fd < 0 || connect(fd, res->ai_addr, res->ai_addrlen) < 0) {
        fprintf(stderr, "atc: cannot reach the admin API at %s:%u: %s (is atc running? see --admin)\n",
                t->host, t->port, strerror(errno));
        freeaddrinfo(res);
        if (fd >= 0)
            close(fd);
        return -1;
    }
    freeaddrinfo(res);
    char req[3072];
    int n = snprintf(req, sizeof(req), "%s %s HTTP/1.0\r\nHost: %s\r\nContent-Length: %zu\r\n%s%s%s\r\n%s",
                     method, path, t->host, strlen(send), t->token[0] ? "Authorization: Bearer " : "",
                     t->token, t->token[0] ? "\r\n" : "", send);
    if (n < 0 || (size_t)n >= sizeof(req) || write(fd, req, (size_t)n) != n) {
        close(fd);
        return -1;
    }
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap);
    ssize_t r;
    while (buf != NULL && (r = read(fd, buf + len, cap - len - 1)) > 0) {
        len += (size_t)r;
        if (len + 1 == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (nb == NULL) {
                free(buf);
                buf = NULL;
            }
            buf = nb;
        }
    }
    close(fd);
    if (buf == NULL)
        return -1;
    buf[len] = '\0';
    int status = -1;
    char *sep = strstr(buf, "\r\n\r\n");
    if (sscanf(buf, "HTTP/%*d.%*d %d", &status) != 1 || sep == NULL) {
        free(buf);
        return -1;
    }
    memmove(buf, sep + 4, len - (size_t)(sep + 4 - buf) + 1);
    *body = buf;
    return status;
}

/* ---- a few JSON lookups on the admin API's answers ---- */

/* The text of the value at @p i as written ("-" when there is none), for a table cell. */
static void json_text(const struct atc_json *j, int i, char *out, size_t size)
{
    size_t len;
    const char *s = atc_json_raw(j, i, &len);
    if (s == NULL)
        snprintf(out, size, "-");
    else
        snprintf(out, size, "%.*s", (int)len, s);
}

/* The first string value of "message" in an OpenAI-style error body, or the body. */
static void print_error(int status, const char *body)
{
    struct atc_json j = {0};
    char msg[1024];
    if (atc_json_parse(&j, body, strlen(body), NULL) < 0 ||
        atc_json_string(&j, atc_json_get(&j, atc_json_get(&j, 0, "error"), "message"), msg, sizeof(msg),
                        NULL) < 0)
        snprintf(msg, sizeof(msg), "%s", body);
    fprintf(stderr, "atc: the admin API answered %d: %s\n", status, msg);
    atc_json_dispose(&j);
}

/* The models with requests waiting, one row each: a name no model serves is queued as "other", so
 * the names clients send make one row, not one each. */
static void print_queues(const struct atc_json *j, int models)
{
    if (atc_json_count(j, models) <= 0)
        return;
    printf("\n%-28s %9s %10s  %s\n", "QUEUED FOR MODEL", "WAITING", "OLDEST(ms)", "BY PRIORITY (0..9)");
    for (int k = 0, i = models + 1; k < atc_json_count(j, models); k++, i = atc_json_next(j, i)) {
        char model[128], waiting[16], oldest[24], prio[64];
        json_text(j, atc_json_get(j, i, "model"), model, sizeof(model));
        json_text(j, atc_json_get(j, i, "waiting"), waiting, sizeof(waiting));
        json_text(j, atc_json_get(j, i, "oldest_ms"), oldest, sizeof(oldest));
        json_text(j, atc_json_get(j, i, "by_priority"), prio, sizeof(prio));
        printf("%-28s %9s %10s  %s\n", model, waiting, oldest, prio);
    }
}

/* The cluster: this replica's Redis state and mode, and every other replica seen with its last sync. */
static void print_cluster(const struct admin_target *t)
{
    char *body = NULL;
    struct atc_json j = {0};
    if (admin_call(t, "GET", "/admin/cluster", &body) != 200 ||
        atc_json_parse(&j, body, strlen(body), NULL) < 0 || atc_json_get(&j, 0, "name") < 0) {
        atc_json_dispose(&j);
        free(body);
        return;
    }
    char name[80], redis[160], state[24], mode[16], last[24];
    json_text(&j, atc_json_get(&j, 0, "name"), name, sizeof(name));
    json_text(&j, atc_json_get(&j, 0, "redis"), redis, sizeof(redis));
    json_text(&j, atc_json_get(&j, 0, "state"), state, sizeof(state));
    json_text(&j, atc_json_get(&j, 0, "mode"), mode, sizeof(mode));
    json_text(&j, atc_json_get(&j, 0, "last_sync_ms_ago"), last, sizeof(last));
    printf("\ncluster: replica %s, Redis %s %s, %s mode, last sync %s ms ago\n", name, redis, state, mode,
           last);
    int reps = atc_json_get(&j, 0, "replicas");
    printf("%-40s %16s\n", "REPLICA", "LAST SYNC(ms)");
    for (int k = 0, i = reps + 1; reps >= 0 && k < atc_json_count(&j, reps); k++, i = atc_json_next(&j, i)) {
        json_text(&j, atc_json_get(&j, i, "name"), name, sizeof(name));
        json_text(&j, atc_json_get(&j, i, "last_sync_ms_ago"), last, sizeof(last));
        printf("%-40s %16s\n", name, last);
    }
    atc_json_dispose(&j);
    free(body);
}

static int cmd_status(const struct admin_target *t)
{
    char *body = NULL, *pol = NULL;
    int status = admin_call(t, "GET", "/admin/endpoints", &body);
    if (status != 200) {
        if (status > 0)
            print_error(status, body);
        free(body);
        return 1;
    }
    struct atc_json j = {0}, pj = {0};
    if (atc_json_parse(&j, body, strlen(body), NULL) < 0) {
        fprintf(stderr, "atc: cannot read the admin API's answer\n");
        free(body);
        return 1;
    }
    char version[32] = "-", errbuf[512] = "";
    if (admin_call(t, "GET", "/admin/policy", &pol) == 200 &&
        atc_json_parse(&pj, pol, strlen(pol), NULL) == 0) {
        json_text(&pj, atc_json_get(&pj, 0, "version"), version, sizeof(version));
        if (atc_json_string(&pj, atc_json_get(&pj, 0, "last_error"), errbuf, sizeof(errbuf), NULL) < 0)
            errbuf[0] = '\0';
    }
    /* INFLIGHT is this replica's; FLEET adds the other replicas' (cluster:) with their figures' age. */
    printf("%-28s %-20s %-10s %9s %9s %9s %10s %-22s %-8s %s\n", "ENDPOINT", "MODEL", "STATE", "INFLIGHT",
           "CAPACITY", "ERRORS", "TTFT(ms)", "FLEET(others, age)", "ENGINE", "ORIGIN");
    int eps = atc_json_get(&j, 0, "endpoints");
    for (int k = 0, i = eps + 1; k < atc_json_count(&j, eps); k++, i = atc_json_next(&j, i)) {
        char id[128], model[128], state[32], engine[32], inflight[16], capacity[16], errors[24], ttft[24],
            origin[16] = "-";
        json_text(&j, atc_json_get(&j, i, "id"), id, sizeof(id));
        json_text(&j, atc_json_get(&j, i, "model"), model, sizeof(model));
        int st = atc_json_get(&j, i, "state");
        if (st >= 0)
            json_text(&j, st, state, sizeof(state));
        else {
            json_text(&j, atc_json_get(&j, i, "routable"), state, sizeof(state));
            snprintf(state, sizeof(state), "%s", strcmp(state, "true") == 0 ? "healthy" : "draining");
        }
        json_text(&j, atc_json_get(&j, i, "engine"), engine, sizeof(engine));
        json_text(&j, atc_json_get(&j, i, "origin"), origin, sizeof(origin)); /* config, api, dns, simulate */
        char role[16] = "both";
        json_text(&j, atc_json_get(&j, i, "role"), role, sizeof(role));
        size_t elen = strlen(engine);
        if (strcmp(role, "both") != 0 && strcmp(role, "-") != 0) /* a disaggregated model's: "vllm prefill" */
            snprintf(engine + elen, sizeof(engine) - elen, " %s", role);
        json_text(&j, atc_json_get(&j, i, "inflight"), inflight, sizeof(inflight));
        json_text(&j, atc_json_get(&j, i, "capacity"), capacity, sizeof(capacity));
        json_text(&j, atc_json_get(&j, i, "errors_total"), errors, sizeof(errors));
        double v = 0, remote = 0, fleet = 0, age = 0;
        /* an endpoint that has not answered yet has no TTFT (not 0.000) */
        if (atc_json_number(&j, atc_json_get(&j, i, "ttft_ewma_ms"), &v) && v > 0)
            snprintf(ttft, sizeof(ttft), "%.1f", v);
        else
            snprintf(ttft, sizeof(ttft), "-");
        char others[48] = "-";
        if (atc_json_number(&j, atc_json_get(&j, i, "remote_age_ms"), &age) &&
            atc_json_number(&j, atc_json_get(&j, i, "remote_inflight"), &remote) &&
            atc_json_number(&j, atc_json_get(&j, i, "fleet_inflight"), &fleet))
            snprintf(others, sizeof(others), "%.0f (%.0f, %.1fs)", fleet, remote, age / 1000);
        printf("%-28s %-20s %-10s %9s %9s %9s %10s %-22s %-8s %s\n", id, model, state, inflight, capacity,
               errors, ttft, others, engine, origin);
    }
    char active[16], waiting[16] = "0";
    json_text(&j, atc_json_get(&j, 0, "active"), active, sizeof(active));
    int q = atc_json_get(&j, 0, "queues");
    if (atc_json_type(&j, q) == ATC_JSON_OBJECT) {
        json_text(&j, atc_json_get(&j, q, "waiting"), waiting, sizeof(waiting));
        print_queues(&j, atc_json_get(&j, q, "models"));
    }
    printf("\npolicy version %s; %s request(s) in progress, %s waiting for capacity\n", version, active,
           waiting);
    if (errbuf[0])
        printf("last policy error: %s\n", errbuf);
    print_cluster(t);
    print_rollout(&pj);
    atc_json_dispose(&j);
    atc_json_dispose(&pj);
    free(body);
    free(pol);
    return 0;
}

/* The shadow's and the canary's lines of atc status, from /admin/policy. */
static void print_rollout(const struct atc_json *pj)
{
    char a[32], b[32], c[32], d[32], e[32], f[32], last[640];
    int sh = atc_json_get(pj, 0, "shadow"), ca = atc_json_get(pj, 0, "canary");
    if (sh >= 0 && atc_json_type(pj, sh) == ATC_JSON_OBJECT) {
        json_text(pj, atc_json_get(pj, sh, "version"), a, sizeof(a));
        json_text(pj, atc_json_get(pj, sh, "live_version"), b, sizeof(b));
        json_text(pj, atc_json_get(pj, sh, "decisions"), c, sizeof(c));
        double agree = 0;
        if (atc_json_number(pj, atc_json_get(pj, sh, "agreement"), &agree))
            snprintf(d, sizeof(d), "%.2f", agree);
        else
            snprintf(d, sizeof(d), "-");
        json_text(pj, atc_json_get(pj, sh, "errors"), e, sizeof(e));
        json_text(pj, atc_json_get(pj, sh, "budget_overruns"), f, sizeof(f));
        printf("shadow v%s beside v%s: %s decisions, agreement %s, %s errors, %s overruns\n", a, b, c, d, e,
               f);
    }
    if (ca >= 0 && atc_json_type(pj, ca) == ATC_JSON_OBJECT) {
        int rq = atc_json_get(pj, ca, "requests"), cur = atc_json_get(pj, ca, "current");
        json_text(pj, atc_json_get(pj, ca, "version"), a, sizeof(a));
        json_text(pj, atc_json_get(pj, ca, "share"), b, sizeof(b));
        json_text(pj, atc_json_get(pj, rq, "decisions"), c, sizeof(c));
        json_text(pj, atc_json_get(pj, rq, "fallbacks"), d, sizeof(d));
        double p90 = 0;
        /* a fresh canary has no TTFT yet: "-", not "null ms" */
        if (atc_json_number(pj, atc_json_get(pj, rq, "ttft_p90_ms"), &p90))
            snprintf(e, sizeof(e), "%.1f ms", p90);
        else
            snprintf(e, sizeof(e), "-");
        if (atc_json_number(pj, atc_json_get(pj, cur, "ttft_p90_ms"), &p90))
            snprintf(f, sizeof(f), "%.1f ms", p90);
        else
            snprintf(f, sizeof(f), "-");
        printf("canary v%s for %s of the requests: %s decisions, %s fallbacks, TTFT p90 %s (current %s)\n", a, b,
               c, d, e, f);
    }
    int armed = atc_json_get(pj, 0, "canary_armed");
    if (armed >= 0 && atc_json_type(pj, armed) == ATC_JSON_OBJECT) {
        double share = 0, window_ms = 0;
        atc_json_number(pj, atc_json_get(pj, armed, "share"), &share);
        atc_json_number(pj, atc_json_get(pj, armed, "window_ms"), &window_ms);
        printf("canary armed for %g of the requests over %.0f s: the next change of the policy's files loads "
               "as it\n",
               share, window_ms / 1000);
    }
    if (atc_json_string(pj, atc_json_get(pj, 0, "last_canary"), last, sizeof(last), NULL) == 0)
        printf("last canary: %s\n", last);
}

static int post_with(const struct admin_target *t, const char *path, const char *send, const char *done)
{
    char *body = NULL;
    int status = admin_call_with(t, "POST", path, send, &body);
    if (status == 202) { /* accepted, to happen later: the answer says what it waits for */
        struct atc_json j = {0};
        char note[512];
        if (atc_json_parse(&j, body, strlen(body), NULL) == 0 &&
            atc_json_string(&j, atc_json_get(&j, 0, "note"), note, sizeof(note), NULL) == 0)
            printf("canary armed: %s\n", note);
        else
            printf("%s", body);
        atc_json_dispose(&j);
        free(body);
        return 0;
    }
    if (status == 200) {
        printf("%s: %s", done, body);
        free(body);
        return 0;
    }
    if (status > 0)
        print_error(status, body);
    free(body);
    return 1;
}

static int post(const struct admin_target *t, const char *path, const char *done)
{
    return post_with(t, path, "", done);
}

/* atc policy canary SHARE [WINDOW] | promote | rollback | shadow FILE [SAMPLE] | shadow clear */
static int cmd_policy(const struct admin_target *t, int argc, char **argv)
{
    char send[2048];
    const char *sub = argc > 0 ? argv[0] : "";
    if (strcmp(sub, "canary") == 0 && (argc == 2 || argc == 3)) {
        char *end;
        double share = strtod(argv[1], &end);
        if (*end != '\0' || !(share > 0 && share <= 1) || strchr(argc == 3 ? argv[2] : "", '"') != NULL) {
            fputs(usage_policy, stderr);
            return 2;
        }
        snprintf(send, sizeof(send), "{\"canary\":%g,\"window\":\"%s\"}", share, argc == 3 ? argv[2] : "5m");
        return post_with(t, "/admin/policy/reload", send, "canary loaded");
    }
    if ((strcmp(sub, "promote") == 0 || strcmp(sub, "rollback") == 0) && argc == 1)
        return post(t, sub[0] == 'p' ? "/admin/policy/promote" : "/admin/policy/rollback",
                    sub[0] == 'p' ? "canary promoted" : "canary rolled back");
    if (strcmp(sub, "shadow") == 0 && argc == 2 && strcmp(argv[1], "clear") == 0)
        return post(t, "/admin/policy/shadow/clear", "shadow removed");
    if (strcmp(sub, "shadow") == 0 && (argc == 2 || argc == 3) && strchr(argv[1], '"') == NULL) {
        char path[1024];
        if (realpath(argv[1], path) == NULL) { /* the server resolves nothing against our directory */
            fprintf(stderr, "atc policy shadow: %s: %s\n", argv[1], strerror(errno));
            return 1;
        }
        snprintf(send, sizeof(send), "{\"entry\":\"%s\",\"sample\":%s}", path, argc == 3 ? argv[2] : "1");
        return post_with(t, "/admin/policy/shadow", send, "shadow loaded");
    }
    fputs(usage_policy, stderr);
    return 2;
}

int atc_cli_main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"config", required_argument, NULL, 'c'}, {"admin", required_argument, NULL, 'a'},
        {"token", required_argument, NULL, 't'},  {"yaml", no_argument, NULL, 'r'},
        {"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0},
    };
    const char *cmd = argv[0], *config = NULL, *admin = NULL, *token = getenv("ATC_ADMIN_TOKEN");
    bool reload_config = false;
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "c:h", longopts, NULL)) != -1) {
        switch (ch) {
        case 'c':
            config = optarg;
            break;
        case 'a':
            admin = optarg;
            break;
        case 't':
            token = optarg;
            break;
        case 'r':
            if (strcmp(cmd, "reload") != 0) {
                fputs(usage_admin, stderr);
                return 2;
            }
            reload_config = true;
            break;
        case 'h':
            fputs(strcmp(cmd, "policy") == 0 ? usage_policy : usage_admin, stdout);
            return 0;
        default:
            fputs(usage_admin, stderr);
            return 2;
        }
    }
    /* --config once meant "the YAML too" when alone: it names a file now, always (one reading). */
    if (config != NULL && config[0] == '-') {
        fprintf(stderr, "atc %s: --config takes a FILE (got '%s'); to re-read the YAML: atc reload --yaml\n",
                cmd, config);
        return 2;
    }
    bool needs_id = strcmp(cmd, "drain") == 0 || strcmp(cmd, "enable") == 0;
    bool is_policy = strcmp(cmd, "policy") == 0;
    if (!is_policy && ((needs_id && optind + 1 != argc) || (!needs_id && optind != argc))) {
        fputs(usage_admin, stderr);
        return 2;
    }
    struct admin_target t = {.host = "127.0.0.1", .port = 8081};
    if (config != NULL) {
        struct atc_config *cfg = NULL;
        char *errors = NULL;
        if (atc_config_load(config, &cfg, &errors) < 0) {
            fprintf(stderr, "%s\n", errors);
            free(errors);
            return 1;
        }
        snprintf(t.host, sizeof(t.host), "%s", cfg->admin_host);
        t.port = cfg->admin_port;
        if (cfg->admin_token != NULL && token == NULL)
            snprintf(t.token, sizeof(t.token), "%s", cfg->admin_token);
        atc_config_free(cfg);
        if (t.port == 0) {
            fprintf(stderr, "atc: %s sets admin port 0 (any free port); give the address with --admin\n",
                    config);
            return 2;
        }
    }
    if (admin != NULL) {
        char *host = NULL;
        uint16_t port;
        if (atc_parse_hostport(admin, &host, &port, NULL) < 0 || port == 0) {
            fprintf(stderr, "atc: invalid --admin '%s' (want HOST:PORT)\n", admin);
            return 2;
        }
        snprintf(t.host, sizeof(t.host), "%s", host);
        t.port = port;
        free(host);
    }
    if (token != NULL)
        snprintf(t.token, sizeof(t.token), "%s", token);

    if (strcmp(cmd, "status") == 0)
        return cmd_status(&t);
    if (is_policy)
        return cmd_policy(&t, argc - optind, argv + optind);
    if (strcmp(cmd, "reload") == 0)
        return post(&t, reload_config ? "/admin/config/reload" : "/admin/policy/reload",
                    reload_config ? "reloaded the YAML and the policy" : "reloaded the policy");
    char path[512];
    snprintf(path, sizeof(path), "/admin/endpoints/%s/%s", argv[optind], cmd);
    return post(&t, path, cmd);
}
