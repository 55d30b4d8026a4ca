/* Shadows and canaries on the server (see rollout.h). */

#include "core/rollout.h"

#include <stdio.h>
#include <stdlib.h>

#include <event2/event.h>

#include "config/config.h"
#include "base/clock.h"
#include "base/log.h"
#include "core/server.h"
#include "proxy/worker.h"
#include "policy/policy.h"

static bool has_policy(struct atc_server *srv, atc_reload_done done, void *arg)
{
    if (srv->group.workers[0].policy != NULL &&
        (srv->reloader != NULL || (srv->reloader = atc_reloader_create(&srv->group)) != NULL))
        return true;
    if (done != NULL)
        done(arg, 0,
             srv->group.workers[0].policy == NULL ? "the config has no policy: section" : "out of memory");
    return false;
}

void atc_rollout_shadow(struct atc_server *srv, const char *entry, double sample, atc_reload_done done,
                        void *arg)
{
    if (!has_policy(srv, done, arg))
        return;
    struct atc_policy_target_spec spec = {
        .target = entry != NULL ? ATC_POLICY_SHADOW : ATC_POLICY_SHADOW_CLEAR,
        .entry = entry,
        .sample = sample,
    };
    atc_reloader_start_as(srv->reloader, &spec, done, arg);
}

static void on_window(evutil_socket_t fd, short what, void *arg)
{
    char why[512];
    atc_rollout_canary_end(arg, ATC_ROLLOUT_JUDGE, why, sizeof(why));
}

struct canary_load {
    struct atc_server *srv;
    uint64_t window_ms;
    atc_reload_done done;
    void *arg;
};

static void on_canary_loaded(void *arg, uint64_t version, const char *err)
{
    struct canary_load *c = arg;
    struct atc_server *srv = c->srv;
    if (err == NULL && version != 0) {
        if (srv->canary_timer == NULL)
            srv->canary_timer = evtimer_new(srv->base, on_window, srv);
        struct timeval tv = atc_timeval_ms(c->window_ms);
        if (srv->canary_timer != NULL)
            evtimer_add(srv->canary_timer, &tv);
    }
    if (c->done != NULL)
        c->done(c->arg, version, err);
    free(c);
}

static void load_canary(struct atc_server *srv, double share, uint64_t window_ms, atc_reload_done done,
                        void *arg)
{
    struct canary_load *c = malloc(sizeof(*c));
    if (c == NULL) {
        if (done != NULL)
            done(arg, 0, "out of memory");
        return;
    }
    *c = (struct canary_load){.srv = srv, .window_ms = window_ms, .done = done, .arg = arg};
    struct atc_policy_target_spec spec = {.target = ATC_POLICY_CANARY, .share = share};
    atc_reloader_start_as(srv->reloader, &spec, on_canary_loaded, c);
}

bool atc_rollout_canary_armed(const struct atc_server *srv, double *share, uint64_t *window_ms)
{
    *share = srv->canary_armed_share;
    *window_ms = srv->canary_armed_window_ms;
    return srv->canary_armed_share > 0;
}

int atc_rollout_canary(struct atc_server *srv, double share, uint64_t window_ms, atc_reload_done done,
                       void *arg)
{
    if (!has_policy(srv, done, arg))
        return 0;
    /* With the watch on, the files an operator is about to edit would go live to all traffic the moment
     * they are saved: the canary waits for that change instead and is built from it. */
    if (atc_policy_watching(srv->group.workers[0].policy) &&
        atc_policy_canary_version(srv->group.workers[0].policy) == 0) {
        srv->canary_armed_share = share;
        srv->canary_armed_window_ms = window_ms;
        atc_info("policy canary armed: the next change of the policy's files loads as a canary on %g of the "
                 "requests for %llu ms; the current version keeps routing the rest",
                 share, (unsigned long long)window_ms);
        return 1;
    }
    load_canary(srv, share, window_ms, done, arg);
    return 0;
}

