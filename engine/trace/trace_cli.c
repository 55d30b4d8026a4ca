/* `atc trace import|stats|dump`: converting public traces, and what is in a trace. */

#include "trace/trace_cli.h"

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "trace/trace.h"
#include "sim/sim.h"
#include "trace/trace_import.h"
#include "trace/trace_lru.h"

static const char usage_trace[] =
    "usage: atc trace <import|stats|dump> ...\n"
    "\n"
    "  atc trace import --format mooncake|qwen|azure|jsonl IN -o OUT   convert a trace to atc's format\n"
    "  atc trace stats [--json] FILE                              counts, rates, lengths, prefix sharing\n"
    "  atc trace dump [--limit N] FILE                            records as JSON lines\n"
    "\n"
    "FILE may be an atc trace or any format import reads (told apart by content and name).\n"
    "atc trace <command> --help for each command's flags.\n";

static const char usage_import[] =
    "usage: atc trace import [--format FORMAT] [--model NAME] [--block-tokens N] [--max-errors N] IN -o OUT\n"
    "\n"
    "Converts a public trace into an atc trace (MessagePack, see docs/replay.md 'Trace format'). Malformed\n"
    "input lines are reported as IN:LINE: reason and skipped; the exit status is then 1 (OUT still holds\n"
    "every good line).\n"
    "\n"
    "  -f, --format FORMAT    mooncake (JSON lines: timestamp, input_length, output_length, hash_ids),\n"
    "                         qwen (Alibaba's Qwen-Bailian traces: those keys with chat_id and\n"
    "                         parent_chat_id, timestamp in seconds, 16-token hash ids; a conversation's\n"
    "                         turns share a session), azure (CSV: TIMESTAMP, ContextTokens,\n"
    "                         GeneratedTokens; or BurstGPT's Timestamp in seconds, Request tokens,\n"
    "                         Response tokens, its failed rows left out), jsonl (atc's record keys, as\n"
    "                         `atc trace dump` prints them), or auto (default: by content and file name)\n"
    "  -o, --output OUT       the atc trace to write (required)\n"
    "      --model NAME       model of requests whose trace names none (default llama-3-8b)\n"
    "      --block-tokens N   tokens per hash id (default: mooncake 512, qwen 16)\n"
    "      --max-errors N     give up after N malformed lines (default 100)\n"
    "  -h, --help             this text\n";

static const char usage_stats[] =
    "usage: atc trace stats [--json] FILE\n"
    "\n"
    "Prints what a trace holds: requests, duration and rates (mean, busiest second and minute), models,\n"
    "prompt and output length distributions, streaming, priorities, sessions, tenants; prefix sharing\n"
    "(blocks, distinct blocks, the share of blocks an unbounded cache would have served, and the hit\n"
    "rate of one LRU cache the size of 8 to 64 simulated servers' KV caches); and for\n"
    "recorded traffic, statuses, endpoints and latencies.\n"
    "\n"
    "  --json      one JSON object instead of text\n"
    "  -h, --help  this text\n";

static const char usage_dump[] =
    "usage: atc trace dump [--limit N] FILE\n"
    "\n"
    "Prints the header as a comment line, then each record as one JSON object per line; the output reads\n"
    "back with `atc trace import --format jsonl`.\n"
    "\n"
    "  --limit N   only the first N records\n"
    "  -h, --help  this text\n";

/* ---- a set of 64-bit keys (distinct blocks, sessions, tenants) ---- */

struct uset {
    uint64_t *slots; /* 0 = empty; key 0 is stored as 1 */
    size_t mask, n;
};

