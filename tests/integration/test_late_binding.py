"""Late binding in production: the shipped policy holds a request in atc's queue while every endpoint has
a long prefill queue (scripts/priority.lua, HOLD_MS), and a held request is always answered: placed once
a prefill finishes, or 503 with Retry-After at its deadline.

One simulated server prefilling 2,000 tokens a second (the signals' prior says so too): a streamed
request with a long prompt keeps about a second of prefill queued there, so a second request waits in
atc's queue until the first one's first token comes back."""

import json
import os
import threading
import unittest

from harness import SOURCE_DIR, AtcTestCase, chat, request, stream_events, wait_for

CONFIG = """
listen: 127.0.0.1:0
admin: 127.0.0.1:0
workers: 1
policy:
  entry: {entry}
signals:
  prefill_rate: 2000
admission:
  queue: 16
  deadline: 20s
models:
  - name: m
simulate:
  - model: m
    prefill_tps: 2000
    decode_ms: 5
"""

LONG = "lorem ipsum dolor sit amet " * 1200  # about 2,000+ prompt tokens: a second of prefill


class LateBindingTest(AtcTestCase):
    def start(self):
        entry = os.path.abspath(os.path.join(SOURCE_DIR, "scripts", "policy.lua"))
        return self.start_atc(CONFIG.format(entry=entry))

    def queues(self, atc):
        _, _, body = request("127.0.0.1", atc.admin_port, "GET", "/admin/endpoints")
        return json.loads(body)["queues"]

    def long_stream(self, atc):
        out = {}

        def run():
            body = {"model": "m", "stream": True, "max_tokens": 4, "messages": [{"role": "user", "content": LONG}]}
            out["status"], _, out["events"] = stream_events(atc.port, body, timeout=30)

        th = threading.Thread(target=run, daemon=True)
        th.start()
        wait_for(lambda: atc.endpoints()["m-sim-1"]["inflight"] == 1, what="the long prompt in flight")
        return th, out

    def test_a_held_request_is_placed_when_the_prefill_ahead_finishes(self):
        atc = self.start()
        th, first = self.long_stream(atc)
        status, _, _ = chat(atc.port, model="m", content="a short question", max_tokens=2, timeout=30)
        th.join(30)
        self.assertEqual(first["status"], 200)
        self.assertEqual(status, 200)
        q = self.queues(atc)
        # it waited in atc's queue (not on the server's), and left it placed
        self.assertEqual((q["admitted_queued"], q["waiting"], q["shed_deadline"]), (1, 0, 0))
        self.assertEqual(atc.endpoints()["m-sim-1"]["requests_total"], 2)

    def test_a_held_request_past_its_deadline_gets_503_and_retry_after(self):
        atc = self.start()
        th, first = self.long_stream(atc)
        status, headers, body = chat(atc.port, model="m", content="a short question", max_tokens=2,
                                     headers={"x-atc-deadline": "100ms"})
        self.assertEqual(status, 503)
        self.assertEqual(json.loads(body)["error"]["code"], "queue_timeout")
        self.assertTrue(headers["retry-after"].isdigit())
        th.join(30)
        self.assertEqual(first["status"], 200)
        self.assertEqual(self.queues(atc)["shed_deadline"], 1)

    def test_an_urgent_request_is_never_held(self):
        atc = self.start()
        th, _ = self.long_stream(atc)
        status, _, _ = chat(atc.port, model="m", content="a short question", max_tokens=2,
                            headers={"x-atc-priority": "9"})
        self.assertEqual(status, 200)
        th.join(30)
        self.assertEqual(self.queues(atc)["admitted_queued"], 0)


if __name__ == "__main__":
    unittest.main()
