-- Balancers: each picks one available endpoint from an array, or returns nil when none is available.
--
-- They take the engine's endpoints or any array of endpoint-like tables with the fields available,
-- inflight, capacity and, where used, weight (mock fleets in tests, a filtered copy). least_loaded
-- and p2c are the host's C balancers, which read both kinds, so tests run the code production runs.
--
--   random(eps)            uniform among available endpoints
--   round_robin(eps[, k])  the next available one after the last pick for key k (default "")
--   least_loaded(eps)      lowest inflight / capacity (ties: the first in the array)
--   p2c(eps)               power of two choices: two distinct random ones, the less loaded of the two
--   weighted(eps)          random, proportional to ep.weight

local M = {}

-- Share of capacity in use (the engine precomputes ep.load; endpoint-like tables may not have it).
function M.load(ep)
  local l = ep.load
  if l ~= nil then
    return l
  end
  local c = ep.capacity or 0
  if c <= 0 then
    return 1
  end
  return ep.inflight / c
end

-- Number of available endpoints.
local function count(eps)
  local n = 0
  for i = 1, #eps do
    if eps[i].available then
      n = n + 1
    end
  end
  return n
end
M.count = count

-- The k-th available endpoint (1-based), or nil.
local function nth(eps, k)
  for i = 1, #eps do
    local ep = eps[i]
    if ep.available then
      k = k - 1
      if k == 0 then
        return ep
      end
    end
  end
  return nil
end

function M.random(eps)
  local n = count(eps)
  if n == 0 then
    return nil
  end
  return nth(eps, atc.random(n))
end

local cursors = {} -- key -> index of the last pick; one entry per key a policy uses (a model name, say)

function M.round_robin(eps, key)
  key = key or ""
  local n = #eps
  local start = cursors[key] or 0
  for step = 1, n do
    local i = (start + step - 1) % n + 1
    if eps[i].available then
      cursors[key] = i
      return eps[i]
    end
  end
  return nil
end

function M.least_loaded(eps)
  return atc.least_loaded(eps)
end

function M.p2c(eps)
  return atc.p2c(eps)
end

function M.weighted(eps)
  local total = 0
  for i = 1, #eps do
    local ep = eps[i]
    if ep.available then
      total = total + (ep.weight or 1)
    end
  end
  if total <= 0 then
    return M.random(eps) -- every weight 0: no preference left to honour
  end
  local r = atc.random() * total
  local last
  for i = 1, #eps do
    local ep = eps[i]
    local w = ep.weight or 1
    if ep.available and w > 0 then
      last = ep
      r = r - w
      if r < 0 then
        return ep
      end
    end
  end
  return last -- rounding left r at 0
end

return M
