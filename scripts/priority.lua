-- Priority: where the request gets its first token soonest. The engine predicts that for every endpoint
-- from what it observes (ep:predict_ttft): the prompt tokens already queued for prefill there
-- (ep.prefill_tokens: sent, first token not back yet) plus this request's own uncached tokens (the prefix
-- index credits what the endpoint likely has cached), at the observed prefill rate, plus one decode step.
-- atc.fastest computes it over the pool in C. Urgent requests take the soonest first token, full stop;
-- the others also weigh the cache they leave behind, and wait in atc's queue while every endpoint has a
-- long prefill queue (late binding, HOLD_MS). Nothing available: queue.

local verdict = require "atc.verdict"

-- Knobs ------------------------------------------------------------------------------------------------
local HIGH_PRIORITY = 5 -- req.priority (0-9, header x-atc-priority) above this is urgent
-- The cost of an endpoint, in milliseconds of its prefill (at the pool's observed rate):
--   the prompt tokens queued there (ep.prefill_tokens: sent, first token not back)
--   + CACHE_WEIGHT x this request's tokens not cached there: their prefill now, and the cache they leave
--     on a server that did not hold them (urgent requests count them once: the soonest first token)
--   + DECODE_WEIGHT x one decode step per request decoding there (a new request slows every step of the
--     batch it joins).
-- Fitted on the first half of Mooncake's synthetic trace only (`atc replay -c examples/replay/mooncake.yaml
-- --trace mooncake_synthetic.jsonl --limit 1996 --speed 1,2,2.5,4 --servers 8,16,32`, docs/replay.md, "The routing grids"):
-- below 0.5 of the fleet's prefill capacity every weighting tied (TTFT p90 within 3%: the floor is the
-- prefill of the long prompts); at 0.77-0.96 CACHE_WEIGHT 1.5 gave the lowest TTFT p90 (2x/8 servers:
-- 2945 ms against 3103 at 1 and 3218 at 2; 2.5x/8: 6213 against 6713 and 6328). DECODE_WEIGHT 0.1 is a tie-breaker: on the Azure code trace (no
-- prefixes, requests one at a time) it cut e2e p99 by 9% and left TTFT as it was.
-- CONGESTION: near saturation a token of prefill delays every request queued behind it, so the cache a
-- request uses or leaves is worth more than its own first token: the uncached weight rises to
-- 1 + CONGESTION x the requests queued per endpoint (mean ep.prefill_tokens / mean ep.uncached_mean), the
-- marginal cost of work in a queue (M/M/1: 1 / (1 - utilisation)); 1 is that formula, not a fit. On the
-- first half and the conversation trace, 0.5 / 1 / 2 gave geomean TTFT p90 ratios 0.981 / 0.980 / 0.979 and
-- 0.859 / 0.850 / 0.877 against the best reference; without it, at 2.5x / 8 servers (0.96 of capacity) the
-- policy gave hits away for balance: 5.3 s against 4.7 s.
-- Not weighed: the tokens held by requests in flight (ep.inflight_tokens). Counting them as Dynamo does
-- helped by 3-7% at 0.6-0.8 of capacity, and past saturation gave cache hits away for balance, the
-- collapse "tokens in flight" caused in the policy this one replaced (docs/replay.md, "The routing grids").
-- HOLD_MS: late binding. While every endpoint has more than HOLD_MS of prefill queued, a request that is
-- not urgent waits in atc's own queue (a queue verdict: the engine asks again when a prefill finishes or
-- a slot frees, and answers 503 at the admission deadline), then goes where it costs least among them
-- all. Committed at arrival, it would sit behind one endpoint's queue while another frees first or while
-- the endpoint holding its prefix frees; waiting centrally is what the ideal fleet does (one FIFO queue).
-- Fitted on the first half only (speeds 1,2,2.5,3,4 x 8,16,32 servers, TTFT p90 over the ideal fleet's):
-- 0 / 200 / 300 / 500 / 800 ms gave geomeans 1.255 / 1.251 / 1.236 / 1.239 / 1.243 against 1.253 without;
-- at 0.77 of capacity (2x/8, 4x/16) 1.07 and 1.06 against 1.11 and 1.11. 0 (bind only to an endpoint with
-- no prefill queued) starves the servers' batches near saturation (2.5x/8: 2.07 against 1.75).
local CACHE_WEIGHT = 1.5
local DECODE_WEIGHT = 0.1
local CONGESTION = 1
local HOLD_MS = 300
----------------------------------------------------------------------------------------------------------

local M = {}
M.HIGH_PRIORITY, M.CACHE_WEIGHT, M.HOLD_MS = HIGH_PRIORITY, CACHE_WEIGHT, HOLD_MS

-- Every endpoint at the pool's mean observed rates: the servers of one pool run the same model on the
-- same hardware, and comparing each one's noisy estimate of the same speed moved traffic for nothing
-- (the same first-half grid: per-endpoint rates cost 9 points of cache hits at 1x/32 servers, 31% ->
-- 22%, 16% of TTFT p90 there and 23% at 2x/8). A pool of unlike servers: split it by tags (capability).
-- explain: atc.fastest puts every candidate's cost (ms) and predicted TTFT in the decision record, the
-- pick first, when someone reads it (x-atc-explain: 1, the access log, a recording); else it costs nothing.
M.COST = { pooled = true, uncached = CACHE_WEIGHT, decode = DECODE_WEIGHT, congestion = CONGESTION, explain = true }
M.URGENT = { pooled = true, uncached = 1, decode = DECODE_WEIGHT, explain = true }

function M.cost(req)
  return req.priority > HIGH_PRIORITY and M.URGENT or M.COST
end

-- The soonest any endpoint starts a new prefill: uncached = 0 leaves the cost at its queue (ms) + itl.
M.SOONEST = { pooled = true, uncached = 0 }

function M.pick(req, pool)
  local cost = M.cost(req)
  if cost ~= M.URGENT then
    local soon, wait = atc.fastest(pool, req, M.SOONEST)
    if soon ~= nil and wait > HOLD_MS and soon.prefill_tokens > 0 then -- (a first token will come)
      return verdict.queue("every endpoint has a prefill queue")
    end
  end
  return atc.fastest(pool, req, cost) or verdict.queue("no endpoint of the pool has room")
end

return M
