"""Admission control: who waits, who goes first, who is told to come back later.

One simulated server with capacity 1 makes placement order observable: a long "blocker" request holds
the slot while the test lines others up in the queue; when it ends, the queue drains one request at a
time, and completion order is placement order."""

import json
import os
import socket
import subprocess
import threading
import time
import unittest

from harness import ATC_BIN, SLACK, AtcTestCase, post_raw, chat, request, wait_for

# One worker: the order tests need every request in one queue (each worker has its own; queues on two
# workers are covered by test_workers.py).
CONFIG = """
listen: 127.0.0.1:0
admin: 127.0.0.1:0
workers: 1
admission:
  queue: {queue}
  deadline: 10s
  aging: {aging}
  tenant_weights: {{gold: 1, free: 1}}
models:
  - name: m
simulate:
  - model: m
    capacity: 1
    decode_ms: 5
"""


class Client(threading.Thread):
    """One request in its own thread; records status, body and when it finished."""

    done_order = []
    lock = threading.Lock()

    def __init__(self, port, name, headers, max_tokens=15):  # ~100 ms each: longer than a thread's wake-up on a busy machine
        super().__init__(daemon=True)
        self.port, self.name, self.headers, self.max_tokens = port, name, headers, max_tokens
        self.status = None

    def run(self):
        self.start_time = time.monotonic()
        self.status, self.resp_headers, self.body = chat(self.port, model="m", max_tokens=self.max_tokens,
                                                         headers=self.headers, timeout=60)
        self.end_time = time.monotonic()
        with Client.lock:
            Client.done_order.append(self.name)


class AdmissionTest(AtcTestCase):
    def start(self, queue=64, aging="10s"):
        Client.done_order = []
        return self.start_atc(CONFIG.format(queue=queue, aging=aging))

    def queues(self, atc):
        status, _, body = request("127.0.0.1", atc.admin_port, "GET", "/admin/endpoints")
        return json.loads(body)["queues"]

    def block(self, atc, max_tokens=120):
        """Takes the only slot with a long request; returns its client."""
        blocker = Client(atc.port, "blocker", {}, max_tokens=max_tokens)
        blocker.start()
        wait_for(lambda: atc.endpoints()["m-sim-1"]["inflight"] == 1, what="blocker in flight")
        return blocker

    def line_up(self, atc, clients):
        """Starts clients one by one, each after the previous one is in the queue (arrival order)."""
        for i, c in enumerate(clients):
            c.start()
            wait_for(lambda: self.queues(atc)["waiting"] == i + 1, what=f"{c.name} queued")

    def test_higher_priority_goes_first(self):
        atc = self.start()
        blocker = self.block(atc)
        low = [Client(atc.port, f"low{i}", {"x-atc-priority": "0"}) for i in range(6)]
        high = [Client(atc.port, f"high{i}", {"x-atc-priority": "9"}) for i in range(3)]
        self.line_up(atc, low + high)  # the high ones arrive last
        queued = self.queues(atc)["models"][0]
        self.assertEqual((queued["by_priority"][0], queued["by_priority"][9]), (6, 3))
        for c in [blocker] + low + high:
            c.join(30)
        self.assertTrue(all(c.status == 200 for c in low + high))
        # after the blocker (whose client may record its end after the next request's: leave it out)
        order = [n for n in Client.done_order if n != "blocker"]
        self.assertEqual(order[:3], ["high0", "high1", "high2"], order)
        self.assertEqual(order[3:], [f"low{i}" for i in range(6)], order)  # the rest keep their arrival order
        # Waits: every high request waited less than every low one.
        self.assertLess(max(c.end_time - c.start_time for c in high), min(c.end_time - c.start_time for c in low))

    def test_ageing_lets_a_long_wait_through(self):
        atc = self.start(aging="100ms")
        blocker = self.block(atc, max_tokens=200)  # about a second
        old = Client(atc.port, "old-low", {"x-atc-priority": "0"})
        self.line_up(atc, [old])
        time.sleep(0.6)  # waiting raises it one level per 100 ms: past priority 5 by now
        fresh = Client(atc.port, "fresh-mid", {"x-atc-priority": "5"})
        fresh.start()
        wait_for(lambda: self.queues(atc)["waiting"] == 2, what="both queued")
        for c in (blocker, old, fresh):
            c.join(30)
        self.assertEqual([n for n in Client.done_order if n != "blocker"], ["old-low", "fresh-mid"])

    def test_tenants_share_within_a_priority(self):
        atc = self.start()
        blocker = self.block(atc, max_tokens=200)
        noisy = [Client(atc.port, f"free{i}", {"x-atc-tenant": "free"}) for i in range(10)]
        quiet = [Client(atc.port, f"gold{i}", {"x-atc-tenant": "gold"}) for i in range(2)]
        self.line_up(atc, noisy + quiet)  # the quiet tenant arrives behind ten of the noisy one's
        for c in [blocker] + noisy + quiet:
            c.join(60)
        order = [n for n in Client.done_order if n != "blocker"]
        # Equal weights: the two tenants alternate while both wait, so gold's two requests are placed
        # within the first four, not after all ten of free's.
        self.assertLessEqual(max(order.index("gold0"), order.index("gold1")), 3, order)
        self.assertEqual([n for n in order if n.startswith("free")], [f"free{i}" for i in range(10)])

    def test_deadline_queue_full_and_exactly_one_answer_each(self):
        atc = self.start(queue=3)
        blocker = self.block(atc, max_tokens=200)
        waiting = [Client(atc.port, f"w{i}", {"x-atc-deadline": "300ms"}) for i in range(3)]
        self.line_up(atc, waiting)
        # The queue holds three: a fourth is told at once to come back later.
        start = time.monotonic()
        status, headers, body = chat(atc.port, model="m", max_tokens=1)
        self.assertEqual(status, 429)
        self.assertEqual(json.loads(body)["error"]["code"], "queue_full")
        self.assertTrue(headers["retry-after"].isdigit())
        self.assertLess(time.monotonic() - start, 1.0 * SLACK)
        for c in waiting:
            c.join(10)
            self.assertEqual(c.status, 503)
            self.assertEqual(json.loads(c.body)["error"]["code"], "queue_timeout")
            self.assertIn("retry-after", c.resp_headers)
            # 300 ms asked; the queue checks deadlines every 50 ms
            self.assertLess(c.end_time - c.start_time, 0.3 + 0.5 * SLACK)
        blocker.join(30)
        self.assertEqual(blocker.status, 200)
        q = self.queues(atc)
        self.assertEqual((q["waiting"], q["shed_deadline"], q["shed_queue_full"]), (0, 3, 1))
        status, _, body = request("127.0.0.1", atc.admin_port, "GET", "/admin/endpoints")
        doc = json.loads(body)
        self.assertEqual(doc["requests_total"], doc["responses_total"])  # one answer per request

    def test_a_client_that_leaves_the_queue_is_forgotten(self):
        atc = self.start()
        blocker = self.block(atc)
        sock = post_raw(atc.port, {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]})
        wait_for(lambda: self.queues(atc)["waiting"] == 1, what="queued")
        sock.close()
        wait_for(lambda: self.queues(atc)["waiting"] == 0, timeout=3, what="left the queue")
        self.assertEqual(self.queues(atc)["left_queue"], 1)
        blocker.join(30)
        self.assertEqual(atc.endpoints()["m-sim-1"]["requests_total"], 1)  # only the blocker reached the server


