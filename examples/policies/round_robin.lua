-- Reference policy: round robin. Each request goes to the next endpoint of its model that has room, in
-- turn, whatever its prompt or the load.
--
-- Source: the classic load balancer default (nginx's upstream module without a balancing directive,
-- HAProxy's `balance roundrobin`), also the default routing of vLLM's production-stack router
-- (`--routing-logic roundrobin`) and of NVIDIA Dynamo's frontend (`--router-mode round-robin`).
-- Kept here as the baseline every other policy should beat.

local balance = require "atc.balance"
local verdict = require "atc.verdict"

return function(req, fleet)
  local pool = fleet:endpoints(req.model)
  if #pool == 0 then
    return verdict.model_not_found(req.model)
  end
  -- One cursor per model, as those routers keep one per backend group.
  return balance.round_robin(pool, req.model) or verdict.queue("no endpoint has room")
end
