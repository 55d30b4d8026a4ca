#!/usr/bin/env python3
"""Hostile-policy soak: steady mixed traffic through atc while the policy is reloaded, every second or
so, with a hostile version: one that spins, spins in an xpcall handler, hogs memory (at once, or a leak
that grows to the cap), sets off a pattern bomb, raises, returns nonsense, or misbehaves at load time
(spins in the chunk or in an xpcall handler there, hogs memory, loads slowly near the limits), between
good ones. The hostile versions route most requests normally and misbehave on the rest, so that they
serve traffic until they are rolled back.

Every request must get exactly one outcome (soak.py's: a complete success, a clear error status, or an
SSE error event) within its deadline, and none may take longer than DEADLINE_S; reloads must be
answered (200 or 422) and atc must answer SIGTERM. Prints the count of each outcome, the latencies, the
policy's failures by kind, the reloads and atc's memory; exits 1 on a lost or late request.

Then the floods: for each thing a client can send without end in a request's framing (a chunk
extension, a trailer line, leading zeros of a chunk size, CRLF before a request line), FLOOD_BYTES go in
on one connection (a new one when atc closed it, until they all went), to the front port and to the admin
port with admin_token set (the framing is read before any token is checked). atc's peak RSS (VmHWM,
reset before each flood) must stay within FLOOD_RSS_MIB of its RSS before the first, and atc must still answer.

  tests/soak/hostile_soak.py [--seconds 600] [--clients 8]     (not part of tests/run: 10 minutes)
  tests/soak/hostile_soak.py --floods-only                     (the floods alone: a minute or so)
"""

import argparse
import http.client
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import soak  # noqa: E402  (its Sim, Counts, one_request, rss_kib)

DEADLINE_S = 10.0  # no request may take longer (x-atc-deadline is 10s; the decode is a few ms a token)
MEMORY = "32MiB"   # policy.memory: a hog reaches it quickly

ROUTE = "atc.least_loaded(fleet:endpoints(req.model))"

# Route requests normally, misbehave on one in three (a module-level counter, per worker).
PER_REQUEST = {
    "spin": "while true do end",
    "xpcall spinning handler": "xpcall(function() while true do end end, function() while true do end end)",
    "xpcall spinning handler of an error": "xpcall(function() error('x') end, function() while true do end end)",
    "pcall swallowing a spin": "while true do pcall(function() while true do end end) end",
    "table bomb (the budget stops it first)": "local t = {} for i = 1, 1e8 do t[i] = {i} end",
    "memory leak to the cap": "for i = 1, 4 do keep[#keep + 1] = string.rep('x', 1048576 - #keep) end",  # distinct: LuaJIT interns strings
    "pattern bomb": "string.find(string.rep('a', 60000), '.-.-.-.-b')",
    "gsub bomb": "string.gsub(string.rep('a', 20000), '(.-)(.-)b', '%%1')",
    "error": "error('hostile policy raised')",
    "invalid return: number": "return 42",
    "invalid return: unknown id": "return 'no-such-endpoint'",
    "invalid return: table": "return {}",
    "invalid return: id with NUL": "return 'sim0\\0junk'",
}

PER_REQUEST_POLICY = """
local keep, n = {{}}, 0
return function(req, fleet)
  n = n + 1
  if n % 3 == 0 then
    {bad}
  end
  return {route}
end
"""

AT_LOAD = {
    "spin at load": "while true do end",
    "xpcall spinning handler at load": "xpcall(function() while true do end end, function() while true do end end)",
    "memory hog at load": "local t = {} for i = 1, 1e8 do t[i] = {i} end",
    "error at load": "error('hostile at load')",
    "syntax error": "return = 1",
}

AT_LOAD_POLICY = """
{bad}
return function(req, fleet) return {route} end
"""

# Valid, but each step of loading runs close to its limit (100 budgets of the default 1 ms).
SLOW_LOAD = """
local function busy(ms) local t = atc.now() + ms while atc.now() < t do end end
local keep = {{}}
busy(40)
return {{
  init = function(fleet)
    busy(20)
    for i = 1, 60000 do keep[i] = {{i}} end  -- a live set the collector steps through
  end,
  route = function(req, fleet)
    if req.id == "atc-reload-check" then busy(40) end
    local junk = {{}}
    for i = 1, 200 do junk[i] = {{i}} end
    return {route}
  end,
}}
"""

