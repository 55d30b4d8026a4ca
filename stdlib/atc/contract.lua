-- The policy contract: every field and function a policy sees, in one place. This file is the source:
--   * the tables in scripts/README.md ("The contract") are generated from it (`atc test --contract`
--     prints them; tests/policy/contract_docs.py checks, or with --write rewrites, the README);
--   * atc.testing builds its mock requests and endpoints from it (a spec field it does not list is an
--     error), and tests/policy/contract_test.lua checks the mocks against it;
--   * tests/policy/contract_test.lua checks every entry against the engine's own views (t.route runs a
--     decision on a real parsed request and a real endpoint table).
--
-- One rule for "not known yet": nil. A field with `nil_when` is nil exactly then; every other field is
-- always set. Types: string, integer, number, boolean, or T[] (an array of T).

local M = {}

M.NOTE = "nil means not known yet (never \"\" or 0); a field without a \"nil when\" is always set."

-- req: the request being decided (read-only; valid only during its own decision).
M.req = {
  { name = "id", type = "string", doc = "the client's `x-request-id`, else one atc makes" },
  { name = "model", type = "string", mock = "m", doc = "the body's `model`, as the client sent it (an alias such as `auto` included)" },
  { name = "kind", type = "string", mock = "chat", doc = "`\"chat\"`, `\"completion\"` or `\"embedding\"`, from the path" },
  { name = "path", type = "string", doc = "`/v1/chat/completions`, `/v1/completions` or `/v1/embeddings`" },
  { name = "priority", type = "integer", unit = "0-9", mock = 0, doc = "`x-atc-priority`; 0 without it" },
  { name = "tenant", type = "string", nil_when = "no `x-atc-tenant`", doc = "`x-atc-tenant`" },
  { name = "session", type = "string", nil_when = "neither header nor `user`", doc = "`x-atc-session`, else the body's `user`" },
  { name = "stream", type = "boolean", mock = false, doc = "the body's `\"stream\": true`" },
  { name = "prompt_tokens", type = "integer", unit = "tokens", mock = 100, doc = "estimate: about 4 bytes of `messages` / `prompt` / `input` a token" },
  { name = "max_tokens", type = "integer", unit = "tokens", nil_when = "the body sets neither", doc = "`max_tokens`, else `max_completion_tokens`" },
  { name = "n", type = "integer", mock = 1, doc = "the body's `n`, the choices asked for (1 without it; a wrong one counts as 1): the server runs a sequence for each" },
  { name = "attempt", type = "integer", mock = 1, doc = "1 on the first try, n on the n-th (endpoints already tried are then not `available`)" },
  { name = "blocks", type = "integer", unit = "blocks", doc = "full 256-byte blocks of the prompt, hashed for prefix affinity (at most 512)" },
  { name = "block_tokens", type = "integer", unit = "tokens", mock = 64, doc = "tokens one block covers: 64 live; the trace's under replay (512 for Mooncake)" },
  { name = "tools", type = "boolean", mock = false, doc = "the body has a non-empty `tools` array" },
  { name = "header", kind = "method", args = "name", type = "string", nil_when = "no such header", doc = "a request header, by case-insensitive name; under replay, those the trace recorded (`record.headers`)" },
}

-- fleet: the endpoint table.
M.fleet = {
  { name = "endpoints", kind = "method", args = "model", type = "endpoint[]", doc = "the model's endpoints: an engine list, the same array on every call until the set of endpoints changes (a config reload, an endpoint added or removed: the policy gets a new `fleet` then); read-only, shared by every decision (copy it into a new table to change it; a list whose length changed raises); the host functions read it in C (`{}`, a new one, for an unknown model)" },
  { name = "all", kind = "method", args = "", type = "endpoint[]", doc = "every endpoint: an engine list, as `endpoints`" },
  { name = "models", kind = "method", args = "", type = "string[]", doc = "the model names" },
  { name = "endpoint", kind = "method", args = "id", type = "endpoint", nil_when = "no such id", doc = "one endpoint" },
}

