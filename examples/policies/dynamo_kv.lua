-- Reference policy: NVIDIA Dynamo's KV-aware router cost, with its defaults.
--
-- Rule (Dynamo docs, "KV Router" / "Routing Concepts", and the router's CLI defaults):
--   for each worker:  cost = overlap_score_weight * prefill_blocks + decode_blocks
--     prefill_blocks = the request's prompt blocks that worker would have to compute: its blocks minus
--                      the leading blocks the worker already has cached (the overlap);
--     decode_blocks  = the KV blocks active on the worker (requests in flight) plus the request's own;
--   the worker with the lowest cost wins (router_temperature 0: deterministic; ties at random).
--   Defaults: overlap_score_weight (--kv-overlap-score-weight) 1.0, router_temperature 0.0.
-- Mapping onto atc: the overlap is ep:prefix_overlap(req) (Dynamo's --no-kv-events "approximation
-- mode", which predicts cache state from its own routing decisions, as atc's prefix index does);
-- active blocks are the endpoint's tokens in flight (prompt + max_tokens of its requests) in blocks of
-- req.block_tokens. Endpoints without room are skipped.

local verdict = require "atc.verdict"

local OVERLAP_SCORE_WEIGHT = 1.0

return function(req, fleet)
  local pool = fleet:endpoints(req.model)
  if #pool == 0 then
    return verdict.model_not_found(req.model)
  end
  local bt = req.block_tokens
  local request_blocks = math.ceil(req.prompt_tokens / bt)
  local best, best_cost, ties = nil, math.huge, 0
  for i = 1, #pool do
    local ep = pool[i]
    if ep.available then
      local prefill = request_blocks - ep:prefix_overlap(req)
      if prefill < 0 then prefill = 0 end
      local decode = ep.inflight_tokens / bt + request_blocks
      local cost = OVERLAP_SCORE_WEIGHT * prefill + decode
      if cost < best_cost then
        best, best_cost, ties = ep, cost, 1
      elseif cost == best_cost then
        ties = ties + 1
        if atc.random(ties) == 1 then
          best = ep
        end
      end
    end
  end
  return best or verdict.queue("no endpoint has room")
end
