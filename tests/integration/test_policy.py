"""The policy runtime end to end: sandbox escapes, budget and memory limits, verdicts, hot reload under
load, rollback. Each test runs atc serve with a policy written to a temporary directory."""

import json
import os
import signal
import subprocess
import threading
import time
import unittest

from harness import ATC_BIN, AtcTestCase, chat, request, wait_for

# Two models: requests name "m"; the policy under test answers "escaped" (the endpoint of model canary)
# only when the code it was given ran without error. A blocked attempt raises, and the engine falls
# back to the C balancer, which can only pick "m"'s endpoint: "m-sim-1".
CONFIG = """
listen: 127.0.0.1:0
admin: 127.0.0.1:0
policy:
  entry: policy.lua
  memory: 16MiB
  rollback_after: {rollback_after}
  watch: {watch}
models:
  - name: m
  - name: canary
simulate:
  - model: m
    decode_ms: 1
  - model: canary
    decode_ms: 1
"""

SAFE, ESCAPED = "m-sim-1", "canary-sim-1"

ESCAPES = {
    "io": "return io.open('/etc/passwd')",
    "os": "return os.execute('true')",
    "debug": "return debug.getinfo(1)",
    "ffi": "return require('ffi')",
    "jit": "return jit.off()",
    "load": "return load('return 1')",
    "loadstring": "return loadstring('return 1')()",
    "dofile": "return dofile('/etc/passwd')",
    "loadfile": "return loadfile('/etc/passwd')",
    "setfenv": "return setfenv(1, {})",
    "getfenv": "return getfenv(1)",
    "setmetatable": "return setmetatable({}, {})",
    "getmetatable": "return getmetatable('').__index",
    "rawset": "return rawset({}, 'x', 1)",
    "string.dump": "return string.dump(function() end)",
    "dump via string metatable": "return ('x').dump(function() end)",
    "newproxy": "return newproxy(true)",
    "collectgarbage": "return collectgarbage('count')",
    "package": "return package.loaded",
    "require outside the path": "return require('../../../etc/passwd')",
    "require a C module": "return require('os')",
    "poison string.upper": "string.upper = function() return 'pwned' end",
    "poison through the metatable": "local mt = ('').upper; ('').upper = nil",
    "new global": "leaked = true",
    "_G": "return _G.io.open",
    "coroutine": "return coroutine.create(function() end)",
    "module": "return module('x')",
    "math.randomseed": "return math.randomseed(1)",
    "replace atc.affinity": "atc.affinity = nil",
    "bytecode via string.char": "return load(string.char(27, 76, 74, 2))",
}

ESCAPE_POLICY = """
local attempts = {
%s
}
return function(req, fleet)
  local name = req:header("x-attempt")
  if name == "check-upper" then
    if ("a"):upper() ~= "A" then return "%s" end
    return fleet:endpoints("m")[1]
  end
  if name then attempts[name]() end
  return "%s"
end
"""

BUDGET_POLICY = """
local function deep(n) return deep(n + 1) + 1 end
local behaviours = {
  ["loop"] = function() while true do end end,
  ["swallowing pcall"] = function()
    while true do pcall(function() while true do end end) end
  end,
  ["nested pcall"] = function()
    pcall(function() while true do pcall(function() while true do end end) end end)
    while true do end
  end,
  ["xpcall"] = function() xpcall(function() while true do end end, function() return "caught" end) end,
  -- a handler that never returns: it runs once the error has unwound, where the budget still holds
  ["xpcall looping handler"] = function() xpcall(function() while true do end end, function() while true do end end) end,
  ["xpcall looping handler of an error"] = function() xpcall(function() error("x") end, function() while true do end end) end,
  ["xpcall handler raising"] = function() return xpcall(function() error("x") end, function() error("y") end) end,
  ["pattern bomb"] = function() string.find(string.rep("a", 60000), ".-.-.-.-b") end,
  ["gsub bomb"] = function() string.gsub(string.rep("a", 20000), "(.-)(.-)b", "%%1") end,
  ["memory bomb"] = function() return string.rep("x", 32 * 1024 * 1024) end,
  ["memory bomb in pcall"] = function()
    local ok = pcall(string.rep, "y", 32 * 1024 * 1024)
    return ok
  end,
  ["table bomb"] = function()
    local t = {}
    for i = 1, 1e9 do t[i] = i end
  end,
  ["deep recursion"] = function() return deep(1) end,
}
return function(req, fleet)
  local name = req:header("x-behaviour")
  if name then behaviours[name]() end
  return "%s"
end
""" % ESCAPED


