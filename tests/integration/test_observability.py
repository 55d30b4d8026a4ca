"""Metrics, access log, admin API and CLI, as an operator's tools see them."""

import json
import os
import re
import shutil
import signal
import subprocess
import unittest

from harness import ATC_BIN, SOURCE_DIR, AtcTestCase, chat, request, stream_events, wait_for

CONFIG = """
listen: 127.0.0.1:0
admin: 127.0.0.1:0
access_log: access.log
{extra}
policy:
  entry: {scripts}/policy.lua
models:
  - name: llama-3-8b
simulate:
  - model: llama-3-8b
    count: 2
    decode_ms: 2
"""


def parse_metrics(text):
    """{(name, frozenset(labels)): value} from Prometheus text."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$', line)
        assert m, f"bad line: {line}"
        labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        out[(m.group(1), labels)] = float(m.group(4))
    return out


def total(metrics, name, **labels):
    want = set(labels.items())
    return sum(v for (n, ls), v in metrics.items() if n == name and want <= set(ls))


class ObservabilityTest(AtcTestCase):
    def start(self, extra=""):
        return self.start_atc(CONFIG.format(extra=extra, scripts=os.path.join(SOURCE_DIR, "scripts")))

    def scrape(self, atc, headers=None):
        status, hdrs, body = request("127.0.0.1", atc.admin_port, "GET", "/metrics", headers=headers)
        self.assertEqual(status, 200)
        self.assertTrue(hdrs["content-type"].startswith("text/plain"))
        return body.decode()

    def access_lines(self, atc, name="access.log"):
        path = os.path.join(self.tmp.name, name)
        with open(path) as f:
            return [json.loads(line) for line in f.read().splitlines()]

    def test_metrics_move_with_a_known_request_mix(self):
        atc = self.start()
        ids = []
        for _ in range(3):
            status, headers, events = stream_events(atc.port, {"model": "llama-3-8b", "stream": True, "max_tokens": 4,
                                                                "messages": [{"role": "user", "content": "hi"}]},
                                                    headers={"x-atc-priority": "7"})
            self.assertEqual(status, 200)
            ids.append(headers["x-request-id"])
        for _ in range(2):
            status, headers, _ = chat(atc.port, max_tokens=2)
            self.assertEqual(status, 200)
            ids.append(headers["x-request-id"])
        status, headers, _ = request("127.0.0.1", atc.port, "POST", "/v1/chat/completions", b"{not json",
                                     {"x-request-id": "bad-1"})
        self.assertEqual((status, headers["x-request-id"]), (400, "bad-1"))
        status, _, _ = chat(atc.port, model="nope")
        self.assertEqual(status, 404)

        text = self.scrape(atc)
        if shutil.which("promtool"):
            check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
            self.assertEqual(check.returncode, 0, check.stdout + check.stderr)
        m = parse_metrics(text)
        self.assertEqual(total(m, "atc_requests_total", model="llama-3-8b", status="200", priority="7"), 3)
        self.assertEqual(total(m, "atc_requests_total", model="llama-3-8b", status="200", priority="0"), 2)
        self.assertEqual(total(m, "atc_requests_total", status="400"), 1)
        self.assertEqual(total(m, "atc_requests_total", model="other", status="404"), 1)  # a client's name
        self.assertEqual(total(m, "atc_request_duration_seconds_count", model="llama-3-8b"), 5)
        # the 3 streams: a TTFT is a stream's first data event; a whole answer's first token is not seen
        self.assertEqual(total(m, "atc_request_ttft_seconds_count", model="llama-3-8b"), 3)
        # 3 streams x (role + 4 tokens, the last with finish_reason as vLLM sends it, + [DONE]) events
        self.assertEqual(total(m, "atc_relayed_sse_events_total"), 3 * 6)
        self.assertEqual(total(m, "atc_policy_decision_seconds_count"), 6)  # every routed request, and "nope"
        self.assertEqual(total(m, "atc_endpoint_attempts_total"), 5)
        self.assertEqual(total(m, "atc_policy_version"), 1)
        self.assertEqual(total(m, "atc_endpoint_inflight_requests"), 0)
        self.assertEqual(total(m, "atc_admitted_total", how="direct"), 5)

        # One valid JSON line per request, failed ones included, with the ids the clients saw. Each worker
        # writes its own lines, so lines of requests served by different workers may come in any order.
        lines = wait_for(lambda: (lambda l: l if len(l) == 7 else None)(self.access_lines(atc)), timeout=5,
                         what="seven access log lines")
        by_id = {l["id"]: l for l in lines}
        self.assertEqual(len(by_id), 7)
        self.assertEqual([by_id[i]["status"] for i in ids], [200] * 5)
        self.assertEqual(by_id["bad-1"]["status"], 400)
        unknown = [l for l in lines if l["id"] not in ids and l["id"] != "bad-1"]
        self.assertEqual([l["status"] for l in unknown], [404])
        first = by_id[ids[0]]
        self.assertTrue(first["stream"])
        self.assertEqual(first["sse_events"], 6)
        self.assertIsNotNone(first["ttft_ms"])
        self.assertIn(first["endpoint"], ("llama-3-8b-sim-1", "llama-3-8b-sim-2"))
        self.assertIsNone(unknown[0]["endpoint"])
        self.assertIn("does not exist", unknown[0]["error"])

    def test_model_names_a_client_sends_do_not_grow_the_metrics(self):
        atc = self.start()
        def send(i):
            # distinct names, some longer than a label is kept (so a cut name must still find its series)
            status, _, _ = chat(atc.port, model=("x" * (150 if i % 2 else 10)) + str(i), max_tokens=1)
            self.assertEqual(status, 404)
        for i in range(50):
            send(i)
        before = len(self.scrape(atc))
        for i in range(50, 3000):
            send(i)
        text = self.scrape(atc)
        self.assertLess(len(text), before + 200, "3,000 more unknown model names added series")
        m = parse_metrics(text)
        self.assertEqual(total(m, "atc_requests_total", model="other", status="404"), 3000)

    def test_sigusr1_reopens_the_access_log(self):
        atc = self.start()
        chat(atc.port, max_tokens=1)
        wait_for(lambda: len(self.access_lines(atc)) == 1, what="first line")
        os.rename(os.path.join(self.tmp.name, "access.log"), os.path.join(self.tmp.name, "access.log.1"))
        atc.signal(signal.SIGUSR1, "SIGUSR1: reopening")
        wait_for(lambda: os.path.exists(os.path.join(self.tmp.name, "access.log")), what="new file")
        chat(atc.port, max_tokens=1)
        lines = wait_for(lambda: self.access_lines(atc), what="a line in the new file")
        self.assertEqual(len(lines), 1)
        self.assertEqual(len(self.access_lines(atc, "access.log.1")), 1)

    def test_admin_token_config_and_cli(self):
        atc = self.start(extra="admin_token: s3cret-token")
        for headers in (None, {"authorization": "Bearer wrong"}, {"authorization": "s3cret-token"}):
            status, hdrs, body = request("127.0.0.1", atc.admin_port, "GET", "/admin/endpoints", headers=headers)
            self.assertEqual(status, 401, headers)
            self.assertEqual(json.loads(body)["error"]["code"], "invalid_admin_token")
        status, _, _ = request("127.0.0.1", atc.admin_port, "GET", "/metrics")
        self.assertEqual(status, 401)
        status, _, _ = request("127.0.0.1", atc.admin_port, "GET", "/health")  # for probes, always open
        self.assertEqual(status, 200)
        auth = {"authorization": "Bearer s3cret-token"}
        status, _, body = request("127.0.0.1", atc.admin_port, "GET", "/admin/config", headers=auth)
        self.assertEqual(status, 200)
        cfg = json.loads(body)
        self.assertEqual(cfg["admin_token"], "(set)")  # never the secret itself
        self.assertEqual(cfg["models"][0]["endpoints"], ["llama-3-8b-sim-1", "llama-3-8b-sim-2"])
        self.scrape(atc, headers=auth)

        admin = f"127.0.0.1:{atc.admin_port}"
        out = subprocess.run([ATC_BIN, "status", "--admin", admin], capture_output=True, text=True, timeout=10)
        self.assertEqual(out.returncode, 1)
        self.assertIn("401", out.stderr)
        out = subprocess.run([ATC_BIN, "status", "--admin", admin, "--token", "s3cret-token"], capture_output=True,
                             text=True, timeout=10)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertRegex(out.stdout, r"llama-3-8b-sim-1\s+llama-3-8b\s+\w+\s+0\s+64")
        self.assertIn("policy version 1", out.stdout)
        env = dict(os.environ, ATC_ADMIN_TOKEN="s3cret-token")
        out = subprocess.run([ATC_BIN, "reload", "--admin", admin], capture_output=True, text=True, timeout=10,
                             env=env)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn('"version":2', out.stdout)


class AdminSafetyTest(AtcTestCase):
    """Without admin_token the admin API listens on loopback and refuses what a web page can send."""

    def test_a_web_page_cannot_drive_the_admin_api(self):
        atc = self.start_atc(CONFIG.format(extra="", scripts=os.path.join(SOURCE_DIR, "scripts")))
        port = atc.admin_port
        refused = [
            ("POST", "/admin/policy/reload", {"content-type": "text/plain", "origin": "http://evil.example"}),
            ("POST", "/admin/policy/reload", {"content-type": "text/plain"}),  # a simple cross-site POST
            ("POST", "/admin/endpoints/llama-3-8b-sim-1/drain", {"content-type": "application/x-www-form-urlencoded"}),
            ("POST", "/admin/policy/reload", {"origin": "http://evil.example"}),
            ("GET", "/admin/config", {"host": "evil.example:%d" % port}),  # DNS rebinding
            ("GET", "/metrics", {"host": "rebind.evil.example"}),
            # names that start like a loopback address but are names anyone can point at 127.0.0.1
            ("GET", "/admin/config", {"host": "127.0.0.1.rebind.example"}),
            ("GET", "/admin/config", {"host": "127.0.0.1.rebind.example:%d" % port,
                                      "origin": "http://127.0.0.1.rebind.example:%d" % port}),
            ("POST", "/admin/endpoints/llama-3-8b-sim-1/drain", {"host": "127.anything"}),
            ("POST", "/admin/policy/reload", {"host": "127.1"}),
            ("GET", "/admin/config", {"host": "[::1].rebind.example"}),
        ]
        for method, path, headers in refused:
            status, _, body = request("127.0.0.1", port, method, path, headers=headers)
            self.assertEqual(status, 403, (method, path, headers, body))
            self.assertEqual(json.loads(body)["error"]["code"], "cross_site_request")
        status, _, body = request("127.0.0.1", port, "GET", "/admin/policy")
        self.assertEqual(json.loads(body)["version"], 1, "nothing was reloaded")
        # what curl, scripts and atc's own CLI send still works, as does a page of the admin port itself
        status, _, _ = request("127.0.0.1", port, "POST", "/admin/policy/reload")
        self.assertEqual(status, 200)
        status, _, _ = request("127.0.0.1", port, "GET", "/admin/config",
                               headers={"origin": "http://127.0.0.1:%d" % port})
        self.assertEqual(status, 200)
        status, _, _ = request("localhost", port, "GET", "/admin/config")
        self.assertEqual(status, 200)
        for host in ("127.0.0.1:%d" % port, "127.1.2.3", "[::1]:%d" % port, "LOCALHOST"):
            status, _, _ = request("127.0.0.1", port, "GET", "/admin/config", headers={"host": host})
            self.assertEqual(status, 200, host)
        # an id that decodes to a NUL or a '/' names no endpoint
        for bad in ("llama-3-8b-sim-1%00x", "llama-3-8b-sim-1%2Fx"):
            status, _, _ = request("127.0.0.1", port, "POST", f"/admin/endpoints/{bad}/drain")
            self.assertEqual(status, 404, bad)
        status, _, body = request("127.0.0.1", port, "GET", "/admin/endpoints")
        self.assertTrue(all(e["routable"] for e in json.loads(body)["endpoints"]), "nothing was drained")

    def test_a_non_loopback_admin_needs_a_token(self):
        cfg = os.path.join(self.tmp.name, "atc.yaml")
        text = CONFIG.format(extra="", scripts=os.path.join(SOURCE_DIR, "scripts")).replace(
            "admin: 127.0.0.1:0", "admin: 0.0.0.0:0")
        with open(cfg, "w") as f:
            f.write(text)
        out = subprocess.run([ATC_BIN, "check", "-c", cfg], capture_output=True, text=True, timeout=10)
        self.assertEqual(out.returncode, 1)
        self.assertRegex(out.stderr, r"atc\.yaml:3:\d+: key 'admin': '0\.0\.0\.0' is not a loopback address")
        with open(cfg, "w") as f:
            f.write(text.replace("access_log: access.log", "access_log: access.log\nadmin_token: t0ken"))
        out = subprocess.run([ATC_BIN, "check", "-c", cfg], capture_output=True, text=True, timeout=10)
        self.assertEqual(out.returncode, 0, out.stderr)

    def test_the_bearer_scheme_is_case_insensitive(self):
        atc = self.start_atc(CONFIG.format(extra="admin_token: s3cret", scripts=os.path.join(SOURCE_DIR, "scripts")))
        for scheme in ("Bearer", "bearer", "BEARER"):
            status, _, _ = request("127.0.0.1", atc.admin_port, "GET", "/admin/config",
                                   headers={"authorization": f"{scheme} s3cret"})
            self.assertEqual(status, 200, scheme)


class ConfigReloadTest(AtcTestCase):
    CONFIG = """