static int uset_add(struct uset *s, uint64_t k) /* 1 new, 0 present, -1 out of memory */
{
    k = k ? k : 1;
    if (s->slots == NULL || (s->n + 1) * 10 > (s->mask + 1) * 7) {
        size_t size = s->slots ? (s->mask + 1) * 2 : 1024;
        uint64_t *slots = calloc(size, sizeof(uint64_t));
        if (slots == NULL)
            return -1;
        for (size_t i = 0; s->slots != NULL && i <= s->mask; i++) {
            if (s->slots[i] == 0)
                continue;
            size_t j = (size_t)(s->slots[i] * 0x9E3779B97F4A7C15ull >> 20) & (size - 1);
            while (slots[j] != 0)
                j = (j + 1) & (size - 1);
            slots[j] = s->slots[i];
        }
        free(s->slots);
        s->slots = slots;
        s->mask = size - 1;
    }
    size_t j = (size_t)(k * 0x9E3779B97F4A7C15ull >> 20) & s->mask;
    for (; s->slots[j] != 0; j = (j + 1) & s->mask)
        if (s->slots[j] == k)
            return 0;
    s->slots[j] = k;
    s->n++;
    return 1;
}

static bool uset_has(const struct uset *s, uint64_t k)
{
    k = k ? k : 1;
    if (s->slots == NULL)
        return false;
    for (size_t j = (size_t)(k * 0x9E3779B97F4A7C15ull >> 20) & s->mask; s->slots[j] != 0;
         j = (j + 1) & s->mask)
        if (s->slots[j] == k)
            return true;
    return false;
}

/* ---- counting named things (models, statuses, endpoints) ---- */

struct tally_item {
    char name[64];
    size_t n;
};

struct tally {
    struct tally_item v[32];
    size_t n, other;
};

static void tally_add(struct tally *t, const char *name)
{
    for (size_t i = 0; i < t->n; i++) {
        if (strcmp(t->v[i].name, name) == 0) {
            t->v[i].n++;
            return;
        }
    }
    if (t->n == sizeof(t->v) / sizeof(t->v[0])) {
        t->other++;
        return;
    }
    snprintf(t->v[t->n].name, sizeof(t->v[t->n].name), "%s", name);
    t->v[t->n++].n = 1;
}

static int by_count(const void *a, const void *b)
{
    const struct tally_item *x = a, *y = b;
    return x->n < y->n ? 1 : x->n > y->n ? -1 : strcmp(x->name, y->name);
}

/* ---- distributions ---- */

struct dist {
    double *v;
    size_t n, cap;
    double sum;
};

static void dist_add(struct dist *d, double x)
{
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 1024;
        double *v = realloc(d->v, cap * sizeof(double));
        if (v == NULL)
            return;
        d->v = v;
        d->cap = cap;
    }
    d->v[d->n++] = x;
    d->sum += x;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of a sorted distribution; 0 when empty. */
static double pct(const struct dist *d, double p)
{
    if (d->n == 0)
        return 0;
    size_t k = (size_t)ceil(p / 100.0 * (double)d->n);
    return d->v[k > 0 ? k - 1 : 0];
}

struct trace_stats {
    size_t n;
    double duration_s;
    size_t peak_second, peak_minute;
    struct tally models, statuses, endpoints, decisions;
    struct dist prompt, output, max_tokens, ttft, total;
    size_t streamed, with_session, with_tenant, with_blocks, priorities[10];
    struct uset sessions, tenants, distinct;
    uint64_t blocks, reused_blocks, block_tokens;
    bool mixed_block_tokens;
    size_t requests_reusing;
};

