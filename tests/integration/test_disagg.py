"""Prefill/decode disaggregation end to end (issue 30): atc serve in front of `atc sim --role prefill` and
`--role decode` servers (real processes on loopback, port 0 and ready files, deadlines rather than sleeps).

vLLM's protocol (NixlConnector, as vLLM's toy_proxy_server.py runs it): the prefill server saw max_tokens 1,
stream false and kv_transfer_params.do_remote_decode true; the decode server saw the prefill answer's
kv_transfer_params; the client got one whole answer, streamed or not, chat or completions. SGLang's
protocol (pd_router.rs): both servers saw the same bootstrap_room. Failures: a dead prefill server is
replaced within tries, and killing a prefill server under load loses no request. The sims refuse with 400
what does not fit their role, so each assertion can fail.
"""

import json
import os
import subprocess
import tempfile
import threading
import unittest

from harness import ATC_BIN, AtcTestCase, chat, post_raw, request, stream_events, wait_for

MODEL = "llama-3-8b"


def config(prefills, decodes, protocol, tries=2):
    eps = "".join(f"      - {{id: p{i}, url: \"{s.url}\", role: prefill}}\n" for i, s in enumerate(prefills))
    eps += "".join(f"      - {{id: d{i}, url: \"{s.url}\", role: decode}}\n" for i, s in enumerate(decodes))
    return (f"listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\nworkers: 2\nupstream: {{tries: {tries}}}\n"
            f"access_log: access.log\n"
            f"health: {{enabled: false}}\n"
            f"models:\n  - name: {MODEL}\n    disaggregation: {protocol}\n    endpoints:\n{eps}")


def metric(atc, name, **labels):
    """The value of one /metrics series of atc's admin port (0 when absent)."""
    status, _, body = request("127.0.0.1", atc.admin_port, "GET", "/metrics")
    assert status == 200, body
    want = "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items(), key=lambda kv: kv[0] != "model")) + "}"
    for line in body.decode().splitlines():
        if line.startswith(name + (want if labels else " ")):
            return float(line.rsplit(" ", 1)[1])
    return 0


def seen(sim):
    status, _, body = request("127.0.0.1", sim.port, "GET", "/sim/disagg")
    assert status == 200, body
    return json.loads(body)


