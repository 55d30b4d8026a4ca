-- Sticky percentage splits: the same key always lands on the same side.
--
--   local split = require "atc.split"
--   local side = split.pick(req.session, { v1 = 95, v2 = 5 })   -- "v1" for ~95% of keys
--
-- Weights need not add up to 100: each side gets weight / total of the keys. The choice depends only
-- on atc.hash(key) and the weights, so every worker and every replica agrees, and a key changes side
-- only when the weights change (moving 5% -> 10% moves just the keys between the two cut points).
-- Sides are taken in name order, so the result never depends on table iteration order.

local M = {}

local TWO32 = 4294967296

-- weights table -> { names = {sorted}, upto = {cumulative}, total = n }, checked on each use so an
-- edited table is recompiled. Bounded: a policy that builds a new weights table per request only
-- makes this cache start over now and then.
local compiled, ncompiled = {}, 0

local function compile(weights)
  local names = {}
  for name, w in pairs(weights) do
    if type(name) ~= "string" or type(w) ~= "number" or w < 0 then
      return nil, "split: weights must map names to numbers >= 0"
    end
    names[#names + 1] = name
  end
  table.sort(names)
  local upto, ws, total = {}, {}, 0
  for i = 1, #names do
    local w = weights[names[i]]
    ws[i] = w
    total = total + w
    upto[i] = total
  end
  if total <= 0 then
    return nil, "split: weights add up to 0"
  end
  return { names = names, ws = ws, upto = upto, total = total }
end

local function still_valid(c, weights)
  local names, ws = c.names, c.ws
  for i = 1, #names do
    if weights[names[i]] ~= ws[i] then
      return false
    end
  end
  local n = 0
  for _ in pairs(weights) do
    n = n + 1
  end
  return n == #names
end

-- Returns the side's name, or nil, err when the weights are unusable.
function M.pick(key, weights)
  local c = compiled[weights]
  if c == nil or not still_valid(c, weights) then
    local err
    c, err = compile(weights)
    if not c then
      return nil, err
    end
    if ncompiled >= 64 then
      compiled, ncompiled = {}, 0
    end
    if compiled[weights] == nil then
      ncompiled = ncompiled + 1
    end
    compiled[weights] = c
  end
  -- the low 32 bits of the hash as a fraction of the total weight
  local x = math.fmod(atc.hash(key), TWO32) / TWO32 * c.total
  local upto = c.upto
  for i = 1, #upto do
    if x < upto[i] then
      return c.names[i]
    end
  end
  return c.names[#upto]
end

return M
