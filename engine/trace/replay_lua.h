#ifndef ATC_REPLAY_LUA_H
#define ATC_REPLAY_LUA_H

struct lua_State;

/** atc.replay(opts) for `atc test` (upvalue 1: the policy version running the test). */
int atc_replay_lua(struct lua_State *L);

#endif
