-- scripts/priority.lua: the soonest predicted first token, with cache credit; urgent requests take the
-- soonest first token alone; nothing available is a queue verdict. Mock endpoints (atc.testing) carry the
-- engine's signals as fields; atc.fastest reads them as it reads the engine's views.
local t = require "atc.testing"
local priority = require "priority"

-- a holds 100 blocks (6,400 tokens) of the request's 8,000-token prompt; b holds none
local function cached_vs_idle(queued_at_a)
  return t.fleet {
    { id = "a", capacity = 10, overlap = 100, prefill_tokens = queued_at_a },
    { id = "b", capacity = 10 },
  }
end

local REQ = { prompt_tokens = 8000, block_tokens = 64 }

return {
  the_shortest_prefill_queue_wins = function()
    local f = t.fleet { { id = "a", prefill_tokens = 30000 }, { id = "b", prefill_tokens = 2000 }, { id = "c", prefill_tokens = 9000 } }
    t.is_endpoint(priority.pick(t.request(REQ), f:endpoints("m")), "b")
  end,

  a_cached_prefix_wins_until_its_queue_costs_more = function()
    -- cost in tokens: a = queued + 1.5 x 1,600 uncached; b = 1.5 x 8,000. a wins while queued < 9,600.
    t.is_endpoint(priority.pick(t.request(REQ), cached_vs_idle(9000):endpoints("m")), "a")
    t.is_endpoint(priority.pick(t.request(REQ), cached_vs_idle(10000):endpoints("m")), "b")
  end,

  urgent_requests_take_the_soonest_first_token = function()
    -- urgent: a = queued + 1,600, b = 8,000: a only while queued < 6,400 (the cache is not valued beyond now)
    local urgent = { prompt_tokens = 8000, block_tokens = 64, priority = priority.HIGH_PRIORITY + 1 }
    t.is_endpoint(priority.pick(t.request(urgent), cached_vs_idle(6000):endpoints("m")), "a")
    t.is_endpoint(priority.pick(t.request(urgent), cached_vs_idle(8000):endpoints("m")), "b")
    t.is_endpoint(priority.pick(t.request(REQ), cached_vs_idle(8000):endpoints("m")), "a", "not urgent: the cache")
  end,

  a_smaller_decode_batch_breaks_a_tie = function()
    local f = t.fleet { { id = "a", decoding = 30 }, { id = "b", decoding = 2 }, { id = "c", decoding = 9 } }
    t.is_endpoint(priority.pick(t.request(REQ), f:endpoints("m")), "b")
  end,

  an_idle_pool_spreads = function()
    -- all tie: less recent work, then the lower in-flight share; f:route counts each pick in flight
    local f = t.fleet { { id = "a", capacity = 100 }, { id = "b", capacity = 100 }, { id = "c", capacity = 100 } }
    local counts = t.tally(240, function()
      return f:route(function(req, fleet) return priority.pick(req, fleet:endpoints("m")) end, t.request {})
    end)
    for _, id in ipairs { "a", "b", "c" } do
      t.between(counts[id] or 0, 70, 90, id)
    end
  end,

  never_an_unavailable_endpoint = function()
    -- (c's queue is short enough not to hold the request: late binding has its own tests below)
    local f = t.fleet { { id = "a", available = false }, { id = "b", capacity = 2, inflight = 2 }, { id = "c", prefill_tokens = 3000 } }
    t.is_endpoint(priority.pick(t.request(REQ), f:endpoints("m")), "c")
  end,

  late_binding_waits_while_every_prefill_queue_is_long = function()
    -- 15,000 tokens/s (the prior): HOLD_MS of prefill is HOLD_MS x 15 tokens
    local long = priority.HOLD_MS * 15 * 2
    local f = t.fleet { { id = "a", prefill_tokens = long }, { id = "b", prefill_tokens = long * 2 } }
    t.is_queue(priority.pick(t.request(REQ), f:endpoints("m")))
    t.is_endpoint(priority.pick(t.request { priority = 9 }, f:endpoints("m")), "a", "urgent: never held")
    f:set("b", { prefill_tokens = 0 })
    t.is_endpoint(priority.pick(t.request(REQ), f:endpoints("m")), "b", "b's queue drained: bound now")
  end,

  late_binding_then_picks_the_cache_among_them_all = function()
    -- b came free; a holds 6,400 of the 8,000 tokens and has less than HOLD_MS queued: the cache wins
    local f = t.fleet { { id = "a", overlap = 100, prefill_tokens = priority.HOLD_MS * 15 / 2 }, { id = "b" } }
    t.is_endpoint(priority.pick(t.request(REQ), f:endpoints("m")), "a")
  end,

  nothing_available_is_a_queue_verdict = function()
    local f = t.fleet { { id = "a", available = false }, { id = "b", capacity = 2, inflight = 2 } }
    t.is_queue(priority.pick(t.request {}, f:endpoints("m")))
    t.is_queue(priority.pick(t.request { priority = 9 }, f:endpoints("m")))
  end,
}
