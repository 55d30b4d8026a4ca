-- The sandbox's bounds on single C calls, which the budget's count hook cannot interrupt halfway:
-- patterns that backtrack, string.rep, table.sort and table.concat, and the atc.* loops over a pool.
local t = require "atc.test"

local function array(n, v)
  local out = {}
  for i = 1, n do
    out[i] = v or (n - i)
  end
  return out
end

t.test("patterns: every construct that backtracks counts", function()
  local s = string.rep("a", 26)
  t.expect(function() string.find(s, string.rep("a?", 26) .. string.rep("a", 26)) end).to_raise("could take too long")
  local big = string.rep("(", 30000) .. string.rep(")", 30000)
  t.expect(function() string.find(big, "%b()x") end).to_raise("could take too long")
  t.expect(string.find(big, "^%b()")).to_be(1) -- anchored: one scan
  t.expect(function() string.gsub(string.rep("ab", 20000), "(a)%1", "") end).to_raise("could take too long")
  t.expect(string.match("key=value", "^(%w+)=(%w+)$")).to_be("key") -- ordinary patterns are fine
  t.expect(string.find("colour", "colou?r")).to_be(1)
end)

t.test("string.rep builds at most 1 MiB in one call", function()
  t.expect(#string.rep("x", 1024 * 1024)).to_be(1024 * 1024)
  t.expect(function() string.rep("x", 1024 * 1024 + 1) end).to_raise("at most")
  t.expect(function() string.rep("xy", 600000, ",") end).to_raise("at most")
  t.expect(function() ("x"):rep(4 * 1024 * 1024) end).to_raise("at most") -- through the string metatable too
end)

t.test("table.sort and table.concat have a length cap", function()
  local a = array(16384)
  table.sort(a)
  t.expect(a[1]).to_be(0)
  t.expect(function() table.sort(array(16385)) end).to_raise("sorts at most")
  t.expect(#table.concat(array(65536, "x"))).to_be(65536)
  t.expect(function() table.concat(array(65537, "x")) end).to_raise("joins at most")
end)

t.test("the atc.* loops refuse a pool longer than any fleet", function()
  local pool = {}
  for i = 1, 4097 do
    pool[i] = t.endpoint { id = "e" .. i }
  end
  t.expect(function() atc.least_loaded(pool) end).to_raise("4096")
  t.expect(function() atc.p2c(pool) end).to_raise("4096")
  t.expect(function() atc.rendezvous(pool, "k") end).to_raise("4096")
  pool[4097] = nil
  t.expect(atc.least_loaded(pool)).to_be_endpoint()
end)
