-- A fleet that changes over the trace (issue 32): two servers throughout, and a third that joins at 30 s
-- (from:) and leaves at 70 s (until:) of the 40 multi-turn chats of fixtures/sessions.jsonl (116 s). The
-- shipped policy must see it join and leave: no request before it is in the fleet nor after it left,
-- traffic while it is there, every request served, and the report counting what it got.
local t = require "atc.test"

local TRACE = "tests/policy/fixtures/sessions.jsonl"
local NEW = "llama-3-8b-sim-3"
local FROM, UNTIL = 30000, 70000
local FLEET = {
  { model = "llama-3-8b", count = 2, max_seqs = 8, capacity = 8, prefill_tps = 15000 },
  { model = "llama-3-8b", count = 1, max_seqs = 8, capacity = 8, prefill_tps = 15000, from_ms = FROM, until_ms = UNTIL },
}

local function replay(extra)
  local opts = { trace = TRACE, fleet = FLEET, snapshots = true }
  for k, v in pairs(extra or {}) do
    opts[k] = v
  end
  return t.replay(opts)
end

t.test("requests land on the new server only within its window, and the report counts them", function()
  local decisions, report = replay()
  local on_new, inside = 0, 0
  for _, d in ipairs(decisions) do
    if d.at_ms >= FROM and d.at_ms < UNTIL then
      inside = inside + 1
    end
    if d.endpoint == NEW then
      on_new = on_new + 1
      t.expect(d.at_ms, d.id .. " went to " .. NEW).to_be_between(FROM, UNTIL - 0.001)
    end
  end
  t.expect(inside, "decisions within the window").to_be_at_least(60)
  t.expect(on_new, "requests on the new server").to_be_at_least(10)
  t.expect(report.completed, "completed (those in flight as it left finish there)").to_be(274)
  local ep = report.endpoints[NEW]
  t.expect(ep.requests, "the report's count for " .. NEW).to_be(on_new)
  t.expect(ep.from_ms).to_be(FROM)
  t.expect(ep.until_ms).to_be(UNTIL)
  t.expect(ep.inflight_at_leave).to_be_between(0, 8)
  t.expect(report.endpoints["llama-3-8b-sim-1"].from_ms, "a server without a window").to_be(nil)
end)

t.test("the policy sees it in the fleet only within its window", function()
  local decisions = replay()
  for _, d in ipairs(decisions) do
    local there = d.fleet[NEW] ~= nil
    t.expect(there, d.id .. " at " .. d.at_ms .. " ms").to_be(d.at_ms >= FROM and d.at_ms < UNTIL)
    t.expect(d.fleet["llama-3-8b-sim-1"] ~= nil).to_be(true)
  end
end)

t.test("its sessions move on to the servers left when it leaves", function()
  local decisions = replay()
  local where, moved = {}, 0
  for _, d in ipairs(decisions) do
    if d.kind == "endpoint" then
      if where[d.session] == NEW and d.at_ms >= UNTIL then
        moved = moved + 1
        t.expect(d.endpoint, d.id).never.to_be(NEW)
      end
      where[d.session] = d.endpoint
    end
  end
  t.expect(moved, "sessions that were on it and came back after it left").to_be_at_least(1)
end)

t.test("the same seed gives the same decisions through the changes", function()
  local a = replay { seed = 7, snapshots = false }
  local b = replay { seed = 7, snapshots = false }
  t.expect(#a).to_be(#b)
  for i = 1, #a do
    t.expect(b[i].endpoint, "decision " .. i).to_be(a[i].endpoint)
  end
end)
