-- Verdicts: what a policy returns instead of an endpoint. Thin, named wrappers over the host's
-- atc.queue and atc.reject, and kind(v) to tell an answer apart (for tests and for layers that pass a
-- result along).
--
--   local verdict = require "atc.verdict"
--   return verdict.queue("no capacity")          -- wait for room (503 + Retry-After until admission)
--   return verdict.reject(429, "tenant over quota")

local M = {}

function M.queue(reason)
  return atc.queue(reason)
end

function M.reject(status, message)
  return atc.reject(status, message)
end

-- 404 with OpenAI's wording, for a model (or alias) nothing serves.
function M.model_not_found(model)
  return atc.reject(404, "The model '" .. tostring(model) .. "' does not exist")
end

-- "endpoint", "queue", "reject", or nil for anything else (which the engine would count as an invalid
-- return and route with its built-in balancer). Verdicts carry kind = "queue" | "reject"; endpoints
-- carry an id.
function M.kind(v)
  local t = type(v)
  if t ~= "table" and t ~= "userdata" then
    return nil
  end
  local k = v.kind
  if k == "queue" or k == "reject" then
    return k
  end
  if v.id ~= nil then
    return "endpoint"
  end
  return nil
end

return M
