-- Precise prefix routing in replay: simulated servers that publish their KV-cache events (simulate:
-- kv_events:) feed the exact index as their caches store and evict blocks, and ep:cached_tokens reads it;
-- under cache pressure the exact figure is right where atc's own guess is off.
local t = require "atc.test"

local TRACE = "tests/policy/fixtures/sessions.jsonl"
local function fleet(publish, kv_blocks)
  return { { model = "llama-3-8b", count = 3, max_seqs = 8, capacity = 8, prefill_tps = 15000,
             kv_blocks = kv_blocks or 300, kv_events = publish and "replay" or nil } }
end

local PROBE = "tests/policy/fixtures/kv_probe.lua"

t.test("cached_tokens is nil where no server publishes KV events", function()
  local _, report = t.replay { trace = TRACE, fleet = fleet(false), policy = PROBE }
  t.expect(report.rejected, "every request without an exact figure").to_be(274)
end)

t.test("publishing servers feed the exact index: cached_tokens is there, within the prompt", function()
  local _, report = t.replay { trace = TRACE, fleet = fleet(true), policy = PROBE }
  t.expect(report.rejected).to_be(0)
  t.expect(report.policy_errors).to_be(0)
  t.expect(report.completed).to_be(274)
end)

-- (Which finds more cache hits is the routing's trade with load, not the index's: on this small fixture
-- the guess, which ages blocks as the servers' LRU does, found 54.0% against 52.7%.)
t.test("under cache pressure the exact figure is right where the guess is off", function()
  local _, precise = t.replay { trace = TRACE, fleet = fleet(true), policy = "tests/bench/kv_precise/precise.lua" }
  local _, guessed = t.replay { trace = TRACE, fleet = fleet(true), policy = "tests/bench/kv_precise/guessed.lua" }
  t.expect(precise.exact_samples).to_be(274)
  t.expect(precise.exact_error_tokens).to_be(0)
  t.expect(guessed.guess_error_tokens > 1000, ("the guess is off by %d tokens a request"):format(
    guessed.guess_error_tokens)).to_be(true)
end)

-- Engine restarts and traffic around atc (issue 29): what the exact index sees and the guess does not.
local function run(policy, opts)
  local o = { trace = TRACE, fleet = fleet(true, 1000), policy = "tests/bench/kv_precise/" .. policy .. ".lua" }
  for k, v in pairs(opts or {}) do o[k] = v end
  return t.replay(o)
end
local RESTART = { { endpoint = "llama-3-8b-sim-1", at_ms = 60000 } }
local function sent_to(decisions, id, from_ms, to_ms)
  local n = 0
  for _, d in ipairs(decisions) do
    if d.endpoint == id and d.at_ms >= from_ms and d.at_ms < to_ms then n = n + 1 end
  end
  return n
end

t.test("a restart empties the server's cache: the guess keeps sending there, the exact index routes away", function()
  local _, g0 = run("guessed")
  local gd, g1 = run("guessed", { restarts = RESTART })
  local pd, p1 = run("precise", { restarts = RESTART })
  local id = "llama-3-8b-sim-1"
  t.expect(g1.endpoints[id].prefix_block_hits < g0.endpoints[id].prefix_block_hits,
    ("guessed hits on %s: %d with the restart, %d without"):format(id, g1.endpoints[id].prefix_block_hits,
      g0.endpoints[id].prefix_block_hits)).to_be(true)
  t.expect(sent_to(pd, id, 60000, 70000) < sent_to(gd, id, 60000, 70000), "precise sends less there after").to_be(true)
  t.expect(g1.guess_error_tokens > g0.guess_error_tokens, "the guess is further off after a restart").to_be(true)
  t.expect(p1.exact_samples > 0 and p1.exact_error_tokens == 0, "the exact index follows the restart").to_be(true)
end)

t.test("traffic around atc fills caches only the exact index sees: precise finds more", function()
  local _, p0 = run("precise")
  local _, g0 = run("guessed")
  t.expect(p0.cache_hit_rate).to_be(g0.cache_hit_rate) -- all through atc, no pressure: the guess is right
  local _, p = run("precise", { around = 0.3 })
  local _, g = run("guessed", { around = 0.3 })
  t.expect(p.around > 60 and p.around == g.around, "the same requests go around").to_be(true)
  t.expect(p.cache_hit_rate > g.cache_hit_rate,
    ("precise %.3f, guessed %.3f"):format(p.cache_hit_rate, g.cache_hit_rate)).to_be(true)
  t.expect(g.guess_error_tokens > g0.guess_error_tokens, "the guess is further off").to_be(true)
end)
