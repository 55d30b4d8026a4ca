-- The reference policies of examples/policies/ (reached through the tests/policy/refs link) pick what a
-- hand computation of their projects' formulas says, on small fake fleets; and each replays a trace
-- through the real runtime without errors.
local t = require "atc.test"
local dynamo = require "refs.dynamo_kv"
local sglang = require "refs.sglang_cache_aware"
local llmd = require "refs.llmd_weighted"
local loadaware = require "refs.vllm_loadaware"

-- A fake fleet with the engine's routing signals set (the mock endpoints do not carry them).
local function fleet(specs)
  local f = t.fleet(specs)
  for _, s in ipairs(specs) do
    f:set(s.id, {
      prefill_tokens = s.prefill_tokens or 0,
      prefilling = s.prefilling or 0,
      decoding = s.decoding or 0,
    })
  end
  return f
end

-- Dynamo ------------------------------------------------------------------------------------------

t.test("dynamo: the logit is prefill blocks (active + the prompt, minus overlap) plus decode blocks", function()
  -- 4096-token prompt in 512-token blocks: 8 blocks.
  --   a: (2048 + 4096) / 512 - 6 = 6 prefill, 10240 / 512 + (8 - 6) = 22 decode: 28
  --   b: (0 + 4096) / 512 - 0 = 8 prefill, 14336 / 512 + 8 = 36 decode: 44
  local f = fleet {
    { id = "a", overlap = 6, prefill_tokens = 2048, inflight_tokens = 10240, inflight = 2 },
    { id = "b", overlap = 0, inflight_tokens = 14336, inflight = 3 },
  }
  local req = t.request { prompt_tokens = 4096, block_tokens = 512 }
  t.expect(dynamo.logit(f:endpoint("a"), req)).to_be(28)
  t.expect(dynamo.logit(f:endpoint("b"), req)).to_be(44)
  t.expect(dynamo.route(req, f)).to_be_endpoint("a")
end)

t.test("dynamo: a prefill backlog outweighs the overlap credit", function()
  -- a's backlog of 12288 uncached tokens: (12288 + 4096) / 512 - 6 = 26, + 22 = 48 > b's 44
  local f = fleet {
    { id = "a", overlap = 6, prefill_tokens = 12288, inflight_tokens = 10240 },
    { id = "b", overlap = 0, inflight_tokens = 14336 },
  }
  local req = t.request { prompt_tokens = 4096, block_tokens = 512 }
  t.expect(dynamo.logit(f:endpoint("a"), req)).to_be(48)
  t.expect(dynamo.route(req, f)).to_be_endpoint("b")
end)

t.test("dynamo: an overlap past the prompt's end credits no more than the prompt", function()
  -- 4000 tokens, 8 overlap blocks = 4096 cached: raw (0 + 4096) / 512 = 8, adjusted 0; decode 0 + 0
  -- (its 7 full blocks are all among the overlap); with a request in flight, 1024 / 512 = 2
  local f = fleet { { id = "a", overlap = 8 } }
  local req = t.request { prompt_tokens = 4000, block_tokens = 512 }
  t.expect(dynamo.logit(f:endpoint("a"), req)).to_be(0)
  f:set("a", { inflight = 1, inflight_tokens = 1024 })
  t.expect(dynamo.logit(f:endpoint("a"), req)).to_be(2)
end)

t.test("dynamo: ties are broken at random, full endpoints are skipped, none with room queues", function()
  local f = fleet { { id = "a" }, { id = "b" }, { id = "c", inflight = 8, inflight_tokens = 0 } }
  local req = t.request { prompt_tokens = 1024, block_tokens = 64 }
  local counts = t.tally(200, function() return dynamo.route(req, f) end)
  t.expect(counts.a, "a").to_be_between(60, 140)
  t.expect(counts.b, "b").to_be_between(60, 140)
  t.expect(counts.c, "c").to_be_nil()
  local full = fleet { { id = "a", inflight = 8 } }
  t.expect(dynamo.route(req, full)).to_be_queue()
end)

-- SGLang ------------------------------------------------------------------------------------------

t.test("sglang: imbalance (max - min > 64 and max > 1.5 min) sends to the least loaded", function()
  local f = t.fleet {
    { id = "a", capacity = 128, inflight = 70, overlap = 16 },
    { id = "b", capacity = 128, inflight = 5 },
    { id = "c", capacity = 128, inflight = 6 },
  }
  local req = t.request { prompt_tokens = 1024, block_tokens = 64 }
  t.expect(sglang.route(req, f)).to_be_endpoint("b")
  f:set("b", { inflight = 6 }) -- 70 - 6 = 64: balanced, so the full match wins
  t.expect(sglang.route(req, f)).to_be_endpoint("a")
end)

t.test("sglang: a match above cache_threshold 0.3 wins, at or below it the least loaded does", function()
  local f = t.fleet { { id = "a", inflight = 5, overlap = 5 }, { id = "b", inflight = 1 } }
  local req = t.request { prompt_tokens = 1000, block_tokens = 64 }
  t.expect(sglang.route(req, f), "5 * 64 / 1000 = 0.32").to_be_endpoint("a")
  f:set("a", { overlap = 4 })
  t.expect(sglang.route(req, f), "4 * 64 / 1000 = 0.256").to_be_endpoint("b")
end)

t.test("sglang: requests without prefix blocks spread as the shortest queue does", function()
  local f = t.fleet { { id = "a" }, { id = "b" }, { id = "c" }, { id = "d" } }
  local counts = t.tally(12, function() return f:route(sglang, t.request { prompt_tokens = 3000, blocks = 0 }) end)
  t.expect(counts).to_equal { a = 3, b = 3, c = 3, d = 3 }
end)

