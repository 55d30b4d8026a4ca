-- atc.fastest reads a pool once a decision and its later calls in that decision reuse what it read
-- (policy_pick.c, struct fast_snap). What a policy sees must not change: a pool changed between two
-- calls is read again, and the next decision reads the fleet as it is then.
local t = require "atc.test"

local ENDPOINTS = {
  { id = "a", model = "llama", capacity = 8, prefill_tokens = 20000 },
  { id = "b", model = "llama", capacity = 8, prefill_tokens = 0 },
  { id = "c", model = "llama", capacity = 8, prefill_tokens = 5000 },
}
local BODY = { model = "llama", messages = { { role = "user", content = "hello" } } }

t.test("a pool changed between two calls of a decision is read again", function()
  t.route({ endpoints = ENDPOINTS, body = BODY }, function(req, fleet)
    local pool = fleet:endpoints "llama"
    local a, b, c = pool[1], pool[2], pool[3]
    t.expect(atc.fastest(pool, req)).to_be(b)
    t.expect(atc.fastest(pool, req, { skip = b })).to_be(c) -- the same pool, another skip
    pool[2] = a -- the same table and length, another endpoint in it
    t.expect(atc.fastest(pool, req)).to_be(c)
    t.expect(atc.fastest({ a, c }, req)).to_be(c) -- a shorter pool
    t.expect(atc.fastest({ b, a, c }, req)).to_be(b)
    return atc.queue()
  end)
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