class PolicyTestCase(AtcTestCase):
    def start_policy(self, source, rollback_after=20, watch=True):
        self.write_policy(source)
        return self.start_atc(CONFIG.format(rollback_after=rollback_after, watch=str(watch).lower()))



    def reload(self, atc):
        status, _, body = request("127.0.0.1", atc.admin_port, "POST", "/admin/policy/reload")
        return status, json.loads(body)


class SandboxTest(PolicyTestCase):
    def test_escape_attempts_fail_and_routing_goes_on(self):
        attempts = ",\n".join(f"  [{json.dumps(k)}] = function() {v} end" for k, v in ESCAPES.items())
        atc = self.start_policy(ESCAPE_POLICY % (attempts, ESCAPED, ESCAPED))
        # Without an attempt the policy routes to "escaped": the harness itself works.
        status, headers, _ = chat(atc.port, model="m", max_tokens=1)
        self.assertEqual((status, headers["x-atc-endpoint"]), (200, ESCAPED))
        self.assertGreaterEqual(len(ESCAPES), 15)
        for name in ESCAPES:
            with self.subTest(name):
                status, headers, body = chat(atc.port, model="m", max_tokens=1, headers={"x-attempt": name})
                self.assertEqual(status, 200, body)
                self.assertEqual(headers["x-atc-endpoint"], SAFE, f"attempt '{name}' was not blocked")
        # A poisoned shared library would show in the next decision.
        status, headers, _ = chat(atc.port, model="m", max_tokens=1, headers={"x-attempt": "check-upper"})
        self.assertEqual(headers["x-atc-endpoint"], SAFE)
        current = self.policy_status(atc)["current"]
        self.assertEqual(current["errors"], len(ESCAPES))
        self.assertIn("policy.lua:", self.policy_status(atc)["last_error"])
        self.assertIn("policy.lua:", atc.read_log())  # logged with file:line


class BudgetTest(PolicyTestCase):
    def test_runaway_policies_are_stopped_and_the_request_still_succeeds(self):
        atc = self.start_policy(BUDGET_POLICY)
        expected = {
            "loop": "budget_overruns", "swallowing pcall": "budget_overruns", "nested pcall": "budget_overruns",
            "xpcall": "budget_overruns", "xpcall looping handler": "budget_overruns",
            "xpcall looping handler of an error": "budget_overruns", "pattern bomb": "errors", "gsub bomb": "errors",
            "memory bomb": "memory_errors", "memory bomb in pcall": "memory_errors",
            # stack overflow, or out of time first on a slow (sanitizer) build; likewise memory or time
            "deep recursion": ("errors", "budget_overruns"), "table bomb": ("memory_errors", "budget_overruns"),
        }
        for name, counter in expected.items():
            with self.subTest(name):
                before = self.policy_status(atc)["current"]
                start = time.monotonic()
                status, headers, body = chat(atc.port, model="m", max_tokens=1, headers={"x-behaviour": name})
                elapsed = time.monotonic() - start
                self.assertEqual(status, 200, body)
                self.assertEqual(headers["x-atc-endpoint"], SAFE)  # routed by the C balancer
                self.assertLess(elapsed, 5.0)  # stopped, not hung
                after = self.policy_status(atc)["current"]
                if isinstance(counter, tuple):  # whichever limit comes first
                    self.assertEqual(sum(after[c] for c in counter), sum(before[c] for c in counter) + 1)
                else:
                    self.assertEqual(after[counter], before[counter] + 1)
        status, headers, _ = chat(atc.port, model="m", max_tokens=1)
        self.assertEqual((status, headers["x-atc-endpoint"]), (200, ESCAPED))  # the policy still decides
        log = atc.read_log()
        self.assertIn("budget exceeded", log)


