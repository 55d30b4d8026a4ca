-- The per-request pick of the HAProxy peer in tests/bench/run (HAProxy's Lua 5.3): least loaded among the
-- servers of backend "fleet" by requests in flight (counted here), ties broken round-robin, the same pick
-- as the nginx peer's. haproxy.cfg:
--   global:   lua-load haproxy_pick.lua
--   frontend: http-request lua.atc_pick
--   backend:  use-server b1 if { var(txn.atc_server) -m str b1 }   (one line per server)
--             http-response lua.atc_done
-- The server names come from the backend itself, at the first request.

local names, inflight = nil, {}
local n, rotor = 0, 0

local function setup()
  names = {}
  for name in pairs(core.backends["fleet"].servers) do
    names[#names + 1] = name
  end
  table.sort(names)
  n = #names
  for i = 1, n do
    inflight[names[i]] = 0
  end
end

core.register_action("atc_pick", { "http-req" }, function(txn)
  if names == nil then
    setup()
  end
  rotor = rotor % n + 1
  local best = names[rotor]
  local least = inflight[best]
  for k = 1, n - 1 do
    local name = names[(rotor + k - 1) % n + 1]
    if inflight[name] < least then
      best, least = name, inflight[name]
    end
  end
  inflight[best] = least + 1
  txn:set_var("txn.atc_server", best)
end)

core.register_action("atc_done", { "http-res" }, function(txn)
  local name = txn:get_var("txn.atc_server")
  if name ~= nil and inflight[name] ~= nil then
    inflight[name] = inflight[name] - 1
  end
end)
