#!/usr/bin/env python3
"""Soak: steady mixed traffic through atc to simulated servers that die, hang, fail and come back,
while the policy is reloaded (good and broken versions) and clients now and then walk away mid-stream.

Every request must get exactly one outcome: a complete success, or a clear error (an OpenAI-style
error status, or an SSE error event that ends the stream), within its deadline. atc's memory must stay
flat after warm-up, and atc must still answer when the soak ends. Prints the counts; exits 1 on any
lost request or memory growth.

  tests/soak/soak.py [--seconds 30] [--clients 8]     (ATC_SOAK_SECONDS also sets the duration)
"""

import argparse
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.abspath(os.path.join(HERE, "..", ".."))
ATC = os.environ.get("ATC_BIN", os.path.join(SOURCE, "build", "atc"))
DEADLINE_S = 20.0  # a client gives up after this: an outcome later than that counts as lost
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
from harness import signal_until  # noqa: E402


def sigterm(proc, log_path):
    """SIGTERM, sent again while @p log_path shows no "signal 15" and the process lives (signal_until)."""
    def received():
        with open(log_path, "rb") as f:
            return proc.poll() is not None or b"signal 15" in f.read()
    try:
        signal_until(proc, signal.SIGTERM, received, what="SIGTERM received", timeout=10)
    except AssertionError:
        pass  # the caller's wait for the exit says what happened


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_file(path, proc, timeout=15):
    end = time.monotonic() + timeout
    while not os.path.exists(path):
        if proc.poll() is not None or time.monotonic() > end:
            raise RuntimeError(f"process did not become ready ({path})")
        time.sleep(0.02)


class Sim:
    def __init__(self, workdir, name, port, extra):
        self.workdir, self.name, self.port, self.extra = workdir, name, port, extra
        self.proc = None
        for attempt in range(3):  # another test may take a free_port() port before the sim binds it
            try:
                self.start()
                return
            except RuntimeError:
                if attempt == 2 or "in use" not in self.log_tail():
                    raise RuntimeError(f"{name} did not start: {self.log_tail()}")
                self.port = free_port()

    def log_tail(self):
        with open(os.path.join(self.workdir, f"{self.name}.log"), "rb") as f:
            return f.read()[-2000:].decode(errors="replace")

    def start(self):
        ready = os.path.join(self.workdir, f"{self.name}.ready")
        if os.path.exists(ready):
            os.unlink(ready)
        log = open(os.path.join(self.workdir, f"{self.name}.log"), "ab")
        self.proc = subprocess.Popen([ATC, "sim", "--listen", f"127.0.0.1:{self.port}", "--model", "m",
                                      "--decode-ms", "3", "--ready-file", ready, *self.extra],
                                     stdout=log, stderr=log)
        wait_file(ready, self.proc)

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            sigterm(self.proc, os.path.join(self.workdir, f"{self.name}.log"))
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class Counts:
    def __init__(self):
        self.lock = threading.Lock()
        self.c = {}

    def add(self, key):
        with self.lock:
            self.c[key] = self.c.get(key, 0) + 1


def one_request(port, rng, counts):
    """Sends one request; records exactly one outcome."""
    stream = rng.random() < 0.6
    walk_away = stream and rng.random() < 0.05
    body = {"model": "m", "stream": stream, "max_tokens": rng.choice([4, 16, 48]),
            "messages": [{"role": "user", "content": "soak " * rng.randint(1, 200)}]}
    headers = {"content-type": "application/json", "x-atc-priority": str(rng.choice([0, 0, 0, 5, 9])),
               "x-atc-session": f"s{rng.randint(0, 50)}", "x-atc-deadline": "10s"}
    start = time.monotonic()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=DEADLINE_S)
        conn.request("POST", "/v1/chat/completions", json.dumps(body), headers)
        resp = conn.getresponse()
        if resp.status != 200:
            doc = json.loads(resp.read())
            assert "message" in doc["error"]
            counts.add(f"error {resp.status}")
        elif not stream:
            doc = json.loads(resp.read())
            assert doc["choices"][0]["message"]["content"] is not None
            counts.add("ok")
        else:
            events = 0
            last = None
            while True:
                line = resp.readline()
                if not line:
                    break
                if line.startswith(b"data: "):
                    events += 1
                    last = line[6:].strip()
                    if walk_away and events == 2:
                        conn.sock.close()  # the client walks away mid-stream
                        counts.add("client walked away")
                        return
            if last == b"[DONE]":
                counts.add("ok")
            elif last is not None and b'"error"' in last:
                counts.add("stream ended with an error event")
            else:
                counts.add("LOST: stream cut without an error event")
                return
        conn.close()
    except (ConnectionError, http.client.HTTPException, socket.timeout, OSError, ValueError, AssertionError) as e:
        counts.add(f"LOST: {type(e).__name__}")
        return
    if time.monotonic() - start > DEADLINE_S:
        counts.add("LOST: past the deadline")


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


