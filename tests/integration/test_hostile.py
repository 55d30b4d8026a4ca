"""Hostile HTTP clients against atc serve: each gets a defined answer (a status, or the connection closed
by a timeout), frees what it held (no request active, no endpoint slot taken), and leaves other clients
unaffected. Raw sockets from Python's standard library; deadlines, not sleeps, decide every wait."""

import errno
import json
import os
import resource
import select
import socket
import threading
import time
import unittest
from unittest import mock

import harness
from harness import AtcTestCase, chat, request, stream_events, wait_for

CLIENT_TIMEOUT = 1.0  # seconds: client_timeout in the config below

CONFIG = """
listen: 127.0.0.1:0
admin: 127.0.0.1:0
max_body: 64KiB
client_timeout: 1s
access_log: access.log
models:
  - name: llama-3-8b
simulate:
  - model: llama-3-8b
    count: 1
    max_seqs: 16
    decode_ms: {decode_ms}
    prefill_tps: 1000000
"""

CHAT_PATH = "/v1/chat/completions"


def chat_body(**extra):
    body = {"model": "llama-3-8b", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    body.update(extra)
    return json.dumps(body).encode()


def post(body, path=CHAT_PATH, headers=b"", length=None):
    """Raw bytes of a POST; length overrides the Content-Length header."""
    n = len(body) if length is None else length
    return (f"POST {path} HTTP/1.1\r\nHost: atc\r\nContent-Type: application/json\r\nConnection: close\r\n"
            f"Content-Length: {n}\r\n").encode() + headers + b"\r\n" + body


class Raw:
    """One client connection that sends what it is told and reads what comes back."""

    def __init__(self, port, rcvbuf=None):
        self.sock = socket.socket()
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.connect(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self, data):
        self.sock.sendall(data)

    def read_until_closed(self, timeout):
        """Everything until the server closes; fails if it is still open after timeout seconds."""
        deadline = time.monotonic() + timeout
        data = b""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"connection still open after {timeout}s; got {data[:200]!r}")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                continue
            except ConnectionResetError:
                return data
            if not chunk:
                return data
            data += chunk

    def close(self):
        self.sock.close()


def exchange(port, data, half_close=False, timeout=5.0):
    """Sends data on a fresh connection and returns all the server answered until it closed. atc takes a
    client that half-closes its side (shutdown) as gone: its request is cancelled and gets no answer."""
    c = Raw(port)
    try:
        c.send(data)
        if half_close:
            c.sock.shutdown(socket.SHUT_WR)
        return c.read_until_closed(timeout)
    finally:
        c.close()


def status_of(response):
    if not response:
        return None
    line = response.split(b"\r\n", 1)[0].split(b" ")
    assert line[0].startswith(b"HTTP/1."), response[:200]
    return int(line[1])


def split_response(response):
    head, _, body = response.partition(b"\r\n\r\n")
    headers = {}
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        headers[k.strip().lower().decode()] = v.strip().decode()
    return status_of(response), headers, body


def openai_error(body):
    """The error object of an OpenAI-style error body, which must be valid UTF-8 JSON."""
    doc = json.loads(body.decode("utf-8"))
    err = doc["error"]
    for key in ("message", "type", "code"):
        assert key in err, doc
    return err


