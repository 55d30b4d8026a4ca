-- Policy unit tests, run by `atc test` in the production sandbox.
--
--   local t = require "atc.test"
--   local policy = require "policy"
--
--   t.test("urgent requests take the least loaded endpoint", function()
--     local fleet = t.fleet { { id = "a", inflight = 6 }, { id = "b", inflight = 1 } }
--     t.expect(policy.route(t.request { priority = 9 }, fleet)).to_be_endpoint("b")
--   end)
--
-- Expectations: t.expect(actual [, label]) followed by a matcher; `.never` turns any matcher around
-- (t.expect(v).never.to_be_nil()). A failed expectation raises "expected ..., got ..." and `atc test`
-- prints it with the test file's line.
--
--   to_be(x)              actual == x (the same table, endpoint or value)
--   to_equal(x)           the same content, compared deeply
--   to_be_nil()  to_be_truthy()  to_be_falsy()
--   to_be_between(lo, hi)  to_be_near(x, tolerance)  to_be_at_least(x)  to_be_at_most(x)
--   to_contain(x)         a string containing x (plain text), or an array with an element == x
--   to_raise([text])      actual is a function that raises (an error containing text)
--   to_be_endpoint([id])  to_be_queue()  to_be_reject([status])
--
-- Fake fleets and requests: t.fleet{...}, t.request{...}, t.endpoint{...} (see atc.testing), and the
-- other helpers of atc.testing (t.tally, t.ids, t.show).
--
-- The engine's own views: t.route(spec, policy) runs one decision the way atc serves one, on a real
-- endpoint table and a request parsed from a real body by the engine, through the same C path
-- production uses (atc_policy_route), and returns the decision. policy is a function(req, fleet) or a
-- module with .route. spec:
--   endpoints = { {id, model ("m"), version, tags, weight, capacity (8), token_budget,
--                  max_server_queue, inflight, inflight_tokens, ttft_ewma, errors, slow_start_limit,
--                  health ("healthy"; false: no health checks, as under replay), routable (default:
--                  healthy), consecutive_failures, last_error, last_check, running, server_queue,
--                  kv_usage, prefix_hit_rate (the scraped values; absent: never scraped)}, ... }
--   body = a JSON string or a table (t.json encodes it), path ("/v1/chat/completions"),
--   headers = { name = value }, id, tried = { endpoint ids already tried }, attempt (#tried + 1),
--   block_tokens (0: live), seed (of atc.random, 1), budget_ms (the decision's budget; default the
--   test's, --budget),
--   routed = { {endpoint = id, body = ..., path = ...}, ... }: earlier requests routed there (the
--            prefix index learns their blocks, so ep:prefix_overlap(req) answers as in production),
--   allow_error = true: return a failed decision instead of raising its error.
-- The decision: { kind = "endpoint" | "queue" | "reject" | "fallback", endpoint (id), status, message,
-- reason ("error", "overrun", "memory", "invalid_return"), error (the policy's error message) }. When the
-- policy raised, t.route raises that error (a failed t.expect inside the policy fails the test) unless
-- allow_error. Views handed to the policy are only valid during its decision.
--
-- Traces: t.replay{ trace = FILE, fleet = CONFIG.yaml or { {model = "m", count = 3, ...}, ... } (an entry's
-- from_ms / until_ms: its servers join / leave the fleet then, the YAML's from: / until:),
-- [policy = FILE], [seed = 1], [limit = N], [model = NAME], [outages = {{endpoint, from_ms, to_ms}}],
-- [snapshots = true] } replays a trace through a policy against a simulated fleet, as `atc replay`
-- does, and returns its decisions and the replay's report. policy: a file, or a module as require
-- returned it; by default the one policy module (a function or a table with route) this test file
-- requires itself, else the policy under test; two such modules and no policy: an error naming them.
-- report.policy is the file replayed.
--   decisions[k] = { record, id, at_ms, attempt, kind ("endpoint" | "queue" | "reject" | "fallback"),
--                    endpoint (id or nil), inflight (that endpoint's, before), capacity, model, session,
--                    tenant, priority, prompt_tokens, reason, status, ttft_ms, e2e_ms (of the request,
--                    on its last decision), fleet (with snapshots: id -> {inflight, capacity, routable},
--                    the servers in the fleet then only)}
--   report = { requests, completed, rejected, ttft_p50_ms, ttft_p90_ms, ttft_p99_ms, e2e_p50_ms,
--              e2e_p99_ms, cache_hit_rate, imbalance, policy_errors, budget_overruns, ...,
--              endpoints = { [id] = {requests, prefix_blocks, prefix_block_hits, from_ms, until_ms,
--                                    inflight_at_leave (its requests in flight as it left)} } }

local testing = require "atc.testing"
local verdict = require "atc.verdict"

local M = {}

M.fleet, M.request, M.endpoint = testing.fleet, testing.request, testing.endpoint
M.tally, M.ids, M.show = testing.tally, testing.ids, testing.show

local registered = {}

function M.test(name, fn)
  if type(name) ~= "string" or name == "" then
    error("t.test: a name (string) expected", 2)
  end
  if type(fn) ~= "function" then
    error("t.test: a function expected for test " .. string.format("%q", name), 2)
  end
  registered[#registered + 1] = { name = name, fn = fn }
end

-- For the runner: the tests declared so far, in order.
function M._take()
  local out = registered
  registered = {}
  return out
end

local show = testing.show

local deep_eq = testing.deep_eq

-- Each matcher returns ok, what was expected (phrased for a failure), and optionally what was got.
local matchers = {}

function matchers.to_be(actual, x)
  return actual == x, show(x)
end

function matchers.to_equal(actual, x)
  return deep_eq(actual, x), show(x)
end

function matchers.to_be_nil(actual)
  return actual == nil, "nil"
end

function matchers.to_be_truthy(actual)
  return actual ~= nil and actual ~= false, "a true value"
end

function matchers.to_be_falsy(actual)
  return actual == nil or actual == false, "nil or false"
end

local function number_check(actual, ok, what)
  if type(actual) ~= "number" then
    return false, what
  end
  return ok, what
end

function matchers.to_be_between(actual, lo, hi)
  return number_check(actual, type(actual) == "number" and actual >= lo and actual <= hi,
    "a number in [" .. tostring(lo) .. ", " .. tostring(hi) .. "]")
end

function matchers.to_be_near(actual, x, tolerance)
  return number_check(actual, type(actual) == "number" and math.abs(actual - x) <= tolerance,
    tostring(x) .. " +- " .. tostring(tolerance))
end

function matchers.to_be_at_least(actual, x)
  return number_check(actual, type(actual) == "number" and actual >= x, "at least " .. tostring(x))
end

function matchers.to_be_at_most(actual, x)
  return number_check(actual, type(actual) == "number" and actual <= x, "at most " .. tostring(x))
end

function matchers.to_contain(actual, x)
  if type(actual) == "string" then
    return string.find(actual, tostring(x), 1, true) ~= nil, "a string containing " .. show(x)
  end
  if type(actual) == "table" then
    for i = 1, #actual do
      if actual[i] == x then
        return true, "an array containing " .. show(x)
      end
    end
  end
  return false, "something containing " .. show(x)
end

function matchers.to_raise(actual, text)
  if type(actual) ~= "function" then
    return false, "a function that raises", show(actual)
  end
  local ok, err = pcall(actual)
  if ok then
    return false, "an error" .. (text and (" containing " .. show(text)) or ""), "no error"
  end
  if text ~= nil and not string.find(tostring(err), text, 1, true) then
    return false, "an error containing " .. show(text), show(err)
  end
  return true, "an error" .. (text and (" containing " .. show(text)) or ""), show(err)
end

function matchers.to_be_endpoint(actual, id)
  local ok = verdict.kind(actual) == "endpoint" and (id == nil or actual.id == id)
  return ok, id and ("endpoint " .. tostring(id)) or "an endpoint"
end

function matchers.to_be_queue(actual)
  return verdict.kind(actual) == "queue", "a queue verdict"
end

function matchers.to_be_reject(actual, status)
  local ok = verdict.kind(actual) == "reject" and (status == nil or actual.status == status)
  return ok, status and ("a reject with status " .. tostring(status)) or "a reject verdict"
end

-- Builds the matcher functions of one expectation; negate turns them around.
local function expectation(actual, label, negate)
  local e = {}
  for name, check in pairs(matchers) do
    e[name] = function(...)
      local ok, expected, got = check(actual, ...)
      if negate then
        ok = not ok
        expected = "not " .. expected
      end
      if not ok then
        -- level 2: the line of the test that called the matcher
        error((label and (label .. ": ") or "") .. "expected " .. expected .. ", got " .. (got or show(actual)), 2)
      end
      return actual
    end
  end
  return e
end

function M.expect(actual, label)
  local e = expectation(actual, label, false)
  e.never = expectation(actual, label, true)
  return e
end

-- JSON text of a Lua value (object keys sorted, so the text is stable); for t.route bodies.
local function json(v, out)
  local ty = type(v)
  if ty == "string" then
    out[#out + 1] = '"' .. string.gsub(v, '[%c"\\]', function(c)
      return string.format("\\u%04x", string.byte(c))
    end) .. '"'
  elseif ty == "number" then
    out[#out + 1] = v == math.floor(v) and string.format("%d", v) or string.format("%.17g", v)
  elseif ty == "boolean" then
    out[#out + 1] = tostring(v)
  elseif v == nil or v == M.null then
    out[#out + 1] = "null"
  elseif ty == "table" then
    if #v > 0 or next(v) == nil and v ~= M.object then
      out[#out + 1] = "["
      for i = 1, #v do
        if i > 1 then out[#out + 1] = "," end
        json(v[i], out)
      end
      out[#out + 1] = "]"
    else
      local keys = {}
      for k in pairs(v) do
        keys[#keys + 1] = tostring(k)
      end
      table.sort(keys)
      out[#out + 1] = "{"
      for i, k in ipairs(keys) do
        if i > 1 then out[#out + 1] = "," end
        json(k, out)
        out[#out + 1] = ":"
        json(v[k], out)
      end
      out[#out + 1] = "}"
    end
  else
    error("t.json: cannot encode a " .. ty, 3)
  end
  return out
end

M.null, M.object = {}, {} -- t.json: JSON null, and {} as an empty object rather than []

function M.json(v)
  return table.concat(json(v, {}))
end

function M.route(spec, policy)
  if type(spec) ~= "table" then
    error("t.route: a spec table expected", 2)
  end
  local route = type(policy) == "table" and policy.route or policy
  if type(route) ~= "function" then
    error("t.route: a policy (function(req, fleet) or a module with route) expected", 2)
  end
  local s = {}
  for k, v in pairs(spec) do
    s[k] = v
  end
  s.endpoints = spec.endpoints or {}
  if type(spec.body) == "table" then
    s.body = M.json(spec.body)
  end
  if type(spec.routed) == "table" then
    s.routed = {}
    for i, r in ipairs(spec.routed) do
      s.routed[i] = { endpoint = r.endpoint, path = r.path, body = type(r.body) == "table" and M.json(r.body) or r.body }
    end
  end
  local d = atc.test_route(s, route)
  if d.error ~= nil and not spec.allow_error then
    error(d.error, 0)
  end
  return d
end

-- Runs a trace through a policy against a simulated fleet (see the top of this file).
function M.replay(opts)
  if type(opts) ~= "table" or type(opts.trace) ~= "string" then
    error("t.replay: a table with trace = FILE expected", 2)
  end
  if opts.fleet == nil then
    error("t.replay: fleet = CONFIG.yaml or a list of simulated servers expected", 2)
  end
  return atc.replay(opts)
end

return M
