#!/usr/bin/env python3
"""Admission control under overload: time to first token per priority class, with and without it.

A simulated fleet (2 servers, 8 sequences each) is offered about twice what it can serve, open loop,
with 20% of requests at priority 9 and the rest at 0. "Without" forwards everything and lets the
servers queue in arrival order (endpoint capacity far above the servers' own limit); "with" keeps each
endpoint at the servers' limit and lets atc's priority queue decide. Prints a markdown table.

  tests/bench/admission_bench.py [--duration 20] [--overload 2.0]
"""

import argparse
import http.client
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

ATC = os.environ.get("ATC_BIN", "build/atc")
TOKENS, DECODE_MS, SEQS, SERVERS = 32, 10, 8, 2

CONFIG = """
listen: 127.0.0.1:0
admin: 127.0.0.1:0
admission:
  queue: 100000
  deadline: 120s
  max_deadline: 120s
  aging: 60s
models:
  - name: m
simulate:
  - model: m
    count: {servers}
    max_seqs: {seqs}
    capacity: {capacity}
    decode_ms: {decode}
    decode_batch_factor: 1.0001
"""


def start_atc(workdir, capacity):
    cfg = os.path.join(workdir, f"atc-{capacity}.yaml")
    with open(cfg, "w") as f:
        f.write(CONFIG.format(servers=SERVERS, seqs=SEQS, capacity=capacity, decode=DECODE_MS))
    ready = os.path.join(workdir, f"ready-{capacity}")
    log = open(os.path.join(workdir, f"atc-{capacity}.log"), "wb")
    proc = subprocess.Popen([ATC, "serve", "-c", cfg, "--ready-file", ready], stdout=log, stderr=log)
    deadline = time.monotonic() + 15
    while not os.path.exists(ready):
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"atc did not start; see {log.name}")
        time.sleep(0.02)
    with open(ready) as f:
        port = int(json.load(f)["listen"].rsplit(":", 1)[1])
    return proc, port


def one(port, priority, results):
    body = json.dumps({"model": "m", "stream": True, "max_tokens": TOKENS,
                       "messages": [{"role": "user", "content": "overload"}]})
    start = time.monotonic()
    ttft = None
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=180)
        conn.request("POST", "/v1/chat/completions", body,
                     {"content-type": "application/json", "x-atc-priority": str(priority)})
        resp = conn.getresponse()
        while True:
            line = resp.readline()
            if not line:
                break
            if line.startswith(b"data: ") and ttft is None:
                ttft = time.monotonic() - start
        status = resp.status
        conn.close()
    except Exception:
        status = 0
    results.append((priority, status, ttft))


def run(port, rate, duration, seed):
    rng = random.Random(seed)
    results, threads = [], []
    start = time.monotonic()
    t = start
    while t - start < duration:
        prio = 9 if rng.random() < 0.2 else 0
        th = threading.Thread(target=one, args=(port, prio, results), daemon=True)
        th.start()
        threads.append(th)
        t += rng.expovariate(rate)  # open loop: Poisson arrivals
        time.sleep(max(0, t - time.monotonic()))
    for th in threads:
        th.join(300)
    return results


def pct(values, q):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=20)
    ap.add_argument("--overload", type=float, default=2.0)
    args = ap.parse_args()
    # What the fleet serves: SERVERS x SEQS streams at a time, each about TOKENS x DECODE_MS long.
    capacity_rps = SERVERS * SEQS / (TOKENS * DECODE_MS / 1000.0)
    rate = args.overload * capacity_rps
    rows = {}
    with tempfile.TemporaryDirectory() as workdir:
        for name, capacity in (("without admission control", 100000), ("with admission control", SEQS)):
            proc, port = start_atc(workdir, capacity)
            try:
                rows[name] = run(port, rate, args.duration, seed=7)
            finally:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
    print(f"**admission under {args.overload:.1f}x overload**: {SERVERS} simulated servers x {SEQS} sequences, "
          f"{TOKENS} tokens at {DECODE_MS} ms (fleet serves ~{capacity_rps:.0f} req/s), Poisson arrivals at "
          f"{rate:.0f} req/s for {args.duration:.0f} s, 20% priority 9, 80% priority 0; TTFT = first SSE event.\n")
    print("| mode | priority | requests | ok | TTFT p50 (s) | TTFT p99 (s) |")
    print("|---|--:|--:|--:|--:|--:|")
    for name, results in rows.items():
        for prio in (9, 0):
            mine = [r for r in results if r[0] == prio]
            ttfts = [r[2] for r in mine if r[1] == 200 and r[2] is not None]
            print(f"| {name} | {prio} | {len(mine)} | {len(ttfts)} | {pct(ttfts, 0.5):.2f} | {pct(ttfts, 0.99):.2f} |")


if __name__ == "__main__":
    main()