class HostileTestCase(AtcTestCase):
    decode_ms = 2

    def setUp(self):
        super().setUp()
        self.atc = self.start_atc(self.config())

    def config(self):
        return CONFIG.format(decode_ms=self.decode_ms)

    def admin(self):
        status, _, body = request("127.0.0.1", self.atc.admin_port, "GET", "/admin/endpoints")
        self.assertEqual(status, 200)
        return json.loads(body)

    def assert_released(self):
        """Nothing of the hostile client is left: no request in flight anywhere."""
        def idle():
            doc = self.admin()
            return doc["active"] == 0 and all(ep["inflight"] == 0 for ep in doc["endpoints"])
        wait_for(idle, timeout=5, what="inflight back to 0")

    def assert_normal_request_works(self):
        status, headers, body = chat(self.atc.port, max_tokens=2)
        self.assertEqual(status, 200, body)
        self.assertEqual(json.loads(body)["object"], "chat.completion")

    def in_parallel(self, fn):
        """Runs fn in a thread; returns a join() that re-raises its failure."""
        box = {}

        def run():
            try:
                box["result"] = fn()
            except BaseException as e:  # noqa: B036 - handed to the test thread
                box["error"] = e
        t = threading.Thread(target=run)
        t.start()

        def join():
            t.join(30)
            self.assertFalse(t.is_alive(), "parallel client hung")
            if "error" in box:
                raise box["error"]
            return box.get("result")
        return join


class MalformedTest(HostileTestCase):
    def test_malformed_request_lines_get_400(self):
        cases = {
            "garbage": b"GARBAGE\r\n\r\n",
            "no target": b"GET\r\n\r\n",
            "unknown version": b"GET /health HTTP/9.9\r\n\r\n",
            "extra words": b"GET /health HTTP/1.1 extra\r\n\r\n",
            "binary": b"\x00\x01\x02\xff\r\n\r\n",
            "bad target": b"GET http://[::1 HTTP/1.1\r\nHost: atc\r\n\r\n",
        }
        for name, data in cases.items():
            with self.subTest(name):
                self.assertEqual(status_of(exchange(self.atc.port, data)), 400)
        self.assert_released()
        self.assert_normal_request_works()

    def test_unsupported_method_gets_501_or_405(self):
        # A method atc does not serve at all (known to HTTP or not) is refused by evhttp: 501.
        for method in (b"DELETE", b"BREW"):
            self.assertEqual(status_of(exchange(self.atc.port, method + b" /v1/models HTTP/1.1\r\nHost: atc\r\n\r\n")), 501)
        # GET on an inference route reaches atc: OpenAI-style 405
        status, _, body = request("127.0.0.1", self.atc.port, "GET", CHAT_PATH)
        self.assertEqual(status, 405)
        self.assertEqual(openai_error(body)["code"], "method_not_allowed")

    def test_malformed_headers_get_400(self):
        body = chat_body()
        cases = {
            "no colon": post(body, headers=b"NoColonHere\r\n"),
            "length not a number": post(body, length="abc"),
            "negative length": post(body, length="-5"),
        }
        for name, data in cases.items():
            with self.subTest(name):
                self.assertEqual(status_of(exchange(self.atc.port, data)), 400)
        # broken chunked framing: 400 (a chunk size over max_body is a 413, FloodTest)
        data = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: atc\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"zz\r\n" + body + b"\r\n0\r\n\r\n")
        self.assertEqual(status_of(exchange(self.atc.port, data)), 400)
        # HTTP/1.1 without Host (RFC 9112 3.2), on both ports
        for port in (self.atc.port, self.atc.admin_port):
            answer = exchange(port, b"GET /health HTTP/1.1\r\n\r\n")
            self.assertEqual(status_of(answer), 400)
            self.assertIn(b'"code":"missing_host"', answer)
            answer = exchange(port, b"GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n")
            self.assertEqual(status_of(answer), 400)
            self.assertIn(b'"code":"two_hosts"', answer)
        self.assert_released()
        self.assert_normal_request_works()

    def test_two_content_lengths_that_differ_get_400(self):
        body = chat_body()
        data = post(body, headers=f"Content-Length: {len(body) + 1}\r\n".encode())
        answer = exchange(self.atc.port, data)
        self.assertEqual(status_of(answer), 400)
        self.assertIn(b"conflicting_content_length", answer)
        same = post(body, headers=f"Content-Length: {len(body)}\r\n".encode())  # repeated, but agreeing
        self.assertEqual(status_of(exchange(self.atc.port, same)), 200)
        self.assert_normal_request_works()

    def test_oversized_headers_get_400_and_the_connection_closes(self):
        big = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"a" * 1000) for i in range(100))  # 100 KiB > 64 KiB
        self.assertEqual(status_of(exchange(self.atc.port, post(chat_body(), headers=big))), 400)
        long_line = b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: atc\r\n\r\n"
        self.assertEqual(status_of(exchange(self.atc.port, long_line)), 400)
        self.assert_released()
        self.assert_normal_request_works()


