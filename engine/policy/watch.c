/* Reloading the policy when its files change (inotify, debounced). */

#include "policy/watch.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <event2/event.h>

#include "core/log.h"
#include "policy/state.h"
#include "policy/sandbox.h"

static void on_watch_debounced(evutil_socket_t fd, short what, void *arg)
{
    struct atc_policy_runtime *rt = arg;
    char *err = NULL;
    atc_info("policy files changed: reloading");
    if (rt->on_change != NULL) {
        rt->on_change(rt->on_change_arg);
        return;
    }
    atc_policy_reload(rt, &err);
    free(err);
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
            if (len > 4 && strcmp(ev->name + len - 4, ".lua") == 0)
                relevant = true;
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
        if (inotify_add_watch(rt->inotify_fd, dirs[i],
                              IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_MOVED_FROM) < 0)
            atc_warn("cannot watch %s for policy changes: %s", dirs[i], strerror(errno));
    }
    rt->watch_event = event_new(base, rt->inotify_fd, EV_READ | EV_PERSIST, on_inotify, rt);
    rt->watch_debounce = evtimer_new(base, on_watch_debounced, rt);
    if (rt->watch_event == NULL || rt->watch_debounce == NULL)
        return -1;
    return event_add(rt->watch_event, NULL);
}