class UnknownNamesTest(AtcTestCase):
    def test_names_no_model_serves_wait_as_one_row(self):
        # A policy that queues what it cannot route (as an alias whose targets are full would): five
        # names nobody serves wait at once, and atc status, /admin/endpoints and /metrics show one
        # "other" row for them, not five client-chosen ones.
        policy = os.path.join(self.tmp.name, "queue.lua")
        with open(policy, "w") as f:
            f.write("return function(req, fleet)\n"
                    "  local eps = fleet:endpoints(req.model)\n"
                    "  if #eps == 0 then return atc.queue('unknown') end\n"
                    "  return eps[1]\nend\n")
        atc = self.start_atc(CONFIG.format(queue=64, aging="10s") + f"policy:\n  entry: {policy}\n")
        socks = [post_raw(atc.port, {"model": f"ghost-{i}", "messages": []}) for i in range(5)]
        try:
            wait_for(lambda: AdmissionTest.queues(None, atc)["waiting"] == 5, what="five waiting")
            rows = AdmissionTest.queues(None, atc)["models"]
            self.assertEqual([(r["model"], r["waiting"]) for r in rows], [("other", 5)])
            out = subprocess.run([ATC_BIN, "status", "--admin", f"127.0.0.1:{atc.admin_port}"],
                                 capture_output=True, text=True, timeout=10)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertNotIn("ghost", out.stdout)
            other = [l.split() for l in out.stdout.splitlines() if l.startswith("other ")]
            self.assertEqual(len(other), 1, out.stdout)
            self.assertEqual(other[0][1], "5", out.stdout)
            _, _, metrics = request("127.0.0.1", atc.admin_port, "GET", "/metrics")
            self.assertNotIn(b"ghost", metrics)
            self.assertIn(b'atc_queue_waiting_requests{model="other",priority="0"} 5', metrics)
        finally:
            for s in socks:
                s.close()


if __name__ == "__main__":
    unittest.main(verbosity=2)