class Vllm(AtcTestCase):
    def fleet(self, nprefill=1, ndecode=1, protocol="vllm", extra=(), decode_extra=()):
        eng = ["--engine", protocol]
        self.prefills = [self.start_sim(f"p{i}", extra=("--role", "prefill", *eng, *extra)) for i in range(nprefill)]
        self.decodes = [self.start_sim(f"d{i}", extra=("--role", "decode", *eng, *decode_extra))
                        for i in range(ndecode)]
        return self.start_atc(config(self.prefills, self.decodes, protocol))

    def test_streamed_chat_whole_and_params(self):
        atc = self.fleet()
        status, _, events = stream_events(atc.port, {"model": MODEL, "stream": True, "max_tokens": 6,
                                                     "stream_options": {"include_usage": True},
                                                     "messages": [{"role": "user", "content": "hello " * 40}]})
        self.assertEqual(status, 200)
        self.assertEqual(events[-1][1], "[DONE]")
        text = "".join(json.loads(e)["choices"][0]["delta"].get("content", "")
                       for _, e in events[:-1] if json.loads(e).get("choices"))
        self.assertEqual(len(text.split()), 6)  # the decode server's 6 tokens, not the prefill's 1
        p, d = seen(self.prefills[0]), seen(self.decodes[0])
        self.assertEqual(p["requests"], 1)
        self.assertEqual(p["seen"][0]["max_tokens"], 1)
        self.assertFalse(p["seen"][0]["stream"])
        self.assertIs(p["seen"][0]["carried"]["do_remote_decode"], True)
        self.assertIsNone(p["seen"][0]["carried"]["remote_engine_id"])
        got = d["seen"][0]["carried"]
        self.assertIs(got["do_remote_prefill"], True)
        self.assertEqual(got["remote_engine_id"], f"atc-sim-{self.prefills[0].port}")
        self.assertEqual(got["remote_request_id"], f"atc-sim-{self.prefills[0].port}-1")
        self.assertTrue(d["seen"][0]["stream"])
        self.assertEqual(d["seen"][0]["max_tokens"], 6)
        eps = atc.endpoints()
        self.assertEqual((eps["p0"]["role"], eps["d0"]["role"]), ("prefill", "decode"))
        # the access log names both servers and times the stages: prefill, then transfer + first token
        path = os.path.join(self.tmp.name, "access.log")
        line = wait_for(lambda: os.path.exists(path) and open(path).read().strip(), what="the access log")
        rec = json.loads(line.splitlines()[-1])
        self.assertEqual((rec["endpoint"], rec["prefill_endpoint"]), ("d0", "p0"))
        self.assertGreater(rec["prefill_ms"], 0)
        self.assertGreater(rec["decode_first_ms"], 0)
        self.assertGreaterEqual(rec["ttft_ms"], rec["prefill_ms"] + rec["decode_first_ms"] - 1)
        # and /metrics has both stages' times (a whole answer has no first token: the streamed one only)
        self.assertEqual(metric(atc, "atc_disagg_prefill_seconds_count", model=MODEL), 1)
        self.assertEqual(metric(atc, "atc_disagg_decode_first_token_seconds_count", model=MODEL), 1)
        self.assertGreater(metric(atc, "atc_disagg_decode_first_token_seconds_sum", model=MODEL), 0)

    def test_whole_chat_and_completion(self):
        atc = self.fleet()
        status, _, body = chat(atc.port, max_tokens=4, max_completion_tokens=4)
        self.assertEqual(status, 200, body)
        self.assertEqual(json.loads(body)["usage"]["completion_tokens"], 4)
        self.assertNotIn("kv_transfer_params", json.loads(body))  # the prefill answer is not the client's
        status, _, body = request("127.0.0.1", atc.port, "POST", "/v1/completions",
                                  {"model": MODEL, "prompt": "once upon", "max_tokens": 3, "min_tokens": 2})
        self.assertEqual(status, 200, body)
        self.assertEqual(json.loads(body)["usage"]["completion_tokens"], 3)
        s = seen(self.prefills[0])["seen"]
        self.assertEqual([x["max_tokens"] for x in s], [1, 1])
        self.assertEqual(seen(self.decodes[0])["requests"], 2)

    def test_dead_prefill_server_is_replaced(self):
        atc = self.fleet(nprefill=2)
        self.prefills[0].stop()
        for _ in range(6):
            status, _, body = chat(atc.port, max_tokens=2)
            self.assertEqual(status, 200, body)
        self.assertEqual(seen(self.prefills[1])["requests"], 6)
        # /metrics: the prefill stage's failures (a refused connection) and retries, per model and stage
        failed = metric(atc, "atc_disagg_failures_total", model=MODEL, stage="prefill", reason="connection")
        self.assertGreater(failed, 0)
        self.assertEqual(metric(atc, "atc_disagg_retries_total", model=MODEL, stage="prefill"), failed)
        self.assertEqual(metric(atc, "atc_disagg_failures_total", model=MODEL, stage="decode", reason="connection"), 0)
        # the stages' times, once each request's access log line is written (at its end, after its answer)
        wait_for(lambda: metric(atc, "atc_disagg_prefill_seconds_count", model=MODEL) == 6, what="6 prefill times")


    def test_dead_decode_server_is_replaced_with_the_same_params(self):
        atc = self.fleet(ndecode=2)
        self.decodes[0].stop()
        for _ in range(6):
            status, _, body = chat(atc.port, max_tokens=2)
            self.assertEqual(status, 200, body)
        # each request prefilled once: a decode retry reuses the prefill answer's kv_transfer_params
        self.assertEqual(seen(self.prefills[0])["requests"], 6)
        ids = [x["carried"]["remote_request_id"] for x in seen(self.decodes[1])["seen"]]
        self.assertEqual(ids, [f"atc-sim-{self.prefills[0].port}-{i}" for i in range(1, 7)])
        failed = metric(atc, "atc_disagg_failures_total", model=MODEL, stage="decode", reason="connection")
        self.assertGreater(failed, 0)
        self.assertEqual(metric(atc, "atc_disagg_retries_total", model=MODEL, stage="decode"), failed)
        self.assertEqual(metric(atc, "atc_disagg_retries_total", model=MODEL, stage="prefill"), 0)

    def test_killing_a_prefill_server_under_load_loses_nothing(self):
        atc = self.fleet(nprefill=2, ndecode=2)
        results = []

        def client(n):
            for _ in range(n):
                status, _, events = stream_events(atc.port, {"model": MODEL, "stream": True, "max_tokens": 5,
                                                             "messages": [{"role": "user", "content": "hi"}]})
                results.append((status, events[-1][1] if events else None))

        threads = [threading.Thread(target=client, args=(15,)) for _ in range(4)]
        for t in threads:
            t.start()
        self.prefills[0].stop()
        for t in threads:
            t.join(60)
        self.assertEqual(len(results), 60)
        self.assertEqual([r for r in results if r != (200, "[DONE]")], [])

    def test_sglang_same_room(self):
        atc = self.fleet(protocol="sglang")
        status, _, events = stream_events(atc.port, {"model": MODEL, "stream": True, "max_tokens": 5,
                                                     "messages": [{"role": "user", "content": "hello there"}]})
        self.assertEqual(status, 200)
        self.assertEqual(events[-1][1], "[DONE]")
        status, _, body = request("127.0.0.1", atc.port, "POST", "/v1/completions",
                                  {"model": MODEL, "prompt": ["a b", "c d"], "max_tokens": 2})
        self.assertEqual(status, 200, body)
        d = seen(self.decodes[0])["seen"]
        p = seen(self.prefills[0])["seen"]
        self.assertEqual(len(d), 2)
        self.assertIsInstance(d[0]["carried"], int)
        self.assertLess(d[0]["carried"], 2 ** 63)
        self.assertEqual(len(d[1]["carried"]), 2)  # a room per prompt of the batch
        self.assertEqual(len(set(d[1]["carried"])), 2)
        self.assertEqual(sorted(json.dumps(x["carried"]) for x in p), sorted(json.dumps(x["carried"]) for x in d))

    def test_policy_picks_the_pair(self):
        """A Lua policy returns {prefill = p1, decode = d0}: those two servers saw their stage, the others
        nothing; the decision record and the access log name both."""
        self.prefills = [self.start_sim(f"p{i}", extra=("--role", "prefill", "--engine", "vllm")) for i in range(2)]
        self.decodes = [self.start_sim(f"d{i}", extra=("--role", "decode", "--engine", "vllm")) for i in range(2)]
        self.write_policy('return function(req, fleet)\n'
                          '  return {prefill = fleet:endpoint("p1"), decode = "d0"}\nend\n')
        atc = self.start_atc(config(self.prefills, self.decodes, "vllm")
                             + "policy: {entry: policy.lua, explain: true}\n")
        for _ in range(3):
            status, headers, body = chat(atc.port, max_tokens=3, headers={"x-atc-explain": "1"})
            self.assertEqual(status, 200, body)
            self.assertEqual(headers.get("x-atc-endpoint"), "d0")
            record = json.loads(headers["x-atc-explain"])
            self.assertEqual((record["kind"], record["endpoint"], record["prefill"]), ("endpoint", "d0", "p1"))
        self.assertEqual([seen(s)["requests"] for s in self.prefills], [0, 3])
        self.assertEqual([seen(s)["requests"] for s in self.decodes], [3, 0])
        self.assertEqual(seen(self.prefills[1])["seen"][0]["max_tokens"], 1)
        d = seen(self.decodes[0])["seen"][0]["carried"]
        self.assertEqual(d["remote_engine_id"], f"atc-sim-{self.prefills[1].port}")
        path = os.path.join(self.tmp.name, "access.log")

        def log_lines():
            if not os.path.exists(path):
                return None
            with open(path) as f:
                got = f.read().splitlines()
            return got if len(got) >= 3 else None

        lines = wait_for(log_lines, what="three access log lines")
        rec = json.loads(lines[-1])
        self.assertEqual((rec["endpoint"], rec["prefill_endpoint"], rec["decision"]), ("d0", "p1", "endpoint"))

    def test_policy_naming_the_prefill_server_only(self):
        """One endpoint, a prefill server: it takes the prefill stage, the C balancer picks the decode one."""
        self.prefills = [self.start_sim(f"p{i}", extra=("--role", "prefill", "--engine", "vllm")) for i in range(2)]
        self.decodes = [self.start_sim("d0", extra=("--role", "decode", "--engine", "vllm"))]
        self.write_policy('return function(req, fleet) return "p0" end\n')
        atc = self.start_atc(config(self.prefills, self.decodes, "vllm") + "policy: {entry: policy.lua}\n")
        for _ in range(8):  # the C balancer alone would send some of them to p1
            status, headers, body = chat(atc.port, max_tokens=2)
            self.assertEqual(status, 200, body)
            self.assertEqual(headers.get("x-atc-decision"), "endpoint")
        self.assertEqual([seen(s)["requests"] for s in self.prefills], [8, 0])
        self.assertEqual(seen(self.decodes[0])["requests"], 8)

    def test_the_prefill_server_is_learned_as_holding_the_prompt(self):
        """The prefix index records the prefill server as well as the decode one: a repeat of a long
        prompt shows a prefix overlap on the prefill server that computed it (the policy sends the pair to
        d0 only when it sees one)."""
        self.prefills = [self.start_sim(f"p{i}", extra=("--role", "prefill", "--engine", "vllm")) for i in range(2)]
        self.decodes = [self.start_sim(f"d{i}", extra=("--role", "decode", "--engine", "vllm")) for i in range(2)]
        self.write_policy('return function(req, fleet)\n'
                          '  for _, ep in ipairs(fleet:endpoints(req.model)) do\n'
                          '    if ep.role == "prefill" and ep:prefix_overlap(req) > 0 then\n'
                          '      return {prefill = ep, decode = "d0"}\n'
                          '    end\n'
                          '  end\n'
                          '  return {prefill = "p1", decode = "d1"}\n'
                          'end\n')
        atc = self.start_atc(config(self.prefills, self.decodes, "vllm") + "policy: {entry: policy.lua}\n")
        prompt = "the same long system prompt " * 40
        picks = []
        for _ in range(2):
            status, headers, body = chat(atc.port, content=prompt, max_tokens=2)
            self.assertEqual(status, 200, body)
            picks.append(headers.get("x-atc-endpoint"))
        self.assertEqual(picks, ["d1", "d0"])  # the second saw p1 holding the prompt
        self.assertEqual([seen(s)["requests"] for s in self.prefills], [0, 2])

    def leave_and_see_aborts(self, atc, want, read_events=0):
        """A streamed chat on a raw socket; once each server of @want (sim -> aborts expected) has it (and
        @read_events data events arrived), the client leaves; each server must see its request aborted."""
        sock = post_raw(atc.port, {"model": MODEL, "stream": True, "max_tokens": 500,
                                   "messages": [{"role": "user", "content": "hello " * 20}]})
        sims = self.prefills + self.decodes
        wait_for(lambda: all(seen(s)["requests"] == 1 for s in want), what="the stages in flight")
        got = b""
        while got.count(b"data: ") < read_events:
            got += sock.recv(65536)
        sock.close()
        wait_for(lambda: [seen(s)["aborted"] for s in sims] == [want.get(s, 0) for s in sims],
                 what="the servers' aborts")
        wait_for(lambda: all(e["inflight"] == 0 for e in atc.endpoints().values()), what="slots freed")

    def test_a_client_that_leaves_during_prefill_aborts_it(self):
        atc = self.fleet(extra=("--hang-rate", "1"))  # the prefill server never answers
        self.leave_and_see_aborts(atc, {self.prefills[0]: 1})
        self.assertEqual(seen(self.decodes[0])["requests"], 0)

    def test_a_client_that_leaves_while_decode_streams_aborts_it(self):
        atc = self.fleet(decode_extra=("--decode-ms", "100"))  # 500 tokens: 50 s
        self.leave_and_see_aborts(atc, {self.decodes[0]: 1}, read_events=2)
        self.assertEqual(seen(self.prefills[0])["aborted"], 0)  # it had answered

    def test_sglang_a_client_that_leaves_aborts_both_servers(self):
        atc = self.fleet(protocol="sglang", extra=("--hang-rate", "1"), decode_extra=("--hang-rate", "1"))
        self.leave_and_see_aborts(atc, {self.prefills[0]: 1, self.decodes[0]: 1})

    def sglang_pair(self, nprefill, ndecode, policy, prefill_extra=(), decode_extra=()):
        eng = ("--engine", "sglang")
        self.prefills = [self.start_sim(f"p{i}", extra=("--role", "prefill", *eng, *(prefill_extra if i == 0 else ())))
                         for i in range(nprefill)]
        self.decodes = [self.start_sim(f"d{i}", extra=("--role", "decode", *eng, *decode_extra))
                        for i in range(ndecode)]
        self.write_policy(f"return function(req, fleet) return {policy} end\n")
        return self.start_atc(config(self.prefills, self.decodes, "sglang", tries=3) + "policy: {entry: policy.lua}\n")

    def test_sglang_failed_prefill_sends_the_pair_again_with_a_new_room(self):
        """p0 answers 500 while d0 works on the pair (its first token 300 ms away): atc cancels d0's attempt
        and sends the pair again, p1 and d0, with a new room; the client gets one whole answer."""
        atc = self.sglang_pair(2, 1, '{prefill = "p0", decode = "d0"}', prefill_extra=("--error-rate", "1"),
                               decode_extra=("--decode-ms", "300"))
        status, _, events = stream_events(atc.port, {"model": MODEL, "stream": True, "max_tokens": 2,
                                                     "messages": [{"role": "user", "content": "hello"}]})
        self.assertEqual((status, events[-1][1]), (200, "[DONE]"))
        rooms = [x["carried"] for x in seen(self.decodes[0])["seen"]]
        self.assertEqual(len(rooms), 2)
        self.assertNotEqual(rooms[0], rooms[1])
        self.assertEqual([x["carried"] for x in seen(self.prefills[0])["seen"]], rooms[:1])
        self.assertEqual([x["carried"] for x in seen(self.prefills[1])["seen"]], rooms[1:])
        wait_for(lambda: seen(self.decodes[0])["aborted"] == 1, what="the first pair's decode cancelled")
        self.assertEqual(metric(atc, "atc_disagg_failures_total", model=MODEL, stage="prefill", reason="http_5xx"), 1)
        self.assertEqual(metric(atc, "atc_disagg_retries_total", model=MODEL, stage="prefill"), 1)
        self.assertEqual(metric(atc, "atc_disagg_retries_total", model=MODEL, stage="decode"), 0)

    def test_sglang_failed_decode_sends_the_pair_again_on_the_same_prefill_server(self):
        """d0 is dead: the pair goes again to p0 (which did not fail) and d1, with a new room."""
        atc = self.sglang_pair(1, 2, '{decode = "d0"}')
        self.decodes[0].stop()
        status, _, body = chat(atc.port, max_tokens=2)
        self.assertEqual(status, 200, body)
        rooms = [x["carried"] for x in seen(self.prefills[0])["seen"]]
        self.assertEqual(len(rooms), 2)
        self.assertNotEqual(rooms[0], rooms[1])
        self.assertEqual([x["carried"] for x in seen(self.decodes[1])["seen"]], rooms[1:])
        self.assertEqual(metric(atc, "atc_disagg_failures_total", model=MODEL, stage="decode", reason="connection"), 1)
        self.assertEqual(metric(atc, "atc_disagg_retries_total", model=MODEL, stage="decode"), 1)

    def test_admission_holds_the_pair_until_decode_has_room(self):
        """The decode server is full (capacity 1): a second request waits in the queue before its prefill
        and, past its deadline, is shed with no prefill sent for it."""
        self.prefills = [self.start_sim("p0", extra=("--role", "prefill", "--engine", "vllm"))]
        self.decodes = [self.start_sim("d0", extra=("--role", "decode", "--engine", "vllm", "--decode-ms", "100"))]
        yaml = config(self.prefills, self.decodes, "vllm").replace("role: decode}", "role: decode, capacity: 1}")
        atc = self.start_atc(yaml + "admission: {queue: 8, deadline: 10s}\n")
        blocker = post_raw(atc.port, {"model": MODEL, "stream": True, "max_tokens": 100,
                                      "messages": [{"role": "user", "content": "block"}]})
        wait_for(lambda: seen(self.decodes[0])["requests"] == 1, what="the blocker decoding")
        status, _, body = chat(atc.port, max_tokens=2, headers={"x-atc-deadline": "300ms"})
        self.assertEqual(status, 503, body)
        self.assertEqual(json.loads(body)["error"]["code"], "queue_timeout")
        self.assertEqual(seen(self.prefills[0])["requests"], 1)  # the blocker's only
        blocker.close()

    def test_a_full_prefill_stage_queues_the_request_rather_than_refusing_it(self):
        """The only prefill server is full (capacity 1, a slow prefill in flight): a second request waits in
        the admission queue and is served once the slot frees, where it was refused with 503 at once."""
        self.prefills = [self.start_sim("p0", extra=("--role", "prefill", "--engine", "vllm",
                                                     "--prefill-tps", "400"))]
        self.decodes = [self.start_sim("d0", extra=("--role", "decode", "--engine", "vllm"))]
        yaml = config(self.prefills, self.decodes, "vllm").replace("role: prefill}", "role: prefill, capacity: 1}")
        atc = self.start_atc(yaml + "admission: {queue: 8, deadline: 20s}\n")
        results = []

        def first():
            results.append(chat(atc.port, content="a long prompt " * 100, max_tokens=2)[0])

        t = threading.Thread(target=first)
        t.start()
        wait_for(lambda: seen(self.prefills[0])["requests"] == 1, what="the first prefill in flight")
        status, _, body = chat(atc.port, content="another", max_tokens=2)
        t.join()
        self.assertEqual((results, status), ([200], 200), body)
        self.assertEqual(seen(self.prefills[0])["requests"], 2)

    def test_sim_refuses_what_its_role_does_not_take(self):
        self.fleet()
        status, _, body = chat(self.prefills[0].port, max_tokens=3)
        self.assertEqual(status, 400, body)
        status, _, body = chat(self.decodes[0].port, max_tokens=3)
        self.assertEqual(status, 400, body)