def chunked_post(body, ext=b"", trailer=b"", close=True):
    """A chunked chat POST: the body in two chunks, each size line followed by @ext, then @trailer lines."""
    half = len(body) // 2
    chunks = b"".join(b"%x%s\r\n%s\r\n" % (len(part), ext, part) for part in (body[:half], body[half:]))
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: atc\r\nContent-Type: application/json\r\n" +
            (b"Connection: close\r\n" if close else b"") + b"Transfer-Encoding: chunked\r\n\r\n" + chunks +
            b"0" + ext + b"\r\n" + trailer + b"\r\n")


class FramingTest(HostileTestCase):
    """Headers evhttp would take wrongly (obs-fold joined to the previous header, a NUL cutting a value
    short) are refused; valid chunked framing it would refuse (extensions, trailers) is accepted."""

    def assert_refused(self, answer, code):
        status, headers, body = split_response(answer)
        self.assertEqual(status, 400, answer[:300])
        self.assertEqual(headers.get("connection", "").lower(), "close")
        self.assertEqual(headers["content-type"], "application/json")
        err = openai_error(body)
        self.assertEqual((err["type"], err["code"]), ("invalid_request_error", code))

    def test_obs_fold_and_nul_in_headers_get_400_in_the_openai_shape(self):
        body = chat_body()
        cases = {
            "obs-fold with a space": (post(body, headers=b"X-Note: a\r\n  folded\r\n"), "obs_fold"),
            "obs-fold with a tab": (post(body, headers=b"X-Note: a\r\n\tfolded\r\n"), "obs_fold"),
            "folded Content-Length": (post(body, headers=b"X-A: 1\r\n Content-Length: 0\r\n"), "obs_fold"),
            "NUL in a value": (post(body, headers=b"X-Note: a\x00b\r\n"), "nul_in_header"),
            "NUL in a name": (post(body, headers=b"X-N\x00ote: a\r\n"), "nul_in_header"),
        }
        for name, (data, code) in cases.items():
            with self.subTest(name):
                self.assert_refused(exchange(self.atc.port, data), code)
        # Sent a byte at a time, and with a second request behind it: one answer, the refusal, then close.
        c = Raw(self.atc.port)
        try:
            try:
                for b in post(body, headers=b"X-Note: a\r\n b\r\n") + post(body):
                    c.send(bytes([b]))
            except (BrokenPipeError, ConnectionResetError):
                pass  # atc answered and closed while the rest was still being sent
            answer = c.read_until_closed(5)
        finally:
            c.close()
        self.assert_refused(answer, "obs_fold")
        self.assertEqual(answer.count(b"HTTP/1.1 "), 1)
        # The admin port vets the same way.
        self.assert_refused(exchange(self.atc.admin_port, b"GET /health HTTP/1.1\r\nHost: x\r\n"
                                                          b"X-A: 1\r\n\tb\r\n\r\n"), "obs_fold")
        def logged():  # each refusal has its access log line (the log is written in batches)
            with open(os.path.join(self.tmp.name, "access.log")) as f:
                text = f.read()
            return text.count("obs-fold") >= 4 and text.count("NUL byte") >= 2
        wait_for(logged, timeout=5, what="the refusals in the access log")
        self.assert_released()
        self.assert_normal_request_works()

    def test_chunk_extensions_and_trailers_are_accepted(self):
        body = chat_body()
        cases = {
            "plain": chunked_post(body),
            "extension": chunked_post(body, ext=b";name=value"),
            "quoted extension with spaces": chunked_post(body, ext=b' ; n="a b;c"'),
            "trailers": chunked_post(body, trailer=b"X-Checksum: 1234\r\nX-More: 2\r\n"),
            "both": chunked_post(body, ext=b";x", trailer=b"X-Checksum: 1234\r\n"),
            "a Content-Length padded long": post(body, length=" " * 300 + str(len(body))),
        }
        for name, data in cases.items():
            with self.subTest(name):
                status, _, answer = split_response(exchange(self.atc.port, data))
                self.assertEqual(status, 200, answer[:300])
                self.assertEqual(json.loads(answer)["object"], "chat.completion")
        # Two on one keep-alive connection, a byte at a time: each answered (the framing is followed).
        c = Raw(self.atc.port)
        try:
            for b in chunked_post(body, ext=b";a=b", trailer=b"X-T: 1\r\n", close=False) + chunked_post(body):
                c.send(bytes([b]))
            answer = c.read_until_closed(10)
        finally:
            c.close()
        self.assertEqual(answer.count(b"HTTP/1.1 200 OK"), 2, answer[:500])
        self.assert_released()
        self.assert_normal_request_works()


