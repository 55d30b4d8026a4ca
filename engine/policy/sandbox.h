#ifndef ATC_POLICY_SANDBOX_H
#define ATC_POLICY_SANDBOX_H

/* The sandbox of one policy state: its allocator with a memory cap, the allow-listed globals (read-only
 * library tables, guarded string patterns, pcall/xpcall that cannot swallow a budget stop), chunk
 * loading with a private environment (policy_load_chunk), and require over the policy's module path.
 * Called on the thread that owns the state (a worker, or the
 * main thread for atc check / atc test). */

#include <lua.h>
#include <stddef.h>
#include <stdint.h>

struct policy_version;
struct atc_policy_runtime;

/** lua_Alloc for a version's state (@p ud is the struct policy_version): refuses to grow past
 * mem_limit, sets mem_refused when it does. */
void *policy_sandbox_alloc(void *ud, void *ptr, size_t osize, size_t nsize);

/** Builds the sandbox in v->L: opens the allowed libraries, installs the globals table (policy_api_open
 * adds what a policy sees) in the registry as "atc.sandbox", and drops the dangerous base functions.
 * Raises a Lua error on failure (out of memory): call it inside a protected call. */
void policy_sandbox_open(struct policy_version *v);

/* atc test only (registry keys): the test file that runs ("@path", set by the runner), each required
 * module's file (name -> path) and the modules the test file required itself (an array of names, in
 * order), so that t.replay replays the policy a test loaded. */
#define POLICY_TEST_FILE "atc.test_file"
#define POLICY_MODULE_FILES "atc.module_files"
#define POLICY_TEST_MODULES "atc.test_modules"

/* The largest policy source file (an entry or a module) that is read: anything larger is refused
 * (a policy is a few kB; this bounds what a wrong path makes the loader read). */
#define POLICY_FILE_MAX (1024 * 1024)
#define POLICY_FILE_MAX_TEXT "1MiB"

/** Loads a Lua source file as a sandboxed chunk (a regular file of at most POLICY_FILE_MAX bytes,
 * opened without blocking: a FIFO or a device is refused, never waited on; the message names the path
 * and why, never the file's content); pushes it, or an error message. 0 / -1. */
int policy_load_chunk(lua_State *L, const char *path);

/** A hash (XXH3, chained in load order) of the contents of every file policy_load_chunk loaded into
 * @p L; 0 before the first. The same files give the same value on every worker and every reload. */
uint64_t policy_files_hash(lua_State *L);

/** The directories require searches, in order: the entry's own, stdlib, then policy.path. Fills
 * @p dirs (at most @p max) with borrowed strings; @p entry_dir (PATH_MAX bytes) holds the first one.
 * Returns how many. */
size_t policy_module_dirs(const struct atc_policy_runtime *rt, const char **dirs, char *entry_dir,
                          size_t max);

/** Whether @p entry may be loaded as a shadow beside @p rt's live policy: a regular file of at most
 * POLICY_FILE_MAX bytes, inside (once links are resolved) the live entry's folder or a policy.path
 * directory. 0, or -1 with an owned message in *err ("FILE: why", naming no content; NULL: out of
 * memory). Reads no file. */
int policy_check_entry(const struct atc_policy_runtime *rt, const char *entry, char **err);

#endif
