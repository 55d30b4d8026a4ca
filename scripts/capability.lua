-- Capability: which endpoints may serve this request at all. Returns the candidate pool (an array of
-- endpoints, some possibly full) or nil and a verdict. Three steps:
--   1. model: the request's model, or an alias resolved to a real one (auto: small or large model);
--   2. tags: with the header `x-atc-tags: a, b`, only endpoints carrying every listed tag;
--   3. version: a sticky weighted split between versions of that model (a canary), falling back to
--      the stable version when the chosen side has no available endpoint.

local split = require "atc.split"
local verdict = require "atc.verdict"

-- Knobs ------------------------------------------------------------------------------------------------

-- Aliases. A list names real models in order of preference: the first one with endpoints (with the
-- requested tags) serves. `small`/`large` lists are picked by needs_large() below. alias{} notes its
-- own file:line (error() with a level writes it), so that init's warning points at the alias.
local function alias(targets)
  local _, at = pcall(error, "", 3)
  targets.at = at
  return targets
end

local ALIASES = {
  auto = alias {
    small = { "qwen-2.5-1.5b", "llama-3-8b" },
    large = { "llama-3-70b", "llama-3-8b" },
  },
  fast = alias { "qwen-2.5-1.5b", "llama-3-8b" },
}

-- When `auto` means the large model: a long prompt (req.prompt_tokens estimates messages or prompt at
-- about 4 bytes a token), a long answer, tool use (req.tools: the body has a "tools" array), or a
-- header a client or gateway sets. A header counts as set unless it is empty, "0", "false" or "no".
local LARGE_PROMPT_TOKENS = 2000 -- a longer prompt goes to the large model
local LARGE_MAX_TOKENS = 4096    -- so does asking for a longer answer than this
local LARGE_HEADERS = { "x-atc-reasoning", "x-atc-tools" }

-- Version split, per model ("*": every model not listed). An endpoint without a version counts as
-- STABLE. The same session (or, without one, the same request id) always gets the same side.
local STABLE = "v1"
local SPLITS = {
  ["*"] = { v1 = 95, v2 = 5 },
}

local TAGS_HEADER = "x-atc-tags"

----------------------------------------------------------------------------------------------------------

local M = {}
M.ALIASES, M.SPLITS, M.STABLE = ALIASES, SPLITS, STABLE -- for tests and init() checks

local function is_set(v)
  return v ~= nil and v ~= "" and v ~= "0" and v ~= "false" and v ~= "no"
end

function M.needs_large(req)
  if req.prompt_tokens > LARGE_PROMPT_TOKENS then
    return true
  end
  if req.max_tokens ~= nil and req.max_tokens > LARGE_MAX_TOKENS then
    return true
  end
  if req.tools then
    return true
  end
  for i = 1, #LARGE_HEADERS do
    if is_set(req:header(LARGE_HEADERS[i])) then
      return true
    end
  end
  return false
end

-- "a, b" -> { "a", "b" }; nil without the header.
local function wanted_tags(req)
  local v = req:header(TAGS_HEADER)
  if v == nil or v == "" then
    return nil
  end
  if #v > 256 then
    return nil, verdict.reject(400, TAGS_HEADER .. " is too long")
  end
  local tags = {}
  for tag in string.gmatch(v, "[^,%s]+") do
    tags[#tags + 1] = tag
  end
  return tags
end

-- The endpoints of eps with every tag; eps itself when all qualify.
local function with_tags(eps, tags)
  if tags == nil then
    return eps
  end
  local out = {}
  for i = 1, #eps do
    local ep, ok = eps[i], true
    for j = 1, #tags do
      if not ep:has_tag(tags[j]) then
        ok = false
        break
      end
    end
    if ok then
      out[#out + 1] = ep
    end
  end
  if #out == #eps then
    return eps
  end
  return out
end

-- A fleet's endpoint lists do not change while its endpoints do not (a config reload or an endpoint added
-- or removed hands the policy a new fleet), so a model's list (fleet:endpoints: the engine's, the same
-- table every call) and its version sides (atc.pool: engine lists too, which atc.fastest reads in C) are
-- built once per fleet rather than per request.
local cached_fleet, by_model, by_version, single_version = nil, {}, {}, {}

