/* Reloading the policy when its files change (inotify, debounced). */

#include "policy/watch.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <event2/event.h>

#include "base/log.h"
#include "policy/state.h"
#include "policy/sandbox.h"

static void on_watch_debounced(evutil_socket_t fd, short what, void *arg)
{
    struct atc_policy_runtime *rt = arg;
    char *err = NULL;
    /* One line for the burst, naming what changed: the reload's own line follows. */
    if (rt->nchanged > 1)
        atc_info("policy file %s changed (and %u more events): reloading", rt->changed, rt->nchanged - 1);
    else
        atc_info("policy file %s changed: reloading", rt->changed);
    rt->changed[0] = '\0';
    rt->nchanged = 0;
    if (rt->on_change != NULL) {
        rt->on_change(rt->on_change_arg);
        return;
    }
    atc_policy_reload(rt, &err);
    free(err);
}

static const char *watched_dir(const struct atc_policy_runtime *rt, int wd)
{
    for (size_t i = 0; i < rt->nwatch; i++)
        if (rt->watch_wd[i] == wd)
            return rt->watch_dir[i];
    return "?";
}

static void on_inotify(evutil_socket_t fd, short what, void *arg)
{
    struct atc_policy_runtime *rt = arg;
    char buf[8192] __attribute__((aligned(__alignof__(struct inotify_event))));
    bool relevant = false;
    ssize_t n;
    while ((n = read(fd, buf, sizeof(buf))) > 0) {
        for (char *p = buf; p < buf + n;) {
            struct inotify_event *ev = (struct inotify_event *)p;
            size_t len = ev->len ? strlen(ev->name) : 0;
            if (len > 4 && strcmp(ev->name + len - 4, ".lua") == 0) {
                relevant = true;
                if (rt->nchanged++ == 0)
                    snprintf(rt->changed, sizeof(rt->changed), "%s/%s", watched_dir(rt, ev->wd), ev->name);
            }
            p += sizeof(*ev) + ev->len;
        }
    }
    if (relevant) {
        /* Editors write in several steps (truncate, write, rename): wait for the burst to end. */
        struct timeval tv = {0, 100000};
        event_add(rt->watch_debounce, &tv);
    }
}

void policy_watch_stop(struct atc_policy_runtime *rt)
{
    if (rt->watch_event != NULL)
        event_free(rt->watch_event);
    if (rt->watch_debounce != NULL)
        event_free(rt->watch_debounce);
    if (rt->inotify_fd >= 0)
        close(rt->inotify_fd);
    rt->watch_event = rt->watch_debounce = NULL;
    rt->inotify_fd = -1;
    for (size_t i = 0; i < rt->nwatch; i++)
        free(rt->watch_dir[i]);
    rt->nwatch = 0;
}

bool atc_policy_watching(const struct atc_policy_runtime *rt)
{
    return rt->watch_event != NULL;
}

void atc_policy_unwatch(struct atc_policy_runtime *rt)
{
    policy_watch_stop(rt);
}

int atc_policy_watch(struct atc_policy_runtime *rt, struct event_base *base, void (*on_change)(void *arg),
                     void *arg)
{
    rt->on_change = on_change;
    rt->on_change_arg = arg;
    rt->inotify_fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (rt->inotify_fd < 0)
        return -1;
    const char *dirs[16];
    char entry_dir[PATH_MAX];
    size_t ndirs = policy_module_dirs(rt, dirs, entry_dir, 16);
    for (size_t i = 0; i < ndirs; i++) {
        if (rt->s.stdlib_dir != NULL && dirs[i] == rt->s.stdlib_dir)
            continue; /* the shipped stdlib changes with atc itself, not in production */
        int wd = inotify_add_watch(rt->inotify_fd, dirs[i],
                                   IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_MOVED_FROM);
        if (wd < 0)
            atc_warn("cannot watch %s for policy changes: %s", dirs[i], strerror(errno));
        else if (rt->nwatch < sizeof(rt->watch_wd) / sizeof(rt->watch_wd[0]) &&
                 (rt->watch_dir[rt->nwatch] = strdup(dirs[i])) != NULL)
            rt->watch_wd[rt->nwatch++] = wd;
    }
    rt->watch_event = event_new(base, rt->inotify_fd, EV_READ | EV_PERSIST, on_inotify, rt);
    rt->watch_debounce = evtimer_new(base, on_watch_debounced, rt);
    if (rt->watch_event == NULL || rt->watch_debounce == NULL)
        return -1;
    return event_add(rt->watch_event, NULL);
}
