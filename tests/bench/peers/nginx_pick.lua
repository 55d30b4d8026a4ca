-- The per-request pick of the nginx peer in tests/bench/run: least loaded among the backends by
-- requests in flight (counted in this worker), ties broken round-robin, so that it does the same kind of
-- work as atc's shipped policy (a load-aware pick in Lua for every request). Used from nginx.conf:
--   init_by_lua_block      { pick = require "nginx_pick"; pick.setup({{"127.0.0.1", 9001}, ...}) }
--   balancer_by_lua_block  { pick.balance() }
--   log_by_lua_block       { pick.done() }

local balancer = require "ngx.balancer"

local M = {}

local hosts, ports, inflight = {}, {}, {}
local n, rotor = 0, 0

function M.setup(list)
  for i, b in ipairs(list) do
    hosts[i], ports[i], inflight[i] = b[1], b[2], 0
  end
  n = #list
end

function M.balance()
  local ctx = ngx.ctx
  if ctx.pick ~= nil then -- a retry: release the slot of the failed try
    inflight[ctx.pick] = inflight[ctx.pick] - 1
  end
  rotor = rotor % n + 1
  local best, least = rotor, inflight[rotor]
  for k = 1, n - 1 do
    local i = (rotor + k - 1) % n + 1
    if inflight[i] < least then
      best, least = i, inflight[i]
    end
  end
  inflight[best] = least + 1
  ctx.pick = best
  local ok, err = balancer.set_current_peer(hosts[best], ports[best])
  if not ok then
    ngx.log(ngx.ERR, "set_current_peer: ", err)
    return ngx.exit(500)
  end
end

function M.done()
  local i = ngx.ctx.pick
  if i ~= nil then
    inflight[i] = inflight[i] - 1
    ngx.ctx.pick = nil
  end
end

return M