static void compute(const struct atc_trace *t, struct trace_stats *s)
{
    memset(s, 0, sizeof(*s));
    s->n = t->n;
    s->duration_s = t->n ? (double)t->records[t->n - 1].at_us / 1e6 : 0;
    size_t sec_start = 0, min_start = 0;
    for (size_t i = 0; i < t->n; i++) {
        const struct atc_trace_record *r = &t->records[i];
        while (r->at_us - t->records[sec_start].at_us >= 1000000)
            sec_start++;
        while (r->at_us - t->records[min_start].at_us >= 60000000)
            min_start++;
        if (i - sec_start + 1 > s->peak_second)
            s->peak_second = i - sec_start + 1;
        if (i - min_start + 1 > s->peak_minute)
            s->peak_minute = i - min_start + 1;
        tally_add(&s->models, r->model[0] ? r->model : "(none)");
        dist_add(&s->prompt, r->prompt_tokens);
        if (r->output_tokens >= 0)
            dist_add(&s->output, (double)r->output_tokens);
        if (r->max_tokens >= 0)
            dist_add(&s->max_tokens, (double)r->max_tokens);
        s->streamed += r->stream;
        s->priorities[r->priority >= 0 && r->priority <= 9 ? r->priority : 0]++;
        if (r->session[0]) {
            s->with_session++;
            uset_add(&s->sessions, XXH3_64bits(r->session, strlen(r->session)));
        }
        if (r->tenant[0]) {
            s->with_tenant++;
            uset_add(&s->tenants, XXH3_64bits(r->tenant, strlen(r->tenant)));
        }
        if (r->nblocks > 0) {
            s->with_blocks++;
            if (s->block_tokens != 0 && s->block_tokens != r->block_tokens)
                s->mixed_block_tokens = true;
            s->block_tokens = r->block_tokens;
            /* Leading blocks seen before: what an unbounded prefix cache shared by all would serve. */
            size_t k = 0;
            while (k < r->nblocks && uset_has(&s->distinct, r->blocks[k]))
                k++;
            s->reused_blocks += k;
            s->requests_reusing += k > 0;
            s->blocks += r->nblocks;
            for (size_t j = 0; j < r->nblocks; j++)
                uset_add(&s->distinct, r->blocks[j]);
        }
        if (r->status != 0) {
            char st[16];
            snprintf(st, sizeof(st), "%d", r->status);
            tally_add(&s->statuses, st);
        }
        if (r->endpoint != NULL)
            tally_add(&s->endpoints, r->endpoint);
        if (r->decision != NULL)
            tally_add(&s->decisions, r->decision);
        if (r->ttft_ms >= 0)
            dist_add(&s->ttft, r->ttft_ms);
        if (r->total_ms >= 0)
            dist_add(&s->total, r->total_ms);
    }
    struct dist *all[] = {&s->prompt, &s->output, &s->max_tokens, &s->ttft, &s->total};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        if (all[i]->n > 0)
            qsort(all[i]->v, all[i]->n, sizeof(double), cmp_double);
    struct tally *tallies[] = {&s->models, &s->statuses, &s->endpoints, &s->decisions};
    for (size_t i = 0; i < sizeof(tallies) / sizeof(tallies[0]); i++)
        if (tallies[i]->n > 0)
            qsort(tallies[i]->v, tallies[i]->n, sizeof(tallies[i]->v[0]), by_count);
}

static void stats_free(struct trace_stats *s)
{
    free(s->prompt.v);
    free(s->output.v);
    free(s->max_tokens.v);
    free(s->ttft.v);
    free(s->total.v);
    free(s->sessions.slots);
    free(s->tenants.slots);
    free(s->distinct.slots);
}

static void print_dist(FILE *out, const char *name, const struct dist *d, const char *unit)
{
    if (d->n == 0)
        return;
    fprintf(out, "%-15s mean %.0f, p50 %.0f, p90 %.0f, p99 %.0f, max %.0f %s (%zu values)\n", name,
            d->sum / (double)d->n, pct(d, 50), pct(d, 90), pct(d, 99), d->v[d->n - 1], unit, d->n);
}

static void print_tally(FILE *out, const char *name, const struct tally *t)
{
    if (t->n == 0)
        return;
    fprintf(out, "%-15s", name);
    for (size_t i = 0; i < t->n && i < 12; i++)
        fprintf(out, "%s %s %zu", i ? "," : "", t->v[i].name, t->v[i].n);
    if (t->n > 12 || t->other)
        fprintf(out, ", ...");
    fputc('\n', out);
}

