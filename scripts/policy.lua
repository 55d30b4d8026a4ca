-- The shipped policy: three layers, each a file beside this one (see README.md here).
--   capability: which endpoints may serve the request (model, alias, tags, version split)
--   affinity:   where its cache is (session, prefix), weighed against the work queued there
--   priority:   otherwise where the least work is queued (ties: urgent requests to the least
--               loaded, power of two choices for the rest)
-- route returns an endpoint or a verdict (queue / reject).

local capability = require "capability"
local affinity = require "affinity"
local priority = require "priority"
local work = require "atc.work"

local M = {}

function M.route(req, fleet)
  local pool, verdict = capability.candidates(req, fleet)
  if pool == nil then
    return verdict
  end
  local v = affinity.pick(req, pool) or priority.pick(req, pool)
  work.sent(v, req) -- the prefill work it adds there, which the next decisions weigh
  return v
end

-- Runs once per load, before any request: says in the log what in this file does not match the fleet.
function M.init(fleet)
  local problems = capability.check(fleet)
  for i = 1, #problems do
    atc.log(problems[i])
  end
end

return M
