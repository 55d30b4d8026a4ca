/* The replay grid (replay_grid.h): policies x loads x fleet sizes, and its reports. */

#include "trace/replay_grid.h"

#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "sim/sim.h"
#include "trace/replay_report.h"
#include "trace/trace.h"

/* Prefill tokens a second of the fleet @p cfg simulates (replay.h: every simulate: entry
 * and every configured endpoint, the latter with the default server model). */
static void fleet_capacity(const struct atc_config *cfg, double *prefill_tps)
{
    struct atc_sim_params dflt;
    atc_sim_params_init(&dflt);
    *prefill_tps = 0;
    for (size_t i = 0; i < cfg->nmodels; i++)
        *prefill_tps += (double)cfg->models[i].nendpoints * dflt.prefill_tps;
    for (size_t i = 0; i < cfg->nsimulate; i++) {
        const struct atc_sim_params *p = &cfg->simulate[i].params;
        double tps = p->prefill_tps > 0 ? p->prefill_tps : dflt.prefill_tps;
        *prefill_tps += cfg->simulate[i].count * tps;
    }
    atc_sim_params_dispose(&dflt);
}

static double offered_tps(const struct atc_trace *t, size_t limit)
{
    size_t n = limit > 0 && limit < t->n ? limit : t->n;
    if (n < 2)
        return 0;
    uint64_t tokens = 0;
    for (size_t i = 0; i < n; i++)
        tokens += t->records[i].prompt_tokens;
    double span = (double)(t->records[n - 1].at_us - t->records[0].at_us) / 1e6;
    return span > 0 ? (double)tokens / span : 0;
}

int atc_replay_grid_run(struct atc_config *cfg, struct atc_trace *trace, struct atc_replay_grid *g,
                        const double *speeds, size_t nspeeds, const unsigned *servers, size_t nservers,
                        const struct atc_replay_options *o, char **err)
{
    static const double as_recorded = 1;
    static const unsigned as_configured = 0;
    if (nspeeds == 0) {
        speeds = &as_recorded;
        nspeeds = 1;
    }
    if (nservers == 0) {
        servers = &as_configured;
        nservers = 1;
    }
    uint64_t *arrivals = malloc((trace->n ? trace->n : 1) * sizeof(uint64_t));
    unsigned *counts = malloc((cfg->nsimulate ? cfg->nsimulate : 1) * sizeof(unsigned));
    g->cells = calloc(nspeeds * nservers, sizeof(*g->cells));
    if (arrivals == NULL || counts == NULL || g->cells == NULL) {
        *err = strdup("out of memory");
        goto error;
    }
    for (size_t i = 0; i < trace->n; i++)
        arrivals[i] = trace->records[i].at_us;
    for (size_t i = 0; i < cfg->nsimulate; i++)
        counts[i] = cfg->simulate[i].count;
    for (size_t si = 0; si < nspeeds; si++) {
        for (size_t i = 0; i < trace->n; i++)
            trace->records[i].at_us = (uint64_t)((double)arrivals[i] / speeds[si]);
        double tps = offered_tps(trace, o->limit);
        for (size_t ni = 0; ni < nservers; ni++) {
            for (size_t i = 0; i < cfg->nsimulate; i++)
                cfg->simulate[i].count = servers[ni] > 0 ? servers[ni] : counts[i];
            struct atc_replay_grid_cell *c = &g->cells[g->ncells];
            c->speed = speeds[si];
            c->servers = servers[ni];
            double capacity;
            fleet_capacity(cfg, &capacity);
            c->offered_load = capacity > 0 ? tps / capacity : 0;
            if (atc_replay_ideal_of_fleet(cfg, trace, o->limit, &c->ideal) < 0 ||
                (c->results = calloc(g->npolicies, sizeof(*c->results))) == NULL) {
                atc_replay_ideal_dispose(&c->ideal);
                *err = strdup("out of memory");
                goto error;
            }
            g->ncells++;
            for (size_t p = 0; p < g->npolicies; p++)
                if (atc_replay_run(cfg, trace, g->policies[p].path, g->policies[p].name, o, &c->results[p], err) <
                    0)
                    goto error;
        }
    }
    for (size_t i = 0; i < trace->n; i++)
        trace->records[i].at_us = arrivals[i];
    for (size_t i = 0; i < cfg->nsimulate; i++)
        cfg->simulate[i].count = counts[i];
    free(arrivals);
    free(counts);
    return 0;
error:
    if (arrivals != NULL)
        for (size_t i = 0; i < trace->n; i++)
            trace->records[i].at_us = arrivals[i];
    if (counts != NULL)
        for (size_t i = 0; i < cfg->nsimulate; i++)
            cfg->simulate[i].count = counts[i];
    free(arrivals);
    free(counts);
    return -1;
}

