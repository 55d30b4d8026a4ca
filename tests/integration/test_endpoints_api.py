"""Endpoints that join and leave at run time through the admin API (POST /admin/endpoints, DELETE
/admin/endpoints/<id>): they join through `starting`, leave by draining, are refused with a reason, show
in atc status and survive a YAML reload unless the file names the same id. atc serve in front of `atc sim`
processes on free loopback ports, deadlines rather than sleeps."""

import json
import os
import re
import subprocess
import threading

from harness import (ATC_BIN, SOURCE_DIR, AtcTestCase, chat, open_stream, request, run_file, stream_events,
                     wait_access_lines, wait_for)

HEALTH = """
health:
  failure_threshold: 2
  recovery_threshold: 2
  fast_interval: 50ms
  down_interval: 200ms
  live: {interval: 100ms, timeout: 300ms}
  ready: {interval: 100ms, timeout: 300ms}
"""


def config(endpoints, workers=2):
    eps = "\n".join(f'      - {{id: {i}, url: "{u}", capacity: 64}}' for i, u in endpoints)
    return (f"listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\nworkers: {workers}\n" + HEALTH +
            f"models:\n  - name: llama-3-8b\n    endpoints:\n{eps}\n  - name: other\n    endpoints:\n"
            f'      - {{id: o, url: "{endpoints[0][1]}"}}\n')