class LogTest(PolicyTestCase):
    def test_policy_text_reaches_the_log_as_one_escaped_line(self):
        atc = self.start_policy("""
            return function(req, fleet)
              atc.log("first\\nforged ERROR line\\27[31m red")
              return fleet:endpoints(req.model)[1]
            end
        """)
        status, _, _ = chat(atc.port, model="m", max_tokens=1)
        self.assertEqual(status, 200)
        log = wait_for(lambda: (lambda l: l if "first" in l else None)(atc.read_log()), timeout=5, what="the line")
        line = next(l for l in log.splitlines() if "first" in l)
        self.assertIn("first\\nforged ERROR line\\x1b[31m red", line)  # shown, not obeyed
        self.assertFalse(any(l.startswith("forged") for l in log.splitlines()))
        self.assertNotIn("\x1b", log)


class ReloadLogTest(PolicyTestCase):
    def test_a_changed_file_is_named_once_and_the_sources_are_hashed(self):
        import re
        layer = os.path.join(self.tmp.name, "layer.lua")
        with open(layer, "w") as f:
            f.write("return { n = 1 }\n")
        self.write_policy("local layer = require 'layer'\n"
                          "return function(req, fleet) return fleet:endpoints(req.model)[1] end\n")
        atc = self.start_atc("workers: 2\n" + CONFIG.format(rollback_after=20, watch="true"))
        before = self.policy_status(atc)
        self.assertRegex(before["files_hash"], r"^[0-9a-f]{16}$")
        iso = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$"
        self.assertRegex(before["loaded"], iso)
        self.assertRegex(before["current"]["loaded"], iso)
        self.assertEqual(before["current"]["files_hash"], before["files_hash"])
        self.assertEqual(atc.read_log().count("policy v1 loaded from"), 1)  # not once per worker
        with open(layer + ".new", "w") as f:
            f.write("return { n = 2 }\n")
        os.replace(layer + ".new", layer)
        wait_for(lambda: self.policy_status(atc)["version"] == 2, timeout=5, what="reload on the change")
        wait_for(lambda: "policy v2 loaded" in atc.read_log(), timeout=5, what="the reload logged")
        log = atc.read_log()
        self.assertEqual(len(re.findall(r"policy file .*/layer\.lua changed", log)), 1, log)
        self.assertEqual(log.count("policy v2 loaded from"), 1, log)
        after = self.policy_status(atc)
        self.assertRegex(after["files_hash"], r"^[0-9a-f]{16}$")
        self.assertNotEqual(after["files_hash"], before["files_hash"])
        self.assertIn(after["files_hash"], log)  # the log line and the admin API name the same sources
        self.assertRegex(after["last_reload"], iso)


class VerdictTest(PolicyTestCase):
    def test_reject_queue_nonsense_and_alias(self):
        atc = self.start_policy("""
            return function(req, fleet)
              local what = req:header("x-what")
              if what == "reject" then return atc.reject(429, "tenant over quota") end
              if what == "queue" then return atc.queue("busy") end
              if what == "nonsense" then return 42 end
              if req.model == "auto" then return atc.least_loaded(fleet:endpoints("canary")) end
              return fleet:endpoints(req.model)[1]
            end
        """)
        status, headers, body = chat(atc.port, model="m", headers={"x-what": "reject"})
        self.assertEqual(status, 429)
        self.assertEqual(json.loads(body)["error"]["message"], "tenant over quota")
        self.assertEqual(headers["x-atc-policy-version"], "1")
        status, headers, body = chat(atc.port, model="m", headers={"x-what": "queue", "x-atc-deadline": "200ms"})
        self.assertEqual(status, 503)  # it waited for capacity the policy never granted, up to its deadline
        self.assertEqual(json.loads(body)["error"]["code"], "queue_timeout")
        self.assertTrue(headers["retry-after"].isdigit())
        status, headers, _ = chat(atc.port, model="m", max_tokens=1, headers={"x-what": "nonsense"})
        self.assertEqual((status, headers["x-atc-endpoint"]), (200, SAFE))
        self.assertEqual(self.policy_status(atc)["current"]["invalid_returns"], 1)
        _, _, metrics = request("127.0.0.1", atc.admin_port, "GET", "/metrics")  # one spelling, no space
        self.assertIn(b'atc_policy_fallbacks_total{reason="invalid_return"} 1\n', metrics)
        self.assertIn(b'atc_policy_failures_total{version="1",kind="invalid_return"} 1\n', metrics)
        # An alias: the server gets the endpoint's model name, not "auto".
        status, headers, body = chat(atc.port, model="auto", max_tokens=2)
        self.assertEqual(status, 200, body)
        self.assertEqual(headers["x-atc-endpoint"], ESCAPED)
        self.assertEqual(json.loads(body)["model"], "canary")
        # An unknown model the policy has no answer for is still a 404.
        status, _, body = chat(atc.port, model="nope")
        self.assertEqual(status, 404)


