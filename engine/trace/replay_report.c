/* Replay reports (replay.h): the terminal table, JSON, and a self-contained HTML page whose charts are
 * inline SVG (no script, no network). */

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "trace/replay.h"
#include "trace/replay_ideal.h"
#include "trace/replay_report.h"

/* The footnote every report gives the ideal fleet (replay_ideal.h). */
#define IDEAL_NOTE                                                                                           \
    "ideal fleet: the fleet's KV caches pooled into one LRU cache, its servers as parallel prefill lanes "   \
    "and one\n"                                                                                              \
    "central FIFO queue (TTFT = queue wait + prefill of the uncached tokens + one decode step); /ideal: a\n" \
    "policy's TTFT p90 over the ideal's. It ignores decode interference: a target, not a strict bound."

static void fmt_ms(char *buf, size_t size, double ms)
{
    if (ms >= 100000)
        snprintf(buf, size, "%.0fs", ms / 1000);
    else if (ms >= 10000)
        snprintf(buf, size, "%.1fs", ms / 1000);
    else
        snprintf(buf, size, "%.0f", ms);
}

double atc_replay_vs_ideal(const struct atc_replay_result *r, const struct atc_replay_ideal *ideal)
{
    return ideal != NULL && ideal->ttft_p90_ms > 0 && !r->live ? r->ttft_p90_ms / ideal->ttft_p90_ms : 0;
}

