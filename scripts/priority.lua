-- Priority: the pick when affinity has no opinion. A request goes where it would wait least: the
-- endpoint with the least work queued ahead of it (the prefill atc.work estimates is queued there, and
-- the tokens in flight there), since a server prefills prompts one after another and a first token
-- waits for every prompt before it. Among endpoints with equally little work (an idle pool: all of
-- them), urgent requests take the least loaded; the rest spread with power-of-two choices, which
-- avoids the herd that "everyone to the first one" makes. Nothing available: queue.

local balance = require "atc.balance"
local verdict = require "atc.verdict"
local work = require "atc.work"

-- Knobs ------------------------------------------------------------------------------------------------
local HIGH_PRIORITY = 5    -- req.priority (0-9, header x-atc-priority) above this is urgent
local BACKLOG_WEIGHT = 0.5 -- cost of a prompt token queued for prefill there (atc.work's estimate) ...
local LOAD_WEIGHT = 0.5    -- ... and of a token in flight there (prompts and answers)
----------------------------------------------------------------------------------------------------------

local M = {}
M.HIGH_PRIORITY = HIGH_PRIORITY

function M.pick(req, pool)
  local least = work.cheapest(pool, BACKLOG_WEIGHT, LOAD_WEIGHT)
  local ep
  if #least <= 1 then
    ep = least[1]
  elseif req.priority > HIGH_PRIORITY then
    ep = balance.least_loaded(least)
  else
    ep = balance.p2c(least)
  end
  return ep or verdict.queue("no endpoint of the pool has room")
end

return M
