/* The simulated fleet (sim_fleet.h): simulate: entries as servers of this process and endpoints of its
 * table. Apart from server.c, which wires it, so that file stays under the layout's size. */

#include "core/sim_fleet.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "sim/sim_server.h"

/* A simulated server's api_key as the key atc sends it (the endpoint owns the copy, endpoint.c wipes it). */
static int sim_key(struct atc_endpoint *ep, const char *key)
{
    size_t n = strlen(key) + sizeof("Bearer ");
    if ((ep->authorization = malloc(n)) == NULL || (ep->api_key_source = strdup("simulate: api_key")) == NULL)
        return -1;
    snprintf(ep->authorization, n, "Bearer %s", key);
    return 0;
}

int atc_sim_fleet_start(struct atc_sim_fleet *f, struct event_base *base, const struct atc_config *cfg,
                        struct atc_endpoint_table *table, const char **err)
{
    size_t total = 0;
    for (size_t i = 0; i < cfg->nsimulate; i++)
        total += cfg->simulate[i].count;
    if (total == 0)
        return 0;
    if ((f->sims = calloc(total, sizeof(*f->sims))) == NULL) {
        *err = "out of memory";
        return -1;
    }
    for (size_t i = 0; i < cfg->nsimulate; i++) {
        const struct atc_simulate_config *sc = &cfg->simulate[i];
        for (unsigned k = 0; k < sc->count; k++) {
            struct atc_sim_params p = sc->params;
            p.seed = sc->params.seed + f->n; /* each server draws differently, reproducibly */
            struct atc_sim_server *sim = atc_sim_server_start(base, &p, "127.0.0.1", 0, err);
            if (sim == NULL)
                return -1;
            f->sims[f->n++] = sim;
            char id[300];
            struct atc_model *m = atc_endpoint_table_model(table, p.model, strlen(p.model));
            snprintf(id, sizeof(id), "%s-sim-%zu", p.model, m != NULL ? m->nendpoints + 1 : 1);
            uint16_t port = atc_sim_server_port(sim);
            struct atc_endpoint *sep = atc_endpoint_table_add(table, p.model, id, "127.0.0.1", port,
                                                              sc->capacity ? sc->capacity : p.max_seqs);
            if (sep == NULL) {
                *err = "cannot add a simulated endpoint";
                return -1;
            }
            sep->simulated = true;
            sep->engine = sc->engine; /* what /admin/endpoints shows; health reads the model's, the same */
            sep->role = p.role;
            sep->bootstrap_port = port; /* the sim's bootstrap rooms are on its own port (sim_disagg.c) */
            if (p.api_key != NULL && sim_key(sep, p.api_key) < 0) { /* atc speaks to it with its own key */
                *err = "out of memory";
                return -1;
            }
            atomic_store_explicit(&sep->kv_tokens, atc_sim_params_kv_tokens(&p), memory_order_relaxed);
            atc_info("simulated %s server %s on 127.0.0.1:%u", p.model, id, (unsigned)port);
        }
    }
    return 0;
}

void atc_sim_fleet_stop(struct atc_sim_fleet *f)
{
    for (size_t i = 0; i < f->n; i++)
        atc_sim_server_stop(f->sims[i]);
    free(f->sims);
    f->sims = NULL;
    f->n = 0;
}
