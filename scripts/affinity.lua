-- Affinity: send a request where its KV cache already is, unless that would overload the endpoint.
--   session: a known session (x-atc-session, else the body's `user`) goes back to its endpoint while
--            that endpoint is available and at most SESSION_MAX_LOAD full; otherwise, or the first
--            time, it is pinned anew: by prefix affinity, else by consistent hashing with bounded
--            load (so replicas of atc agree). Pins live in the engine (atc.affinity) across reloads.
--   prefix:  when some endpoint recently got at least PREFIX_MIN_BLOCKS of this prompt's leading
--            blocks, the endpoint where the request costs least: the prompt tokens it would still have
--            to prefill there (a cache hit saves the rest) + LOAD_WEIGHT x the tokens in flight there.
--            Unless the pool is imbalanced; then balancing matters more than the cache (as in SGLang's
--            cache-aware router: imbalanced when max - min > BALANCE_ABS and max > BALANCE_REL * min,
--            counting requests in flight on the available endpoints).
-- Returns an endpoint, or nil for "no opinion": priority.pick decides.

local balance = require "atc.balance"
local hash = require "atc.hash"

-- Knobs ------------------------------------------------------------------------------------------------
local SESSION_TTL_MS = 30 * 60 * 1000 -- a session idle this long is forgotten
local SESSION_MAX_LOAD = 0.9          -- a session leaves its endpoint above this inflight / capacity
local SESSION_SPREAD = 1.25           -- placing a session: no endpoint above 1.25x its share of the load
local PREFIX_MIN_BLOCKS = 2           -- fewer shared blocks (256 bytes, ~64 tokens each) decide nothing
local BALANCE_ABS = 16                -- imbalanced: the busiest endpoint has more than 16 requests more
local BALANCE_REL = 1.5               --   than the idlest, and more than 1.5 times as many
local LOAD_WEIGHT = 0.5               -- a token in flight on an endpoint costs half a token to prefill
----------------------------------------------------------------------------------------------------------

local M = {}
M.SESSION_MAX_LOAD, M.PREFIX_MIN_BLOCKS, M.BALANCE_ABS, M.BALANCE_REL, M.LOAD_WEIGHT =
  SESSION_MAX_LOAD, PREFIX_MIN_BLOCKS, BALANCE_ABS, BALANCE_REL, LOAD_WEIGHT

-- The available endpoint where the request costs least (see the top), or nil when no overlap reaches
-- PREFIX_MIN_BLOCKS or the pool is imbalanced. `skip`: an endpoint not to choose.
--
-- Why a cost and not simply the longest overlap: replaying Mooncake's trace (README, "record, import,
-- replay, compare, test"), sending each prompt wherever most of it was cached piled the shared prefixes
-- onto a few servers, whose prefill queues then made the slowest tenth of first tokens wait 30% longer
-- than under Dynamo's cost-based router. Weighing the hit against the work in flight keeps most of the
-- hits and none of the queues.
local function by_prefix(req, pool, skip)
  if req.blocks < PREFIX_MIN_BLOCKS then
    return nil
  end
  -- The loop over the pool runs in C: it is the hot part of a decision.
  return atc.prefix_pick(pool, req, {
    min_blocks = PREFIX_MIN_BLOCKS,
    balance_abs = BALANCE_ABS,
    balance_rel = BALANCE_REL,
    skip = skip,
    load_weight = LOAD_WEIGHT,
  })
end
M.by_prefix = by_prefix

local function find(pool, id)
  for i = 1, #pool do
    if pool[i].id == id then
      return pool[i]
    end
  end
  return nil
end

-- pool without ep (a new table; only on the rare path where a session leaves a busy endpoint)
local function without(pool, ep)
  local out = {}
  for i = 1, #pool do
    if pool[i] ~= ep then
      out[#out + 1] = pool[i]
    end
  end
  return out
end

local function by_session(req, pool)
  local tenant = req.tenant -- nil without x-atc-tenant
  local key = "s:" .. (tenant or "") .. ":" .. req.session
  local id = atc.affinity.get(key)
  local old = id ~= nil and find(pool, id) or nil
  if old ~= nil and old.available then
    if balance.load(old) <= SESSION_MAX_LOAD then
      atc.affinity.set(key, old.id, SESSION_TTL_MS) -- keeps it from expiring while in use
      return old
    end
  else
    old = nil -- gone from the pool (model, version or tags changed), unhealthy, or full
  end
  local ep = by_prefix(req, pool, old)
  if ep == nil then
    ep = hash.bounded(old and without(pool, old) or pool, key, SESSION_SPREAD) or old
  end
  if ep ~= nil then
    atc.affinity.set(key, ep.id, SESSION_TTL_MS)
  end
  return ep
end

function M.pick(req, pool)
  if req.session ~= nil then -- nil: no x-atc-session and no `user` in the body
    return by_session(req, pool)
  end
  return by_prefix(req, pool)
end

return M
