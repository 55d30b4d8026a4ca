-- Reference policy: llm-d's inference scheduler (the endpoint picker, EPP) with its default scheduling
-- profile: queue-scorer weight 2, kv-cache-utilization-scorer weight 2, prefix-cache-scorer weight 3,
-- then the max-score picker.
--
-- Source (llm-d/llm-d-inference-scheduler, now the llm-d-router module):
--   pkg/epp/config/loader/defaults.go                loadDefaultConfig: the three scorers and weights
--   config/charts/epplib/templates/_config.yaml      the same profile in the Helm chart
--   pkg/epp/scheduling/scheduler_profile.go          filters, then sum of weight * score (each clamped to
--                                                    [0, 1]), then the picker
--   pkg/epp/framework/plugins/scheduling/scorer/queuedepth/queue.go
--   pkg/epp/framework/plugins/scheduling/scorer/kvcacheutilization/kvcache_utilization.go
--   pkg/epp/framework/plugins/scheduling/scorer/prefix/plugin.go
--   pkg/epp/framework/plugins/requestcontrol/dataproducer/approximateprefix/{types.go,hashing.go,plugin.go}
--   pkg/epp/framework/plugins/scheduling/picker/maxscore/picker.go
--
-- Rules, per candidate endpoint:
--   queue:  (max_q - q) / (max_q - min_q) over the candidates, 1 for all when they are equal
--           (q = the server's waiting requests, vllm:num_requests_waiting);
--   kv:     1 - KV cache usage (vllm:kv_cache_usage_perc);
--   prefix: matched blocks / the request's blocks, from an approximate index of the blocks the scheduler
--           sent to each server: the prompt is cut into blocks of 16 tokens (blockSizeTokens, vLLM's
--           default) and only the first 256 of them (maxPrefixBlocksToMatch) are hashed, so a match of
--           the first 4,096 tokens is a full score; a prompt shorter than one block scores 0;
--   score = 2 * queue + 2 * kv + 3 * prefix; the highest wins, ties at random (the picker shuffles,
--   then sorts stably). The default profile has no filter.
-- A pod whose metrics were not scraped yet reads the zero values (no queue, no KV in use).
--
-- Mapping onto atc: q and KV usage are ep.server_queue and ep.kv_usage (under `atc replay`, the simulated
-- servers' own numbers), nil until scraped and read as 0 as the scheduler does; the matched tokens are
-- ep:prefix_overlap(req) blocks of req.block_tokens, counted up to the same 4,096-token horizon, over
-- min(prompt tokens, 4,096). Endpoints without room are left out first (atc's capacity; llm-d sheds only
-- sheddable requests when saturated, and has no per-pod limit).

local verdict = require "atc.verdict"

local W_QUEUE, W_KV, W_PREFIX = 2, 2, 3
local BLOCK_SIZE_TOKENS = 16
local MAX_PREFIX_BLOCKS = 256
local HORIZON = BLOCK_SIZE_TOKENS * MAX_PREFIX_BLOCKS -- tokens the prefix index looks at

local M = {}

-- The prefix-cache scorer's value for ep (exposed for the tests).
function M.prefix_score(ep, req)
  local total = math.min(req.prompt_tokens, HORIZON)
  if total < BLOCK_SIZE_TOKENS then
    return 0
  end
  local matched = math.min(ep:prefix_overlap(req) * req.block_tokens, total)
  return matched / total
end

function M.route(req, fleet)
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
    local kv = math.min(1, math.max(0, 1 - (ep.kv_usage or 0)))
    local score = W_QUEUE * queue + W_KV * kv + W_PREFIX * M.prefix_score(ep, req)
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

return M
