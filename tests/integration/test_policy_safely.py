"""Changing a policy safely (issue 16), end to end: rollback to the last version that served, answers that
say who decided, decision records, shadow policies and canaries. Each test runs atc serve with two workers
and a simulated fleet, and checks every request it sends."""

import http.client
import json
import os
import re
import subprocess
import threading
import time
import unittest

from harness import ATC_BIN, SLACK, SOURCE_DIR, AtcTestCase, chat, request, wait_for

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

    def admin(self, atc, method, path, body=None):
        status, _, data = request("127.0.0.1", atc.admin_port, method, path, body)
        return status, json.loads(data) if data else None

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
                             (200, "2", "endpoint"))
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
        self.assertEqual(answers[5:], [("2", "endpoint")] * 7)  # v2, not v1
        doc = self.policy_status(atc)
        self.assertEqual((doc["version"], doc["rollbacks"]), (2, 1))
        log = atc.read_log()
        # One rollback line, by the worker whose failure made the fifth in a row; the failures count
        # across both workers, as rollback_after does: 1, 2, 3, 4, 5, each once.
        self.assertEqual(re.findall(r"policy v3 failed (\d+) decisions in a row: rolling back to v2", log), ["5"])
        self.assertEqual(sorted(int(n) for n in re.findall(r"policy v3 error \((\d+) in a row across the workers", log)),
                         [1, 2, 3, 4, 5])

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
        # the metrics name the overrun as the header does
        _, _, metrics = request("127.0.0.1", atc.admin_port, "GET", "/metrics")
        metrics = metrics.decode() if isinstance(metrics, bytes) else metrics
        self.assertIn('atc_policy_failures_total{version="1",kind="overrun"} 1\n', metrics)
        self.assertIn('atc_policy_fallbacks_total{reason="overrun"} 1\n', metrics)


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
        self.assertEqual((rec["version"], rec["kind"], rec["endpoint"]), (1, "endpoint", headers["x-atc-endpoint"]))
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
        self.assertEqual((doc["decision"], doc["reason"]), ("endpoint", None))
        self.assertEqual(doc["explain"], rec)

    def test_the_shipped_policy_scores_every_candidate_as_the_docs_show(self):
        # docs/policies.md, "Reading a decision record": its command on the quick start with explain: true,
        # run as written (on this atc's port), prints the record the docs show.
        with open(os.path.join(SOURCE_DIR, "docs", "policies.md")) as f:
            doc = f.read()
        section = doc[doc.index("## Reading a decision record"):]
        command = re.search(r"```bash\n(curl .*)\n```", section).group(1)
        shown = json.loads(re.search(r"```json\n(.*)\n```", section).group(1))
        with open(os.path.join(SOURCE_DIR, "examples", "quickstart.yaml")) as f:
            text = f.read()
        text = re.sub(r"(?m)^listen: \S+", "listen: 127.0.0.1:0", text)
        text = re.sub(r"(?m)^admin: \S+", "admin: 127.0.0.1:0", text)
        text = re.sub(r"(?m)^  entry: \.\./scripts/policy\.lua.*$",
                      "  entry: " + os.path.join(SOURCE_DIR, "scripts", "policy.lua") + "\n  explain: true", text)
        atc = self.start_atc(text)
        out = subprocess.run(["sh", "-c", command.replace("127.0.0.1:8080", f"127.0.0.1:{atc.port}")],
                             capture_output=True, text=True, timeout=30)
        rec = json.loads(out.stdout)
        self.assertEqual(rec, shown)
        self.assertEqual([s["endpoint"] for s in rec["scores"]][1:],  # every candidate, the pick first
                         [f"llama-3-8b-sim-{i}" for i in (1, 2, 3) if f"llama-3-8b-sim-{i}" != rec["endpoint"]])

    def test_explain_off_in_the_config_sends_no_record(self):
        self.policy_path = os.path.join(self.tmp.name, "policy.lua")
        self.write_policy(PICK_BY_N % 0)
        atc = self.start_atc(CONFIG.format(extra="", decode_ms=1).replace("explain: true", "explain: false"))
        status, headers, _ = chat(atc.port, model="m", max_tokens=1, headers={"x-atc-explain": "1"})
        self.assertEqual(status, 200)
        self.assertNotIn("x-atc-explain", headers)


