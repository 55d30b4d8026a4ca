-- The common pick of a disaggregated model's pair (disaggregation: on a model): route returns
-- {prefill = ep, decode = ep} (stdlib/atc/contract.lua, "route's return").
--
--   local disagg = require "atc.disagg"
--   return function(req, fleet)
--     return disagg.pick(fleet:endpoints(req.model), req) or atc.queue("no pair")
--   end
--
-- prefill: the least prefill work ahead of this request: the uncached prompt tokens queued there
--          (`prefill_tokens`) plus this request's own uncached tokens there (its prompt less the blocks
--          `ep:prefix_overlap(req)` says are cached), over `prefill_rate`: seconds until its KV is ready.
-- decode:  the fewest running sequences (`decoding` + `prefilling`, atc's own count), then the most KV
--          room (1 - `kv_usage`, scraped; unknown counts as empty), then the lower `load`.
local M = {}

-- A server takes the prefill stage when its role is prefill or both, the decode stage when decode or both.
local function takes(ep, stage)
  return ep.role == stage or ep.role == "both"
end

-- The available endpoint of pool that takes the prefill stage with the least prefill time ahead of req,
-- and that time (s); nil when none. opts.skip: an endpoint never chosen.
function M.prefill(pool, req, opts)
  local skip = opts and opts.skip
  local best, best_cost
  for _, ep in ipairs(pool) do
    if ep ~= skip and ep.available and takes(ep, "prefill") then
      local cached = ep:prefix_overlap(req) * req.block_tokens
      local uncached = req.prompt_tokens > cached and req.prompt_tokens - cached or 0
      local cost = (ep.prefill_tokens + uncached) / ep.prefill_rate
      if best == nil or cost < best_cost then
        best, best_cost = ep, cost
      end
    end
  end
  return best, best_cost
end

-- The available endpoint of pool that takes the decode stage with the fewest sequences, then the most KV
-- room, then the lowest load; nil when none. opts.skip: an endpoint never chosen.
function M.decode(pool, req, opts)
  local skip = opts and opts.skip
  local best, bs, bkv, bload
  for _, ep in ipairs(pool) do
    if ep ~= skip and ep.available and takes(ep, "decode") then
      local seqs, kv, load = ep.decoding + ep.prefilling, ep.kv_usage or 0, ep.load
      if best == nil or seqs < bs or (seqs == bs and (kv < bkv or (kv == bkv and load < bload))) then
        best, bs, bkv, bload = ep, seqs, kv, load
      end
    end
  end
  return best
end

-- Whether pool has a server whose role is prefill: a disaggregated model's.
function M.disaggregated(pool)
  for _, ep in ipairs(pool) do
    if ep.role == "prefill" then
      return true
    end
  end
  return false
end

-- The pair {prefill = ep, decode = ep} for req over pool (a server of role both is not used for both
-- stages of one request while another can take one of them); nil when either stage has no available
-- server. A pool without prefill servers (a colocated model): the decode pick alone, an endpoint.
function M.pick(pool, req)
  if not M.disaggregated(pool) then
    return M.decode(pool, req)
  end
  local decode = M.decode(pool, req)
  if decode == nil then
    return nil
  end
  local prefill = M.prefill(pool, req, { skip = decode }) or M.prefill(pool, req)
  if prefill == nil then
    return nil
  end
  return { prefill = prefill, decode = decode }
end

return M
