-- Priority: the pick when affinity has no opinion. Urgent requests take the least-loaded endpoint;
-- the rest spread with power-of-two choices, which avoids the herd that "everyone to the least
-- loaded" makes when many decisions see the same counters. Nothing available: queue.

local balance = require "atc.balance"
local verdict = require "atc.verdict"

-- Knobs ------------------------------------------------------------------------------------------------
local HIGH_PRIORITY = 5 -- req.priority (0-9, header x-atc-priority) above this is urgent
----------------------------------------------------------------------------------------------------------

local M = {}
M.HIGH_PRIORITY = HIGH_PRIORITY

function M.pick(req, pool)
  local ep
  if req.priority > HIGH_PRIORITY then
    ep = balance.least_loaded(pool)
  else
    ep = balance.p2c(pool)
  end
  return ep or verdict.queue("no endpoint of the pool has room")
end

return M
