-- Reference policy: SGLang's cache-aware routing, as its router (sgl-router, policies/cache_aware.rs)
-- does it, with its default thresholds.
--
-- Rules, each from that file:
--   1. Load is the number of requests the router has in flight on each worker. The workers are
--      imbalanced when (max - min) > balance_abs_threshold AND max > balance_rel_threshold * min;
--      then the request goes to the least loaded worker ("shortest queue") whatever its prefix.
--   2. Otherwise the worker whose approximate radix tree (the prompts the router sent it) shares the
--      longest prefix with the request is found; match rate = matched / request length. Above
--      cache_threshold, the request goes to that worker.
--   3. At or below it, the request goes to the worker with the smallest tree, i.e. the one with the most
--      free cache capacity (get_smallest_tenant).
--   4. In every case the request's text is inserted into the chosen worker's tree.
-- Defaults (sgl-router's RouterConfig / launch_router): cache_threshold 0.3, balance_abs_threshold 64,
-- balance_rel_threshold 1.5.
--
-- Mapping onto atc: the radix tree is atc's prefix index (ep:prefix_overlap(req): leading prefix
-- blocks recently routed to that endpoint); the match rate counts those blocks' tokens against the
-- prompt's; the tree size is tracked here, per endpoint, as the prefix blocks sent to it that it did not
-- have yet (SGLang evicts trees above max_tree_size = 2^26 characters, about 16M tokens each, which this
-- trace-length replay never reaches, so no eviction is modelled). SGLang has no capacity limit; atc
-- does, so a full worker is skipped for the least loaded one with room.

local balance = require "atc.balance"
local verdict = require "atc.verdict"

local CACHE_THRESHOLD = 0.3
local BALANCE_ABS_THRESHOLD = 64
local BALANCE_REL_THRESHOLD = 1.5

local tree_size = {} -- endpoint id -> prefix blocks inserted into its approximate tree

local function insert(ep, req, overlap)
  tree_size[ep.id] = (tree_size[ep.id] or 0) + (req.blocks - overlap)
end

return function(req, fleet)
  local pool = fleet:endpoints(req.model)
  if #pool == 0 then
    return verdict.model_not_found(req.model)
  end
  -- 1. imbalance, over every worker of the model (as sgl-router computes it)
  local lo, hi = math.huge, 0
  for i = 1, #pool do
    local n = pool[i].inflight
    if n < lo then lo = n end
    if n > hi then hi = n end
  end
  if hi - lo > BALANCE_ABS_THRESHOLD and hi > lo * BALANCE_REL_THRESHOLD then
    local ep = balance.least_loaded(pool)
    if ep == nil then
      return verdict.queue("no endpoint has room")
    end
    insert(ep, req, ep:prefix_overlap(req))
    return ep
  end
  -- 2. the longest prefix match (ties: the one with fewer requests in flight)
  local best, best_overlap = nil, 0
  for i = 1, #pool do
    local ep = pool[i]
    local o = ep:prefix_overlap(req)
    if o > best_overlap or (o == best_overlap and best ~= nil and ep.inflight < best.inflight) then
      best, best_overlap = ep, o
    end
  end
  local prompt = req.prompt_tokens > 0 and req.prompt_tokens or 1
  local rate = best_overlap * req.block_tokens / prompt
  local ep
  if best ~= nil and rate > CACHE_THRESHOLD then
    ep = best
  else
    -- 3. the smallest tree
    for i = 1, #pool do
      local e = pool[i]
      if ep == nil or (tree_size[e.id] or 0) < (tree_size[ep.id] or 0) then
        ep = e
      end
    end
  end
  if not ep.available then
    ep = balance.least_loaded(pool)
    if ep == nil then
      return verdict.queue("no endpoint has room")
    end
  end
  insert(ep, req, ep:prefix_overlap(req))
  return ep
end
