-- The prompt tokens each server would still prefill, exact where it publishes KV-cache events, plus the
-- tokens already in flight there: the lowest wins (stdlib/atc/prefix.lua).
local prefix = require "atc.prefix"
return function(req, fleet)
  return prefix.pick(fleet:endpoints(req.model), req) or atc.queue()
end
