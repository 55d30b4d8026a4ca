#!/usr/bin/env python3
"""`atc sim`: a real process on loopback, port 0 and a ready file, driven with the standard library."""

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

from harness import signal_until

SLACK = float(os.environ.get("ATC_TEST_SLACK", "1"))  # as harness.SLACK: upper time bounds only

ATC = os.environ.get("ATC_BIN", os.path.join(os.path.dirname(__file__), "..", "..", "build", "atc"))
MODEL = "llama-3-8b"


class Sim:
    """One `atc sim` process; stopped with TERM, then KILL."""

    def __init__(self, *flags, deadline=10.0):
        self.dir = tempfile.TemporaryDirectory()
        ready = os.path.join(self.dir.name, "ready.json")
        self.log_path = os.path.join(self.dir.name, "sim.log")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [ATC, "sim", "--listen", "127.0.0.1:0", "--ready-file", ready, *flags],
                stdout=log, stderr=subprocess.STDOUT)
        end = time.monotonic() + deadline
        while not os.path.exists(ready):
            if self.proc.poll() is not None:
                raise RuntimeError("atc sim exited: %s" % self.log())
            if time.monotonic() > end:
                self.stop()
                raise RuntimeError("atc sim not ready in time")
            time.sleep(0.01)
        with open(ready) as f:
            host, port = json.load(f)["listen"].rsplit(":", 1)
        self.host, self.port = host, int(port)

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def signal(self, sig):
        """Sends sig until the sim says it has it ("sim: signal N, exiting") or is gone."""
        signal_until(self.proc, sig, timeout=15, what=f"signal {int(sig)} received",
                     received=lambda: self.proc.poll() is not None or f"signal {int(sig)}" in self.log())

    def stop(self):
        if self.proc.poll() is None:
            try:
                self.signal(signal.SIGTERM)
                self.proc.wait(15)  # a TSan build's exit can take seconds on a loaded machine
            except (AssertionError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        err = self.log()
        self.dir.cleanup()
        if "Sanitizer" in err:  # a sanitizer build reports leaks and memory errors at exit
            raise AssertionError(err)
        return self.proc.returncode

    def conn(self, timeout=10):
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def request(self, method, path, body=None, timeout=10):
        c = self.conn(timeout)
        data = json.dumps(body) if isinstance(body, dict) else body
        c.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
        r = c.getresponse()
        out = r.status, dict(r.getheaders()), r.read()
        c.close()
        return out

    def metrics(self):
        status, _, body = self.request("GET", "/metrics")
        assert status == 200
        m = {}
        for line in body.decode().splitlines():
            if line.startswith(("vllm:", "sglang:", "llamacpp:", "tgi_")):
                name, value = line.rsplit(" ", 1)
                m[name.split("{")[0]] = float(value)
        return m

    def wait_metric(self, name, value, deadline=5.0):
        end = time.monotonic() + deadline
        while True:
            got = self.metrics()[name]
            if got == value or time.monotonic() > end:
                return got
            time.sleep(0.02)

    def raw(self, body, path="/v1/chat/completions", headers=b""):
        """Sends a request on a bare socket, for clients that leave early."""
        s = socket.create_connection((self.host, self.port), timeout=10)
        b = json.dumps(body).encode()
        s.sendall(b"POST %s HTTP/1.1\r\nHost: sim\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n"
                  % (path.encode(), len(b), headers) + b)
        return s

    def stream(self, body, path="/v1/chat/completions", headers=None):
        """(seconds to the response's headers, seconds to its first SSE event, status, every event)."""
        c = self.conn()
        t0 = time.monotonic()
        c.request("POST", path, body=json.dumps(body), headers=headers or {})
        resp = c.getresponse()
        t_head = time.monotonic() - t0
        events = list(sse_events(resp))
        c.close()
        t_first = events[0][0] - t0 if events else None
        return t_head, t_first, resp.status, [e for _, e in events]


def chat(n=5, stream=False, **extra):
    return dict({"model": MODEL, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": n,
                 "stream": stream}, **extra)


def sse_events(resp):
    """Yields (arrival time, parsed data) per SSE event; the data of [DONE] is the string."""
    while True:
        line = resp.fp.readline()
        if not line:
            return
        line = line.strip()
        if line.startswith(b"data: "):
            data = line[6:].decode()
            if data == "[DONE]":
                yield time.monotonic(), data
                return  # the connection stays open (keep-alive)
            event = json.loads(data)
            yield time.monotonic(), event
            if "error" in event:  # TGI's stream of one error event ends there, without [DONE]
                return


class TestSimServer(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.sim = Sim("--model", MODEL, "--decode-ms", "20", "--max-seqs", "4")

    @classmethod
    def tearDownClass(cls):
        assert cls.sim.stop() == 0

    def test_health_and_models(self):
        status, _, _ = self.sim.request("GET", "/health")
        self.assertEqual(status, 200)
        status, _, body = self.sim.request("GET", "/v1/models")
        models = json.loads(body)
        self.assertEqual(models["object"], "list")
        self.assertEqual([m["id"] for m in models["data"]], [MODEL])
        self.assertEqual(models["data"][0]["owned_by"], "atc-sim")

    def test_embeddings_as_floats_and_as_base64(self):
        # The official OpenAI SDK asks for encoding_format "base64" unless told otherwise: base64 of the
        # little-endian float32 array, the same vector as the float list.
        import base64
        import struct
        body = {"model": MODEL, "input": "the same text"}
        status, _, out = self.sim.request("POST", "/v1/embeddings", body)
        self.assertEqual(status, 200, out)
        floats = json.loads(out)["data"][0]["embedding"]
        self.assertTrue(floats and all(isinstance(x, float) for x in floats))
        status, _, out = self.sim.request("POST", "/v1/embeddings", dict(body, encoding_format="base64"))
        self.assertEqual(status, 200, out)
        encoded = json.loads(out)["data"][0]["embedding"]
        self.assertIsInstance(encoded, str)
        raw = base64.b64decode(encoded, validate=True)
        decoded = struct.unpack("<%df" % (len(raw) // 4), raw)
        self.assertEqual(len(decoded), len(floats))
        for a, b in zip(decoded, floats):
            self.assertAlmostEqual(a, b, places=5)
        status, _, out = self.sim.request("POST", "/v1/embeddings", dict(body, encoding_format="float"))
        self.assertEqual(json.loads(out)["data"][0]["embedding"], floats)
        status, _, out = self.sim.request("POST", "/v1/embeddings", dict(body, encoding_format="utf8"))
        self.assertEqual(status, 400, out)
        # one embedding per input, in order, as vLLM answers a list; equal inputs, equal vectors
        status, _, out = self.sim.request("POST", "/v1/embeddings", {"model": MODEL, "input": ["x", "y", "x"]})
        data = json.loads(out)["data"]
        self.assertEqual((status, [d["index"] for d in data]), (200, [0, 1, 2]))
        self.assertEqual(data[0]["embedding"], data[2]["embedding"])
        self.assertNotEqual(data[0]["embedding"], data[1]["embedding"])
        for tokens, n in (([1, 2, 3], 1), ([[1, 2], [3]], 2)):  # one token list; a list of them
            out = self.sim.request("POST", "/v1/embeddings", {"model": MODEL, "input": tokens})[2]
            self.assertEqual(len(json.loads(out)["data"]), n)

    def test_chat_non_stream(self):
        status, headers, body = self.sim.request("POST", "/v1/chat/completions", chat(7))
        self.assertEqual(status, 200)
        self.assertTrue(headers["Content-Type"].startswith("application/json"))
        r = json.loads(body)
        self.assertTrue(r["id"].startswith("chatcmpl-"))
        self.assertEqual(r["object"], "chat.completion")
        self.assertEqual(r["model"], MODEL)
        self.assertEqual(r["choices"][0]["message"]["role"], "assistant")
        self.assertEqual(len(r["choices"][0]["message"]["content"].split()), 7)
        self.assertEqual(r["choices"][0]["finish_reason"], "length")
        u = r["usage"]
        self.assertEqual(u["completion_tokens"], 7)
        self.assertEqual(u["total_tokens"], u["prompt_tokens"] + 7)

    def test_chat_stream_arrives_token_by_token(self):
        c = self.sim.conn()
        c.request("POST", "/v1/chat/completions", body=json.dumps(chat(10, stream=True)))
        resp = c.getresponse()
        self.assertEqual(resp.status, 200)
        self.assertTrue(resp.getheader("Content-Type").startswith("text/event-stream"))
        events = list(sse_events(resp))
        c.close()
        self.assertEqual(events[-1][1], "[DONE]")
        chunks = [e for _, e in events[:-1]]
        self.assertTrue(all(e["object"] == "chat.completion.chunk" for e in chunks))
        # vLLM's shape: the role chunk, one chunk per token, finish_reason on the last content chunk and
        # no usage unless asked for.
        self.assertEqual(chunks[0]["choices"][0]["delta"], {"role": "assistant", "content": ""})
        content = [e["choices"][0]["delta"].get("content") for e in chunks[1:]]
        self.assertEqual(len([t for t in content if t]), 10)
        self.assertEqual(len(chunks), 11)
        self.assertEqual([e["choices"][0]["finish_reason"] for e in chunks[1:]], [None] * 9 + ["length"])
        self.assertTrue(all("usage" not in e for e in chunks))
        # 9 decode steps of at least 20 ms between the first and the last token: they were streamed.
        self.assertGreater(events[-2][0] - events[1][0], 0.15)

    def test_completions(self):
        status, _, body = self.sim.request("POST", "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 3})
        r = json.loads(body)
        self.assertEqual((status, r["object"]), (200, "text_completion"))
        self.assertEqual(len(r["choices"][0]["text"].split()), 3)
        c = self.sim.conn()
        c.request("POST", "/v1/completions", body=json.dumps({"prompt": "hi", "max_tokens": 2, "stream": True}))
        events = [e for _, e in sse_events(c.getresponse())]
        c.close()
        self.assertEqual(events[-1], "[DONE]")
        self.assertEqual([e["object"] for e in events[:-1]], ["text_completion"] * 2)
        self.assertEqual(events[-2]["choices"][0]["finish_reason"], "length")
        # Without max_tokens the length is drawn and the model "stops".
        status, _, body = self.sim.request("POST", "/v1/completions", {"prompt": "hi"})
        r = json.loads(body)
        self.assertEqual(r["choices"][0]["finish_reason"], "stop")
        self.assertGreaterEqual(r["usage"]["completion_tokens"], 16)

    def test_errors(self):
        for body, code in [('{"model": "llama-3-8b", "messages": {}}', 400), ("{not json", 400),
                           (json.dumps(chat(0)), 400)]:
            status, _, out = self.sim.request("POST", "/v1/chat/completions", body)
            self.assertEqual(status, code, body)
            err = json.loads(out)["error"]
            self.assertEqual((err["code"], err["type"]), (400, "BadRequestError"))
        status, _, out = self.sim.request("POST", "/v1/chat/completions", chat(1, model="gpt-4"))
        err = json.loads(out)["error"]
        self.assertEqual((status, err["code"], err["type"]), (404, 404, "NotFoundError"))
        self.assertIn("gpt-4", err["message"])
        self.assertEqual(self.sim.request("GET", "/nope")[0], 404)
        # past the context (--max-model-len, 131072 by default): vLLM's 400 before any queueing
        status, _, out = self.sim.request("POST", "/v1/chat/completions", chat(10**9))
        err = json.loads(out)["error"]
        self.assertEqual((status, err["code"], err["type"]), (400, 400, "BadRequestError"))
        self.assertIn("maximum context length is 131072 tokens", err["message"])
        self.assertIn("1000000000 in the completion", err["message"])

    def test_metrics_names(self):
        status, headers, body = self.sim.request("GET", "/metrics")
        text = body.decode()
        for name, kind in [("vllm:num_requests_running", "gauge"), ("vllm:num_requests_waiting", "gauge"),
                           ("vllm:kv_cache_usage_perc", "gauge"), ("vllm:prefix_cache_queries_total", "counter"),
                           ("vllm:prefix_cache_hits_total", "counter")]:
            self.assertIn("# TYPE %s %s\n" % (name, kind), text)
            self.assertIn('%s{engine="0",model_name="%s"} ' % (name, MODEL), text)

    def test_prefix_cache_hits_on_repeat(self):
        long = chat(1)
        long["messages"][0]["content"] = "a shared system prompt. " * 200
        before = self.sim.metrics()["vllm:prefix_cache_hits_total"]
        first = json.loads(self.sim.request("POST", "/v1/chat/completions", long)[2])["usage"]
        second = json.loads(self.sim.request("POST", "/v1/chat/completions", long)[2])["usage"]
        self.assertGreater(self.sim.metrics()["vllm:prefix_cache_hits_total"] - before, 1000)
        # usage.prompt_tokens_details.cached_tokens: the hits of this request (always sent by the sim)
        self.assertEqual(first["prompt_tokens_details"], {"cached_tokens": 0})
        self.assertGreater(second["prompt_tokens_details"]["cached_tokens"], 1000)
        self.assertLess(second["prompt_tokens_details"]["cached_tokens"], second["prompt_tokens"])

    def test_headers_at_once_first_event_after_prefill(self):
        # vLLM answers a stream at once and sends its first event once the prompt is prefilled: a
        # 12,000-word prompt takes about a second at 15,000 tokens/s.
        body = chat(2, stream=True)
        body["messages"][0]["content"] = "word " * 12000
        t_head, t_first, status, events = self.sim.stream(body)
        self.assertEqual(status, 200)
        # a prefill between the headers and the first event; relative, as a sanitizer build reads the
        # 60 KB body slower (headers after 0.16 s under TSan in CI)
        self.assertGreater(t_first - t_head, 0.2)
        self.assertLess(t_head, (t_first - t_head) / 2)
        self.assertEqual(events[-1], "[DONE]")

    def test_include_usage(self):
        _, _, _, events = self.sim.stream(chat(3, stream=True, stream_options={"include_usage": True}))
        self.assertEqual(events[-1], "[DONE]")
        last = events[-2]
        self.assertEqual(last["choices"], [])
        self.assertEqual(last["usage"]["completion_tokens"], 3)
        self.assertEqual(last["usage"]["total_tokens"], last["usage"]["prompt_tokens"] + 3)
        self.assertIn("cached_tokens", last["usage"]["prompt_tokens_details"])
        self.assertEqual(events[-3]["choices"][0]["finish_reason"], "length")
        self.assertTrue(all("usage" not in e for e in events[:-2]))
        _, _, _, events = self.sim.stream(chat(3, stream=True, stream_options={"include_usage": False}))
        self.assertTrue(all("usage" not in e for e in events[:-1]))
        # completions too
        _, _, _, events = self.sim.stream({"prompt": "hi", "max_tokens": 2, "stream": True,
                                           "stream_options": {"include_usage": True}}, path="/v1/completions")
        self.assertEqual((events[-2]["choices"], events[-2]["usage"]["completion_tokens"]), ([], 2))

    def test_n_choices_are_sequences_of_their_own(self):
        # vLLM V1 runs a request with n > 1 as n child requests (parallel_sampling.py): n choices, their
        # tokens summed in usage, n sequences running (and taking n of --max-seqs 4).
        status, _, body = self.sim.request("POST", "/v1/chat/completions", dict(chat(3), n=3))
        self.assertEqual(status, 200, body)
        doc = json.loads(body)
        self.assertEqual([c["index"] for c in doc["choices"]], [0, 1, 2])
        self.assertEqual([c["finish_reason"] for c in doc["choices"]], ["length"] * 3)
        texts = [c["message"]["content"] for c in doc["choices"]]
        self.assertEqual(len(set(texts)), 3, texts)  # each choice its own sample
        self.assertEqual(doc["usage"]["completion_tokens"], 9)
        status, _, body = self.sim.request("POST", "/v1/completions",
                                           {"model": MODEL, "prompt": "hi", "max_tokens": 2, "n": 2})
        self.assertEqual([c["index"] for c in json.loads(body)["choices"]], [0, 1])
        # streamed: each choice's chunks carry its index, a role first and a finish_reason last; then
        # the usage of all of them and [DONE]
        body = dict(chat(4, stream=True, stream_options={"include_usage": True}), n=2)
        _, _, _, events = self.sim.stream(body)
        self.assertEqual(events[-1], "[DONE]")
        self.assertEqual(events[-2]["usage"]["completion_tokens"], 8)
        for i in (0, 1):
            mine = [e["choices"][0] for e in events[:-2] if e["choices"][0]["index"] == i]
            self.assertEqual(len(mine), 5)  # the role, four tokens
            self.assertEqual(mine[0]["delta"], {"role": "assistant", "content": ""})
            self.assertEqual([c["finish_reason"] for c in mine], [None] * 4 + ["length"])
        # n sequences run: a long n=3 takes three of the four slots
        sock = self.sim.raw(dict(chat(100000, stream=True), n=3))
        self.assertEqual(self.sim.wait_metric("vllm:num_requests_running", 3), 3)
        sock.close()
        self.assertEqual(self.sim.wait_metric("vllm:num_requests_running", 0), 0)
        # vLLM's 400s (sampling_params.py _verify_args); null is the default
        for n, message in ((0, "n must be at least 1, got 0."), (-2, "n must be at least 1, got -2."),
                           (1.5, "n must be an integer."), ("2", "n must be an integer.")):
            status, _, body = self.sim.request("POST", "/v1/chat/completions", dict(chat(2), n=n))
            self.assertEqual((status, json.loads(body)["error"]["message"]), (400, message))
        self.assertEqual(self.sim.request("POST", "/v1/chat/completions", dict(chat(2), n=None))[0], 200)

    def test_queue_and_client_disconnect_cancels(self):
        # max-seqs 4: four long streams run, a fifth waits; dropping them frees every slot.
        socks = [self.sim.raw(chat(100000, stream=True)) for _ in range(4)]
        waiting = self.sim.raw(chat(100000))
        self.assertEqual(self.sim.wait_metric("vllm:num_requests_running", 4), 4)
        self.assertEqual(self.sim.wait_metric("vllm:num_requests_waiting", 1), 1)
        self.assertTrue(socks[0].recv(4096).startswith(b"HTTP/1.1 200"))
        for s in socks:
            s.close()
        # The waiting one got a slot; then it leaves before any byte of its answer.
        self.assertEqual(self.sim.wait_metric("vllm:num_requests_waiting", 0), 0)
        self.assertEqual(self.sim.wait_metric("vllm:num_requests_running", 1), 1)
        waiting.close()
        self.assertEqual(self.sim.wait_metric("vllm:num_requests_running", 0), 0)
        self.assertEqual(self.sim.wait_metric("vllm:kv_cache_usage_perc", 0), 0)
        # Still serving.
        self.assertEqual(self.sim.request("POST", "/v1/chat/completions", chat(2))[0], 200)


class TestFaults(unittest.TestCase):
    def test_error_rate(self):
        sim = Sim("--error-rate", "1")
        try:
            status, _, body = sim.request("POST", "/v1/chat/completions", chat(2))
            self.assertEqual(status, 500)
            self.assertEqual(json.loads(body)["error"]["code"], 500)
        finally:
            self.assertEqual(sim.stop(), 0)

    def test_hang_rate(self):
        sim = Sim("--hang-rate", "1")
        try:
            with self.assertRaises(socket.timeout):
                sim.request("POST", "/v1/chat/completions", chat(2), timeout=0.5)
            self.assertEqual(sim.request("GET", "/health")[0], 200)
        finally:
            self.assertEqual(sim.stop(), 0)

    def test_not_ready_for_refuses_connections_like_vllm(self):
        # vLLM binds its port before loading and listens once the engine is up.
        sim = Sim("--not-ready-for", "1s")
        try:
            t0 = time.monotonic()
            with self.assertRaises(ConnectionRefusedError):
                socket.create_connection((sim.host, sim.port), timeout=1)
            while True:
                try:
                    status = sim.request("GET", "/health")[0]
                    break
                except ConnectionRefusedError:
                    self.assertLess(time.monotonic() - t0, 5)
                    time.sleep(0.05)
            self.assertEqual(status, 200)
            self.assertGreater(time.monotonic() - t0, 0.5)
            self.assertEqual(sim.request("POST", "/v1/chat/completions", chat(1))[0], 200)
        finally:
            sim.stop()

    def test_die_after(self):
        sim = Sim("--die-after", "2", "--decode-ms", "5")
        try:
            for _ in range(2):
                self.assertEqual(sim.request("POST", "/v1/chat/completions", chat(2))[0], 200)
            c = sim.conn()
            c.request("POST", "/v1/chat/completions", body=json.dumps(chat(40, stream=True)))
            resp = c.getresponse()
            events = [e for _, e in sse_events(resp)]  # until the server closes the connection
            c.close()
            self.assertNotIn("[DONE]", events)
            self.assertEqual(len([e for e in events if e["choices"][0]["delta"].get("content")]), 20)
            self.assertEqual(sim.proc.wait(5), 1)
            with self.assertRaises(ConnectionRefusedError):
                socket.create_connection((sim.host, sim.port), timeout=1)
        finally:
            sim.stop()


class TestEngines(unittest.TestCase):
    def sim(self, *flags):
        sim = Sim(*flags)
        self.addCleanup(lambda: self.assertEqual(sim.stop(), 0))
        return sim

    def test_max_model_len(self):
        sim = self.sim("--max-model-len", "40")
        prompt = json.loads(sim.request("POST", "/v1/chat/completions", chat(1))[2])["usage"]["prompt_tokens"]
        self.assertEqual(sim.request("POST", "/v1/chat/completions", chat(40 - prompt))[0], 200)  # just fits
        status, _, out = sim.request("POST", "/v1/chat/completions", chat(41 - prompt))
        self.assertEqual(status, 400)
        self.assertIn("maximum context length is 40 tokens. However, you requested 41 tokens",
                      json.loads(out)["error"]["message"])
        # without max_tokens the prompt alone must leave room for a token; an embedding's input may fill it
        long = "word " * 40
        unset = {"model": MODEL, "messages": [{"role": "user", "content": long}]}
        status, _, out = sim.request("POST", "/v1/chat/completions", unset)
        self.assertEqual(status, 400)
        self.assertRegex(json.loads(out)["error"]["message"], r"requested \d+ tokens in the messages, Please")
        self.assertEqual(sim.request("POST", "/v1/embeddings", {"model": MODEL, "input": "hi"})[0], 200)
        status, _, out = sim.request("POST", "/v1/embeddings", {"model": MODEL, "input": long})
        self.assertEqual(status, 400)
        self.assertIn("tokens in the input for embedding generation", json.loads(out)["error"]["message"])

    def test_api_key_vllm(self):
        sim = self.sim("--api-key", "sekrit")
        status, _, body = sim.request("POST", "/v1/chat/completions", chat(1))
        self.assertEqual((status, json.loads(body)), (401, {"error": "Unauthorized"}))
        self.assertEqual(sim.request("GET", "/v1/models")[0], 401)
        self.assertEqual(sim.request("GET", "/health")[0], 200)   # outside /v1
        self.assertEqual(sim.request("GET", "/metrics")[0], 200)
        c = sim.conn()
        c.request("POST", "/v1/chat/completions", body=json.dumps(chat(1)),
                  headers={"Authorization": "Bearer sekrit"})
        r = c.getresponse()
        self.assertEqual(r.status, 200, r.read())
        c.close()
        c = sim.conn()
        c.request("GET", "/v1/models", headers={"Authorization": "Bearer wrong"})
        self.assertEqual(c.getresponse().status, 401)
        c.close()

    def test_api_key_each_engine(self):
        for engine, shape, open_paths, guarded in [
                ("sglang", {"error": "Unauthorized"}, ["/health", "/metrics"], ["/v1/models"]),
                ("llamacpp", {"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}},
                 ["/health", "/v1/models"], ["/metrics"]),
                ("tgi", None, ["/health", "/metrics", "/v1/models"], [])]:
            sim = self.sim("--engine", engine, "--api-key", "k")
            status, _, body = sim.request("POST", "/v1/chat/completions", chat(1))
            self.assertEqual(status, 401, engine)
            self.assertEqual(json.loads(body) if body else None, shape, engine)
            for path in open_paths:
                self.assertNotEqual(sim.request("GET", path, timeout=5)[0], 401, (engine, path))
            for path in guarded:
                self.assertEqual(sim.request("GET", path)[0], 401, (engine, path))
            c = sim.conn()
            c.request("POST", "/v1/chat/completions", body=json.dumps(chat(1)), headers={"Authorization": "Bearer k"})
            self.assertEqual(c.getresponse().status, 200, engine)
            c.close()

    def test_llamacpp_loading_and_headers_with_the_first_token(self):
        sim = self.sim("--engine", "llamacpp", "--not-ready-for", "1s")
        status, _, body = sim.request("POST", "/v1/chat/completions", chat(1))
        self.assertEqual((status, json.loads(body)),
                         (503, {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}))
        self.assertEqual(sim.request("GET", "/health")[0], 503)
        self.assertEqual(sim.request("GET", "/metrics")[0], 503)
        self.assertEqual(sim.request("GET", "/")[0], 503)
        status, _, body = sim.request("GET", "/v1/models")  # let through while loading, the model named
        self.assertEqual((status, json.loads(body)["data"][0]["id"]), (200, MODEL))
        t0 = time.monotonic()
        while sim.request("GET", "/health")[0] != 200:
            self.assertLess(time.monotonic() - t0, 5)
            time.sleep(0.05)
        self.assertEqual(json.loads(sim.request("GET", "/health")[2]), {"status": "ok"})
        body = chat(2, stream=True)
        body["messages"][0]["content"] = "word " * 12000
        t_head, t_first, status, events = sim.stream(body)
        self.assertEqual(status, 200)
        self.assertGreater(t_head, 0.2)  # held until the first token
        self.assertEqual(events[-1], "[DONE]")
        text = sim.request("GET", "/metrics")[2].decode()
        for name in ["llamacpp:requests_processing", "llamacpp:requests_deferred", "llamacpp:tokens_predicted_total"]:
            self.assertIn("\n%s " % name, text)
        self.assertNotIn("kv_cache_usage_ratio", text)
        self.assertNotIn("vllm:", text)

    def test_llamacpp_chat_answers_one_choice_only(self):
        # tools/server/utils.hpp, oaicompat_chat_params_parse: any n but 1 is refused
        sim = self.sim("--engine", "llamacpp")
        status, _, body = sim.request("POST", "/v1/chat/completions", dict(chat(2), n=2))
        self.assertEqual(status, 400, body)
        self.assertIn("Only one completion choice is allowed", body.decode())
        self.assertEqual(sim.request("POST", "/v1/chat/completions", dict(chat(2), n=1))[0], 200)

    def test_sglang_health_takes_a_second_and_its_metrics(self):
        sim = self.sim("--engine", "sglang")
        t0 = time.monotonic()
        self.assertEqual(sim.request("GET", "/health")[0], 200)
        self.assertGreater(time.monotonic() - t0, 0.9)
        body = chat(2, stream=True)
        body["messages"][0]["content"] = "word " * 12000
        t_head, t_first, status, events = sim.stream(body)
        self.assertGreater(t_first - t_head, 0.2)  # headers at once, the first event after prefill
        self.assertEqual(events[-1], "[DONE]")
        m = sim.metrics()
        for name in ["sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
                     "sglang:cache_hit_rate", "sglang:max_total_num_tokens"]:
            self.assertIn(name, m)
        self.assertNotIn("vllm:", sim.request("GET", "/metrics")[2].decode())
        status, _, body = sim.request("POST", "/v1/chat/completions", chat(0))
        self.assertEqual((status, json.loads(body)["object"], json.loads(body)["code"]), (400, "error", 400))

    def test_tgi_errors_overload_and_metrics(self):
        sim = self.sim("--engine", "tgi", "--max-concurrent", "1", "--hang-rate", "0")
        status, _, body = sim.request("POST", "/v1/chat/completions", chat(0))
        self.assertEqual(status, 422)
        self.assertEqual(json.loads(body)["error_type"], "validation")
        # a streamed validation error: a 200 whose one event is the error
        _, _, status, events = sim.stream(chat(0, stream=True))
        self.assertEqual(status, 200)
        self.assertEqual(events[0]["error_type"], "validation")
        # TGI does not read the model name
        self.assertEqual(sim.request("POST", "/v1/chat/completions", chat(1, model="tgi"))[0], 200)
        held = sim.raw(chat(100000))  # holds the one place
        self.assertEqual(sim.wait_metric("tgi_batch_current_size", 1), 1)
        status, _, body = sim.request("POST", "/v1/chat/completions", chat(1))
        self.assertEqual((status, json.loads(body)), (429, {"error": "Model is overloaded", "error_type": "overloaded"}))
        held.close()
        self.assertEqual(sim.wait_metric("tgi_batch_current_size", 0), 0)
        self.assertEqual(sim.request("POST", "/v1/chat/completions", chat(1))[0], 200)
        self.assertIn("tgi_queue_size", sim.metrics())
        fail = self.sim("--engine", "tgi", "--error-rate", "1")
        status, _, body = fail.request("POST", "/v1/chat/completions", chat(1))
        self.assertEqual((status, json.loads(body)["error_type"]), (424, "generation"))

    def test_tgi_refuses_connections_while_loading(self):
        sim = self.sim("--engine", "tgi", "--not-ready-for", "2s")
        with self.assertRaises(ConnectionRefusedError):
            socket.create_connection((sim.host, sim.port), timeout=1)


class TestCli(unittest.TestCase):
    def test_help_lists_every_flag(self):
        out = subprocess.run([ATC, "sim", "--help"], capture_output=True, text=True)
        self.assertEqual(out.returncode, 0)
        for flag in ["--listen", "--model", "--max-seqs", "--prefill-tps", "--decode-ms", "--kv-blocks",
                     "--error-rate", "--hang-rate", "--not-ready-for", "--die-after", "--seed", "--ready-file",
                     "--engine", "--api-key", "--max-concurrent"]:
            self.assertIn(flag, out.stdout)

    def test_bad_flag(self):
        out = subprocess.run([ATC, "sim", "--max-seqs", "zero"], capture_output=True, text=True)
        self.assertEqual(out.returncode, 2)
        self.assertIn("--max-seqs", out.stderr)

    def test_sigint_exits_zero(self):
        sim = Sim()
        sim.signal(signal.SIGINT)
        self.assertEqual(sim.proc.wait(5), 0)
        sim.stop()


if __name__ == "__main__":
    unittest.main(verbosity=2)
