#ifndef ATC_CONFIG_ENDPOINT_H
#define ATC_CONFIG_ENDPOINT_H

/* Endpoints that join the config in force at run time: added through the admin API
 * (POST /admin/endpoints) or found by DNS discovery. Each is an ordinary struct atc_endpoint_config with
 * its model's settings (engine, health, api key, kv_events), appended to its model's list in the
 * config in force, so that every subsystem reading the config (the endpoint table, health, /admin/config)
 * sees it as it sees one written in the YAML. A YAML reload keeps them, unless the file names the same
 * id (then the file's wins); they are gone at a restart. Main thread only, like the config itself. */

#include <stdbool.h>

#include "config/config.h"

enum atc_endpoint_origin {
    ATC_ORIGIN_CONFIG, /* written in the YAML */
    ATC_ORIGIN_API,    /* POST /admin/endpoints */
    ATC_ORIGIN_DNS,    /* discover: of its model */
};

/** "config", "api" or "dns". */
const char *atc_endpoint_origin_name(unsigned origin);

/** Fills @p ec (zeroed by the caller) as an endpoint @p id at @p url of model @p m of @p cfg with the
 * model's settings and the defaults of an endpoint (capacity 64, weight 1); @p origin an enum
 * atc_endpoint_origin. 0, or -1 with *err a static reason (a bad url, an empty id, out of memory); on
 * failure @p ec owns what was filled: atc_endpoint_config_dispose it either way. */
int atc_config_endpoint_init(struct atc_endpoint_config *ec, const struct atc_config *cfg,
                             const struct atc_model_config *m, const char *id, const char *url,
                             unsigned origin, const char **err);


/** The endpoint of @p cfg with id @p id (in any model), or NULL; its model in *model when not NULL. */
struct atc_endpoint_config *atc_config_endpoint(const struct atc_config *cfg, const char *id,
                                                struct atc_model_config **model);

/** Appends @p ec to @p m's endpoints, taking what it owns (the struct is copied; do not dispose it
 * after). 0, or -1 out of memory (then @p ec is unchanged and still the caller's). */
int atc_config_append_endpoint(struct atc_model_config *m, struct atc_endpoint_config *ec);

/** Removes (and frees) the endpoint @p id from @p cfg. True when it was there. */
bool atc_config_remove_endpoint(struct atc_config *cfg, const char *id);

/** A YAML reload: copies into @p ncfg the endpoints of @p old that joined at run time (origin api or
 * dns) whose model @p ncfg still has and whose id @p ncfg does not name. 0, or -1 out of memory. */
int atc_config_keep_joined(struct atc_config *ncfg, const struct atc_config *old);

#endif
