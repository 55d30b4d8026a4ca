-- Balancers: each picks one available endpoint from an array, or returns nil when none is available.
--
-- They take the engine's endpoints (then the host's C balancers do the work where one exists) or any
-- array of endpoint-like tables with the fields available, inflight, capacity and, where used,
-- weight, load and inflight_tokens (mock fleets in tests, a filtered copy).
--
--   random(eps)            uniform among available endpoints
--   round_robin(eps[, k])  the next available one after the last pick for key k (default "")
--   least_loaded(eps)      lowest inflight/capacity, then fewest tokens in flight
--   p2c(eps)               power of two choices: two distinct random ones, the lighter of the two
--   weighted(eps)          random, proportional to ep.weight

local M = {}

-- The engine hands out endpoints as userdata: the host balancers read them in C. Anything else goes
-- through the Lua versions below, which behave the same way.
local function native(eps)
  return type(eps[1]) == "userdata"
end
M.native = native

-- Share of capacity in use. The engine precomputes ep.load; endpoint-like tables may not.
local function load(ep)
  local l = ep.load
  if l ~= nil then
    return l
  end
  local c = ep.capacity or 0
  if c <= 0 then
    return math.huge
  end
  return ep.inflight / c
end
M.load = load

-- a is lighter than b: by load, then by tokens in flight (a long prompt weighs more than a short one).
local function lighter(a, b)
  local la, lb = load(a), load(b)
  if la ~= lb then
    return la < lb
  end
  return (a.inflight_tokens or 0) < (b.inflight_tokens or 0)
end
M.lighter = lighter

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
  if native(eps) then
    return atc.least_loaded(eps)
  end
  local best
  for i = 1, #eps do
    local ep = eps[i]
    if ep.available and (best == nil or lighter(ep, best)) then
      best = ep
    end
  end
  return best
end

function M.p2c(eps)
  if native(eps) then
    return atc.p2c(eps)
  end
  local n = count(eps)
  if n <= 1 then
    return nth(eps, 1)
  end
  -- two distinct positions among the available ones, then one pass to fetch both
  local a = atc.random(n)
  local b = atc.random(n - 1)
  if b >= a then
    b = b + 1
  end
  local x, y
  local k = 0
  for i = 1, #eps do
    local ep = eps[i]
    if ep.available then
      k = k + 1
      if k == a then
        x = ep
      elseif k == b then
        y = ep
      end
    end
  end
  if lighter(y, x) then
    return y
  end
  return x
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
