"""What a steady request stream sees while endpoints are added and removed through the admin API: the
largest and the 99th-percentile latency of small chat requests (one client thread, keep-alive off), first
with no change, then while endpoints are added and removed back to back for the whole window; and how many
times the workers were parked meanwhile (atc_worker_parks_total). Not a pass/fail test.

    ATC_SOURCE_DIR=$PWD ATC_BIN=build/atc python3 tests/bench/endpoint_churn_bench.py [SECONDS]
"""

import os
import re
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from harness import Atc, Sim, chat, request  # noqa: E402


def stream(atc, seconds):
    lat = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.monotonic()
        status = chat(atc.port, max_tokens=1)[0]
        lat.append((time.monotonic() - t) * 1000)
        assert status == 200, status
    lat.sort()
    return lat[-1], lat[int(len(lat) * 0.99)], len(lat)


def parks(atc):
    """atc_worker_parks_total, or None on a build without it."""
    body = request("127.0.0.1", atc.admin_port, "GET", "/metrics")[2]
    m = re.search(r"^atc_worker_parks_total (\d+)$", body.decode(), re.M)
    return int(m.group(1)) if m else None


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 5
    with tempfile.TemporaryDirectory() as tmp:
        sim = Sim(tmp, "a", extra=["--decode-ms", "1"])
        atc = Atc(f"""listen: 127.0.0.1:0
admin: 127.0.0.1:0
workers: 2
policy: {{entry: {os.path.join(os.environ.get("ATC_SOURCE_DIR", "."), "scripts/policy.lua")}}}
models:
  - name: llama-3-8b
    endpoints:
      - {{id: a, url: "{sim.url}"}}
""", tmp)
        try:
            print("steady:   max %.1f ms, p99 %.1f ms over %d requests" % stream(atc, seconds))
            out = {}
            before = parks(atc)
            t = threading.Thread(target=lambda: out.setdefault("r", stream(atc, seconds)))
            t.start()
            changes = 0
            while t.is_alive():
                i = changes // 2
                assert request("127.0.0.1", atc.admin_port, "POST", "/admin/endpoints",
                               {"model": "llama-3-8b", "id": f"n{i}", "url": sim.url})[0] == 201
                assert request("127.0.0.1", atc.admin_port, "DELETE", f"/admin/endpoints/n{i}")[0] == 200
                changes += 2
            t.join()
            after = parks(atc)
            print("churning: max %.1f ms, p99 %.1f ms over %d requests" % out["r"]
                  + ", %d endpoint changes, %s parks" % (changes, "?" if after is None else after - before))
        finally:
            atc.stop()
            sim.stop()


if __name__ == "__main__":
    main()
