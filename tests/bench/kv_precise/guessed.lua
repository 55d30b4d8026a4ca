-- precise.lua with the exact figure ignored: atc's own guess (where it sent each prompt) everywhere.
local prefix = require "atc.prefix"
return function(req, fleet)
  return prefix.pick(fleet:endpoints(req.model), req, { exact = false }) or atc.queue()
end
