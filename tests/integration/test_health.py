"""Health checks, ejection, panic mode, drain, the load scrape and failover, end to end: atc serve in front
of `atc sim` processes (and, where a sim has no knob for the fault, a small stub server in this process),
all on free loopback ports, with deadlines rather than sleeps. Intervals are short so the file runs fast.
"""

import http.client
import http.server
import json
import os
import subprocess
import threading
import time
import unittest

from harness import ATC_BIN, SLACK, AtcTestCase, chat, open_stream, request, stream_events, wait_for

# Short intervals: a probe every 200 ms, 50 ms while a verdict is changing.
HEALTH = """
health:
  failure_threshold: 3
  recovery_threshold: 2
  fast_interval: 50ms
  down_interval: 200ms
  jitter: 0.1
  live: {{interval: 200ms, timeout: 300ms}}
  ready: {{interval: 200ms, timeout: 300ms}}
  deep: {{enabled: {deep}, interval: 5s, timeout: 1s}}
  scrape: {{interval: 100ms, timeout: 300ms}}
  eject: {{consecutive_errors: {eject}, base_time: {eject_time}, max_time: 10s}}
  slow_start: {slow_start}
  panic: {panic}
"""


def config(endpoints, deep="false", eject=3, eject_time="5s", slow_start="0s", panic="route_all", extra="",
           model="llama-3-8b"):
    """A config for one model with @endpoints [(id, url)], the short health settings and @extra."""
    eps = "\n".join(f'      - {{id: {i}, url: "{u}", capacity: 64}}' for i, u in endpoints)
    return (f"listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\n{extra}"
            + HEALTH.format(deep=deep, eject=eject, eject_time=eject_time, slow_start=slow_start, panic=panic)
            + f"models:\n  - name: {model}\n    endpoints:\n{eps}\n")


class Stub:
    """An HTTP server in this process for the faults `atc sim` has no knob for. routes maps a path to a
    function (call number from 1) -> (status, body); hang makes every request wait until stop()."""

    def __init__(self, routes, model="llama-3-8b"):
        self.routes = dict(routes)
        self.calls = {}
        self.hang = threading.Event()
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        stub = self
        models = json.dumps({"object": "list", "data": [{"id": model, "object": "model"}]})
        answer = json.dumps({"id": "x", "object": "chat.completion", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]})
        self.routes.setdefault("/health", lambda n: (200, ""))
        self.routes.setdefault("/v1/models", lambda n: (200, models))
        self.routes.setdefault("/v1/chat/completions", lambda n: (200, answer))
        self.routes.setdefault("/metrics", lambda n: (200, ""))

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def handle_one(self):
                length = int(self.headers.get("content-length") or 0)
                if length:
                    self.rfile.read(length)
                with stub.lock:
                    n = stub.calls[self.path] = stub.calls.get(self.path, 0) + 1
                if stub.hang.is_set():
                    stub.stopping.wait(30)
                    self.close_connection = True
                    return
                route = stub.routes.get(self.path)
                status, body = route(n) if route else (404, "")
                data = body.encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # atc gave up on the probe (its timeout) and closed the connection
                    self.close_connection = True

            do_GET = do_POST = handle_one

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def count(self, path):
        with self.lock:
            return self.calls.get(path, 0)

    def stop(self):
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()


