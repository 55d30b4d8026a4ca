-- atc.fastest reads a pool once a decision and its later calls in that decision reuse what it read
-- (policy_fastest.c, struct fast_snap). What a policy sees must not change: a pool changed between two
-- calls is read again, and the next decision reads the fleet as it is then. It finds the cheapest run by
-- run of alike endpoints (struct fast_cols): it must pick what a plain loop over the pool picks.
local t = require "atc.test"

local ENDPOINTS = {
  { id = "a", model = "llama", capacity = 8, prefill_tokens = 20000 },
  { id = "b", model = "llama", capacity = 8, prefill_tokens = 0 },
  { id = "c", model = "llama", capacity = 8, prefill_tokens = 5000 },
}
local BODY = { model = "llama", messages = { { role = "user", content = "hello" } } }

t.test("a pool changed between two calls of a decision is read again", function()
  t.route({ endpoints = ENDPOINTS, body = BODY }, function(req, fleet)
    local list = fleet:endpoints "llama"
    local a, b, c = list[1], list[2], list[3]
    local pool = { a, b, c } -- the policy's own table (an engine list is read-only)
    t.expect(atc.fastest(pool, req)).to_be(b)
    t.expect(atc.fastest(pool, req, { skip = b })).to_be(c) -- the same pool, another skip
    pool[2] = a -- the same table and length, another endpoint in it
    t.expect(atc.fastest(pool, req)).to_be(c)
    t.expect(atc.fastest(list, req)).to_be(b) -- the engine's list of the same views
    t.expect(atc.fastest({ a, c }, req)).to_be(c) -- a shorter pool
    t.expect(atc.fastest({ b, a, c }, req)).to_be(b)
    return atc.queue()
  end)
end)

-- A plain loop over the pool with atc.fastest's cost (the contract's formula) and tie-breaks (less
-- recent work, then the lower load, then the first), read through the views.
local function reference(pool, req, o)
  local n, tps, itl, queued, uncached_mean = #pool, 0, 0, 0, 0
  for i = 1, n do
    local ep = pool[i]
    tps, itl = tps + ep.prefill_rate, itl + ep.itl
    queued, uncached_mean = queued + ep.prefill_tokens, uncached_mean + (ep.uncached_mean or 0)
  end
  local w = o.uncached or 1
  if (o.congestion or 0) > 0 and uncached_mean > 0 then
    w = math.max(w, math.min(1 + o.congestion * queued / uncached_mean, 16))
  end
  local recent = {} -- read at one instant (it decays: read one by one, a later read is less)
  for i = 1, n do
    recent[i] = pool[i].recent_tokens
  end
  local best, best_cost, best_recent, best_load
  for i = 1, n do
    local ep = pool[i]
    if ep.available and ep ~= o.skip then
      local rate, step = ep.prefill_rate, ep.itl
      if o.pooled then
        rate, step = tps / n, itl / n
      end
      local u = ep:predict_ttft(req) -- (own rates) gives the uncached tokens back:
      u = (u - ep.itl) * ep.prefill_rate / 1000 - ep.prefill_tokens
      u = math.floor(u + 0.5)
      local cost = (ep.prefill_tokens + u) * 1000 / rate + step + (w - 1) * u * 1000 / rate
        + (o.recent or 0) * recent[i] * 1000 / rate + (o.decode or 0) * ep.decoding * step
      if (o.step_tokens or 0) > 0 and ep.prefill_tokens > 0 then -- (it shares the last step of the one ahead)
        cost = cost + math.min(u, o.step_tokens) * 1000 / rate
      end
      local r, l = recent[i], ep.load
      if best == nil or cost < best_cost or (cost == best_cost and (r < best_recent or (r == best_recent and l < best_load))) then
        best, best_cost, best_recent, best_load = ep, cost, r, l
      end
    end
  end
  return best, best_cost
end

