-- Reference policy: llm-d's inference scheduler with its default weighted scorers (the endpoint picker
-- of the Gateway API Inference Extension, as llm-d configures it): queue-scorer weight 2,
-- kv-cache-utilization-scorer weight 2, prefix-cache-scorer weight 3, then the max-score picker.
--
-- Rules, each from those scorers (gateway-api-inference-extension, pkg/epp/scheduling/.../scorer):
--   queue:    (max_queue - queue) / (max_queue - min_queue) over the candidates, 1 when all are equal
--             (queue = the server's waiting requests, vllm:num_requests_waiting);
--   kv:       1 - KV cache usage (vllm:gpu_cache_usage_perc);
--   prefix:   matched prefix blocks / the request's prefix blocks, from an index of the blocks the
--             scheduler sent to each server (approximate, like atc's);
--   picker:   the highest weighted sum; ties broken at random.
-- Mapping onto atc: queue and kv are ep.server_queue and ep.kv_usage, what the servers report (under
-- `atc replay`, the simulated servers' own numbers; nil until a server is scraped, counted here as an
-- empty queue and cache, as the scheduler does for a pod without metrics yet), prefix is
-- ep:prefix_overlap(req) / req.blocks. Endpoints without room are
-- filtered out first, as the scheduler's filters drop pods that cannot take the request.

local verdict = require "atc.verdict"

local W_QUEUE, W_KV, W_PREFIX = 2, 2, 3

return function(req, fleet)
  local pool = fleet:endpoints(req.model)
  if #pool == 0 then
    return verdict.model_not_found(req.model)
  end
  local cands = {}
  local qmin, qmax = math.huge, -math.huge
  for i = 1, #pool do
    local ep = pool[i]
    if ep.available then
      cands[#cands + 1] = ep
      local q = ep.server_queue or 0
      if q < qmin then qmin = q end
      if q > qmax then qmax = q end
    end
  end
  if #cands == 0 then
    return verdict.queue("no endpoint has room")
  end
  local best, best_score, ties = nil, -math.huge, 0
  for i = 1, #cands do
    local ep = cands[i]
    local queue = qmax == qmin and 1 or (qmax - (ep.server_queue or 0)) / (qmax - qmin)
    local kv = 1 - (ep.kv_usage or 0)
    local prefix = req.blocks > 0 and ep:prefix_overlap(req) / req.blocks or 0
    local score = W_QUEUE * queue + W_KV * kv + W_PREFIX * prefix
    if score > best_score then
      best, best_score, ties = ep, score, 1
    elseif score == best_score then
      ties = ties + 1
      if atc.random(ties) == 1 then -- reservoir sampling: each tied endpoint equally likely
        best = ep
      end
    end
  end
  return best
end
