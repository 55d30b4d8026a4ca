-- scripts/affinity.lua: session pins with a load guard, prefix affinity with an imbalance guard.
-- Session pins live in the engine's table for the whole run, so every test uses its own session names.
local t = require "atc.testing"
local affinity = require "affinity"

local function three(cap)
  return t.fleet { { id = "a", capacity = cap or 10 }, { id = "b", capacity = cap or 10 }, { id = "c", capacity = cap or 10 } }
end

local function pick(f, spec)
  return affinity.pick(t.request(spec), f:endpoints("m"))
end

-- the other endpoints' ids
local function others(id)
  local out = {}
  for _, x in ipairs { "a", "b", "c" } do
    if x ~= id then
      out[#out + 1] = x
    end
  end
  return out
end

return {
  no_session_no_prefix_no_opinion = function()
    t.eq(pick(three(), {}), nil)
    t.eq(pick(three(), { prompt_tokens = 5000 }), nil, "long prompt but nothing cached anywhere")
  end,

  session_sticks = function()
    local f = three()
    local first = t.is_endpoint(pick(f, { session = "stick-1" })).id
    for i = 1, 100 do
      -- load moves around on the others; the session stays while its endpoint is under the guard
      if i % 10 == 0 then
        f:acquire(others(first)[1])
      end
      t.is_endpoint(pick(f, { session = "stick-1" }), first, "call " .. i)
    end
    f:set(first, { inflight = 5 }) -- half full: still under the guard
    t.is_endpoint(pick(f, { session = "stick-1" }), first)
  end,

  session_repins_when_its_endpoint_is_full = function()
    local f = three()
    local first = pick(f, { session = "full-1" }).id
    f:set(first, { inflight = 10 })
    local second = t.is_endpoint(pick(f, { session = "full-1" })).id
    t.ne(second, first)
    f:set(first, { inflight = 0 })
    t.is_endpoint(pick(f, { session = "full-1" }), second, "re-pinned: stays on the new endpoint")
  end,

  session_repins_above_the_load_guard = function()
    local f = three(100)
    local first = pick(f, { session = "guard-1" }).id
    f:set(first, { inflight = math.floor(affinity.SESSION_MAX_LOAD * 100) })
    t.is_endpoint(pick(f, { session = "guard-1" }), first, "at the guard: stays")
    f:set(first, { inflight = math.floor(affinity.SESSION_MAX_LOAD * 100) + 1 })
    local second = t.is_endpoint(pick(f, { session = "guard-1" })).id
    t.ne(second, first, "above the guard: leaves")
  end,

  session_stays_above_guard_when_nothing_else_has_room = function()
    local f = three(100)
    local first = pick(f, { session = "guard-2" }).id
    for _, id in ipairs(others(first)) do
      f:set(id, { inflight = 100 })
    end
    f:set(first, { inflight = 95 })
    t.is_endpoint(pick(f, { session = "guard-2" }), first)
  end,

  session_repins_when_its_endpoint_is_unhealthy = function()
    local f = three()
    local first = pick(f, { session = "sick-1" }).id
    f:set(first, { health = "ejected" })
    local second = t.is_endpoint(pick(f, { session = "sick-1" })).id
    t.ne(second, first)
  end,

  session_repins_when_its_endpoint_left_the_pool = function()
    local f = t.fleet { { id = "x1", model = "x" }, { id = "y1", model = "y" } }
    t.is_endpoint(affinity.pick(t.request { session = "move-1" }, f:endpoints("x")), "x1")
    t.is_endpoint(affinity.pick(t.request { session = "move-1" }, f:endpoints("y")), "y1")
  end,

  sessions_of_other_tenants_are_apart = function()
    local f = t.fleet { { id = "a" }, { id = "b" } }
    local x = pick(f, { session = "tenant-1", tenant = "acme" }).id
    f:set(x, { inflight = 8 })
    -- the same session name under another tenant: placed elsewhere, without moving acme's pin
    t.ne(pick(f, { session = "tenant-1", tenant = "beta" }).id, x)
    f:set(x, { inflight = 0 })
    t.is_endpoint(pick(f, { session = "tenant-1", tenant = "acme" }), x)
  end,

  new_sessions_spread_with_bounded_load = function()
    local f = t.fleet { { id = "a", capacity = 1000 }, { id = "b", capacity = 1000 },
                        { id = "c", capacity = 1000 }, { id = "d", capacity = 1000 } }
    local counts = t.tally(400, function(i)
      local ep = pick(f, { session = "spread-" .. i })
      f:acquire(ep)
      return ep
    end)
    for _, id in ipairs { "a", "b", "c", "d" } do
      -- fair share 100; the bound (1.25x) caps each at 125 and hashing leaves none idle
      t.between(counts[id] or 0, 50, 126, "sessions on " .. id)
    end
  end,

  prefix_picks_best_overlap = function()
    local f = t.fleet {
      { id = "a", overlap = 2 },
      { id = "b", overlap = 9 },
      { id = "c", overlap = 4 },
    }
    for _ = 1, 20 do
      t.is_endpoint(pick(f, { prompt_tokens = 1000 }), "b")
    end
  end,

  prefix_tie_goes_to_lighter = function()
    local f = t.fleet { { id = "a", overlap = 6, inflight = 3 }, { id = "b", overlap = 6, inflight = 1 } }
    t.is_endpoint(pick(f, { prompt_tokens = 1000 }), "b")
  end,

  prefix_ignores_unavailable_best = function()
    local f = t.fleet { { id = "a", overlap = 9, capacity = 2, inflight = 2 }, { id = "b", overlap = 5 } }
    t.is_endpoint(pick(f, { prompt_tokens = 1000 }), "b")
  end,

  prefix_below_minimum_has_no_opinion = function()
    local f = t.fleet { { id = "a", overlap = affinity.PREFIX_MIN_BLOCKS - 1 }, { id = "b" } }
    t.eq(pick(f, { prompt_tokens = 1000 }), nil)
  end,

  prefix_used_at_low_load = function()
    -- an idle endpoint beside a slightly busy one is no reason to give up the cache
    local f = t.fleet { { id = "a", overlap = 8, capacity = 64, inflight = 3 }, { id = "b", capacity = 64 } }
    t.is_endpoint(pick(f, { prompt_tokens = 1000 }), "a")
  end,

  imbalance_guard_overrides_prefix = function()
    local abs, rel = affinity.BALANCE_ABS, affinity.BALANCE_REL
    local lo = 10
    local hi = math.max(lo + abs + 1, math.floor(rel * lo) + 1)
    local f = t.fleet {
      { id = "a", overlap = 8, capacity = 200, inflight = hi },
      { id = "b", capacity = 200, inflight = lo },
      { id = "c", capacity = 200, inflight = lo + 2 },
    }
    t.eq(pick(f, { prompt_tokens = 1000 }), nil, "imbalanced: no opinion, priority balances")
    f:set("a", { inflight = lo + abs }) -- within the absolute threshold
    t.is_endpoint(pick(f, { prompt_tokens = 1000 }), "a", "balanced again: the cache wins")
  end,

  imbalance_needs_both_thresholds = function()
    -- a big absolute gap that is a small relative one (200 vs 180) is still balanced
    local f = t.fleet {
      { id = "a", overlap = 8, capacity = 400, inflight = 200 },
      { id = "b", capacity = 400, inflight = 180 },
    }
    t.is_endpoint(pick(f, { prompt_tokens = 1000 }), "a")
  end,

  new_session_is_pinned_where_its_prefix_is = function()
    local f = t.fleet { { id = "a" }, { id = "b", overlap = 7 }, { id = "c" } }
    t.is_endpoint(pick(f, { session = "prefix-pin-1", prompt_tokens = 1000 }), "b")
    f:set("b", { overlap = 0 })
    t.is_endpoint(pick(f, { session = "prefix-pin-1", prompt_tokens = 1000 }), "b", "the pin holds")
  end,

  nothing_available_no_opinion = function()
    local f = t.fleet { { id = "a", capacity = 1, inflight = 1, overlap = 5 }, { id = "b", health = "down" } }
    t.eq(pick(f, { session = "none-1", prompt_tokens = 1000 }), nil)
    t.eq(pick(f, { prompt_tokens = 1000 }), nil)
  end,
}
