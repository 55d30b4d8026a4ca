-- Reference policy: NVIDIA Dynamo's KV router (`--router-mode kv`), as its code computes a worker's cost,
-- with the router's defaults.
--
-- Source (ai-dynamo/dynamo):
--   lib/kv-router/src/scheduling/selector/default.rs   DefaultWorkerScorer::worker_logit, the argmin
--   lib/kv-router/src/scheduling/selector/mod.rs       WorkerSelectionInput::row (the load inputs)
--   lib/kv-router/src/sequences/prompt_registry.rs     WorkerLoadProjection::potential_decode_blocks
--   lib/kv-router/src/sequences/prefill_tracker.rs     active prefill tokens
--   lib/kv-router/src/scheduling/config.rs             KvRouterConfig::default
--   (earlier: lib/llm/src/kv_router/scheduler.rs and sequence.rs, potential_blocks_and_tokens; the same
--   cost with overlap_score_weight in place of prefill_load_scale)
--
-- Rule, per worker, in KV blocks of block_size tokens (lowest wins):
--   raw_prefill = (active_prefill_tokens + max(isl, cached_tokens)) / block_size
--   adjusted    = max(0, raw_prefill - overlap_score_credit * overlap_blocks)
--   decode      = active_decode_blocks + the request's full blocks not already among them
--                 (potential_decode_blocks = active_decode_blocks + additional_active_blocks)
--   logit       = prefill_load_scale * adjusted + decode + decode_active_request_weight * active_requests
--   active_prefill_tokens: the uncached prompt tokens of the worker's requests that have not produced
--   their first token (no decay: router_prefill_load_model "none"); active_decode_blocks: the prompt
--   blocks of its requests in flight, prefill or decode, until they finish (router_track_output_blocks
--   false: no output blocks). argmin; router_temperature 0 means no softmax, ties broken at random.
-- Defaults (config.rs): overlap_score_credit 1.0, overlap_score_credit_decay 0.0 (the credit is not
-- faded under load), prefill_load_scale 1.0, decode_active_request_weight 0.0, router_temperature 0.0,
-- router_track_prefill_tokens true, router_track_output_blocks false.
--
-- Mapping onto atc: overlap_blocks = ep:prefix_overlap(req) (Dynamo's approximate mode, which predicts
-- the cache from its own routing decisions, as atc's prefix index does); active_prefill_tokens =
-- ep.prefill_tokens (the engine's count of exactly that: uncached tokens sent, first token not back);
-- isl = req.prompt_tokens; block_size = req.block_tokens. active_decode_blocks = ep.inflight_tokens /
-- block_size: atc does not count the prompt tokens in flight apart from their max_tokens, so this
-- counts each request's output budget too (small beside the prompts of chat and Mooncake traffic), and
-- it cannot deduplicate the prompt blocks that requests in flight share, as Dynamo does
-- (router_assume_kv_reuse true): where traffic shares prefixes this term reads higher than Dynamo's.
-- The request's own blocks are deduplicated as Dynamo does, against the overlap: additional blocks =
-- max(0, floor(isl / block_size) - overlap_blocks). Dynamo counts only blocks of requests still in
-- flight there; atc's index also remembers finished ones, which matters at light load, where this term
-- is small anyway.
-- Not modelled: the router's own queue (router_queue_threshold, a fraction of the engines'
-- max_num_batched_tokens); atc skips endpoints without room and queues when none has any.

local verdict = require "atc.verdict"

local OVERLAP_SCORE_CREDIT = 1.0
local PREFILL_LOAD_SCALE = 1.0
local DECODE_ACTIVE_REQUEST_WEIGHT = 0.0

local M = {}

-- The logit of ep for req (exposed for the tests).
function M.logit(ep, req)
  local bs = req.block_tokens
  local isl = req.prompt_tokens
  local overlap = ep:prefix_overlap(req)
  local cached = overlap * bs
  local raw_prefill = (ep.prefill_tokens + math.max(isl, cached)) / bs
  local adjusted = math.max(0, raw_prefill - OVERLAP_SCORE_CREDIT * overlap)
  local decode = ep.inflight_tokens / bs + math.max(0, math.floor(isl / bs) - overlap)
  return PREFILL_LOAD_SCALE * adjusted + decode + DECODE_ACTIVE_REQUEST_WEIGHT * ep.inflight
end

function M.route(req, fleet)
  local pool = fleet:endpoints(req.model)
  if #pool == 0 then
    return verdict.model_not_found(req.model)
  end
  local best, best_cost, ties = nil, math.huge, 0
  for i = 1, #pool do
    local ep = pool[i]
    if ep.available then
      local cost = M.logit(ep, req)
      if cost < best_cost then
        best, best_cost, ties = ep, cost, 1
      elseif cost == best_cost then
        ties = ties + 1
        if atc.random(ties) == 1 then -- reservoir sampling, as minimum_cost_index does
          best = ep
        end
      end
    end
  end
  return best or verdict.queue("no endpoint has room")
end

return M