void atc_replay_report_table(FILE *out, const char *title, const struct atc_replay_result *r, size_t n,
                             const struct atc_replay_ideal *ideal)
{
    fprintf(out, "%s\n\n", title);
    fprintf(out, "%-22s %8s %8s %8s %6s %8s %8s %7s %7s %7s %9s %6s %6s %14s %7s\n", "policy",
            "ttft p50", "p90", "p99", "/ideal", "e2e p50", "p99", "itl p50", "p90", "req/s", "out tok/s",
            "cache", "imbal", "queued (p99)", "errors");
    if (ideal != NULL) {
        char a[16], b[16], c[16];
        fmt_ms(a, sizeof(a), ideal->ttft_p50_ms);
        fmt_ms(b, sizeof(b), ideal->ttft_p90_ms);
        fmt_ms(c, sizeof(c), ideal->ttft_p99_ms);
        fprintf(out, "%-22s %8s %8s %8s %6s %8s %8s %7s %7s %7s %9s %5.1f%% %6s %14s %7s\n",
                "(ideal fleet)", a, b, c, "1.00", "-", "-", "-", "-", "-", "-", 100 * ideal->cache_hit_rate,
                "-", "-", "-");
    }
    for (size_t i = 0; i < n; i++) {
        const struct atc_replay_result *x = &r[i];
        char a[16], b[16], c[16], d[16], e[16], q[48], w[16], i50[16], i90[16];
        fmt_ms(a, sizeof(a), x->ttft_p50_ms);
        fmt_ms(b, sizeof(b), x->ttft_p90_ms);
        fmt_ms(c, sizeof(c), x->ttft_p99_ms);
        fmt_ms(d, sizeof(d), x->e2e_p50_ms);
        fmt_ms(e, sizeof(e), x->e2e_p99_ms);
        fmt_ms(w, sizeof(w), x->queue_wait_p99_ms);
        snprintf(i50, sizeof(i50), "%.1f", x->itl_p50_ms);
        snprintf(i90, sizeof(i90), "%.1f", x->itl_p90_ms);
        if (x->queued > 0)
            snprintf(q, sizeof(q), "%zu (%s)", x->queued, w);
        else
            snprintf(q, sizeof(q), "0");
        char cache[16], imbal[16];
        snprintf(cache, sizeof(cache), x->live ? "-" : "%.1f%%", 100 * x->cache_hit_rate);
        snprintf(imbal, sizeof(imbal), x->live ? "-" : "%.2f", x->imbalance);
        char vs[16];
        double ratio = atc_replay_vs_ideal(x, ideal);
        snprintf(vs, sizeof(vs), ratio > 0 ? "%.2f" : "-", ratio);
        fprintf(out, "%-22.22s %8s %8s %8s %6s %8s %8s %7s %7s %7.2f %9.0f %6s %6s %14s %7llu\n", x->name, a,
                b, c, vs, d, e, i50, i90, x->throughput_rps, x->output_tps, cache, imbal, q,
                (unsigned long long)(x->policy_errors + x->budget_overruns));
    }
    fputs("\nlatencies in ms (s where marked); itl: each request's mean inter-token latency, (last token - "
          "first) / (tokens - 1); cache: prefix blocks found in the server's KV cache / blocks "
          "requested;\nimbal: mean over time of max / mean requests in flight per endpoint (of the models "
          "asked "
          "for); queued: requests\nthat waited for capacity in front of the fleet (p99 of their wait); "
          "errors: policy failures and "
          "budget overruns\n(those requests went to the built-in balancer).\n",
          out);
    if (ideal != NULL)
        fputs(IDEAL_NOTE "\n", out);
    for (size_t i = 0; i < n; i++) {
        const struct atc_replay_result *x = &r[i];
        if (x->rejected || x->unserved || x->completed != x->requests)
            fprintf(out, "%s: %zu of %zu requests completed (%zu rejected, %zu never left the queue)\n",
                    x->name, x->completed, x->requests, x->rejected, x->unserved);
        if (x->budget_overruns)
            fprintf(out, "%s: %llu budget overruns\n", x->name, (unsigned long long)x->budget_overruns);
    }
    for (int by = 0; by < 2; by++) /* TTFT per tenant, then per priority, where the trace has them */
        for (size_t i = 0; i < n; i++) {
            const struct atc_replay_group *g = by == 0 ? r[i].tenants : r[i].priorities;
            size_t ng = by == 0 ? r[i].ntenants : r[i].npriorities;
            const char *what = by == 0 ? "tenant" : "priority";
            if (ng > 0)
                fprintf(out, "\n%s: ttft per %s\n  %-24s %9s %8s %8s %8s\n", r[i].name, what, what,
                        "requests", "p50", "p90", "p99");
            for (size_t k = 0; k < ng; k++) {
                char a[16], b[16], c[16];
                fmt_ms(a, sizeof(a), g[k].ttft_p50_ms);
                fmt_ms(b, sizeof(b), g[k].ttft_p90_ms);
                fmt_ms(c, sizeof(c), g[k].ttft_p99_ms);
                fprintf(out, "  %-24.24s %9zu %8s %8s %8s\n", g[k].name, g[k].requests, a, b, c);
            }
        }
    for (size_t i = 0; i < n; i++) /* servers that joined or left the fleet (from: / until:) */
        for (size_t k = 0; k < r[i].nendpoints; k++) {
            const struct atc_replay_endpoint_result *e = &r[i].endpoints[k];
            if (e->from_ms == 0 && e->until_ms == 0)
                continue;
            char until[48] = "the end";
            if (e->until_ms > 0)
                snprintf(until, sizeof(until), "%.1f s", (double)e->until_ms / 1000.0);
            fprintf(out, "%s: %s in the fleet from %.1f s to %s: %llu requests", r[i].name, e->id,
                    (double)e->from_ms / 1000.0, until, (unsigned long long)e->requests);
            if (e->until_ms > 0)
                fprintf(out, " (%llu in flight as it left, finished there)",
                        (unsigned long long)e->inflight_at_leave);
            fputc('\n', out);
        }
    fprintf(out, "replayed in");
    for (size_t i = 0; i < n; i++)
        fprintf(out, "%s %s %.2f s", i ? "," : "", r[i].name, r[i].wall_s);
    fputs(" (wall clock)\n", out);
}

static void json_str(FILE *out, const char *s)
{
    atc_json_fwrite_string(out, s != NULL ? s : "", s != NULL ? strlen(s) : 0);
}

/* Numbers rounded to the microsecond / 4 decimals, so the same run prints the same text. */
void atc_replay_report_json_string(FILE *out, const char *s)
{
    if (s != NULL)
        json_str(out, s);
    else
        fputs("null", out);
}

