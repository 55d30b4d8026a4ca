-- The policy contract (stdlib/atc/contract.lua), checked against the engine itself: each test runs a
-- decision with t.route, which parses a real request body with the engine's request_features.c, builds
-- a real endpoint table and calls the policy through atc_policy_route, so every value asserted here is
-- one the C views produced. Every entry of the contract must have an expected value below (a field
-- added to the contract without a test here fails "every field is checked"), and the atc.testing
-- mocks are checked against the same contract at the end.

local t = require "atc.test"
local contract = require "atc.contract"

local NIL = {} -- an expected nil

-- The chat body whose prompt (the raw JSON of "messages") is exactly the text t.json gives it, so the
-- blocks and the token estimate can be computed here without asking the engine.
local function chat(content, extra)
  local body = { model = "llama", messages = { { role = "user", content = content } } }
  for k, v in pairs(extra or {}) do
    body[k] = v
  end
  return body
end

local function prompt_of(body)
  return t.json(body.messages)
end

local SHARED = string.rep("abcdefgh", 128) -- 1,024 bytes every request below starts with
local EARLIER = chat(SHARED .. "Xfirst question, sent to endpoint a before")
local ASKED = chat(SHARED .. "Ysecond question" .. string.rep(" and more", 40),
  { stream = true, max_tokens = 300, n = 3, tools = { { type = "function", ["function"] = { name = "f" } } } })
