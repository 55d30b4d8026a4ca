-- scripts/policy.lua end to end: the three layers together, on fleets shaped like the examples.
local t = require "atc.testing"
local policy = require "policy"
local verdict = require "atc.verdict"

-- examples/quickstart.yaml: three llama-3-8b servers and one small model, no versions
local function quickstart()
  return t.fleet {
    { id = "llama-3-8b-sim-1", model = "llama-3-8b", capacity = 64 },
    { id = "llama-3-8b-sim-2", model = "llama-3-8b", capacity = 64 },
    { id = "llama-3-8b-sim-3", model = "llama-3-8b", capacity = 64 },
    { id = "qwen-2.5-1.5b-sim-1", model = "qwen-2.5-1.5b", capacity = 64 },
  }
end

-- examples/fleet.yaml: a v2 canary among the llama-3-8b servers, one large model
local function fleet_yaml()
  return t.fleet {
    { id = "llama-a", model = "llama-3-8b", capacity = 64, version = "v1", tags = { "small" } },
    { id = "llama-b", model = "llama-3-8b", capacity = 64, version = "v1", tags = { "small" } },
    { id = "llama-c", model = "llama-3-8b", capacity = 64, version = "v2", tags = { "small" } },
    { id = "big-a", model = "llama-3-70b", capacity = 32, tags = { "large" } },
  }
end

return {
  routes_the_quickstart = function()
    local f = quickstart()
    local counts = t.tally(300, function()
      return f:route(policy, t.request { model = "llama-3-8b", max_tokens = 16 })
    end)
    for i = 1, 3 do
      t.between(counts["llama-3-8b-sim-" .. i] or 0, 50, 150, "sim-" .. i)
    end
    t.is_endpoint(policy.route(t.request { model = "qwen-2.5-1.5b" }, f), "qwen-2.5-1.5b-sim-1")
  end,

  unknown_model_is_rejected = function()
    t.is_reject(policy.route(t.request { model = "nope" }, quickstart()), 404)
  end,

  auto_goes_by_size = function()
    local f = fleet_yaml()
    t.is_endpoint(policy.route(t.request { model = "auto", prompt_tokens = 9000 }, f), "big-a")
    local small = t.is_endpoint(policy.route(t.request { model = "auto", prompt_tokens = 100 }, f))
    t.eq(small.model, "llama-3-8b", "no qwen in this fleet: the next small target")
  end,

  canary_gets_its_share = function()
    local f = fleet_yaml()
    local counts = t.tally(4000, function(i)
      return policy.route(t.request { model = "llama-3-8b", session = "e2e-canary-" .. i }, f)
    end)
    t.between((counts["llama-c"] or 0) / 4000, 0.03, 0.07)
  end,

  everything_full_is_a_queue_verdict = function()
    local f = quickstart()
    for _, ep in ipairs(f:all()) do
      f:set(ep.id, { inflight = ep.capacity })
    end
    t.is_queue(policy.route(t.request { model = "llama-3-8b" }, f))
    t.is_queue(policy.route(t.request { model = "llama-3-8b", priority = 9 }, f))
    t.is_queue(policy.route(t.request { model = "llama-3-8b", session = "e2e-full-1", prompt_tokens = 3000 }, f))
    t.is_queue(policy.route(t.request { model = "auto" }, f))
  end,

  equal_queues_go_to_the_least_loaded = function()
    local f = quickstart()
    f:set("llama-3-8b-sim-1", { inflight = 30 })
    f:set("llama-3-8b-sim-2", { inflight = 4 })
    f:set("llama-3-8b-sim-3", { inflight = 12 })
    t.is_endpoint(policy.route(t.request { model = "llama-3-8b", priority = 9 }, f), "llama-3-8b-sim-2")
  end,

  cache_wins_until_the_queue_there_costs_more = function()
    local f = quickstart()
    f:set("llama-3-8b-sim-1", { overlap = 20, prefill_tokens = 1000 }) -- 20 blocks x 64 tokens cached
    f:set("llama-3-8b-sim-2", { prefill_tokens = 200 })
    f:set("llama-3-8b-sim-3", { prefill_tokens = 300 })
    local req = { model = "llama-3-8b", prompt_tokens = 2000 }
    t.is_endpoint(policy.route(t.request(req), f), "llama-3-8b-sim-1", "the cache saves more than the queue costs")
    f:set("llama-3-8b-sim-1", { prefill_tokens = 5000 })
    t.is_endpoint(policy.route(t.request(req), f), "llama-3-8b-sim-2", "a long queue there: the shortest elsewhere")
  end,

  never_returns_an_unavailable_endpoint = function()
    local f = t.fleet {
      { id = "a", model = "m", capacity = 3 },
      { id = "b", model = "m", capacity = 5, overlap = 4 },
      { id = "c", model = "m", capacity = 2, health = "draining" },
    }
    local open = {}
    for i = 1, 500 do
      local spec = { model = "m", priority = i % 10, prompt_tokens = (i % 3) * 400 }
      if i % 4 == 0 then
        spec.session = "e2e-avail-" .. (i % 7)
      end
      local req = t.request(spec)
      local v = policy.route(req, f)
      if verdict.kind(v) == "endpoint" then
        t.truthy(v.available, "chose " .. v.id .. " while it was not available")
        f:acquire(v)
        open[#open + 1] = v
      else
        t.is_queue(v)
      end
      if i % 3 == 0 and #open > 0 then
        f:release(table.remove(open, 1))
      end
    end
  end,

  init_runs = function()
    policy.init(quickstart()) -- logs that no endpoint serves llama-3-70b
  end,
}
