-- Prefix cache: how much of a request's prompt an endpoint holds, exact where the endpoint publishes its
-- KV-cache events (kv_events:, ep:cached_tokens) and guessed elsewhere (atc's prefix index: where atc sent
-- each prompt, ep:prefix_overlap). A fleet may mix both: engines that publish and engines that do not.
--
--   cached(ep, req)        tokens of req's prompt ep holds, and true when the figure is exact
--   uncached(ep, req)      prompt tokens ep would still have to prefill (at least 1)
--   pick(pool, req[, o])   the available endpoint with the lowest uncached + o.load_weight (default 1)
--                          x its tokens in flight (ties: the lighter); nil when none is available.
--                          o.exact = false ignores the exact figure (to compare against the guess).
--
-- atc.fastest and ep:predict_ttft already count the exact figure where there is one.

local M = {}

function M.cached(ep, req, exact_ok)
  if exact_ok ~= false then
    local c = ep:cached_tokens(req)
    if c ~= nil then
      return c, true
    end
  end
  return ep:prefix_overlap(req) * (req.block_tokens or 64), false
end

function M.uncached(ep, req, exact_ok)
  local u = (req.prompt_tokens or 0) - M.cached(ep, req, exact_ok)
  return u > 1 and u or 1
end

function M.pick(pool, req, o)
  local w = o and o.load_weight or 1
  local exact_ok = not (o and o.exact == false)
  local best, best_cost, best_load
  for i = 1, #pool do
    local ep = pool[i]
    if ep.available then
      local cost = M.uncached(ep, req, exact_ok) + w * (ep.inflight_tokens or 0)
      local load = ep.load or 0
      if best == nil or cost < best_cost or (cost == best_cost and load < best_load) then
        best, best_cost, best_load = ep, cost, load
      end
    end
  end
  return best
end

return M