-- ep: one endpoint (read-only view of the engine's live table; the same table for the same endpoint).
M.ep = {
  { name = "id", type = "string", doc = "its `id` in the config" },
  { name = "model", type = "string", mock = "m", doc = "the model it serves" },
  { name = "version", type = "string", nil_when = "none configured", doc = "its `version`" },
  { name = "tags", type = "string[]", mock = {}, doc = "its `tags` (a new array each read)" },
  { name = "weight", type = "integer", mock = 1, doc = "its `weight`" },
  { name = "role", type = "string", mock = "both", doc = "its `role`: `\"prefill\"`, `\"decode\"` or `\"both\"` (the default); in a model with `disaggregation:`, route returns `{prefill = ep, decode = ep}` (see the return values below)" },
  { name = "capacity", type = "integer", unit = "requests", mock = 8, doc = "its configured `capacity`" },
  { name = "inflight", type = "integer", unit = "requests", mock = 0, doc = "requests atc routed there that have not finished; with `cluster:`, every replica's (this one's + `remote_inflight`)" },
  { name = "inflight_tokens", type = "integer", unit = "tokens", mock = 0, doc = "their prompt estimates + `max_tokens` per choice (`n`; every replica's, as `inflight`)" },
  { name = "load", type = "number", unit = "share", derived = true, doc = "`inflight` / the capacity offered now (less while slow-starting)" },
  { name = "remote_inflight", type = "integer", unit = "requests", mock = 0, doc = "cluster: the part of `inflight` other replicas routed there, as they last published it (0 without a cluster, in local mode, or when no other replica publishes)" },
  { name = "remote_tokens", type = "integer", unit = "tokens", mock = 0, doc = "cluster: the part of `inflight_tokens` other replicas routed there" },
  { name = "remote_prefill_tokens", type = "integer", unit = "tokens", mock = 0, doc = "cluster: the part of `prefill_tokens` other replicas sent there (also counted by `predict_ttft` and `atc.fastest`)" },
  { name = "remote_age", type = "number", unit = "ms", nil_when = "no other replica's figures (no cluster, local mode, none publishing)", doc = "cluster: how old the oldest of the remote figures is (a replica silent for 4 `sync_interval`s is left out)" },
  { name = "available", type = "boolean", derived = true, doc = "routable, has room (capacity, `token_budget`, `max_server_queue`: this replica's own slots), not tried yet by this request" },
  { name = "health", type = "string", mock = "healthy", doc = "`\"healthy\"`, `\"starting\"`, `\"unhealthy\"`, `\"ejected\"` or `\"draining\"`" },
  { name = "consecutive_failures", type = "integer", unit = "probes", mock = 0, doc = "failed health probes in a row" },
  { name = "last_error", type = "string", nil_when = "no probe has failed", doc = "the last failed probe or ejection, with why" },
  { name = "last_check", type = "number", unit = "ms, `atc.now()`'s clock", nil_when = "before the first probe", doc = "when it was last probed" },
  { name = "errors", type = "integer", unit = "requests", mock = 0, doc = "connection failures, timeouts and 5xx answers so far" },
  { name = "ttft_ewma", type = "number", unit = "ms", nil_when = "before its first answer", doc = "moving average of its time to first byte" },
  { name = "running", type = "number", unit = "requests", nil_when = "never scraped", doc = "server-reported: requests being generated" },
  { name = "server_queue", type = "number", unit = "requests", nil_when = "never scraped", doc = "server-reported: requests waiting inside the server (not atc's queue: that is `atc.queue()`)" },
  { name = "kv_usage", type = "number", unit = "share 0..1", nil_when = "never scraped", doc = "server-reported: KV cache in use" },
  { name = "prefix_hit_rate", type = "number", unit = "share 0..1", nil_when = "never scraped", doc = "server-reported: prompt tokens found in its prefix cache" },
  { name = "cached_token_share", type = "number", unit = "share 0..1", nil_when = "no answer reported cached tokens", doc = "engine-reported in answers: the share of prompt tokens the server said were cached (`usage.prompt_tokens_details.cached_tokens`), a moving average weighted by prompt size; the server's real cache hits, beside atc's guess by its prefix index" },
  { name = "scrape_age", type = "number", unit = "ms", nil_when = "never scraped", doc = "how long ago the four server-reported values were read" },
  { name = "prefill_tokens", type = "integer", unit = "tokens", mock = 0, doc = "engine-observed: uncached prompt tokens (by the prefix index, at send) of the requests sent there whose first token has not come back: the prefill queue a new request waits behind (every replica's with `cluster:`)" },
  { name = "prefilling", type = "integer", unit = "requests", mock = 0, doc = "engine-observed: requests sent there before their first token (every replica's)" },
  { name = "decoding", type = "integer", unit = "requests", mock = 0, doc = "engine-observed: requests there past their first token, not finished (every replica's)" },
  { name = "recent_tokens", type = "number", unit = "tokens", mock = 0, doc = "engine-observed: the uncached prompt tokens sent there, summed with exponential decay (half-life `signals.recent_half_life`, 2 s): not 0 for traffic that arrives one request at a time" },
  { name = "prefill_rate", type = "number", unit = "tokens/s", mock = 15000, doc = "engine-observed: prompt tokens a second it prefills (uncached tokens over the time each streamed answer's prefill took there, from its send or the previous first token there to its own: moving averages), the `signals.prefill_rate` prior (15000) until then" },
  { name = "uncached_mean", type = "number", unit = "tokens", nil_when = "before its first request", doc = "engine-observed: uncached prompt tokens per request sent there (a moving average): `prefill_tokens / uncached_mean` is how many requests' prefill is queued" },
  { name = "kv_tokens", type = "number", unit = "tokens", nil_when = "not configured and not scraped", doc = "the size of its KV cache: the endpoint's `kv_tokens`, a simulated server's, or scraped (vLLM `vllm:cache_config_info`, SGLang `sglang:max_total_num_tokens`); the prefix index then forgets what the server must have evicted" },
  { name = "itl", type = "number", unit = "ms/token", mock = 12, doc = "engine-observed: time per output token (a moving average over streamed answers), the `signals.itl` prior (12ms) until then" },
  { name = "has_tag", kind = "method", args = "tag", type = "boolean", doc = "tag is one of its `tags`" },
  { name = "prefix_overlap", kind = "method", args = "req", type = "integer", unit = "blocks", doc = "leading blocks of req's prompt recently routed to ep (0 when none): where its KV cache likely is" },
  { name = "cached_tokens", kind = "method", args = "req", type = "integer", unit = "tokens", nil_when = "the endpoint publishes no KV-cache events (kv_events:), or req's block keys are not known", doc = "tokens of req's prompt the endpoint holds in its KV cache now, exact: its leading blocks found in the index its KV-cache events feed, times the block size (0 when none)" },
  { name = "predict_ttft", kind = "method", args = "req", type = "number", unit = "ms", doc = "req's time to first token there if sent now: (the prefill still queued there + its uncached prompt tokens there) / `prefill_rate` + `itl`; the prefill still queued is `prefill_tokens` less what the server did since the last first token there, at `prefill_rate`; a streamed first token overdue (the server did more than atc counted) reads as that much late again, plus what was sent since" },
}

-- verdict: what atc.queue / atc.reject return (a policy returns it instead of an endpoint).
M.verdict = {
  { name = "kind", type = "string", doc = "`\"queue\"` or `\"reject\"`" },
  { name = "status", type = "integer", unit = "HTTP status", nil_when = "a queue verdict", doc = "the answer's status" },
  { name = "message", type = "string", doc = "the reason (queue) or the error message (reject)" },
}

-- atc: the host functions. Functions over a pool take the pool first.
M.atc = {
  { name = "queue", args = "[reason]", type = "verdict", doc = "wait in atc's admission queue for capacity" },
  { name = "reject", args = "status [, message]", type = "verdict", doc = "answer now with status 400-599 and an OpenAI-style error" },
  { name = "random", args = "[n]", type = "number", doc = "[0, 1), or an integer 1..n; seedable by the host (replay)" },
  { name = "now", args = "", type = "number", unit = "ms", doc = "monotonic milliseconds; virtual time under replay" },
  { name = "hash", args = "s", type = "integer", doc = "XXH3 of s, 52 bits (exact in a Lua number)" },
  { name = "log", args = "...", type = "nothing", doc = "a rate-limited log line with the script's file:line (a line that starts with a position, `file.lua:N: ` as `error(msg, level)` writes it, keeps that one: the shipped init points at an alias so)" },
  { name = "explain", args = "ep_or_id, score [, note]", type = "nothing", doc = "attaches a candidate's score (and a note, 47 printable characters) to the decision record, up to 8 per decision; kept only when someone reads the record (access log, trace, x-atc-explain), else it returns at once" },
  { name = "least_loaded", args = "eps", type = "endpoint", nil_when = "none available", doc = "the available endpoint with the lowest `load` (ties: fewer tokens in flight, then the first)" },
  { name = "p2c", args = "eps", type = "endpoint", nil_when = "none available", doc = "power of two choices, the built-in balancer's (fleet/balancer.c)" },
  { name = "rendezvous", args = "eps, key [, c | opts]", type = "endpoint", nil_when = "none available", doc = "weighted highest-random-weight hashing of key; with c >= 1, no endpoint above c x its share of the load; opts: `c`, and `req` with `max_ttft` (ms): only the endpoints where `ep:predict_ttft(req)` is at most max_ttft count, as if eps held only those" },
  { name = "prefix_pick", args = "pool, req [, opts]", type = "endpoint", nil_when = "no overlap reaches min_blocks, or the pool is imbalanced", doc = "the prefix-affinity loop in C; opts: `min_blocks` (1), `balance_abs`, `balance_rel` (imbalanced when max - min in-flight > balance_abs and max > balance_rel x min; no guard without balance_abs), `skip` (an endpoint never chosen), `load_weight` (0: the longest overlap; > 0: the lowest uncached prompt tokens + load_weight x tokens in flight)" },
  { name = "fastest", args = "pool, req [, opts]", type = "endpoint", nil_when = "none available", doc = "the available endpoint where req's first token comes soonest, by `ep:predict_ttft` in C (also returns the cost and the predicted TTFT, ms); opts: `uncached` (1: a token not cached there counts this many times, > 1 values the cache left behind), `decode` (0: + decode x `decoding` x `itl`), `recent` (0: + recent x `recent_tokens` / `prefill_rate`), `congestion` (0: raises `uncached` to 1 + congestion x the pool's queued requests, the mean prefill still queued (as `predict_ttft` reads it) / mean `uncached_mean`, at most 16: the marginal cost of work in a queue), `pooled` (false: true compares at the pool's mean rates), `step_tokens` (0: the engine's iteration token budget, vLLM's `max_num_batched_tokens`; where prefill is queued + min(uncached tokens, step_tokens) / `prefill_rate`: the delay this prompt adds to the first token of the prompt ahead, whose last iteration it joins), `skip` (an endpoint never chosen), `explain` (false: true puts each available candidate's cost and predicted TTFT in the decision record, the pick first, as `atc.explain` does; nothing when nobody reads it); ties: less recent work, then the lower `load`" },
  { name = "pool", args = "list", type = "endpoint[]", doc = "an engine list of list's endpoints in its order (list itself when it is one), which the policy keeps, read-only, for the host functions to read in C, as fleet:endpoints's: a model's version side built once per fleet, say; a list with anything but an endpoint view in it (a test's mock), or past 256 lists made for one set of endpoints, gives a plain copy" },
  { name = "find", args = "pool, ep_or_id", type = "endpoint", nil_when = "pool does not hold it", doc = "the element of pool that is that endpoint (a view or an id; a test's mock: itself, or by its id), and its place in pool as a second value" },
  { name = "affinity.get", args = "key", type = "string", nil_when = "no live pin", doc = "the endpoint id pinned to key (a bounded LRU in C: it survives reloads)" },
  { name = "affinity.set", args = "key, ep_or_id [, ttl_ms]", type = "nothing", doc = "pins key to an endpoint (default ttl 10 min)" },
  { name = "affinity.del", args = "key", type = "nothing", doc = "forgets key" },
}

-- What route(req, fleet) may return (not a view: no engine table serves it; docs only).
M.returns = {
  { name = "ep", type = "endpoint", doc = "an available endpoint (or its id): it answers the request; in a disaggregated model a `role: prefill` one takes the prefill stage and the C balancer picks the decode server, any other takes the decode stage and the C balancer picks the prefill server" },
  { name = "{prefill = ep, decode = ep}", type = "table", doc = "a disaggregated model's pair: the prefill server (`role` prefill or both) and the decode server (decode or both), both available, of one model; either may be left out (the C balancer picks that one); anything else in it is an invalid return. The decision record's `prefill` and the access log's `prefill_endpoint` name the prefill server, `endpoint` the decode one. A prefill server that fails is replaced by the C balancer's pick" },
  { name = "atc.queue(reason)", type = "verdict", doc = "wait in the model's admission queue, and decide again when a slot frees" },
  { name = "atc.reject(status, message)", type = "verdict", doc = "answer that status (`code: rejected_by_policy`)" },
}

M.SECTIONS = {
  { key = "req", title = "`req`", what = "the request (read-only, valid only during its decision)" },
  { key = "fleet", title = "`fleet`", what = "the endpoint table" },
  { key = "ep", title = "endpoint `ep`", what = "read-only view of one endpoint's live state" },
  { key = "verdict", title = "verdict", what = "what `atc.queue` / `atc.reject` return" },
  { key = "atc", title = "`atc`", what = "host functions" },
}

-- Whether value x has the contract type t ("integer", "string[]", "endpoint", ...).
function M.has_type(x, t)
  if t == "integer" then
    return type(x) == "number" and x == math.floor(x)
  elseif t == "number" or t == "string" or t == "boolean" then
    return type(x) == t
  elseif string.sub(t, -2) == "[]" then
    if type(x) ~= "table" then
      return false
    end
    local inner = string.sub(t, 1, -3)
    for i = 1, #x do
      if not M.has_type(x[i], inner) then
        return false
      end
    end
    return true
  elseif t == "endpoint" then
    return (type(x) == "table" or type(x) == "userdata") and type(x.id) == "string"
  elseif t == "verdict" then
    return type(x) == "userdata" and (x.kind == "queue" or x.kind == "reject")
  elseif t == "nothing" then
    return x == nil
  end
  error("contract: unknown type " .. tostring(t), 2)
end

-- The entry called name in section key, or nil.
function M.entry(key, name)
  local list = M[key]
  for i = 1, #list do
    if list[i].name == name then
      return list[i]
    end
  end
  return nil
end

local function cell(s)
  return (string.gsub(s or "", "|", "\\|"))
end

-- The contract as markdown tables (what the READMEs carry between their contract markers).
function M.markdown()
  local out = {}
  local function add(s)
    out[#out + 1] = s
  end
  add("<!-- generated from stdlib/atc/contract.lua by `atc test --contract`; edit that file, then run")
  add("     tests/policy/contract_docs.py --write -->")
  add(M.NOTE)
  for _, sec in ipairs(M.SECTIONS) do
    add("")
    add("**" .. sec.title .. "**: " .. sec.what .. ".")
    add("")
    add("| name | type | unit | nil when | meaning |")
    add("|---|---|---|---|---|")
    for _, e in ipairs(M[sec.key]) do
      local name
      if sec.key == "atc" then
        name = "`atc." .. e.name .. "(" .. e.args .. ")`"
      elseif e.kind == "method" then
        name = "`" .. sec.key .. ":" .. e.name .. "(" .. e.args .. ")`"
      else
        name = "`" .. e.name .. "`"
      end
      local ty = (e.kind == "method" or sec.key == "atc") and ("→ " .. e.type) or e.type
      add("| " .. name .. " | " .. cell(ty) .. " | " .. cell(e.unit) .. " | " .. cell(e.nil_when) .. " | " .. cell(e.doc) .. " |")
    end
  end
  add("")
  add("**`route`'s return**: what `route(req, fleet)` may return (anything else is an invalid return: the C balancer routes).")
  add("")
  add("| return | type | meaning |")
  add("|---|---|---|")
  for _, e in ipairs(M.returns) do
    add("| `" .. cell(e.name) .. "` | " .. cell(e.type) .. " | " .. cell(e.doc) .. " |")
  end
  return table.concat(out, "\n") .. "\n"
end

return M