def load(port, n_requests, threads=4, headers_for=None, max_tokens=4, stream=False):
    """Sends n_requests chat requests from `threads` clients; returns [(status, headers)], every one.
    Only streamed answers give TTFT samples (the first token is the first event)."""
    results, lock, counter = [], threading.Lock(), iter(range(n_requests))

    def client():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        while True:
            with lock:
                n = next(counter, None)
            if n is None:
                return
            body = json.dumps({"model": "m", "max_tokens": max_tokens, "stream": stream,
                               "messages": [{"role": "user", "content": "x"}]})
            hdrs = {"content-type": "application/json", "x-atc-session": f"s{n}"}
            hdrs.update(headers_for(n) if headers_for else {})
            try:
                conn.request("POST", "/v1/chat/completions", body, hdrs)
                resp = conn.getresponse()
                resp.read()
                item = (resp.status, {k.lower(): v for k, v in resp.getheaders()})
            except Exception as e:  # a failed request is what these tests exist to catch
                item = (0, {"error": repr(e)})
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            with lock:
                results.append(item)
    ts = [threading.Thread(target=client) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return results


LEAST_LOADED = "return function(req, fleet) return atc.least_loaded(fleet:endpoints(req.model)) end -- %s\n"


class CanaryTest(SafelyTestCase):
    def canary(self, atc, source, share=0.5, window="2s"):
        self.write_policy(source)
        return self.reload(atc, {"canary": share, "window": window})

    def wait_end(self, atc):
        return wait_for(lambda: (lambda d: d if d["canary"] is None else None)(self.policy_status(atc)),
                        timeout=20, what="the canary's end")

    def test_a_canary_that_errors_rolls_back_and_no_request_fails(self):
        atc = self.start(LEAST_LOADED % "v1")
        status, doc = self.canary(atc, "return function(req, fleet)\n"
                                       "  if req.session then error('canary bug') end\n"
                                       "  return fleet:endpoints(req.model)[1]\nend\n")
        self.assertEqual((status, doc), (200, {"version": 2, "canary": True}))
        results = load(atc.port, 300)
        self.assertEqual([r for r in results if r[0] != 200], [])
        decided = {(h.get("x-atc-policy-version"), h["x-atc-decision"]) for _, h in results}
        self.assertIn((None, "fallback; reason=error"), decided)  # the canary's share fell back
        self.assertIn(("1", "endpoint"), decided)
        doc = self.wait_end(atc)
        self.assertEqual((doc["version"], doc["canary_rollbacks"], doc["canary_promotions"]), (1, 1, 0))
        self.assertIn("error rate", doc["last_canary"])
        self.assertIn("policy canary v2 rolled back: its error rate", atc.read_log())
        results = load(atc.port, 40)
        self.assertEqual({(r[0], r[1]["x-atc-policy-version"]) for r in results}, {(200, "1")})

    def test_a_canary_that_sends_everything_to_one_endpoint_rolls_back_on_ttft(self):
        self.policy_path = os.path.join(self.tmp.name, "policy.lua")
        self.write_policy(LEAST_LOADED % "v1")
        atc = self.start_atc(CONFIG.format(extra="", decode_ms=4).replace(
            "    count: 3\n", "    count: 3\n    max_seqs: 1\n    capacity: 64\n"))
        self.canary(atc, "return function(req, fleet) return fleet:endpoint('m-sim-1') end\n", share=0.5, window="4s")
        results = load(atc.port, 600, threads=8, stream=True)
        self.assertEqual([r for r in results if r[0] != 200], [])
        doc = self.wait_end(atc)
        self.assertEqual((doc["version"], doc["canary_rollbacks"]), (1, 1), doc)
        self.assertIn("TTFT p90", doc["last_canary"])

    def test_a_good_canary_is_promoted_and_a_session_stays_on_its_side(self):
        atc = self.start(LEAST_LOADED % "v1")
        status, doc = self.canary(atc, LEAST_LOADED % "v2", share=0.3)
        self.assertEqual(status, 200)
        results = load(atc.port, 300, headers_for=lambda n: {"x-atc-session": f"s{n % 20}"})
        self.assertEqual([r for r in results if r[0] != 200], [])
        sides = {}
        for _, h in results:
            sides.setdefault(h.get("x-atc-decision"), set()).add(h["x-atc-policy-version"])
        self.assertEqual(sides, {"endpoint": {"1"}, "endpoint; canary": {"2"}})
        doc = self.policy_status(atc)
        self.assertEqual(doc["canary"]["version"], 2)
        doc = self.wait_end(atc)
        self.assertEqual((doc["version"], doc["canary_promotions"]), (2, 1), doc)
        self.assertIn("v2 promoted", doc["last_canary"])
        results = load(atc.port, 20)
        self.assertEqual({(r[0], r[1]["x-atc-decision"], r[1]["x-atc-policy-version"]) for r in results},
                         {(200, "endpoint", "2")})

    def test_a_canary_goes_on_while_endpoints_come_and_go(self):
        # With DNS discovery the endpoint set may change more often than any canary window ends: an endpoint
        # added and removed leaves the canary running (same version, its counts going on), and its side
        # routes to the new endpoint too.
        atc = self.start(LEAST_LOADED % "v1")
        self.assertEqual(self.canary(atc, LEAST_LOADED % "v2", share=0.5, window="1h")[0], 200)
        self.assertEqual([r for r in load(atc.port, 20) if r[0] != 200], [])
        extra = self.start_sim("x", model="m", extra=["--decode-ms", "1"])
        self.assertEqual(self.admin(atc, "POST", "/admin/endpoints", {"model": "m", "id": "x", "url": extra.url})[0], 201)
        wait_for(lambda: atc.endpoints()["x"]["state"] == "healthy", what="x healthy")
        results = load(atc.port, 60)
        self.assertEqual([r for r in results if r[0] != 200], [])
        canary_side = {h["x-atc-endpoint"] for _, h in results if h.get("x-atc-decision") == "endpoint; canary"}
        self.assertIn("x", canary_side)
        self.assertEqual(self.admin(atc, "DELETE", "/admin/endpoints/x")[0], 200)
        self.assertEqual([r for r in load(atc.port, 20) if r[0] != 200], [])
        doc = self.policy_status(atc)
        self.assertEqual((doc["version"], doc["canary"]["version"]), (1, 2), doc)
        self.assertNotIn("canary ended", atc.read_log())

    def test_promote_and_rollback_by_hand(self):
        atc = self.start(LEAST_LOADED % "v1")
        self.assertEqual(self.admin(atc, "POST", "/admin/policy/promote")[0], 409)  # no canary yet
        self.canary(atc, LEAST_LOADED % "v2", window="1h")
        status, doc = self.admin(atc, "POST", "/admin/policy/rollback")
        self.assertEqual((status, doc["canary"], doc["promoted"]), (200, 2, False))
        self.assertEqual(self.policy_status(atc)["version"], 1)
        self.canary(atc, LEAST_LOADED % "v3", window="1h")
        status, doc = self.admin(atc, "POST", "/admin/policy/promote")
        self.assertEqual((status, doc["canary"]), (200, 3))
        self.assertEqual(self.policy_status(atc)["version"], 3)

    def test_the_cli_runs_a_canary_and_a_shadow_and_status_shows_them(self):
        atc = self.start(LEAST_LOADED % "v1")
        admin = ["--admin", f"127.0.0.1:{atc.admin_port}"]

        def cli(*args):
            return subprocess.run([ATC_BIN, *args, *admin], capture_output=True, text=True, cwd=self.tmp.name)
        self.write_policy(LEAST_LOADED % "v2")
        out = cli("policy", "canary", "0.5", "1h")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn('"canary":true', out.stdout)
        other = self.write_policy(LEAST_LOADED % "v9", "candidate.lua")
        self.assertEqual(cli("policy", "shadow", other).returncode, 0)
        load(atc.port, 40)
        status = cli("status").stdout
        self.assertRegex(status, r"shadow v1 beside v1: \d+ decisions, agreement (\d\.\d\d|-), ")
        self.assertRegex(status, r"canary v2 for 0.5 of the requests: \d+ decisions, 0 fallbacks")
        out = cli("policy", "promote")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("last canary: v2 promoted: by hand", cli("status").stdout)
        self.assertEqual(cli("policy", "rollback").returncode, 1)  # no canary left
        self.assertEqual(cli("policy", "shadow", "clear").returncode, 0)
        self.assertNotIn("shadow v", cli("status").stdout)


class CanaryWithWatchTest(SafelyTestCase):
    """docs/policies.md's procedure with the default policy.watch (on): ask for the canary, then edit."""

    def start_watched(self, source):
        self.policy_path = os.path.join(self.tmp.name, "policy.lua")
        self.write_policy(source)
        return self.start_atc(CONFIG.format(extra="", decode_ms=1).replace("  watch: false\n", ""))

    def cli(self, atc, *args):
        return subprocess.run([ATC_BIN, *args, "--admin", f"127.0.0.1:{atc.admin_port}"], capture_output=True,
                              text=True, cwd=self.tmp.name)

    def test_the_documented_procedure_canaries_the_edit_on_5_percent_and_status_shows_both(self):
        atc = self.start_watched(LEAST_LOADED % "v1")
        self.assertTrue(self.policy_status(atc)["watch"])
        out = self.cli(atc, "policy", "canary", "0.05", "5m")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("canary armed", out.stdout)
        self.assertIn("canary armed for 0.05", self.cli(atc, "status").stdout)
        self.write_policy(LEAST_LOADED % "v2")  # the edit
        # (until every worker adopted it, the status may show the canary while it is still armed)
        doc = wait_for(lambda: (lambda d: d if d["canary"] and d["canary_armed"] is None else None)(
            self.policy_status(atc)), what="the canary built from the edit, adopted")
        self.assertEqual((doc["version"], doc["canary"]["version"], doc["canary"]["share"]), (1, 2, 0.05))
        self.assertIsNone(doc["canary_armed"])
        results = load(atc.port, 400, headers_for=lambda n: {"x-atc-session": f"s{n}"})
        sides = {}
        for _, h in results:
            sides[h["x-atc-decision"]] = sides.get(h["x-atc-decision"], 0) + 1
        self.assertEqual(set(sides), {"endpoint", "endpoint; canary"})
        self.assertLess(sides["endpoint; canary"], 60)  # about 5% of 400, not everything
        status = self.cli(atc, "status").stdout
        self.assertIn("policy version 1;", status)
        self.assertRegex(status, r"canary v2 for 0.05 of the requests: \d+ decisions, \d+ fallbacks, "
                                 r"TTFT p90 (\d+\.\d ms|-) \(current (\d+\.\d ms|-)\)")
        self.assertNotIn("null", status)
        # Another edit while the canary runs does not replace the version it is judged against.
        self.write_policy(LEAST_LOADED % "v3")
        wait_for(lambda: "not reloaded" in atc.read_log(), what="the held-back change's log line")
        doc = self.policy_status(atc)
        self.assertEqual((doc["version"], doc["canary"]["version"]), (1, 2))

    def test_rollback_disarms_a_canary_that_waits_for_the_files(self):
        atc = self.start_watched(LEAST_LOADED % "v1")
        self.assertEqual(self.cli(atc, "policy", "canary", "0.05").returncode, 0)
        self.assertEqual(self.cli(atc, "policy", "rollback").returncode, 0)
        self.assertIsNone(self.policy_status(atc)["canary_armed"])
        self.write_policy(LEAST_LOADED % "v2")
        doc = wait_for(lambda: (lambda d: d if d["version"] == 2 else None)(self.policy_status(atc)),
                       what="the edit reloaded as the whole policy")
        self.assertIsNone(doc["canary"])

    def test_watch_false_by_a_yaml_reload_stops_the_watch(self):
        atc = self.start_watched(LEAST_LOADED % "v1")
        with open(atc.config_path) as f:
            text = f.read()
        with open(atc.config_path, "w") as f:
            f.write(text.replace("  explain: true\n", "  explain: true\n  watch: false\n"))
        out = self.cli(atc, "reload", "--yaml")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertFalse(self.policy_status(atc)["watch"])
        self.assertIn("policy.watch is off", atc.read_log())
        # Without the watch a canary loads the files as they are, at once.
        self.write_policy(LEAST_LOADED % "v2")
        status, doc = self.reload(atc, {"canary": 0.05, "window": "1h"})  # the YAML reload made v2
        self.assertEqual((status, doc), (200, {"version": 3, "canary": True}))


class ShadowTest(SafelyTestCase):
    def test_the_shipped_policy_shadowing_itself_agrees_on_every_decision(self):
        self.policy_path = os.path.join(self.tmp.name, "policy.lua")
        shipped = os.path.join(os.environ.get("ATC_SOURCE_DIR", "."), "scripts", "policy.lua")
        # A 50 ms budget: one decision over 1 ms of thread CPU (a loaded or TSan machine) falls back in the
        # shadow only and reads as a disagreement; this test is about the comparison, not the budget.
        atc = self.start_atc(CONFIG.format(extra=f"  budget: 50ms\n  shadow:\n    entry: {os.path.abspath(shipped)}\n    sample: 1",
                                           decode_ms=1).replace("entry: policy.lua", f"entry: {os.path.abspath(shipped)}"))
        wait_for(lambda: self.policy_status(atc)["shadow"], timeout=10, what="the shadow")
        results = load(atc.port, 300, headers_for=lambda n: {"x-atc-session": f"s{n % 17}"})
        self.assertEqual([r for r in results if r[0] != 200], [])
        doc = self.policy_status(atc)["shadow"]
        self.assertEqual((doc["version"], doc["live_version"], doc["decisions"]), (1, 1, 300), doc)
        self.assertEqual(doc["agreed"], 300, doc)
        self.assertEqual(doc["picks"], doc["live_picks"])
        status, _, body = request("127.0.0.1", atc.admin_port, "GET", "/metrics")
        self.assertIn('atc_policy_shadow_agreed_total{live="1",shadow="1"} 300', body.decode())

    def test_a_shadow_loaded_and_cleared_at_run_time_is_never_acted_on(self):
        atc = self.start(PICK_BY_N % 0)
        other = self.write_policy(PICK_BY_N % 1, "candidate.lua")
        status, doc = self.admin(atc, "POST", "/admin/policy/shadow", {"entry": other, "sample": 1})
        self.assertEqual((status, doc), (200, {"version": 1, "shadow": True}))
        results = load(atc.port, 90, headers_for=lambda n: {"x-n": str(n)})
        for _, h in results:  # the live pick, always
            self.assertEqual(h["x-atc-policy-version"], "1")
        ends = {h["x-atc-endpoint"] for _, h in results}
        self.assertEqual(ends, {"m-sim-1", "m-sim-2", "m-sim-3"})
        doc = self.policy_status(atc)["shadow"]
        self.assertEqual((doc["decisions"], doc["agreed"]), (90, 0))  # shifted by one: never the same
        self.assertEqual(self.admin(atc, "POST", "/admin/policy/shadow/clear")[0], 200)
        self.assertIsNone(self.policy_status(atc)["shadow"])

    def test_a_shadows_record_goes_on_while_endpoints_come_and_go(self):
        # An endpoint added and removed through the admin API changes neither the shadow's version nor its
        # record: its decisions, agreement and picks (kept by endpoint slot) go on counting across both.
        atc = self.start(PICK_BY_N % 0)
        other = self.write_policy(PICK_BY_N % 1, "candidate.lua")
        self.assertEqual(self.admin(atc, "POST", "/admin/policy/shadow", {"entry": other, "sample": 1})[0], 200)
        self.assertEqual([r for r in load(atc.port, 30, headers_for=lambda n: {"x-n": str(n)}) if r[0] != 200], [])
        before = self.policy_status(atc)["shadow"]
        self.assertEqual((before["version"], before["decisions"], before["agreed"]), (1, 30, 0), before)
        extra = self.start_sim("x", model="m", extra=["--decode-ms", "1"])
        self.assertEqual(self.admin(atc, "POST", "/admin/endpoints", {"model": "m", "id": "x", "url": extra.url})[0], 201)
        wait_for(lambda: atc.endpoints()["x"]["state"] == "healthy", what="x healthy")
        results = load(atc.port, 30, headers_for=lambda n: {"x-n": str(n)})
        self.assertEqual([r for r in results if r[0] != 200], [])
        self.assertIn("x", {h["x-atc-endpoint"] for _, h in results})
        self.assertEqual(self.admin(atc, "DELETE", "/admin/endpoints/x")[0], 200)
        self.assertEqual([r for r in load(atc.port, 30, headers_for=lambda n: {"x-n": str(n)}) if r[0] != 200], [])
        doc = self.policy_status(atc)["shadow"]
        self.assertEqual((doc["version"], doc["live_version"], doc["decisions"], doc["agreed"]), (1, 1, 90, 0), doc)
        for ep, n in before["picks"].items():  # what it counted before the changes is still counted
            self.assertGreaterEqual(doc["picks"][ep], n, doc)
        self.assertNotIn("x", doc["picks"])  # (a removed endpoint is no longer named)
        self.assertNotIn("policy shadow removed", atc.read_log())

    def test_a_shadow_that_differs_agrees_as_often_as_atc_replay_computes_from_the_recording(self):
        by_session = """
            return function(req, fleet)
              local eps = fleet:endpoints(req.model)
              local h = atc.hash(req.session or "")
              %s
              return eps[h %% #eps + 1]
            end
        """.replace("\n            ", "\n")
        live = by_session % ""
        candidate = self.write_policy(by_session % "if h % 2 == 1 then h = h + 1 end", "candidate.lua")
        self.policy_path = os.path.join(self.tmp.name, "policy.lua")
        self.write_policy(live)
        traces = os.path.join(self.tmp.name, "traces")
        atc = self.start_atc(CONFIG.format(
            extra=f"  shadow:\n    entry: {candidate}\nrecord:\n  dir: {traces}", decode_ms=1))
        wait_for(lambda: self.policy_status(atc)["shadow"], timeout=10, what="the shadow")
        results = load(atc.port, 200, threads=2, headers_for=lambda n: {"x-atc-session": f"user-{n % 53}"})
        self.assertEqual([r for r in results if r[0] != 200], [])
        doc = self.policy_status(atc)["shadow"]
        self.assertEqual(doc["decisions"], 200)
        self.assertTrue(0 < doc["agreed"] < 200, doc)
        atc.stop()  # the recorder flushes
        trace = os.path.join(traces, sorted(os.listdir(traces))[0])
        dump = subprocess.run([ATC_BIN, "trace", "dump", trace], capture_output=True, text=True, check=True)
        records = [json.loads(l) for l in dump.stdout.splitlines() if not l.startswith("#")]
        self.assertEqual(len(records), 200)
        self.assertEqual(sum(r["shadow_endpoint"] == r["endpoint"] for r in records), doc["agreed"])
        self.assertEqual({r["shadow_version"] for r in records}, {1})
        out = subprocess.run([ATC_BIN, "replay", "-c", atc.config_path, "--trace", trace, "--vs",
                              f"candidate={candidate}"], capture_output=True, text=True, cwd=self.tmp.name)
        self.assertEqual(out.returncode, 0, out.stderr)
        line = [l for l in out.stdout.splitlines() if l.startswith("candidate: agreement")][0]
        self.assertIn(f"recorded live picks {doc['agreed']}/200", line)
        self.assertIn("with the recorded shadow picks 200/200", line)
        self.assertIn("TTFT p90", line)
        # the same figures in --json and the HTML report
        html = os.path.join(self.tmp.name, "replay.html")
        out = subprocess.run([ATC_BIN, "replay", "-c", atc.config_path, "--trace", trace, "--vs",
                              f"candidate={candidate}", "--json", "--html", html], capture_output=True, text=True,
                             cwd=self.tmp.name)
        self.assertEqual(out.returncode, 0, out.stderr)
        cand = [p for p in json.loads(out.stdout)["policies"] if p["name"] == "candidate"][0]
        self.assertEqual(cand["agreement"], {"live": round(doc["agreed"] / 200, 4), "live_picks": 200,
                                             "shadow": 1.0, "shadow_picks": 200})
        with open(html) as f:
            self.assertIn(f"candidate: agreement with the recorded live picks {doc['agreed']}/200", f.read())


class EntryPathTest(SafelyTestCase):
    """A shadow's entry is a regular file of at most 1 MiB under the live policy's folder (issue 25): a FIFO,
    a device or a file elsewhere is refused at once with a message that quotes no content, and atc still
    reloads and stops on SIGTERM."""

    def refused(self, atc, entry):
        t0 = time.monotonic()
        status, doc = self.admin(atc, "POST", "/admin/policy/shadow", {"entry": entry, "sample": 1})
        elapsed = time.monotonic() - t0
        self.assertLess(elapsed, 2.0 * SLACK, f"{entry}: answered after {elapsed:.2f}s")
        self.assertEqual(status, 422, doc)
        return doc["error"]["message"]

    def test_a_fifo_a_device_or_a_file_elsewhere_is_refused_within_2s_and_atc_still_stops(self):
        atc = self.start(LEAST_LOADED % "v1")
        fifo = os.path.join(self.tmp.name, "fifo.lua")
        os.mkfifo(fifo)
        self.assertEqual(self.refused(atc, fifo), f"{fifo}: not a regular file")
        self.assertEqual(self.refused(atc, "/dev/zero"),
                         "/dev/zero: outside the live policy's folder and policy.path")
        link = os.path.join(self.tmp.name, "zero.lua")
        os.symlink("/dev/zero", link)  # inside by name, not once resolved
        self.assertEqual(self.refused(atc, link), f"{link}: outside the live policy's folder and policy.path")
        msg = self.refused(atc, "/etc/passwd")
        self.assertEqual(msg, "/etc/passwd: outside the live policy's folder and policy.path")  # no line of it
        big = self.write_policy("-- " + "x" * (1024 * 1024) + "\nreturn function() end\n", "big.lua")
        self.assertEqual(self.refused(atc, big), f"{big}: larger than 1MiB")
        self.assertIn(f"policy shadow failed to load: {fifo}: not a regular file", atc.read_log())
        # The live entry and a module it requires are read the same way: a FIFO there fails the reload
        # at once (the loader thread is not stuck on it) and the next reload works.
        os.mkfifo(os.path.join(self.tmp.name, "policy.fifo"))
        os.replace(os.path.join(self.tmp.name, "policy.fifo"), self.policy_path)
        t0 = time.monotonic()
        status, doc = self.reload(atc)
        self.assertLess(time.monotonic() - t0, 2.0 * SLACK)
        self.assertEqual((status, doc["error"]["message"]), (422, f"cannot read {self.policy_path}: not a regular file"))
        self.write_policy("return require('big')\n")
        status, doc = self.reload(atc)
        self.assertEqual(status, 422)
        self.assertIn(f"cannot read {big}: larger than 1MiB", doc["error"]["message"])
        self.write_policy(LEAST_LOADED % "v2")
        self.assertEqual(self.reload(atc), (200, {"version": 2}))
        status, doc = self.admin(atc, "POST", "/admin/policy/shadow", {"entry": self.policy_path, "sample": 1})
        self.assertEqual((status, doc), (200, {"version": 1, "shadow": True}))
        self.assertEqual(chat(atc.port, model="m", max_tokens=1)[0], 200)
        t0 = time.monotonic()
        self.assertEqual(atc.stop(timeout=5), 0)  # SIGTERM, not the SIGKILL after 5 s
        self.assertLess(time.monotonic() - t0, 5.0)


class InitWarningTest(SafelyTestCase):
    """The shipped policy's init warns about an alias whose target nothing serves (issue 31): once per load,
    not once per worker, and at the alias's own line in capability.lua, not at init's atc.log call."""

    def test_the_alias_warning_is_logged_once_per_load_at_the_alias(self):
        scripts = os.path.abspath(os.path.join(SOURCE_DIR, "scripts"))
        with open(os.path.join(scripts, "capability.lua")) as f:
            line = next(i for i, text in enumerate(f, 1) if text.lstrip().startswith("auto = alias"))
        atc = self.start_atc(f"""
listen: 127.0.0.1:0
admin: 127.0.0.1:0
workers: 2
policy:
  entry: {scripts}/policy.lua
  watch: false
models:
  - name: llama-3-8b
  - name: qwen-2.5-1.5b
simulate:
  - model: llama-3-8b
    count: 1
  - model: qwen-2.5-1.5b
    count: 1
""")
        warning = f"{scripts}/capability.lua:{line}: alias 'auto': no endpoint serves 'llama-3-70b'"
        lines = [l for l in atc.read_log().splitlines() if "no endpoint serves" in l]
        self.assertEqual(len(lines), 1, lines)
        self.assertTrue(lines[0].endswith(f"policy v1: {warning}"), lines[0])
        self.assertEqual(self.reload(atc), (200, {"version": 2}))
        lines = [l for l in atc.read_log().splitlines() if "no endpoint serves" in l]
        self.assertEqual(len(lines), 2, lines)
        self.assertTrue(lines[1].endswith(f"policy v2: {warning}"), lines[1])


if __name__ == "__main__":
    unittest.main()
