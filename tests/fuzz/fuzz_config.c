/* atc_config_parse over any bytes: a YAML config as an operator (or a deploy tool) writes it.
 *
 * Besides not crashing or leaking: a config is accepted (0, a config, no errors) or refused (-1, no
 * config, and every error line names the file), and an accepted config holds what config.h promises. */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "fuzz.h"

#define NAME "fuzz.yaml"

static void check_config(const struct atc_config *cfg)
{
    CHECK(cfg->listen_host != NULL && cfg->admin_host != NULL);
    CHECK(cfg->upstream.tries >= 1);
    CHECK(cfg->nmodels >= 1);
    for (size_t i = 0; i < cfg->nmodels; i++) {
        const struct atc_model_config *m = &cfg->models[i];
        CHECK(m->name != NULL && m->name[0] != '\0');
        for (size_t j = 0; j < m->nendpoints; j++) {
            const struct atc_endpoint_config *ep = &m->endpoints[j];
            CHECK(ep->id != NULL && ep->url != NULL && ep->host != NULL && ep->model != NULL);
            CHECK(strcmp(ep->model, m->name) == 0);
            CHECK(ep->capacity > 0);
            for (size_t t = 0; t < ep->ntags; t++)
                CHECK(ep->tags[t] != NULL);
        }
    }
    for (size_t i = 0; i < cfg->nsimulate; i++)
        CHECK(cfg->simulate[i].params.model != NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size ? size : 1); /* exactly the input: an overread is an ASan report */
    memcpy(text, data, size);
    struct atc_config *cfg = NULL;
    char *errors = NULL;
    int rc = atc_config_parse(text, size, NAME, "/nonexistent", &cfg, &errors);
    if (rc == 0) {
        CHECK(cfg != NULL && errors == NULL);
        check_config(cfg);
    } else {
        CHECK(rc == -1 && cfg == NULL && errors != NULL);
        /* every line is "fuzz.yaml:line:col: message" (or "fuzz.yaml: message") */
        for (const char *line = errors; line != NULL;) {
            CHECK(strncmp(line, NAME ":", sizeof(NAME)) == 0);
            line = strchr(line, '\n');
            if (line != NULL)
                line++;
        }
    }
    atc_config_free(cfg);
    free(errors);
    free(text);
    return 0;
}
