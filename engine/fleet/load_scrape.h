#ifndef ATC_LOAD_SCRAPE_H
#define ATC_LOAD_SCRAPE_H

/* The load scrape: the numbers of a server's load from its /metrics page (Prometheus text; vLLM, SGLang,
 * TGI and llama.cpp names). health.c runs the scrape. */

#include <stdbool.h>

struct atc_prom_sample;

enum load_slot { L_RUNNING, L_WAITING, L_KV, L_QUERIES, L_HITS, L_HIT_RATE, NSLOTS };

struct load_acc {
    const char *model;
    double mine[NSLOTS], all[NSLOTS]; /* series labelled with this model / every series */
    bool has_mine[NSLOTS], has_all[NSLOTS];
};

/* A sample of the page (atc_prom_parse's callback; @p arg is a struct load_acc). */
int on_load_sample(void *arg, const struct atc_prom_sample *s);

/* A server may serve several models (and label each series): this endpoint's model's series when there
 * are any, else all of them. NaN when the page has none. */
double acc_get(const struct load_acc *a, enum load_slot slot);

#endif