void atc_replay_report_json_ideal(FILE *out, const struct atc_replay_ideal *ideal)
{
    if (ideal == NULL) {
        fputs("null", out);
        return;
    }
    fprintf(out,
            "{\"requests\":%zu,\"ttft_p50_ms\":%.3f,\"ttft_p90_ms\":%.3f,\"ttft_p99_ms\":%.3f,"
            "\"cache_hit_rate\":%.4f}",
            ideal->requests, ideal->ttft_p50_ms, ideal->ttft_p90_ms, ideal->ttft_p99_ms,
            ideal->cache_hit_rate);
}

void atc_replay_report_json(FILE *out, const char *trace, const char *fleet, uint64_t seed,
                            const struct atc_replay_result *r, size_t n, const struct atc_replay_ideal *ideal)
{
    fputs("{\"trace\":", out);
    json_str(out, trace);
    fputs(",\"fleet\":", out);
    atc_replay_report_json_string(out, fleet);
    fprintf(out, ",\"seed\":%llu,\"ideal\":", (unsigned long long)seed);
    atc_replay_report_json_ideal(out, ideal);
    fputs(",\"policies\":", out);
    atc_replay_report_json_policies(out, r, n, ideal);
    fputs("}\n", out);
}

/* ,"KEY":[{"name":..., "requests", "completed", TTFT percentiles}, ...] ([] when the trace has none). */
static void json_groups(FILE *out, const char *key, const struct atc_replay_group *g, size_t n)
{
    fprintf(out, ",\"%s\":[", key);
    for (size_t k = 0; k < n; k++) {
        fputs(k ? ",{\"name\":" : "{\"name\":", out);
        json_str(out, g[k].name);
        fprintf(out,
                ",\"requests\":%zu,\"completed\":%zu,\"ttft_p50_ms\":%.3f,\"ttft_p90_ms\":%.3f,"
                "\"ttft_p99_ms\":%.3f}",
                g[k].requests, g[k].completed, g[k].ttft_p50_ms, g[k].ttft_p90_ms, g[k].ttft_p99_ms);
    }
    fputc(']', out);
}

