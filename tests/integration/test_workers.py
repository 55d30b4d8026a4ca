"""Worker threads: every worker serves, and what one worker learns (a reload, a freed slot, a drain)
reaches the others. Each test runs atc with `workers: 2` (two loops, SO_REUSEPORT listeners)."""

import http.client
import json
import os
import signal
import threading
import time
import unittest

from harness import AtcTestCase, chat, request, stream_events, wait_for
from test_health import Stub

BASE = """
listen: 127.0.0.1:0
admin: 127.0.0.1:0
workers: 2
{extra}
models:
  - name: llama-3-8b
{models}
simulate:
  - model: llama-3-8b
    count: 2
    decode_ms: {decode_ms}
"""

POLICY = """
return function(req, fleet)
  return fleet:endpoints(req.model)[1]
end
"""


def admin_json(atc, path):
    status, _, body = request("127.0.0.1", atc.admin_port, "GET", path)
    assert status == 200, body
    return json.loads(body)


def parallel(n, fn):
    """Runs fn(i) on n threads at once (each its own connection); returns the results in order."""
    results = [None] * n

    def run(i):
        try:
            results[i] = fn(i)
        except Exception as e:  # reported as a result: the test asserts on it
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def worker_of(request_id):
    """The worker that made a request id: atc's ids are atc-<16 hex digits>, the worker in the top 16 bits."""
    assert request_id.startswith("atc-") and len(request_id) == 20, request_id
    return int(request_id[4:8], 16)


