-- scripts/capability.lua: aliases, tags, the sticky version split and its fallback.
local t = require "atc.testing"
local capability = require "capability"

local function fleet()
  return t.fleet {
    { id = "q1", model = "qwen-2.5-1.5b", capacity = 8 },
    { id = "l1", model = "llama-3-8b", version = "v1", tags = { "small" } },
    { id = "l2", model = "llama-3-8b", version = "v1", tags = { "small", "h100" } },
    { id = "l3", model = "llama-3-8b", version = "v2", tags = { "small" } },
    { id = "b1", model = "llama-3-70b", tags = { "large" } },
  }
end

local function model_of(pool)
  return pool[1].model
end

-- the share of 10,000 sessions whose pool is the v2 side
local function v2_share(f)
  local n = 0
  for i = 1, 10000 do
    local pool = capability.candidates(t.request { model = "llama-3-8b", session = "share-" .. i }, f)
    if pool[1].version == "v2" then
      n = n + 1
    end
  end
  return n / 10000
end

return {
  plain_model_gives_its_endpoints = function()
    local pool = capability.candidates(t.request { model = "qwen-2.5-1.5b" }, fleet())
    t.eq(t.ids(pool), { "q1" })
  end,

  unknown_model_is_a_404 = function()
    local pool, v = capability.candidates(t.request { model = "gpt-9" }, fleet())
    t.falsy(pool)
    t.is_reject(v, 404)
    t.truthy(string.find(v.message, "gpt-9", 1, true), "the message names the model")
  end,

  auto_short_prompt_is_small = function()
    local pool = capability.candidates(t.request { model = "auto", prompt_tokens = 200 }, fleet())
    t.eq(model_of(pool), "qwen-2.5-1.5b")
  end,

  auto_long_prompt_is_large = function()
    local pool = capability.candidates(t.request { model = "auto", prompt_tokens = 6000 }, fleet())
    t.eq(model_of(pool), "llama-3-70b")
  end,

  auto_reasoning_or_tools_header_is_large = function()
    local f = fleet()
    local r = t.request { model = "auto", prompt_tokens = 50, headers = { ["X-ATC-Reasoning"] = "1" } }
    t.eq(model_of(capability.candidates(r, f)), "llama-3-70b", "reasoning")
    r = t.request { model = "auto", prompt_tokens = 50, headers = { ["x-atc-tools"] = "true" } }
    t.eq(model_of(capability.candidates(r, f)), "llama-3-70b", "tools")
    r = t.request { model = "auto", prompt_tokens = 50, headers = { ["x-atc-reasoning"] = "0" } }
    t.eq(model_of(capability.candidates(r, f)), "qwen-2.5-1.5b", "a header set to 0 is off")
  end,

  auto_tool_use_is_large = function()
    local r = t.request { model = "auto", prompt_tokens = 50, tools = true }
    t.eq(model_of(capability.candidates(r, fleet())), "llama-3-70b")
  end,

  auto_long_answer_is_large = function()
    local pool = capability.candidates(t.request { model = "auto", prompt_tokens = 50, max_tokens = 8000 }, fleet())
    t.eq(model_of(pool), "llama-3-70b")
  end,

  alias_falls_back_to_next_target_with_endpoints = function()
    local f = t.fleet { { id = "l1", model = "llama-3-8b" } } -- neither qwen nor 70b here
    t.eq(model_of(capability.candidates(t.request { model = "auto", prompt_tokens = 10 }, f)), "llama-3-8b")
    t.eq(model_of(capability.candidates(t.request { model = "auto", prompt_tokens = 9000 }, f)), "llama-3-8b")
  end,

  alias_without_any_target_is_a_404 = function()
    local _, v = capability.candidates(t.request { model = "auto" }, t.fleet { { id = "x", model = "other" } })
    t.is_reject(v, 404)
  end,

  tags_header_keeps_matching_endpoints = function()
    local f = fleet()
    local pool = capability.candidates(t.request { model = "llama-3-8b", session = "tags-1",
                                                   headers = { ["x-atc-tags"] = "small, h100" } }, f)
    t.eq(t.ids(pool), { "l2" })
  end,

  tags_choose_among_alias_targets = function()
    -- auto/small prefers qwen, but only llama endpoints carry "small"
    local pool = capability.candidates(t.request { model = "auto", prompt_tokens = 10, session = "tags-2",
                                                   headers = { ["x-atc-tags"] = "small" } }, fleet())
    t.eq(model_of(pool), "llama-3-8b")
  end,

  tags_nobody_has_is_a_reject = function()
    local pool, v = capability.candidates(t.request { model = "llama-3-8b", headers = { ["x-atc-tags"] = "tpu" } }, fleet())
    t.falsy(pool)
    t.is_reject(v, 404)
  end,

  split_is_sticky_per_session = function()
    local f = fleet()
    for s = 1, 20 do
      local first = capability.candidates(t.request { model = "llama-3-8b", session = "sticky-" .. s }, f)[1].version
      for _ = 1, 100 do
        local v = capability.candidates(t.request { model = "llama-3-8b", session = "sticky-" .. s }, f)[1].version
        t.eq(v, first, "session sticky-" .. s)
      end
    end
  end,

  split_without_session_uses_request_id = function()
    local f = fleet()
    local seen = {}
    for i = 1, 2000 do
      local pool = capability.candidates(t.request { model = "llama-3-8b", id = "rid-" .. i }, f)
      seen[pool[1].version] = true
      local again = capability.candidates(t.request { model = "llama-3-8b", id = "rid-" .. i }, f)
      t.eq(again[1].version, pool[1].version, "same request id, same side")
    end
    t.truthy(seen.v1 and seen.v2, "both sides get some requests")
  end,

  split_share_is_about_right = function()
    local w = capability.SPLITS["*"]
    local expected = w.v2 / (w.v1 + w.v2)
    t.near(v2_share(fleet()), expected, 0.02)
  end,

  split_share_follows_the_knob = function()
    local w = capability.SPLITS["*"]
    local v1, v2 = w.v1, w.v2
    w.v1, w.v2 = 50, 50
    local ok, err = pcall(function() t.near(v2_share(fleet()), 0.5, 0.03) end)
    w.v1, w.v2 = v1, v2
    if not ok then
      error(err, 0)
    end
  end,

  split_side_pools_hold_one_version = function()
    local f = fleet()
    for i = 1, 300 do
      local pool = capability.candidates(t.request { model = "llama-3-8b", session = "side-" .. i }, f)
      local v = pool[1].version
      for _, ep in ipairs(pool) do
        t.eq(ep.version, v)
      end
      t.eq(#pool, v == "v1" and 2 or 1)
    end
  end,

  canary_unavailable_falls_back_to_stable = function()
    local f = fleet()
    -- find sessions on the canary side first
    local canary = {}
    for i = 1, 2000 do
      local s = "canary-" .. i
      if capability.candidates(t.request { model = "llama-3-8b", session = s }, f)[1].version == "v2" then
        canary[#canary + 1] = s
      end
    end
    t.truthy(#canary > 0, "some sessions on v2")
    f:set("l3", { health = "ejected" })
    for _, s in ipairs(canary) do
      local pool = capability.candidates(t.request { model = "llama-3-8b", session = s }, f)
      t.eq(t.ids(pool), { "l1", "l2" }, s)
    end
    f:set("l3", { health = "healthy", inflight = 8 }) -- full counts as not available too
    local pool = capability.candidates(t.request { model = "llama-3-8b", session = canary[1] }, f)
    t.eq(t.ids(pool), { "l1", "l2" })
    f:set("l3", { inflight = 0 })
    pool = capability.candidates(t.request { model = "llama-3-8b", session = canary[1] }, f)
    t.eq(t.ids(pool), { "l3" }, "back on the canary once it has room")
  end,

  endpoints_without_version_are_stable = function()
    local f = t.fleet { { id = "a", model = "m" }, { id = "b", model = "m" } }
    for i = 1, 500 do
      t.eq(#capability.candidates(t.request { model = "m", session = "nov-" .. i }, f), 2)
    end
  end,

  init_check_names_missing_alias_targets = function()
    local problems = capability.check(t.fleet { { id = "q1", model = "qwen-2.5-1.5b" }, { id = "l", model = "llama-3-8b" } })
    t.eq(#problems, 1)
    t.truthy(string.find(problems[1], "llama-3-70b", 1, true))
  end,
}
