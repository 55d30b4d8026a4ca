"""The first token is a stream's first SSE data event, never its response headers.

vLLM, SGLang (Starlette's StreamingResponse) and TGI send their headers at once and the first event only
after prefill; llama.cpp holds its headers until the first token. A raw-socket server (harness.RawServer)
plays each engine (the simulator is not used: its header timing is not what these tests are about)."""

import json
import os
import time
import unittest

from harness import AtcTestCase, RawServer, chat, request, stream_events, wait_access_lines, wait_for

PREFILL_S = 1.0  # the fake vLLM's time from its headers to its first event
GAP_S = 0.010  # between two events after it
TOKENS = 20
USAGE = {"prompt_tokens": 12, "completion_tokens": TOKENS, "total_tokens": 12 + TOKENS,
         "prompt_tokens_details": {"cached_tokens": 8}}


def chunk(conn, data):
    conn.sendall(b"%x\r\n%s\r\n" % (len(data), data))


def event(obj):
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


STREAM_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
               b"x-engine: fake-vllm\r\nConnection: close, X-Hop\r\nX-Hop: secret\r\nKeep-Alive: timeout=5\r\n"
               b"Proxy-Thing: 1\r\nx-request-id: engine-own\r\n\r\n")


def delta(text):
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": text}}]}


def vllm_stream(prefill_s):
    """Headers at once, a comment (as sse-starlette's pings), the first event after @p prefill_s, then
    one event every GAP_S, the usage chunk and [DONE]."""

    def behave(conn, body):
        conn.sendall(STREAM_HEAD)
        chunk(conn, b": ping\n\n")  # a comment is no token
        time.sleep(prefill_s)
        chunk(conn, event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}))
        for i in range(TOKENS):
            time.sleep(GAP_S)
            chunk(conn, event(delta(f"t{i} ")))
        chunk(conn, event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
        chunk(conn, event({"choices": [], "usage": USAGE}))
        chunk(conn, event(b"[DONE]"))
        conn.sendall(b"0\r\n\r\n")

    return behave


def json_answer(status, body, extra=b""):
    def behave(conn, _):
        data = json.dumps(body).encode()
        conn.sendall(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s"
                     b"Connection: close\r\n\r\n%s" % (status, len(data), extra, data))

    return behave


def completion(conn, body):
    json_answer(200, {"object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": USAGE})(conn, body)


def dies_after_headers(conn, _):
    conn.sendall(STREAM_HEAD)
    chunk(conn, b": ping\n\n")
    time.sleep(0.2)  # then dies during prefill


def headers_then_nothing(conn, _):
    conn.sendall(STREAM_HEAD)
    time.sleep(5)


TGI_OVERLOADED = {"error": "Model is overloaded", "error_type": "overloaded"}
TGI_VALIDATION = {"error": "Input validation error: `max_new_tokens` must be <= 100", "error_type": "validation"}


def tgi_stream_error(conn, _):
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
                 b"Connection: close\r\n\r\n")
    time.sleep(0.05)
    chunk(conn, b"data:" + json.dumps(TGI_VALIDATION).encode() + b"\n\n")
    conn.sendall(b"0\r\n\r\n")


POLICY = """
-- the endpoints in their configured order: the first that can take it (tried ones cannot)
return function(req, fleet)
  for _, ep in ipairs(fleet:endpoints(req.model)) do
    if ep.available then return ep end
  end
  return atc.queue()
end
"""