static void print_text(FILE *out, const char *path, const struct atc_trace *t, const struct trace_stats *s)
{
    fprintf(out, "%s: atc trace v%u, source %s%s\n", path, t->header.version,
            t->header.source[0] ? t->header.source : "?", t->header.text ? ", with prompt text" : "");
    fprintf(out, "%-15s %zu over %.1f s: %.2f req/s on average; busiest second %zu, busiest minute %zu\n",
            "requests", s->n, s->duration_s, s->duration_s > 0 ? (double)s->n / s->duration_s : 0.0,
            s->peak_second, s->peak_minute);
    print_tally(out, "models", &s->models);
    print_dist(out, "prompt", &s->prompt, "tokens");
    print_dist(out, "output", &s->output, "tokens");
    print_dist(out, "max_tokens", &s->max_tokens, "tokens");
    fprintf(out, "%-15s %zu streamed (%.1f%%)", "kinds", s->streamed,
            s->n ? 100.0 * (double)s->streamed / (double)s->n : 0.0);
    fprintf(out, "; priorities:");
    for (int p = 0; p < 10; p++)
        if (s->priorities[p])
            fprintf(out, " %d: %zu", p, s->priorities[p]);
    fputc('\n', out);
    fprintf(out, "%-15s %zu distinct sessions (%zu requests with one), %zu distinct tenants\n", "sessions",
            s->sessions.n, s->with_session, s->tenants.n);
    if (s->with_blocks > 0) {
        double kv = (double)s->distinct.n * (double)s->block_tokens;
        fprintf(out,
                "%-15s %llu blocks of %s%llu tokens in %zu requests, %zu distinct (%.*f%s tokens of KV to "
                "hold them all)\n",
                "prefix", (unsigned long long)s->blocks, s->mixed_block_tokens ? "mostly " : "",
                (unsigned long long)s->block_tokens, s->with_blocks, s->distinct.n, kv >= 1e6 ? 1 : 0,
                kv >= 1e6   ? kv / 1e6
                : kv >= 1e3 ? kv / 1e3
                            : kv,
                kv >= 1e6   ? "M"
                : kv >= 1e3 ? "k"
                            : "");
        fprintf(out,
                "%-15s %.1f%% of blocks repeat a prefix seen earlier (an unbounded shared cache's hit "
                "rate); %.1f%% of requests reuse at least one block\n",
                "prefix sharing", s->blocks ? 100.0 * (double)s->reused_blocks / (double)s->blocks : 0.0,
                100.0 * (double)s->requests_reusing / (double)s->with_blocks);
        /* The bound a fleet's caches could reach (trace_lru.h), at the simulated server's KV size. */
        struct atc_sim_params sp;
        atc_sim_params_init(&sp);
        fprintf(out, "%-15s", "pooled LRU");
        static const unsigned servers[] = {8, 16, 32, 64};
        for (size_t i = 0; i < sizeof(servers) / sizeof(servers[0]); i++) {
            uint64_t room = (uint64_t)servers[i] * sp.kv_blocks * ATC_SIM_KV_BLOCK_TOKENS;
            fprintf(out, "%s %u servers %.1f%%", i ? "," : "", servers[i],
                    100.0 * atc_trace_pooled_lru_hit_rate(t, 0, room));
        }
        fprintf(out, " (the hit rate of one LRU cache as large as N servers' KV caches of %uk tokens: the "
                     "most routing can reach)\n",
                sp.kv_blocks * ATC_SIM_KV_BLOCK_TOKENS / 1000);
        atc_sim_params_dispose(&sp);
    } else {
        fprintf(out, "%-15s none (the trace has no prefix block hashes)\n", "prefix");
    }
    print_tally(out, "statuses", &s->statuses);
    print_tally(out, "decisions", &s->decisions);
    print_tally(out, "endpoints", &s->endpoints);
    print_dist(out, "ttft", &s->ttft, "ms");
    print_dist(out, "total time", &s->total, "ms");
}

static void json_dist(FILE *out, const char *name, const struct dist *d)
{
    fprintf(out, ",\"%s\":{\"count\":%zu,\"mean\":%.3f,\"p50\":%.3f,\"p90\":%.3f,\"p99\":%.3f,\"max\":%.3f}",
            name, d->n, d->n ? d->sum / (double)d->n : 0.0, pct(d, 50), pct(d, 90), pct(d, 99),
            d->n ? d->v[d->n - 1] : 0.0);
}

static void json_tally(FILE *out, const char *name, const struct tally *t)
{
    fprintf(out, ",\"%s\":{", name);
    for (size_t i = 0; i < t->n; i++) {
        fputs(i ? ",\"" : "\"", out);
        for (const char *c = t->v[i].name; *c; c++) {
            if (*c == '"' || *c == '\\')
                fputc('\\', out);
            fputc((unsigned char)*c < 0x20 ? '?' : *c, out);
        }
        fprintf(out, "\":%zu", t->v[i].n);
    }
    fputc('}', out);
}

