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
local SHORT = { prompt_tokens = 1000, block_tokens = 64 } -- joins a queue: delays the prompt ahead 67 ms

return {
  the_shortest_prefill_queue_wins = function()
    local f = t.fleet { { id = "a", prefill_tokens = 30000 }, { id = "b", prefill_tokens = 2000 }, { id = "c", prefill_tokens = 9000 } }
    t.is_endpoint(priority.pick(t.request(SHORT), f:endpoints("m")), "b")
  end,

  a_cached_prefix_wins_until_its_queue_costs_more = function()
    -- cost in tokens: a = queued + 1.5 x 1,600 uncached + the 1,600 its prefill adds to the last step of
    -- the prompt ahead (STEP_TOKENS); b = 1.5 x 8,000. a wins while queued < 8,000.
    t.is_endpoint(priority.pick(t.request(REQ), cached_vs_idle(7000):endpoints("m")), "a")
    t.is_endpoint(priority.pick(t.request(REQ), cached_vs_idle(9000):endpoints("m")), "b")
  end,

  urgent_requests_take_the_soonest_first_token = function()
    -- urgent: a = queued + 1,600, b = 8,000: a only while queued < 6,400 (the cache is not valued beyond now)
    local urgent = { prompt_tokens = 8000, block_tokens = 64, priority = priority.HIGH_PRIORITY + 1 }
    t.is_endpoint(priority.pick(t.request(urgent), cached_vs_idle(6000):endpoints("m")), "a")
    t.is_endpoint(priority.pick(t.request(urgent), cached_vs_idle(8000):endpoints("m")), "b")
    t.is_endpoint(priority.pick(t.request(REQ), cached_vs_idle(8000):endpoints("m")), "a", "not urgent: the cache")
  end,

  a_burst_just_sent_to_the_holder_gives_the_next_request_to_a_cold_server = function()
    -- a holds 6,400 of the 8,000 tokens and has nothing queued, but was just sent R tokens (recent_tokens):
    -- a = 1.5 x 1,600 + RECENT x R, b = 1.5 x 8,000, so b from R = 9,600 / RECENT on (32,000 at 0.3)
    local function fleet(recent)
      return t.fleet { { id = "a", overlap = 100, recent_tokens = recent }, { id = "b" } }
    end
    local flip = 9600 / priority.RECENT
    t.is_endpoint(priority.pick(t.request(REQ), fleet(flip / 2):endpoints("m")), "a", "a short burst: the cache")
    t.is_endpoint(priority.pick(t.request(REQ), fleet(flip * 2):endpoints("m")), "b", "a hot holder: the cold one")
  end,

  a_full_decode_batch_gives_a_request_to_an_empty_one_unless_its_cache_saves_more = function()
    -- a holds 6,400 of 8,000 tokens: 1.5 x 1,600 tokens (160 ms) + a 12 ms step per request decoding there,
    -- against b's 1.5 x 8,000 (800 ms): a while fewer than 54 decode there
    local function fleet(decoding)
      return t.fleet { { id = "a", overlap = 100, decoding = decoding }, { id = "b" } }
    end
    t.is_endpoint(priority.pick(t.request(REQ), fleet(20):endpoints("m")), "a")
    t.is_endpoint(priority.pick(t.request(REQ), fleet(64):endpoints("m")), "b")
  end,

  urgent_requests_weigh_their_first_token_alone = function()
    -- a's first token comes 20 ms before b's (a: 5,800 queued + 1,600 uncached; b: 8,000 of 15,000 a second
    -- minus 300), whatever the 64 requests decoding there
    local f = t.fleet { { id = "a", overlap = 100, prefill_tokens = 5800, decoding = 64 }, { id = "b", prefill_tokens = 300 } }
    t.is_endpoint(priority.pick(t.request { prompt_tokens = 8000, block_tokens = 64, priority = 9 }, f:endpoints("m")), "a")
  end,

  one_busy_server_beside_new_ones_is_not_a_congested_pool = function()
    -- a holds the prefix and 15 requests' prefill (30,000 tokens of 2,000 each); b was never sent anything.
    -- Read as a congested pool (15 requests queued) the cache weight would be 16 and keep the request on a;
    -- b is idle and starts it now.
    local f = t.fleet { { id = "a", overlap = 100, prefill_tokens = 30000, uncached_mean = 2000 }, { id = "b" } }
    t.is_endpoint(priority.pick(t.request(REQ), f:endpoints("m")), "b")
    -- b was sent requests before (2,000 tokens each) and is idle now: the pool holds 7.5 requests per
    -- endpoint, weight 8.5: a = 30,000 + 8.5 x 1,600 + 1,600 (the step it shares) = 45,200 tokens of
    -- prefill, b = 8.5 x 8,000 = 68,000
    f:set("b", { uncached_mean = 2000 })
    t.is_endpoint(priority.pick(t.request(REQ), f:endpoints("m")), "a", "a congested pool: the cache")
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
    -- (c's queue is short enough not to hold a short request: late binding has its own tests below)
    local f = t.fleet { { id = "a", available = false }, { id = "b", capacity = 2, inflight = 2 }, { id = "c", prefill_tokens = 3000 } }
    t.is_endpoint(priority.pick(t.request(SHORT), f:endpoints("m")), "c")
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

  late_binding_keeps_a_long_prompt_out_of_the_last_step_of_the_one_ahead = function()
    -- a has 100 ms of prefill queued. The 8,000-token prompt sent there would join the last iteration of
    -- the prompt ahead and delay its first token by 533 ms (STEP_TOKENS): it waits in atc's queue, and
    -- gets its own first token no later for it. A short one delays it 67 ms: it goes now.
    local f = t.fleet { { id = "a", prefill_tokens = 1500 }, { id = "b", prefill_tokens = 3000 } }
    t.is_queue(priority.pick(t.request(REQ), f:endpoints("m")))
    t.is_endpoint(priority.pick(t.request(SHORT), f:endpoints("m")), "a")
    f:set("a", { prefill_tokens = 0 })
    t.is_endpoint(priority.pick(t.request(REQ), f:endpoints("m")), "a", "a's prompt done: bound now")
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