t.test("runs of alike endpoints: the pick of a plain loop, on random fleets", function()
  local seed = 7
  local function rand(k) -- a small deterministic generator: 0..k-1
    seed = (seed * 1103515245 + 12345) % 2147483648
    return seed % k
  end
  for round = 1, 30 do
    local eps, q, d, rate = {}, 0, 0, 15000
    -- Runs of alike endpoints (few distinct values: ties across runs too). Recent work (even rounds) decays
    -- from when it was set, so the reference, which reads it later, sees every value a little less:
    -- values at least 7 tokens apart keep their order, and equal ones set in another millisecond would not.
    for i = 1, 40 do
      if i == 1 or rand(8) == 0 then
        q, d, rate = rand(3) * 1000, rand(2), rand(4) == 0 and 10000 or 15000
      end
      eps[i] = { id = "e" .. i, model = "llama", capacity = 8, inflight = rand(3) * 2, prefill_tokens = q,
                 decoding = d, recent_tokens = round % 2 == 0 and 100 + 7 * ((i * 13 + round) % 40) or 0, prefill_rate = rate }
    end
    local routed = {}
    for k = 1, 3 do -- some endpoints hold the prompt's prefix
      routed[k] = { endpoint = "e" .. (rand(40) + 1), body = BODY }
    end
    t.route({ endpoints = eps, body = BODY, routed = routed }, function(req, fleet)
      local pool = fleet:endpoints "llama"
      for _, o in ipairs {
        { pooled = true, uncached = 0 }, { pooled = true, uncached = 1.5, decode = 0.1, congestion = 1 },
        { pooled = true, uncached = 1, decode = 0.1 }, {}, { uncached = 2 }, { pooled = true, skip = pool[3] },
        { pooled = true, uncached = 1.5, decode = 1, recent = 0.3, congestion = 1 }, { recent = 0.5 },
        { pooled = true, uncached = 1.5, congestion = 1, step_tokens = 8192 }, { step_tokens = 512 },
      } do
        -- (recent work decays: weighed, read at another instant, it may pick another; here only where
        -- there is none, and below where it decides alone)
        if o.recent == nil or round % 2 == 1 then
          local ep, cost = atc.fastest(pool, req, o)
          local want, want_cost = reference(pool, req, o)
          t.expect(ep, "round " .. round).to_be(want)
          t.expect(cost, "round " .. round .. ": the cost").to_be(want_cost)
        end
      end
      return atc.queue()
    end)
  end
end)

-- burst.jsonl: r1, r2, r3 of 8000 prompt tokens within 2 ms on two servers. The fixture checks that each
-- call's predicted TTFT is the endpoint's now: were a decision's snapshot used by the next (the replay
-- decides every request with the same request struct), r3 would see both queues empty still.
t.test("each decision reads the fleet as it is then", function()
  local decisions, report = t.replay {
    trace = "tests/policy/fixtures/burst.jsonl",
    fleet = { { model = "llama-3-8b", count = 2, max_seqs = 8, capacity = 8, prefill_tps = 15000 } },
    policy = "tests/policy/fixtures/fastest_twice.lua",
  }
  t.expect(report.policy_errors, "policy errors (a failed assert in the policy)").to_be(0)
  local at = {}
  for _, d in ipairs(decisions) do
    at[d.id] = d.endpoint
  end
  t.expect(at.r1).to_be "llama-3-8b-sim-1"
  t.expect(at.r2).to_be "llama-3-8b-sim-2"
  t.expect(at.r3).to_be "llama-3-8b-sim-1"
end)

t.test("recent work weighed: alike endpoints each cost their own", function()
  local eps = {}
  for i, r in ipairs { 600, 200, 400 } do -- alike but for the work sent lately (read when needed: it decays)
    eps[i] = { id = "r" .. i, model = "llama", capacity = 8, recent_tokens = r }
  end
  t.route({ endpoints = eps, body = BODY }, function(req, fleet)
    local pool = fleet:endpoints "llama"
    local ep, cost = atc.fastest(pool, req, { pooled = true, recent = 1 })
    t.expect(ep.id).to_be("r2")
    local want = ep:predict_ttft(req) + ep.recent_tokens * 1000 / ep.prefill_rate
    t.expect(cost).to_be_between(want * 0.999, want * 1.001)
    return atc.queue()
  end)
end)

-- step_tokens: an engine fills an iteration's token budget with the next waiting prompt, so a request sent
-- where prefill is queued delays the first token of the prompt ahead by its own uncached tokens (up to the
-- budget). "warm" holds the first half of the prompt and is prefilling 1,000 tokens; "cold" is idle and
-- holds none: warm is sooner for this request, cold dearer for nobody else.
t.test("step_tokens: joining a prefill queue costs the prompt ahead its share of the last step", function()
  local eps = {
    { id = "warm", model = "llama", capacity = 8, prefill_tokens = 1000 },
    { id = "cold", model = "llama", capacity = 8, prefill_tokens = 0 },
  }
  local function ask(n)
    return { model = "llama", messages = { { role = "user", content = string.rep("tell me more. ", n) } } }
  end
  t.route({ endpoints = eps, body = ask(2000), routed = { { endpoint = "warm", body = ask(1000) } } }, function(req, fleet)
    local pool = fleet:endpoints "llama"
    local warm = pool[1]
    t.expect(atc.fastest(pool, req, { pooled = true }).id).to_be("warm")
    t.expect(atc.fastest(pool, req, { pooled = true, step_tokens = 8192 }).id).to_be("cold")
    -- the delay is min(uncached, step_tokens) tokens at the pool's rate, and only where prefill is queued
    local _, base = atc.fastest({ warm }, req, { pooled = true })
    local _, one = atc.fastest({ warm }, req, { pooled = true, step_tokens = 1 })
    t.expect(one - base).to_be_between(1000 / warm.prefill_rate - 1e-9, 1000 / warm.prefill_rate + 1e-9)
    local _, idle = atc.fastest({ pool[2] }, req, { pooled = true })
    local _, idle_step = atc.fastest({ pool[2] }, req, { pooled = true, step_tokens = 8192 })
    t.expect(idle_step).to_be(idle)
    return atc.queue()
  end)
end)
