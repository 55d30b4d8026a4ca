#ifndef ATC_ENGINE_PROFILE_H
#define ATC_ENGINE_PROFILE_H

/* Engine profiles: what differs between the inference servers atc fronts (`engine:` on a model or an
 * endpoint), kept in one const table (engine_profile.c) that cites each engine's source. The config
 * reads the defaults it may override (health paths, the live timeout, the start-up grace); health.c
 * reads how start-up and refusals look; load_scrape.c scrapes the metric names of its engine. Const
 * data: any thread. */

#include <stdbool.h>
#include <stdint.h>

/* The engines, in the order `engine:` lists them; ATC_ENGINE_OPENAI (0) is also the default when the
 * config says nothing: a generic OpenAI-compatible server, checked as atc always did. */
enum atc_engine {
    ATC_ENGINE_OPENAI,
    ATC_ENGINE_VLLM,
    ATC_ENGINE_SGLANG,
    ATC_ENGINE_LLAMACPP,
    ATC_ENGINE_TGI,
    ATC_ENGINE_COUNT,
};

struct atc_engine_profile {
    const char *name;          /* as written after engine: */
    const char *live_path;     /* health.live.path unless set; NULL: atc's default (/health) */
    const char *ready_path;    /* health.ready.path unless set; NULL: atc's default (/v1/models) */
    uint64_t live_timeout_ms;  /* health.live.timeout unless set; 0: atc's default (1s) */
    uint64_t startup_grace_ms; /* health.startup_grace unless set: until it first turns healthy and for at
                                  most this long, refused connections (and loading_503) read "starting" */
    bool loading_503;          /* a 503 during the start-up grace is the server loading its model */
};

/** The names `engine:` accepts, NULL-terminated, indexed by enum atc_engine. */
extern const char *const atc_engine_names[];

/** The profile of @p engine (an enum atc_engine; anything else is the generic openai profile). */
const struct atc_engine_profile *atc_engine_profile(unsigned engine);

#endif
