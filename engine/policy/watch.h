#ifndef ATC_POLICY_WATCH_H
#define ATC_POLICY_WATCH_H

/* Watching the policy's files: atc_policy_watch (declared in policy/policy.h) adds an inotify watch on
 * the entry's directory and policy.path (not the shipped stdlib) to a libevent base; a change to a .lua
 * file, after a 100 ms debounce, reloads the runtime or calls the on_change callback. Runs on the
 * thread of that event base. */

struct atc_policy_runtime;

/** Removes the watch of @p rt, if any (its events and inotify descriptor); on the thread of its event
 * base, before the base is freed. */
void policy_watch_stop(struct atc_policy_runtime *rt);

#endif
