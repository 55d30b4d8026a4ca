#ifndef ATC_CONFIG_KEYS_H
#define ATC_CONFIG_KEYS_H

/* The config file's schema, private to config/: one table of fields per mapping, each key with its kind,
 * bounds and where its value goes (config_tables.c); config.c walks the YAML document against them. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum kind {
    F_STR,      /* required text, not empty */
    F_OPTSTR,   /* text, or nothing ("version:") for absent */
    F_PATH,     /* text resolved against the file's directory */
    F_STRS,     /* list of F_STR; aux is the count */
    F_PATHS,    /* list of F_PATH; aux is the count */
    F_BOOL,     /* bool */
    F_UINT,     /* unsigned within [min, max] */
    F_U64,      /* uint64_t within [min, max] */
    F_MS,       /* duration, uint64_t milliseconds; min 1 = must not be 0 */
    F_US,       /* duration, uint64_t microseconds; min 1 = must not be 0 */
    F_SIZE,     /* size_t bytes, > 0 */
    F_POSITIVE, /* double > 0 */
    F_NONNEG,   /* double >= 0 */
    F_SHARE,    /* double in [0, 1] */
    F_HOSTPORT, /* char * host at off, uint16_t port at aux */
    F_URL,      /* the url, host and port of an endpoint */
    F_URLPATH,  /* char *: a request path, "/" followed by printable ASCII without spaces */
    F_CHOICE,   /* unsigned: the index of the value in choices */
    F_WEIGHTS,  /* mapping of name -> whole number >= 1, into a struct atc_weights */
    F_SECTION,  /* a nested mapping described by sub, filling the same struct */
    F_NODE,     /* handled by the caller, which finds the node in parse_section's found[] */
};

struct field {
    const char *key;
    enum kind kind;
    size_t off, aux;   /* where the value goes in the struct being filled; aux: see enum kind */
    uint64_t min, max; /* F_UINT, F_U64; F_MS and F_US use min only */
    bool required;
    bool model_wide;            /* refused in an endpoint's health: (it applies to a whole model) */
    const struct field *sub;    /* F_SECTION */
    const char *const *choices; /* F_CHOICE, NULL-terminated */
};

#define MAX_FIELDS 28 /* the longest table of config_tables.c, for parse_section's found[] */

/* The tables config.c walks by name (the others are reached through .sub). */
extern const struct field atc_config_health_fields[];
extern const struct field atc_config_endpoint_fields[];
extern const struct field atc_config_model_fields[];
extern const struct field atc_config_simulate_fields[];
extern const struct field atc_config_record_fields[];
extern const struct field atc_config_cluster_fields[];
extern const struct field atc_config_limits_fields[];
extern const struct field atc_config_rule_fields[];
extern const struct field atc_config_root_fields[];

#endif