class Replay(unittest.TestCase):
    """`atc replay` of a disaggregated fleet: simulate: entries with role: prefill and role: decode."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.trace = os.path.join(self.tmp.name, "t.jsonl")
        with open(self.trace, "w") as f:
            for i in range(4):  # one at a time, far apart: no queueing, each TTFT its own stages
                f.write(json.dumps({"at_ms": 1000 * i, "id": f"r{i}", "model": MODEL, "prompt_tokens": 1000,
                                    "output_tokens": 20, "max_tokens": 20, "stream": True}) + "\n")

    def tearDown(self):
        self.tmp.cleanup()

    def replay(self, fleet, policy=None, disaggregation="vllm"):
        cfg = os.path.join(self.tmp.name, "fleet.yaml")
        with open(cfg, "w") as f:
            f.write(f"models:\n  - name: {MODEL}\n" + (f"    disaggregation: {disaggregation}\n" if disaggregation else "")
                    + "simulate:\n" + "".join(f"  - {{model: {MODEL}, {e}}}\n" for e in fleet))
        args = [ATC_BIN, "replay", "-c", cfg, "--trace", self.trace, "--json"]
        if policy is not None:
            path = os.path.join(self.tmp.name, "policy.lua")
            with open(path, "w") as f:
                f.write(policy)
            args += ["--policy", path]
        done = subprocess.run(args, capture_output=True, text=True, timeout=120)
        self.assertEqual(done.returncode, 0, done.stderr)
        return json.loads(done.stdout)["policies"][0]

    def test_ttft_includes_the_transfer_and_both_servers_work(self):
        # 1000 prompt tokens x 1e6 bytes / 1 GB/s = 1 s of transfer; x 1e7 = 10 s: TTFT 9 s more, exactly
        fast = self.replay(["count: 1, role: prefill", "count: 1, role: decode, kv_bytes_per_token: 1000000, "
                            "transfer_gbps: 1"])
        slow = self.replay(["count: 1, role: prefill", "count: 1, role: decode, kv_bytes_per_token: 10000000, "
                            "transfer_gbps: 1"])
        for r in (fast, slow):
            self.assertEqual(r["completed"], 4)
            self.assertEqual([e["requests"] for e in r["endpoints"]], [4, 4])  # each stage on its server
        self.assertGreater(fast["ttft_p50_ms"], 1000)
        self.assertAlmostEqual(slow["ttft_p50_ms"] - fast["ttft_p50_ms"], 9000, delta=1)
        self.assertAlmostEqual(slow["itl_p50_ms"], fast["itl_p50_ms"], delta=0.01)  # decode is not slower
        self.assertGreater(fast["itl_p50_ms"], 0)
        colocated = self.replay(["count: 2"], disaggregation=None)
        self.assertLess(colocated["ttft_p50_ms"], 1000)  # no transfer

    def test_the_policy_picks_the_pair_in_replay(self):
        fleet = ["count: 2, role: prefill", "count: 2, role: decode"]
        r = self.replay(fleet, policy='return function(req, fleet)\n'
                                      '  return {prefill = "llama-3-8b-sim-2", decode = "llama-3-8b-sim-3"}\nend\n')
        self.assertEqual([e["requests"] for e in r["endpoints"]], [0, 4, 4, 0])
        r = self.replay(fleet, policy='local disagg = require "atc.disagg"\n'
                                      'return function(req, fleet)\n'
                                      '  return disagg.pick(fleet:endpoints(req.model), req) or atc.queue("no pair")\nend\n')
        self.assertEqual(r["completed"], 4)
        self.assertEqual(r["fallbacks"], 0)
        self.assertEqual(sum(e["requests"] for e in r["endpoints"][:2]), 4)
        self.assertEqual(sum(e["requests"] for e in r["endpoints"][2:]), 4)


if __name__ == "__main__":
    unittest.main()
