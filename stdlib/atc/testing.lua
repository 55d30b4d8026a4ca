-- Helpers for policy unit tests: tests/policy/*_test.lua return a table of name -> function, and
-- `atc test FILE...` runs each one in the production sandbox; a test fails when it raises.
--
--   local t = require "atc.testing"
--   local fleet = t.fleet{
--     { id = "a", model = "m", capacity = 4, inflight = 1, version = "v1", tags = { "small" }, overlap = 3 },
--     { id = "b", model = "m", capacity = 4 },
--   }
--   local req = t.request{ model = "m", priority = 7, session = "s1", prompt_tokens = 900,
--                          headers = { ["x-atc-tags"] = "small" } }
--   t.is_endpoint(policy.route(req, fleet), "b")
--
-- Mock endpoints and requests are plain tables with exactly the fields of stdlib/atc/contract.lua (the
-- contract; what is not known yet is nil there too) and the real methods. Change endpoints through the
-- fleet (fleet:set, fleet:acquire, fleet:release) so that load and available stay consistent. For the
-- engine's own views instead of mocks, see t.route in atc.test.

local verdict = require "atc.verdict"

local M = {}

-- printing values in failure messages --------------------------------------------------------------

local function show(v, depth)
  local t = type(v)
  if t == "string" then
    return string.format("%q", v)
  end
  if t ~= "table" then
    return tostring(v)
  end
  local kind = verdict.kind(v)
  if kind == "endpoint" then
    return "endpoint " .. tostring(v.id)
  elseif kind == "queue" then
    return "queue(" .. tostring(v.reason) .. ")"
  elseif kind == "reject" then
    return "reject(" .. tostring(v.status) .. ", " .. show(v.message) .. ")"
  end
  depth = depth or 0
  if depth > 2 then
    return "{...}"
  end
  local parts, n = {}, 0
  for i = 1, #v do
    n = n + 1
    if n > 20 then
      parts[n] = "..."
      return "{" .. table.concat(parts, ", ") .. "}"
    end
    parts[n] = show(v[i], depth + 1)
  end
  local keys = {}
  for k in pairs(v) do
    if not (type(k) == "number" and k >= 1 and k <= #v and k % 1 == 0) then
      keys[#keys + 1] = k
    end
  end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  for _, k in ipairs(keys) do
    n = n + 1
    if n > 20 then
      parts[n] = "..."
      break
    end
    parts[n] = tostring(k) .. " = " .. show(v[k], depth + 1)
  end
  return "{" .. table.concat(parts, ", ") .. "}"
end
M.show = show

local function fail(msg, what)
  error((msg and (msg .. ": ") or "") .. what, 3)
end

-- assertions ----------------------------------------------------------------------------------------

local function deep_eq(a, b)
  if a == b then
    return true
  end
  if type(a) ~= "table" or type(b) ~= "table" then
    return false
  end
  for k, v in pairs(a) do
    if not deep_eq(v, b[k]) then
      return false
    end
  end
  for k in pairs(b) do
    if a[k] == nil then
      return false
    end
  end
  return true
end

M.deep_eq = deep_eq

-- eq compares tables by content (endpoints: by identity, as they are the same objects).
function M.eq(actual, expected, msg)
  if not deep_eq(actual, expected) then
    fail(msg, "expected " .. show(expected) .. ", got " .. show(actual))
  end
  return actual
end

function M.ne(actual, unexpected, msg)
  if deep_eq(actual, unexpected) then
    fail(msg, "expected anything but " .. show(unexpected))
  end
  return actual
end

function M.truthy(v, msg)
  if not v then
    fail(msg, "expected a true value, got " .. show(v))
  end
  return v
end

function M.falsy(v, msg)
  if v then
    fail(msg, "expected nil or false, got " .. show(v))
  end
  return v
end

-- lo <= x <= hi
function M.between(x, lo, hi, msg)
  if type(x) ~= "number" or x < lo or x > hi then
    fail(msg, "expected a number in [" .. lo .. ", " .. hi .. "], got " .. show(x))
  end
  return x
end

function M.near(x, expected, tolerance, msg)
  if type(x) ~= "number" or math.abs(x - expected) > tolerance then
    fail(msg, "expected " .. expected .. " +- " .. tolerance .. ", got " .. show(x))
  end
  return x
end

-- Calls fn(...) and expects it to raise; with pattern, a message containing it (plain text).
-- Returns the error message.
function M.raises(fn, pattern, msg)
  local ok, err = pcall(fn)
  if ok then
    fail(msg, "expected an error")
  end
  if pattern and not string.find(tostring(err), pattern, 1, true) then
    fail(msg, "expected an error containing " .. show(pattern) .. ", got " .. show(err))
  end
  return err
end

-- v is an endpoint (with that id, when given). Returns v.
function M.is_endpoint(v, id, msg)
  if verdict.kind(v) ~= "endpoint" then
    fail(msg, "expected an endpoint" .. (id and (" " .. id) or "") .. ", got " .. show(v))
  end
  if id ~= nil and v.id ~= id then
    fail(msg, "expected endpoint " .. tostring(id) .. ", got endpoint " .. tostring(v.id))
  end
  return v
end

function M.is_queue(v, msg)
  if verdict.kind(v) ~= "queue" then
    fail(msg, "expected a queue verdict, got " .. show(v))
  end
  return v
end

-- v is a reject verdict (with that status, when given).
function M.is_reject(v, status, msg)
  if verdict.kind(v) ~= "reject" then
    fail(msg, "expected a reject verdict, got " .. show(v))
  end
  if status ~= nil and v.status ~= status then
    fail(msg, "expected a reject with status " .. status .. ", got " .. show(v))
  end
  return v
end

-- Calls fn(i) n times and counts what it returns (endpoints are counted by id):
-- tally(100, function() return pick() end) -> { a = 52, b = 48 }
function M.tally(n, fn)
  local counts = {}
  for i = 1, n do
    local v = fn(i)
    if verdict.kind(v) == "endpoint" then
      v = v.id
    elseif verdict.kind(v) ~= nil then
      v = verdict.kind(v)
    end
    v = tostring(v)
    counts[v] = (counts[v] or 0) + 1
  end
  return counts
end

-- ids of an array of endpoints, in order
function M.ids(eps)
  local out = {}
  for i = 1, #eps do
    out[i] = eps[i].id
  end
  return out
end

-- mock endpoints and fleets -------------------------------------------------------------------------
-- Built from atc.contract: a mock has exactly the contract's fields (spec values, else the contract's
-- mock defaults, else nil: "not known yet"), so a mock cannot drift from what the engine provides.

local contract = require "atc.contract"

local function refresh(ep, spec)
  ep.load = ep.capacity > 0 and ep.inflight / ep.capacity or 1 -- as the engine reports it
  ep.available = spec.available ~= false and ep.health == "healthy" and ep.inflight < ep.capacity
end

local function has_tag(self, tag)
  local tags = self.tags
  for i = 1, #tags do
    if tags[i] == tag then
      return true
    end
  end
  return false
end

-- Spec keys that are not contract fields: what a mock needs to fake the engine.
local ENDPOINT_EXTRA = { available = true, overlap = true, cached = true }
local REQUEST_EXTRA = { headers = true }

-- Copies the contract's data fields of section key from spec (else their mock default) into out;
-- a spec key that is neither a field nor in extra is an error (a typo, or a field renamed).
local function from_contract(key, spec, extra, out, who)
  for k in pairs(spec) do
    local e = contract.entry(key, k)
    if not extra[k] and (e == nil or e.kind == "method" or e.derived) then
      error(who .. ": '" .. tostring(k) .. "' is not a field a policy sees (see stdlib/atc/contract.lua)", 3)
    end
  end
  for _, e in ipairs(contract[key]) do
    if e.kind ~= "method" and not e.derived then
      local v = spec[e.name]
      if v == nil then
        v = e.mock
        if type(v) == "table" then
          v = {}
        end
      end
      out[e.name] = v
    end
  end
  return out
end

-- One mock endpoint. spec: id (required) and any field of contract.ep (defaults there: model "m",
-- weight 1, capacity 8, inflight 0, health "healthy", ...; the nil_when fields default to nil), plus
-- available (false forces it unavailable, as when drained or already tried) and overlap: the blocks
-- prefix_overlap(req) reports, a number or function(req) -> number (default 0), and cached: the tokens
-- cached_tokens(req) reports, likewise (default nil: the endpoint publishes no KV-cache events).
function M.endpoint(spec)
  if type(spec) ~= "table" or type(spec.id) ~= "string" then
    error("testing.endpoint: spec with a string id expected", 2)
  end
  local ep = from_contract("ep", spec, ENDPOINT_EXTRA, {}, "testing.endpoint")
  ep.has_tag = has_tag
  local own = { available = spec.available, overlap = spec.overlap or 0, cached = spec.cached }
  ep.prefix_overlap = function(_, req)
    local o = own.overlap
    if type(o) == "function" then
      return o(req)
    end
    return o
  end
  ep.cached_tokens = function(_, req)
    local c = own.cached
    if type(c) == "function" then
      return c(req)
    end
    return c
  end
  ep.predict_ttft = function(self, req) -- the engine's formula (fleet/signals.c), on the mock's fields
    local uncached = req.prompt_tokens - (self:cached_tokens(req) or self:prefix_overlap(req) * req.block_tokens)
    return ((self.prefill_tokens or 0) + (uncached > 1 and uncached or 1)) * 1000 / self.prefill_rate + self.itl
  end
  ep._mock = own -- how fleet:set reaches the settings that are not fields
  refresh(ep, own)
  return ep
end

local function copy(a)
  local out = {}
  for i = 1, #a do
    out[i] = a[i]
  end
  return out
end

-- A mock fleet with the real fleet's methods, endpoints(model), all(), models(), endpoint(id), and
-- for tests: set(id, fields), acquire(ep_or_id[, tokens]), release(ep_or_id[, tokens]),
-- route(policy, req) (runs a policy and counts the chosen endpoint's new request, as the engine does).
function M.fleet(specs)
  local all, by_id, by_model, models = {}, {}, {}, {}
  for i = 1, #specs do
    local ep = M.endpoint(specs[i])
    if by_id[ep.id] then
      error("testing.fleet: duplicate endpoint id " .. ep.id, 2)
    end
    all[#all + 1] = ep
    by_id[ep.id] = ep
    local list = by_model[ep.model]
    if list == nil then
      list = {}
      by_model[ep.model] = list
      models[#models + 1] = ep.model
    end
    list[#list + 1] = ep
  end

  local fl = {}

  -- As the engine's: the same list on every call (the set of endpoints does not change), shared and
  -- read-only; a list a policy changed raises here, as the engine's host functions do (policy_fleet.c).
  local function shared(list, kept, name)
    if #list ~= #kept then
      error(name .. ": a list from fleet:endpoints, fleet:all or atc.pool was changed; those lists are shared by every decision and read-only (copy one into a new table to change it)", 3)
    end
    for i = 1, #kept do
      if list[i] ~= kept[i] then
        error(name .. ": a list from fleet:endpoints, fleet:all or atc.pool was changed; those lists are shared by every decision and read-only (copy one into a new table to change it)", 3)
      end
    end
    return list
  end
  local lists, kept = {}, {}
  for model, list in pairs(by_model) do
    lists[model], kept[model] = copy(list), list
  end
  local all_list = copy(all)

  function fl:endpoints(model)
    if lists[model] == nil then
      return {} -- an unknown model: an empty table of its own
    end
    return shared(lists[model], kept[model], "fleet:endpoints")
  end

  function fl:all()
    return shared(all_list, all, "fleet:all")
  end

  function fl:models()
    return copy(models)
  end

  function fl:endpoint(id)
    return by_id[id]
  end

  local function get(ep_or_id)
    local ep = by_id[type(ep_or_id) == "table" and ep_or_id.id or ep_or_id]
    if ep == nil then
      error("testing.fleet: no endpoint " .. show(ep_or_id), 3)
    end
    return ep
  end

  -- fields: any endpoint field (inflight, capacity, health, weight, ...) plus available, overlap, cached.
  function fl:set(id, fields)
    local ep = get(id)
    for k, v in pairs(fields) do
      if k == "available" or k == "overlap" or k == "cached" then
        ep._mock[k] = v
      else
        local e = contract.entry("ep", k)
        if e == nil or e.kind == "method" or e.derived then
          error("testing.fleet:set: '" .. tostring(k) .. "' is not a field a policy sees (see stdlib/atc/contract.lua)", 2)
        end
        ep[k] = v
      end
    end
    refresh(ep, ep._mock)
    return ep
  end

  function fl:acquire(ep_or_id, tokens)
    local ep = get(ep_or_id)
    ep.inflight = ep.inflight + 1
    ep.inflight_tokens = ep.inflight_tokens + (tokens or 0)
    refresh(ep, ep._mock)
    return ep
  end

  function fl:release(ep_or_id, tokens)
    local ep = get(ep_or_id)
    if ep.inflight > 0 then
      ep.inflight = ep.inflight - 1
    end
    ep.inflight_tokens = math.max(0, ep.inflight_tokens - (tokens or 0))
    refresh(ep, ep._mock)
    return ep
  end

  function fl:route(policy, req)
    local route = type(policy) == "table" and policy.route or policy
    local v = route(req, self)
    if type(v) == "string" then
      v = by_id[v] or v
    end
    if verdict.kind(v) == "endpoint" then
      self:acquire(v, (req.prompt_tokens or 0) + (req.n or 1) * (req.max_tokens or 0))
    end
    return v
  end

  return fl
end

-- mock requests ---------------------------------------------------------------------------------------

local PATHS = { chat = "/v1/chat/completions", completion = "/v1/completions", embedding = "/v1/embeddings" }
local serial = 0

-- spec: any field of contract.req (defaults there: model "m", kind "chat", priority 0, prompt_tokens
-- 100, attempt 1, block_tokens 64, ...; tenant, session and max_tokens nil), with id generated, path
-- from kind, blocks = prompt_tokens / block_tokens; plus headers (name -> value; names are
-- case-insensitive, as in HTTP).
function M.request(spec)
  spec = spec or {}
  serial = serial + 1
  local headers = {}
  for k, v in pairs(spec.headers or {}) do
    headers[string.lower(k)] = tostring(v)
  end
  local req = from_contract("req", spec, REQUEST_EXTRA, {}, "testing.request")
  req.id = req.id or ("req-" .. serial)
  req.path = req.path or PATHS[req.kind] or "/v1/chat/completions"
  req.blocks = req.blocks or math.floor(req.prompt_tokens / req.block_tokens)
  function req:header(name)
    return headers[string.lower(name)]
  end
  return req
end

return M
