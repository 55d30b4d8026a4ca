-- stdlib atc.work and how the shipped layers use it: prefix hits weighed against the work in flight,
-- and requests without an affinity placed where the least prefill work is queued. Also the atc.test
-- matchers themselves.
local t = require "atc.test"
local work = require "atc.work"
local affinity = require "affinity"
local priority = require "priority"
local policy = require "policy"

t.test("sent counts the prompt tokens the endpoint does not have cached", function()
  local f = t.fleet { { id = "a", overlap = 4 }, { id = "b" } }
  local req = t.request { prompt_tokens = 1000 }
  work.sent(f:endpoint("a"), req)
  work.sent(f:endpoint("b"), req)
  t.expect(work.backlog(f:endpoint("a"))).to_be_between(1000 - 4 * 64 - 50, 1000 - 4 * 64)
  t.expect(work.backlog(f:endpoint("b"))).to_be_between(950, 1000)
end)

t.test("sent ignores verdicts and nil", function()
  work.sent(atc.queue("full"), t.request {})
  work.sent(nil, t.request {})
end)

t.test("cheapest returns every endpoint that ties, only available ones", function()
  local f = t.fleet { { id = "a" }, { id = "b" }, { id = "c", inflight = 8 }, { id = "d", inflight_tokens = 500 } }
  t.expect(t.ids(work.cheapest(f:endpoints("m"), 1, 1))).to_equal { "a", "b" }
  t.expect(#work.cheapest({}, 1, 1)).to_be(0)
end)

t.test("a long prompt goes where the least prefill is queued", function()
  local f = t.fleet { { id = "a" }, { id = "b" }, { id = "c" } }
  work.sent(f:endpoint("a"), t.request { prompt_tokens = 30000 })
  work.sent(f:endpoint("c"), t.request { prompt_tokens = 8000 })
  t.expect(priority.pick(t.request { prompt_tokens = 4000 }, f:endpoints("m"))).to_be_endpoint("b")
  t.expect(priority.pick(t.request { prompt_tokens = 4000, priority = 9 }, f:endpoints("m"))).to_be_endpoint("b")
end)

t.test("tokens in flight count as work too", function()
  local f = t.fleet { { id = "a", inflight = 1, inflight_tokens = 20000 }, { id = "b", inflight = 3, inflight_tokens = 900 } }
  t.expect(priority.pick(t.request { prompt_tokens = 4000 }, f:endpoints("m"))).to_be_endpoint("b")
end)

t.test("a cache hit gives way to a much busier endpoint", function()
  -- a has half the prompt cached but 40k tokens in flight; b has nothing cached and is idle
  local f = t.fleet { { id = "a", overlap = 8, inflight_tokens = 40000 }, { id = "b", overlap = 1 } }
  t.expect(affinity.pick(t.request { prompt_tokens = 1024 }, f:endpoints("m"))).to_be_endpoint("b")
  f:set("a", { inflight_tokens = 400 })
  t.expect(affinity.pick(t.request { prompt_tokens = 1024 }, f:endpoints("m"))).to_be_endpoint("a")
end)

t.test("the policy records what it routes", function()
  local f = t.fleet { { id = "x", model = "llama-3-8b", capacity = 64 }, { id = "y", model = "llama-3-8b", capacity = 64 } }
  local first = f:route(policy, t.request { model = "llama-3-8b", prompt_tokens = 20000 })
  t.expect(first).to_be_endpoint()
  t.expect(work.backlog(first)).to_be_at_least(19000)
  local second = f:route(policy, t.request { model = "llama-3-8b", prompt_tokens = 20000 })
  t.expect(second.id, "the second long prompt").never.to_be(first.id)
end)

t.test("matchers say what was expected and what came", function()
  t.expect(function() t.expect(1).to_be(2) end).to_raise("expected 2, got 1")
  t.expect(function() t.expect(3, "count").never.to_be(3) end).to_raise("count: expected not 3, got 3")
  t.expect(function() t.expect({ 1, 2 }).to_equal({ 1, 3 }) end).to_raise("expected {1, 3}, got {1, 2}")
  t.expect(function() t.expect(nil).to_be_endpoint("a") end).to_raise("expected endpoint a, got nil")
  t.expect("a queue of one").to_contain("queue")
  t.expect({ "a", "b" }).to_contain("b")
  t.expect(1.05).to_be_near(1, 0.1)
  t.expect(atc.queue("x")).to_be_queue()
  t.expect(atc.reject(429, "slow down")).to_be_reject(429)
  t.expect(nil).to_be_nil()
  t.expect(0).to_be_truthy()
  t.expect(false).to_be_falsy()
end)
