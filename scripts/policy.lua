-- The shipped policy: three layers, each a file beside this one (see README.md here).
--   capability: which endpoints may serve the request (model, alias, tags, version split)
--   affinity:   a conversation back where its cache is when the prefix index cannot tell, unless that
--               endpoint is much slower now
--   priority:   otherwise where the first token comes soonest, by the engine's prediction (its prefill
--               queue, the request's uncached prompt there), weighing the cache a request leaves behind
-- route returns an endpoint or a verdict (queue / reject).

local capability = require "capability"
local affinity = require "affinity"
local priority = require "priority"
local verdicts = require "atc.verdict"

local M = {}

function M.route(req, fleet)
  local pool, verdict = capability.candidates(req, fleet)
  if pool == nil then
    return verdict
  end
  local pick = affinity.pick(req, pool)
  if pick ~= nil then
    return pick
  end
  pick = priority.pick(req, pool)
  if verdicts.kind(pick) == "endpoint" then
    affinity.remember(req, pick) -- the session's next turn finds it here if the index does not
  end
  return pick
end

-- Runs once per load, before any request: says in the log what in this file does not match the fleet.
function M.init(fleet)
  local problems = capability.check(fleet)
  for i = 1, #problems do
    atc.log(problems[i])
  end
end

return M
