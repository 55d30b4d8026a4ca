#!/usr/bin/env python3
"""What the status page costs the request path: requests/s and p99 latency of one atc (2 workers, the
shipped policy, static backends) with 0 and with 10 status-page-like pollers (each GETs /admin/endpoints,
/admin/policy and /metrics every 1.5 s, as an open status tab polls, plus the scrape), side by side in
interleaved rounds of one run. The admin reads copy each worker's figures on its own thread and park none,
so the two should be within noise of each other. Prints a markdown table.

  tests/bench/admin_read_bench.py [--rounds 3] [--duration 5] [--connections 32] [--pollers 10]
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from load import run_wrk  # noqa: E402
from procs import BenchError, Children, start_atc, start_static_backend  # noqa: E402

ATC = os.environ.get("ATC_BIN", "build/atc")
PATHS = ("/admin/endpoints", "/admin/policy", "/metrics")


def poll(admin, stop, interval, reads, failures):
    """One status tab: the three reads every interval seconds until stop is set."""
    while not stop.is_set():
        for path in PATHS:
            try:
                urllib.request.urlopen(f"http://{admin}{path}", timeout=10).read()
                reads.append(1)
            except OSError:
                failures.append(1)
        stop.wait(interval)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=5)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--pollers", type=int, default=10)
    ap.add_argument("--interval", type=float, default=1.5)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        raise BenchError("needs wrk (apt-get install -y wrk)")
    kids = Children(tempfile.mkdtemp(prefix="atc-admin-read-bench-"))
    try:
        build = os.path.dirname(os.path.abspath(ATC))
        backends = [start_static_backend(kids, build, f"backend{i}") for i in range(2)]
        atc = start_atc(kids, ATC, "atc", "atc", backends, policy=True, capacity=4096, keepalive=64,
                        workers=args.workers)
        with open(os.path.join(kids.workdir, "atc.ready")) as f:
            admin = json.load(f)["admin"]
        legs = ("0 pollers", f"{args.pollers} pollers")
        results = {k: [] for k in legs}
        reads, failures = [], []
        for r in range(args.rounds):
            for leg in legs[r % 2:] + legs[:r % 2]:
                stop = threading.Event()
                n = args.pollers if leg != "0 pollers" else 0
                threads = [threading.Thread(target=poll, args=(admin, stop, args.interval, reads, failures))
                           for _ in range(n)]
                for t in threads:
                    t.start()
                results[leg].append(run_wrk(kids, f"wrk-{r}-{n}", atc.addr, args.duration, args.connections, 2))
                stop.set()
                for t in threads:
                    t.join()
        rows = ["| leg | requests/s | p50 latency (ms) | p99 latency (ms) | errors |", "|---|---|---|---|---|"]
        med = {}
        for leg in legs:
            rs = results[leg]
            med[leg] = {k: statistics.median(x[k] for x in rs) for k in ("rps", "p50_us", "p99_us")}
            m = med[leg]
            rows.append(f"| {leg} | {m['rps']:.0f} | {m['p50_us'] / 1000:.2f} | {m['p99_us'] / 1000:.2f} | "
                        f"{sum(x['errors'] for x in rs)} |")
        a, b = med[legs[1]], med[legs[0]]
        rows.append("")
        rows.append(f"{legs[1]} / {legs[0]}: {a['rps'] / b['rps']:.3f} of the requests/s, "
                    f"{a['p99_us'] / b['p99_us']:.3f} of the p99 (median of {args.rounds} interleaved rounds of "
                    f"{args.duration:.0f} s, {args.connections} connections, {args.workers} workers, shipped "
                    f"policy; {len(reads)} admin reads, {len(failures)} failed)")
        print("\n".join(rows))
    finally:
        kids.stop_all()


if __name__ == "__main__":
    try:
        main()
    except BenchError as e:
        print(f"admin_read_bench: {e}", file=sys.stderr)
        sys.exit(1)
