-- Affinity: a conversation goes back where its KV cache is, when atc's prefix index cannot tell. A
-- session (x-atc-session, else the body's `user`) whose prompt the index places on its pinned endpoint,
-- or whose prefix the index knows anywhere, gets no opinion here: priority.pick weighs that cache
-- against the queues, and policy.lua pins its pick (remember). Where the index cannot tell (another
-- replica routed the turns before, traffic reached the servers around atc, the index forgot, or all it
-- hashes of a longer prompt is a prefix every session shares), the pin decides: the session returns to
-- its endpoint while that one is available and its predicted time to first token is at most
-- SESSION_SLACK x the best one + SESSION_SLACK_MS; otherwise, or the first time, it is pinned by
-- consistent hashing among the endpoints within that slack (so replicas of atc agree without talking,
-- and nothing is pinned behind a queue). Pins live in the engine (atc.affinity) across reloads, shared
-- by replicas with cluster:.
-- Sticking to the pin whatever the index said cost multi-turn chats: on
-- examples/replay/conversations.py's chats with their sessions, TTFT p90 1.43x the ideal fleet at 4
-- servers (1x) against 1.25x without sessions; deferring to the index gives 1.28x (seed 11; seed 2024,
-- which nothing was fitted on: 1.44x -> 1.30x, no session 1.28x; at 8 servers 2x 1.40x -> 1.29x).

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

-- An endpoint for req's session; nil without a session, where the index can tell (priority.pick
-- decides), or with nothing available.
function M.pick(req, pool)
  local session = req.session
  if session == nil or session == "" then
    return nil
  end
  local key = key_of(req)
  local id = atc.affinity.get(key)
  local ep = id ~= nil and atc.find(pool, id) or nil
  if ep ~= nil and ep.available then
    local overlap = ep:prefix_overlap(req)
    -- the index sees the prompt's first req.blocks blocks (128 KiB live): where the pinned endpoint
    -- holds all of them and the prompt runs on past them (an agent's long shared system prompt), it
    -- cannot tell this session from the others, and the pin decides
    local blind = overlap >= req.blocks and req.prompt_tokens > (req.blocks + 1) * req.block_tokens
    if overlap > 0 and not blind then
      return nil -- the index places its cache there
    end
  end
  if ep == nil and atc.prefix_pick(pool, req) ~= nil then
    return nil -- a new session whose prefix the index knows somewhere
  end
  local best, _, best_ttft = atc.fastest(pool, req, priority.URGENT)
  if best == nil then
    return nil
  end
  local bound = best_ttft * SESSION_SLACK + SESSION_SLACK_MS
  if ep == nil or not ep.available or ep:predict_ttft(req) > bound then
    -- among the available endpoints whose predicted first token is within the bound
    ep = atc.rendezvous(pool, key, { req = req, max_ttft = bound }) or best
  end
  atc.affinity.set(key, ep.id, SESSION_TTL_MS) -- also keeps it from expiring while in use
  return ep
end

-- Pins req's session to ep, where priority.pick sent it (no session: nothing).
function M.remember(req, ep)
  local session = req.session
  if session ~= nil and session ~= "" then
    atc.affinity.set(key_of(req), ep.id, SESSION_TTL_MS)
  end
end

return M