class EndpointsApiTest(AtcTestCase):
    def admin(self, atc, method, path, body=None):
        status, _, data = request("127.0.0.1", atc.admin_port, method, path, body)
        return status, json.loads(data) if data else None

    def test_an_added_endpoint_joins_through_starting_and_serves(self):
        a = self.start_sim("a", extra=["--decode-ms", "1"])
        b = self.start_sim("b", extra=["--decode-ms", "1"])
        atc = self.start_atc(config([("a", a.url)]))
        status, body = self.admin(atc, "POST", "/admin/endpoints",
                                  {"model": "llama-3-8b", "id": "b", "url": b.url, "capacity": 8, "tags": ["new"]})
        self.assertEqual(status, 201, body)
        self.assertEqual((body["id"], body["origin"], body["capacity"], body["state"]), ("b", "api", 8, "starting"))
        wait_for(lambda: atc.endpoints()["b"]["state"] == "healthy", what="b healthy")
        self.assertIn(f"endpoint b ({b.url}) added to model llama-3-8b", atc.read_log())
        self.assertEqual(atc.endpoints()["b"]["origin"], "api")
        self.assertEqual(atc.endpoints()["a"]["origin"], "config")
        served = {chat(atc.port, max_tokens=1)[1]["x-atc-endpoint"] for _ in range(40)}
        self.assertEqual(served, {"a", "b"})
        out = subprocess.run([ATC_BIN, "status", "--admin", f"127.0.0.1:{atc.admin_port}"], capture_output=True,
                             text=True, timeout=10)
        self.assertEqual(out.returncode, 0, out.stderr)
        row = [line.split() for line in out.stdout.splitlines() if line.startswith("b ")]
        self.assertEqual((row[0][1], row[0][2], row[0][-1]), ("llama-3-8b", "healthy", "api"), out.stdout)

    def test_an_endpoint_added_beside_a_serving_one_ramps_up_by_slow_start(self):
        # A new pod must not take a full share of a busy model's traffic in its first second (its caches are
        # cold): it ramps up as one coming back does. The endpoint there at start-up does not.
        a = self.start_sim("a", extra=["--decode-ms", "1"])
        b = self.start_sim("b", extra=["--decode-ms", "1"])
        atc = self.start_atc(config([("a", a.url)]).replace("health:\n", "health:\n  slow_start: 2s\n"))
        wait_for(lambda: atc.endpoints()["a"]["state"] == "healthy", what="a healthy")
        self.assertEqual(atc.endpoints()["a"]["slow_start"], 1.0)
        status, body = self.admin(atc, "POST", "/admin/endpoints", {"model": "llama-3-8b", "id": "b", "url": b.url})
        self.assertEqual(status, 201, body)
        wait_for(lambda: atc.endpoints()["b"]["state"] == "healthy", what="b healthy")
        self.assertLess(atc.endpoints()["b"]["slow_start"], 0.9)
        wait_for(lambda: atc.endpoints()["b"]["slow_start"] == 1.0, timeout=10, what="b's ramp over")

    def test_bad_bodies_unknown_models_and_taken_ids_are_refused_with_a_reason(self):
        a = self.start_sim("a", extra=["--decode-ms", "1"])
        atc = self.start_atc(config([("a", a.url)]))
        cases = [
            ("not json", 400, "invalid_json"),
            ({"model": "llama-3-8b", "id": "x"}, 400, "invalid_endpoint"),  # no url
            ({"model": "llama-3-8b", "id": "x", "url": "ftp://h:1"}, 400, "invalid_endpoint"),
            ({"model": "llama-3-8b", "id": "", "url": a.url}, 400, "invalid_endpoint"),
            ({"model": "llama-3-8b", "id": "x", "url": a.url, "capacity": 0}, 400, "invalid_endpoint"),
            ({"model": "llama-3-8b", "id": "x", "url": a.url, "colour": "red"}, 400, "invalid_endpoint"),
            ({"model": "llama-3-8b", "id": "x", "url": a.url, "tags": [1]}, 400, "invalid_endpoint"),
            ({"model": "nope", "id": "x", "url": a.url}, 404, "model_not_found"),
            ({"model": "other", "id": "a", "url": a.url}, 409, "duplicate_endpoint"),
        ]
        for body, want, code in cases:
            status, answer = self.admin(atc, "POST", "/admin/endpoints", body)
            self.assertEqual((status, answer["error"]["code"]), (want, code), body)
            self.assertTrue(answer["error"]["message"], body)
        self.assertEqual(sorted(atc.endpoints()), ["a", "o"])  # nothing half-added
        self.assertEqual(self.admin(atc, "DELETE", "/admin/endpoints/nope")[0], 404)

    def test_a_removed_endpoint_drains_its_requests_in_flight_and_leaves(self):
        a = self.start_sim("a", extra=["--decode-ms", "1"])
        b = self.start_sim("b", extra=["--decode-ms", "20"])
        atc = self.start_atc(config([("a", a.url)]))
        self.assertEqual(self.admin(atc, "POST", "/admin/endpoints", {"model": "llama-3-8b", "id": "b", "url": b.url})[0],
                         201)
        wait_for(lambda: atc.endpoints()["b"]["state"] == "healthy", what="b healthy")
        self.assertEqual(self.admin(atc, "POST", "/admin/endpoints/a/drain")[0], 200)  # the stream goes to b
        conn, resp = open_stream(atc.port, max_tokens=40, timeout=10)
        self.assertEqual(resp.getheader("x-atc-endpoint"), "b")
        self.assertEqual(self.admin(atc, "POST", "/admin/endpoints/a/enable")[0], 200)
        status, body = self.admin(atc, "DELETE", "/admin/endpoints/b")
        self.assertEqual((status, body), (200, {"id": "b", "removed": True, "draining_inflight": 1}))
        self.assertNotIn("b", atc.endpoints())
        for _ in range(10):
            status, headers, _ = chat(atc.port, max_tokens=1)
            self.assertEqual((status, headers["x-atc-endpoint"]), (200, "a"))
        stream = resp.read().decode()  # the request in flight on b finishes whole
        conn.close()
        self.assertTrue(stream.rstrip().endswith("data: [DONE]"), stream[-200:])
        self.assertIn('"finish_reason":"length"', stream)
        self.assertEqual(self.admin(atc, "DELETE", "/admin/endpoints/b")[0], 404)
        self.assertIn("endpoint b removed: it drains", atc.read_log())

    def test_a_yaml_reload_keeps_added_endpoints_unless_the_file_names_them(self):
        a = self.start_sim("a", extra=["--decode-ms", "1"])
        b = self.start_sim("b", extra=["--decode-ms", "1"])
        atc = self.start_atc(config([("a", a.url)]))
        self.assertEqual(self.admin(atc, "POST", "/admin/endpoints", {"model": "llama-3-8b", "id": "b", "url": b.url})[0],
                         201)
        wait_for(lambda: atc.endpoints()["b"]["state"] == "healthy", what="b healthy")
        status, body = self.admin(atc, "POST", "/admin/config/reload")
        self.assertEqual(status, 200, body)
        self.assertEqual((atc.endpoints()["b"]["origin"], atc.endpoints()["b"]["state"]), ("api", "healthy"))
        with open(atc.config_path, "w") as f:
            f.write(config([("a", a.url), ("b", b.url)]))
        self.assertEqual(self.admin(atc, "POST", "/admin/config/reload")[0], 200)
        self.assertEqual(atc.endpoints()["b"]["origin"], "config")  # the file's now

    def test_a_policy_keeps_its_state_and_views_while_endpoints_come_and_go(self):
        # The policy keeps every view it saw in its module state, and counts its decisions. Adding and
        # removing endpoints must neither rebuild its Lua state (the count goes on, the version stays) nor
        # break the views it holds: b's reads nil once b is removed, a's still reads a.
        a = self.start_sim("a", extra=["--decode-ms", "1"])
        b = self.start_sim("b", extra=["--decode-ms", "1"])
        policy = self.write_policy("""
local held, decisions = {}, 0
return function(req, fleet)
  decisions = decisions + 1
  for _, ep in ipairs(fleet:endpoints(req.model)) do held[ep.id] = ep end
  if req:header("x-probe") then
    local function show(id)
      local ep = held[id]
      return ep == nil and "unseen" or string.format("%s/%s", tostring(ep.id), tostring(ep.health))
    end
    return atc.reject(418, string.format("decisions=%d a=%s b=%s", decisions, show("a"), show("b")))
  end
  local want = req:header("x-want")
  if want and held[want] and held[want].health == "healthy" then return held[want] end
  return held.a
end
""")
        cfg = config([("a", a.url)], workers=1).replace("workers: 1\n", f"workers: 1\npolicy: {{entry: {policy}}}\n")
        atc = self.start_atc(cfg)

        def probe():
            status, _, body = request("127.0.0.1", atc.port, "POST", "/v1/chat/completions",
                                      {"model": "llama-3-8b", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]},
                                      headers={"x-probe": "1"})
            self.assertEqual(status, 418, body)
            return json.loads(body)["error"]["message"]

        first = probe()  # (the count starts after the load's smoke test, which decides a few made-up requests)
        n = int(first.split()[0].split("=")[1])
        self.assertEqual(first, f"decisions={n} a=a/healthy b=unseen")
        version = self.policy_status(atc)["version"]
        self.assertEqual(self.admin(atc, "POST", "/admin/endpoints", {"model": "llama-3-8b", "id": "b", "url": b.url})[0],
                         201)
        wait_for(lambda: atc.endpoints()["b"]["state"] == "healthy", what="b healthy")
        self.assertEqual(probe(), f"decisions={n + 1} a=a/healthy b=b/healthy")
        status, headers, _ = request("127.0.0.1", atc.port, "POST", "/v1/chat/completions",
                                     {"model": "llama-3-8b", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]},
                                     headers={"x-want": "b"})
        self.assertEqual((status, headers["x-atc-endpoint"], headers["x-atc-decision"]), (200, "b", "endpoint"))
        self.assertEqual(self.admin(atc, "DELETE", "/admin/endpoints/b")[0], 200)
        self.assertEqual(probe(), f"decisions={n + 3} a=a/healthy b=b/nil")  # the held view of b: its id, live fields nil
        status, headers, _ = request("127.0.0.1", atc.port, "POST", "/v1/chat/completions",
                                     {"model": "llama-3-8b", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]},
                                     headers={"x-want": "b"})
        self.assertEqual((status, headers["x-atc-endpoint"], headers["x-atc-decision"]), (200, "a", "endpoint"))
        self.assertEqual(self.policy_status(atc)["version"], version)  # never reloaded
        self.assertNotIn("policy v2", atc.read_log())

    def metric(self, atc, name):
        body = request("127.0.0.1", atc.admin_port, "GET", "/metrics")[2].decode()
        m = re.search(r"^%s (\d+)$" % re.escape(name), body, re.M)
        self.assertIsNotNone(m, f"{name} not in /metrics")
        return int(m.group(1))

    def test_endpoints_come_and_go_while_requests_flow_and_no_worker_is_parked(self):
        # Clients stream and post without a pause while endpoints are added, take traffic and are removed
        # with requests in flight on them, ten times over. None of those requests may fail, the removed
        # endpoints' connections must all be freed in the end, and the workers must never have been parked:
        # the endpoint set reaches them through their mailboxes, as policy versions do.
        a = self.start_sim("a", extra=["--decode-ms", "1"])
        b = self.start_sim("b", extra=["--decode-ms", "3"])
        policy = os.path.join(SOURCE_DIR, "scripts", "policy.lua")
        atc = self.start_atc(config([("a", a.url)], workers=2).replace(
            "workers: 2\n", f"workers: 2\npolicy: {{entry: {policy}}}\n"))
        parks = self.metric(atc, "atc_worker_parks_total")
        served, failures, count = set(), [], [0]
        stop = threading.Event()

        def client(k):
            i = 0
            while not stop.is_set():
                i += 1
                body = {"model": "llama-3-8b", "max_tokens": 8, "messages": [{"role": "user", "content": f"c{k} {i}"}]}
                try:
                    if i % 2:
                        status, headers, events = stream_events(atc.port, dict(body, stream=True))
                        ok = status == 200 and events and events[-1][1] == "[DONE]"
                    else:
                        status, headers, data = request("127.0.0.1", atc.port, "POST", "/v1/chat/completions", body)
                        ok = status == 200 and json.loads(data)["choices"]
                except Exception as e:  # a connection cut counts as a failure too
                    status, headers, ok = repr(e), {}, False
                count[0] += 1
                if not ok:
                    failures.append((status, headers.get("x-atc-endpoint")))
                served.add(headers.get("x-atc-endpoint"))

        threads = [threading.Thread(target=client, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        try:
            for i in range(10):
                status, body = self.admin(atc, "POST", "/admin/endpoints", {"model": "llama-3-8b", "id": f"n{i}", "url": b.url})
                self.assertEqual(status, 201, body)
                flowed = count[0]  # requests flow while it serves, however slow the build (TSan)
                wait_for(lambda: f"n{i}" in served and count[0] >= flowed + 5, what=f"n{i} serving")
                self.assertEqual(self.admin(atc, "DELETE", f"/admin/endpoints/n{i}")[0], 200)
        finally:
            stop.set()
            for t in threads:
                t.join()
        self.assertEqual(failures, [])
        self.assertGreaterEqual(count[0], 50)
        self.assertEqual(self.metric(atc, "atc_worker_parks_total"), parks)
        wait_for(lambda: self.metric(atc, "atc_endpoints_removed_pending") == 0, what="removed endpoints freed")
        self.assertEqual(sorted(atc.endpoints()), ["a", "o"])

    def test_a_scored_endpoint_removed_during_a_stream_keeps_its_id_in_the_access_log(self):
        # atc.explain names candidates the request does not hold: one removed and freed while the request
        # streams must still be named (by a copy) when the request ends and the access log prints the
        # scores, not read from the freed endpoint (an ASan report fails the test).
        a = self.start_sim("a", extra=["--decode-ms", "20"])
        b = self.start_sim("b", extra=["--decode-ms", "1"])
        self.write_policy("""
return function(req, fleet)
  for _, ep in ipairs(fleet:endpoints(req.model)) do atc.explain(ep, 1, "x") end
  return fleet:endpoint("a")
end
""")
        long_id = "b" * 40
        atc = self.start_atc(config([("a", a.url)]) + "access_log: access.log\npolicy:\n  entry: policy.lua\n")
        self.assertEqual(self.admin(atc, "POST", "/admin/endpoints",
                                    {"model": "llama-3-8b", "id": long_id, "url": b.url})[0], 201)
        wait_for(lambda: atc.endpoints()[long_id]["state"] == "healthy", what="b healthy")
        wait_for(lambda: atc.endpoints()["a"]["state"] == "healthy", what="a healthy")
        conn, resp = open_stream(atc.port, max_tokens=100, timeout=30)
        self.assertEqual(resp.getheader("x-atc-endpoint"), "a")
        self.assertEqual(self.admin(atc, "DELETE", f"/admin/endpoints/{long_id}")[0], 200)
        wait_for(lambda: self.metric(atc, "atc_endpoints_removed_pending") == 0, what="b freed")
        for _ in range(20):  # reuse the freed memory
            self.admin(atc, "GET", "/admin/endpoints")
        stream = resp.read().decode()
        conn.close()
        self.assertTrue(stream.rstrip().endswith("data: [DONE]"), stream[-200:])
        lines = wait_access_lines(os.path.join(self.tmp.name, "access.log"), 1)
        scores = lines[-1]["explain"]["scores"]
        self.assertEqual(sorted(s["endpoint"] for s in scores), ["a", long_id])

    def test_a_removed_endpoint_is_freed_only_after_the_tokenize_asked_of_it_answers(self):
        # The /tokenize before a decision goes to a's pool, and is no request routed to a: a removed while
        # it is asked must outlive the answer (ASan reported a write to its freed pool).
        sims = {n: self.start_sim(n, extra=("--kv-events", "tcp://127.0.0.1:*", "--kv-events-hash", "sha256_cbor",
                                            "--tokenize-delay-ms", "800")) for n in ("a", "b")}
        policy = self.write_policy("return function(req, fleet) return fleet:endpoint('b') end\n")
        eps = "".join(f"""
                  - id: {n}
                    url: {s.url}
                    kv_events: {{endpoint: "{s.info["kv_events"]}"}}""" for n, s in sims.items())
        atc = self.start_atc(f"""
            listen: 127.0.0.1:0
            admin: 127.0.0.1:0
            workers: 2
            health: {{enabled: false}}
            policy: {{entry: {policy}}}
            models:
              - name: llama-3-8b
                kv_events: {{block_size: 64, hash: sha256_cbor, tokenize: true, tokenize_timeout: 3s,
                             tokenize_min_bytes: 1KiB}}
                endpoints:{eps}
            """)
        res = {}
        t = threading.Thread(target=lambda: res.update(r=chat(atc.port, content="tokenize me. " * 200, max_tokens=4)))
        t.start()
        wait_for(lambda: self.metric(atc, "atc_kv_tokenize_calls_total") == 1, what="tokenize asked of a")
        status, body = self.admin(atc, "DELETE", "/admin/endpoints/a")
        self.assertEqual((status, body), (200, {"id": "a", "removed": True, "draining_inflight": 0}))
        self.assertEqual(self.metric(atc, "atc_endpoints_removed_pending"), 1)  # waits for the answer
        t.join(20)
        self.assertEqual((res["r"][0], res["r"][1]["x-atc-endpoint"]), (200, "b"))
        wait_for(lambda: self.metric(atc, "atc_endpoints_removed_pending") == 0, what="a freed")
        self.assertEqual(chat(atc.port, content="tokenize me again. " * 200, max_tokens=4)[0], 200)

    def test_a_policy_build_keeps_the_endpoints_of_the_table_it_began_with(self):
        # The reload's smoke test reads every endpoint of the table the build began with, b among them,
        # while b is removed: b is not freed until the build is over (ASan reported a read of b freed).
        a = self.start_sim("a", extra=["--decode-ms", "1"])
        b = self.start_sim("b", extra=["--decode-ms", "1"])
        self.write_policy("""
return function(req, fleet)
  if req.id == "atc-reload-check" then
    atc.log("smoke test begins")
    local t0 = atc.now()
    while atc.now() - t0 < 300 do end
    local s = 0
    for _, ep in ipairs(fleet:all()) do s = s + (ep.inflight or 0) + #ep.id + (ep.prefill_tokens or 0) end
    return atc.fastest(fleet:all(), req) or atc.queue("x")
  end
  return fleet:endpoint("a")
end
""")
        atc = self.start_atc(config([("a", a.url)]).replace("workers: 2\n", "workers: 2\npolicy: {entry: policy.lua, budget: 5ms}\n"))
        self.assertEqual(self.admin(atc, "POST", "/admin/endpoints", {"model": "llama-3-8b", "id": "b", "url": b.url})[0],
                         201)
        wait_for(lambda: atc.endpoints()["b"]["state"] == "healthy", what="b healthy")
        begun = atc.read_log().count("smoke test begins")
        res = {}
        t = threading.Thread(
            target=lambda: res.update(r=request("127.0.0.1", atc.admin_port, "POST", "/admin/policy/reload")))
        t.start()
        wait_for(lambda: atc.read_log().count("smoke test begins") > begun, what="the reload's smoke test")
        self.assertEqual(self.admin(atc, "DELETE", "/admin/endpoints/b")[0], 200)
        for _ in range(20):  # collects, while the build runs
            self.assertEqual(self.admin(atc, "GET", "/admin/endpoints")[0], 200)
        t.join(20)
        self.assertEqual(res["r"][0], 200, res["r"][2])
        wait_for(lambda: self.metric(atc, "atc_endpoints_removed_pending") == 0, what="b freed after the build")
        self.assertEqual(sorted(atc.endpoints()), ["a", "o"])

    def test_a_request_that_fails_on_a_removed_endpoint_leaves_its_health_alone(self):
        # One worker (the main thread observes inline): b's health husk pointed into the config's endpoint
        # array, which the removal moves and the additions reallocate; b failing after that read it freed.
        a = self.start_sim("a", extra=["--decode-ms", "1"])
        b = self.start_sim("b", extra=["--decode-ms", "50"])
        self.write_policy('return function(req, fleet) return fleet:endpoint("b") or fleet:endpoint("a") end\n')
        atc = self.start_atc(config([("a", a.url)], workers=1).replace(
            "workers: 1\n", "workers: 1\npolicy: {entry: policy.lua}\n"))
        self.assertEqual(self.admin(atc, "POST", "/admin/endpoints", {"model": "llama-3-8b", "id": "b", "url": b.url})[0],
                         201)
        wait_for(lambda: atc.endpoints()["b"]["state"] == "healthy", what="b healthy")
        res = {}
        t = threading.Thread(target=lambda: res.update(r=chat(atc.port, max_tokens=200)))
        t.start()
        wait_for(lambda: atc.endpoints()["b"]["inflight"] == 1, what="a request in flight on b")
        status, body = self.admin(atc, "DELETE", "/admin/endpoints/b")
        self.assertEqual((status, body), (200, {"id": "b", "removed": True, "draining_inflight": 1}))
        for n in ("c", "d", "e"):
            self.assertEqual(self.admin(atc, "POST", "/admin/endpoints", {"model": "llama-3-8b", "id": n, "url": a.url})[0],
                             201)
        b.proc.kill()
        t.join(20)
        self.assertEqual(res["r"][0], 200)  # tried again on a (or c, d, e: the same server)
        self.assertNotEqual(res["r"][1]["x-atc-endpoint"], "b")
        wait_for(lambda: self.metric(atc, "atc_endpoints_removed_pending") == 0, what="b freed")
        wait_for(lambda: all(atc.endpoints()[n]["state"] == "healthy" for n in "cde"), what="c, d, e healthy")
        status, headers, _ = chat(atc.port, max_tokens=1)
        self.assertEqual(status, 200)

    def test_atc_serve_ignores_a_replays_from_and_until_and_says_so(self):
        # from: / until: place a server in a replay's fleet over time; atc serve serves it from the start.
        a = self.start_sim("a", extra=["--decode-ms", "1"])
        atc = self.start_atc(config([("a", a.url)]).replace(
            f'url: "{a.url}", capacity: 64}}', f'url: "{a.url}", capacity: 64, from: 10m, until: 20m}}'))
        wait_for(lambda: atc.endpoints()["a"]["state"] == "healthy", what="a healthy")
        status, headers, _ = chat(atc.port, max_tokens=1)
        self.assertEqual((status, headers["x-atc-endpoint"]), (200, "a"))
        self.assertIn("endpoint a: from:/until: are read by atc replay and atc test only; atc serve ignores them",
                      atc.read_log())


if __name__ == "__main__":
    raise SystemExit(run_file(__file__))
