"""The request path end to end: atc serve in front of simulated servers on loopback."""

import json
import signal
import socket
import time
import unittest

import os

from harness import SOURCE_DIR, AtcTestCase, post_raw, chat, dead_port, request, stream_events, wait_for

SIMULATED = """
listen: 127.0.0.1:0
admin: 127.0.0.1:0
models:
  - name: llama-3-8b
  - name: small
simulate:
  - model: llama-3-8b
    count: 2
    decode_ms: {decode_ms}
  - model: small
    count: 1
"""


def error_of(body):
    doc = json.loads(body)
    err = doc["error"]
    for key in ("message", "type", "code"):
        assert key in err, doc
    return err


class ProxyTest(AtcTestCase):
    def test_streaming_events_arrive_before_the_stream_ends(self):
        atc = self.start_atc(SIMULATED.format(decode_ms=25))
        body = {"model": "llama-3-8b", "stream": True, "max_tokens": 20,
                "messages": [{"role": "user", "content": "tell me a story"}]}
        status, headers, events = stream_events(atc.port, body)
        self.assertEqual(status, 200)
        self.assertTrue(headers["content-type"].startswith("text/event-stream"))
        self.assertIn(headers["x-atc-endpoint"], ("llama-3-8b-sim-1", "llama-3-8b-sim-2"))
        self.assertRegex(headers.get("x-request-id", ""), r"^atc-[0-9a-f]{16}$")  # made by atc: none was sent
        self.assertEqual(events[-1][1], "[DONE]")
        chunks = [json.loads(data) for _, data in events[:-1]]
        self.assertGreaterEqual(len(chunks), 20)
        self.assertEqual(chunks[0]["object"], "chat.completion.chunk")
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c.get("choices"))
        self.assertTrue(text.strip())
        # 20 tokens at 25 ms each take about half a second: the first event must reach the client long
        # before the last one, or atc buffered the stream.
        first, last = events[0][0], events[-1][0]
        self.assertGreater(last - first, 0.3, f"events arrived together: first {first:.3f}s last {last:.3f}s")

    def test_non_streaming_json(self):
        atc = self.start_atc(SIMULATED.format(decode_ms=2))
        status, headers, body = chat(atc.port, max_tokens=5, headers={"x-request-id": "req-42"})
        self.assertEqual(status, 200, body)
        self.assertTrue(headers["content-type"].startswith("application/json"))
        self.assertEqual(headers["x-request-id"], "req-42")
        self.assertIn(headers["x-atc-endpoint"], ("llama-3-8b-sim-1", "llama-3-8b-sim-2"))
        doc = json.loads(body)
        self.assertEqual(doc["object"], "chat.completion")
        self.assertEqual(doc["usage"]["completion_tokens"], 5)
        self.assertTrue(doc["choices"][0]["message"]["content"])

    def test_completions_route_and_other_model(self):
        atc = self.start_atc(SIMULATED.format(decode_ms=2))
        status, headers, body = request("127.0.0.1", atc.port, "POST", "/v1/completions",
                                        {"model": "small", "prompt": "once upon", "max_tokens": 3})
        self.assertEqual(status, 200, body)
        self.assertEqual(headers["x-atc-endpoint"], "small-sim-1")
        self.assertEqual(json.loads(body)["object"], "text_completion")

    def test_models_lists_every_configured_model(self):
        atc = self.start_atc(SIMULATED.format(decode_ms=2))
        status, _, body = request("127.0.0.1", atc.port, "GET", "/v1/models")
        self.assertEqual(status, 200)
        doc = json.loads(body)
        self.assertEqual(doc["object"], "list")
        self.assertEqual(sorted(m["id"] for m in doc["data"]), ["llama-3-8b", "small"])
        self.assertTrue(all(m["object"] == "model" for m in doc["data"]))

    def test_health(self):
        atc = self.start_atc(SIMULATED.format(decode_ms=2))
        status, _, body = request("127.0.0.1", atc.port, "GET", "/health")
        self.assertEqual(status, 200)
        self.assertEqual(json.loads(body)["status"], "ok")

    def test_client_errors(self):
        atc = self.start_atc(SIMULATED.format(decode_ms=2))
        cases = [
            ("malformed JSON", b'{"model": "llama-3-8b", "messages": [', 400, None),
            ("not an object", b'["model"]', 400, None),
            ("missing model", {"messages": [{"role": "user", "content": "x"}]}, 400, "missing_model"),
            ("messages not a list", {"model": "llama-3-8b", "messages": "hi"}, 400, None),
            ("unknown model", {"model": "gpt-9", "messages": []}, 404, "model_not_found"),
            ("bad priority", {"model": "llama-3-8b", "messages": []}, 400, "invalid_priority"),
        ]
        for name, body, want, code in cases:
            with self.subTest(name):
                headers = {"x-atc-priority": "12"} if name == "bad priority" else None
                status, hdrs, out = request("127.0.0.1", atc.port, "POST", "/v1/chat/completions", body, headers)
                self.assertEqual(status, want, out)
                self.assertTrue(hdrs["content-type"].startswith("application/json"))
                err = error_of(out)
                self.assertIsInstance(err["code"], str, out)  # as OpenAI's: never the status number
                if code:
                    self.assertEqual(err["code"], code)
                if name == "unknown model":
                    self.assertEqual(err["message"],
                                     "The model 'gpt-9' does not exist; GET /v1/models lists the models served")
        # a route atc does not serve (the Responses API, say) is told which ones it does
        status, _, out = request("127.0.0.1", atc.port, "POST", "/v1/responses", json.dumps({"model": "m"}),
                                 headers={"content-type": "application/json"})
        self.assertEqual(status, 404)
        self.assertEqual(error_of(out)["code"], "not_found")
        self.assertIn("atc serves POST /v1/chat/completions, /v1/completions and /v1/embeddings",
                      error_of(out)["message"])
        status, _, out = request("127.0.0.1", atc.port, "GET", "/v1/chat/completions")
        self.assertEqual(status, 405)
        error_of(out)

    def test_unknown_model_is_model_not_found_with_the_shipped_policy(self):
        # The shipped policy rejects a model it cannot resolve with a 404; the client sees the same
        # answer as without a policy.
        atc = self.start_atc(SIMULATED.format(decode_ms=2) + "policy:\n  entry: %s\n"
                             % os.path.join(SOURCE_DIR, "scripts", "policy.lua"))
        status, hdrs, out = chat(atc.port, model="gpt-9")
        self.assertEqual(status, 404, out)
        self.assertEqual(error_of(out)["code"], "model_not_found")
        self.assertEqual(error_of(out)["type"], "invalid_request_error")
        self.assertTrue(hdrs.get("x-atc-policy-version"))  # the policy did decide it

    def test_body_over_the_limit_is_413(self):
        atc = self.start_atc(SIMULATED.format(decode_ms=2) + "max_body: 4KiB\n")
        big = {"model": "llama-3-8b", "messages": [{"role": "user", "content": "x" * 8000}]}
        status, _, out = request("127.0.0.1", atc.port, "POST", "/v1/chat/completions", big)
        self.assertEqual(status, 413)
        self.assertEqual(error_of(out)["code"], "request_too_large")
        # The server is unaffected: a small request still works.
        status, _, _ = chat(atc.port, max_tokens=2)
        self.assertEqual(status, 200)

    def test_no_capacity_is_503_with_retry_after(self):
        atc = self.start_atc("""
            listen: 127.0.0.1:0
            admin: 127.0.0.1:0
            admission:
              queue: 0              # no waiting: a full fleet answers at once
            models:
              - name: llama-3-8b
            simulate:
              - model: llama-3-8b
                count: 1
                capacity: 1
                decode_ms: 50
        """)
        # Hold the only slot with a long stream, then ask again.
        sock = post_raw(atc.port, {"model": "llama-3-8b", "stream": True, "max_tokens": 100,
                           "messages": [{"role": "user", "content": "hold"}]})
        wait_for(lambda: atc.endpoints()["llama-3-8b-sim-1"]["inflight"] == 1, what="slot taken")
        status, headers, out = chat(atc.port, max_tokens=2)
        self.assertEqual(status, 503)
        self.assertEqual(headers["retry-after"], "1")
        self.assertEqual(error_of(out)["code"], "no_endpoint_available")
        sock.close()

    def test_dead_server_is_502(self):
        atc = self.start_atc(f"""
            listen: 127.0.0.1:0
            admin: 127.0.0.1:0
            models:
              - name: llama-3-8b
                endpoints:
                  - {{id: dead, url: "http://127.0.0.1:{dead_port()}"}}
        """)
        status, headers, out = chat(atc.port)
        self.assertEqual(status, 502)
        self.assertEqual(headers["x-atc-endpoint"], "dead")
        self.assertIn("connect failed", error_of(out)["message"])
        self.assertEqual(atc.endpoints()["dead"]["errors_total"], 1)

    def test_hung_server_is_504(self):
        sim = self.start_sim(extra=["--hang-rate", "1"])
        atc = self.start_atc(f"""
            listen: 127.0.0.1:0
            admin: 127.0.0.1:0
            upstream:
              first_byte_timeout: 300ms
              tries: 1
            models:
              - name: llama-3-8b
                endpoints:
                  - {{id: hung, url: "{sim.url}"}}
        """)
        start = time.monotonic()
        status, _, out = chat(atc.port)
        self.assertEqual(status, 504)
        self.assertEqual(error_of(out)["type"], "timeout")
        self.assertLess(time.monotonic() - start, 5)
        self.assertEqual(atc.endpoints()["hung"]["inflight"], 0)

    def test_a_whole_answer_may_take_a_token_timeout_per_token_more(self):
        # vLLM sends a non-streamed answer's head once its last token is decoded: a long answer takes
        # longer than first_byte_timeout, and gets token_timeout x its max_tokens more. 40 tokens of
        # 25 ms take about 1 s; first_byte_timeout 300ms alone cut them at 0.3 s, and retried them.
        sim = self.start_sim(extra=["--decode-ms", "25"])
        for token_timeout, want in (("100ms", 200), ("0ms", 504)):
            atc = self.start_atc(f"""
                listen: 127.0.0.1:0
                admin: 127.0.0.1:0
                upstream: {{first_byte_timeout: 300ms, token_timeout: {token_timeout}, tries: 1}}
                models:
                  - name: llama-3-8b
                    endpoints:
                      - {{id: s, url: "{sim.url}"}}
            """, name="atc-" + token_timeout)
            status, _, out = chat(atc.port, max_tokens=40)
            self.assertEqual(status, want, out)
            config = json.loads(request("127.0.0.1", atc.admin_port, "GET", "/admin/config")[2])
            self.assertEqual(config["upstream"]["token_timeout_ms"], int(token_timeout[:-2]))
            # a stream's wait is for its first event, which comes after prefill: token_timeout is not in it
            status, _, events = stream_events(atc.port, {"model": "llama-3-8b", "stream": True, "max_tokens": 40,
                                                         "messages": [{"role": "user", "content": "hi"}]})
            self.assertEqual((status, events[-1][1]), (200, "[DONE]"))
        # a hung server still costs a short answer little: 300 ms + 2 x 100 ms
        hung = self.start_sim("hung", extra=["--hang-rate", "1"])
        atc = self.start_atc(f"""
            listen: 127.0.0.1:0
            admin: 127.0.0.1:0
            upstream: {{first_byte_timeout: 300ms, tries: 1}}
            models:
              - name: llama-3-8b
                endpoints:
                  - {{id: hung, url: "{hung.url}"}}
        """, name="atc-hung")
        start = time.monotonic()
        status, _, out = chat(atc.port, max_tokens=2)
        self.assertEqual((status, error_of(out)["type"]), (504, "timeout"))
        self.assertGreater(time.monotonic() - start, 0.45)

    def test_an_endpoint_id_too_long_for_a_header_leaves_the_answer_whole(self):
        # atc's own headers are built in a fixed buffer; a line that does not fit is left out whole: cut
        # short, it ran into the next header line. Streamed and not, with and without the policy.
        sim = self.start_sim()
        long_id = "e" * 600
        shipped = os.path.join(SOURCE_DIR, "scripts", "policy.lua")
        for policy in ("", f"policy: {{entry: \"{shipped}\"}}"):
            atc = self.start_atc(f"""
                listen: 127.0.0.1:0
                admin: 127.0.0.1:0
                {policy}
                models:
                  - name: llama-3-8b
                    endpoints:
                      - {{id: {long_id}, url: "{sim.url}"}}
            """, name=f"atc{len(policy)}")
            status, headers, body = chat(atc.port, max_tokens=2, headers={"x-request-id": "req-long"})
            self.assertEqual(status, 200, body)
            self.assertEqual(headers["x-request-id"], "req-long")
            self.assertNotIn("x-atc-endpoint", headers)
            if policy:
                self.assertEqual(headers["x-atc-decision"], "endpoint")
            self.assertEqual(json.loads(body)["object"], "chat.completion")
            body = {"model": "llama-3-8b", "stream": True, "max_tokens": 3,
                    "messages": [{"role": "user", "content": "hi"}]}
            status, headers, events = stream_events(atc.port, body)
            self.assertEqual(status, 200)
            self.assertEqual(headers["cache-control"], "no-cache")
            self.assertEqual(events[-1][1], "[DONE]")

    def test_retry_on_another_server_when_the_first_refuses(self):
        sim = self.start_sim()
        # Without active checks, so that the dead endpoint is tried (with them it never gets traffic).
        atc = self.start_atc(f"""
            listen: 127.0.0.1:0
            admin: 127.0.0.1:0
            health: {{enabled: false}}
            models:
              - name: llama-3-8b
                endpoints:
                  - {{id: dead, url: "http://127.0.0.1:{dead_port()}"}}
                  - {{id: live, url: "{sim.url}"}}
        """)
        for _ in range(20):
            status, headers, body = chat(atc.port, max_tokens=2)
            self.assertEqual(status, 200, body)
            self.assertEqual(headers["x-atc-endpoint"], "live")
        eps = atc.endpoints()
        self.assertGreater(eps["dead"]["errors_total"], 0)  # it was tried, and every try was retried
        self.assertEqual(eps["live"]["errors_total"], 0)
        self.assertEqual(eps["dead"]["inflight"] + eps["live"]["inflight"], 0)

    def test_retry_after_a_500(self):
        bad = self.start_sim("bad", extra=["--error-rate", "1"])
        good = self.start_sim("good")
        atc = self.start_atc(f"""
            listen: 127.0.0.1:0
            admin: 127.0.0.1:0
            models:
              - name: llama-3-8b
                endpoints:
                  - {{id: bad, url: "{bad.url}"}}
                  - {{id: good, url: "{good.url}"}}
        """)
        for _ in range(10):
            status, headers, body = chat(atc.port, max_tokens=2)
            self.assertEqual(status, 200, body)
            self.assertEqual(headers["x-atc-endpoint"], "good")
        self.assertGreater(atc.endpoints()["bad"]["errors_total"], 0)

    def test_client_disconnect_mid_stream_frees_the_slot(self):
        atc = self.start_atc(SIMULATED.format(decode_ms=50))
        sock = post_raw(atc.port, {"model": "llama-3-8b", "stream": True, "max_tokens": 200,
                           "messages": [{"role": "user", "content": "long"}]})
        got = b""
        while got.count(b"data: ") < 2:  # the stream is flowing
            got += sock.recv(65536)
        busy = [e for e in atc.endpoints().values() if e["inflight"] == 1]
        self.assertEqual(len(busy), 1)
        sock.close()
        # 200 tokens at 50 ms would take 10 s: the slot must be freed long before that.
        wait_for(lambda: all(e["inflight"] == 0 for e in atc.endpoints().values()), timeout=3,
                 what="in-flight slot freed after the client left")
        status, _, body = request("127.0.0.1", atc.admin_port, "GET", "/admin/endpoints")
        self.assertEqual(json.loads(body)["client_gone_total"], 1)

    def test_client_disconnect_before_the_first_byte_frees_the_slot(self):
        sim = self.start_sim(extra=["--hang-rate", "1"])
        atc = self.start_atc(f"""
            listen: 127.0.0.1:0
            admin: 127.0.0.1:0
            models:
              - name: llama-3-8b
                endpoints:
                  - {{id: hung, url: "{sim.url}"}}
        """)
        sock = post_raw(atc.port, {"model": "llama-3-8b", "messages": [{"role": "user", "content": "x"}]})
        wait_for(lambda: atc.endpoints()["hung"]["inflight"] == 1, what="request in flight")
        sock.close()
        wait_for(lambda: atc.endpoints()["hung"]["inflight"] == 0, timeout=3, what="slot freed")

    def test_a_request_with_n_choices_counts_n_outputs_and_gets_them(self):
        # The engine runs a sequence per choice (vLLM V1's n child requests): the endpoint's in-flight
        # tokens (token_budget, tenants' token limits) count max_tokens once per choice, the prompt once.
        atc = self.start_atc(SIMULATED.format(decode_ms=20))
        held = {}
        for n in (1, 3):
            sock = post_raw(atc.port, {"model": "small", "stream": True, "max_tokens": 1000, "n": n,
                                       "messages": [{"role": "user", "content": "x" * 400}]})
            try:
                def in_flight():
                    ep = atc.endpoints()["small-sim-1"]
                    return ep if ep["inflight"] else None
                held[n] = wait_for(in_flight, what="the request in flight")["inflight_tokens"]
            finally:
                sock.close()
            wait_for(lambda: atc.endpoints()["small-sim-1"]["inflight"] == 0, what="the request gone")
        self.assertEqual(held[3] - held[1], 2000, held)
        status, _, body = chat(atc.port, model="small", max_tokens=2, n=2)
        self.assertEqual(status, 200, body)
        self.assertEqual([c["index"] for c in json.loads(body)["choices"]], [0, 1])
        # a wrong n is the engine's to refuse, in its own words (vLLM's, here)
        status, _, body = chat(atc.port, model="small", n=0)
        self.assertEqual((status, error_of(body)["message"]), (400, "n must be at least 1, got 0."))

    def test_sigterm_lets_a_stream_finish_then_exits_0(self):
        atc = self.start_atc(SIMULATED.format(decode_ms=20))
        sock = post_raw(atc.port, {"model": "llama-3-8b", "stream": True, "max_tokens": 30,
                           "messages": [{"role": "user", "content": "x"}]})
        got = sock.recv(65536)
        atc.signal(signal.SIGTERM, "signal 15: draining")
        sock.settimeout(10)
        while not got.endswith(b"0\r\n\r\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
        self.assertIn(b"data: [DONE]", got)
        self.assertEqual(atc.proc.wait(10), 0)
        # New connections are refused once draining started.
        with self.assertRaises(OSError):
            socket.create_connection(("127.0.0.1", atc.port), timeout=1)


if __name__ == "__main__":
    unittest.main(verbosity=2)
