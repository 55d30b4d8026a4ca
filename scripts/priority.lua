-- Priority: where the request gets its first token soonest. The engine predicts that for every endpoint
-- from what it observes (ep:predict_ttft): the prompt tokens already queued for prefill there
-- (ep.prefill_tokens: sent, first token not back yet) plus this request's own uncached tokens (the prefix
-- index credits what the endpoint likely has cached), at the observed prefill rate, plus one decode step.
-- atc.fastest computes it over the pool in C. Urgent requests take the soonest first token, full stop;
-- the others also weigh the cache they leave behind. Nothing available: queue.

local verdict = require "atc.verdict"

-- Knobs ------------------------------------------------------------------------------------------------
local HIGH_PRIORITY = 5 -- req.priority (0-9, header x-atc-priority) above this is urgent
-- A prompt token that is not cached where the request goes costs CACHE_WEIGHT tokens of queue: the
-- prefill now, and the cache it leaves on a server that did not hold it. With 1 (urgent requests), a
-- prompt leaves its cache for an endpoint whose queue is shorter by more than the cached tokens; with
-- 1.5 it stays unless the queue there is longer by 1.5 times its uncached part elsewhere. Fitted on the
-- first half of Mooncake's synthetic trace (README, "Routing"): 1.5 kept the most hits at 0.8-1.0 of
-- the fleet's prefill capacity (TTFT p90 0.91x of 1.0 at 2x speed on 8 servers) and changed nothing
-- at light load; 2 and more gave hits back to queues again near saturation.
local CACHE_WEIGHT = 1.5
-- Each request decoding there costs DECODE_WEIGHT of a token step: a new request slows every step of the
-- batch it joins. A tie-breaker, too small to move a prompt from its cache: on the Azure code trace
-- (prompts without prefixes, one at a time) 0.1 cut e2e p99 by 9% and left TTFT as it was.
local DECODE_WEIGHT = 0.1
----------------------------------------------------------------------------------------------------------

local M = {}
M.HIGH_PRIORITY, M.CACHE_WEIGHT = HIGH_PRIORITY, CACHE_WEIGHT

-- Every endpoint at the pool's mean observed rates: the servers of one pool run the same model on the
-- same hardware, and comparing each one's noisy estimate of the same speed moved traffic for nothing
-- (replayed on the first half of the synthetic trace, per-endpoint rates cost 8 points of cache hits
-- at light load, 30% -> 22%, and 15% of TTFT p90).
M.COST = { pooled = true, uncached = CACHE_WEIGHT, decode = DECODE_WEIGHT }
M.URGENT = { pooled = true, uncached = 1, decode = DECODE_WEIGHT }

function M.cost(req)
  return req.priority > HIGH_PRIORITY and M.URGENT or M.COST
end

function M.pick(req, pool)
  return atc.fastest(pool, req, M.cost(req)) or verdict.queue("no endpoint of the pool has room")
end

return M
