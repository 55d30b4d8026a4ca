-- A disaggregated model's pair, chosen by the policy: route's {prefill = ep, decode = ep} return
-- (stdlib/atc/contract.lua, "route's return"), decided on the engine's own views by t.route, and the
-- stdlib's common pick (stdlib/atc/disagg.lua).
local t = require "atc.test"
local disagg = require "atc.disagg"

local function fleet(extra)
  local eps = {
    { id = "p0", role = "prefill", disaggregation = "vllm", prefill_tokens = 40000 },
    { id = "p1", role = "prefill", disaggregation = "vllm", prefill_tokens = 500 },
    { id = "d0", role = "decode", disaggregation = "vllm", decoding = 3, kv_usage = 0.2 },
    { id = "d1", role = "decode", disaggregation = "vllm", decoding = 1, kv_usage = 0.9 },
  }
  for k, v in pairs(extra or {}) do
    for _, ep in ipairs(eps) do
      if ep.id == k then
        for f, x in pairs(v) do
          ep[f] = x
        end
      end
    end
  end
  return eps
end

local BODY = { model = "m", messages = { { role = "user", content = "hello there" } } }

t.test("route returns the pair: the record names the decode server and the prefill server", function()
  local d = t.route({ endpoints = fleet(), body = BODY }, function(req, f)
    return { prefill = f:endpoint("p0"), decode = f:endpoint("d1") }
  end)
  t.expect(d.kind).to_be("endpoint")
  t.expect(d.endpoint).to_be("d1")
  t.expect(d.prefill).to_be("p0")
end)

t.test("ids work as well as views, and either end may be left to the C balancer", function()
  local d = t.route({ endpoints = fleet(), body = BODY }, function() return { prefill = "p1" } end)
  t.expect(d.kind).to_be("endpoint")
  t.expect(d.endpoint).to_be(nil)
  t.expect(d.prefill).to_be("p1")
  d = t.route({ endpoints = fleet(), body = BODY }, function() return { decode = "d0" } end)
  t.expect(d.endpoint).to_be("d0")
  t.expect(d.prefill).to_be(nil)
end)

t.test("one endpoint: a prefill server takes its stage, any other the decode stage", function()
  local d = t.route({ endpoints = fleet(), body = BODY }, function() return "p0" end)
  t.expect(d.kind).to_be("endpoint")
  t.expect(d.prefill).to_be("p0")
  t.expect(d.endpoint).to_be(nil)
  d = t.route({ endpoints = fleet(), body = BODY }, function() return "d0" end)
  t.expect(d.endpoint).to_be("d0")
  t.expect(d.prefill).to_be(nil)
end)

t.test("a pair with a server in the wrong stage, an unavailable one or an empty table is invalid", function()
  for _, bad in ipairs({ { prefill = "d0", decode = "d1" }, { prefill = "p0", decode = "p1" }, {},
                         { prefill = "p0", decode = "nosuch" } }) do
    local d = t.route({ endpoints = fleet(), body = BODY, allow_error = true }, function() return bad end)
    t.expect(d.kind).to_be("fallback")
    t.expect(d.reason).to_be("invalid_return")
    t.expect(d.error).to_contain("prefill = ep, decode = ep")
  end
  local d = t.route({ endpoints = fleet({ p0 = { health = "unhealthy" } }), body = BODY, allow_error = true },
    function() return { prefill = "p0", decode = "d0" } end)
  t.expect(d.reason).to_be("invalid_return")
end)

t.test("a pair for a model that is not disaggregated is invalid", function()
  local d = t.route({ endpoints = { { id = "a" }, { id = "b" } }, body = BODY, allow_error = true },
    function() return { prefill = "a", decode = "b" } end)
  t.expect(d.reason).to_be("invalid_return")
end)

t.test("ep.role says each server's role", function()
  t.route({ endpoints = fleet(), body = BODY }, function(req, f)
    t.expect(f:endpoint("p0").role).to_be("prefill")
    t.expect(f:endpoint("d0").role).to_be("decode")
    return "d0"
  end)
end)

t.test("disagg.pick: prefill by the work queued there, decode by running sequences then KV room", function()
  local d = t.route({ endpoints = fleet(), body = BODY }, function(req, f)
    return disagg.pick(f:endpoints("m"), req)
  end)
  t.expect(d.prefill).to_be("p1")  -- 500 queued tokens against 40000
  t.expect(d.endpoint).to_be("d1") -- one sequence against three
  d = t.route({ endpoints = fleet({ d0 = { decoding = 1 } }), body = BODY }, function(req, f)
    return disagg.pick(f:endpoints("m"), req)
  end)
  t.expect(d.endpoint).to_be("d0") -- as many sequences: the one with more KV room
end)

t.test("disagg.pick: the prefix cache counts on the prefill side", function()
  local long = string.rep("a long shared system prompt ", 400)
  local body = { model = "m", messages = { { role = "system", content = long }, { role = "user", content = "q" } } }
  local d = t.route({ endpoints = fleet({ p0 = { prefill_tokens = 0 }, p1 = { prefill_tokens = 1000 } }),
                      body = body, routed = { { endpoint = "p1", body = body } } }, function(req, f)
    return disagg.pick(f:endpoints("m"), req)
  end)
  t.expect(d.prefill).to_be("p1") -- 1000 queued, but its cache holds the prompt (about 2800 tokens)
end)

t.test("disagg.pick: a colocated pool gets one endpoint, a stage with none available nil", function()
  local d = t.route({ endpoints = { { id = "a", inflight = 2 }, { id = "b" } }, body = BODY }, function(req, f)
    return disagg.pick(f:endpoints("m"), req)
  end)
  t.expect(d.endpoint).to_be("b")
  t.route({ endpoints = fleet({ p0 = { health = "unhealthy" }, p1 = { health = "unhealthy" } }), body = BODY },
    function(req, f)
      t.expect(disagg.pick(f:endpoints("m"), req)).to_be(nil)
      return "d0"
    end)
end)
