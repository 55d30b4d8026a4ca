#!/usr/bin/env python3
"""Virtual-time replay speed against fleet size: simulated requests a second of `atc replay` with the
shipped policy at 8, 32, 128 and 512 simulated servers.

    tests/bench/replay_bench.py [--servers 8,32,128,512] [--copies 5] [--rounds 3]

The load per server is held constant: the trace (Mooncake's synthetic trace, repeated --copies times
one after another with fresh prefix ids) is compressed by servers / 8, so every fleet is as busy as 8
servers on the trace as recorded and only the fleet's size changes. Each count runs --rounds times; the
table shows the best round (the machine is shared: the best is the least disturbed), as requests a
second of replay wall time (what `atc replay` prints as "replayed in"), setup included. Prints one
markdown table. Needs build/atc (ATC_BIN overrides).
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TRACE = os.path.join(ROOT, "..", "shared", "traces", "mooncake_synthetic.jsonl")
FLEET = os.path.join(ROOT, "examples", "replay", "mooncake.yaml")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", default="8,32,128,512")
    ap.add_argument("--copies", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--trace", default=os.environ.get("ATC_TRACE", TRACE))
    args = ap.parse_args()
    atc = os.environ.get("ATC_BIN", os.path.join(ROOT, "build", "atc"))
    if not os.path.exists(args.trace):
        sys.exit(f"replay_bench: no trace at {args.trace} (--trace FILE)")
    recs = [json.loads(line) for line in open(args.trace) if line.strip()]
    span = recs[-1]["timestamp"] + 1000
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "repeated.jsonl")
        with open(trace, "w") as f:
            for k in range(args.copies):
                for r in recs:
                    r = dict(r, timestamp=r["timestamp"] + k * span, hash_ids=[h + k * 10**7 for h in r["hash_ids"]])
                    f.write(json.dumps(r) + "\n")
        n = len(recs) * args.copies
        rows = []
        for servers in [int(x) for x in args.servers.split(",")]:
            best = None
            for _ in range(args.rounds):
                out = subprocess.run([atc, "replay", "-c", FLEET, "--trace", trace, "--format", "mooncake",
                                      "--servers", str(servers), "--speed", str(servers / 8), "--no-progress"],
                                     capture_output=True, text=True, cwd=ROOT, timeout=600)
                m = re.search(r"replayed in \S+ ([0-9.]+) s", out.stdout)
                if out.returncode != 0 or m is None:
                    sys.exit(f"replay_bench: atc replay failed ({out.returncode}): {out.stderr[-500:]}")
                s = float(m.group(1))
                best = s if best is None else min(best, s)
            rows.append((servers, best))
            print(f"replay_bench: {servers} servers: {n / best:,.0f} requests/s", file=sys.stderr)
    print(f"\n| replay, shipped policy ({n:,} requests, load per server held) | "
          + " | ".join(f"{s} servers" for s, _ in rows) + " |")
    print("|---|" + "---|" * len(rows))
    print("| simulated requests/s (best of %d) | " % args.rounds + " | ".join(f"{n / b:,.0f}" for _, b in rows) + " |")
    print("| relative to 8 servers | " + " | ".join(f"{rows[0][1] / b:.2f}x" for _, b in rows) + " |")


if __name__ == "__main__":
    main()