CHUNKED_HEAD = b"POST %s HTTP/1.1\r\nHost: atc\r\nTransfer-Encoding: chunked\r\n%s\r\n"

# What a client may send without end in chunked framing or before a request line: (bytes that start it,
# a piece repeated after them). Each was buffered 1:1 until client_timeout.
FLOODS = {
    "chunk extension": (b"1;", b"a" * 65536),
    "trailer line": (b"1\r\nx\r\n0\r\nX-T: ", b"v" * 65536),
    "many trailer lines": (b"1\r\nx\r\n0\r\n", b"X-T: 1\r\n" * 8192),
    "leading zeros": (b"", b"0" * 65536),
    "whitespace after the size": (b"1", b" " * 65536),
}


def flood(port, head, prefix, piece, total=4 << 20):
    """Sends head + prefix, then piece until total bytes went or atc stopped taking them; then half-closes
    and returns (what atc answered, seconds from the first byte to its answer's first byte)."""
    c = Raw(port)
    try:
        start = time.monotonic()
        sent = 0
        try:
            c.send(head + prefix)
            while sent < total:
                c.send(piece)
                sent += len(piece)
                if select.select([c.sock], [], [], 0)[0]:
                    break  # an answer came: atc is done with this connection
            c.sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass
        c.sock.settimeout(5)
        first = c.sock.recv(65536)
        elapsed = time.monotonic() - start
        return first + c.read_until_closed(5), elapsed
    finally:
        c.close()