void atc_replay_report_json_policies(FILE *out, const struct atc_replay_result *r, size_t n,
                                     const struct atc_replay_ideal *ideal)
{
    fputc('[', out);
    for (size_t i = 0; i < n; i++) {
        const struct atc_replay_result *x = &r[i];
        /* A live replay measures at the client: the fleet's cache and load are not known there. */
        char cache[32], imbal[32], imbal_max[32];
        snprintf(cache, sizeof(cache), x->live ? "null" : "%.4f", x->cache_hit_rate);
        snprintf(imbal, sizeof(imbal), x->live ? "null" : "%.4f", x->imbalance);
        snprintf(imbal_max, sizeof(imbal_max), x->live ? "null" : "%.4f", x->imbalance_max);
        fputs(i ? ",\n{\"name\":" : "\n{\"name\":", out);
        json_str(out, x->name);
        fputs(",\"entry\":", out);
        json_str(out, x->entry);
        double ratio = atc_replay_vs_ideal(x, ideal);
        if (ratio > 0)
            fprintf(out, ",\"ttft_p90_vs_ideal\":%.4f", ratio);
        else
            fputs(",\"ttft_p90_vs_ideal\":null", out);
        fprintf(out,
                ",\"requests\":%zu,\"completed\":%zu,\"rejected\":%zu,\"unserved\":%zu,"
                "\"ttft_p50_ms\":%.3f,\"ttft_p90_ms\":%.3f,\"ttft_p99_ms\":%.3f,\"ttft_mean_ms\":%.3f,"
                "\"e2e_p50_ms\":%.3f,\"e2e_p99_ms\":%.3f,\"itl_p50_ms\":%.3f,\"itl_p90_ms\":%.3f,"
                "\"throughput_rps\":%.4f,\"output_tps\":%.4f,"
                "\"output_tokens\":%llu,\"duration_s\":%.6f,\"cache_hit_rate\":%s,\"prefix_blocks\":%llu,"
                "\"prefix_block_hits\":%llu,\"imbalance\":%s,\"imbalance_max\":%s,\"work_imbalance\":%.4f,"
                "\"queued\":%zu,"
                "\"queue_wait_p50_ms\":%.3f,\"queue_wait_p99_ms\":%.3f,\"queue_wait_max_ms\":%.3f,"
                "\"decisions\":%llu,\"fallbacks\":%llu,\"policy_errors\":%llu,\"budget_overruns\":%llu,"
                "\"preemptions\":%llu,\"endpoints\":[",
                x->requests, x->completed, x->rejected, x->unserved, x->ttft_p50_ms, x->ttft_p90_ms,
                x->ttft_p99_ms, x->ttft_mean_ms, x->e2e_p50_ms, x->e2e_p99_ms, x->itl_p50_ms, x->itl_p90_ms,
                x->throughput_rps,
                x->output_tps, (unsigned long long)x->output_tokens, x->duration_s, cache,
                (unsigned long long)x->prefix_blocks, (unsigned long long)x->prefix_block_hits, imbal,
                imbal_max, x->work_imbalance, x->queued, x->queue_wait_p50_ms, x->queue_wait_p99_ms,
                x->queue_wait_max_ms, (unsigned long long)x->decisions, (unsigned long long)x->fallbacks,
                (unsigned long long)x->policy_errors, (unsigned long long)x->budget_overruns,
                (unsigned long long)x->preemptions);
        for (size_t k = 0; k < x->nendpoints; k++) {
            const struct atc_replay_endpoint_result *e = &x->endpoints[k];
            fputs(k ? ",{\"id\":" : "{\"id\":", out);
            json_str(out, e->id);
            fprintf(out, ",\"requests\":%llu,\"cache_hit_rate\":%.4f,\"preemptions\":%llu",
                    (unsigned long long)e->requests,
                    e->prefix_blocks ? (double)e->prefix_block_hits / (double)e->prefix_blocks : 0.0,
                    (unsigned long long)e->preemptions);
            if (e->from_ms > 0 || e->until_ms > 0) /* from: / until: (null: the start / the end) */
                fprintf(out, ",\"window\":{\"from_s\":%.3f,\"until_s\":", (double)e->from_ms / 1000.0);
            if (e->until_ms > 0)
                fprintf(out, "%.3f,\"inflight_at_leave\":%llu}", (double)e->until_ms / 1000.0,
                        (unsigned long long)e->inflight_at_leave);
            else if (e->from_ms > 0)
                fputs("null,\"inflight_at_leave\":null}", out);
            fputc('}', out);
        }
        fputc(']', out);
        /* the guessed index against what the chosen server held (null in a live replay: not known) */
        if (!x->live)
            fprintf(out,
                    ",\"around\":%zu,\"guess\":{\"samples\":%llu,\"guessed_cached_tokens\":%llu,"
                    "\"actual_cached_tokens\":%llu,\"error_tokens\":%llu,\"exact_samples\":%llu,"
                    "\"exact_error_tokens\":%llu}",
                    x->around, (unsigned long long)x->guess_samples,
                    (unsigned long long)x->guessed_cached_tokens, (unsigned long long)x->actual_cached_tokens,
                    (unsigned long long)x->guess_error_tokens, (unsigned long long)x->exact_samples,
                    (unsigned long long)x->exact_error_tokens);
        else
            fputs(",\"around\":null,\"guess\":null", out);
        /* against the trace's recorded picks: null when it recorded none */
        if (x->recorded_live > 0)
            fprintf(out, ",\"agreement\":{\"live\":%.4f,\"live_picks\":%zu",
                    (double)x->agree_live / (double)x->recorded_live, x->recorded_live);
        else
            fputs(",\"agreement\":{\"live\":null,\"live_picks\":0", out);
        if (x->recorded_shadow > 0)
            fprintf(out, ",\"shadow\":%.4f,\"shadow_picks\":%zu}",
                    (double)x->agree_shadow / (double)x->recorded_shadow, x->recorded_shadow);
        else
            fputs(",\"shadow\":null,\"shadow_picks\":0}", out);
        json_groups(out, "tenants", x->tenants, x->ntenants);
        json_groups(out, "priorities", x->priorities, x->npriorities);
        fputc('}', out);
    }
    fputs("\n]", out);
}

/* ---- HTML ---- */