GOOD = open(os.path.join(SOURCE, "scripts", "policy.lua")).read()
BROKEN = ["return function(req, fleet) return = end\n", "error('broken at load')\n",
          "return function(req, fleet) while true do end end\n"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=float(os.environ.get("ATC_SOAK_SECONDS", 30)))
    ap.add_argument("--clients", type=int, default=8)
    args = ap.parse_args()
    rng = random.Random(42)
    work = tempfile.mkdtemp(prefix="atc-soak-")
    sims = [Sim(work, "sim0", free_port(), []),
            Sim(work, "sim1", free_port(), ["--error-rate", "0.05"]),
            Sim(work, "sim2", free_port(), ["--hang-rate", "0.02"])]
    policy = os.path.join(work, "policy.lua")
    with open(policy, "w") as f:
        f.write(GOOD)
    cfg = os.path.join(work, "atc.yaml")
    with open(cfg, "w") as f:
        f.write(f"""listen: 127.0.0.1:0
admin: 127.0.0.1:0
policy:
  entry: policy.lua
  path: [{os.path.join(SOURCE, "scripts")}]
  watch: false
upstream:
  connect_timeout: 500ms
  first_byte_timeout: 2s
  idle_timeout: 2s
  tries: 3
admission:
  deadline: 5s
models:
  - name: m
    endpoints:
""" + "".join(f"      - {{id: {s.name}, url: \"http://127.0.0.1:{s.port}\", capacity: 32}}\n" for s in sims))
    ready = os.path.join(work, "atc.ready")
    atc_log = open(os.path.join(work, "atc.log"), "wb")
    atc = subprocess.Popen([ATC, "serve", "-c", cfg, "--ready-file", ready], stdout=atc_log, stderr=atc_log)
    wait_file(ready, atc)
    with open(ready) as f:
        info = json.load(f)
    port, admin = int(info["listen"].rsplit(":", 1)[1]), int(info["admin"].rsplit(":", 1)[1])

    counts, stop = Counts(), threading.Event()
    sent = [0]

    def client(seed):
        r = random.Random(seed)
        while not stop.is_set():
            with counts.lock:
                sent[0] += 1
            one_request(port, r, counts)

    def chaos():
        while not stop.wait(rng.uniform(1.0, 2.5)):
            s = rng.choice(sims)
            if rng.random() < 0.5:
                s.kill()  # dies
                stop.wait(rng.uniform(0.5, 1.5))
                s.start()  # and comes back on the same port
            else:
                s.proc.send_signal(signal.SIGSTOP)  # hangs
                stop.wait(rng.uniform(0.5, 2.0))
                s.proc.send_signal(signal.SIGCONT)
            counts.add("chaos events")

    def reloads():
        n = 0
        while not stop.wait(0.7):
            n += 1
            with open(policy + ".new", "w") as f:
                f.write(GOOD + f"-- v{n}\n" if n % 2 else rng.choice(BROKEN))
            os.replace(policy + ".new", policy)
            conn = http.client.HTTPConnection("127.0.0.1", admin, timeout=10)
            conn.request("POST", "/admin/policy/reload")
            status = conn.getresponse().status
            counts.add(f"reload {'ok' if status == 200 else 'refused'}")
            conn.close()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(args.clients)]
    threads += [threading.Thread(target=chaos, daemon=True), threading.Thread(target=reloads, daemon=True)]
    for t in threads:
        t.start()
    time.sleep(min(5.0, args.seconds / 4))
    rss_warm = rss_kib(atc.pid)
    time.sleep(max(0.0, args.seconds - min(5.0, args.seconds / 4)))
    stop.set()
    for t in threads:
        t.join(DEADLINE_S + 5)
    rss_end = rss_kib(atc.pid)

    # atc still answers once the dust settles
    for s in sims:
        if s.proc.poll() is not None:
            s.start()
        else:
            s.proc.send_signal(signal.SIGCONT)
    final = Counts()
    time.sleep(1)
    one_request(port, random.Random(1), final)
    sigterm(atc, os.path.join(work, "atc.log"))
    exit_code = atc.wait(30)
    for s in sims:
        s.stop()

    lost = sum(v for k, v in counts.c.items() if k.startswith("LOST"))
    outcomes = sum(v for k, v in counts.c.items() if not k.startswith(("chaos", "reload")))
    print(f"soak: {args.seconds:.0f} s, {args.clients} clients, logs in {work}")
    print("| outcome | count |\n|---|--:|")
    for k in sorted(counts.c):
        print(f"| {k} | {counts.c[k]} |")
    print(f"| requests sent | {sent[0]} |\n| outcomes counted | {outcomes} |")
    print(f"| atc RSS after warm-up / at the end (KiB) | {rss_warm} / {rss_end} |")
    print(f"| after the soak | {', '.join(final.c)} |\n| atc exit code | {exit_code} |")
    with open(os.path.join(work, "atc.log"), "rb") as f:
        log = f.read().decode(errors="replace")
    problems = []
    if lost:
        problems.append(f"{lost} request(s) lost")
    if outcomes != sent[0]:
        problems.append(f"{sent[0]} sent but {outcomes} outcomes")
    # Flat: allow allocator noise, not a leak per request. AddressSanitizer holds freed memory in a
    # quarantine (256 MiB by default) and ThreadSanitizer keeps access history, so under either RSS grows
    # by design: the leak report (ASan) checks instead.
    libs = subprocess.run(["ldd", ATC], capture_output=True).stdout
    sanitized = b"libasan" in libs or b"libtsan" in libs
    if not sanitized and rss_end > rss_warm + 32 * 1024:
        problems.append(f"memory grew from {rss_warm} to {rss_end} KiB")
    if "ok" not in final.c:
        problems.append("atc did not answer after the soak")
    if exit_code != 0:
        problems.append(f"atc exited with {exit_code}")
    for marker in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
                   "WARNING: ThreadSanitizer", "ERROR: ThreadSanitizer", "FATAL: ThreadSanitizer"):
        if marker in log:
            problems.append(f"sanitizer report in atc's log ({marker})")
    if problems:
        print("FAILED: " + "; ".join(problems))
        return 1
    print("soak passed: every request got exactly one outcome")
    return 0


if __name__ == "__main__":
    sys.exit(main())
