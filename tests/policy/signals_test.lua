-- The engine's routing signals, read by a policy in the real runtime (t.replay runs the production
-- policy runtime against simulated servers): what C counts must reach ep.* unchanged.
local t = require "atc.test"

local FLEET = { { model = "llama-3-8b", count = 2, max_seqs = 8, capacity = 8, prefill_tps = 15000 } }

local function where(policy)
  local decisions, report = t.replay { trace = "tests/policy/fixtures/burst.jsonl", fleet = FLEET, policy = policy }
  local at = {}
  for _, d in ipairs(decisions) do
    at[d.id] = d.endpoint
  end
  return at, report
end

t.test("prefill_tokens rises when a request is sent and falls at its first token", function()
  local at, report = where "tests/policy/fixtures/least_prefill.lua"
  t.expect(report.policy_errors, "policy errors (a failed assert in the policy)").to_be(0)
  -- r1 to sim-1; r2 to sim-2 (sim-1 has 8000 queued); r3 ties at 8000 each: the first
  t.expect(at.r1).to_be "llama-3-8b-sim-1"
  t.expect(at.r2).to_be "llama-3-8b-sim-2"
  t.expect(at.r3).to_be "llama-3-8b-sim-1"
  -- at 3 s every first token is back (prefill 8000 / 15000 tokens/s each): both queues read 0 while
  -- three answers are still decoding, so the tie goes to the first again (16000 vs 8000 if they did not fall)
  t.expect(at.r4).to_be "llama-3-8b-sim-1"
end)

-- atc.fastest's congestion option on real endpoint views: with prefill queued in the pool, a cache hit
-- is worth more than its own first token (uncached weight 1 + congestion x queued requests).
local SHARED = string.rep("abcdefgh", 2048) -- 16 KiB (about 4k tokens) the two prompts share
local function chat(text) return { model = "llama", messages = { { role = "user", content = text } } } end

t.test("congestion: a cache hit behind a queue wins once the pool is congested", function()
  local spec = {
    endpoints = {
      { id = "a", model = "llama", capacity = 8, prefill_tokens = 20000, uncached_mean = 2000 },
      { id = "b", model = "llama", capacity = 8, prefill_tokens = 0, uncached_mean = 2000 },
    },
    body = chat(SHARED .. "second question"),
    routed = { { endpoint = "a", body = chat(SHARED .. "first question") } },
  }
  t.route(spec, function(req, fleet)
    local pool = fleet:endpoints "llama"
    t.expect(pool[1]:prefix_overlap(req) > 0, "the shared prefix was routed to a").to_be(true)
    t.expect(pool[1].uncached_mean).to_be(2000)
    -- uncached 1.5: a costs its 20000 queued tokens, b the whole prompt x 1.5 (about 6k tokens)
    local plain, plain_cost = atc.fastest(pool, req, { pooled = true, uncached = 1.5 })
    t.expect(plain.id).to_be "b"
    -- congestion 1: mean queued 10000 / mean request 2000 = 5 requests -> uncached weight 6: b's ~4k
    -- uncached tokens cost ~25k, more than a's queue and its few uncached tokens
    local ep, cost = atc.fastest(pool, req, { pooled = true, uncached = 1.5, congestion = 1 })
    t.expect(ep.id).to_be "a"
    t.expect(cost > plain_cost, "the weight rose with the queue").to_be(true)
    return atc.queue()
  end)
end)

-- ep.cached_token_share: the engine's own count of cached prompt tokens (usage), nil until reported; a
-- policy may prefer the server whose cache really hits over atc's guess.
t.test("cached_token_share: what the servers reported, nil where none did", function()
  local spec = {
    endpoints = {
      { id = "a", model = "llama", capacity = 8, cached_token_share = 0.25 },
      { id = "b", model = "llama", capacity = 8, cached_token_share = 0.75 },
      { id = "c", model = "llama", capacity = 8 },
    },
    body = chat("hello"),
  }
  t.route(spec, function(req, fleet)
    local pool = fleet:endpoints "llama"
    t.expect(pool[1].cached_token_share).to_be(0.25)
    t.expect(pool[2].cached_token_share).to_be(0.75)
    t.expect(pool[3].cached_token_share).to_be(nil)
    local best
    for _, ep in ipairs(pool) do
      if ep.cached_token_share and (best == nil or ep.cached_token_share > best.cached_token_share) then
        best = ep
      end
    end
    t.expect(best.id).to_be "b"
    return best
  end)
end)
