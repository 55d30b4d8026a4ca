#!/usr/bin/env python3
"""The cost of cluster: (replicas through Redis) on the request path: requests/s, latency and the shipped
policy's decision time of one atc with a cluster configured (a Redis, a second replica publishing) and
of one without, side by side in interleaved rounds of one run, on the same static backends. No request
waits for Redis, so the two should be within noise of each other. Prints a markdown table.

  tests/bench/cluster_bench.py [--rounds 3] [--duration 5] [--connections 32]
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from load import run_wrk  # noqa: E402
from procs import BenchError, Children, free_port, start_atc, start_static_backend  # noqa: E402

ATC = os.environ.get("ATC_BIN", "build/atc")


def decision_totals(admin):
    """(sum of seconds, count) of atc_policy_decision_seconds from /metrics."""
    text = urllib.request.urlopen(f"http://{admin}/metrics", timeout=10).read().decode()
    s = c = 0.0
    for line in text.splitlines():
        if line.startswith("atc_policy_decision_seconds_sum"):
            s = float(line.split()[-1])
        elif line.startswith("atc_policy_decision_seconds_count"):
            c = float(line.split()[-1])
    return s, c


def admin_of(kids, name):
    import json
    with open(os.path.join(kids.workdir, f"{name}.ready")) as f:
        return json.load(f)["admin"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=5)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--sync-interval", default="50ms")
    args = ap.parse_args()
    redis = shutil.which("redis-server")
    if redis is None or shutil.which("wrk") is None:
        raise BenchError("needs redis-server and wrk (apt-get install -y redis-server wrk)")
    kids = Children(tempfile.mkdtemp(prefix="atc-cluster-bench-"))
    try:
        build = os.path.dirname(os.path.abspath(ATC))
        backends = [start_static_backend(kids, build, f"backend{i}") for i in range(2)]
        port = free_port()
        kids.spawn("redis", [redis, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        time.sleep(0.3)
        cluster = [f"cluster: {{redis: 'redis://127.0.0.1:{port}/0', name: bench, sync_interval: {args.sync_interval}}}"]
        peer = ["cluster: {redis: 'redis://127.0.0.1:%d/0', name: peer, sync_interval: %s}" % (port, args.sync_interval)]
        legs = {
            "no cluster": start_atc(kids, ATC, "atc-alone", "no cluster", backends, policy=True, capacity=4096,
                                    keepalive=64, workers=1),
            "cluster": start_atc(kids, ATC, "atc-cluster", "cluster", backends, policy=True, capacity=4096,
                                 keepalive=64, workers=1, extra=cluster),
        }
        start_atc(kids, ATC, "atc-peer", "peer", backends, policy=True, capacity=4096, keepalive=64, workers=1,
                  extra=peer)
        time.sleep(0.5)
        results = {k: [] for k in legs}
        names = list(legs)
        for r in range(args.rounds):
            for name in names[r % 2:] + names[:r % 2]:
                leg = legs[name]
                admin = admin_of(kids, leg.name)
                s0, c0 = decision_totals(admin)
                w = run_wrk(kids, f"wrk-{leg.name}-{r}", leg.addr, args.duration, args.connections, 2)
                s1, c1 = decision_totals(admin)
                w["decision_us"] = (s1 - s0) / (c1 - c0) * 1e6 if c1 > c0 else float("nan")
                results[name].append(w)
        rows = ["| leg | requests/s | p50 latency (ms) | p99 latency (ms) | decision (µs, mean) | errors |",
                "|---|---|---|---|---|---|"]
        med = {}
        for name in names:
            rs = results[name]
            med[name] = {k: statistics.median(x[k] for x in rs) for k in ("rps", "p50_us", "p99_us", "decision_us")}
            m = med[name]
            rows.append(f"| {name} | {m['rps']:.0f} | {m['p50_us'] / 1000:.2f} | {m['p99_us'] / 1000:.2f} | "
                        f"{m['decision_us']:.1f} | {sum(x['errors'] for x in rs)} |")
        ratio = med["cluster"]["rps"] / med["no cluster"]["rps"]
        rows.append("")
        rows.append(f"cluster / no cluster: {ratio:.3f} of the requests/s; decision "
                    f"{med['cluster']['decision_us']:.1f} vs {med['no cluster']['decision_us']:.1f} µs "
                    f"(median of {args.rounds} interleaved rounds of {args.duration:.0f} s, {args.connections} "
                    f"connections, 1 worker, shipped policy, sync_interval {args.sync_interval})")
        print("\n".join(rows))
    finally:
        kids.stop_all()


if __name__ == "__main__":
    try:
        main()
    except BenchError as e:
        print(f"cluster_bench: {e}", file=sys.stderr)
        sys.exit(1)