-- llm-d -------------------------------------------------------------------------------------------

t.test("llmd: 2 * queue + 2 * (1 - kv) + 3 * prefix, the queue scaled between min and max", function()
  -- queues 4, 0, 2: queue scores 0, 1, 0.5; prefix of a = 2 * 64 / 1024 = 0.125
  --   a: 0 + 2 * 0.5 + 3 * 0.125 = 1.375; b: 2 + 2 * 0.1 = 2.2; c: 1 + 2 * 0.8 = 2.6
  local f = t.fleet {
    { id = "a", server_queue = 4, kv_usage = 0.5, overlap = 2 },
    { id = "b", server_queue = 0, kv_usage = 0.9 },
    { id = "c", server_queue = 2, kv_usage = 0.2 },
  }
  local req = t.request { prompt_tokens = 1024, block_tokens = 64 }
  t.expect(llmd.prefix_score(f:endpoint("a"), req)).to_be(0.125)
  t.expect(llmd.route(req, f)).to_be_endpoint("c")
  f:set("a", { overlap = 8 }) -- prefix 0.5: a = 1 + 1.5 = 2.5 < 2.6
  t.expect(llmd.route(req, f)).to_be_endpoint("c")
  f:set("a", { overlap = 9 }) -- prefix 0.5625: a = 1 + 1.6875 = 2.6875
  t.expect(llmd.route(req, f)).to_be_endpoint("a")
end)

t.test("llmd: the prefix index looks at the first 4096 tokens only", function()
  local f = t.fleet { { id = "a", overlap = 8 }, { id = "b", overlap = 7 } }
  local long = t.request { prompt_tokens = 20000, block_tokens = 512 }
  t.expect(llmd.prefix_score(f:endpoint("a"), long), "8 * 512 = 4096 of 4096").to_be(1)
  t.expect(llmd.prefix_score(f:endpoint("b"), long), "3584 of 4096").to_be(0.875)
  t.expect(llmd.prefix_score(f:endpoint("a"), t.request { prompt_tokens = 10, block_tokens = 512 })).to_be(0)
end)

t.test("llmd: servers not scraped yet read as an empty queue and an empty cache", function()
  local f = t.fleet { { id = "a" }, { id = "b", server_queue = 3, kv_usage = 0.1 } }
  local a = f:endpoint("a")
  a.queue, a.kv_usage = nil, nil -- as the engine shows them before the first scrape
  -- a: 2 * 1 + 2 * 1 = 4; b: 0 + 2 * 0.9 = 1.8
  t.expect(llmd.route(t.request {}, f)).to_be_endpoint("a")
end)

-- vLLM production-stack loadaware -----------------------------------------------------------------

t.test("loadaware: cached share of the prompt minus beta times load relative to the mean", function()
  -- loads 3, 2, 2: mean 7/3; a: 960/1000 - (3 - 7/3) / (7/3) = 0.96 - 2/7; b, c: 0 + 1/7
  local f = fleet {
    { id = "a", overlap = 15, prefilling = 1, decoding = 2 },
    { id = "b", prefilling = 2 },
    { id = "c", decoding = 2 },
  }
  local req = t.request { prompt_tokens = 1000, block_tokens = 64 }
  t.expect(loadaware.score(f:endpoint("a"), req, 7 / 3)).to_be_near(0.96 - 2 / 7, 1e-9)
  t.expect(loadaware.route(req, f)).to_be_endpoint("a")
  -- loads 4, 2, 1: mean 7/3; a: 0.96 - 5/7 = 0.246; b: 1/7 = 0.143; c: 4/7 = 0.571
  f:set("a", { decoding = 3 })
  f:set("c", { decoding = 1 })
  t.expect(loadaware.route(req, f)).to_be_endpoint("c")
end)

t.test("loadaware: a near-idle fleet divides by 1, not by its mean", function()
  -- loads 1, 0, 0, 0: mean 0.25, divisor 1; a: 1 - 0.75 = 0.25; the others 0.25: a tie, to the first id
  local f = fleet { { id = "d", prefilling = 1, overlap = 16 }, { id = "a" }, { id = "b" }, { id = "c" } }
  local req = t.request { prompt_tokens = 1024, block_tokens = 64 }
  t.expect(loadaware.score(f:endpoint("d"), req, 0.25)).to_be(0.25)
  t.expect(loadaware.score(f:endpoint("a"), req, 0.25)).to_be(0.25)
  t.expect(loadaware.route(req, f)).to_be_endpoint("a")
end)

t.test("loadaware: with nothing cached anywhere, an unused endpoint first, then the lowest QPS", function()
  local f = fleet { { id = "x" }, { id = "y" }, { id = "z" } }
  local req = t.request { prompt_tokens = 500, blocks = 0 }
  local order = {}
  for i = 1, 5 do
    order[i] = loadaware.route(req, f).id
  end
  t.expect(order).to_equal { "x", "y", "z", "x", "y" }
end)

-- the real runtime ------------------------------------------------------------------------------------

t.test("each reference replays a trace without a policy error", function()
  for _, name in ipairs { "dynamo_kv", "sglang_cache_aware", "llmd_weighted", "vllm_loadaware" } do
    local _, report = t.replay {
      trace = "tests/policy/fixtures/sessions.jsonl",
      fleet = { { model = "llama-3-8b", count = 3, max_seqs = 8, capacity = 8, prefill_tps = 15000 } },
      policy = "examples/policies/" .. name .. ".lua",
    }
    t.expect(report.completed, name .. " completed").to_be(274)
    t.expect(report.policy_errors, name .. " policy errors").to_be(0)
    t.expect(report.cache_hit_rate, name .. " cache hits").to_be_at_least(0.3)
  end
end)
