/* The latency figures of a replay's result: of all its requests (atc_replay_latencies) and per tenant and
 * per priority (atc_replay_groups), apart from the event loop of replay.c. */

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "trace/replay.h"
#include "trace/trace.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

void atc_replay_sort(double *v, size_t n)
{
    qsort(v, n, sizeof(double), cmp_double);
}

double atc_replay_percentile(const double *v, size_t n, double p)
{
    if (n == 0)
        return 0;
    size_t k = (size_t)ceil(p / 100.0 * (double)n);
    return v[k > 0 ? k - 1 : 0];
}

void atc_replay_latencies(struct atc_replay_result *r, size_t n)
{
    double *v = malloc((n ? n : 1) * sizeof(double));
    size_t m = 0;
    double sum = 0;
    if (v == NULL)
        return;
    for (size_t i = 0; i < n; i++)
        if (!isnan(r->ttft_ms[i])) {
            v[m++] = r->ttft_ms[i];
            sum += r->ttft_ms[i];
        }
    atc_replay_sort(v, m);
    r->ttft_p50_ms = atc_replay_percentile(v, m, 50);
    r->ttft_p90_ms = atc_replay_percentile(v, m, 90);
    r->ttft_p99_ms = atc_replay_percentile(v, m, 99);
    r->ttft_mean_ms = m ? sum / (double)m : 0;
    m = 0;
    for (size_t i = 0; i < n; i++)
        if (!isnan(r->e2e_ms[i]))
            v[m++] = r->e2e_ms[i];
    atc_replay_sort(v, m);
    r->e2e_p50_ms = atc_replay_percentile(v, m, 50);
    r->e2e_p99_ms = atc_replay_percentile(v, m, 99);
    m = 0;
    for (size_t i = 0; r->itl_ms != NULL && i < n; i++)
        if (!isnan(r->itl_ms[i]))
            v[m++] = r->itl_ms[i];
    atc_replay_sort(v, m);
    r->itl_p50_ms = atc_replay_percentile(v, m, 50);
    r->itl_p90_ms = atc_replay_percentile(v, m, 90);
    free(v);
}

static int by_tenant(const void *a, const void *b, void *ctx)
{
    const struct atc_trace *t = ctx;
    int c = strcmp(t->records[*(const size_t *)a].tenant, t->records[*(const size_t *)b].tenant);
    return c != 0 ? c : (*(const size_t *)a > *(const size_t *)b) - (*(const size_t *)a < *(const size_t *)b);
}

/* Fills @p g from the requests idx[0..n) of @p r. @p v: scratch for n values. */
static void fill_group(struct atc_replay_group *g, const struct atc_replay_result *r, const size_t *idx, size_t n,
                       double *v)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (!isnan(r->ttft_ms[idx[i]]))
            v[m++] = r->ttft_ms[idx[i]];
    atc_replay_sort(v, m);
    g->requests = n;
    g->completed = m;
    g->ttft_p50_ms = atc_replay_percentile(v, m, 50);
    g->ttft_p90_ms = atc_replay_percentile(v, m, 90);
    g->ttft_p99_ms = atc_replay_percentile(v, m, 99);
}

int atc_replay_groups(struct atc_replay_result *r, const struct atc_trace *t, size_t n)
{
    size_t *idx = malloc((n ? n : 1) * sizeof(size_t)), *sel = malloc((n ? n : 1) * sizeof(size_t));
    double *v = malloc((n ? n : 1) * sizeof(double));
    bool tenants = false, priorities = false;
    for (size_t i = 0; i < n; i++) {
        idx[i] = i;
        tenants |= t->records[i].tenant[0] != '\0';
        priorities |= t->records[i].priority != 0;
    }
    if (idx == NULL || sel == NULL || v == NULL)
        goto oom;
    if (priorities) { /* every priority the trace has, in order */
        if ((r->priorities = calloc(10, sizeof(*r->priorities))) == NULL)
            goto oom;
        for (int p = 0; p <= 9; p++) {
            size_t m = 0;
            for (size_t i = 0; i < n; i++)
                if (t->records[i].priority == p)
                    sel[m++] = i;
            if (m == 0)
                continue;
            struct atc_replay_group *g = &r->priorities[r->npriorities++];
            if ((g->name = malloc(2)) == NULL)
                goto oom;
            g->name[0] = (char)('0' + p);
            g->name[1] = '\0';
            fill_group(g, r, sel, m, v);
        }
    }
    if (tenants) { /* the busiest ATC_REPLAY_GROUPS_MAX - 1 tenants by name, the rest as one "(other)" */
        qsort_r(idx, n, sizeof(size_t), by_tenant, (void *)t);
        size_t runs = 0;
        for (size_t i = 0; i < n; i++) /* sel[k]: the start of run k */
            if (i == 0 || strcmp(t->records[idx[i]].tenant, t->records[idx[i - 1]].tenant) != 0)
                sel[runs++] = i;
        size_t keep = runs <= ATC_REPLAY_GROUPS_MAX ? runs : ATC_REPLAY_GROUPS_MAX - 1;
        bool *kept = calloc(runs, sizeof(bool));
        if (kept == NULL || (r->tenants = calloc(keep + 1, sizeof(*r->tenants))) == NULL) {
            free(kept);
            goto oom;
        }
        for (size_t k = 0; k < keep; k++) { /* the largest run not kept yet, the first on a tie */
            size_t best = SIZE_MAX, best_len = 0;
            for (size_t j = 0; j < runs; j++) {
                size_t len = (j + 1 < runs ? sel[j + 1] : n) - sel[j];
                if (!kept[j] && len > best_len)
                    best = j, best_len = len;
            }
            kept[best] = true;
        }
        size_t *rest = malloc((n ? n : 1) * sizeof(size_t)), nrest = 0;
        for (size_t j = 0; rest != NULL && j < runs; j++) {
            size_t start = sel[j], len = (j + 1 < runs ? sel[j + 1] : n) - start;
            if (!kept[j]) {
                memcpy(rest + nrest, idx + start, len * sizeof(size_t));
                nrest += len;
                continue;
            }
            const char *name = t->records[idx[start]].tenant;
            struct atc_replay_group *g = &r->tenants[r->ntenants++];
            g->name = strdup(name[0] != '\0' ? name : "(none)");
            fill_group(g, r, idx + start, len, v);
        }
        if (rest != NULL && nrest > 0) {
            struct atc_replay_group *g = &r->tenants[r->ntenants++];
            g->name = strdup("(other)");
            fill_group(g, r, rest, nrest, v);
        }
        free(kept);
        free(rest);
        if (rest == NULL)
            goto oom;
        for (size_t k = 0; k < r->ntenants; k++)
            if (r->tenants[k].name == NULL)
                goto oom;
    }
    free(idx);
    free(sel);
    free(v);
    return 0;
oom:
    free(idx);
    free(sel);
    free(v);
    return -1;
}

