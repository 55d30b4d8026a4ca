"""Integration test harness: real atc processes on loopback, Python standard library only.

Every server is started on port 0 and found through its --ready-file, waited for with a deadline (never a
sleep), and stopped with SIGTERM then SIGKILL. Logs go to a temporary directory printed on failure.
"""

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import unittest

ATC_BIN = os.environ.get("ATC_BIN", os.path.join(os.path.dirname(__file__), "..", "..", "build", "atc"))
SOURCE_DIR = os.environ.get("ATC_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
# Upper bounds on elapsed time are multiplied by this (lower bounds never are): sanitizer builds run
# several times slower; tests/CMakeLists.txt sets ATC_TEST_SLACK to 2 for ASan, 3 for ThreadSanitizer.
SLACK = float(os.environ.get("ATC_TEST_SLACK", "1"))


def wait_for(predicate, timeout=10.0, interval=0.01, what="condition"):
    """Polls predicate until it returns a truthy value, or fails after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def signal_until(proc, sig, received, what, timeout=10.0, every=2.0):
    """Sends @p sig to @p proc, and again every @p every seconds until @p received() is true; fails after
    @p timeout. Once is enough but under ThreadSanitizer: GCC 12's runtime now and then loses a signal
    that lands while the thread runs between two of its intercepted calls (seen: 7 idle `atc sim`s of 200,
    on a loaded machine, never logged a SIGINT, parked in epoll_wait with nothing pending; a second SIGINT
    stopped each). @p received must turn true on the signal's receipt (its log line, the process gone),
    not on its whole effect, so that only a lost signal is sent again: a second SIGTERM would cut a drain
    short."""
    deadline = time.monotonic() + timeout
    while True:
        proc.send_signal(sig)
        try:
            return wait_for(received, timeout=min(every, max(0.0, deadline - time.monotonic())), what=what)
        except AssertionError:
            if time.monotonic() >= deadline:
                raise


class RawServer(threading.Thread):
    """A raw-socket server playing an inference server that HTTP libraries cannot imitate (headers sent
    before the first token, garbage, stalls): reads each request's head and its Content-Length body,
    then hands the connection to @p behaviour(conn, body) (the body parsed as JSON, {} when empty) and
    closes it. `requests` counts the POSTs to /v1/ (not the health checks)."""

    def __init__(self, behaviour):
        super().__init__(daemon=True)
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.behaviour = behaviour
        self.requests = 0
        self.start()

    def run(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    def serve(self, conn):
        try:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, body = data.split(b"\r\n\r\n", 1)
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            while len(body) < length:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                body += chunk
            if head.startswith(b"POST /v1/"):
                self.requests += 1
            try:
                parsed = json.loads(body) if body else {}
            except ValueError:
                parsed = {}
            self.behaviour(conn, parsed)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self):
        self.sock.close()


def wait_access_lines(path, n, timeout=10.0):
    """Waits until the JSON-lines access log at @p path holds at least @p n records; returns them all."""
    def lines():
        try:
            with open(path) as f:
                got = [json.loads(line) for line in f.read().splitlines()]
        except FileNotFoundError:
            return None
        return got if len(got) >= n else None

    return wait_for(lines, timeout=timeout, what=f"{n} access log lines")


def dead_port():
    """A loopback port with nothing listening (bound, then closed)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Process:
    """A child process that writes a ready file once it listens."""

    def __init__(self, args, workdir, name):
        self.workdir = workdir
        self.ready_path = os.path.join(workdir, f"{name}.ready")
        self.log_path = os.path.join(workdir, f"{name}.log")
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args + ["--ready-file", self.ready_path], stdout=self.log,
                                     stderr=subprocess.STDOUT, cwd=SOURCE_DIR)
        self.info = self._wait_ready()

    def _wait_ready(self):
        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"process exited with {self.proc.returncode}: {self.read_log()}")
            try:
                with open(self.ready_path) as f:
                    return json.load(f)
            except (FileNotFoundError, json.JSONDecodeError):
                return None
        return wait_for(ready, timeout=15, what=f"ready file {self.ready_path}")

    def read_log(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def signal(self, sig, says, timeout=10.0):
        """Sends sig until the log has one more line saying @p says (the process's receipt of it), or the
        process is gone: see signal_until."""
        before = self.read_log().count(says)
        signal_until(self.proc, sig, timeout=timeout, what=f"one more {says!r} in the log",
                     received=lambda: self.proc.poll() is not None or self.read_log().count(says) > before)

    def stop(self, timeout=10.0):
        """SIGTERM, then SIGKILL after timeout; returns the exit code."""
        if self.proc.poll() is None:
            end = time.monotonic() + timeout
            try:  # atc logs "signal 15: draining", atc sim "sim: signal 15, exiting"
                self.signal(signal.SIGTERM, f"signal {int(signal.SIGTERM)}", timeout=timeout)
                self.proc.wait(max(0.0, end - time.monotonic()))
            except (AssertionError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode

    def sanitizer_report(self):
        """The sanitizer's report in the log (an ASan/UBSan build writes one on error or leak, a TSan build
        on a data race, a lock-order inversion or a bad unlock), or None."""
        log = self.read_log()
        for marker in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
                       "WARNING: ThreadSanitizer", "ERROR: ThreadSanitizer", "FATAL: ThreadSanitizer"):
            if marker in log:
                return log[log.index(marker) - 200 if log.index(marker) > 200 else 0:][:4000]
        return None


class Atc(Process):
    def __init__(self, config_yaml, workdir, name="atc"):
        self.config_path = os.path.join(workdir, f"{name}.yaml")
        with open(self.config_path, "w") as f:
            f.write(textwrap.dedent(config_yaml))
        super().__init__([ATC_BIN, "serve", "-c", self.config_path], workdir, name)
        self.host, port = self.info["listen"].rsplit(":", 1)
        self.port = int(port)
        self.admin_port = int(self.info["admin"].rsplit(":", 1)[1])

    def endpoints(self):
        status, _, body = request("127.0.0.1", self.admin_port, "GET", "/admin/endpoints")
        assert status == 200, body
        return {ep["id"]: ep for ep in json.loads(body)["endpoints"]}


class Sim(Process):
    def __init__(self, workdir, name="sim", model="llama-3-8b", extra=()):
        super().__init__([ATC_BIN, "sim", "--listen", "127.0.0.1:0", "--model", model, *extra], workdir, name)
        self.port = int(self.info["listen"].rsplit(":", 1)[1])
        self.url = f"http://127.0.0.1:{self.port}"


def request(host, port, method, path, body=None, headers=None, timeout=30):
    """One HTTP request on a fresh connection; returns (status, headers as a lower-cased dict, body bytes)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    hdrs = {"content-type": "application/json"}
    hdrs.update(headers or {})
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    conn.request(method, path, body=body, headers=hdrs)
    resp = conn.getresponse()
    data = resp.read()
    result = (resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)
    conn.close()
    return result


def post_raw(port, body, timeout=None):
    """Sends a chat POST on a raw socket and returns the socket unread (to read slowly, or hang up)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    data = json.dumps(body).encode()
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
    return sock


def chat(port, model="llama-3-8b", content="hello", stream=False, max_tokens=8, headers=None, **extra):
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "stream": stream}
    body.update(extra)
    return request("127.0.0.1", port, "POST", "/v1/chat/completions", body, headers)


