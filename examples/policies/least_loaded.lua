-- Reference policy: least loaded. Each request goes to the endpoint with the fewest requests in flight
-- relative to its capacity (ties: fewer tokens in flight, then the first).
--
-- Source: nginx's `least_conn` and HAProxy's `balance leastconn` (fewest active connections), and the
-- "shortest queue" rule SGLang's router falls back to when its workers are imbalanced
-- (sgl-router, policies/cache_aware.rs: "Load Balancing (Shortest Queue)"). It ignores prompts, so it
-- never aims for a cache hit: it shows what balance alone buys.

local balance = require "atc.balance"
local verdict = require "atc.verdict"

return function(req, fleet)
  local pool = fleet:endpoints(req.model)
  if #pool == 0 then
    return verdict.model_not_found(req.model)
  end
  return balance.least_loaded(pool) or verdict.queue("no endpoint has room")
end
