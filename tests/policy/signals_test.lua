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
