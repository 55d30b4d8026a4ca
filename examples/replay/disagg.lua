-- A disaggregated model's pair by the stdlib's common pick (stdlib/atc/disagg.lua): the prefill server
-- with the least prefill work ahead of the request (its queue plus the request's uncached tokens there,
-- over its prefill rate), the decode server with the fewest running sequences, then the most KV room.
-- examples/replay/disagg-2p2d.yaml replays it; docs/replay.md, "Disaggregated fleets".
local disagg = require "atc.disagg"

return function(req, fleet)
  return disagg.pick(fleet:endpoints(req.model), req) or atc.queue("no prefill and decode pair has room")
end
