-- Invariants of the shipped policy over a recorded-style trace (fixtures/sessions.jsonl: 40 multi-turn
-- chats with shared system prompts), replayed against three simulated servers with t.replay.
local t = require "atc.test"

local TRACE = "tests/policy/fixtures/sessions.jsonl"
local FLEET = { { model = "llama-3-8b", count = 3, max_seqs = 8, capacity = 8, prefill_tps = 15000 } }

local function replay(extra)
  local opts = { trace = TRACE, fleet = FLEET, snapshots = true }
  for k, v in pairs(extra or {}) do
    opts[k] = v
  end
  return t.replay(opts)
end

t.test("every request is served", function()
  local decisions, report = replay()
  t.expect(report.requests).to_be(274)
  t.expect(report.completed, "completed").to_be(274)
  t.expect(report.policy_errors, "policy errors").to_be(0)
  t.expect(#decisions).to_be_at_least(274)
end)

t.test("no endpoint is ever given more than its capacity", function()
  local decisions = replay()
  for _, d in ipairs(decisions) do
    if d.kind == "endpoint" then
      t.expect(d.inflight, d.id .. " on " .. d.endpoint).to_be_between(0, d.capacity - 1)
    end
  end
end)

t.test("a session leaves its endpoint only when that one is busy or down", function()
  -- (where its cache is, an idle endpoint always costs least: priority.pick and affinity agree)
  local decisions = replay()
  local where, moves = {}, 0
  for _, d in ipairs(decisions) do
    if d.kind == "endpoint" then
      local before = where[d.session]
      if before ~= nil and before ~= d.endpoint then
        local ep = d.fleet[before]
        t.expect(ep.inflight > 0 or not ep.routable, d.id .. " left " .. before .. " for " .. d.endpoint)
          .to_be(true)
        moves = moves + 1
      end
      where[d.session] = d.endpoint
    end
  end
  t.expect(moves, "sessions that moved").to_be_at_most(20)
end)

t.test("nothing goes to an endpoint while it is out, and its sessions come back to no harm", function()
  local out = "llama-3-8b-sim-2"
  local decisions, report = replay { outages = { { endpoint = out, from_ms = 20000, to_ms = 60000 } } }
  local during = 0
  for _, d in ipairs(decisions) do
    if d.at_ms >= 20000 and d.at_ms < 60000 then
      during = during + 1
      t.expect(d.endpoint, d.id).never.to_be(out)
    end
  end
  t.expect(during, "decisions during the outage").to_be_at_least(50)
  t.expect(report.completed).to_be(274)
end)

t.test("shared prefixes hit the servers' caches", function()
  local _, report = replay()
  t.expect(report.cache_hit_rate).to_be_at_least(0.6)
end)

t.test("the same seed gives the same decisions", function()
  local a = replay { seed = 5, snapshots = false }
  local b = replay { seed = 5, snapshots = false }
  t.expect(#a).to_be(#b)
  for i = 1, #a do
    t.expect(b[i].endpoint, "decision " .. i).to_be(a[i].endpoint)
    t.expect(b[i].ttft_ms, "ttft of decision " .. i).to_be(a[i].ttft_ms)
  end
end)

t.test("a reference policy replays through the same helper", function()
  local _, report = replay { policy = "examples/policies/round_robin.lua", snapshots = false }
  t.expect(report.completed).to_be(274)
end)

t.test("every example policy replays without a policy error", function()
  for _, name in ipairs { "round_robin", "least_loaded", "sglang_cache_aware", "llmd_weighted", "dynamo_kv" } do
    local _, report = replay { policy = "examples/policies/" .. name .. ".lua", snapshots = false }
    t.expect(report.policy_errors, name .. ": policy errors").to_be(0)
    t.expect(report.completed, name .. ": completed").to_be(274)
  end
end)