class FirstTokenTest(AtcTestCase):
    def start_with(self, *engines, first_byte="5s", idle="10s", tries=1, policy=False, name="atc"):
        eps = "\n".join(f'                  - {{id: e{i}, url: "http://127.0.0.1:{e.port}"}}'
                        for i, e in enumerate(engines))
        pol = f"policy: {{entry: {self.write_policy(POLICY)}}}" if policy else ""
        return self.start_atc(f"""
            listen: 127.0.0.1:0
            admin: 127.0.0.1:0
            access_log: {os.path.join(self.tmp.name, name + '.access.log')}
            health: {{enabled: false}}
            upstream:
              first_byte_timeout: {first_byte}
              idle_timeout: {idle}
              tries: {tries}
            {pol}
            models:
              - name: m
                endpoints:
{eps}
        """, name=name)

    def access_lines(self, n, name="atc"):
        return wait_access_lines(os.path.join(self.tmp.name, name + ".access.log"), n)

    def stream(self, atc, **extra):
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        body.update(extra)
        return stream_events(atc.port, body, timeout=15)

    def test_ttft_itl_and_usage_of_a_server_that_sends_headers_before_prefill(self):
        engine = RawServer(vllm_stream(PREFILL_S))
        atc = self.start_with(engine)
        status, headers, events = self.stream(atc)
        self.assertEqual(status, 200)
        self.assertEqual(len(events), TOKENS + 4)  # role, tokens, finish, usage, [DONE]
        self.assertGreater(events[0][0], 0.9, "the client got nothing before the first token")

        # the server's own headers reach the client; hop-by-hop ones and those atc sets do not
        self.assertEqual(headers.get("x-engine"), "fake-vllm")
        self.assertNotIn("x-hop", headers)  # named in Connection
        self.assertNotIn("keep-alive", headers)
        self.assertNotIn("proxy-thing", headers)
        self.assertNotIn("close", headers.get("connection", ""))
        self.assertNotEqual(headers.get("x-request-id"), "engine-own")
        self.assertEqual(headers.get("x-atc-endpoint"), "e0")

        # atc's TTFT is the first token's time, not the headers': at least the prefill wait, and no later
        # than the client saw that token (a bound relative to the client, not to a loaded machine's clock)
        first_event_ms = events[0][0] * 1000 + 1
        line = self.access_lines(1)[0]
        self.assertGreaterEqual(line["ttft_ms"], 900, line)
        self.assertLessEqual(line["ttft_ms"], first_event_ms, line)
        self.assertEqual(line["usage"], {"prompt_tokens": 12, "completion_tokens": TOKENS, "cached_tokens": 8})

        ep = atc.endpoints()["e0"]
        self.assertGreaterEqual(ep["ttft_ewma_ms"], 900, ep)
        self.assertLessEqual(ep["ttft_ewma_ms"], first_event_ms, ep)
        sig = ep["signals"]
        self.assertEqual(sig["itl_samples"], 1, sig)
        self.assertGreater(sig["itl_ms"], GAP_S * 1000 * 0.5, sig)
        self.assertLess(sig["itl_ms"], GAP_S * 1000 * 1.5, sig)
        self.assertAlmostEqual(sig["cached_token_share"], 8 / 12, places=3)
        self.assertEqual(sig["prefill_tokens"], 0, "the prompt left the backlog")

    def test_a_non_streamed_answer_gives_no_ttft_but_its_usage(self):
        atc = self.start_with(RawServer(completion))
        status, headers, body = chat(atc.port, model="m")
        self.assertEqual(status, 200, body)
        line = self.access_lines(1)[0]
        self.assertIsNone(line["ttft_ms"])
        self.assertEqual(line["usage"]["completion_tokens"], TOKENS)
        self.assertEqual(atc.endpoints()["e0"]["ttft_ewma_ms"], 0)

    def test_a_server_that_dies_after_its_headers_before_the_first_event_is_retried(self):
        dead, good = RawServer(dies_after_headers), RawServer(vllm_stream(0.05))
        atc = self.start_with(dead, good, tries=2, policy=True)
        for _ in range(3):
            status, headers, events = self.stream(atc)
            self.assertEqual(status, 200)
            self.assertEqual(headers.get("x-atc-endpoint"), "e1")
            self.assertEqual(len(events), TOKENS + 4)
            self.assertFalse(any("error" in data for _, data in events))
        self.assertEqual(dead.requests, 3)
        eps = atc.endpoints()
        self.assertEqual(eps["e0"]["errors_total"], 3)
        self.assertEqual(eps["e0"]["signals"]["prefill_tokens"], 0)
        self.assertEqual([l["retries"] for l in self.access_lines(3)], [1, 1, 1])

    def test_first_byte_timeout_covers_the_wait_for_the_first_event(self):
        atc = self.start_with(RawServer(headers_then_nothing), first_byte="500ms", idle="10s")
        start = time.monotonic()
        status, headers, body = chat(atc.port, model="m", stream=True)
        took = time.monotonic() - start
        self.assertEqual(status, 504, body)  # nothing had reached the client: a whole error answer
        self.assertLess(took, 3, "the first-byte timeout (500 ms), not the idle timeout (10 s)")
        err = json.loads(body)["error"]
        self.assertEqual((err["type"], err["code"]), ("timeout", "upstream_timeout"))
        self.assertIn("waiting for the response", err["message"])
        self.assertEqual(atc.endpoints()["e0"]["errors_total"], 1)

    def test_a_tgi_429_is_the_server_overloaded_retried_elsewhere(self):
        busy, good = RawServer(json_answer(429, TGI_OVERLOADED)), RawServer(completion)
        atc = self.start_with(busy, good, tries=2, policy=True)
        for _ in range(10):
            status, _, body = chat(atc.port, model="m")
            self.assertEqual(status, 200, body)
        self.assertGreaterEqual(busy.requests, 1)
        self.assertEqual(atc.endpoints()["e0"]["errors_total"], busy.requests)

    def test_tgi_error_bodies_reach_the_client_in_openai_shape(self):
        atc = self.start_with(RawServer(json_answer(422, TGI_VALIDATION, b"x-engine: tgi\r\n")))
        status, headers, body = chat(atc.port, model="m")
        self.assertEqual(status, 422)
        self.assertEqual(headers["content-type"], "application/json")
        self.assertEqual(headers.get("x-engine"), "tgi")
        self.assertEqual(json.loads(body), {"error": {
            "message": TGI_VALIDATION["error"], "type": "invalid_request_error", "param": None,
            "code": "validation"}})

        # the only server overloaded: its 429 reaches the client, OpenAI-shaped
        atc = self.start_with(RawServer(json_answer(429, TGI_OVERLOADED)), name="atc2")
        status, _, body = chat(atc.port, model="m")
        self.assertEqual(status, 429)
        err = json.loads(body)["error"]
        self.assertEqual((err["message"], err["type"], err["code"]),
                         ("Model is overloaded", "rate_limit_error", "overloaded"))
        self.assertEqual(atc.endpoints()["e0"]["errors_total"], 1, "counted against the server")

    def test_a_stream_whose_first_event_is_an_error_counts_against_the_server(self):
        atc = self.start_with(RawServer(tgi_stream_error))
        status, _, events = self.stream(atc)
        self.assertEqual(status, 200)
        self.assertEqual(len(events), 1)
        err = json.loads(events[0][1])["error"]
        self.assertEqual((err["message"], err["code"]), (TGI_VALIDATION["error"], "validation"))
        self.assertEqual(atc.endpoints()["e0"]["errors_total"], 1)
        self.assertIsNone(self.access_lines(1)[0]["ttft_ms"], "an error is no token")


if __name__ == "__main__":
    unittest.main(verbosity=2)
