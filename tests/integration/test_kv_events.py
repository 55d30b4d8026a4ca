"""KV-cache events end to end: atc serve subscribed to a fake engine (kv_publisher.py, written from vLLM's
wire format) that publishes array- and map-encoded batches; /admin/endpoints and /metrics count what atc
read. A gap is filled from the replay socket; a replay socket that never answers, a sequence going back
(an engine restart) and AllBlocksCleared clear the endpoint's entries; garbage is counted as decode errors
while atc goes on serving."""

import json
import os
import subprocess
import unittest
from time import time_ns

from harness import AtcTestCase, chat, request, wait_for

PUBLISHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kv_publisher.py")
# Debian's python3 with python3-zmq and python3-msgpack (the `python3` on PATH may be another one).
PYTHON = "/usr/bin/python3"


class Publisher:
    def __init__(self):
        self.proc = subprocess.Popen([PYTHON, PUBLISHER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        self.addr = json.loads(self.proc.stdout.readline())

    def do(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def stop(self):
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class KvEventsTest(AtcTestCase):
    def start(self, replay=True):
        pub = Publisher()
        self.addCleanup(pub.stop)
        replay_line = f'replay_endpoint: "{pub.addr["replay"]}", ' if replay else ""
        atc = self.start_atc(f"""
            listen: 127.0.0.1:0
            admin: 127.0.0.1:0
            health: {{enabled: false}}
            models:
              - name: m
                kv_events: {{block_size: 16}}
                endpoints:
                  - id: e1
                    url: http://127.0.0.1:9
                    kv_events: {{endpoint: "{pub.addr["pub"]}", {replay_line}max_blocks: 1000}}
            """)
        self.assertEqual(pub.do(op="wait_subscribed"), "ok")
        return pub, atc

    def kv(self, atc):
        return atc.endpoints()["e1"]["kv_events"]

    def wait_kv(self, atc, what, pred):
        return wait_for(lambda: (lambda k: k if pred(k) else None)(self.kv(atc)), what=what)

    def test_array_and_map_batches_fill_the_index(self):
        pub, atc = self.start()
        pub.do(op="batch", seq=0, encoding="array", events=[["stored", [1, 2, 3], "GPU"]])
        pub.do(op="batch", seq=1, encoding="map", events=[["stored", [4, 5], "CPU"], ["other"]])
        pub.do(op="batch", seq=2, encoding="array", events=[["removed", [1], None], ["stored", [6], None]])
        k = self.wait_kv(atc, "three batches", lambda k: k["batches"] == 3)
        self.assertEqual((k["blocks_gpu"], k["blocks_cpu"]), (3, 2))  # 2, 3, 6 on the GPU; 4, 5 on the CPU
        self.assertEqual((k["blocks_stored"], k["blocks_removed"]), (6, 1))
        self.assertEqual((k["last_seq"], k["decode_errors"], k["gaps"], k["unknown_events"]), (2, 0, 0, 1))
        self.assertLess(abs(k["lag_ms"]), 10000)
        # AllBlocksCleared empties it
        pub.do(op="batch", seq=3, encoding="map", events=[["cleared"]])
        k = self.wait_kv(atc, "the clear", lambda k: k["batches"] == 4)
        self.assertEqual((k["blocks_gpu"], k["blocks_cpu"], k["cleared"]), (0, 0, 1))
        status, _, body = request("127.0.0.1", atc.admin_port, "GET", "/metrics")
        self.assertEqual(status, 200)
        self.assertIn('atc_kv_events_batches_total{endpoint="e1"} 4', body.decode())

    def test_gap_is_filled_from_the_replay_socket(self):
        pub, atc = self.start()
        pub.do(op="batch", seq=0, events=[["stored", [10], "GPU"]])
        self.wait_kv(atc, "seq 0", lambda k: k["last_seq"] == 0)
        pub.do(op="batch", seq=1, events=[["stored", [11], "GPU"]], publish=False)  # lost on the way
        pub.do(op="batch", seq=2, encoding="map", events=[["stored", [12], "GPU"]], publish=False)
        pub.do(op="batch", seq=3, events=[["stored", [13], "GPU"]])
        k = self.wait_kv(atc, "the replay", lambda k: k["last_seq"] == 3 and not k["replaying"])
        self.assertEqual((k["gaps"], k["replays"], k["replay_failures"], k["cleared"]), (1, 1, 0, 0))
        self.assertEqual(k["replayed_batches"], 3)  # 1, 2 and 3 from the replay; the live 3 was held, skipped
        self.assertEqual((k["batches"], k["blocks_gpu"]), (4, 4))

    def test_unanswered_replay_and_restart_clear_the_entries(self):
        pub, atc = self.start()
        pub.do(op="replay", mode="silent")
        pub.do(op="batch", seq=0, events=[["stored", [1, 2], "GPU"]])
        pub.do(op="batch", seq=5, events=[["stored", [3], "GPU"]])  # a gap the replay never answers
        k = self.wait_kv(atc, "the replay's deadline", lambda k: k["replay_failures"] == 1 and not k["replaying"])
        self.assertEqual((k["gaps"], k["cleared"], k["blocks_gpu"], k["last_seq"]), (1, 1, 1, 5))
        self.assertIn("did not answer in time", atc.read_log())
        # the engine restarts: its sequence starts again from 0
        pub.do(op="batch", seq=0, events=[["stored", [7, 8], "GPU"]])
        k = self.wait_kv(atc, "the restart", lambda k: k["restarts"] == 1)
        self.assertEqual((k["cleared"], k["blocks_gpu"], k["last_seq"]), (2, 2, 0))

    def test_garbage_is_counted_and_atc_serves(self):
        pub, atc = self.start(replay=False)
        pub.do(op="raw", seq=0, hex="c1c1c1")  # not msgpack
        pub.do(op="raw", seq=1, hex="ddffffffff00")  # an array claiming 4 billion items
        pub.do(op="raw", seq=2, hex="a3616263")  # msgpack, not a batch
        pub.do(op="frames", hex=["", "0102"])  # two frames, a short sequence number
        pub.do(op="batch", seq=3, events=[["stored", [9], "GPU"]])
        k = self.wait_kv(atc, "the good batch", lambda k: k["batches"] == 1)
        self.assertEqual((k["decode_errors"], k["blocks_gpu"], k["gaps"]), (4, 1, 0))
        self.assertEqual(atc.read_log().count("did not decode"), 1)  # logged once
        status, _, _ = request("127.0.0.1", atc.admin_port, "GET", "/metrics")
        self.assertEqual(status, 200)


# Routes a request to the endpoint whose KV events say it holds the most of its prompt (atc.prefix's
# pick, exact where published); with none holding any, to the endpoint named in x-target (default a).
SIM_POLICY = """
local prefix = require "atc.prefix"
return function(req, fleet)
  local pool = fleet:endpoints(req.model)
  for _, ep in ipairs(pool) do
    local c = ep:cached_tokens(req)
    if c ~= nil and c > 0 then
      return prefix.pick(pool, req)
    end
  end
  local want = req:header("x-target") or "a"
  for _, ep in ipairs(pool) do
    if ep.id == want then return ep end
  end
  return atc.queue()
end
"""


class SimKvEventsTest(AtcTestCase):
    """Two atc sim servers publishing their KV events live (vLLM's wire format) behind atc."""

    ZMQ_ANY = "tcp://127.0.0.1:*"

    def sim(self, name, extra=()):
        return self.start_sim(name, extra=("--kv-events", self.ZMQ_ANY, "--kv-events-replay", self.ZMQ_ANY,
                                           *extra))

    def kv(self, atc, ep):
        return atc.endpoints()[ep]["kv_events"]

    def served(self, atc):
        eps = atc.endpoints()
        return eps["a"]["requests_total"], eps["b"]["requests_total"]

    def ask(self, atc, content, target=None):
        headers = {"x-target": target} if target else None
        status, _, body = chat(atc.port, content=content, max_tokens=4, headers=headers)
        self.assertEqual(status, 200, body)

    def test_two_sims_feed_the_exact_index(self):
        a = self.sim("a")
        b = self.sim("b", ("--kv-events-drop", "8"))  # its live socket skips batch 8: a gap to replay
        policy = self.write_policy(SIM_POLICY)
        eps = "".join(f"""
                  - id: {name}
                    url: {s.url}
                    kv_events: {{endpoint: "{s.info["kv_events"]}", replay_endpoint: "{s.info["kv_events_replay"]}"}}"""
                      for name, s in (("a", a), ("b", b)))
        atc = self.start_atc(f"""
            listen: 127.0.0.1:0
            admin: 127.0.0.1:0
            health: {{enabled: false}}
            policy: {{entry: {policy}}}
            models:
              - name: llama-3-8b
                endpoints:{eps}
            """)
        prompt = "the exact index knows where this prompt is cached. " * 40  # 2,080 bytes: 8 blocks
        # The first request goes to b by its header (nothing is cached anywhere yet); its blocks are
        # then counted from b's events. ZMQ subscribers join late: keep asking (new prompts, to a)
        # until a's events are read too.
        wait_for(lambda: self.ask(atc, "warm-up " + str(time_ns()) * 100, "a") or self.kv(atc, "a")["batches"] > 0,
                 what="a's first batch")
        wait_for(lambda: self.ask(atc, "warm-up " + str(time_ns()) * 100, "b") or self.kv(atc, "b")["batches"] > 0,
                 what="b's first batch")
        self.assertLess(self.kv(atc, "b")["last_seq"], 8)  # atc reads b before the gap
        before_b = self.kv(atc, "b")["blocks_gpu"]
        self.ask(atc, prompt, "b")
        k = wait_for(lambda: (lambda k: k if k["blocks_gpu"] >= before_b + 8 else None)(self.kv(atc, "b")),
                     what="b's stored blocks")
        self.assertGreaterEqual(k["blocks_stored"], 8)
        # Batch 8 never comes live: the gap is filled from b's replay socket.
        k = wait_for(lambda: self.ask(atc, "more " + str(time_ns()) * 100, "b") or
                     (lambda k: k if k["last_seq"] > 8 else None)(self.kv(atc, "b")), what="b past batch 8")
        self.assertGreaterEqual(k["gaps"], 1)
        self.assertGreaterEqual(k["replays"], 1)
        self.assertEqual(k["replay_failures"], 0)
        self.assertGreaterEqual(k["blocks_gpu"], before_b + 8)
        # The repeat, without a header (the fallback would send it to a), goes to b by its cached tokens.
        na, nb = self.served(atc)
        self.ask(atc, prompt)
        self.assertEqual(self.served(atc), (na, nb + 1))

        # b restarts on the same ports: its sequence starts again, and atc forgets what b held.
        b.stop()
        b2 = self.start_sim("b2", extra=("--listen", f"127.0.0.1:{b.port}", "--kv-events", b.info["kv_events"],
                                         "--kv-events-replay", b.info["kv_events_replay"]))
        self.assertEqual(b2.port, b.port)
        def restarted():
            self.ask(atc, "after the restart " + str(time_ns()) * 100, "b")
            k = self.kv(atc, "b")
            return k if k["restarts"] + k["cleared"] >= 1 else None
        wait_for(restarted, what="b's restart seen")
        # The old prompt is no longer held by b: its repeat falls back to a.
        na, nb = self.served(atc)
        self.ask(atc, prompt)
        self.assertEqual(self.served(atc), (na + 1, nb))


class TokenizeTest(AtcTestCase):
    """kv_events.tokenize: before the decision atc asks an endpoint's POST /tokenize for the request's token
    ids and chains them into the engine's block keys. The sims publish keys chained from their own token
    ids with sha256_cbor (--kv-events-hash), never the prompt-text hashes atc would guess with, so only
    the tokenize path finds what they hold."""

    ZMQ_ANY = "tcp://127.0.0.1:*"

    def start(self, timeout="2s", sim_extra=()):
        sims = {n: self.start_sim(n, extra=("--kv-events", self.ZMQ_ANY, "--kv-events-hash", "sha256_cbor",
                                            *sim_extra)) for n in ("a", "b")}
        policy = self.write_policy(SIM_POLICY)
        eps = "".join(f"""
                  - id: {n}
                    url: {s.url}
                    kv_events: {{endpoint: "{s.info["kv_events"]}"}}""" for n, s in sims.items())
        return self.start_atc(f"""
            listen: 127.0.0.1:0
            admin: 127.0.0.1:0
            health: {{enabled: false}}
            policy: {{entry: {policy}}}
            models:
              - name: llama-3-8b
                kv_events: {{block_size: 64, hash: sha256_cbor, tokenize: true, tokenize_timeout: {timeout},
                             tokenize_min_bytes: 1KiB}}
                endpoints:{eps}
            """)

    def metric(self, atc, name):
        status, _, body = request("127.0.0.1", atc.admin_port, "GET", "/metrics")
        self.assertEqual(status, 200)
        for line in body.decode().splitlines():
            if line.startswith(name + " "):
                return int(line.split()[1])
        self.fail(f"{name} not in /metrics")

    def ask(self, atc, content, target=None):
        status, _, body = chat(atc.port, content=content, max_tokens=4,
                               headers={"x-target": target} if target else None)
        self.assertEqual(status, 200, body)

    def served(self, atc):
        eps = atc.endpoints()
        return eps["a"]["requests_total"], eps["b"]["requests_total"]

    def test_repeat_goes_to_the_holder_through_tokenize(self):
        atc = self.start()
        for n in ("a", "b"):  # ZMQ subscribers join late: ask until each one's events are read
            wait_for(lambda: self.ask(atc, "warm-up " + str(time_ns()) * 100, n) or
                     atc.endpoints()[n]["kv_events"]["batches"] > 1, what=f"{n}'s first stores")
        calls = self.metric(atc, "atc_kv_tokenize_calls_total")
        self.assertGreaterEqual(calls, 2)  # the warm-ups (2 KiB) were tokenized
        prompt = "the engine's own tokens find where this prompt is cached. " * 40  # 2,400 bytes
        before = atc.endpoints()["b"]["kv_events"]["blocks_gpu"]
        self.ask(atc, prompt, "b")  # nothing holds it yet: the header's endpoint
        wait_for(lambda: atc.endpoints()["b"]["kv_events"]["blocks_gpu"] >= before + 9, what="b's stores")
        self.assertEqual(self.metric(atc, "atc_kv_tokenize_calls_total"), calls + 1)
        hits = self.metric(atc, "atc_kv_tokenize_cache_hits_total")
        # The repeat, without a header (the guess would send it to a: the text hashes match nothing the
        # sims publish), goes to b by the keys of its token ids, taken from the cache this time.
        na, nb = self.served(atc)
        self.ask(atc, prompt)
        self.assertEqual(self.served(atc), (na, nb + 1))
        self.assertEqual(self.metric(atc, "atc_kv_tokenize_cache_hits_total"), hits + 1)
        self.assertEqual(self.metric(atc, "atc_kv_tokenize_calls_total"), calls + 1)
        # A small prompt is not tokenized; nothing timed out or failed.
        self.ask(atc, "short", "a")
        self.assertEqual(self.metric(atc, "atc_kv_tokenize_calls_total"), calls + 1)
        self.assertEqual((self.metric(atc, "atc_kv_tokenize_timeouts_total"),
                          self.metric(atc, "atc_kv_tokenize_failures_total")), (0, 0))

    def test_a_hanging_tokenizer_falls_back_within_the_budget(self):
        atc = self.start(timeout="50ms", sim_extra=("--tokenize-delay-ms", "30000"))
        t0 = time_ns()
        self.ask(atc, "a tokenizer that never answers in time. " * 60, "b")
        elapsed_ms = (time_ns() - t0) / 1e6
        self.assertLess(elapsed_ms, 5000)  # served on the guess, not after the sim's 30 s
        self.assertEqual(self.served(atc), (0, 1))
        self.assertEqual(self.metric(atc, "atc_kv_tokenize_timeouts_total"), 1)
        self.assertEqual(self.metric(atc, "atc_kv_tokenize_calls_total"), 1)


if __name__ == "__main__":
    unittest.main()
