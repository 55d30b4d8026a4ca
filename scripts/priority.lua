-- Priority: where the request gets its first token soonest. The engine predicts that for every endpoint
-- from what it observes (ep:predict_ttft): the prompt tokens already queued for prefill there
-- (ep.prefill_tokens: sent, first token not back yet) plus this request's own uncached tokens (the prefix
-- index credits what the endpoint likely has cached), at the observed prefill rate, plus one decode step.
-- atc.fastest computes it over the pool in C. Urgent requests take the soonest first token, full stop;
-- the others also weigh the cache they leave behind and the work each endpoint was given lately (so a cold
-- server takes a share of a hot prefix rather than stay idle), and a long one waits in atc's own queue
-- while every endpoint has a long prefill queue (late binding); a short one never waits there. Nothing
-- available: queue.

local verdict = require "atc.verdict"

-- Knobs ------------------------------------------------------------------------------------------------
local HIGH_PRIORITY = 5   -- req.priority (0-9, header x-atc-priority) above this is urgent
local CACHE_WEIGHT = 1.5  -- an uncached prompt token counts this many times (> 1: the cache it leaves behind)
local DECODE_WEIGHT = 1   -- + this x one decode step per request decoding there (the batch it joins)
local CONGESTION = 1      -- near saturation the uncached weight rises to 1 + this x requests queued per endpoint
local RECENT = 0.3        -- + this x the prefill of the uncached tokens sent there lately (ep.recent_tokens)
local HOLD_MS = 300       -- late binding: wait in atc's queue while every endpoint has more prefill queued
local STEP_TOKENS = 8192  -- the engines' iteration budget: joining a prefill queue delays the prompt ahead
----------------------------------------------------------------------------------------------------------
-- What each knob does, and the data that fitted it: the first half of Mooncake's synthetic trace
-- (`--limit 1996`), tests/bench/bursty_trace.py 7 (agents and documents shared by bursts of requests) and
-- examples/replay/conversations.py 11 (multi-turn chats, one-off documents). Never the data reported
-- against: docs/replay.md ("The routing grids") has the second half, the Azure code trace and those
-- generators with another seed. Figures are TTFT p90 over the ideal fleet's, geomean over the cells of
-- offered load <= 1.5, for first half / bursty / conversations (`tests/bench/routing_grid --fit`; a knob
-- changed in a copy of scripts/ and `--policy COPY/policy.lua` gives the same line for it).
-- The figures below were taken before the prefix index aged blocks as an LRU cache and the prefill
-- signals counted a half-done prompt as half queued (issue 28). Since then these knobs gave 1.238 / 1.125 /
-- 1.140, and each one's neighbours stay within 3%: CACHE_WEIGHT 1 / 2: 1.241 / 1.116 / 1.132, 1.246 /
-- 1.142 / 1.166; CONGESTION 0.5 / 2: 1.257 / 1.122 / 1.135, 1.242 / 1.132 / 1.150; RECENT 0.1 / 1: 1.246
-- / 1.163 / 1.158, 1.254 / 1.093 / 1.162; DECODE_WEIGHT 0.5 / 2: 1.241 / 1.127 / 1.141, 1.252 / 1.122 /
-- 1.143; HOLD_MS 150 / 600: 1.269 / 1.125 / 1.137, 1.245 / 1.125 / 1.140. None moved for good, so none
-- changed. With a late first token read as a busy server (engine/fleet/signals.h) and STEP_TOKENS
-- (below) they give 1.228 / 1.115 / 1.134; HOLD_MS 100 / 600 then 1.233 / 1.115 / 1.133, 1.227 / 1.115 /
-- 1.131 (kept).
--
-- The cost of an endpoint, in milliseconds of prefill at the pool's mean observed rate:
--   ep.prefill_tokens                      the prompt tokens queued there (sent, first token not back)
--   + CACHE_WEIGHT x its uncached tokens   its prefill now, and the cache it leaves on a server that did
--                                          not hold it (urgent requests count them once)
--   + RECENT x ep.recent_tokens            the uncached tokens sent there in the last few seconds
--   + DECODE_WEIGHT x decoding x itl       the decode batch it joins
-- CACHE_WEIGHT 1.5 (first half): below 0.5 of capacity every weight tied; at 0.77-0.96 1.5 gave the lowest
-- TTFT p90 (2x/8 servers: 2945 ms against 3103 at 1 and 3218 at 2).
-- CONGESTION: near saturation a token of prefill delays every request queued behind it, so the uncached
-- weight rises to 1 + CONGESTION x (mean ep.prefill_tokens / mean ep.uncached_mean), the marginal cost of
-- work in a queue (M/M/1: 1 / (1 - utilisation)); 1 is that formula, not a fit (0.5 / 1 / 2 tied within 1%
-- on the first half; without it the policy gave hits away for balance at 0.96 of capacity).
-- RECENT: a server that was just given a burst is about to be busy (the next calls of the same agents come
-- back to it), which its prefill queue stops saying once those prefills are done; and where many prompts
-- open with the same blocks, a cold server always looked dearer and stayed idle while the warm one
-- queued. With RECENT the next request of a hot prefix goes to the cold server, which computes the prefix
-- once and then holds it too. RECENT 0 / 0.1 / 0.3 / 1: 1.238 / 1.249 / 1.173, 1.240 / 1.178 / 1.165,
-- 1.241 / 1.117 / 1.182, 1.256 / 1.096 / 1.198 (bursty at 4x / 32 servers: 3.8x the ideal without it,
-- 1.17x with 0.3).
-- DECODE_WEIGHT: RECENT evens out the uncached tokens each server is sent, not the requests: servers that
-- got cache hits took more of them and their decode batches grew (first half, 4x / 16 servers: in-flight
-- imbalance 2.14 against 1.59, ITL p50 28.5 ms against 22.9). A full decode step per request decoding
-- there evens the batches again: 0.1 / 1 / 2: 1.252 / 1.124 / 1.181, 1.241 / 1.117 / 1.182, 1.251 /
-- 1.115 / 1.182.
-- HOLD_MS: late binding. While every endpoint has more than HOLD_MS of prefill queued, a request that is
-- not urgent waits in atc's own queue (a queue verdict: the engine asks again when a prefill finishes or
-- a slot frees, and answers 503 at the admission deadline), then goes where it costs least among them
-- all, as the ideal fleet's one FIFO queue binds a request only when a server comes free. 0 / 300 / 600 /
-- never: 1.243 / 1.117 / 1.180, 1.241 / 1.117 / 1.182, 1.242 / 1.117 / 1.185, 1.276 / 1.117 / 1.186.
-- STEP_TOKENS: the engines' iteration token budget (vLLM's --max-num-batched-tokens, 8192 on its OpenAI
-- server on large GPUs; SGLang's --chunked-prefill-size). An engine fills an iteration with the next
-- waiting prompt once the ones ahead are scheduled (vllm/v1/core/sched/scheduler.py schedule()), so a
-- request sent where prefill is queued joins the last iteration of the prompt ahead, whose first token
-- then waits for up to STEP_TOKENS more of prefill, while this request, sent once that one is done,
-- would start in the next iteration and get its first token no later. The cost counts that delay, and
-- so does the hold (SOONEST): while every endpoint would make the request wait, or delay the one ahead,
-- by more than HOLD_MS, it waits in atc's queue, and endpoints work through one prompt at a time as the
-- ideal fleet's lanes do. It is the engine's setting, not a fit: 4096 / 8192 / 16384 gave 1.227 / 1.116 /
-- 1.132, 1.228 / 1.115 / 1.134, 1.233 / 1.115 / 1.134; without it 1.238 / 1.125 / 1.140. Where it told
-- most was data no knob saw: the Azure code trace (no shared prefixes: load balancing alone) went from
-- 1.07x the ideal (geomean of its grid) to 0.97x, its slowest cell from 1.24x to 1.02x.
-- Not weighed: the tokens held by requests in flight (ep.inflight_tokens). Counting them as Dynamo does
-- helped by 3-7% at 0.6-0.8 of capacity, and past saturation gave cache hits away for balance, the
-- collapse "tokens in flight" caused in the policy this one replaced (docs/replay.md, "The routing grids").
-- Tried on the same data and left out:
-- * never holding a short request (its own prefill under 500 ms): 1.219 on the first half, all of it
--   from long prompts starved past saturation (short ones kept every queue full: bursty at 2x / 8 servers
--   62x the ideal against 38x); bypassing only while nothing had waited 2 s left 1.240, no gain.
-- * holding a request until the endpoint it would pick (its cache holder) has a short queue: it starved
--   behind a hot holder that never emptied (bursty at 1x / 16 servers: 95x the ideal).
-- * sending a request to an idle server when its first token comes 300-600 ms sooner there than at the
--   cheapest one (replicating a hot prefix): nothing once RECENT spreads the work; RECENT only while some
--   endpoint has nothing queued: the same.
-- * CONGESTION only while no endpoint is idle (a pool with an idle server is not congested): without
--   RECENT it took the bursty trace from 1.528 to 1.191, with RECENT it changed nothing (1.255 / 1.109 /
--   1.179); only while some endpoint was never sent a request (M.COLD_POOL below): 1.241 / 1.114 / 1.182.