/* The first policy's TTFT p90 over the best of the others' (0 with fewer than two policies). */
static double ratio(const struct atc_replay_grid *g, const struct atc_replay_grid_cell *c)
{
    double best = 0;
    for (size_t p = 1; p < g->npolicies; p++)
        if (best == 0 || c->results[p].ttft_p90_ms < best)
            best = c->results[p].ttft_p90_ms;
    return best > 0 ? c->results[0].ttft_p90_ms / best : 0;
}

static void cell_label(char *buf, size_t size, const struct atc_replay_grid_cell *c)
{
    if (c->servers > 0)
        snprintf(buf, size, "%gx / %u", c->speed, c->servers);
    else
        snprintf(buf, size, "%gx / config", c->speed);
}

void atc_replay_grid_table(FILE *out, const struct atc_replay_grid *g)
{
    fprintf(out, "%s on %s, seed %llu: TTFT p90 in ms (prefix cache hit rate) and its ratio to the ideal fleet's\n\n",
            g->trace_path, g->fleet_path, (unsigned long long)g->seed);
    fprintf(out, "%-16s %5s %12s", "speed / servers", "load", "ideal");
    for (size_t p = 0; p < g->npolicies; p++)
        fprintf(out, " %19.19s", g->policies[p].name);
    if (g->npolicies > 1)
        fprintf(out, " %7s", "ratio");
    fputc('\n', out);
    for (size_t i = 0; i < g->ncells; i++) {
        const struct atc_replay_grid_cell *c = &g->cells[i];
        char label[64];
        cell_label(label, sizeof(label), c);
        char v[64];
        snprintf(v, sizeof(v), "%.0f (%.0f%%)", c->ideal.ttft_p90_ms, 100 * c->ideal.cache_hit_rate);
        fprintf(out, "%-16s %5.2f %12s", label, c->offered_load, v);
        for (size_t p = 0; p < g->npolicies; p++) {
            snprintf(v, sizeof(v), "%.0f (%.0f%%) %.2f", c->results[p].ttft_p90_ms,
                     100 * c->results[p].cache_hit_rate, atc_replay_vs_ideal(&c->results[p], &c->ideal));
            fprintf(out, " %19s", v);
        }
        if (g->npolicies > 1)
            fprintf(out, " %7.2f", ratio(g, c));
        fputc('\n', out);
    }
    fprintf(out, "\nload: the trace's prompt tokens a second over the fleet's prefill tokens a second; ideal: the "
                 "ideal fleet, the\nfleet's KV caches pooled into one LRU cache (whose hit rate no policy can "
                 "beat), its servers as parallel\nprefill lanes and one central FIFO queue (TTFT = queue wait + "
                 "prefill of the uncached tokens + one decode\nstep; it ignores decode interference: a target, "
                 "not a strict bound); after each policy's hit rate, its\nTTFT p90 over the ideal's; ratio: "
                 "%s's TTFT p90 over the best of the others'.\n",
            g->npolicies ? g->policies[0].name : "");
}

