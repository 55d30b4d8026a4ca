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

ATC = os.environ.get("ATC_BIN", os.path.join(os.path.dirname(__file__), "..", "..", "build", "atc"))
MODEL = "llama-3-8b"


class Sim:
    """One `atc sim` process; stopped with TERM, then KILL."""

    def __init__(self, *flags, deadline=10.0):
        self.dir = tempfile.TemporaryDirectory()
        ready = os.path.join(self.dir.name, "ready.json")
        self.proc = subprocess.Popen(
            [ATC, "sim", "--listen", "127.0.0.1:0", "--ready-file", ready, *flags],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        end = time.monotonic() + deadline
        while not os.path.exists(ready):
            if self.proc.poll() is not None:
                raise RuntimeError("atc sim exited: %s" % self.proc.stderr.read().decode())
            if time.monotonic() > end:
                self.stop()
                raise RuntimeError("atc sim not ready in time")
            time.sleep(0.01)
        with open(ready) as f:
            host, port = json.load(f)["listen"].rsplit(":", 1)
        self.host, self.port = host, int(port)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        err = self.proc.stderr.read()
        self.proc.stdout.close()
        self.proc.stderr.close()
        self.dir.cleanup()
        if b"Sanitizer" in err:  # a sanitizer build reports leaks and memory errors at exit
            raise AssertionError(err.decode(errors="replace"))
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
            if line.startswith("vllm:"):
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

    def raw(self, body, path="/v1/chat/completions"):
        """Sends a request on a bare socket, for clients that leave early."""
        s = socket.create_connection((self.host, self.port), timeout=10)
        b = json.dumps(body).encode()
        s.sendall(b"POST %s HTTP/1.1\r\nHost: sim\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                  % (path.encode(), len(b)) + b)
        return s


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
            yield time.monotonic(), json.loads(data)


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
        content = [e["choices"][0]["delta"].get("content") for e in chunks]
        self.assertEqual(len([t for t in content if t]), 10)
        self.assertEqual(chunks[-1]["choices"][0]["finish_reason"], "length")
        self.assertEqual(chunks[-1]["usage"]["completion_tokens"], 10)
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
        self.assertEqual([e["object"] for e in events[:-1]], ["text_completion"] * 3)
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

    def test_metrics_names(self):
        status, headers, body = self.sim.request("GET", "/metrics")
        text = body.decode()
        for name, kind in [("vllm:num_requests_running", "gauge"), ("vllm:num_requests_waiting", "gauge"),
                           ("vllm:kv_cache_usage_perc", "gauge"), ("vllm:prefix_cache_queries_total", "counter"),
                           ("vllm:prefix_cache_hits_total", "counter")]:
            self.assertIn("# TYPE %s %s\n" % (name, kind), text)
            self.assertIn('%s{model_name="%s"} ' % (name, MODEL), text)

    def test_prefix_cache_hits_on_repeat(self):
        long = chat(1)
        long["messages"][0]["content"] = "a shared system prompt. " * 200
        before = self.sim.metrics()["vllm:prefix_cache_hits_total"]
        self.sim.request("POST", "/v1/chat/completions", long)
        self.sim.request("POST", "/v1/chat/completions", long)
        self.assertGreater(self.sim.metrics()["vllm:prefix_cache_hits_total"] - before, 1000)

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

    def test_not_ready_for(self):
        sim = Sim("--not-ready-for", "1s")
        try:
            t0 = time.monotonic()
            self.assertEqual(sim.request("GET", "/health")[0], 503)
            self.assertEqual(json.loads(sim.request("GET", "/v1/models")[2])["data"], [])
            self.assertEqual(sim.request("POST", "/v1/chat/completions", chat(1))[0], 503)
            while sim.request("GET", "/health")[0] != 200:
                self.assertLess(time.monotonic() - t0, 5)
                time.sleep(0.05)
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


class TestCli(unittest.TestCase):
    def test_help_lists_every_flag(self):
        out = subprocess.run([ATC, "sim", "--help"], capture_output=True, text=True)
        self.assertEqual(out.returncode, 0)
        for flag in ["--listen", "--model", "--max-seqs", "--prefill-tps", "--decode-ms", "--kv-blocks",
                     "--error-rate", "--hang-rate", "--not-ready-for", "--die-after", "--seed", "--ready-file"]:
            self.assertIn(flag, out.stdout)

    def test_bad_flag(self):
        out = subprocess.run([ATC, "sim", "--max-seqs", "zero"], capture_output=True, text=True)
        self.assertEqual(out.returncode, 2)
        self.assertIn("--max-seqs", out.stderr)

    def test_sigint_exits_zero(self):
        sim = Sim()
        sim.proc.send_signal(signal.SIGINT)
        self.assertEqual(sim.proc.wait(5), 0)
        sim.stop()


if __name__ == "__main__":
    unittest.main(verbosity=2)
