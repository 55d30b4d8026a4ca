-- atc.fastest called again from inside itself: a mock's cached_tokens or prefix_overlap is Lua (as
-- atc.testing's mocks are), and may call atc.fastest. The nested call must read into columns of its own,
-- not into the outer call's snapshot (policy_fastest.c, fast_snap_take): a larger nested pool once
-- replaced the snapshot and let the collector free it under the outer call (a use after free), a smaller
-- one reused it, overwriting the outer call's columns and growing its runs past their end. Both calls
-- must pick what they would pick alone.
local t = require "atc.test"

local BODY = { model = "m", messages = { { role = "user", content = "hi" } } }

-- A pool of n mocks whose cost grows with the index (the first is the fastest), cached_tokens calling
-- nested (or nothing).
local function pool_of(n, step, nested)
  local pool = {}
  for i = 1, n do
    pool[i] = { inflight = i, capacity = 1000, prefill_tokens = i * step, decoding = i,
                cached_tokens = nested or function() return 0 end }
  end
  return pool
end

local function route(nested_pool, churn)
  local picks = {}
  t.route({ endpoints = { { id = "a" }, { id = "b" } }, body = BODY }, function(req, fleet)
    local keep
    local function nested()
      picks[#picks + 1] = atc.fastest(nested_pool, req)
      for i = 1, churn do -- garbage, so that the collector runs while the outer call reads
        keep = { i, tostring(i) }
      end
      return 0
    end
    local pool = pool_of(60, 13, nested)
    t.expect(atc.fastest(pool, req)).to_be(pool[1])
    t.expect(atc.fastest(pool, req)).to_be(pool[1]) -- a second call of the decision as well
    return atc.queue()
  end)
  t.expect(#picks).to_be(120)
  for i = 1, #picks do
    t.expect(picks[i]).to_be(nested_pool[1])
  end
end

t.test("a nested atc.fastest over a larger pool leaves the outer call's pool alone", function()
  route(pool_of(300, 7), 3000)
end)

t.test("a nested atc.fastest over a smaller pool leaves the outer call's pool alone", function()
  local small = pool_of(3, 1)
  for i = 1, 3 do -- costlier than any of the outer pool: read into the outer columns, they would win
    small[i].prefill_tokens = 1e9 + i
  end
  route(small, 0)
end)