local M = {}
M.HIGH_PRIORITY, M.CACHE_WEIGHT, M.RECENT, M.HOLD_MS = HIGH_PRIORITY, CACHE_WEIGHT, RECENT, HOLD_MS

-- Every endpoint at the pool's mean observed rates: the servers of one pool run the same model on the
-- same hardware, and comparing each one's noisy estimate of the same speed moved traffic for nothing
-- (the same first-half grid: per-endpoint rates cost 9 points of cache hits at 1x/32 servers, 31% ->
-- 22%, 16% of TTFT p90 there and 23% at 2x/8). A pool of unlike servers: split it by tags (capability).
-- explain: atc.fastest puts every candidate's cost (ms) and predicted TTFT in the decision record, the
-- pick first, when someone reads it (x-atc-explain: 1, the access log, a recording); else it costs nothing.
M.COST = { pooled = true, uncached = CACHE_WEIGHT, decode = DECODE_WEIGHT, congestion = CONGESTION,
           recent = RECENT, step_tokens = STEP_TOKENS, explain = true }
M.URGENT = { pooled = true, uncached = 1, explain = true } -- the soonest predicted first token alone
-- While some endpoint has never been sent a request, COST without CONGESTION: the pool's queued requests
-- per endpoint (mean ep.prefill_tokens / mean ep.uncached_mean) count such an endpoint as holding requests
-- of no size, so one busy server beside idle new ones read as a congested pool (at most 16x), and its
-- cache weight kept every request on it while they stayed idle: a hot prefix from a cold start queued on
-- one server of four (tests/policy/fixtures/hot_prefix.jsonl: TTFT p90 2.1 s, 1.1 s with this).
M.COLD_POOL = { pooled = true, uncached = CACHE_WEIGHT, decode = DECODE_WEIGHT, recent = RECENT,
                step_tokens = STEP_TOKENS, explain = true }

function M.cost(req)
  return req.priority > HIGH_PRIORITY and M.URGENT or M.COST
end

-- The soonest any endpoint starts a new prefill: uncached = 0 leaves the cost at its queue (ms) + itl.
M.SOONEST = { pooled = true, uncached = 0, step_tokens = STEP_TOKENS }

function M.pick(req, pool)
  local cost = M.cost(req)
  if cost ~= M.URGENT then
    local soon, wait = atc.fastest(pool, req, M.SOONEST)
    if soon ~= nil and wait > HOLD_MS and soon.prefill_tokens > 0 then -- (a first token will come)
      return verdict.queue("every endpoint has a prefill queue")
    end
    if soon ~= nil and soon.uncached_mean == nil then -- (the least queued: a new one if any is new)
      cost = M.COLD_POOL
    end
  end
  return atc.fastest(pool, req, cost) or verdict.queue("no endpoint of the pool has room")
end

return M