class FloodTest(HostileTestCase):
    """Framing a client can send without end is refused as soon as it passes its bound, on the front
    port and on the admin port before any token is checked, instead of being buffered until
    client_timeout (tests/soak/hostile_soak.py measures the memory while 200 MiB go in)."""

    def config(self):
        return super().config() + "admin_token: s3cret\n"

    def assert_answered(self, answer, elapsed, status, code):
        self.assertEqual(status_of(answer), status, answer[:300])
        self.assertIn(b'"code":"%s"' % code.encode(), answer)
        self.assertLess(elapsed, CLIENT_TIMEOUT)  # an answer, not the timeout

    def test_endless_chunk_framing_is_refused_at_once(self):
        for port, path in ((self.atc.port, b"/v1/chat/completions"), (self.atc.admin_port, b"/admin/endpoints")):
            for name, (prefix, piece) in FLOODS.items():
                with self.subTest(name, port=port):
                    answer, elapsed = flood(port, CHUNKED_HEAD % (path, b""), prefix, piece)
                    self.assert_answered(answer, elapsed, 400, "bad_chunked_framing")
        self.assert_normal_request_works()

    def test_empty_lines_before_a_request_are_bounded(self):
        for port in (self.atc.port, self.atc.admin_port):
            with self.subTest(port=port):
                answer, elapsed = flood(port, b"", b"", b"\r\n" * 32768)
                self.assert_answered(answer, elapsed, 400, "too_many_empty_lines")
        # a few are skipped, as RFC 9112 2.2 asks
        answer = exchange(self.atc.port, b"\r\n\r\nGET /health HTTP/1.1\r\nHost: atc\r\nConnection: close\r\n\r\n")
        self.assertEqual(status_of(answer), 200, answer[:300])
        self.assert_normal_request_works()

    def test_a_chunk_size_over_max_body_is_refused_at_once(self):
        for port in (self.atc.port, self.atc.admin_port):
            for size in (b"ffffffffffffffff", b"%x" % (1 << 30)):
                with self.subTest(size=size, port=port):
                    answer, elapsed = flood(port, CHUNKED_HEAD % (b"/v1/chat/completions", b""), size + b"\r\n",
                                            b"", total=0)
                    self.assert_answered(answer, elapsed, 413, "request_too_large")

    def test_a_bare_cr_in_a_trailer_is_refused(self):
        body = chat_body()
        data = (CHUNKED_HEAD % (b"/v1/chat/completions", b"Connection: close\r\n") +
                b"%x\r\n%s\r\n0\r\nX-T: a\rb\r\n\r\n" % (len(body), body))
        answer = exchange(self.atc.port, data)
        self.assertEqual(status_of(answer), 400, answer[:300])
        self.assertIn(b'"code":"bad_chunked_framing"', answer)
        self.assert_normal_request_works()


