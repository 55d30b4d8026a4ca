-- scripts/affinity.lua: a session goes back to its endpoint while that endpoint's predicted first token
-- is within the slack of the fastest; otherwise it is pinned anew among the endpoints within the slack.
-- Session pins live in the engine's table for the whole run, so every test uses its own session names.
local t = require "atc.testing"
local affinity = require "affinity"

local function three()
  return t.fleet { { id = "a", capacity = 10 }, { id = "b", capacity = 10 }, { id = "c", capacity = 10 } }
end

local function pick(f, spec)
  return affinity.pick(t.request(spec), f:endpoints("m"))
end

-- prefill tokens that make an endpoint's predicted TTFT for a 1,000-token prompt `factor` times the
-- fastest's (an idle endpoint at the 15,000 tokens/s prior: 1000/15 + 12 ms) plus `plus_ms`
local function queued_for(factor, plus_ms)
  local best_ms = 1000 * 1000 / 15000 + 12
  return (best_ms * factor + plus_ms - 12) * 15 - 1000
end

return {
  no_session_no_opinion = function()
    t.eq(pick(three(), {}), nil)
    t.eq(pick(three(), { prompt_tokens = 5000 }), nil, "prefixes are priority.pick's to weigh")
  end,

  a_session_sticks_while_its_endpoint_is_within_the_slack = function()
    local f = three()
    local first = t.is_endpoint(pick(f, { session = "stick-1", prompt_tokens = 1000 })).id
    for i = 1, 50 do -- the others idle, its own queue grows but stays within the slack
      f:set(first, { prefill_tokens = queued_for(affinity.SESSION_SLACK, affinity.SESSION_SLACK_MS) * i / 60 })
      t.is_endpoint(pick(f, { session = "stick-1", prompt_tokens = 1000 }), first, "call " .. i)
    end
  end,

  a_session_moves_when_its_endpoint_is_much_slower = function()
    local f = three()
    local first = pick(f, { session = "slow-1", prompt_tokens = 1000 }).id
    f:set(first, { prefill_tokens = queued_for(affinity.SESSION_SLACK, affinity.SESSION_SLACK_MS) + 200 })
    local second = t.is_endpoint(pick(f, { session = "slow-1", prompt_tokens = 1000 })).id
    t.ne(second, first)
    f:set(first, { prefill_tokens = 0 })
    t.is_endpoint(pick(f, { session = "slow-1", prompt_tokens = 1000 }), second, "pinned to the new one now")
  end,

  a_session_moves_when_its_endpoint_is_full_or_gone = function()
    local f = three()
    local first = pick(f, { session = "full-1" }).id
    f:set(first, { inflight = 10 })
    local second = t.is_endpoint(pick(f, { session = "full-1" })).id
    t.ne(second, first)
    f:set(second, { available = false })
    local third = t.is_endpoint(pick(f, { session = "full-1" })).id
    t.ne(third, second)
  end,

  new_sessions_hash_over_the_near_endpoints = function()
    -- several replicas of atc agree: the pin is a hash of the session among the endpoints within the slack
    local f = three()
    local seen = {}
    for i = 1, 60 do
      seen[pick(f, { session = "spread-" .. i }).id] = true
    end
    t.truthy(seen.a and seen.b and seen.c, "sessions spread over every endpoint")
    f:set("c", { prefill_tokens = 1e6 }) -- far outside the slack: new sessions never go there
    for i = 1, 30 do
      t.ne(pick(f, { session = "far-" .. i }).id, "c")
    end
  end,

  tenants_have_their_own_sessions = function()
    local f = three()
    local a = pick(f, { session = "same", tenant = "t1" }).id
    f:set(a, { inflight = 10 })
    local b = pick(f, { session = "same", tenant = "t2" }).id
    t.ne(b, a)
    f:set(a, { inflight = 0 })
    t.is_endpoint(pick(f, { session = "same", tenant = "t1" }), a, "t1 keeps its own pin")
  end,

  the_index_decides_where_it_knows_the_cache = function()
    -- the pinned endpoint holds the prompt's prefix by the index: priority.pick weighs it (no opinion)
    local f = three()
    local first = t.is_endpoint(pick(f, { session = "known-1", prompt_tokens = 1000 })).id
    f:set(first, { overlap = 2 })
    t.eq(pick(f, { session = "known-1", prompt_tokens = 1000 }), nil)
    -- a new session whose prefix some endpoint holds: the same
    t.eq(pick(f, { session = "known-2", prompt_tokens = 1000 }), nil)
    -- the index knows nothing of the prompt (another replica routed it): the pin holds
    f:set(first, { overlap = 0 })
    t.is_endpoint(pick(f, { session = "known-1", prompt_tokens = 1000 }), first)
  end,

  the_pin_decides_past_what_the_index_sees = function()
    -- an agent's 100k-token prompts share their first 512 blocks (all the index hashes): the pinned
    -- endpoint holds them, so do the others, and only the pin knows where this session's context is
    local f = three()
    local long = { session = "agent-1", prompt_tokens = 100000, blocks = 512, block_tokens = 64 }
    local first = t.is_endpoint(pick(f, long)).id
    for _, id in ipairs { "a", "b", "c" } do
      f:set(id, { overlap = 512 })
    end
    for i = 1, 5 do
      t.is_endpoint(pick(f, long), first, "call " .. i)
    end
    -- a prompt the hashed blocks cover whole: the index tells, priority decides
    t.eq(pick(f, { session = "agent-1", prompt_tokens = 30000, blocks = 468, block_tokens = 64 }), nil)
  end,

  the_policy_pins_where_priority_sent_a_session = function()
    local policy = require "policy"
    for i = 1, 12 do -- (without the pin, consistent hashing would spread them over a, b and c)
      local f = t.fleet { { id = "a", model = "m" }, { id = "b", model = "m", overlap = 3 }, { id = "c", model = "m" } }
      local spec = { model = "m", session = "remember-" .. i, prompt_tokens = 1000, block_tokens = 64 }
      t.is_endpoint(policy.route(t.request(spec), f), "b", "where its cache is, by the index")
      f:set("b", { overlap = 0 }) -- then the index forgets: the pin sends the next turn back
      t.is_endpoint(policy.route(t.request(spec), f), "b", "session " .. i)
    end
  end,

  nothing_available_no_opinion = function()
    local f = t.fleet { { id = "a", available = false }, { id = "b", available = false } }
    t.eq(pick(f, { session = "none-1" }), nil)
  end,
}
