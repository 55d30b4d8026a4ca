"""Changing a policy safely (issue 16), end to end: rollback to the last version that served, answers that
say who decided, decision records, shadow policies and canaries. Each test runs atc serve with two workers
and a simulated fleet, and checks every request it sends."""

import http.client
import json
import os
import threading
import time
import unittest

from harness import ATC_BIN, AtcTestCase, chat, request, wait_for

CONFIG = """
listen: 127.0.0.1:0
admin: 127.0.0.1:0
workers: 2
access_log: access.log
policy:
  entry: policy.lua
  rollback_after: 5
  watch: false
  explain: true
{extra}
models:
  - name: m
simulate:
  - model: m
    count: 3
    decode_ms: {decode_ms}
"""

# Picks the endpoint by the request's x-n header (deterministic): endpoint (n + shift) % 3 + 1.
PICK_BY_N = """
local shift = %d
return function(req, fleet)
  local eps = fleet:endpoints(req.model)
  local n = tonumber(req:header("x-n") or "0")
  for i, ep in ipairs(eps) do atc.explain(ep, i * 10 + shift, "slot " .. i) end
  return eps[(n + shift) %% #eps + 1]
end
"""


class SafelyTestCase(AtcTestCase):
    def start(self, source, extra="", decode_ms=1):
        self.policy_path = os.path.join(self.tmp.name, "policy.lua")
        self.write_policy(source)
        return self.start_atc(CONFIG.format(extra=extra, decode_ms=decode_ms))

    def write_policy(self, source, name="policy.lua"):
        path = os.path.join(self.tmp.name, name)
        with open(path + ".new", "w") as f:
            f.write(source)
        os.replace(path + ".new", path)
        return path

    def admin(self, atc, method, path, body=None):
        status, _, data = request("127.0.0.1", atc.admin_port, method, path, body)
        return status, json.loads(data) if data else None

    def policy_status(self, atc):
        status, doc = self.admin(atc, "GET", "/admin/policy")
        self.assertEqual(status, 200)
        return doc

    def reload(self, atc, body=None):
        return self.admin(atc, "POST", "/admin/policy/reload", body)


class RollbackTest(SafelyTestCase):
    def test_a_bad_version_rolls_back_to_the_last_one_that_served(self):
        atc = self.start(PICK_BY_N % 0)
        self.write_policy(PICK_BY_N % 1)
        self.assertEqual(self.reload(atc)[1]["version"], 2)
        for n in range(60):  # v2 serves, on both workers (fresh connections spread over them)
            status, headers, _ = chat(atc.port, model="m", max_tokens=1, headers={"x-n": str(n)})
            self.assertEqual((status, headers["x-atc-policy-version"], headers["x-atc-decision"]),
                             (200, "2", "policy"))
        # v3 passes the reload's checks (they send no x-n) and fails every real request
        self.write_policy("return function(req, fleet)\n"
                          "  if req:header('x-n') then error('v3 is broken') end\n"
                          "  return fleet:endpoints(req.model)[1]\nend\n")
        self.assertEqual(self.reload(atc)[1]["version"], 3)
        answers = []
        for n in range(12):
            status, headers, _ = chat(atc.port, model="m", max_tokens=1, headers={"x-n": str(n)})
            self.assertEqual(status, 200)
            answers.append((headers.get("x-atc-policy-version"), headers["x-atc-decision"]))
        self.assertEqual(answers[:5], [(None, "fallback; reason=error")] * 5)
        self.assertEqual(answers[5:], [("2", "policy")] * 7)  # v2, not v1
        doc = self.policy_status(atc)
        self.assertEqual((doc["version"], doc["rollbacks"]), (2, 1))
        self.assertIn("rolling back to v2", atc.read_log())

    def test_an_overrun_and_an_invalid_return_say_so_with_the_value_and_the_line(self):
        atc = self.start("""
            return function(req, fleet)
              local what = req:header("x-what")
              if what == "spin" then while true do end end
              if what == "number" then return 42 end
              if what == "string" then return "no-such-endpoint" end
              return fleet:endpoints(req.model)[1]
            end
        """.replace("\n            ", "\n"))
        for what, reason in (("spin", "overrun"), ("number", "invalid_return"), ("string", "invalid_return")):
            status, headers, _ = chat(atc.port, model="m", max_tokens=1, headers={"x-what": what})
            self.assertEqual(status, 200)
            self.assertNotIn("x-atc-policy-version", headers)
            self.assertEqual(headers["x-atc-decision"], f"fallback; reason={reason}")
        log = atc.read_log()
        policy = os.path.join(self.tmp.name, "policy.lua")
        self.assertRegex(log, r"policy\.lua:2: route returned 42 \(return an endpoint")
        self.assertIn('policy.lua:2: route returned "no-such-endpoint", which is no endpoint id', log)
        self.assertTrue(os.path.exists(policy))


class DecisionRecordTest(SafelyTestCase):
    def test_a_client_that_asks_gets_the_record_and_the_access_log_has_it(self):
        atc = self.start(PICK_BY_N % 0)
        status, headers, _ = chat(atc.port, model="m", max_tokens=1, headers={"x-n": "1"})
        self.assertEqual(status, 200)
        self.assertNotIn("x-atc-explain", headers)  # nobody asked
        status, headers, _ = chat(atc.port, model="m", max_tokens=1,
                                  headers={"x-n": "1", "x-atc-explain": "1", "x-request-id": "explained"})
        self.assertEqual(status, 200)
        rec = json.loads(headers["x-atc-explain"])
        self.assertEqual((rec["version"], rec["kind"], rec["endpoint"]), (1, "policy", headers["x-atc-endpoint"]))
        self.assertEqual(rec["endpoint"], "m-sim-2")
        self.assertEqual([(s["endpoint"], s["score"], s["note"]) for s in rec["scores"]],
                         [("m-sim-1", 10, "slot 1"), ("m-sim-2", 20, "slot 2"), ("m-sim-3", 30, "slot 3")])
        log_path = os.path.join(self.tmp.name, "access.log")

        def line():
            if not os.path.exists(log_path):
                return None
            with open(log_path) as f:
                docs = [json.loads(l) for l in f]
            return next((d for d in docs if d["id"] == "explained"), None)
        doc = wait_for(line, timeout=5, what="the access log line")
        self.assertEqual((doc["decision"], doc["reason"]), ("policy", None))
        self.assertEqual(doc["explain"], rec)

    def test_explain_off_in_the_config_sends_no_record(self):
        self.policy_path = os.path.join(self.tmp.name, "policy.lua")
        self.write_policy(PICK_BY_N % 0)
        atc = self.start_atc(CONFIG.format(extra="", decode_ms=1).replace("explain: true", "explain: false"))
        status, headers, _ = chat(atc.port, model="m", max_tokens=1, headers={"x-atc-explain": "1"})
        self.assertEqual(status, 200)
        self.assertNotIn("x-atc-explain", headers)


if __name__ == "__main__":
    unittest.main()