GOOD = "return function(req, fleet) return {route} end -- good {n}\n"


def versions(rng):
    """An endless sequence of (name, source): hostile ones in a shuffled cycle, a good one between."""
    hostile = [(f"request: {k}", PER_REQUEST_POLICY.format(bad=v, route=ROUTE)) for k, v in PER_REQUEST.items()]
    hostile += [(f"load: {k}", AT_LOAD_POLICY.format(bad=v, route=ROUTE)) for k, v in AT_LOAD.items()]
    hostile.append(("load: slow, near the limits", SLOW_LOAD.format(route=ROUTE)))
    n = 0
    while True:
        rng.shuffle(hostile)
        for item in hostile:
            n += 1
            yield item
            if n % 3 == 0:
                yield "good", GOOD.format(route=ROUTE, n=n)


def metric_values(admin, name):
    """{labels: value} of metric @name, or None when the admin API does not answer."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", admin, timeout=10)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
    except (OSError, http.client.HTTPException):
        return None
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^%s\{([^}]*)\} (\S+)$" % name, text, re.M)}


FLOOD_BYTES = 200 << 20
FLOOD_RSS_MIB = 64
CHUNKED = b"POST %s HTTP/1.1\r\nHost: atc\r\nTransfer-Encoding: chunked\r\n\r\n"
# (what starts it after the head, the piece repeated after it)
FLOODS = {
    "chunk extension": (b"1;", b"a" * (1 << 20)),
    "trailer line": (b"1\r\nx\r\n0\r\nX-T: ", b"v" * (1 << 20)),
    "leading zeros": (b"", b"0" * (1 << 20)),
    "CRLF before a request line": (None, b"\r\n" * (1 << 19)),
}


def status_kib(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def flood_one(port, path, prefix, piece):
    """FLOOD_BYTES of piece after the head and prefix, on one connection while atc takes them (a new one
    when it closed it); returns (connections used, the first status atc answered or None)."""
    sent, conns, status = 0, 0, None
    deadline = time.monotonic() + 120
    while sent < FLOOD_BYTES and time.monotonic() < deadline:
        s = socket.create_connection(("127.0.0.1", port))
        conns += 1
        try:
            if prefix is not None:
                s.sendall(CHUNKED % path + prefix)
            while sent < FLOOD_BYTES:
                s.sendall(piece)
                sent += len(piece)
        except OSError:
            pass
        try:
            s.settimeout(2)
            first = s.recv(64)
            if status is None and first.startswith(b"HTTP/1.1 "):
                status = int(first[9:12])
        except OSError:
            pass
        s.close()
    return conns, status


def floods(work):
    """The floods phase against an atc of its own (admin_token set); returns a list of problems."""
    sims = [soak.Sim(work, "flood-sim", soak.free_port(), [])]
    cfg = os.path.join(work, "flood.yaml")
    with open(cfg, "w") as f:
        f.write(f"""listen: 127.0.0.1:0
admin: 127.0.0.1:0
admin_token: s3cret
models:
  - name: m
    endpoints:
      - {{id: s, url: "http://127.0.0.1:{sims[0].port}"}}