listen: 127.0.0.1:0
admin: 127.0.0.1:0
policy:
  entry: {scripts}/policy.lua
  watch: false
health:
  live: {{interval: 200ms}}
  ready: {{interval: 200ms}}
  slow_start: 0s
models:
  - name: llama-3-8b
    endpoints:
{endpoints}
"""

    def write(self, path, sims):
        eps = "".join(f'      - {{id: {name}, url: "{sim.url}"}}\n' for name, sim in sims)
        with open(path + ".new", "w") as f:
            f.write(self.CONFIG.format(scripts=os.path.join(SOURCE_DIR, "scripts"), endpoints=eps))
        os.replace(path + ".new", path)

    def test_endpoints_added_and_removed_under_load_without_a_failed_request(self):
        import threading
        a, b, c = self.start_sim("a"), self.start_sim("b"), self.start_sim("c")
        cfg = os.path.join(self.tmp.name, "atc.yaml")
        self.write(cfg, [("a", a), ("b", b)])
        atc = self.start_atc(open(cfg).read())
        cfg = atc.config_path  # the harness's copy is the file atc reads
        self.write(cfg, [("a", a), ("b", b)])
        results, stop = [], threading.Event()

        def client():
            while not stop.is_set():
                status, headers, _ = chat(atc.port, max_tokens=2)
                results.append((status, headers.get("x-atc-endpoint"), time_now()))

        import time as _t
        time_now = _t.monotonic
        threads = [threading.Thread(target=client) for _ in range(3)]
        for t in threads:
            t.start()
        wait_for(lambda: len(results) > 30, what="traffic")
        self.write(cfg, [("b", b), ("c", c)])  # a leaves, c joins
        atc.signal(signal.SIGHUP, "SIGHUP: reloading")
        wait_for(lambda: set(atc.endpoints()) == {"b", "c"}, what="reloaded endpoints")
        wait_for(lambda: atc.endpoints()["c"]["state"] == "healthy", what="c healthy")
        reloaded_at = time_now()
        wait_for(lambda: any(e == "c" for _, e, _ in results), timeout=10, what="traffic on c")
        n = len(results)
        wait_for(lambda: len(results) > n + 30, what="more traffic after the reload")
        # An invalid file changes nothing and says why, with the position.
        with open(cfg, "a") as f:
            f.write("bogus_key: 1\n")
        status, _, body = request("127.0.0.1", atc.admin_port, "POST", "/admin/config/reload")
        self.assertEqual(status, 422)
        self.assertRegex(json.loads(body)["error"]["message"], r"atc\.yaml:\d+:\d+: .*bogus_key")
        self.assertEqual(set(atc.endpoints()), {"b", "c"})
        stop.set()
        for t in threads:
            t.join(10)
        self.assertGreater(len(results), 60)  # some before, during and after the reload
        self.assertEqual([r for r in results if r[0] != 200], [])
        self.assertFalse([r for r in results if r[1] == "a" and r[2] > reloaded_at + 0.5])
        # the CLI asks for the same reload
        self.write(cfg, [("b", b), ("c", c), ("a", a)])
        out = subprocess.run([ATC_BIN, "reload", "--yaml", "--admin", f"127.0.0.1:{atc.admin_port}"],
                             capture_output=True, text=True, timeout=10)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("1 added", out.stdout)
        self.assertEqual(set(atc.endpoints()), {"a", "b", "c"})


if __name__ == "__main__":
    unittest.main(verbosity=2)
