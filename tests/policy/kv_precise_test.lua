-- Precise prefix routing in replay: simulated servers that publish their KV-cache events (simulate:
-- kv_events:) feed the exact index as their caches store and evict blocks, and ep:cached_tokens reads it;
-- under cache pressure the exact figure finds more cached blocks than atc's own guess.
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

t.test("under cache pressure the exact figure finds more cached blocks than the guess", function()
  local _, precise = t.replay { trace = TRACE, fleet = fleet(true), policy = "tests/bench/kv_precise/precise.lua" }
  local _, guessed = t.replay { trace = TRACE, fleet = fleet(true), policy = "tests/bench/kv_precise/guessed.lua" }
  t.expect(precise.cache_hit_rate > guessed.cache_hit_rate,
    ("precise %.3f, guessed %.3f"):format(precise.cache_hit_rate, guessed.cache_hit_rate)).to_be(true)
end)