def cpu_seconds(pid):
    """User plus system CPU time of process pid so far, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class DescriptorsTest(AtcTestCase):
    """With 128 descriptors and 300 clients that connect and send nothing, atc neither spins on accept nor
    floods its log: it holds max_connections of them (derived from RLIMIT_NOFILE), the rest wait in the
    backlog, and once they go a normal request is served."""

    def test_300_idle_connections_with_128_descriptors(self):
        self.idle_flood("", "max_connections")

    def test_accept_backs_off_when_descriptors_run_out(self):
        # a cap over what the descriptors allow: accept fails with EMFILE, and is retried on a timer
        self.idle_flood("max_connections: 1000\n", "not accepting for a while")

    def idle_flood(self, extra_config, logged):
        def limit():
            resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))
        env = dict(os.environ)
        if "TSAN_OPTIONS" in env:
            # Out of descriptors, ThreadSanitizer cannot open the binaries to symbolize a report, so
            # tests/tsan.supp's rule for libevent's deferred EPOLL_CTL_DEL on a reused fd (race:epoll_ctl)
            # cannot match it by name: this one process runs without race reports (stage 1 and ASan check it).
            env["TSAN_OPTIONS"] += ":report_bugs=0"
        popen = harness.subprocess.Popen
        with mock.patch.object(harness.subprocess, "Popen",
                               lambda *a, **kw: popen(*a, preexec_fn=limit, env=env, **kw)):
            atc = self.start_atc(CONFIG.format(decode_ms=2).replace("client_timeout: 1s", "client_timeout: 30s") +
                                 "workers: 2\n" + extra_config)
        socks = []
        try:
            for _ in range(300):
                s = socket.socket()
                s.setblocking(False)
                self.assertIn(s.connect_ex(("127.0.0.1", atc.port)), (0, errno.EINPROGRESS))
                socks.append(s)
            cpu0, t0 = cpu_seconds(atc.proc.pid), time.monotonic()
            # Over 4 s none of them is answered or dropped (client_timeout is 30 s) ...
            readable, _, _ = select.select(socks, [], [], 4.0)
            elapsed = time.monotonic() - t0
            self.assertEqual(readable, [])
            # ... and atc used under 30% of a core meanwhile, and wrote under 1 MB of log.
            cpu = cpu_seconds(atc.proc.pid) - cpu0
            self.assertLess(cpu, 0.3 * elapsed, f"{cpu:.2f} s of CPU in {elapsed:.2f} s")
            self.assertLess(os.path.getsize(atc.log_path), 1 << 20)
            self.assertIn(logged, atc.read_log())
        finally:
            for s in socks:
                s.close()
        status, _, body = chat(atc.port, max_tokens=2)
        self.assertEqual(status, 200, body)
        self.assertLess(os.path.getsize(atc.log_path), 1 << 20)


class BodyTest(HostileTestCase):
    def test_body_over_max_body_gets_openai_413(self):
        body = chat_body(pad="x" * 100_000)  # over 64 KiB, under 4x
        status, headers, reply = split_response(exchange(self.atc.port, post(body)))
        self.assertEqual(status, 413)
        self.assertEqual(openai_error(reply)["code"], "request_too_large")
        self.assert_released()

    def test_body_far_over_max_body_is_refused_before_it_is_read(self):
        # Content-Length of 10 MiB (over 4x max_body): refused on the headers alone, nothing is read.
        c = Raw(self.atc.port)
        try:
            c.send(post(b"", length=10 << 20))
            start = time.monotonic()
            reply = c.read_until_closed(5)
            self.assertEqual(status_of(reply), 413)
            self.assertLess(time.monotonic() - start, CLIENT_TIMEOUT)  # not a timeout: an answer
        finally:
            c.close()
        # A chunked upload that grows past the limit is cut the same way.
        chunk = b"%x\r\n%s\r\n" % (64 * 1024, b"y" * 64 * 1024)
        data = b"POST /v1/chat/completions HTTP/1.1\r\nHost: atc\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk * 8
        c = Raw(self.atc.port)
        try:
            try:
                c.send(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # atc stopped reading and closed: what it answered is still there to read
            self.assertEqual(status_of(c.read_until_closed(5)), 413)
        finally:
            c.close()
        self.assert_released()
        self.assert_normal_request_works()

    def test_truncated_body_then_hang_up_gets_no_answer(self):
        body = chat_body()
        reply = exchange(self.atc.port, post(body[:10], length=len(body)), half_close=True)
        self.assertEqual(reply, b"")
        self.assert_released()

    def test_truncated_body_then_silence_is_timed_out(self):
        body = chat_body()
        c = Raw(self.atc.port)
        try:
            start = time.monotonic()
            c.send(post(body[:10], length=len(body)))
            join = self.in_parallel(self.assert_normal_request_works)  # while this one waits
            reply = c.read_until_closed(CLIENT_TIMEOUT * 5)
            elapsed = time.monotonic() - start
            join()
        finally:
            c.close()
        self.assertEqual(reply, b"")
        self.assertGreater(elapsed, CLIENT_TIMEOUT * 0.8)
        self.assertLess(elapsed, CLIENT_TIMEOUT * 3)
        self.assert_released()

    def test_invalid_utf8_gets_a_defined_answer_in_valid_json(self):
        # In the model name atc routes on: 404, and the message quoting it is still valid UTF-8 JSON.
        body = b'{"model": "llama\xff\xfe", "messages": [{"role": "user", "content": "hi"}]}'
        status, _, reply = split_response(exchange(self.atc.port, post(body)))
        self.assertEqual(status, 404)
        err = openai_error(reply)
        self.assertEqual(err["code"], "model_not_found")
        self.assertIn("llama\ufffd\ufffd", err["message"])
        # In the prompt, which atc does not read: passed on as sent, and the server answers.
        body = b'{"model": "llama-3-8b", "max_tokens": 2, "messages": [{"role": "user", "content": "\xc3\x28\xff"}]}'
        status, _, reply = split_response(exchange(self.atc.port, post(body, headers=b"x-atc-tenant: t\xff\r\n")))
        self.assertEqual(status, 200, reply[:300])
        self.assert_released()
        # The access log quotes the model and the tenant: its lines stay valid UTF-8 JSON.
        path = os.path.join(self.tmp.name, "access.log")

        def lines():
            if not os.path.exists(path):
                return None
            with open(path, "rb") as f:
                got = [line for line in f.read().split(b"\n") if line]
            return got if len(got) >= 2 else None
        records = [json.loads(line.decode("utf-8")) for line in wait_for(lines, what="two access log lines")]
        self.assertIn("llama\ufffd\ufffd", [r.get("model") for r in records])
        self.assertIn("t\ufffd", [r.get("tenant") for r in records])

    def test_deeply_nested_json_gets_400_quickly(self):
        for depth in (65, 100_000):
            with self.subTest(depth=depth):
                body = b'{"model": "llama-3-8b", "messages": ' + b"[" * depth + b"]" * depth + b"}"
                start = time.monotonic()
                status, _, reply = split_response(exchange(self.atc.port, post(body)))
                self.assertLess(time.monotonic() - start, 1.0 * harness.SLACK)
                if len(body) > 64 * 1024:
                    self.assertEqual(status, 413)
                else:
                    self.assertEqual(status, 400)
                    self.assertEqual(openai_error(reply)["message"], "JSON nested too deeply")
        # at the limit it is valid (64 levels: the object and 63 arrays)
        body = b'{"model": "llama-3-8b", "max_tokens": 1, "messages": [' + b"[" * 62 + b"]" * 62 + b"]}"
        status, _, reply = split_response(exchange(self.atc.port, post(body)))
        self.assertEqual(status, 200, reply[:300])
        self.assert_released()


class SlowClientTest(HostileTestCase):
    def drip(self, prefix, drip, interval=0.2, limit=CLIENT_TIMEOUT * 4):
        """Sends prefix, then one byte of drip per interval (the pace is the behaviour under test) until
        atc closes the connection; returns (seconds until closed, everything atc sent)."""
        c = Raw(self.atc.port)
        reply, closed = b"", False
        try:
            start = time.monotonic()
            c.send(prefix)
            for i in range(len(drip)):
                try:
                    c.send(drip[i:i + 1])
                except (BrokenPipeError, ConnectionResetError):
                    break
                tick = time.monotonic() + interval
                while not closed and time.monotonic() < tick:
                    readable, _, _ = select.select([c.sock], [], [], max(0, tick - time.monotonic()))
                    if readable:
                        try:
                            data = c.sock.recv(65536)
                        except ConnectionResetError:
                            data = b""
                        closed = data == b""
                        reply += data
                if closed:
                    break
                if time.monotonic() - start > limit:
                    raise AssertionError(f"still reading a byte every {interval}s after {limit}s")
            if not closed:
                reply += c.read_until_closed(CLIENT_TIMEOUT * 3)
            return time.monotonic() - start, reply
        finally:
            c.close()

    def assert_timed_out(self, elapsed, reply):
        self.assertIn(reply, (b"",), reply[:200])  # closed without an answer
        # every byte arrives well within client_timeout, so only a deadline on the whole request ends it
        self.assertGreater(elapsed, CLIENT_TIMEOUT * 0.8)
        self.assertLess(elapsed, CLIENT_TIMEOUT * 2.5)

    def test_slowloris_headers_are_cut_at_client_timeout(self):
        join = self.in_parallel(self.assert_normal_request_works)
        head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: atc\r\n" + b"X-Slow: " + b"a" * 100
        elapsed, reply = self.drip(b"", head)
        self.assert_timed_out(elapsed, reply)
        join()
        self.assert_released()

    def test_slowloris_body_is_cut_at_client_timeout(self):
        body = chat_body(pad="z" * 200)
        elapsed, reply = self.drip(post(b"", length=len(body)), body)
        self.assert_timed_out(elapsed, reply)
        self.assert_released()
        self.assert_normal_request_works()

    def test_slowloris_on_a_keep_alive_connection(self):
        # One quick request, then the next one dripped on the same connection.
        first = b"GET /health HTTP/1.1\r\nHost: atc\r\n\r\n"
        elapsed, reply = self.drip(first, b"GET /v1/models HTTP/1.1\r\nHost: atc\r\nX-Slow: " + b"b" * 100)
        self.assertEqual(status_of(reply), 200)  # the first request's answer, then nothing more
        self.assertEqual(reply.count(b"HTTP/1.1 "), 1)
        self.assertGreater(elapsed, CLIENT_TIMEOUT * 0.8)
        self.assertLess(elapsed, CLIENT_TIMEOUT * 2.5)

    def test_idle_connection_is_closed_at_client_timeout(self):
        c = Raw(self.atc.port)
        try:
            start = time.monotonic()
            self.assertEqual(c.read_until_closed(CLIENT_TIMEOUT * 4), b"")
            self.assertGreater(time.monotonic() - start, CLIENT_TIMEOUT * 0.8)
        finally:
            c.close()


class SlowStreamTest(HostileTestCase):
    decode_ms = 100  # 15 tokens take 1.5 s: longer than client_timeout

    def test_a_slow_but_steady_stream_outlives_client_timeout(self):
        body = {"model": "llama-3-8b", "stream": True, "max_tokens": 15,
                "messages": [{"role": "user", "content": "hi"}]}
        start = time.monotonic()
        status, _, events = stream_events(self.atc.port, body)
        self.assertEqual(status, 200)
        self.assertEqual(events[-1][1], "[DONE]")
        self.assertGreater(time.monotonic() - start, CLIENT_TIMEOUT)


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


class NeverReadsTest(HostileTestCase):
    def config(self):
        # The server is its own process, so that atc's memory is atc's alone; it produces far faster
        # than the client reads (never).
        # One worker: the open-file count below must not see a second worker open its own keep-alive
        # connection to the server.
        sim = self.start_sim(extra=("--decode-ms", "0.01", "--prefill-tps", "1000000"))
        return f"""
            listen: 127.0.0.1:0
            admin: 127.0.0.1:0
            workers: 1
            client_timeout: 1s
            models:
              - name: llama-3-8b
                endpoints:
                  - id: sim
                    url: {sim.url}
            """

    def test_a_client_that_never_reads_its_stream_is_timed_out_and_memory_stays_bounded(self):
        self.assert_normal_request_works()  # warm up
        before = rss_kib(self.atc.proc.pid)
        fds = len(os.listdir(f"/proc/{self.atc.proc.pid}/fd"))
        body = chat_body(stream=True, max_tokens=2_000_000)
        c = Raw(self.atc.port, rcvbuf=4096)
        try:
            c.send(post(body))
            join = self.in_parallel(self.assert_normal_request_works)
            peak = [before]

            def released():
                peak[0] = max(peak[0], rss_kib(self.atc.proc.pid))
                return self.admin()["active"] == 0
            # The server would send ~300 MB; atc must stop reading it once the client's socket is full,
            # then give up on the client after client_timeout without progress.
            wait_for(released, timeout=CLIENT_TIMEOUT * 10, interval=0.05, what="the stalled request ended")
            # and the client's connection itself is closed (its socket is full: no FIN reaches it, so
            # look at atc's open files) once nothing was written for client_timeout
            wait_for(lambda: len(os.listdir(f"/proc/{self.atc.proc.pid}/fd")) <= fds, timeout=CLIENT_TIMEOUT * 5,
                     interval=0.05, what="atc closing the stalled connection")
            join()
        finally:
            c.close()
        if os.environ.get("ATC_TEST_LOGS"):
            print(f"never-reading client: atc grew by {peak[0] - before} KiB")
        # (an ASan build keeps freed memory in quarantine, so its RSS says less: the release build is the check)
        bound = 64 * 1024 if "ASAN_OPTIONS" in os.environ else 16 * 1024
        self.assertLess(peak[0] - before, bound, f"atc grew by {peak[0] - before} KiB for one stalled client")
        self.assert_released()
        self.assert_normal_request_works()


if __name__ == "__main__":
    unittest.main(verbosity=2)