def open_stream(port, max_tokens=40, timeout=10, model="llama-3-8b"):
    """Starts a streaming chat request and returns (connection, response) with its headers read, the
    stream still open: for tests that act while a request is in flight."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", "/v1/chat/completions", json.dumps(
        {"model": model, "stream": True, "max_tokens": max_tokens, "messages": [{"role": "user", "content": "x"}]}),
        {"content-type": "application/json"})
    return conn, conn.getresponse()


def stream_events(port, body, headers=None, timeout=30):
    """POSTs a streaming chat request; returns (status, headers, [(arrival_seconds, event_data)])."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    hdrs = {"content-type": "application/json"}
    hdrs.update(headers or {})
    start = time.monotonic()
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers=hdrs)
    resp = conn.getresponse()
    events = []
    buf = b""
    while True:
        chunk = resp.read1(65536) if hasattr(resp, "read1") else resp.read(1)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                if line.startswith(b"data: "):
                    events.append((time.monotonic() - start, line[6:].decode()))
    headers_out = {k.lower(): v for k, v in resp.getheaders()}
    conn.close()
    return resp.status, headers_out, events


class AtcTestCase(unittest.TestCase):
    """Gives each test a temporary directory and stops what it started, printing logs on failure."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="atc-test-")
        self.processes = []

    def tearDown(self):
        result = getattr(self._outcome, "result", None)
        failed = result is not None and any(t is self for t, _ in result.failures + result.errors)
        for p in reversed(self.processes):
            p.stop()
        reports = [r for r in (p.sanitizer_report() for p in self.processes) if r]
        if failed or os.environ.get("ATC_TEST_LOGS"):
            for p in self.processes:
                print(f"--- {p.log_path}\n{p.read_log()[-4000:]}")
        self.tmp.cleanup()
        if reports:
            self.fail("sanitizer report:\n" + reports[0])

    def start_atc(self, config_yaml, name="atc"):
        atc = Atc(config_yaml, self.tmp.name, name)
        self.processes.append(atc)
        return atc

    def write_policy(self, source, name="policy.lua"):
        """Writes a policy file in the test's directory the way an editor saves (a rename, so a watch sees
        one whole file); returns its path."""
        path = os.path.join(self.tmp.name, name)
        with open(path + ".new", "w") as f:
            f.write(source)
        os.replace(path + ".new", path)
        return path

    def policy_status(self, atc):
        """GET /admin/policy, which must answer 200."""
        status, _, body = request("127.0.0.1", atc.admin_port, "GET", "/admin/policy")
        self.assertEqual(status, 200, body)
        return json.loads(body)

    def start_sim(self, name="sim", model="llama-3-8b", extra=()):
        sim = Sim(self.tmp.name, name, model, extra)
        self.processes.append(sim)
        return sim


SKIPPED = 77  # ctest's SKIP_RETURN_CODE for the integration tests (tests/CMakeLists.txt)


def run_file(path):
    """Runs the tests of one test file, as ctest does: exits 1 when a test failed or none ran, SKIPPED
    when none failed but one skipped (redis-server or chromium missing), so that ctest reports the file
    as not run rather than passed, and 0 when every test ran and passed."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    name = os.path.splitext(os.path.basename(path))[0]
    result = unittest.TextTestRunner(verbosity=2).run(unittest.defaultTestLoader.loadTestsFromName(name))
    if not result.wasSuccessful() or result.testsRun == 0:
        return 1
    if result.skipped:
        print(f"{len(result.skipped)} of {result.testsRun} tests skipped:", file=sys.stderr)
        for test, reason in result.skipped:
            print(f"  {test.id()}: {reason}", file=sys.stderr)
        return SKIPPED
    return 0


if __name__ == "__main__":
    # python3 harness.py tests/integration/test_x.py: through the module the test files import, not a
    # second copy of it under the name __main__.
    import harness

    sys.exit(harness.run_file(sys.argv[1]))
