-- Affinity: a conversation goes back where its KV cache is. A known session (x-atc-session, else the
-- body's `user`) returns to its endpoint while that endpoint is available and its predicted time to
-- first token is at most SESSION_SLACK x the best one + SESSION_SLACK_MS; otherwise, or the first time,
-- it is pinned anew, by consistent hashing among the endpoints within that slack (so replicas of atc
-- mostly agree, and nothing is pinned behind a queue). Pins live in the engine (atc.affinity) across
-- reloads. Requests without a session get no opinion here: priority.pick weighs their prefix cache.

local priority = require "priority"

-- Knobs ------------------------------------------------------------------------------------------------
local SESSION_TTL_MS = 30 * 60 * 1000 -- a session idle this long is forgotten
local SESSION_SLACK = 1.5             -- a session stays while its endpoint is at most 1.5x slower ...
local SESSION_SLACK_MS = 250          -- ... + 250 ms than the fastest (a turn's prefix is cached there,
                                      -- which the prediction counts, so leaving is rarely worth it)
----------------------------------------------------------------------------------------------------------

local M = {}
M.SESSION_SLACK, M.SESSION_SLACK_MS = SESSION_SLACK, SESSION_SLACK_MS

local function key_of(req)
  local tenant = req.tenant
  return (tenant ~= nil and tenant ~= "") and ("s:" .. tenant .. ":" .. req.session) or ("s::" .. req.session)
end

-- An endpoint for req's session, or nil without a session (or with nothing available).
function M.pick(req, pool)
  local session = req.session
  if session == nil or session == "" then
    return nil
  end
  local best, _, best_ttft = atc.fastest(pool, req, priority.URGENT)
  if best == nil then
    return nil
  end
  local bound = best_ttft * SESSION_SLACK + SESSION_SLACK_MS
  local key = key_of(req)
  local id = atc.affinity.get(key)
  local ep = id ~= nil and atc.find(pool, id) or nil
  if ep == nil or not ep.available or ep:predict_ttft(req) > bound then
    -- among the available endpoints whose predicted first token is within the bound
    ep = atc.rendezvous(pool, key, { req = req, max_ttft = bound }) or best
  end
  atc.affinity.set(key, ep.id, SESSION_TTL_MS) -- also keeps it from expiring while in use
  return ep
end

return M
