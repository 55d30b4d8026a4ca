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
-- Mock endpoints are plain tables with the real fields and methods (id, model, version, tags,
-- has_tag, weight, capacity, inflight, inflight_tokens, load, available, health, queue, kv_usage,
-- ttft_ewma, prefix_overlap). Change them through the fleet (fleet:set, fleet:acquire,
-- fleet:release) so that load and available stay consistent.

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

-- One mock endpoint. spec: id (required), model ("m"), version (nil), tags ({}), weight (1),
-- capacity (8), inflight (0), inflight_tokens (0), health ("healthy"), available (false forces it
-- unavailable, as when drained or already tried), consecutive_failures (0), last_error (nil),
-- last_check (nil), running (0), queue (0), kv_usage (0), prefix_hit_rate (0), ttft_ewma (0), and overlap:
-- the blocks prefix_overlap(req) reports, a number or function(req) -> number (default 0).
function M.endpoint(spec)
  if type(spec) ~= "table" or type(spec.id) ~= "string" then
    error("testing.endpoint: spec with a string id expected", 2)
  end
  local ep = {
    id = spec.id,
    model = spec.model or "m",
    version = spec.version,
    tags = spec.tags or {},
    weight = spec.weight or 1,
    capacity = spec.capacity or 8,
    inflight = spec.inflight or 0,
    inflight_tokens = spec.inflight_tokens or 0,
    health = spec.health or "healthy",
    consecutive_failures = spec.consecutive_failures or 0,
    last_error = spec.last_error,
    last_check = spec.last_check,
    running = spec.running or 0,
    queue = spec.queue or 0,
    kv_usage = spec.kv_usage or 0,
    prefix_hit_rate = spec.prefix_hit_rate or 0,
    ttft_ewma = spec.ttft_ewma or 0,
    has_tag = has_tag,
  }
  local own = { available = spec.available, overlap = spec.overlap or 0 }
  ep.prefix_overlap = function(_, req)
    local o = own.overlap
    if type(o) == "function" then
      return o(req)
    end
    return o
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

  function fl:endpoints(model)
    return copy(by_model[model] or {})
  end

  function fl:all()
    return copy(all)
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

  -- fields: any endpoint field (inflight, capacity, health, weight, ...) plus available and overlap.
  function fl:set(id, fields)
    local ep = get(id)
    for k, v in pairs(fields) do
      if k == "available" or k == "overlap" then
        ep._mock[k] = v
      else
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
      self:acquire(v, (req.prompt_tokens or 0) + (req.max_tokens or 0))
    end
    return v
  end

  return fl
end

-- mock requests ---------------------------------------------------------------------------------------

local PATHS = { chat = "/v1/chat/completions", completion = "/v1/completions", embedding = "/v1/embeddings" }
local serial = 0

-- spec: id (generated), model ("m"), kind ("chat"), path, priority (0), tenant (""), session (""),
-- stream (false), prompt_tokens (100), max_tokens (nil), tools (false), attempt (1), block_tokens (64),
-- blocks (prompt_tokens / block_tokens),
-- headers (name -> value; names are case-insensitive, as in HTTP).
function M.request(spec)
  spec = spec or {}
  serial = serial + 1
  local headers = {}
  for k, v in pairs(spec.headers or {}) do
    headers[string.lower(k)] = tostring(v)
  end
  local kind = spec.kind or "chat"
  local prompt_tokens = spec.prompt_tokens or 100
  local req = {
    id = spec.id or ("req-" .. serial),
    model = spec.model or "m",
    kind = kind,
    path = spec.path or PATHS[kind] or "/v1/chat/completions",
    priority = spec.priority or 0,
    tenant = spec.tenant or "",
    session = spec.session or "",
    stream = spec.stream or false,
    prompt_tokens = prompt_tokens,
    max_tokens = spec.max_tokens,
    tools = spec.tools or false,
    attempt = spec.attempt or 1,
    block_tokens = spec.block_tokens or 64,
    blocks = spec.blocks or math.floor(prompt_tokens / (spec.block_tokens or 64)),
  }
  function req:header(name)
    return headers[string.lower(name)]
  end
  return req
end

return M