class HealthTest(AtcTestCase):
    def setUp(self):
        super().setUp()
        self.stubs = []

    def tearDown(self):
        for s in self.stubs:
            s.stop()
        super().tearDown()

    def stub(self, routes=(), **kw):
        s = Stub(dict(routes), **kw)
        self.stubs.append(s)
        return s

    def state(self, atc, ep):
        return atc.endpoints()[ep]["state"]

    def wait_state(self, atc, ep, states, timeout=5.0):
        states = (states,) if isinstance(states, str) else states
        return wait_for(lambda: atc.endpoints()[ep] if atc.endpoints()[ep]["state"] in states else None,
                        timeout=timeout, what=f"{ep} in state {states}")

    def log_lines(self, atc, ep):
        return [line for line in atc.read_log().splitlines() if f"endpoint {ep}: " in line and " -> " in line]

    # ---- active checks ----

    def test_a_server_not_ready_at_start_gets_traffic_only_once_ready(self):
        ready = self.start_sim("ready", extra=["--decode-ms", "1"])
        # llama.cpp answers 503 while it loads (vLLM refuses connections); it lets /v1/models through and
        # names the model then, so the ready check reads /health here.
        loading = self.start_sim("loading", extra=["--decode-ms", "1", "--not-ready-for", "1500ms",
                                                   "--engine", "llamacpp"])
        cfg = config([("ready", ready.url), ("loading", loading.url)])
        atc = self.start_atc(cfg.replace("ready: {interval", "ready: {path: /health, interval"))
        self.assertEqual(self.state(atc, "ready"), "healthy")  # the ready file waits for the first checks
        seen_starting = False
        deadline = time.monotonic() + 6
        while True:
            ep = atc.endpoints()["loading"]
            if ep["state"] != "starting":
                break
            seen_starting = True
            self.assertEqual(ep["requests_total"], 0, "a server that is not ready got traffic")
            self.assertFalse(ep["routable"])
            self.assertTrue(ep["live"])  # answering, so not a liveness failure
            status, headers, _ = chat(atc.port, max_tokens=1)
            self.assertEqual(status, 200)
            if headers["x-atc-endpoint"] != "ready":  # it turned ready since we looked
                self.assertEqual(self.state(atc, "loading"), "healthy")
            self.assertLess(time.monotonic(), deadline, "never became ready")
        self.assertTrue(seen_starting)
        self.assertEqual(ep["state"], "healthy")
        served = set()
        for _ in range(40):
            served.add(chat(atc.port, max_tokens=1)[1]["x-atc-endpoint"])
        self.assertIn("loading", served)
        lines = self.log_lines(atc, "loading")
        self.assertEqual(len(lines), 1, lines)
        self.assertIn("starting -> healthy: ready check passed 2 times in a row", lines[0])

    def test_a_killed_server_leaves_rotation_fast_and_comes_back_after_recovery_threshold(self):
        a = self.start_sim("a", extra=["--decode-ms", "1"])
        b = self.start_sim("b", extra=["--decode-ms", "1"])
        atc = self.start_atc(config([("a", a.url), ("b", b.url)], slow_start="1s"))
        self.assertEqual(self.state(atc, "b"), "healthy")
        b.proc.kill()
        killed = time.monotonic()
        ep = wait_for(lambda: (lambda e: e if not e["routable"] else None)(atc.endpoints()["b"]), timeout=5,
                      interval=0.005, what="b out of rotation")
        out_after = time.monotonic() - killed
        print(f"\nkilled server out of rotation after {out_after * 1000:.0f} ms "
              f"(failure_threshold 3, interval 200 ms, fast_interval 50 ms)")
        # Within failure_threshold intervals: 3 x 200 ms (plus a little for the polling).
        self.assertLess(out_after, 0.6 + 0.1 * SLACK)
        self.assertEqual(ep["state"], "unhealthy")
        self.assertGreaterEqual(ep["consecutive_failures"], 3)
        self.assertIn("connect failed", ep["last_error"])
        for _ in range(20):  # the client sees nothing of it
            status, headers, _ = chat(atc.port, max_tokens=1)
            self.assertEqual((status, headers["x-atc-endpoint"]), (200, "a"))
        (down,) = self.log_lines(atc, "b")[1:]
        self.assertRegex(down, r"b: healthy -> unhealthy: (live|ready) check failed 3 times in a row \(.*connect failed\)")

        # Back on the same port: healthy after recovery_threshold (2) good probes of each check, then it
        # ramps up (slow start) to its full capacity.
        restarted = time.monotonic()  # before the start: the sim answers probes before start_sim returns
        b2 = self.start_sim("b2", extra=["--decode-ms", "1", "--listen", f"127.0.0.1:{b.port}"])
        ep = self.wait_state(atc, "b", "healthy")
        back_after = time.monotonic() - restarted
        self.assertGreaterEqual(back_after, 0.05)  # the second good probe is a fast interval after the first
        self.assertLess(ep["slow_start"], 1)
        # Straight back, perhaps through "starting" (answering again, its ready check not yet passed
        # twice), never out again on the way.
        up = self.log_lines(atc, "b")[2:]
        self.assertIn(len(up), (1, 2), up)
        self.assertRegex(up[-1], r"b: (unhealthy|starting) -> healthy: (live|ready) check passed 2 times in a row")
        if len(up) == 2:
            self.assertIn("b: unhealthy -> starting: ", up[0])
        wait_for(lambda: atc.endpoints()["b"]["slow_start"] == 1, timeout=3, what="slow start over")
        self.assertIn("endpoint b: slow start over", atc.read_log())
        served = {chat(atc.port, max_tokens=1)[1]["x-atc-endpoint"] for _ in range(40)}
        self.assertEqual(served, {"a", "b"})
        b2.stop()

    def test_flapping_does_not_oscillate_faster_than_the_thresholds_allow(self):
        good = self.start_sim("good", extra=["--decode-ms", "1"])
        # ok, fail, fail, ok, fail, fail, ...: never 3 failures in a row, so it never leaves.
        flaky = self.stub({"/health": lambda n: (200, "") if n % 3 == 1 else (500, "")})
        # ok, then fail x3, ok, fail x3, ...: out after the first 3 failures, never 2 successes in a row,
        # so it never comes back.
        sick = self.stub({"/health": lambda n: (200, "") if n % 4 == 1 else (500, "")})
        atc = self.start_atc(config([("good", good.url), ("flaky", flaky.url), ("sick", sick.url)]))
        wait_for(lambda: flaky.count("/health") >= 20 and sick.count("/health") >= 20, timeout=15,
                 what="20 probes of each")
        eps = atc.endpoints()
        self.assertEqual(eps["flaky"]["state"], "healthy")
        self.assertEqual(eps["flaky"]["state_changes"], 1)  # starting -> healthy, and nothing since
        self.assertEqual(eps["sick"]["state"], "unhealthy")
        self.assertEqual(eps["sick"]["state_changes"], 2)  # starting -> healthy -> unhealthy
        self.assertEqual(len(self.log_lines(atc, "flaky")), 1)
        self.assertEqual(len(self.log_lines(atc, "sick")), 2)

    def test_a_server_that_answers_probes_but_cannot_generate_fails_its_deep_check(self):
        good = self.start_sim("good", extra=["--decode-ms", "1"])
        broken = self.start_sim("broken", extra=["--error-rate", "1"])
        atc = self.start_atc(config([("good", good.url), ("broken", broken.url)], deep="true", eject=0))
        ep = self.wait_state(atc, "broken", "unhealthy", timeout=3)
        self.assertTrue(ep["live"] and ep["ready"])
        self.assertFalse(ep["deep"])
        self.assertIn("deep check: POST /v1/chat/completions: answered 500", ep["last_error"])
        self.assertEqual(ep["requests_total"], 0)  # caught before any client request went there
        self.assertTrue(atc.endpoints()["good"]["deep"])

    def test_503_is_loading_before_ready_and_broken_after(self):
        good = self.start_sim("good", extra=["--decode-ms", "1"])
        # Lists its model (ready) but says 503 on /health: a server reporting itself broken.
        broken = self.stub({"/health": lambda n: (503, "")})
        atc = self.start_atc(config([("good", good.url), ("broken", broken.url)]))
        ep = self.wait_state(atc, "broken", "unhealthy", timeout=3)
        self.assertFalse(ep["live"])
        self.assertIn("live check: GET /health: answered 503", ep["last_error"])

    # ---- passive checks ----

    def test_a_500ing_server_is_ejected_and_4xx_do_not_count(self):
        bad = self.start_sim("bad", extra=["--error-rate", "1"])
        g1 = self.start_sim("g1", extra=["--decode-ms", "1"])
        g2 = self.start_sim("g2", extra=["--decode-ms", "1"])
        atc = self.start_atc(config([("bad", bad.url), ("g1", g1.url), ("g2", g2.url)], eject=3,
                                    eject_time="400ms"))
        for _ in range(30):
            status, headers, body = chat(atc.port, max_tokens=1)
            self.assertEqual(status, 200, body)  # retried on another endpoint
            self.assertIn(headers["x-atc-endpoint"], ("g1", "g2"))
        ep = atc.endpoints()["bad"]
        self.assertEqual(ep["errors_total"], 3)  # ejected at the third failure in a row
        self.assertEqual(ep["ejections"], 1)
        self.assertIn(ep["state"], ("ejected", "healthy"))  # back after 400 ms, then out again at once
        self.assertIn("bad: healthy -> ejected: 3 requests in a row failed: ejected for 0.4s",
                      "\n".join(self.log_lines(atc, "bad")))
        # The second ejection lasts twice as long.
        wait_for(lambda: atc.endpoints()["bad"]["state"] == "healthy", timeout=3, what="ejection over")
        for _ in range(200):
            self.assertEqual(chat(atc.port, max_tokens=1)[0], 200)
            if atc.endpoints()["bad"]["ejections"] == 2:
                break
        self.assertIn("ejected for 0.8s", atc.endpoints()["bad"]["last_error"])

        # Client errors (a 400 from the server) never count against it.
        for _ in range(10):
            status, headers, _ = chat(atc.port, max_tokens=0)
            self.assertEqual(status, 400)
        for ep_id in ("g1", "g2"):
            ep = atc.endpoints()[ep_id]
            self.assertEqual((ep["state"], ep["ejections"], ep["errors_total"]), ("healthy", 0, 0))

    def test_ejection_is_capped_at_max_share(self):
        bad1 = self.start_sim("bad1", extra=["--error-rate", "1"])
        bad2 = self.start_sim("bad2", extra=["--error-rate", "1"])
        atc = self.start_atc(config([("bad1", bad1.url), ("bad2", bad2.url)], eject=2))
        for _ in range(12):
            chat(atc.port, max_tokens=1)
        eps = atc.endpoints()
        self.assertEqual(sorted(e["state"] for e in eps.values()), ["ejected", "healthy"])  # 50% of 2 = 1
        self.assertIn("are ejected already (health.eject.max_share 0.50)", atc.read_log())

    def test_a_hung_server_costs_at_most_the_first_byte_timeout(self):
        hung = self.start_sim("hung", extra=["--hang-rate", "1"])  # answers probes, never a request
        good = self.start_sim("good", extra=["--decode-ms", "1"])
        atc = self.start_atc(config([("hung", hung.url), ("good", good.url)], eject=2,
                                    extra="upstream: {first_byte_timeout: 300ms, tries: 2}\n"))
        durations = []
        for _ in range(20):
            start = time.monotonic()
            status, headers, _ = chat(atc.port, max_tokens=1)
            durations.append(time.monotonic() - start)
            self.assertEqual((status, headers["x-atc-endpoint"]), (200, "good"))
        self.assertLessEqual(atc.endpoints()["hung"]["errors_total"], 2)  # 2 timeouts in a row ejected it
        # one timeout (first_byte_timeout + token_timeout x max_tokens: 0.4 s), then the retry
        self.assertLess(max(durations), 0.4 + 0.25 * SLACK)
        self.assertEqual(atc.endpoints()["hung"]["state"], "ejected")

        # A server that hangs entirely (accepts connections, answers nothing): its probes time out.
        stub = self.stub()
        atc2 = self.start_atc(config([("stuck", stub.url), ("good", good.url)]), name="atc2")
        self.assertEqual(self.state(atc2, "stuck"), "healthy")
        stub.hang.set()
        ep = self.wait_state(atc2, "stuck", "unhealthy", timeout=3)
        self.assertRegex(ep["last_error"], r"no answer within 300ms|timed out")

    # ---- panic mode ----

    def test_panic_mode_routes_to_all_or_fails_as_configured(self):
        # Probes fail (live answers 500) but requests work: the checks are what is wrong.
        s1 = self.stub({"/health": lambda n: (500, "")})
        s2 = self.stub({"/health": lambda n: (500, "")})
        eps = [("s1", s1.url), ("s2", s2.url)]
        atc = self.start_atc(config(eps))
        self.assertEqual({e["state"] for e in atc.endpoints().values()}, {"unhealthy"})
        status, headers, _ = chat(atc.port, max_tokens=1)
        self.assertEqual(status, 200)
        _, _, body = request("127.0.0.1", atc.admin_port, "GET", "/admin/endpoints")
        health = json.loads(body)["health"]
        self.assertEqual(health["models"][0]["panic"], True)
        self.assertEqual(health["models_in_panic"], 1)
        self.assertIn("model llama-3-8b: no endpoint is healthy: panic mode, routing to all 2", atc.read_log())
        metrics = request("127.0.0.1", atc.admin_port, "GET", "/metrics")[2].decode()
        self.assertIn('atc_model_panic{model="llama-3-8b"} 1\n', metrics)
        self.assertIn('atc_model_panics_total{model="llama-3-8b"} 1\n', metrics)
        self.assertIn('atc_endpoint_health_state{model="llama-3-8b",endpoint="s1",state="unhealthy"} 1\n', metrics)
        self.assertIn('atc_endpoint_health_state{model="llama-3-8b",endpoint="s1",state="healthy"} 0\n', metrics)

        # panic: fail routes to none of them: a request waits in the admission queue for one to come
        # back, and is answered 503 when none does by its deadline.
        failing = self.start_atc(config(eps, panic="fail"), name="atc-fail")
        self.assertIn("panic mode, failing its requests", failing.read_log())
        start = time.monotonic()
        status, headers, body = chat(failing.port, max_tokens=1, headers={"x-atc-deadline": "300ms"})
        self.assertEqual(status, 503)
        self.assertEqual(json.loads(body)["error"]["code"], "queue_timeout")
        self.assertGreaterEqual(time.monotonic() - start, 0.3)
        self.assertEqual(s1.count("/v1/chat/completions") + s2.count("/v1/chat/completions"), 1)  # atc's only
        result = []
        waiting = threading.Thread(target=lambda: result.append(
            chat(failing.port, max_tokens=1, headers={"x-atc-deadline": "5s"})))
        waiting.start()
        wait_for(lambda: json.loads(request("127.0.0.1", failing.admin_port, "GET", "/admin/endpoints")[2])
                 ["queues"]["models"][0]["waiting"] == 1, what="the request queued")
        s2.routes["/health"] = lambda n: (200, "")  # s2 recovers: the waiting request goes there at once
        came_back = time.monotonic()
        waiting.join()
        status, headers, _ = result[0]
        self.assertEqual((status, headers["x-atc-endpoint"]), (200, "s2"))
        self.assertLess(time.monotonic() - came_back, 1.0 * SLACK)  # a down interval and a fast one, not the deadline

    # ---- admin ----

    def test_drain_lets_in_flight_requests_finish_and_enable_undoes_it(self):
        a = self.start_sim("a", extra=["--decode-ms", "20"])
        b = self.start_sim("b", extra=["--decode-ms", "1"])
        atc = self.start_atc(config([("a", a.url), ("b", b.url)]))
        # A stream on a (b drained meanwhile, so that it can only go to a), then drain a while it runs.
        self.assertEqual(request("127.0.0.1", atc.admin_port, "POST", "/admin/endpoints/b/drain")[0], 200)
        conn, resp = open_stream(atc.port, max_tokens=40, timeout=10)
        self.assertEqual(resp.getheader("x-atc-endpoint"), "a")
        self.assertEqual(request("127.0.0.1", atc.admin_port, "POST", "/admin/endpoints/b/enable")[0], 200)
        status, _, body = request("127.0.0.1", atc.admin_port, "POST", "/admin/endpoints/a/drain")
        self.assertEqual(status, 200)
        self.assertEqual(json.loads(body), {"id": "a", "state": "draining", "inflight": 1})
        for _ in range(10):
            status, headers, _ = chat(atc.port, max_tokens=1)
            self.assertEqual((status, headers["x-atc-endpoint"]), (200, "b"))
        stream = resp.read().decode()  # the in-flight stream finishes normally
        conn.close()
        self.assertTrue(stream.rstrip().endswith("data: [DONE]"), stream[-200:])
        self.assertNotIn('"error"', stream)
        self.assertIn('"finish_reason":"length"', stream)  # all 40 tokens
        self.assertEqual(atc.endpoints()["a"]["state"], "draining")
        self.assertEqual(atc.endpoints()["a"]["inflight"], 0)
        # The CLI does the same (atc enable ID).
        out = subprocess.run([ATC_BIN, "enable", "a", "--admin", f"127.0.0.1:{atc.admin_port}"], capture_output=True,
                             text=True, timeout=10)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(json.loads(out.stdout.split(": ", 1)[1])["state"], "healthy")
        served = {chat(atc.port, max_tokens=1)[1]["x-atc-endpoint"] for _ in range(30)}
        self.assertEqual(served, {"a", "b"})
        lines = self.log_lines(atc, "a")
        self.assertIn("healthy -> draining: drained by the admin API", lines[-2])
        self.assertIn("draining -> healthy: enabled by the admin API", lines[-1])
        self.assertEqual(request("127.0.0.1", atc.admin_port, "POST", "/admin/endpoints/nope/drain")[0], 404)
        self.assertEqual(request("127.0.0.1", atc.admin_port, "GET", "/admin/endpoints/a/drain")[0], 405)
        self.assertEqual(request("127.0.0.1", atc.admin_port, "POST", "/admin/endpoints/a/reboot")[0], 404)

    # ---- server load ----

    def test_the_load_scrape_reaches_the_admin_api_and_policies(self):
        sim = self.start_sim("sim", extra=["--decode-ms", "30", "--max-seqs", "2", "--kv-blocks", "1000"])
        page = {"text": "# TYPE vllm:num_requests_running gauge\n"
                        "vllm:num_requests_running{model_name=\"llama-3-8b\"} 7\n"
                        "vllm:num_requests_running{model_name=\"other\"} 100\n"
                        "vllm:num_requests_waiting{model_name=\"llama-3-8b\"} 3\n"
                        "vllm:kv_cache_usage_perc{model_name=\"llama-3-8b\"} 0.25\n"
                        "vllm:prefix_cache_queries_total{model_name=\"llama-3-8b\"} NaN\n"
                        "vllm:e2e_request_latency_seconds_bucket{le=\"+Inf\"} 4\n"}
        stub = self.stub({"/metrics": lambda n: (200, page["text"])})
        with open(os.path.join(self.tmp.name, "policy.lua"), "w") as f:
            f.write("""
return function(req, fleet)
  if req:header("x-probe") then
    local out = {}
    for _, ep in ipairs(fleet:endpoints(req.model)) do
      out[#out + 1] = string.format("%s=%s/%d/%d/%.2f/%d/%s/%s/%s/%s", ep.id, ep.health, ep.running,
                                    ep.server_queue, ep.kv_usage, ep.consecutive_failures,
                                    tostring(ep.last_error),
                                    tostring(ep.last_check ~= nil and ep.last_check <= atc.now()),
                                    tostring(ep.prefix_hit_rate), tostring(ep.kv_tokens))
    end
    table.sort(out)
    return atc.reject(418, table.concat(out, " "))
  end
  return atc.p2c(fleet:endpoints(req.model))
end
""")
        atc = self.start_atc(config([("sim", sim.url), ("stub", stub.url)],
                                    extra=f"policy: {{entry: policy.lua}}\n"))
        # Load the simulated server: 2 running, the rest waiting.
        threads = [threading.Thread(target=chat, args=(sim.port,), kwargs={"max_tokens": 30}) for _ in range(5)]
        for t in threads:
            t.start()
        ep = wait_for(lambda: (lambda e: e if e["load"]["running"] == 2 and e["load"]["waiting"] >= 1 else None)(
            atc.endpoints()["sim"]), timeout=5, what="the sim's load scraped")
        self.assertGreater(ep["load"]["kv_usage"], 0)
        stub_ep = atc.endpoints()["stub"]
        self.assertEqual((stub_ep["load"]["running"], stub_ep["load"]["waiting"], stub_ep["load"]["kv_usage"]),
                         (7, 3, 0.25))  # this model's series only
        self.assertIsNone(stub_ep["load"]["prefix_hit_rate"])
        status, _, body = chat(atc.port, max_tokens=1, headers={"x-probe": "1"})
        self.assertEqual(status, 418)
        msg = json.loads(body)["error"]["message"]
        # prefix_hit_rate: the stub reports NaN, so not known: nil (the contract's rule); kv_tokens: the
        # sim's KV size from vLLM's cache_config_info (1000 blocks of 16), the stub says none
        self.assertRegex(msg, r"sim=healthy/\d/\d/\d\.\d\d/0/nil/true/\S+/16000 stub=healthy/7/3/0\.25/0/nil/true/nil/nil")
        self.assertEqual((atc.endpoints()["sim"]["kv_tokens"], atc.endpoints()["stub"]["kv_tokens"]), (16000, None))
        for t in threads:
            t.join()

        # A malformed page is a counted scrape error: the last values stay, nothing else changes.
        errors = stub_ep["load"]["scrape_errors_total"]
        page["text"] = "vllm:num_requests_running{model_name=\"llama-3-8b\" 9\n"
        ep = wait_for(lambda: (lambda e: e if e["load"]["scrape_errors_total"] >= errors + 3 else None)(
            atc.endpoints()["stub"]), timeout=5, what="scrape errors counted")
        self.assertIn("malformed metrics page: line 1", ep["load"]["last_error"])
        self.assertEqual((ep["load"]["running"], ep["state"]), (7, "healthy"))
        self.assertEqual(chat(atc.port, max_tokens=1)[0], 200)
        self.assertEqual(atc.read_log().count("load scrape failed"), 1)  # logged once, not per scrape

    # ---- failover ----

    def test_failover_2000_requests_with_a_server_killed_in_the_middle(self):
        sims = [self.start_sim(f"s{i}", extra=["--decode-ms", "0.1", "--prefill-tps", "10000000"]) for i in range(3)]
        atc = self.start_atc(config([(f"s{i}", s.url) for i, s in enumerate(sims)]))
        total, results, lock = 2000, [], threading.Lock()
        killed = threading.Event()

        def client():
            conn = http.client.HTTPConnection("127.0.0.1", atc.port, timeout=10)
            body = json.dumps({"model": "llama-3-8b", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]})
            while True:
                with lock:
                    if len(results) >= total:
                        conn.close()
                        return
                    n = len(results)
                    results.append(None)
                if n == total // 2:
                    sims[1].proc.kill()
                    killed.set()
                try:
                    conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
                    resp = conn.getresponse()
                    resp.read()
                    status = resp.status
                except (OSError, http.client.HTTPException) as e:
                    status = repr(e)
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", atc.port, timeout=10)
                with lock:
                    results[n] = status

        threads = [threading.Thread(target=client) for _ in range(8)]
        start = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - start
        self.assertTrue(killed.is_set())
        failures = [r for r in results if r != 200]
        self.assertEqual(failures, [], f"{len(failures)} of {total} failed")
        ep = atc.endpoints()["s1"]
        self.assertFalse(ep["routable"])
        print(f"\n{total} requests in {elapsed:.1f}s, s1 killed at #{total // 2}: 0 failed; "
              f"s1 {ep['state']} after {ep['requests_total']} attempts, {atc.endpoints()['s0']['requests_total']} + "
              f"{atc.endpoints()['s2']['requests_total']} on the others")
        # Restarted, it comes back long before its ejection (5 s) would have ended: the probes saw it
        # unreachable, then answering.
        self.start_sim("s1-again", extra=["--decode-ms", "0.1", "--listen", f"127.0.0.1:{sims[1].port}"])
        self.wait_state(atc, "s1", "healthy", timeout=3)
        if ep["state"] == "ejected":
            self.assertIn("ejection lifted", "\n".join(self.log_lines(atc, "s1")))

    def test_a_stream_cut_by_a_dying_server_ends_with_an_error_event(self):
        dying = self.start_sim("dying", extra=["--die-after", "1", "--decode-ms", "10"])
        atc = self.start_atc(config([("dying", dying.url)]))
        self.assertEqual(chat(atc.port, max_tokens=2)[0], 200)  # request 1; the next one is cut
        start = time.monotonic()
        status, _, events = stream_events(atc.port, {"model": "llama-3-8b", "stream": True, "max_tokens": 40,
                                                     "messages": [{"role": "user", "content": "x"}]})
        self.assertEqual(status, 200)
        self.assertLess(time.monotonic() - start, 5)  # never a silent hang
        last = json.loads(events[-1][1])
        self.assertEqual(set(last["error"]), {"message", "type", "param", "code"})
        self.assertIn("upstream dying", last["error"]["message"])
        self.assertGreater(len(events), 2)  # it had started
        self.assertNotIn("[DONE]", [e for _, e in events])


if __name__ == "__main__":
    unittest.main(verbosity=2)