class ReloadTest(PolicyTestCase):
    GOOD = "return function(req, fleet) return fleet:endpoints(req.model)[1] end -- v%d\n"
    BROKEN = [
        "return function(req, fleet) return fleet:endpoints(req.model)[1] -- syntax error, no end\n",
        "return function(req, fleet) return req.model.nothing.here end\n",
        "return function(req, fleet) while true do end end\n",
        "error('fails at load')\n",
        "return 42\n",
    ]

    def test_reload_under_load_fails_no_request(self):
        atc = self.start_policy(self.GOOD % 0, watch=False)  # only the reloads this test asks for
        results, stop = [], threading.Event()

        def client():
            import http.client
            conn = http.client.HTTPConnection("127.0.0.1", atc.port, timeout=10)
            body = json.dumps({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]})
            while not stop.is_set():
                try:
                    conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
                    resp = conn.getresponse()
                    resp.read()
                    results.append((resp.status, resp.getheader("x-atc-policy-version"),
                                    resp.getheader("x-atc-decision")))
                except Exception as e:  # a failed request is what this test exists to catch
                    results.append((0, repr(e), None))
                    conn = http.client.HTTPConnection("127.0.0.1", atc.port, timeout=10)

        threads = [threading.Thread(target=client) for _ in range(3)]
        for t in threads:
            t.start()
        good_versions, version = {1}, 1
        for i in range(50):
            if i % 2 == 0:
                self.write_policy(self.GOOD % i)
                status, doc = self.reload(atc)
                self.assertEqual(status, 200, doc)
                version += 1
                self.assertEqual(doc["version"], version)
                good_versions.add(version)
            else:
                self.write_policy(self.BROKEN[(i // 2) % len(self.BROKEN)])
                status, doc = self.reload(atc)
                self.assertEqual(status, 422, doc)
                self.assertIn("policy.lua", doc["error"]["message"])
            time.sleep(0.02)  # let traffic flow between reloads
        stop.set()
        for t in threads:
            t.join()
        self.assertGreater(len(results), 100)
        failed = [r for r in results if r[0] != 200]
        self.assertEqual(failed, [])
        # a version is named only on what it decided; the rest say the C balancer routed them, and why (a
        # slow build's decision may overrun its budget)
        self.assertEqual([r for r in results if r[1] is None and not (r[2] or "").startswith("fallback")], [])
        seen = {int(v) for _, v, _ in results if v is not None}
        self.assertTrue(seen <= good_versions, f"versions {seen - good_versions} were never good")
        self.assertGreater(len(seen), 5)
        status = self.policy_status(atc)
        self.assertEqual((status["reloads_ok"], status["reloads_failed"]), (25, 25))

    def test_file_change_and_sighup_reload(self):
        atc = self.start_policy(self.GOOD % 0)
        self.write_policy(self.GOOD % 1)  # inotify sees the rename
        wait_for(lambda: self.policy_status(atc)["version"] == 2, timeout=5, what="reload on file change")
        self.write_policy(self.BROKEN[0])
        wait_for(lambda: self.policy_status(atc)["reloads_failed"] == 1, timeout=5, what="failed reload")
        self.assertEqual(self.policy_status(atc)["version"], 2)
        self.assertIn("policy.lua:", self.policy_status(atc)["last_error"])
        self.write_policy(self.GOOD % 2)
        wait_for(lambda: self.policy_status(atc)["version"] == 3, timeout=5, what="reload after a fix")
        atc.signal(signal.SIGHUP, "SIGHUP: reloading")
        wait_for(lambda: self.policy_status(atc)["version"] == 4, timeout=5, what="reload on SIGHUP")
        status, headers, _ = chat(atc.port, model="m", max_tokens=1)
        self.assertEqual((status, headers["x-atc-policy-version"]), (200, "4"))

    def test_a_failing_new_version_is_rolled_back(self):
        # Without the watch: it would load the same file again while the versions are counted.
        atc = self.start_policy(self.GOOD % 0, rollback_after=5, watch=False)
        # Passes the reload's checks (they send no headers), then fails every real request.
        self.write_policy("return function(req, fleet)\n"
                          "  if req:header('x-real') then error('broken on real traffic') end\n"
                          "  return fleet:endpoints(req.model)[1]\nend\n")
        status, doc = self.reload(atc)
        self.assertEqual((status, doc["version"]), (200, 2))
        answers = []
        for _ in range(8):
            status, headers, _ = chat(atc.port, model="m", max_tokens=1, headers={"x-real": "1"})
            self.assertEqual(status, 200)
            answers.append((headers.get("x-atc-policy-version"), headers["x-atc-decision"]))
        # v2 decided nothing: the C balancer routed those five, and the answers say so
        self.assertEqual(answers[:5], [(None, "fallback; reason=error")] * 5)
        self.assertEqual(answers[5:], [("1", "endpoint")] * 3)
        status = self.policy_status(atc)
        self.assertEqual((status["version"], status["rollbacks"]), (1, 1))
        self.assertIn("rolling back", atc.read_log())


    def test_a_reload_that_cannot_be_built_keeps_the_old_version_serving(self):
        atc = self.start_policy(self.GOOD % 0, watch=False)
        # Loading it needs more than policy.memory (16MiB): the new state cannot be built.
        self.write_policy("local big = string.rep('x', 32 * 1024 * 1024)\n"
                          "return function(req, fleet) return fleet:endpoints(req.model)[1] end\n")
        for attempt in range(3):  # and again: a failed build leaves nothing behind that breaks the next
            status, doc = self.reload(atc)
            self.assertEqual(status, 422, doc)
            self.assertRegex(doc["error"]["message"],
                             r"^policy\.memory 16MiB is too small to load the policy: .*not enough memory")
            status, headers, body = chat(atc.port, model="m", max_tokens=1)
            self.assertEqual((status, headers["x-atc-policy-version"]), (200, "1"), body)
        status = self.policy_status(atc)
        self.assertEqual((status["version"], status["reloads_failed"]), (1, 3))
        self.assertIn("policy.memory 16MiB", status["last_error"])
        self.assertIn("policy.memory 16MiB is too small", atc.read_log())
        self.write_policy(self.GOOD % 1)
        status, doc = self.reload(atc)
        self.assertEqual((status, doc["version"]), (200, 2))

    def test_a_reload_whose_load_spins_in_an_xpcall_handler_is_stopped(self):
        atc = self.start_policy(self.GOOD % 0, watch=False)
        self.write_policy("xpcall(function() while true do end end, function() while true do end end)\n"
                          "return function(req, fleet) return fleet:endpoints(req.model)[1] end\n")
        start = time.monotonic()
        status, doc = self.reload(atc)
        self.assertLess(time.monotonic() - start, 5.0, "the reload was stopped, not hung")
        self.assertEqual(status, 422, doc)
        self.assertIn("budget exceeded", doc["error"]["message"])
        status, headers, body = chat(atc.port, model="m", max_tokens=1)
        self.assertEqual((status, headers["x-atc-policy-version"]), (200, "1"), body)


class StartupTest(PolicyTestCase):
    def assert_stops_startup(self, source, message):
        """serve and check both exit 1 with message on a policy that cannot load."""
        self.write_policy(source)
        cfg = os.path.join(self.tmp.name, "atc.yaml")
        with open(cfg, "w") as f:
            f.write(CONFIG.format(rollback_after=20, watch='true'))
        for cmd in ("serve", "check"):
            out = subprocess.run([ATC_BIN, cmd, "-c", cfg], capture_output=True, text=True, timeout=10)
            self.assertEqual(out.returncode, 1, out.stderr)
            self.assertIn(message, out.stderr)

    def test_a_broken_policy_stops_startup_and_check_with_file_line(self):
        self.assert_stops_startup("return function(req, fleet)\n  return = 1\nend\n", "policy.lua:2:")

    def test_a_policy_spinning_in_an_xpcall_handler_at_load_time_stops_startup(self):
        self.assert_stops_startup("xpcall(function() while true do end end, function() while true do end end)\n"
                                  "return function(req, fleet) return nil end\n", "budget exceeded")


if __name__ == "__main__":
    unittest.main(verbosity=2)
