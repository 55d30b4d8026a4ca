-- Reference policy: SGLang's cache-aware routing (`--policy cache_aware`), as its router's code does it,
-- with the defaults its launcher passes.
--
-- Source (sgl-project/sglang):
--   sgl-model-gateway/src/policies/cache_aware.rs      CacheAwarePolicy::select_worker and
--                                                      select_worker_min_load (the router was
--                                                      sgl-router/src/policies/cache_aware.rs before)
--   sgl-model-gateway/bindings/python/.../router_args.py   the launcher's defaults
-- Since PR #14650 ("cache-aware router should pick min load instead of min tenant size", 2025-12) a
-- request that matches no tree well goes to the least loaded worker; before, it went to the worker with
-- the smallest tree (get_smallest_tenant), which the file's header comment still describes. This file
-- follows the code.
--
-- Rules:
--   1. A worker's load is the router's count of its requests in flight. The workers are imbalanced when
--      (max - min) > balance_abs_threshold AND max > balance_rel_threshold * min, over every worker;
--      then the request goes to the least loaded healthy worker (the first one of equal load).
--   2. Otherwise the approximate radix tree of the prompts the router sent (one tree, each node knows
--      the workers it was sent to) gives the longest prefix match; match rate = matched / request length.
--      Above cache_threshold the request goes to a worker holding that match.
--   3. At or below it, the request goes to the least loaded healthy worker (the first of equal load).
--   In every case the request's text is inserted into the chosen worker's part of the tree.
-- Defaults (router_args.py, what `python -m sglang_router.launch_router` runs with): cache_threshold 0.3,
-- balance_abs_threshold 64, balance_rel_threshold 1.5 (CacheAwareConfig::default in Rust says 0.5 / 32 /
-- 1.1, used only when the policy is built in code without the launcher). The tree's LRU eviction
-- (max_tree_size 2^26 characters per worker, every eviction_interval_secs) is not modelled: atc's prefix
-- index is a bounded LRU of its own.
--
-- Mapping onto atc: the tree is atc's prefix index, into which the engine inserts every routed request;
-- the match is the largest ep:prefix_overlap(req) over the workers, its rate that many blocks' tokens
-- over the prompt's tokens (SGLang counts characters), and several workers holding the same match are
-- chosen among at random (SGLang takes one of the tree node's workers). A request without prefix blocks
-- (a trace without hashes) matches nothing and goes to the least loaded worker, as a request with new
-- text does in SGLang. Load is ep.inflight. SGLang has no capacity limit; atc does, so "healthy" here is
-- ep.available, and a matched worker without room is passed over for the least loaded one with room.

local verdict = require "atc.verdict"

local CACHE_THRESHOLD = 0.3
local BALANCE_ABS_THRESHOLD = 64
local BALANCE_REL_THRESHOLD = 1.5

local M = {}

-- The first available endpoint of fewest requests in flight (Rust's min_by_key keeps the first).
local function min_load(pool)
  local best
  for i = 1, #pool do
    local ep = pool[i]
    if ep.available and (best == nil or ep.inflight < best.inflight) then
      best = ep
    end
  end
  return best
end

function M.route(req, fleet)
  local pool = fleet:endpoints(req.model)
  if #pool == 0 then
    return verdict.model_not_found(req.model)
  end
  -- 1. imbalance, over every worker of the model (as the router computes it)
  local lo, hi = math.huge, 0
  for i = 1, #pool do
    local n = pool[i].inflight
    if n < lo then lo = n end
    if n > hi then hi = n end
  end
  if hi - lo > BALANCE_ABS_THRESHOLD and hi > lo * BALANCE_REL_THRESHOLD then
    return min_load(pool) or verdict.queue("no endpoint has room")
  end
  -- 2. the longest prefix match (ties: one of the workers holding it, at random)
  local best, best_overlap, ties = nil, 0, 0
  for i = 1, #pool do
    local ep = pool[i]
    local o = ep:prefix_overlap(req)
    if o > best_overlap then
      best, best_overlap, ties = ep, o, 1
    elseif o == best_overlap and o > 0 then
      ties = ties + 1
      if atc.random(ties) == 1 then
        best = ep
      end
    end
  end
  local prompt = req.prompt_tokens > 0 and req.prompt_tokens or 1
  local rate = math.min(1, best_overlap * req.block_tokens / prompt)
  if best ~= nil and rate > CACHE_THRESHOLD and best.available then
    return best
  end
  -- 3. no good match (or its worker has no room): the least loaded worker
  return min_load(pool) or verdict.queue("no endpoint has room")
end

return M
