#ifndef ATC_REPLAY_LUA_H
#define ATC_REPLAY_LUA_H

struct lua_State;

/** atc.replay(opts) for `atc test`: a C function of the policy API (atc_policy_settings_of reads its
 * settings), which core/main.c hands to atc_policy_test_main. */
int atc_replay_lua(struct lua_State *L);

#endif