local function endpoints_of(fleet, model)
  if fleet ~= cached_fleet then
    cached_fleet, by_model, by_version, single_version = fleet, {}, {}, {}
  end
  local eps = by_model[model]
  if eps == nil then
    eps = fleet:endpoints(model)
    by_model[model] = eps
  end
  return eps
end

-- The endpoints of eps whose version is `version` (no version = STABLE); eps itself when all are.
local function of_version_uncached(eps, version)
  local n = 0
  for i = 1, #eps do
    if (eps[i].version or STABLE) == version then
      n = n + 1
    end
  end
  if n == #eps then
    return eps
  end
  local out = {}
  for i = 1, #eps do
    if (eps[i].version or STABLE) == version then
      out[#out + 1] = eps[i]
    end
  end
  return out
end

local function of_version(eps, version)
  local sides = by_version[eps]
  if sides == nil then
    if by_model[eps[1] and eps[1].model] ~= eps then
      return of_version_uncached(eps, version) -- a list filtered by tags: built per request anyway
    end
    sides = {}
    by_version[eps] = sides
  end
  local side = sides[version]
  if side == nil then
    side = atc.pool(of_version_uncached(eps, version))
    sides[version] = side
  end
  return side
end

-- Whether every endpoint of eps runs one version: no split can narrow such a pool, so outside a rollout
-- a request is not hashed at all (decided once per model's list, per request for a list cut by tags).
local function one_version(eps)
  local one = single_version[eps]
  if one == nil then
    one = true
    local first = eps[1].version or STABLE
    for i = 2, #eps do
      if (eps[i].version or STABLE) ~= first then
        one = false
        break
      end
    end
    if by_model[eps[1].model] == eps then
      single_version[eps] = one
    end
  end
  return one
end

local function any_available(eps)
  for i = 1, #eps do
    if eps[i].available then
      return true
    end
  end
  return false
end

-- The model's endpoints with the tags, resolving an alias to its first target that has some.
local function resolve(req, fleet, tags)
  local model = req.model
  local alias = ALIASES[model]
  if alias == nil then
    return with_tags(endpoints_of(fleet, model), tags)
  end
  local targets = alias
  if alias.small ~= nil then
    targets = M.needs_large(req) and alias.large or alias.small
  end
  for i = 1, #targets do
    local eps = with_tags(endpoints_of(fleet, targets[i]), tags)
    if #eps > 0 then
      return eps
    end
  end
  return {}
end

-- Narrow to one side of the model's version split. A canary side with nothing available falls back
-- to the stable side (a full stable side is not spilled onto the canary: it queues); without any
-- stable endpoint the split does not narrow at all.
local function split_versions(req, eps)
  local weights = SPLITS[eps[1].model] or SPLITS["*"]
  if weights == nil or one_version(eps) then
    return eps
  end
  local key = req.session or req.id
  local side = split.pick(key, weights) or STABLE
  if side ~= STABLE then
    local canary = of_version(eps, side)
    if any_available(canary) then
      return canary
    end
  end
  local stable = of_version(eps, STABLE)
  if #stable > 0 then
    return stable
  end
  return eps
end

function M.candidates(req, fleet)
  local tags, bad = wanted_tags(req)
  if bad then
    return nil, bad
  end
  local eps = resolve(req, fleet, tags)
  if #eps == 0 then
    if tags ~= nil then
      return nil, verdict.reject(404, "no endpoint of model '" .. req.model .. "' has the tags in " .. TAGS_HEADER)
    end
    return nil, verdict.model_not_found(req.model)
  end
  return split_versions(req, eps)
end

-- Alias targets that no endpoint serves, as log lines that start with the alias's file:line (run from the
-- policy's init; atc.log keeps that position).
function M.check(fleet)
  local problems = {}
  local function check_list(name, list, at)
    for i = 1, #list do
      if #fleet:endpoints(list[i]) == 0 then
        problems[#problems + 1] = (at or "") .. "alias '" .. name .. "': no endpoint serves '" .. list[i] .. "'"
      end
    end
  end
  for name, targets in pairs(ALIASES) do
    if targets.small ~= nil then
      check_list(name, targets.small, targets.at)
      check_list(name, targets.large, targets.at)
    else
      check_list(name, targets, targets.at)
    end
  end
  table.sort(problems)
  return problems
end

return M
