-- Reference policy: vLLM production-stack's `--routing-logic loadaware` (its router's KV-cache-aware
-- placement weighted by live load), with its default.
--
-- Source (vllm-project/production-stack): src/vllm_router/routers/routing_logic.py, LoadAwareRouter
-- (select_url, relative_loads, score_endpoint, fallback_url) and RoutingInterface._qps_routing, added by
-- PR #1035 (merged 2026-08-09; read from the PR's branch, as the main-branch snapshot at hand predates
-- the merge); src/vllm_router/stats/request_stats.py (the in-flight counts and QPS);
-- src/vllm_router/parsers/parser.py (--request-stats-window 60, --session-key unset).
--
-- Rule: every endpoint is scored
--   score(i)         = min(matched_tokens(i), P) / max(P, 1) - beta * relative_load(i)
--   relative_load(i) = (load(i) - mean_load) / max(1, mean_load)
-- where P is the prompt's token count, matched_tokens(i) the prefix of it LMCache reports cached on i,
-- load(i) the router's requests in flight on i (in prefill plus in decode) and mean_load their mean over
-- the endpoints; the highest score wins, ties to the lexicographically first URL. When no endpoint holds
-- any of the prompt, the request takes upstream's fallback: the session's consistent hash when a
-- --session-key is configured (it is not by default), else the endpoint with the lowest QPS over the
-- last --request-stats-window seconds (an endpoint that has had no request yet first).
-- Default: beta 1.0 (DEFAULT_LOADAWARE_BETA; LOADAWARE_BETA in the environment overrides it): an
-- endpoint 100% above the fleet's mean load loses one full cache hit's worth of preference.
--
-- Mapping onto atc: matched_tokens = ep:prefix_overlap(req) * req.block_tokens (atc's prefix index of
-- what it routed stands in for LMCache's controller); P = req.prompt_tokens; load = ep.prefilling +
-- ep.decoding (the engine's count of requests before and after their first byte, the same split as
-- in_prefill_requests and in_decoding_requests); the mean runs over the model's healthy endpoints; the
-- URL order is the endpoint id's. The QPS is counted here, from this policy's own picks, in a sliding
-- window of 60 s of atc.now(). Only endpoints with room are picked (production-stack has no limit).

local verdict = require "atc.verdict"

local BETA = 1.0
local REQUEST_STATS_WINDOW_MS = 60 * 1000

local M = {}

-- endpoint id -> { times of the picks in the window, oldest first; head = index of the oldest }
local picks = {}

local function record(ep, now)
  local p = picks[ep.id]
  if p == nil then
    p = { head = 1 }
    picks[ep.id] = p
  end
  p[#p + 1] = now
end

-- Requests per second routed to ep over the window, or nil when it has had none (no stats yet).
local function qps(ep, now)
  local p = picks[ep.id]
  if p == nil then
    return nil
  end
  local head = p.head
  while head <= #p and p[head] < now - REQUEST_STATS_WINDOW_MS do
    p[head] = false
    head = head + 1
  end
  if head > 1024 and head > #p / 2 then -- compact now and then so the list stays the window's size
    local kept = { head = 1 }
    for i = head, #p do
      kept[#kept + 1] = p[i]
    end
    picks[ep.id] = kept
    p, head = kept, 1
  end
  p.head = head
  return (#p - head + 1) / (REQUEST_STATS_WINDOW_MS / 1000)
end

-- RoutingInterface._qps_routing: the first endpoint without stats, else the lowest QPS (first of equal).
local function lowest_qps(pool, now)
  local best, best_qps
  for i = 1, #pool do
    local ep = pool[i]
    if ep.available then
      local q = qps(ep, now)
      if q == nil then
        return ep
      end
      if best == nil or q < best_qps then
        best, best_qps = ep, q
      end
    end
  end
  return best
end

local function load(ep)
  return ep.prefilling + ep.decoding
end

-- The score of ep for req, given the fleet's mean load (exposed for the tests).
function M.score(ep, req, mean)
  local prompt = req.prompt_tokens
  local matched = ep:prefix_overlap(req) * req.block_tokens
  local benefit = math.min(matched, prompt) / math.max(prompt, 1)
  return benefit - BETA * (load(ep) - mean) / math.max(1, mean)
end

function M.route(req, fleet)
  local pool = fleet:endpoints(req.model)
  if #pool == 0 then
    return verdict.model_not_found(req.model)
  end
  local now = atc.now()
  local sum, n, held = 0, 0, false
  for i = 1, #pool do
    local ep = pool[i]
    if ep.health == "healthy" then
      sum, n = sum + load(ep), n + 1
    end
    if not held and ep:prefix_overlap(req) > 0 then
      held = true
    end
  end
  local best
  if held then
    local mean = n > 0 and sum / n or 0
    local best_score
    for i = 1, #pool do
      local ep = pool[i]
      if ep.available then
        local s = M.score(ep, req, mean)
        if best == nil or s > best_score or (s == best_score and ep.id < best.id) then
          best, best_score = ep, s
        end
      end
    end
  else
    best = lowest_qps(pool, now) -- nothing cached anywhere: upstream's fallback
  end
  if best == nil then
    return verdict.queue("no endpoint has room")
  end
  record(best, now)
  return best
end

return M