static const char *const palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                      "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
#define NCOLORS (sizeof(palette) / sizeof(palette[0]))

void atc_replay_report_html_text(FILE *out, const char *s)
{
    for (; *s; s++) {
        if (*s == '<')
            fputs("&lt;", out);
        else if (*s == '>')
            fputs("&gt;", out);
        else if (*s == '&')
            fputs("&amp;", out);
        else if (*s == '"')
            fputs("&quot;", out);
        else
            fputc(*s, out);
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define W 860
#define H 300
#define ML 60 /* margins */
#define MR 20
#define MT 20
#define MB 40

/* The TTFT distribution of each policy as a CDF, on a log scale of milliseconds. */
/* An SVG chart's start: the drawing of W x H and the frame of its plot area (margins ML, MR, MT, MB). */
static void svg_frame(FILE *out)
{
    fprintf(out,
            "<svg width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" xmlns=\"http://www.w3.org/2000/svg\">\n",
            W, H, W, H);
    fprintf(out, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#999\"/>\n", ML,
            MT, W - ML - MR, H - MT - MB);
}

static void chart_ttft(FILE *out, const struct atc_replay_result *r, size_t n)
{
    double lo = HUGE_VAL, hi = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < r[i].requests; k++)
            if (!isnan(r[i].ttft_ms[k])) {
                double v = r[i].ttft_ms[k] > 1 ? r[i].ttft_ms[k] : 1;
                lo = v < lo ? v : lo;
                hi = v > hi ? v : hi;
            }
    if (!(hi > 0)) {
        fputs("<p>no request completed.</p>\n", out);
        return;
    }
    double llo = floor(log10(lo)), lhi = ceil(log10(hi));
    if (lhi <= llo)
        lhi = llo + 1;
    svg_frame(out);
    for (double d = llo; d <= lhi; d++) {
        double x = ML + (d - llo) / (lhi - llo) * (W - ML - MR);
        fprintf(out, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#ddd\"/>", x, MT, x, H - MB);
        fprintf(out, "<text x=\"%.1f\" y=\"%d\" font-size=\"11\" text-anchor=\"%s\">%g ms</text>\n", x,
                H - MB + 15, d == lhi ? "end" : "middle", pow(10, d));
    }
    for (int q = 0; q <= 4; q++) {
        double y = MT + (1 - q / 4.0) * (H - MT - MB);
        fprintf(out, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#eee\"/>", ML, y, W - MR, y);
        fprintf(out, "<text x=\"%d\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%d%%</text>\n", ML - 5,
                y + 4, q * 25);
    }
    for (size_t i = 0; i < n; i++) {
        double *v = malloc((r[i].requests ? r[i].requests : 1) * sizeof(double));
        size_t m = 0;
        if (v == NULL)
            continue;
        for (size_t k = 0; k < r[i].requests; k++)
            if (!isnan(r[i].ttft_ms[k]))
                v[m++] = r[i].ttft_ms[k] > 1 ? r[i].ttft_ms[k] : 1;
        qsort(v, m, sizeof(double), cmp_double);
        fprintf(out, "<polyline fill=\"none\" stroke-width=\"1.5\" stroke=\"%s\" points=\"",
                palette[i % NCOLORS]);
        size_t step = m > 400 ? m / 400 : 1; /* a few hundred points draw the same curve */
        for (size_t k = 0; k < m; k += step) {
            double x = ML + (log10(v[k]) - llo) / (lhi - llo) * (W - ML - MR);
            double y = MT + (1 - (double)(k + 1) / (double)m) * (H - MT - MB);
            fprintf(out, "%.1f,%.1f ", x, y);
        }
        if (m > 0)
            fprintf(out, "%.1f,%d", ML + (log10(v[m - 1]) - llo) / (lhi - llo) * (W - ML - MR), MT);
        fputs("\"/>\n", out);
        fprintf(out, "<text x=\"%d\" y=\"%zu\" font-size=\"12\" fill=\"%s\">", ML + 10, MT + 16 + 15 * i,
                palette[i % NCOLORS]);
        atc_replay_report_html_text(out, r[i].name);
        fputs("</text>\n", out);
        free(v);
    }
    fputs("</svg>\n", out);
}

/* Requests in flight per endpoint over (virtual) time for one policy. */
static void chart_load(FILE *out, const struct atc_replay_result *r)
{
    if (r->nsamples == 0 || r->nendpoints == 0)
        return;
    unsigned hi = 1;
    for (size_t s = 0; s < r->nsamples * r->nendpoints; s++)
        hi = r->sample_inflight[s] > hi ? r->sample_inflight[s] : hi;
    double t0 = r->sample_s[0], t1 = r->sample_s[r->nsamples - 1];
    if (t1 <= t0)
        t1 = t0 + 1;
    svg_frame(out);
    for (int q = 0; q <= 4; q++) {
        double y = MT + (1 - q / 4.0) * (H - MT - MB);
        fprintf(out, "<text x=\"%d\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%.0f</text>\n", ML - 5,
                y + 4, hi * q / 4.0);
        double x = ML + q / 4.0 * (W - ML - MR);
        fprintf(out, "<text x=\"%.1f\" y=\"%d\" font-size=\"11\" text-anchor=\"middle\">%.0f s</text>\n", x,
                H - MB + 15, t0 + (t1 - t0) * q / 4.0);
    }
    for (size_t k = 0; k < r->nendpoints; k++) {
        fprintf(out, "<polyline fill=\"none\" stroke-width=\"1\" stroke=\"%s\" points=\"",
                palette[k % NCOLORS]);
        for (size_t s = 0; s < r->nsamples; s++) {
            double x = ML + (r->sample_s[s] - t0) / (t1 - t0) * (W - ML - MR);
            double y = MT + (1 - (double)r->sample_inflight[s * r->nendpoints + k] / hi) * (H - MT - MB);
            fprintf(out, "%.1f,%.1f ", x, y);
        }
        fputs("\"/>\n", out);
        if (k < 16) {
            fprintf(out, "<text x=\"%zu\" y=\"%d\" font-size=\"11\" fill=\"%s\">", ML + 8 + 130 * (k % 6),
                    MT + 14 + 13 * (int)(k / 6), palette[k % NCOLORS]);
            atc_replay_report_html_text(out, r->endpoints[k].id);
            fputs("</text>\n", out);
        }
    }
    fputs("</svg>\n", out);
}

int atc_replay_report_html(const char *path, const char *title, const struct atc_replay_result *r, size_t n,
                           const struct atc_replay_ideal *ideal, char **err)
{
    FILE *out = fopen(path, "w");
    if (out == NULL) {
        if (asprintf(err, "%s: cannot create: %s", path, strerror(errno)) < 0)
            *err = NULL;
        return -1;
    }
    fputs("<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>atc replay</title>\n"
          "<style>body{font-family:sans-serif;margin:2em;color:#222}table{border-collapse:collapse}"
          "td,th{padding:4px 10px;border-bottom:1px solid #ddd;text-align:right}td:first-child,th:first-child"
          "{text-align:left}h2{margin-top:2em}</style></head><body>\n<h1>atc replay</h1>\n<p>",
          out);
    atc_replay_report_html_text(out, title);
    fputs("</p>\n<table><tr><th>policy</th><th>requests</th><th>TTFT p50</th><th>p90</th><th>p99</th>"
          "<th>p90 / ideal</th><th>e2e p50</th><th>p99</th><th>req/s</th><th>output tok/s</th><th>cache "
          "hit</th><th>imbalance</th>"
          "<th>queued</th><th>policy errors</th><th>budget overruns</th></tr>\n",
          out);
    if (ideal != NULL)
        fprintf(
            out,
            "<tr><td>ideal fleet</td><td>%zu</td><td>%.0f ms</td><td>%.0f ms</td><td>%.0f "
            "ms</td><td>1.00</td>"
            "<td>-</td><td>-</td><td>-</td><td>-</td><td>%.1f%%</td><td>-</td><td>-</td><td>-</td><td>-</td>"
            "</tr>\n",
            ideal->requests, ideal->ttft_p50_ms, ideal->ttft_p90_ms, ideal->ttft_p99_ms,
            100 * ideal->cache_hit_rate);
    for (size_t i = 0; i < n; i++) {
        const struct atc_replay_result *x = &r[i];
        double ratio = atc_replay_vs_ideal(x, ideal);
        char vs[16];
        snprintf(vs, sizeof(vs), ratio > 0 ? "%.2f" : "-", ratio);
        fprintf(out, "<tr><td style=\"color:%s\">", palette[i % NCOLORS]);
        atc_replay_report_html_text(out, x->name);
        fprintf(out,
                "</td><td>%zu</td><td>%.0f ms</td><td>%.0f ms</td><td>%.0f ms</td><td>%s</td><td>%.0f ms</td>"
                "<td>%.0f ms</td>"
                "<td>%.2f</td><td>%.0f</td><td>%.1f%%</td><td>%.2f</td><td>%zu</td><td>%llu</td><td>%llu</"
                "td></tr>\n",
                x->requests, x->ttft_p50_ms, x->ttft_p90_ms, x->ttft_p99_ms, vs, x->e2e_p50_ms, x->e2e_p99_ms,
                x->throughput_rps, x->output_tps, 100 * x->cache_hit_rate, x->imbalance, x->queued,
                (unsigned long long)x->policy_errors, (unsigned long long)x->budget_overruns);
    }
    fputs("</table>\n", out);
    for (size_t i = 0; i < n && r[i].recorded_live > 0; i++) { /* a recorded trace: its live picks */
        fputs("<p>", out);
        atc_replay_report_html_text(out, r[i].name);
        fprintf(out, ": agreement with the recorded live picks %zu/%zu (%.4f)", r[i].agree_live,
                r[i].recorded_live, (double)r[i].agree_live / (double)r[i].recorded_live);
        if (r[i].recorded_shadow > 0)
            fprintf(out, ", with the recorded shadow picks %zu/%zu (%.4f)", r[i].agree_shadow,
                    r[i].recorded_shadow, (double)r[i].agree_shadow / (double)r[i].recorded_shadow);
        fputs("</p>\n", out);
    }
    if (ideal != NULL) {
        fputs("<p><small>", out);
        atc_replay_report_html_text(out, IDEAL_NOTE);
        fputs("</small></p>\n", out);
    }
    for (int by = 0; by < 2; by++) /* TTFT per tenant, then per priority, where the trace has them */
        for (size_t i = 0; i < n; i++) {
            const struct atc_replay_group *g = by == 0 ? r[i].tenants : r[i].priorities;
            size_t ng = by == 0 ? r[i].ntenants : r[i].npriorities;
            if (ng == 0)
                continue;
            fprintf(out, "<h2>TTFT per %s: ", by == 0 ? "tenant" : "priority");
            atc_replay_report_html_text(out, r[i].name);
            fprintf(out,
                    "</h2>\n<table><tr><th>%s</th><th>requests</th><th>completed</th><th>TTFT p50</th>"
                    "<th>p90</th><th>p99</th></tr>\n",
                    by == 0 ? "tenant" : "priority");
            for (size_t k = 0; k < ng; k++) {
                fputs("<tr><td>", out);
                atc_replay_report_html_text(out, g[k].name);
                fprintf(
                    out,
                    "</td><td>%zu</td><td>%zu</td><td>%.0f ms</td><td>%.0f ms</td><td>%.0f ms</td></tr>\n",
                    g[k].requests, g[k].completed, g[k].ttft_p50_ms, g[k].ttft_p90_ms, g[k].ttft_p99_ms);
            }
            fputs("</table>\n", out);
        }
    fputs("<h2>Time to first token (share of requests at or below)</h2>\n", out);
    chart_ttft(out, r, n);
    for (size_t i = 0; i < n; i++) {
        if (r[i].nsamples == 0)
            continue;
        fputs("<h2>Requests in flight per endpoint: ", out);
        atc_replay_report_html_text(out, r[i].name);
        fputs("</h2>\n", out);
        chart_load(out, &r[i]);
    }
    fputs("</body></html>\n", out);
    if (fclose(out) != 0) {
        if (asprintf(err, "%s: %s", path, strerror(errno)) < 0)
            *err = NULL;
        return -1;
    }
    return 0;
}