static void on_armed_canary_loaded(void *arg, uint64_t version, const char *err)
{
    struct atc_server *srv = arg;
    if (err == NULL && version != 0) {
        srv->canary_armed_share = 0;
        atc_info("policy canary v%llu loaded from the changed files", (unsigned long long)version);
    } else {
        atc_error("policy canary did not load, the current version keeps routing everything: %s; still "
                  "armed (fix the files and save again, or atc policy rollback)",
                  err != NULL ? err : "failed");
    }
}

/* A change of the policy's files (the watch): an armed canary loads from it; while a canary runs the
 * change waits (it would replace the version the canary is judged against); else a reload. */
static void on_policy_files(struct atc_server *srv)
{
    struct atc_policy_runtime *rt = srv->group.workers[0].policy;
    uint64_t running = rt != NULL ? atc_policy_canary_version(rt) : 0;
    if (running != 0) {
        atc_warn("policy files changed while canary v%llu runs: not reloaded (atc policy promote or rollback "
                 "first, then atc reload)",
                 (unsigned long long)running);
        return;
    }
    if (srv->canary_armed_share > 0) {
        load_canary(srv, srv->canary_armed_share, srv->canary_armed_window_ms, on_armed_canary_loaded, srv);
        return;
    }
    atc_server_reload_policy(srv, NULL, NULL);
}

uint64_t atc_rollout_canary_end(struct atc_server *srv, enum atc_rollout_end how, char *why, size_t size)
{
    struct atc_policy_runtime *rts[ATC_MAX_WORKERS];
    const struct atc_config *cfg = srv->cfg;
    struct atc_canary_guards g = {
        .error_rate = cfg->policy.canary.error_rate,
        .fallback_rate = cfg->policy.canary.fallback_rate,
        .overrun_rate = cfg->policy.canary.overrun_rate,
        .ttft_p90 = cfg->policy.canary.ttft_p90,
        .min_requests = cfg->policy.canary.min_requests,
    };
    atc_workers_pause(&srv->group);
    size_t n = atc_server_policies(srv, rts);
    uint64_t version = n > 0 ? atc_policy_canary_version(rts[0]) : 0;
    int promote = -1;
    if (version != 0) {
        promote = atc_policy_canary_judge(rts, n, &g, why, size); /* what the guards say, in any case */
        if (how == ATC_ROLLOUT_PROMOTE)
            promote = 1;
        else if (how == ATC_ROLLOUT_ROLLBACK)
            promote = 0;
        char reason[600];
        snprintf(reason, sizeof(reason), "%s%s",
                 how == ATC_ROLLOUT_JUDGE     ? ""
                 : how == ATC_ROLLOUT_PROMOTE ? "by hand; "
                                              : "by hand; ",
                 why);
        for (size_t i = 0; i < n; i++)
            atc_policy_canary_end(rts[i], promote == 1, reason);
        snprintf(why, size, "%s", reason);
    }
    atc_workers_resume(&srv->group);
    if (srv->canary_timer != NULL)
        evtimer_del(srv->canary_timer);
    if (version == 0)
        snprintf(why, size, "no canary is running");
    else if (promote == 1)
        atc_info("policy canary v%llu promoted: %s", (unsigned long long)version, why);
    else
        atc_warn("policy canary v%llu rolled back: %s", (unsigned long long)version, why);
    return version;
}

static void on_config_shadow(void *arg, uint64_t version, const char *err)
{
    if (err != NULL)
        atc_error("policy.shadow did not load: %s", err);
}

void atc_rollout_start(struct atc_server *srv)
{
    srv->on_policy_files = on_policy_files;
    const struct atc_config *cfg = srv->cfg;
    if (cfg->policy.enabled && cfg->policy.shadow_entry != NULL)
        atc_rollout_shadow(srv, cfg->policy.shadow_entry, cfg->policy.shadow_sample, on_config_shadow, NULL);
}