""")
    ready = os.path.join(work, "flood.ready")
    log = open(os.path.join(work, "flood-atc.log"), "wb")
    atc = subprocess.Popen([soak.ATC, "serve", "-c", cfg, "--ready-file", ready], stdout=log, stderr=log)
    soak.wait_file(ready, atc)
    with open(ready) as f:
        info = json.load(f)
    port, admin = int(info["listen"].rsplit(":", 1)[1]), int(info["admin"].rsplit(":", 1)[1])
    problems = []
    start_rss = status_kib(atc.pid, "VmRSS")  # where it started: every flood's peak is held to this
    print(f"\n| flood ({FLOOD_BYTES >> 20} MiB) | port | connections | answer | RSS before / peak (KiB) |")
    print("|---|---|--:|--:|---|")
    for name, (prefix, piece) in FLOODS.items():
        for label, p, path in (("front", port, b"/v1/chat/completions"), ("admin", admin, b"/admin/policy/reload")):
            before = status_kib(atc.pid, "VmRSS")
            with open(f"/proc/{atc.pid}/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the RSS now
            start = time.monotonic()
            conns, status = flood_one(p, path, prefix, piece)
            peak = status_kib(atc.pid, "VmHWM")
            print(f"| {name} | {label} | {conns} | {status} | {before} / {peak} "
                  f"({time.monotonic() - start:.1f} s) |")
            if peak - start_rss > FLOOD_RSS_MIB << 10:
                problems.append(f"{name} on the {label} port: peak RSS {peak} KiB, {start_rss} at the start")
            if status not in (400, 413):
                problems.append(f"{name} on the {label} port: answered {status}, not 400")
    final = soak.Counts()
    soak.one_request(port, random.Random(1), final)
    if "ok" not in final.c:
        problems.append(f"atc did not answer after the floods: {final.c}")
    soak.sigterm(atc, os.path.join(work, "flood-atc.log"))
    try:
        atc.wait(15)
    except subprocess.TimeoutExpired:
        atc.kill()
        problems.append("atc hung after SIGTERM")
    for s in sims:
        s.stop()
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--reload-every", type=float, default=1.0, help="seconds between reloads")
    ap.add_argument("--floods-only", action="store_true", help="only the floods phase")
    args = ap.parse_args()
    if args.floods_only:
        problems = floods(tempfile.mkdtemp(prefix="atc-floods-"))
        print("FAILED: " + "; ".join(problems) if problems else "floods passed: atc's memory stayed bounded")
        return 1 if problems else 0
    rng = random.Random(19)
    work = tempfile.mkdtemp(prefix="atc-hostile-soak-")
    sims = [soak.Sim(work, f"sim{i}", soak.free_port(), []) for i in range(3)]
    policy = os.path.join(work, "policy.lua")
    with open(policy, "w") as f:
        f.write(GOOD.format(route=ROUTE, n=0))
    cfg = os.path.join(work, "atc.yaml")
    with open(cfg, "w") as f:
        f.write(f"""listen: 127.0.0.1:0
admin: 127.0.0.1:0
policy:
  entry: policy.lua
  memory: {MEMORY}
  rollback_after: 20
  watch: false
upstream:
  first_byte_timeout: 5s
admission:
  deadline: 5s
models:
  - name: m
    endpoints:
""" + "".join(f"      - {{id: {s.name}, url: \"http://127.0.0.1:{s.port}\", capacity: 64}}\n" for s in sims))
    ready = os.path.join(work, "atc.ready")
    atc_log = open(os.path.join(work, "atc.log"), "wb")
    atc = subprocess.Popen([soak.ATC, "serve", "-c", cfg, "--ready-file", ready], stdout=atc_log, stderr=atc_log)
    soak.wait_file(ready, atc)
    with open(ready) as f:
        info = json.load(f)
    port, admin = int(info["listen"].rsplit(":", 1)[1]), int(info["admin"].rsplit(":", 1)[1])

    counts, reloads, stop = soak.Counts(), soak.Counts(), threading.Event()
    sent, latencies, reload_s = [0], [], []

    def client(seed):
        r = random.Random(seed)
        while not stop.is_set():
            with counts.lock:
                sent[0] += 1
            start = time.monotonic()
            soak.one_request(port, r, counts)
            elapsed = time.monotonic() - start
            with counts.lock:
                latencies.append(elapsed)
            if elapsed > DEADLINE_S:
                counts.add(f"LATE: over {DEADLINE_S:.0f} s")

    def reloader():
        gen = versions(rng)
        while not stop.wait(args.reload_every):
            name, source = next(gen)
            with open(policy + ".new", "w") as f:
                f.write(source)
            os.replace(policy + ".new", policy)
            start = time.monotonic()
            try:
                conn = http.client.HTTPConnection("127.0.0.1", admin, timeout=30)
                conn.request("POST", "/admin/policy/reload")
                status = conn.getresponse().status
                conn.close()
            except (OSError, http.client.HTTPException) as e:
                status = type(e).__name__
            reload_s.append(time.monotonic() - start)
            reloads.add(f"{name}: {status}")

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(args.clients)]
    threads.append(threading.Thread(target=reloader, daemon=True))
    t0 = time.monotonic()
    for t in threads:
        t.start()
    warm = min(10.0, args.seconds / 6)
    time.sleep(warm)
    rss_warm = soak.rss_kib(atc.pid)
    rss_max = rss_warm
    while time.monotonic() - t0 < args.seconds:
        time.sleep(1)
        rss_max = max(rss_max, soak.rss_kib(atc.pid))
    stop.set()
    for t in threads:
        t.join(DEADLINE_S + 30)
    hung = [t for t in threads if t.is_alive()]
    rss_end = soak.rss_kib(atc.pid)
    fallbacks = metric_values(admin, "atc_policy_fallbacks_total")
    final = soak.Counts()
    soak.one_request(port, random.Random(1), final)

    start = time.monotonic()
    soak.sigterm(atc, os.path.join(work, "atc.log"))
    try:
        exit_code = atc.wait(15)
    except subprocess.TimeoutExpired:
        atc.kill()
        exit_code = "hung after SIGTERM (killed)"
    term_s = time.monotonic() - start
    for s in sims:
        s.stop()

    lost = sum(v for k, v in counts.c.items() if k.startswith(("LOST", "LATE")))
    outcomes = sum(v for k, v in counts.c.items() if not k.startswith("LATE"))
    latencies.sort()

    def pct(p):
        return latencies[min(len(latencies) - 1, int(len(latencies) * p))] * 1000 if latencies else 0

    print(f"hostile soak: {args.seconds:.0f} s, {args.clients} clients, a reload every {args.reload_every} s, "
          f"logs in {work}")
    print("| request outcome | count |\n|---|--:|")
    for k in sorted(counts.c):
        print(f"| {k} | {counts.c[k]} |")
    print(f"| requests sent | {sent[0]} |\n| outcomes counted | {outcomes} |")
    print(f"| latency p50 / p99 / max (ms) | {pct(0.5):.1f} / {pct(0.99):.1f} / {pct(1.0):.1f} |")
    print("\n| policy fallback (C balancer routed) | count |\n|---|--:|")
    for k in sorted(fallbacks or {}):
        print(f"| {k} | {fallbacks[k]:.0f} |")
    print("\n| reload: version | answers |\n|---|--:|")
    for k in sorted(reloads.c):
        print(f"| {k} | {reloads.c[k]} |")
    if reload_s:
        print(f"| reload answer time median / max (s) | {sorted(reload_s)[len(reload_s) // 2]:.2f} / "
              f"{max(reload_s):.2f} |")
    print(f"\n| atc RSS after warm-up / max / end (KiB) | {rss_warm} / {rss_max} / {rss_end} |")
    print(f"| after the soak | {', '.join(final.c)} |")
    print(f"| SIGTERM to exit (s) | {term_s:.2f} (exit code {exit_code}) |")

    with open(os.path.join(work, "atc.log"), "rb") as f:
        log = f.read().decode(errors="replace")
    problems = []
    if lost:
        problems.append(f"{lost} request(s) lost or late")
    if outcomes != sent[0]:
        problems.append(f"{sent[0]} sent but {outcomes} outcomes")
    if hung:
        problems.append(f"{len(hung)} client or reload thread(s) still hung")
    bad_reloads = [k for k in reloads.c if not k.endswith((": 200", ": 422"))]
    if bad_reloads:
        problems.append(f"reloads without an answer: {bad_reloads}")
    if "ok" not in final.c:
        problems.append("atc did not answer after the soak")
    if fallbacks is None:
        problems.append("the admin API did not answer after the soak")
    if exit_code != 0 or term_s > 12:
        problems.append(f"SIGTERM: exit {exit_code} after {term_s:.1f} s")
    for marker in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
                   "WARNING: ThreadSanitizer", "ERROR: ThreadSanitizer", "FATAL: ThreadSanitizer"):
        if marker in log:
            problems.append(f"sanitizer report in atc's log ({marker})")
    problems += floods(work)
    if problems:
        print("FAILED: " + "; ".join(problems))
        return 1
    print("hostile soak passed: every request got exactly one outcome within its deadline")
    return 0


if __name__ == "__main__":
    sys.exit(main())