local ASKED_PROMPT = prompt_of(ASKED)
-- Full 256-byte blocks the two prompts share: '[{"content":"' (13 bytes) + SHARED, then they differ.
local SHARED_BLOCKS = math.floor((13 + #SHARED) / 256)

local ENDPOINTS = {
  { id = "a", model = "llama", version = "v2", tags = { "gpu", "big" }, weight = 3, capacity = 4, inflight = 1,
    inflight_tokens = 500, ttft_ewma = 120, errors = 2, consecutive_failures = 1, last_error = "timeout",
    last_check = 1234, running = 3, server_queue = 2, kv_usage = 0.5, prefix_hit_rate = 0.25, scrape_age = 250,
    cached_token_share = 0.5,
    prefill_tokens = 3000, prefilling = 2, decoding = 1, recent_tokens = 4000, prefill_rate = 10000, itl = 20,
    uncached_mean = 2500, kv_tokens = 400000 },
  { id = "b", model = "llama", capacity = 8, inflight = 2, inflight_tokens = 100 },
  { id = "c", model = "llama", capacity = 8, inflight = 4, inflight_tokens = 50 },
  { id = "d", model = "other", health = "unhealthy" },
  { id = "e", model = "other", health = false, server_queue = 5, kv_usage = 0.3 }, -- no health checks (replay)
}

local FULL = {
  endpoints = ENDPOINTS,
  body = ASKED,
  headers = { ["x-atc-priority"] = "7", ["x-atc-tenant"] = "acme", ["x-atc-session"] = "s-1",
              ["x-request-id"] = "req-42", ["X-Custom"] = "yes" },
  tried = { "c" },
  routed = { { endpoint = "a", body = EARLIER } },
}

-- Checks view against expected, entry by entry of contract section key: each entry must have an
-- expected value (NIL for nil; for a method, { call = function(view) ... end, value = ... }), its value
-- must have the contract's type, and nil only where the contract says when.
local function check_section(key, view, expected, label)
  for _, e in ipairs(contract[key]) do
    local want = expected[e.name]
    t.expect(want, label .. ": contract entry '" .. e.name .. "' has an expected value in this test").never.to_be_nil()
    local got, map
    if e.kind == "method" then
      got, map = want.call(view), want.map
      want = want.value
    else
      got = view[e.name]
    end
    if got == nil then
      t.expect(e.nil_when, label .. "." .. e.name .. " is nil, which the contract allows").never.to_be_nil()
    else
      t.expect(contract.has_type(got, e.type), label .. "." .. e.name .. " (" .. t.show(got) .. ") is a " .. e.type).to_be(true)
    end
    if want == NIL then
      t.expect(got, label .. "." .. e.name).to_be_nil()
    elseif type(want) == "table" and want.near ~= nil then -- a value that moves with the clock
      t.expect(got, label .. "." .. e.name).to_be_between(want.near - want.within, want.near + want.within)
    else
      t.expect(map and map(got) or got, label .. "." .. e.name).to_equal(want)
    end
  end
end

t.test("req: every field as the engine parsed it, headers and body all set", function()
  t.route(FULL, function(req)
    local n = #ASKED_PROMPT
    check_section("req", req, {
      id = "req-42", model = "llama", kind = "chat", path = "/v1/chat/completions", priority = 7,
      tenant = "acme", session = "s-1", stream = true,
      prompt_tokens = math.floor((n + 3) / 4), max_tokens = 300, n = 3, attempt = 2,
      blocks = math.floor(n / 256), block_tokens = 64, tools = true,
      header = { call = function(r) return r:header("x-custom") end, value = "yes" },
    }, "req")
    return atc.queue("checked")
  end)
end)

t.test("req: what is not known is nil, and kind follows the path", function()
  local d = t.route({ endpoints = ENDPOINTS, path = "/v1/completions", body = { model = "m", prompt = "hi" } },
    function(req)
      check_section("req", req, {
        id = "t-route", model = "m", kind = "completion", path = "/v1/completions", priority = 0,
        tenant = NIL, session = NIL, stream = false, prompt_tokens = 1, max_tokens = NIL, n = 1, attempt = 1,
        blocks = 0, block_tokens = 64, tools = false,
        header = { call = function(r) return r:header("x-atc-tenant") end, value = NIL },
      }, "req")
      return atc.queue("checked")
    end)
  t.expect(d.kind).to_be("queue")
end)

t.test("req: embeddings, the session from the body's user, an empty tools array", function()
  t.route({ endpoints = ENDPOINTS, path = "/v1/embeddings", body = { model = "m", input = "x", user = "u-9", tools = {} } },
    function(req)
      t.expect(req.kind).to_be("embedding")
      t.expect(req.session).to_be("u-9")
      t.expect(req.tools).to_be(false)
      return atc.queue()
    end)
  t.route({ endpoints = ENDPOINTS, body = { model = "m", messages = {}, max_completion_tokens = 12 } }, function(req)
    t.expect(req.max_tokens).to_be(12)
    t.expect(req.attempt).to_be(1)
    return atc.queue()
  end)
end)

t.test("ep: every field and method of a scraped endpoint, and of one nothing is known about", function()
  t.route(FULL, function(req, fleet)
    check_section("ep", fleet:endpoint("a"), {
      id = "a", model = "llama", version = "v2", tags = { "gpu", "big" }, weight = 3, role = "both", capacity = 4, inflight = 1,
      inflight_tokens = 500, load = 0.25, available = true, health = "healthy", consecutive_failures = 1,
      last_error = "timeout", last_check = 1234, errors = 2, ttft_ewma = 120, running = 3, server_queue = 2,
      kv_usage = 0.5, prefix_hit_rate = 0.25, cached_token_share = 0.5, scrape_age = { near = 300, within = 50 },
      prefill_tokens = 3000,
      prefilling = 2, decoding = 1, recent_tokens = { near = 3950, within = 50 }, prefill_rate = 10000, itl = 20,
      uncached_mean = 2500, kv_tokens = 400000,
      remote_inflight = 0, remote_tokens = 0, remote_prefill_tokens = 0, remote_age = NIL, -- no cluster
      has_tag = { call = function(ep) return ep:has_tag("big") end, value = true },
      prefix_overlap = { call = function(ep) return ep:prefix_overlap(req) end, value = SHARED_BLOCKS },
      cached_tokens = { call = function(ep) return ep:cached_tokens(req) end, value = NIL }, -- no kv_events
      predict_ttft = { call = function(ep) return ep:predict_ttft(req) end,
                       value = (3000 + req.prompt_tokens - SHARED_BLOCKS * 64) * 1000 / 10000 + 20 },
    }, "a")
    check_section("ep", fleet:endpoint("b"), {
      id = "b", model = "llama", version = NIL, tags = {}, weight = 1, role = "both", capacity = 8, inflight = 2,
      inflight_tokens = 100, load = 0.25, available = true, health = "healthy", consecutive_failures = 0,
      last_error = NIL, last_check = NIL, errors = 0, ttft_ewma = NIL, running = NIL, server_queue = NIL,
      kv_usage = NIL, prefix_hit_rate = NIL, cached_token_share = NIL, scrape_age = NIL, prefill_tokens = 0,
      prefilling = 0, decoding = 0,
      recent_tokens = 0, prefill_rate = 15000, itl = 12, -- the signals.prefill_rate and signals.itl priors
      uncached_mean = NIL, kv_tokens = NIL,
      remote_inflight = 0, remote_tokens = 0, remote_prefill_tokens = 0, remote_age = NIL,
      has_tag = { call = function(ep) return ep:has_tag("gpu") end, value = false },
      prefix_overlap = { call = function(ep) return ep:prefix_overlap(req) end, value = 0 },
      cached_tokens = { call = function(ep) return ep:cached_tokens(req) end, value = NIL },
      predict_ttft = { call = function(ep) return ep:predict_ttft(req) end, value = req.prompt_tokens * 1000 / 15000 + 12 },
    }, "b")
    t.expect(fleet:endpoint("a").queue, "the old name of server_queue").to_be_nil()
    t.expect(fleet:endpoint("c").available, "already tried").to_be(false)
    t.expect(fleet:endpoint("d").available, "unhealthy").to_be(false)
    t.expect(fleet:endpoint("d").health).to_be("unhealthy")
    local e = fleet:endpoint("e") -- no health checks: the simulated server's numbers (replay)
    t.expect(e.server_queue).to_be(5)
    t.expect(e.kv_usage).to_be(0.3)
    t.expect(e.running).to_be_nil()
    t.expect(e.health).to_be("healthy")
    return atc.queue()
  end)
end)

t.test("ep: cached_tokens is the exact figure where an endpoint publishes KV events, and predict_ttft counts it", function()
  local eps = {
    { id = "a", capacity = 4, cached_tokens = 0 },   -- publishes, holds nothing of this prompt
    { id = "b", capacity = 4, cached_tokens = 128 }, -- publishes, holds 128 tokens of it
    { id = "c", capacity = 4 },                      -- publishes nothing: the guess
  }
  -- the guess says a and c hold the shared prefix (it was routed there); a's own events say it was evicted
  local routed = { { endpoint = "a", body = EARLIER }, { endpoint = "c", body = EARLIER } }
  t.route({ endpoints = eps, body = ASKED, routed = routed }, function(req, fleet)
    local a, b, c = fleet:endpoint("a"), fleet:endpoint("b"), fleet:endpoint("c")
    t.expect(a:prefix_overlap(req)).to_be(SHARED_BLOCKS)
    t.expect(a:cached_tokens(req)).to_be(0)
    t.expect(b:cached_tokens(req)).to_be(128)
    t.expect(c:cached_tokens(req)).to_be_nil()
    t.expect(a:predict_ttft(req)).to_be(req.prompt_tokens * 1000 / 15000 + 12)
    t.expect(b:predict_ttft(req)).to_be((req.prompt_tokens - 128) * 1000 / 15000 + 12)
    local prefix = require "atc.prefix"
    t.expect(select(2, prefix.cached(a, req))).to_be(true)
    t.expect(prefix.cached(c, req)).to_be(SHARED_BLOCKS * 64)
    t.expect(select(2, prefix.cached(c, req))).to_be(false)
    t.expect(prefix.pick({ a, b, c }, req).id, "c's guessed 1 KiB beats b's exact 128 tokens").to_be("c")
    t.expect(prefix.pick({ a, b }, req).id).to_be("b")
    t.expect(prefix.pick({ a, c }, req, { exact = false }).id, "by the guess alone, a ties c").to_be("a")
    t.expect(prefix.pick({ a, c }, req).id, "a's events say it holds nothing").to_be("c")
    return atc.queue()
  end)
end)

t.test("ep: prefix_overlap follows what was routed where", function()
  local spec = { endpoints = ENDPOINTS, body = ASKED, routed = { { endpoint = "b", body = EARLIER } } }
  t.route(spec, function(req, fleet)
    t.expect(fleet:endpoint("a"):prefix_overlap(req)).to_be(0)
    t.expect(fleet:endpoint("b"):prefix_overlap(req)).to_be(SHARED_BLOCKS)
    t.expect(SHARED_BLOCKS).to_be_at_least(2)
    return atc.queue()
  end)
end)

t.test("fleet: every method", function()
  t.route(FULL, function(req, fleet)
    check_section("fleet", fleet, {
      endpoints = { call = function(f) return f:endpoints("llama") end, map = t.ids, value = { "a", "b", "c" } },
      all = { call = function(f) return f:all() end, map = t.ids, value = { "a", "b", "c", "d", "e" } },
      models = { call = function(f) return f:models() end, value = { "llama", "other" } },
      endpoint = { call = function(f) return f:endpoint("nope") end, value = NIL },
    }, "fleet")
    t.expect(fleet:endpoints("unknown")).to_equal({})
    t.expect(fleet:endpoints("llama")[1]).to_be(fleet:endpoint("a")) -- one view per endpoint
    t.expect(fleet:endpoint("a").id).to_be("a")
    t.expect(function() fleet:endpoint("a").inflight = 0 end).to_raise("read-only")
    -- engine lists: the same table on every call, shared and read-only
    local list = fleet:endpoints("llama")
    t.expect(fleet:endpoints("llama")).to_be(list)
    t.expect(fleet:all()).to_be(fleet:all())
    t.expect(fleet:endpoints("unknown")).never.to_be(fleet:endpoints("unknown")) -- {}: a new one
    local a = list[1]
    list[1] = list[2]
    t.expect(function() atc.fastest(list, req) end).to_raise("read-only") -- atc test checks every element
    list[1] = a
    t.expect(atc.fastest(list, req)).to_be_endpoint()
    list[#list + 1] = a
    t.expect(function() fleet:endpoints("llama") end).to_raise("read-only") -- a length changed: anywhere
    t.expect(function() atc.least_loaded(list) end).to_raise("read-only")
    list[#list] = nil
    t.expect(fleet:endpoints("llama")).to_be(list)
    return atc.queue()
  end)
end)

t.test("fleet: a new set of endpoints is a new fleet, with new lists", function()
  local before
  t.route(FULL, function(req, fleet)
    before = fleet:endpoints("llama")
    return atc.queue()
  end)
  t.route(FULL, function(req, fleet) -- t.route builds a new table: what a config reload does
    t.expect(fleet:endpoints("llama")).never.to_be(before)
    t.expect(t.ids(fleet:endpoints("llama"))).to_equal({ "a", "b", "c" })
    t.expect(function() atc.fastest(before, req) end).to_raise("expected an endpoint") -- its views left
    return atc.queue()
  end)
end)

t.test("verdicts: fields, and what the engine decides from them", function()
  local d = t.route(FULL, function()
    local q, r = atc.queue("full"), atc.reject(429, "over quota")
    check_section("verdict", q, { kind = "queue", status = NIL, message = "full" }, "queue")
    check_section("verdict", r, { kind = "reject", status = 429, message = "over quota" }, "reject")
    return r
  end)
  t.expect(d.kind).to_be("reject")
  t.expect(d.status).to_be(429)
  t.expect(d.message).to_be("over quota")
  d = t.route(FULL, function() return atc.queue("later") end)
  t.expect(d.kind).to_be("queue")
  t.expect(d.message).to_be("later")
  d = t.route({ endpoints = ENDPOINTS, body = ASKED, tried = { "c" }, allow_error = true },
    function(req, fleet) return fleet:endpoint("c") end) -- already tried: not usable
  t.expect(d.kind).to_be("fallback")
  t.expect(d.reason).to_be("invalid_return")
  d = t.route(FULL, function(req, fleet) return "b" end) -- an id will do
  t.expect(d.endpoint).to_be("b")
  d = t.route({ endpoints = ENDPOINTS, body = ASKED, allow_error = true }, function() return "b\0junk" end)
  t.expect(d.kind, "an id with a NUL in it is no id").to_be("fallback")
  t.expect(d.reason).to_be("invalid_return")
  d = t.route({ endpoints = ENDPOINTS, body = ASKED, allow_error = true },
    function(req, fleet) return fleet:endpoint("b\0junk") end)
  t.expect(d.kind, "fleet:endpoint finds no endpoint by an id with a NUL").to_be("fallback")
  t.expect(d.reason).to_be("invalid_return")
  d = t.route({ endpoints = ENDPOINTS, body = ASKED, allow_error = true }, function() error("boom") end)
  t.expect(d.kind).to_be("fallback")
  t.expect(d.reason).to_be("error")
  t.expect(d.error).to_contain("boom")
end)

t.test("atc: every host function on the engine's views", function()
  local checked = {}
  local function check(name, fn)
    t.expect(contract.entry("atc", name), "atc." .. name .. " is in the contract").never.to_be_nil()
    checked[name] = true
    fn()
  end
  t.route(FULL, function(req, fleet)
    local pool = fleet:endpoints("llama") -- a (load 0.25), b (0.25, fewer tokens), c (tried)
    check("queue", function() t.expect(atc.queue()).to_be_queue() end)
    check("reject", function() t.expect(atc.reject(503)).to_be_reject(503) end)
    check("random", function()
      t.expect(atc.random()).to_be_between(0, 0.9999999)
      local k = atc.random(3)
      t.expect(contract.has_type(k, "integer") and k >= 1 and k <= 3).to_be(true)
    end)
    check("now", function() t.expect(atc.now()).to_be_at_least(0) end)
    check("hash", function()
      t.expect(atc.hash("k")).to_be(atc.hash("k"))
      t.expect(contract.has_type(atc.hash("k"), "integer")).to_be(true)
      t.expect(atc.hash("k")).to_be_at_most(2 ^ 52)
    end)
    check("log", function() t.expect(atc.log("contract test")).to_be_nil() end)
    check("explain", function()
      t.expect(atc.explain(pool[1], 0.5, "a note")).to_be_nil()
      t.expect(function() atc.explain("no-such-endpoint", 1) end).to_raise("expected an endpoint")
      t.expect(function() atc.explain(pool[1], "x") end).to_raise("number expected")
    end)
    check("least_loaded", function() t.expect(atc.least_loaded(pool)).to_be(fleet:endpoint("b")) end)
    check("p2c", function()
      for _ = 1, 20 do -- two available: p2c draws both and takes the lighter
        t.expect(atc.p2c(pool)).to_be(fleet:endpoint("b"))
      end
      t.expect(atc.p2c({ fleet:endpoint("c") })).to_be_nil()
    end)
    check("rendezvous", function()
      local ep = atc.rendezvous(pool, "key-1")
      t.expect(ep).to_be_endpoint()
      t.expect(ep).never.to_be(fleet:endpoint("c"))
      t.expect(atc.rendezvous(pool, "key-1")).to_be(ep)
      t.expect(atc.rendezvous(pool, "key-1", 1.25)).to_be_endpoint()
      t.expect(atc.rendezvous(pool, "key-1", { c = 1.25 })).to_be(atc.rendezvous(pool, "key-1", 1.25))
      t.expect(function() atc.rendezvous(pool, "k", 0.5) end).to_raise("c must be >= 1")
      t.expect(function() atc.rendezvous(pool, "k", { c = 0.5 }) end).to_raise("c must be >= 1")
      t.expect(function() atc.rendezvous(pool, "k", { max_ttft = 10 }) end).to_raise("needs 'req'")
      t.expect(function() atc.rendezvous(pool, "k", { req = req, maxttft = 10 }) end).to_raise("unknown option 'maxttft'")
      -- max_ttft: as if the pool held only the endpoints whose predicted first token is that soon
      local a, b = fleet:endpoint("a"), fleet:endpoint("b")
      t.expect(a:predict_ttft(req) > b:predict_ttft(req), "a: 3000 tokens queued").to_be(true)
      for k = 1, 20 do
        local key = "key-" .. k
        t.expect(atc.rendezvous(pool, key, { req = req, max_ttft = b:predict_ttft(req) })).to_be(b)
        t.expect(atc.rendezvous(pool, key, { req = req, max_ttft = a:predict_ttft(req) })).to_be(atc.rendezvous(pool, key))
      end
      t.expect(atc.rendezvous(pool, "k", { req = req, max_ttft = 0 })).to_be_nil()
    end)
    check("prefix_pick", function()
      t.expect(atc.prefix_pick(pool, req, { min_blocks = 2 })).to_be(fleet:endpoint("a"))
      t.expect(atc.prefix_pick(pool, req)).to_be(fleet:endpoint("a"))
      t.expect(atc.prefix_pick(pool, req, { min_blocks = SHARED_BLOCKS + 1 })).to_be_nil()
      t.expect(atc.prefix_pick(pool, req, { skip = fleet:endpoint("a") })).to_be_nil()
      t.expect(atc.prefix_pick(pool, req, { load_weight = 100 })).to_be(fleet:endpoint("b"))
      t.expect(atc.prefix_pick(pool, req, { balance_abs = 0, balance_rel = 1 })).to_be_nil() -- 1 vs 2 in flight
      t.expect(function() atc.prefix_pick(pool, req, { min_block = 2 }) end).to_raise("unknown option 'min_block'")
    end)
    check("fastest", function() -- a: 3000 tokens queued at 10000/s; b: idle at the 15000/s prior
      local a, b = fleet:endpoint("a"), fleet:endpoint("b")
      local ep, cost, ttft = atc.fastest(pool, req)
      t.expect(ep).to_be(b)
      t.expect(ttft).to_be(b:predict_ttft(req))
      t.expect(cost).to_be(ttft)
      t.expect(atc.fastest(pool, req, { skip = b })).to_be(a)
      t.expect(atc.fastest({ fleet:endpoint("c") }, req)).to_be_nil() -- tried already
      -- a's cache credit: its uncached tokens are fewer, so weighing them more pulls towards b less
      local _, c1 = atc.fastest({ a }, req, { uncached = 1 })
      local _, c2 = atc.fastest({ a }, req, { uncached = 2 })
      local credit = (req.prompt_tokens - SHARED_BLOCKS * 64) * 1000 / 10000
      t.expect(c2 - c1).to_be_between(credit - 1e-9, credit + 1e-9)
      local _, c3 = atc.fastest({ a }, req, { decode = 1 }) -- + 1 decoding x 20 ms
      t.expect(c3 - c1).to_be_between(20 - 1e-9, 20 + 1e-9)
      local _, c4 = atc.fastest({ a, b }, req, { pooled = true, skip = b }) -- at the pool's mean rates
      local pooled = (3000 + req.prompt_tokens - SHARED_BLOCKS * 64) * 1000 / 12500 + 16
      t.expect(c4).to_be_between(pooled - 1e-9, pooled + 1e-9)
    end)
    check("pool", function()
      local a, b = fleet:endpoint("a"), fleet:endpoint("b")
      t.expect(atc.pool(pool)).to_be(pool) -- an engine list already
      local mine = { b, a }
      local side = atc.pool(mine)
      t.expect(side).never.to_be(mine)
      t.expect(side).to_equal({ b, a })
      t.expect(atc.pool(side)).to_be(side)
      t.expect(atc.fastest(side, req)).to_be(b)
      mine[1] = nil -- the policy's own table stays its own
      t.expect(#side).to_be(2)
      t.expect(atc.pool({})).to_equal({})
      local mock = atc.pool({ { id = "m" } }) -- not a view: a plain copy
      t.expect(mock[1].id).to_be("m")
      t.expect(function() atc.pool("a") end).to_raise("table expected")
    end)
    check("find", function()
      local b = fleet:endpoint("b")
      local ep, at = atc.find(pool, "b")
      t.expect(ep).to_be(b)
      t.expect(at).to_be(2)
      t.expect(atc.find(pool, b)).to_be(b)
      t.expect(atc.find(pool, "nope")).to_be_nil()
      t.expect(atc.find({ fleet:endpoint("a") }, "b")).to_be_nil()
      t.expect(select(2, atc.find({ fleet:endpoint("c"), b }, b))).to_be(2) -- a plain table
      local m = { id = "m" }
      t.expect(atc.find({ m }, "m")).to_be(m) -- a mock: by its id
      t.expect(atc.find({ m }, m)).to_be(m)
    end)
    check("affinity.get", function() t.expect(atc.affinity.get("contract-pin")).to_be_nil() end)
    check("affinity.set", function()
      t.expect(atc.affinity.set("contract-pin", fleet:endpoint("b"))).to_be_nil()
      t.expect(atc.affinity.get("contract-pin")).to_be("b")
    end)
    check("affinity.set", function() -- a TTL that is no positive number of ms (NaN, inf) is refused
      t.expect(function() atc.affinity.set("contract-ttl", fleet:endpoint("b"), 0 / 0) end).to_raise("ttl must be")
      t.expect(function() atc.affinity.set("contract-ttl", fleet:endpoint("b"), math.huge) end).to_raise("ttl must be")
      t.expect(function() atc.affinity.set("contract-ttl", "b\0x") end).to_raise("expected an endpoint")
      t.expect(function() atc.affinity.set("contract-ttl", { id = 42 }) end).to_raise("expected an endpoint")
      t.expect(atc.affinity.get("contract-ttl")).to_be_nil()
    end)
    check("affinity.del", function()
      atc.affinity.del("contract-pin")
      t.expect(atc.affinity.get("contract-pin")).to_be_nil()
    end)
    return atc.queue()
  end)
  for _, e in ipairs(contract.atc) do
    t.expect(checked[e.name], "atc." .. e.name .. " is checked in this test").to_be(true)
  end
end)

t.test("the shipped policy decides on the engine's views", function()
  local policy = require "policy"
  local fleet = { { id = "a", model = "llama" }, { id = "b", model = "llama" }, { id = "c", model = "llama" } }
  for _, where in ipairs { "a", "c" } do -- no session: prefix affinity sends it where its blocks went
    local d = t.route({ endpoints = fleet, body = ASKED, routed = { { endpoint = where, body = EARLIER } } }, policy)
    t.expect(d.kind).to_be("endpoint")
    t.expect(d.endpoint).to_be(where)
  end
  local d = t.route({ endpoints = fleet, body = { model = "nope", messages = {} } }, policy)
  t.expect(d.kind).to_be("reject")
  t.expect(d.status).to_be(404)
  -- auto: a tool call (req.tools, parsed from the body) goes to the large model, a plain chat to the small
  local sizes = { { id = "big", model = "llama-3-70b" }, { id = "small", model = "qwen-2.5-1.5b" } }
  local ask = { model = "auto", messages = { { role = "user", content = "hi" } } }
  t.expect(t.route({ endpoints = sizes, body = ask }, policy).endpoint).to_be("small")
  ask.tools = { { type = "function", ["function"] = { name = "f" } } }
  t.expect(t.route({ endpoints = sizes, body = ask }, policy).endpoint).to_be("big")
end)

t.test("mocks: atc.testing's requests and endpoints have exactly the contract's fields", function()
  local function check_mock(key, mock, label)
    for _, e in ipairs(contract[key]) do
      local v = mock[e.name]
      if e.kind == "method" then
        t.expect(type(v), label .. ":" .. e.name).to_be("function")
      elseif v == nil then
        t.expect(e.nil_when, label .. "." .. e.name .. " is nil, which the contract allows").never.to_be_nil()
      else
        t.expect(contract.has_type(v, e.type), label .. "." .. e.name .. " is a " .. e.type).to_be(true)
      end
    end
    for k in pairs(mock) do
      if k ~= "_mock" then
        t.expect(contract.entry(key, k), label .. " has no field '" .. tostring(k) .. "' outside the contract").never.to_be_nil()
      end
    end
  end
  check_mock("req", t.request {}, "t.request")
  check_mock("req", t.request { tenant = "x", session = "s", max_tokens = 5 }, "t.request")
  check_mock("ep", t.endpoint { id = "a" }, "t.endpoint")
  check_mock("ep", t.endpoint { id = "a", version = "v1", last_error = "x", last_check = 1, ttft_ewma = 3,
                                running = 1, server_queue = 2, kv_usage = 0.1, prefix_hit_rate = 0.2 }, "t.endpoint")
  local fleet = t.fleet { { id = "a" } }
  for _, e in ipairs(contract.fleet) do
    t.expect(type(fleet[e.name]), "t.fleet:" .. e.name).to_be("function")
  end
  t.expect(function() t.endpoint { id = "a", queue = 3 } end).to_raise("'queue' is not a field a policy sees")
  t.expect(function() t.request { sesion = "x" } end).to_raise("'sesion' is not a field a policy sees")
  t.expect(function() fleet:set("a", { queue = 1 }) end).to_raise("'queue' is not a field a policy sees")
end)

t.test("t.route refuses what atc refuses, and a decision keeps its budget", function()
  local eps = { { id = "a", tags = { "x" }, version = "v" }, { id = "b" } }
  local ok = '{"model":"m","messages":[]}'
  local function none() return atc.queue() end
  t.expect(function() t.route({ endpoints = eps, body = "{not json" }, none) end).to_raise("400")
  t.expect(function() t.route({ endpoints = eps, body = '{"messages":[]}' }, none) end).to_raise("no model")
  t.expect(function() t.route({ endpoints = { { id = "a" }, { id = "a" } }, body = ok }, none) end).to_raise("duplicate")
  t.expect(function() t.route({ endpoints = eps, body = ok, tried = { "zz" } }, none) end).to_raise("no endpoint 'zz'")
  t.expect(function() t.route({ endpoints = { { id = "a", capacity = "x" } }, body = ok }, none) end).to_raise("must be a number")
  t.expect(function() t.route({ endpoints = eps, body = ok, headers = { ["x-atc-priority"] = "high" } }, none) end).to_raise("digit")
  t.expect(function()
    t.route({ endpoints = eps, body = ok }, function() return t.route({ endpoints = eps, body = ok }, none) end)
  end).to_raise("inside a decision")
  local d = t.route({ endpoints = eps, body = ok, allow_error = true, budget_ms = 5 }, function() while true do end end)
  t.expect(d.kind).to_be("fallback")
  t.expect(d.reason).to_be("overrun")
end)

t.test("atc.explain: the scores a policy attaches reach the decision record, eight at most", function()
  local d = t.route({ endpoints = { { id = "a", model = "m" }, { id = "b", model = "m" } },
                      body = { model = "m", messages = { { role = "user", content = "hi" } } } },
    function(req, fleet)
      local eps = fleet:endpoints("m")
      atc.explain(eps[1], 1.5, "near")
      atc.explain("b", 2, "far\nline")
      for i = 1, 10 do atc.explain(eps[1], i) end
      return eps[1]
    end)
  t.expect(d.endpoint).to_be("a")
  t.expect(#d.scores).to_be(8)
  t.expect(d.scores[1]).to_equal({ endpoint = "a", score = 1.5, note = "near" })
  t.expect(d.scores[2]).to_equal({ endpoint = "b", score = 2, note = "far?line" })
end)

-- The other way round: the engine's own tables of what it serves (the C views' dispatch and the atc
-- table's registration read them) name exactly the contract's entries. A field or function added in C
-- without an entry in contract.lua fails here, as an entry without C behind it does.
t.test("contract: the engine serves exactly the contract's names, section by section", function()
  local served = atc.test_contract()
  for _, sec in ipairs(contract.SECTIONS) do
    local in_contract, in_engine = {}, {}
    for _, e in ipairs(contract[sec.key]) do
      in_contract[e.name] = true
    end
    for _, name in ipairs(served[sec.key]) do
      t.expect(in_engine[name], sec.key .. "." .. name .. " served twice").to_be(nil)
      in_engine[name] = true
      t.expect(in_contract[name], sec.key .. "." .. name .. " is served by the engine but not in contract.lua").to_be(true)
    end
    for name in pairs(in_contract) do
      t.expect(in_engine[name], sec.key .. "." .. name .. " is in contract.lua but the engine does not serve it").to_be(true)
    end
  end
end)
