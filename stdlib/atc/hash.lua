-- Consistent hashing over the endpoints that are available now.
--
--   rendezvous(eps, key)     highest random weight (weighted by ep.weight): a key keeps its endpoint
--                            while that endpoint stays available; when it goes, only its keys move.
--   bounded(eps, key[, c])   the same, but skipping endpoints above c times their fair share of the
--                            load, as in "consistent hashing with bounded loads" (Mirrokni, Thorup,
--                            Zadimoghaddam): nothing gets more than c x average, and a key moves only
--                            while its own endpoint is over the bound.
--
-- Several atc replicas that see the same endpoints pick the same one for a key without talking.
-- Both return nil when no endpoint is available. The pool comes first, as in every function over a pool
-- (atc.rendezvous, atc.least_loaded, atc.prefix_pick, balance.*); the old order (key, eps) still works.

local M = {}

M.DEFAULT_C = 1.25 -- bounded(): an endpoint may carry up to 25% more than its share

-- Weighted highest random weight: each available endpoint scores -weight / ln(u), u uniform in (0, 1)
-- from hash(key, ep.id); the highest wins. The host computes it in C, for engine endpoints and
-- endpoint-like tables alike.
-- (key, eps): the order before the pool came first.
local function pool_first(eps, key)
  if type(eps) == "string" and type(key) == "table" then
    return key, eps
  end
  return eps, key
end

function M.rendezvous(eps, key)
  eps, key = pool_first(eps, key)
  return atc.rendezvous(eps, key)
end

-- The bound: with this request counted, an endpoint may hold c x its capacity's share of the requests
-- in flight on the available endpoints; some endpoint is always at or under its share, so the bound
-- never excludes everything. The host computes it in C, in the same pass as rendezvous.
function M.bounded(eps, key, c)
  eps, key = pool_first(eps, key)
  c = c or M.DEFAULT_C
  if c < 1 then
    error("hash.bounded: c must be >= 1", 2)
  end
  return atc.rendezvous(eps, key, c)
end

return M
