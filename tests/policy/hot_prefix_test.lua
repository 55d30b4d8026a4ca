-- A hot prefix from a cold start (fixtures/hot_prefix.jsonl: bursts of 16 requests sharing one 12k-token
-- document, each burst 2 s of prefill for the one server holding it), replayed against four simulated
-- servers of examples/replay/mooncake.yaml's class with t.replay. The shipped policy must let the idle
-- servers compute the document too rather than queue every request behind its first holder.
local t = require "atc.test"

local TRACE = "tests/policy/fixtures/hot_prefix.jsonl"
local FLEET = { { model = "llama-3-8b", count = 4, max_seqs = 64, prefill_tps = 15000, decode_ms = 12, kv_blocks = 25000 } }

t.test("a hot prefix from a cold start spreads over the idle servers", function()
  local decisions, report = t.replay { trace = TRACE, fleet = FLEET }
  t.expect(report.completed).to_be(128)
  local per = {}
  for _, d in ipairs(decisions) do
    if d.kind == "endpoint" then
      per[d.endpoint] = (per[d.endpoint] or 0) + 1
    end
  end
  for i = 1, 4 do
    local id = "llama-3-8b-sim-" .. i
    t.expect(per[id] or 0, id .. "'s requests").to_be_at_least(16)
  end
  -- all on one server: 2.1 s (each burst queued behind the first holder); spread: 1.1 s
  t.expect(report.ttft_p90_ms, "TTFT p90").to_be_at_most(1500)
end)
