-- scripts/priority.lua: urgent requests to the least loaded, the rest spread by power of two choices.
local t = require "atc.testing"
local priority = require "priority"

local HIGH = priority.HIGH_PRIORITY + 1
local LOW = priority.HIGH_PRIORITY

local function loaded()
  return t.fleet {
    { id = "a", capacity = 8, inflight = 5 },
    { id = "b", capacity = 8, inflight = 2 },
    { id = "c", capacity = 8, inflight = 3 },
    { id = "d", capacity = 8, inflight = 0, health = "draining" },
  }
end

return {
  high_priority_takes_least_loaded = function()
    local f = loaded()
    for _ = 1, 50 do
      t.is_endpoint(priority.pick(t.request { priority = HIGH }, f:endpoints("m")), "b")
    end
  end,

  least_loaded_is_by_share_of_capacity = function()
    local f = t.fleet {
      { id = "small", capacity = 4, inflight = 2 },  -- half full
      { id = "big", capacity = 64, inflight = 10 },  -- a sixth full
    }
    t.is_endpoint(priority.pick(t.request { priority = 9 }, f:endpoints("m")), "big")
  end,

  high_priority_follows_load_as_it_changes = function()
    local f = t.fleet { { id = "a", capacity = 4 }, { id = "b", capacity = 4 } }
    local counts = t.tally(8, function()
      return f:route(function(req, fl) return priority.pick(req, fl:endpoints("m")) end, t.request { priority = 9 })
    end)
    t.eq(counts, { a = 4, b = 4 })
  end,

  low_priority_spreads = function()
    local f = t.fleet { { id = "a" }, { id = "b" }, { id = "c" }, { id = "d" } }
    local pool = f:endpoints("m")
    local counts = t.tally(2000, function() return priority.pick(t.request { priority = LOW }, pool) end)
    for _, id in ipairs { "a", "b", "c", "d" } do
      t.between(counts[id] or 0, 300, 700, "share of " .. id)
    end
  end,

  low_priority_never_takes_the_busiest = function()
    -- power of two choices: the heaviest endpoint loses every comparison
    local f = loaded()
    local pool = f:endpoints("m")
    local counts = t.tally(1000, function() return priority.pick(t.request { priority = 0 }, pool) end)
    t.eq(counts.a, nil, "a is the busiest")
    t.eq(counts.d, nil, "d is draining")
    t.truthy(counts.b and counts.c, "b and c both get some")
  end,

  low_priority_skips_unavailable = function()
    local f = t.fleet {
      { id = "a", available = false },
      { id = "b" },
      { id = "c", capacity = 2, inflight = 2 },
    }
    local counts = t.tally(200, function() return priority.pick(t.request {}, f:endpoints("m")) end)
    t.eq(counts, { b = 200 })
  end,

  everything_full_queues = function()
    local f = t.fleet { { id = "a", capacity = 1, inflight = 1 }, { id = "b", health = "ejected" } }
    t.is_queue(priority.pick(t.request { priority = 9 }, f:endpoints("m")))
    t.is_queue(priority.pick(t.request { priority = 0 }, f:endpoints("m")))
    t.is_queue(priority.pick(t.request {}, {}))
  end,
}