static void print_json(FILE *out, const struct atc_trace *t, const struct trace_stats *s)
{
    fprintf(out,
            "{\"version\":%u,\"source\":\"%s\",\"requests\":%zu,\"duration_s\":%.3f,\"rate_rps\":%.4f,"
            "\"peak_second\":%zu,\"peak_minute\":%zu",
            t->header.version, t->header.source, s->n, s->duration_s,
            s->duration_s > 0 ? (double)s->n / s->duration_s : 0.0, s->peak_second, s->peak_minute);
    json_tally(out, "models", &s->models);
    json_dist(out, "prompt_tokens", &s->prompt);
    json_dist(out, "output_tokens", &s->output);
    json_dist(out, "max_tokens", &s->max_tokens);
    fprintf(out, ",\"streamed\":%zu,\"priorities\":[", s->streamed);
    for (int p = 0; p < 10; p++)
        fprintf(out, "%s%zu", p ? "," : "", s->priorities[p]);
    fprintf(out, "],\"sessions\":%zu,\"requests_with_session\":%zu,\"tenants\":%zu", s->sessions.n,
            s->with_session, s->tenants.n);
    fprintf(out,
            ",\"prefix\":{\"requests\":%zu,\"block_tokens\":%llu,\"blocks\":%llu,\"distinct_blocks\":%zu,"
            "\"reused_blocks\":%llu,\"reuse_rate\":%.4f,\"requests_reusing\":%zu}",
            s->with_blocks, (unsigned long long)s->block_tokens, (unsigned long long)s->blocks, s->distinct.n,
            (unsigned long long)s->reused_blocks,
            s->blocks ? (double)s->reused_blocks / (double)s->blocks : 0.0, s->requests_reusing);
    json_tally(out, "statuses", &s->statuses);
    json_tally(out, "decisions", &s->decisions);
    json_tally(out, "endpoints", &s->endpoints);
    json_dist(out, "ttft_ms", &s->ttft);
    json_dist(out, "total_ms", &s->total);
    fputs("}\n", out);
}

/* ---- commands ---- */

static int load(const char *path, const struct atc_trace_import_options *o, struct atc_trace **t)
{
    char *err = NULL;
    size_t bad = 0;
    struct atc_trace_import_options opts = o != NULL ? *o : (struct atc_trace_import_options){0};
    opts.errors = stderr;
    if (atc_trace_load(path, &opts, t, &bad, &err) < 0) {
        fprintf(stderr, "%s\n", err != NULL ? err : "cannot load the trace");
        free(err);
        return -1;
    }
    if (bad > 0)
        fprintf(stderr, "%s: %zu malformed line(s) skipped\n", path, bad);
    return bad > 0 ? 1 : 0;
}

static int cmd_import(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"format", required_argument, NULL, 'f'},
        {"output", required_argument, NULL, 'o'},
        {"model", required_argument, NULL, 'm'},
        {"block-tokens", required_argument, NULL, 'b'},
        {"max-errors", required_argument, NULL, 'e'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct atc_trace_import_options o = {0};
    const char *out = NULL;
    char *end;
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "f:o:h", longopts, NULL)) != -1) {
        switch (ch) {
        case 'f':
            if (atc_trace_format_parse(optarg, &o.format) < 0) {
                fprintf(stderr, "atc trace import: unknown format '%s' (mooncake, qwen, azure, jsonl, auto)\n",
                        optarg);
                return 2;
            }
            break;
        case 'o':
            out = optarg;
            break;
        case 'm':
            o.model = optarg;
            break;
        case 'b':
            o.block_tokens = (uint32_t)strtoul(optarg, &end, 10);
            if (*end != '\0' || o.block_tokens == 0) {
                fprintf(stderr, "atc trace import: --block-tokens must be a whole number > 0\n");
                return 2;
            }
            break;
        case 'e':
            o.max_errors = strtoul(optarg, &end, 10);
            if (*end != '\0' || o.max_errors == 0) {
                fprintf(stderr, "atc trace import: --max-errors must be a whole number > 0\n");
                return 2;
            }
            break;
        case 'h':
            fputs(usage_import, stdout);
            return 0;
        default:
            fputs(usage_import, stderr);
            return 2;
        }
    }
    if (optind != argc - 1 || out == NULL) {
        fprintf(stderr, "atc trace import: %s\n%s",
                out == NULL ? "-o OUT is required" : "one input file expected", usage_import);
        return 2;
    }
    struct atc_trace *t;
    int rc = load(argv[optind], &o, &t);
    if (rc < 0)
        return 1;
    char *err = NULL;
    if (atc_trace_save(t, out, &err) < 0) {
        fprintf(stderr, "%s\n", err != NULL ? err : "cannot write");
        free(err);
        atc_trace_free(t);
        return 1;
    }
    fprintf(stderr, "%s: %zu requests from %s (%s)\n", out, t->n, argv[optind], t->header.source);
    atc_trace_free(t);
    return rc;
}

