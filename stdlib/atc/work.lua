-- Prefill work: how many prompt tokens this policy has sent to each endpoint that the endpoint has not
-- had time to prefill yet, as the policy itself estimates it. An inference server computes a prompt
-- before the request's first token, at a steady rate, one prompt after another (vLLM's scheduler is
-- first come first served), so the work queued on an endpoint is what a new request waits behind.
--
--   local work = require "atc.work"
--   work.sent(ep, req)                         -- after routing req to ep (the policy entry does it)
--   work.backlog(ep)                           -- tokens still to prefill there, by now
--   work.cheapest(pool, backlog_w, load_w)     -- the available endpoints where a request waits least
--
-- The estimate drains each endpoint's backlog at PREFILL_TPS tokens a second of atc.now() (virtual
-- time under `atc replay`). Tokens of the prompt the endpoint likely has cached
-- (ep:prefix_overlap(req) blocks) are not counted: a cache hit is not prefilled. State is per policy
-- load (a reload starts from zero, which the next seconds of traffic correct) and per atc worker.

local M = {}

M.PREFILL_TPS = 15000 -- prompt tokens a second one server prefills (vLLM, 8B model, one H100)

local queued = {} -- endpoint (its view table) -> tokens not yet prefilled, as of stamp[ep] (ms)
local stamp = {}

-- Tokens of req's prompt that ep would have to compute.
function M.uncached(ep, req)
  local n = req.prompt_tokens - ep:prefix_overlap(req) * req.block_tokens
  return n > 0 and n or 0
end

function M.backlog(ep)
  local q = queued[ep]
  if q == nil then
    return 0
  end
  local now, last = atc.now(), stamp[ep]
  if now > last then -- (a clock that stepped back drains nothing)
    q = q - (now - last) * M.PREFILL_TPS / 1000
  end
  return q > 0 and q or 0
end

-- Counts req's uncached prompt against ep. v may be any routing result: only endpoints count.
function M.sent(v, req)
  if type(v) ~= "table" or v.id == nil or v.prefix_overlap == nil then
    return
  end
  queued[v] = M.backlog(v) + M.uncached(v, req)
  stamp[v] = atc.now()
end

-- The available endpoints of pool with the lowest estimated wait for a new request,
--   backlog_w * backlog(ep) + load_w * ep.inflight_tokens
-- (the prefill queued there by this estimate, and all the work in flight there, decoding included), as
-- an array: usually one endpoint; several when they tie (an idle pool: all of them); empty when none is
-- available. The loop over the pool runs in C (atc.cheapest).
function M.cheapest(pool, backlog_w, load_w)
  return atc.cheapest(pool, load_w, queued, stamp, atc.now(), M.PREFILL_TPS / 1000, backlog_w)
end

return M