def connections_by_worker(port, want, limit=400):
    """Keep-alive connections to the front, grouped by the worker that accepted each (the kernel spreads
    connections over the workers' SO_REUSEPORT sockets; a connection stays on its worker): opens
    connections until every worker in want has want[w] of them. Returns {worker: [HTTPConnection]}."""
    groups = {w: [] for w in want}
    spare = []
    for _ in range(limit):
        if all(len(groups[w]) >= n for w, n in want.items()):
            break
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        # An unknown model is answered by the front on the worker that accepted the connection.
        conn.request("POST", "/v1/chat/completions", body=json.dumps({"model": "nope", "messages": []}),
                     headers={"content-type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 404, resp.status
        w = worker_of(resp.getheader("x-request-id"))
        if w in groups and len(groups[w]) < want[w]:
            groups[w].append(conn)
        else:
            spare.append(conn)
    for conn in spare:
        conn.close()
    assert all(len(groups[w]) >= n for w, n in want.items()), {w: len(c) for w, c in groups.items()}
    return groups


class Timed(threading.Thread):
    """One chat request on a given connection, in its own thread; records status and when it ended."""

    def __init__(self, conn, name, priority, max_tokens):
        super().__init__(daemon=True)
        self.conn, self.name, self.priority, self.max_tokens = conn, name, priority, max_tokens
        self.status, self.end = None, None

    def run(self):
        body = {"model": "llama-3-8b", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": self.max_tokens, "stream": False}
        try:
            self.conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                              headers={"content-type": "application/json", "x-atc-priority": str(self.priority)})
            resp = self.conn.getresponse()
            self.body = resp.read()
            self.status, self.endpoint = resp.status, resp.getheader("x-atc-endpoint")
        except Exception as e:  # reported through status: the test asserts on it
            self.status = repr(e)
        self.end = time.monotonic()


class WorkersTest(AtcTestCase):
    def start(self, extra="", models="", decode_ms=1):
        return self.start_atc(BASE.format(extra=extra, models=models, decode_ms=decode_ms))

    def test_every_worker_serves(self):
        atc = self.start()
        self.assertEqual(atc.info["workers"], 2)
        self.assertEqual(admin_json(atc, "/admin/config")["workers"], 2)
        # New connections are spread by the kernel over the two listeners: 64 of them reach both.
        results = parallel(64, lambda i: chat(atc.port, max_tokens=2))
        self.assertEqual([r[0] for r in results], [200] * 64, results[:3])
        ids = {r[1]["x-request-id"] for r in results}
        self.assertEqual(len(ids), 64, "request ids must stay unique across workers")
        doc = admin_json(atc, "/admin/endpoints")
        per_worker = [w["requests_total"] for w in doc["workers"]]
        self.assertEqual(len(per_worker), 2)
        self.assertEqual(sum(per_worker), 64)
        self.assertTrue(all(n > 0 for n in per_worker), per_worker)
        self.assertEqual(doc["requests_total"], 64)
        _, _, metrics = request("127.0.0.1", atc.admin_port, "GET", "/metrics")
        text = metrics.decode()
        for w in (0, 1):
            self.assertIn(f'atc_worker_requests_total{{worker="{w}"}} {per_worker[w]}', text)
        self.assertIn("atc_active_requests 0", text)

    def test_policy_reload_reaches_every_worker(self):
        path = os.path.join(self.tmp.name, "policy.lua")
        with open(path, "w") as f:
            f.write(POLICY)
        atc = self.start(extra="policy:\n  entry: policy.lua\n  watch: false")
        before = parallel(32, lambda i: chat(atc.port, max_tokens=1))
        self.assertEqual({r[1]["x-atc-policy-version"] for r in before}, {"1"})
        status, _, body = request("127.0.0.1", atc.admin_port, "POST", "/admin/policy/reload")
        self.assertEqual(status, 200, body)
        self.assertEqual(json.loads(body)["version"], 2)
        after = parallel(32, lambda i: chat(atc.port, max_tokens=1))
        self.assertEqual([r[0] for r in after], [200] * 32)
        self.assertEqual({r[1]["x-atc-policy-version"] for r in after}, {"2"})
        doc = admin_json(atc, "/admin/endpoints")
        self.assertEqual([w["policy_version"] for w in doc["workers"]], [2, 2])
        self.assertTrue(all(w["requests_total"] > 0 for w in doc["workers"]), doc["workers"])

    def test_a_broken_reload_changes_no_worker(self):
        path = os.path.join(self.tmp.name, "policy.lua")
        with open(path, "w") as f:
            f.write(POLICY)
        atc = self.start(extra="policy:\n  entry: policy.lua\n  watch: false")
        with open(path, "w") as f:
            f.write("return function(req, fleet)\n  return fleet:endpoints(\nend\n")
        status, _, body = request("127.0.0.1", atc.admin_port, "POST", "/admin/policy/reload")
        self.assertEqual(status, 422, body)
        self.assertIn("policy.lua:", json.loads(body)["error"]["message"])
        results = parallel(16, lambda i: chat(atc.port, max_tokens=1))
        self.assertEqual({(r[0], r[1]["x-atc-policy-version"]) for r in results}, {(200, "1")})
        self.assertEqual([w["policy_version"] for w in admin_json(atc, "/admin/endpoints")["workers"]], [1, 1])

    def test_config_reload_reaches_every_worker(self):
        extra_sim = self.start_sim(model="mistral-7b")
        atc = self.start()
        status, _, body = chat(atc.port, model="mistral-7b")
        self.assertEqual(status, 404, body)
        with open(atc.config_path, "w") as f:
            f.write(BASE.format(extra="", decode_ms=1, models=f"""  - name: mistral-7b
    endpoints:
      - id: mistral-a
        url: {extra_sim.url}"""))
        status, _, body = request("127.0.0.1", atc.admin_port, "POST", "/admin/config/reload")
        self.assertEqual(status, 200, body)
        wait_for(lambda: atc.endpoints()["mistral-a"]["state"] == "healthy", what="mistral-a healthy")
        results = parallel(32, lambda i: chat(atc.port, model="mistral-7b", max_tokens=1))
        self.assertEqual([r[0] for r in results], [200] * 32, [r for r in results if r[0] != 200][:1])
        self.assertEqual({r[1]["x-atc-endpoint"] for r in results}, {"mistral-a"})
        doc = admin_json(atc, "/admin/endpoints")
        self.assertTrue(all(w["requests_total"] > 0 for w in doc["workers"]), doc["workers"])

    def test_a_config_reload_with_a_host_that_does_not_resolve_changes_nothing(self):
        atc = self.start()
        with open(atc.config_path, "w") as f:
            f.write(BASE.format(extra="", decode_ms=1, models="""  - name: mistral-7b
    endpoints:
      - id: nowhere
        url: http://no-such-host.invalid:8000"""))
        status, _, body = request("127.0.0.1", atc.admin_port, "POST", "/admin/config/reload")
        self.assertEqual(status, 422, body)
        self.assertIn("nowhere", json.loads(body)["error"]["message"])
        self.assertNotIn("nowhere", atc.endpoints())
        results = parallel(16, lambda i: chat(atc.port, max_tokens=1))
        self.assertEqual([r[0] for r in results], [200] * 16)
        self.assertEqual(chat(atc.port, model="mistral-7b")[0], 404)

    def test_requests_queued_on_both_workers_share_one_fleet(self):
        # One slot in the whole fleet, so requests queue on both workers; every one is placed (a slot
        # freed on one worker wakes the other's queue at once) and the slot is free at the end.
        atc = self.start_atc("""
listen: 127.0.0.1:0
admin: 127.0.0.1:0
workers: 2
admission:
  queue: 100
  deadline: 20s
models:
  - name: llama-3-8b
simulate:
  - model: llama-3-8b
    count: 1
    capacity: 1
    decode_ms: 20
""")
        start = time.monotonic()
        # 16 connections: the kernel puts all of them on one worker's socket once in 2^15 runs
        results = parallel(16, lambda i: chat(atc.port, max_tokens=5))
        elapsed = time.monotonic() - start
        self.assertEqual([r[0] for r in results], [200] * 16, [r for r in results if r[0] != 200][:1])
        self.assertLess(elapsed, 15, "queued requests waited for their deadline")
        doc = admin_json(atc, "/admin/endpoints")
        self.assertTrue(all(w["requests_total"] > 0 for w in doc["workers"]), doc["workers"])
        self.assertEqual(doc["queues"]["admitted_queued"] + doc["queues"]["admitted_direct"], 16)
        self.assertGreater(doc["queues"]["admitted_queued"], 0)
        ep = atc.endpoints()["llama-3-8b-sim-1"]
        self.assertEqual((ep["inflight"], ep["inflight_tokens"]), (0, 0))

    def test_the_queue_limit_holds_for_the_whole_process(self):
        # queue: 3 with two workers: 3 wait, however the kernel spreads the connections (each worker's
        # own queue of 3 let up to 6 wait); the others are told 429 at once. The limit is checked on every
        # run; it is only tested across workers once both took some, so a run whose connections all went
        # to one worker (once in 2^9 runs, more often when one worker is slow under TSan) is run again.
        from harness import post_raw
        spread = []
        for attempt in range(4):
            atc = self.start_atc("""
listen: 127.0.0.1:0
admin: 127.0.0.1:0
workers: 2
admission:
  queue: 3
  deadline: 20s
models:
  - name: llama-3-8b
simulate:
  - model: llama-3-8b
    count: 1
    capacity: 1
    decode_ms: 5
""", name=f"atc{attempt}")
            blocker = post_raw(atc.port, {"model": "llama-3-8b", "stream": True, "max_tokens": 2000, "messages": []})
            wait_for(lambda: atc.endpoints()["llama-3-8b-sim-1"]["inflight"] == 1, what="the slot taken")
            waiters = [post_raw(atc.port, {"model": "llama-3-8b", "max_tokens": 1, "messages": []}, timeout=20)
                       for _ in range(10)]
            try:
                def settled():
                    q = admin_json(atc, "/admin/endpoints")["queues"]
                    return q if q["waiting"] + q["shed_queue_full"] == 10 else None
                q = wait_for(settled, timeout=10, what="every request queued or shed")
                self.assertEqual((q["waiting"], q["shed_queue_full"]), (3, 7), q)
                workers = admin_json(atc, "/admin/endpoints")["workers"]
                spread.append([w["requests_total"] for w in workers])
            finally:
                blocker.close()
                for w in waiters:
                    w.close()
            if all(n > 0 for n in spread[-1]):
                break
        self.assertTrue(all(n > 0 for n in spread[-1]), spread)  # both workers took some

    def test_a_slot_freed_on_one_worker_goes_to_the_more_urgent_request_queued_on_the_other(self):
        # One slot in the fleet. Worker 0 holds it (the blocker) and queues three requests of priority 1;
        # worker 1 queues one of priority 9. When the blocker ends on worker 0, the freed slot must go to
        # worker 1's request, at once (server.c's capacity_freed hook hands it across through worker 1's
        # mailbox), not to worker 0's own queue, so priority order holds across workers. Polling the admin
        # API meanwhile parks worker 1 (the main thread runs worker 0 and the admin API), which wakes its
        # mailbox: it must still report its waiting request afterwards.
        atc = self.start_atc("""
listen: 127.0.0.1:0
admin: 127.0.0.1:0
workers: 2
admission:
  queue: 100
  deadline: 20s
  aging: 60s
models:
  - name: llama-3-8b
simulate:
  - model: llama-3-8b
    count: 1
    capacity: 1
    decode_ms: 10
""")
        conns = connections_by_worker(atc.port, {0: 4, 1: 1})
        try:
            queues = lambda: admin_json(atc, "/admin/endpoints")["queues"]["waiting"]
            blocker = Timed(conns[0][0], "blocker", 0, 40)  # about 0.4 s of decoding on worker 0
            blocker.start()
            wait_for(lambda: atc.endpoints()["llama-3-8b-sim-1"]["inflight"] == 1, what="blocker in flight")
            low = [Timed(c, f"low{i}", 1, 2) for i, c in enumerate(conns[0][1:4])]
            for i, t in enumerate(low):
                t.start()
                wait_for(lambda: queues() == i + 1, what=f"{t.name} queued on worker 0")
            high = Timed(conns[1][0], "high", 9, 2)
            high.start()
            wait_for(lambda: queues() == 4, what="high queued on worker 1")
            self.assertTrue(blocker.is_alive(), "the blocker ended before the queue was lined up")
            for t in [blocker, high] + low:
                t.join(30)
            self.assertEqual([t.status for t in [blocker, high] + low], [200] * 5)
            order = sorted([high] + low, key=lambda t: t.end)
            self.assertEqual([t.name for t in order][0], "high",
                             "the slot freed on worker 0 went to its own lower-priority queue")
            # Handed over at once, not at the next admission tick or the blocker's end plus a deadline.
            self.assertLess(high.end - blocker.end, 2.0)
        finally:
            for group in conns.values():
                for c in group:
                    c.close()

    def test_policies_on_both_workers_read_health_while_the_main_thread_writes_it(self):
        # A server whose live check flips on every probe (every 5 ms): the main thread rewrites its state,
        # last error, failure count, check time and scraped load all the time, while the policy on each
        # worker reads all of them for every request. Under the TSan build (tests/run) a plain field
        # written while read is a reported race; here the values read must also make sense.
        flappy = Stub({"/health": lambda n: (500 if n % 2 else 200, ""),
                       "/metrics": lambda n: (200, f"vllm:num_requests_running {n % 7}\n")})
        self.addCleanup(flappy.stop)
        path = os.path.join(self.tmp.name, "policy.lua")
        with open(path, "w") as f:
            f.write("""
local seen = {}
return function(req, fleet)
  for _, ep in ipairs(fleet:endpoints("flappy")) do
    local e, c, h, n = ep.last_error, ep.last_check, ep.health, ep.consecutive_failures
    local r, p, q, kv = ep.running, ep.prefix_hit_rate, ep.queue, ep.kv_usage
    assert(e == nil or (type(e) == "string" and #e > 0 and #e < 200), "last_error: " .. tostring(e))
    assert(c == nil or c > 0, "last_check")
    assert(h == "healthy" or h == "unhealthy" or h == "starting", "health: " .. tostring(h))
    -- nil until known (the contract): before the first probe, before the first scrape
    assert((n == nil or (n >= 0 and n < 100)) and (r == nil or (r >= 0 and r < 7)), "counts")
  end
  return fleet:endpoints(req.model)[1]
end
""")
        atc = self.start_atc(f"""
listen: 127.0.0.1:0
admin: 127.0.0.1:0
workers: 2
policy:
  entry: policy.lua
  watch: false
health:
  failure_threshold: 1
  recovery_threshold: 1
  fast_interval: 5ms
  down_interval: 5ms
  live: {{interval: 5ms, timeout: 500ms}}
  ready: {{interval: 5ms, timeout: 500ms}}
  scrape: {{interval: 5ms, timeout: 500ms}}
models:
  - name: llama-3-8b
  - name: flappy
    endpoints:
      - {{id: flappy, url: "{flappy.url}"}}
simulate:
  - model: llama-3-8b
    count: 1
    decode_ms: 0
""")
        wait_for(lambda: flappy.count("/health") > 20, what="flappy checked")
        deadline = time.monotonic() + 1.5
        results = parallel(8, lambda i: [chat(atc.port, max_tokens=1)[0]
                                         for _ in iter(lambda: time.monotonic() < deadline, False)])
        statuses = [s for r in results for s in (r if isinstance(r, list) else [r])]
        self.assertGreater(len(statuses), 50)
        self.assertEqual(set(statuses), {200}, statuses[:3])
        doc = admin_json(atc, "/admin/endpoints")
        self.assertTrue(all(w["requests_total"] > 0 for w in doc["workers"]), doc["workers"])
        self.assertGreater(atc.endpoints()["flappy"]["state_changes"], 10)
        _, _, metrics = request("127.0.0.1", atc.admin_port, "GET", "/metrics")
        self.assertIn('atc_policy_fallbacks_total{reason="error"} 0\n', metrics.decode())

    def test_drain_lets_streams_on_every_worker_finish(self):
        atc = self.start(decode_ms=50)
        body = {"model": "llama-3-8b", "stream": True, "max_tokens": 20,
                "messages": [{"role": "user", "content": "a story"}]}
        results = []

        def client(i):
            return stream_events(atc.port, body)

        threads_done = []

        def run():
            threads_done.append(parallel(16, client))  # 16: both workers get some (but once in 2^15)

        t = threading.Thread(target=run)
        t.start()
        wait_for(lambda: admin_json(atc, "/admin/endpoints")["active"] == 16, what="16 streams open")
        doc = admin_json(atc, "/admin/endpoints")
        self.assertTrue(all(w["active"] > 0 for w in doc["workers"]), doc["workers"])
        atc.signal(signal.SIGTERM, "signal 15: draining")
        t.join(30)
        results = threads_done[0]
        for status, _, events in results:
            self.assertEqual(status, 200)
            self.assertEqual(events[-1][1], "[DONE]")
        self.assertEqual(atc.proc.wait(15), 0)


if __name__ == "__main__":
    unittest.main()