static int cmd_stats(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    bool json = false;
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (ch) {
        case 'j':
            json = true;
            break;
        case 'h':
            fputs(usage_stats, stdout);
            return 0;
        default:
            fputs(usage_stats, stderr);
            return 2;
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "atc trace stats: one trace file expected\n%s", usage_stats);
        return 2;
    }
    struct atc_trace *t;
    int rc = load(argv[optind], NULL, &t);
    if (rc < 0)
        return 1;
    struct trace_stats s;
    compute(t, &s);
    if (json)
        print_json(stdout, t, &s);
    else
        print_text(stdout, argv[optind], t, &s);
    stats_free(&s);
    atc_trace_free(t);
    return rc;
}

static int cmd_dump(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"limit", required_argument, NULL, 'l'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    size_t limit = SIZE_MAX;
    char *end;
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (ch) {
        case 'l':
            limit = strtoul(optarg, &end, 10);
            if (*end != '\0') {
                fprintf(stderr, "atc trace dump: --limit must be a whole number\n");
                return 2;
            }
            break;
        case 'h':
            fputs(usage_dump, stdout);
            return 0;
        default:
            fputs(usage_dump, stderr);
            return 2;
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "atc trace dump: one trace file expected\n%s", usage_dump);
        return 2;
    }
    /* Streamed record by record for atc traces, so a large recording dumps in constant memory. */
    char *err = NULL;
    struct atc_trace_header h;
    struct atc_trace_reader *rd = atc_trace_open(argv[optind], &h, &err);
    if (rd == NULL) {
        free(err);
        struct atc_trace *t;
        int rc = load(argv[optind], NULL, &t);
        if (rc < 0)
            return 1;
        printf("# atc trace v%u, source %s, %zu records%s\n", t->header.version, t->header.source, t->n,
               t->header.text ? ", with prompt text" : "");
        for (size_t i = 0; i < t->n && i < limit; i++)
            atc_trace_record_json(stdout, &t->records[i]);
        atc_trace_free(t);
        return rc;
    }
    printf("# atc trace v%u, source %s, created %.3f by atc %s%s\n", h.version, h.source, h.created,
           h.atc_version, h.text ? ", with prompt text" : "");
    struct atc_trace_record r;
    int rc = 0;
    for (size_t i = 0; i < limit && (rc = atc_trace_read(rd, &r, &err)) > 0; i++)
        atc_trace_record_json(stdout, &r);
    atc_trace_close(rd);
    if (rc < 0) {
        fprintf(stderr, "%s\n", err != NULL ? err : "read error");
        free(err);
        return 1;
    }
    return 0;
}

int atc_trace_main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        fputs(usage_trace, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "import") == 0)
        return cmd_import(argc - 1, argv + 1);
    if (strcmp(argv[1], "stats") == 0)
        return cmd_stats(argc - 1, argv + 1);
    if (strcmp(argv[1], "dump") == 0)
        return cmd_dump(argc - 1, argv + 1);
    fprintf(stderr, "atc trace: unknown command '%s'\n%s", argv[1], usage_trace);
    return 2;
}
