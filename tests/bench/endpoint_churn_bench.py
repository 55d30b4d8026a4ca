"""What a steady request stream sees while endpoints are added and removed through the admin API: the
largest and the 99th-percentile latency of small chat requests (one client thread, keep-alive off), first
with no change, then while 20 endpoints are added and 20 removed. Not a pass/fail test.

    ATC_BIN=build/atc python3 tests/bench/endpoint_churn_bench.py
"""

import os
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


def main():
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
            print("steady:   max %.1f ms, p99 %.1f ms over %d requests" % stream(atc, 3))
            out = {}
            t = threading.Thread(target=lambda: out.setdefault("r", stream(atc, 3)))
            t.start()
            for i in range(20):
                request("127.0.0.1", atc.admin_port, "POST", "/admin/endpoints",
                        {"model": "llama-3-8b", "id": f"n{i}", "url": sim.url})
                request("127.0.0.1", atc.admin_port, "DELETE", f"/admin/endpoints/n{i}")
            t.join()
            print("churning: max %.1f ms, p99 %.1f ms over %d requests" % out["r"])
        finally:
            atc.stop()
            sim.stop()


if __name__ == "__main__":
    main()