void atc_replay_grid_json(FILE *out, const struct atc_replay_grid *g)
{
    fputs("{\"trace\":", out);
    atc_replay_report_json_string(out, g->trace_path);
    fputs(",\"fleet\":", out);
    atc_replay_report_json_string(out, g->fleet_path);
    fprintf(out, ",\"seed\":%llu,\"cells\":[", (unsigned long long)g->seed);
    for (size_t i = 0; i < g->ncells; i++) {
        const struct atc_replay_grid_cell *c = &g->cells[i];
        fprintf(out,
                "%s\n{\"speed\":%g,\"servers\":%u,\"offered_load\":%.4f,\"ideal\":", i ? "," : "", c->speed,
                c->servers, c->offered_load);
        atc_replay_report_json_ideal(out, &c->ideal);
        fputs(",\"policies\":", out);
        atc_replay_report_json_policies(out, c->results, g->npolicies, &c->ideal);
        fputc('}', out);
    }
    fputs("\n]}\n", out);
}

int atc_replay_grid_html(const char *path, const struct atc_replay_grid *g, char **err)
{
    FILE *out = fopen(path, "w");
    if (out == NULL) {
        if (asprintf(err, "%s: cannot write: %m", path) < 0)
            *err = NULL;
        return -1;
    }
    fputs("<!doctype html><meta charset=utf-8><title>atc replay grid</title>\n"
          "<style>body{font:14px sans-serif;margin:2em}table{border-collapse:collapse}"
          "td,th{padding:4px 10px;border:1px solid #ccc;text-align:right}th{background:#f4f4f4}"
          ".good{background:#d8f0d8}.bad{background:#f6d6d6}</style>\n<h1>atc replay grid</h1>\n<p>",
          out);
    atc_replay_report_html_text(out, g->trace_path);
    fputs(" on ", out);
    atc_replay_report_html_text(out, g->fleet_path);
    fprintf(out, ", seed %llu. TTFT p90 in ms (prefix cache hit rate). Load: prompt tokens a second over "
                 "the fleet's prefill tokens a second; ideal: the ideal fleet, the fleet's KV caches pooled into one "
                 "LRU cache, its servers as parallel prefill lanes and one central FIFO queue (it ignores decode "
                 "interference: a target, not a strict bound); after each policy, its TTFT p90 over the ideal's; "
                 "ratio: the first policy's TTFT p90 over the best of the others'.</p>\n"
                 "<table><tr><th>speed / servers</th><th>load</th><th>ideal</th>",
            (unsigned long long)g->seed);
    for (size_t p = 0; p < g->npolicies; p++) {
        fputs("<th>", out);
        atc_replay_report_html_text(out, g->policies[p].name);
        fputs("</th>", out);
    }
    fputs(g->npolicies > 1 ? "<th>ratio</th></tr>\n" : "</tr>\n", out);
    for (size_t i = 0; i < g->ncells; i++) {
        const struct atc_replay_grid_cell *c = &g->cells[i];
        char label[64];
        cell_label(label, sizeof(label), c);
        fprintf(out, "<tr><td>%s</td><td>%.2f</td><td>%.0f (%.0f%%)</td>", label, c->offered_load,
                c->ideal.ttft_p90_ms, 100 * c->ideal.cache_hit_rate);
        for (size_t p = 0; p < g->npolicies; p++)
            fprintf(out, "<td>%.0f (%.0f%%) %.2f</td>", c->results[p].ttft_p90_ms, 100 * c->results[p].cache_hit_rate,
                    atc_replay_vs_ideal(&c->results[p], &c->ideal));
        if (g->npolicies > 1) {
            double r = ratio(g, c);
            fprintf(out, "<td class=%s>%.2f</td>", r <= 1.0 ? "good" : "bad", r);
        }
        fputs("</tr>\n", out);
    }
    fputs("</table>\n", out);
    if (fclose(out) != 0) {
        if (asprintf(err, "%s: cannot write: %m", path) < 0)
            *err = NULL;
        return -1;
    }
    return 0;
}

void atc_replay_grid_dispose(struct atc_replay_grid *g)
{
    for (size_t i = 0; i < g->ncells; i++) {
        for (size_t p = 0; g->cells[i].results != NULL && p < g->npolicies; p++)
            atc_replay_result_dispose(&g->cells[i].results[p]);
        free(g->cells[i].results);
        atc_replay_ideal_dispose(&g->cells[i].ideal);
    }
    free(g->cells);
    g->cells = NULL;
    g->ncells = 0;
}
