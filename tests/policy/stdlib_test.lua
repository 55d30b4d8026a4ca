-- stdlib/atc: balancers, consistent hashing, splits, verdicts, and the test helpers themselves.
-- The balancers get plain endpoint-like tables here (no methods, no precomputed load).
local t = require "atc.testing"
local balance = require "atc.balance"
local hash = require "atc.hash"
local split = require "atc.split"
local verdict = require "atc.verdict"

local function eps(list)
  local out = {}
  for i, e in ipairs(list) do
    out[i] = { id = e[1], inflight = e[2] or 0, capacity = e[3] or 10, weight = e[4] or 1,
               available = e.available ~= false and (e[2] or 0) < (e[3] or 10) }
  end
  return out
end

return {
  balancers_return_nil_when_nothing_is_available = function()
    local none = eps { { "a", 10, 10 }, { "b", 0, 10, available = false } }
    for _, name in ipairs { "random", "round_robin", "least_loaded", "p2c", "weighted" } do
      t.eq(balance[name](none), nil, name)
      t.eq(balance[name]({}), nil, name .. " on {}")
    end
  end,

  random_is_uniform_over_available = function()
    local pool = eps { { "a" }, { "b", 10, 10 }, { "c" } }
    local counts = t.tally(2000, function() return balance.random(pool) end)
    t.eq(counts.b, nil)
    t.between(counts.a, 850, 1150)
  end,

  round_robin_cycles_and_skips = function()
    local pool = eps { { "a" }, { "b", 0, 10, available = false }, { "c" }, { "d" } }
    local seq = {}
    for i = 1, 6 do
      seq[i] = balance.round_robin(pool, "rr-test").id
    end
    t.eq(seq, { "a", "c", "d", "a", "c", "d" })
  end,

  least_loaded_by_share = function()
    t.eq(balance.least_loaded(eps { { "a", 5, 10 }, { "b", 30, 100 }, { "c", 2, 4 } }).id, "b")
  end,

  p2c_prefers_the_lighter_of_two = function()
    local pool = eps { { "a", 1 }, { "b", 9 } }
    for _ = 1, 50 do
      t.eq(balance.p2c(pool).id, "a")
    end
    t.eq(balance.p2c(eps { { "only", 3 } }).id, "only")
  end,

  weighted_follows_weights = function()
    local pool = eps { { "a", 0, 10, 3 }, { "b", 0, 10, 1 }, { "z", 0, 10, 0 } }
    local counts = t.tally(4000, function() return balance.weighted(pool) end)
    t.eq(counts.z, nil, "weight 0 never")
    t.near(counts.a / 4000, 0.75, 0.04)
  end,

  rendezvous_is_stable_and_minimal = function()
    local pool = eps { { "a" }, { "b" }, { "c" }, { "d" } }
    local before = {}
    for i = 1, 400 do
      before[i] = hash.rendezvous(pool, "k" .. i).id
      t.eq(hash.rendezvous(pool, "k" .. i).id, before[i], "same key, same endpoint")
    end
    pool[2].available = false -- b goes away: only b's keys move
    local moved = 0
    for i = 1, 400 do
      local now = hash.rendezvous(pool, "k" .. i).id
      if before[i] == "b" then
        t.ne(now, "b")
        moved = moved + 1
      else
        t.eq(now, before[i], "key k" .. i .. " should not move")
      end
    end
    t.between(moved, 50, 150, "about a quarter of the keys were on b")
  end,

  rendezvous_weights = function()
    local pool = eps { { "a", 0, 10, 3 }, { "b", 0, 10, 1 } }
    local counts = t.tally(4000, function(i) return hash.rendezvous(pool, "w" .. i) end)
    t.near(counts.a / 4000, 0.75, 0.04)
  end,

  bounded_caps_every_endpoint = function()
    local f = t.fleet { { id = "a", capacity = 1000 }, { id = "b", capacity = 1000 }, { id = "c", capacity = 1000 } }
    -- every key hashes the same way: plain rendezvous would pile them on one endpoint
    for i = 1, 300 do
      local ep = hash.bounded(f:endpoints("m"), "same-key", 1.25)
      f:acquire(ep)
      local total = 0
      for _, e in ipairs(f:all()) do
        total = total + e.inflight
      end
      for _, e in ipairs(f:all()) do
        t.truthy(e.inflight <= math.ceil(1.25 * total / 3), "step " .. i .. ": " .. e.id .. " over the bound")
      end
    end
  end,

  bounded_keeps_keys_when_balanced = function()
    local pool = eps { { "a", 3 }, { "b", 3 }, { "c", 3 } }
    for i = 1, 100 do
      t.eq(hash.bounded(pool, "bk" .. i).id, hash.rendezvous(pool, "bk" .. i).id)
    end
  end,

  rendezvous_takes_the_old_argument_order_too = function()
    local pool = eps { { "a" }, { "b" }, { "c" } }
    for i = 1, 20 do
      t.eq(hash.rendezvous("o" .. i, pool).id, hash.rendezvous(pool, "o" .. i).id)
      t.eq(hash.bounded("o" .. i, pool).id, hash.bounded(pool, "o" .. i).id)
    end
  end,

  bounded_rejects_c_below_one = function()
    t.raises(function() hash.bounded(eps { { "a" } }, "k", 0.5) end, "c must be >= 1")
  end,

  split_is_deterministic_and_weighted = function()
    local w = { blue = 1, green = 3 }
    local n = 0
    for i = 1, 8000 do
      local side = split.pick("u" .. i, w)
      t.eq(split.pick("u" .. i, w), side)
      if side == "green" then
        n = n + 1
      end
    end
    t.near(n / 8000, 0.75, 0.03)
  end,

  split_zero_weight_never_chosen = function()
    for i = 1, 500 do
      t.eq(split.pick("z" .. i, { on = 0, off = 100 }), "off")
    end
  end,

  split_bad_weights_are_errors_not_crashes = function()
    local side, err = split.pick("k", {})
    t.eq(side, nil)
    t.truthy(err)
    side, err = split.pick("k", { a = "x" })
    t.eq(side, nil)
    t.truthy(err)
  end,

  split_notices_edited_weights = function()
    local w = { a = 100, b = 0 }
    t.eq(split.pick("edit", w), "a")
    w.a, w.b = 0, 100
    t.eq(split.pick("edit", w), "b")
  end,

  split_growing_moves_only_new_keys = function()
    local before = {}
    for i = 1, 2000 do
      before[i] = split.pick("g" .. i, { a = 95, b = 5 })
    end
    for i = 1, 2000 do
      if before[i] == "b" then
        -- keys already on b stay there when b grows; a 10% b only takes more of a's keys
        t.eq(split.pick("g" .. i, { a = 90, b = 10 }), "b")
      end
    end
  end,

  verdict_kinds = function()
    t.eq(verdict.kind(verdict.queue("x")), "queue")
    t.eq(verdict.kind(verdict.reject(429, "slow down")), "reject")
    t.eq(verdict.kind(verdict.model_not_found("m")), "reject")
    t.eq(verdict.kind({ id = "a" }), "endpoint")
    t.eq(verdict.kind(42), nil)
    t.eq(verdict.kind({}), nil)
  end,

  testing_assertions_fail_when_they_should = function()
    t.raises(function() t.eq(1, 2) end, "expected 2, got 1")
    t.raises(function() t.eq({ a = 1 }, { a = 2 }) end)
    t.eq({ a = { 1, 2 } }, { a = { 1, 2 } })
    t.raises(function() t.ne(3, 3) end)
    t.raises(function() t.truthy(nil) end)
    t.raises(function() t.falsy(0) end)
    t.raises(function() t.between(5, 1, 4) end)
    t.raises(function() t.near(1, 2, 0.5) end)
    t.raises(function() t.raises(function() end) end, "expected an error")
    t.raises(function() t.is_queue({ id = "a" }) end, "expected a queue verdict")
    t.raises(function() t.is_endpoint(verdict.queue()) end)
    t.raises(function() t.is_endpoint({ id = "a" }, "b") end, "expected endpoint b")
    t.raises(function() t.is_reject(verdict.reject(503, "x"), 429) end)
    t.raises(function() return atc.reject(999, "x") end, "atc.reject: status must be 400-599, got 999")
  end,

  mock_fleet_behaves_like_the_real_one = function()
    local f = t.fleet {
      { id = "a", model = "m", capacity = 2, inflight = 1, version = "v1", tags = { "small" }, overlap = 3 },
      { id = "b", model = "n" },
    }
    local a = f:endpoint("a")
    t.eq(a.load, 0.5)
    t.truthy(a.available)
    t.truthy(a:has_tag("small"))
    t.falsy(a:has_tag("large"))
    t.eq(a:prefix_overlap(t.request {}), 3)
    t.eq(t.ids(f:endpoints("m")), { "a" })
    t.eq(f:endpoints("zzz"), {})
    t.eq(t.ids(f:all()), { "a", "b" })
    t.eq(f:models(), { "m", "n" })
    t.eq(f:endpoint("nope"), nil)
    local list = f:endpoints("m")
    t.eq(f:endpoints("m"), list, "the same table each call, as the engine's")
    t.eq(f:all(), f:all())
    list[1] = nil
    t.raises(function() f:endpoints("m") end, "read-only")
    list[1] = f:endpoint("a")
    t.eq(f:endpoints("m"), list)
    f:acquire("a")
    t.falsy(a.available, "full")
    f:release(a)
    f:set("a", { health = "ejected" })
    t.falsy(a.available, "unhealthy")
    f:set("a", { health = "healthy", available = false })
    t.falsy(a.available, "forced off")
    f:set("a", { available = true, overlap = function(req) return req.blocks end })
    t.truthy(a.available)
    t.eq(a:prefix_overlap(t.request { prompt_tokens = 640 }), 10)
    t.raises(function() t.fleet { { id = "x" }, { id = "x" } } end, "duplicate")
  end,

  mock_request_fields = function()
    local r = t.request { model = "m", priority = 7, session = "s", headers = { ["X-Thing"] = 5 } }
    t.eq(r:header("x-thing"), "5")
    t.eq(r:header("X-THING"), "5")
    t.eq(r:header("missing"), nil)
    t.eq(r.priority, 7)
    t.eq(r.session, "s")
    t.eq(r.tenant, nil) -- not known: nil, as the engine says it
    t.eq(t.request {}.session, nil)
    t.eq(r.attempt, 1)
    t.eq(r.path, "/v1/chat/completions")
    t.ne(t.request {}.id, t.request {}.id)
  end,
}
