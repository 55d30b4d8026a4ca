"""Several replicas as one router (cluster:): three atc serve processes, one Redis (started here, on a
free loopback port), simulated servers they all route to. What a client sees: a session stays on one
endpoint whichever replica it reaches; a policy on one replica sees the load sent through another; a
tenant's budget holds across the replicas; Redis going away fails no request, and its return is
noticed."""

import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import unittest

from harness import ATC_BIN, AtcTestCase, chat, dead_port, request, wait_for

REDIS = shutil.which("redis-server")

SYNC_MS = 100

# Sessions pinned at random (p2c: each replica's own random numbers), so that without shared pins the
# replicas would disagree; a probe request answers with what the policy sees of each endpoint.
POLICY = """
return function(req, fleet)
  local pool = fleet:endpoints(req.model)
  if req:header("x-probe") then
    local seen = {}
    for i = 1, #pool do
      local ep = pool[i]
      seen[#seen + 1] = string.format('"%s": [%d, %d, %s]', ep.id, ep.inflight, ep.remote_inflight,
                                      ep.remote_age ~= nil and "true" or "false")
    end
    return atc.reject(418, "{" .. table.concat(seen, ", ") .. "}")
  end
  local s = req.session
  if s ~= nil then
    local id = atc.affinity.get("s:" .. s)
    for i = 1, #pool do
      if pool[i].id == id then return pool[i] end
    end
    local ep = atc.p2c(pool)
    if ep ~= nil then atc.affinity.set("s:" .. s, ep, 600000) end
    return ep
  end
  return atc.p2c(pool)
end
"""

CONFIG = """
listen: 127.0.0.1:0
admin: 127.0.0.1:0
workers: 2
policy:
  entry: {policy}
  watch: false
{cluster}
limits:
  tenants:
    gold: {{requests_per_minute: {rpm}}}
health:
  enabled: false
models:
  - name: m
    endpoints:
{endpoints}
"""


class Redis:
    """A redis-server of its own on a loopback port, without persistence."""

    def __init__(self, workdir, port=None):
        self.workdir, self.port = workdir, port or dead_port()
        self.start()

    def start(self):
        self.log = open(os.path.join(self.workdir, f"redis-{self.port}.log"), "ab")
        self.proc = subprocess.Popen([REDIS, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", self.workdir], stdout=self.log,
                                     stderr=subprocess.STDOUT)
        wait_for(self.ping, timeout=10, what="redis-server to answer PING")

    def ping(self):
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self):
        self.proc.kill()
        self.proc.wait()
        self.log.close()

    def stop(self, timeout=10.0):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.kill()

    def sanitizer_report(self):
        return None

    @property
    def log_path(self):
        return self.log.name

    def read_log(self):
        with open(self.log.name, errors="replace") as f:
            return f.read()


def redis_call(port, *args, timeout=30):
    """One command to Redis in RESP; returns its answer (bytes, int, str, or a list of them)."""
    parts = [a if isinstance(a, bytes) else str(a).encode() for a in args]
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts))
        f = s.makefile("rb")

        def read():
            line = f.readline()
            kind, rest = line[:1], line[1:-2]
            if kind == b"+":
                return rest.decode()
            if kind == b"-":
                raise AssertionError(f"Redis: {rest.decode()}")
            if kind == b":":
                return int(rest)
            if kind == b"$":
                return None if int(rest) < 0 else f.read(int(rest) + 2)[:-2]
            if kind == b"*":
                return [read() for _ in range(int(rest))]
            raise AssertionError(f"Redis: unexpected {line!r}")
        return read()


def redis_memory(port):
    info = redis_call(port, "INFO", "memory").decode()
    return int(next(line.split(":")[1] for line in info.splitlines() if line.startswith("used_memory:")))


@unittest.skipIf(REDIS is None, "redis-server is not installed (apt-get install -y redis-server)")
class ClusterTest(AtcTestCase):
    def start_cluster(self, rpm=1000, replicas=3, sims=3, cluster=True, sim_extra=()):
        self.redis = Redis(self.tmp.name)
        self.processes.append(self.redis)
        policy = os.path.join(self.tmp.name, "policy.lua")
        with open(policy, "w") as f:
            f.write(POLICY)
        servers = [self.start_sim(name=f"sim{i}", model="m", extra=sim_extra) for i in range(sims)]
        endpoints = "\n".join(f"      - {{id: s{i}, url: '{s.url}', capacity: 64}}" for i, s in enumerate(servers))
        atcs = []
        for i in range(replicas):
            section = (f"cluster: {{redis: 'redis://127.0.0.1:{self.redis.port}/0', name: r{i}, "
                       f"sync_interval: {SYNC_MS}ms}}") if cluster else ""
            atcs.append(self.start_atc(CONFIG.format(policy=policy, cluster=section, rpm=rpm, endpoints=endpoints),
                                       name=f"atc{i}"))
        if cluster:
            wait_for(lambda: all((lambda c: c["mode"] == "shared" and c["pins_subscribed"] and
                                  len(c["replicas"]) == replicas - 1)(self.cluster(a)) for a in atcs),
                     timeout=15, what="every replica in shared mode, subscribed, seeing the others")
        return atcs

    def cluster(self, atc):
        status, _, body = request("127.0.0.1", atc.admin_port, "GET", "/admin/cluster")
        self.assertEqual(status, 200, body)
        return json.loads(body)

    def probe(self, atc):
        status, _, body = chat(atc.port, model="m", headers={"x-probe": "1"})
        self.assertEqual(status, 418, body)
        return json.loads(json.loads(body)["error"]["message"])

    def test_a_session_stays_on_one_endpoint_across_replicas(self):
        atcs = self.start_cluster()
        for s in range(12):
            seen = set()
            for k in range(6):
                before = [self.cluster(a)["pins_received_total"] for a in atcs[1:]] if k == 0 else None
                status, headers, body = chat(atcs[k % 3].port, model="m", max_tokens=2,
                                             headers={"x-atc-session": f"conv-{s}"})
                self.assertEqual(status, 200, body)
                seen.add(headers["x-atc-endpoint"])
                if k == 0:  # a conversation's next turn comes after its pin has reached the others (eventual)
                    wait_for(lambda: all(self.cluster(a)["pins_received_total"] > n
                                         for a, n in zip(atcs[1:], before)), timeout=5, what="the pin shared")
            self.assertEqual(len(seen), 1, f"session conv-{s} went to {sorted(seen)}")
        pins = sum(self.cluster(a)["pins_received_total"] + self.cluster(a)["pins_fetched_total"] for a in atcs)
        self.assertGreaterEqual(pins, 12)

    def test_load_through_one_replica_is_seen_by_another_and_ages_out(self):
        # slow answers: requests stay in flight long enough to be seen
        atcs = self.start_cluster(sims=1, sim_extra=("--decode-ms", "100"))
        a, b = atcs[0], atcs[1]
        def hold():
            try:
                chat(b.port, model="m", max_tokens=60)
            except OSError:
                pass  # B is killed below, its clients with it

        clients = [threading.Thread(target=hold, daemon=True) for _ in range(4)]
        for c in clients:
            c.start()
        wait_for(lambda: b.endpoints()["s0"]["inflight"] == 4, timeout=10, what="4 requests in flight on B")
        a_syncs, b_syncs = self.cluster(a)["syncs_total"], self.cluster(b)["syncs_total"]
        seen = wait_for(lambda: (lambda p: p if p["s0"][0] == 4 and p["s0"][1] == 4 else None)(self.probe(a)),
                        timeout=5, interval=0.005, what="A's policy to see B's 4 requests")
        self.assertTrue(seen["s0"][2], "remote figures come with their age")
        # within 2 sync intervals, counted in sync rounds (B publishes, A reads) rather than in wall time, which
        # a loaded machine or a sanitizer build stretches; +1 for the round under way when the load began
        rounds = max(self.cluster(a)["syncs_total"] - a_syncs, self.cluster(b)["syncs_total"] - b_syncs)
        self.assertLessEqual(rounds, 3, "seen within 2 sync intervals")
        # ... and so does the operator: atc status, /admin/endpoints and /metrics on A show B's requests
        ep = a.endpoints()["s0"]
        self.assertEqual((ep["inflight"], ep["remote_inflight"], ep["fleet_inflight"]), (0, 4, 4))
        self.assertLess(ep["remote_age_ms"], 5000)
        out = subprocess.run([ATC_BIN, "status", "--admin", f"127.0.0.1:{a.admin_port}"], capture_output=True,
                             text=True, timeout=10)
        self.assertRegex(out.stdout, r"(?m)^s0 .* 0 +64 +\d+ +\S+ 4 \(4, \d+\.\ds\) ")
        _, _, metrics = request("127.0.0.1", a.admin_port, "GET", "/metrics")
        self.assertRegex(metrics.decode(), r'(?m)^atc_endpoint_remote_inflight_requests\{[^}]*endpoint="s0"[^}]*\} 4$')
        self.assertRegex(metrics.decode(), r'(?m)^atc_endpoint_fleet_inflight_requests\{[^}]*endpoint="s0"[^}]*\} 4$')
        # B stops publishing (killed with its requests in flight): A leaves its figures out
        b.proc.kill()
        b.proc.wait()
        killed = time.monotonic()
        wait_for(lambda: self.probe(a)["s0"][1] == 0, timeout=5, what="B's figures to age out")
        self.assertLessEqual(time.monotonic() - killed, 6 * SYNC_MS / 1000 + 0.5)

    def test_an_oversized_value_in_the_load_key_is_skipped_and_the_rest_synced(self):
        # someone with write access to Redis puts 64 MiB in atc:load: each replica leaves it in Redis, counts
        # it, and still reads the other replica's load; Redis's memory stays about that one value
        atcs = self.start_cluster(replicas=2, sims=1, sim_extra=("--decode-ms", "100"))
        a, b = atcs
        # a guard for this machine should the bound fail: Redis drops a client past 512 MiB of answers
        redis_call(self.redis.port, "CONFIG", "SET", "client-output-buffer-limit", "normal 512mb 512mb 0")
        used_before = redis_memory(self.redis.port)
        big = 64 << 20
        self.assertEqual(redis_call(self.redis.port, "HSET", "atc:load", "hostile", b"atc1 1\n" + b"9" * (big - 7)), 1)
        # the write's own query buffer goes once the writer's connection is closed (Redis's cron)
        settled = wait_for(lambda: (lambda m: m if m < used_before + big + (24 << 20) else None)(
            redis_memory(self.redis.port)), timeout=10, what="Redis to free the write's query buffer")
        before = [self.cluster(x) for x in atcs]
        peak = [settled]

        def bounded(pred):
            peak[0] = max(peak[0], redis_memory(self.redis.port))
            return pred()

        for x, was in zip(atcs, before):
            wait_for(lambda: bounded(lambda: (lambda c: c["oversized_total"] > was["oversized_total"] and
                                              c["syncs_total"] >= was["syncs_total"] + 10)(self.cluster(x))),
                     timeout=15, what="10 more syncs, the oversized value counted")
        _, _, metrics = request("127.0.0.1", a.admin_port, "GET", "/metrics")
        self.assertRegex(metrics.decode(), r"atc_cluster_oversized_total [1-9]")

        def hold():
            try:
                chat(b.port, model="m", max_tokens=30)
            except OSError:
                pass

        clients = [threading.Thread(target=hold, daemon=True) for _ in range(4)]
        for t in clients:
            t.start()
        wait_for(lambda: bounded(lambda: (lambda p: p["s0"][1] == 4)(self.probe(a))), timeout=10,
                 what="A to see B's 4 requests in flight despite the hostile value")
        for x in atcs:
            self.assertEqual(self.cluster(x)["mode"], "shared")
        for t in clients:
            t.join(timeout=30)
        # not one copy of the value in an answer's output buffer
        self.assertLess(peak[0] - settled, 16 << 20, f"Redis used_memory from {settled} peaked at {peak[0]}")

    def wait_window_start(self):
        """A minute's window ends at the next whole minute: a test counting one window's budget keeps
        clear of the boundary."""
        left = 60 - time.time() % 60
        if left < 15:
            time.sleep(left + 0.2)

    def test_a_tenant_limit_holds_across_replicas(self):
        atcs = self.start_cluster(rpm=6)
        self.wait_window_start()
        codes, limited = [], None
        for k in range(18):
            status, headers, body = chat(atcs[k % 3].port, model="m", max_tokens=2, headers={"x-atc-tenant": "gold"})
            codes.append(status)
            if status == 429:
                limited = (headers, json.loads(body))
        self.assertEqual(codes.count(200), 6, codes)
        self.assertEqual(codes.count(429), 12, codes)
        headers, body = limited
        self.assertEqual(body["error"]["code"], "rate_limit_exceeded")
        self.assertGreaterEqual(int(headers["retry-after"]), 1)
        self.assertLessEqual(int(headers["retry-after"]), 60)
        # another tenant is not held back by gold's budget
        status, _, body = chat(atcs[0].port, model="m", max_tokens=2, headers={"x-atc-tenant": "silver"})
        self.assertEqual(status, 200, body)
        admitted = 0
        for a in atcs:
            _, _, text = request("127.0.0.1", a.admin_port, "GET", "/metrics")
            for line in text.decode().splitlines():
                if line.startswith('atc_tenant_requests_total{tenant="gold",result="admitted"}'):
                    admitted += int(line.split()[-1])
                if line.startswith('atc_tenant_remaining{tenant="gold",kind="requests"}'):
                    self.assertEqual(int(line.split()[-1]), 0, line)
            _, _, js = request("127.0.0.1", a.admin_port, "GET", "/admin/limits")
            self.assertEqual(json.loads(js)["mode"], "shared")
            gold = json.loads(js)["tenants"][0]
            self.assertEqual((gold["requests_remaining"], gold["tokens_remaining"]), (0, None))  # no token limit
        self.assertEqual(admitted, 6)

    def test_without_a_cluster_each_replica_has_the_whole_budget(self):
        atcs = self.start_cluster(rpm=3, cluster=False)
        self.wait_window_start()
        codes = [chat(atcs[k % 3].port, model="m", max_tokens=2, headers={"x-atc-tenant": "gold"})[0]
                 for k in range(12)]
        self.assertEqual(codes.count(200), 9, codes)  # 3 per replica: the documented local behaviour

    def test_redis_away_fails_no_request_and_its_return_resyncs(self):
        atcs = self.start_cluster(rpm=10000000)
        stop = threading.Event()
        failures, done = [], [0]

        def client(i):
            k = 0
            while not stop.is_set():
                status, _, body = chat(atcs[(i + k) % 3].port, model="m", max_tokens=2,
                                       headers={"x-atc-session": f"c{i}-{k % 5}", "x-atc-tenant": "gold"})
                k += 1
                done[0] += 1
                if status != 200:
                    failures.append((status, body))

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(4)]
        for t in threads:
            t.start()
        wait_for(lambda: done[0] > 30, timeout=20, what="traffic")
        self.redis.kill()
        wait_for(lambda: all(self.cluster(a)["mode"] == "local" for a in atcs), timeout=5,
                 what="every replica in local mode")
        before = done[0]
        wait_for(lambda: done[0] > before + 30, timeout=20, what="traffic without Redis")
        out = subprocess.run([ATC_BIN, "status", "--admin", f"127.0.0.1:{atcs[0].admin_port}"],
                             capture_output=True, text=True, timeout=10)
        self.assertIn("local mode", out.stdout)
        self.assertIn("down", out.stdout)
        _, _, metrics = request("127.0.0.1", atcs[0].admin_port, "GET", "/metrics")
        self.assertIn("atc_cluster_shared 0", metrics.decode())
        self.redis.start()
        wait_for(lambda: all(self.cluster(a)["mode"] == "shared" and len(self.cluster(a)["replicas"]) == 2
                             for a in atcs), timeout=10, what="every replica back in shared mode")
        # slow counts as away: a stopped Redis (connection open, no answer) sends them to local mode too
        self.redis.proc.send_signal(signal.SIGSTOP)
        wait_for(lambda: all(self.cluster(a)["mode"] == "local" for a in atcs), timeout=5,
                 what="local mode while Redis does not answer")
        before = done[0]
        wait_for(lambda: done[0] > before + 20, timeout=20, what="traffic while Redis hangs")
        self.redis.proc.send_signal(signal.SIGCONT)
        wait_for(lambda: all(self.cluster(a)["mode"] == "shared" for a in atcs), timeout=15,
                 what="shared mode once Redis answers again")
        stop.set()
        for t in threads:
            t.join(timeout=30)
        self.assertEqual(failures, [])
        out = subprocess.run([ATC_BIN, "status", "--admin", f"127.0.0.1:{atcs[0].admin_port}"],
                             capture_output=True, text=True, timeout=10)
        self.assertIn("shared mode", out.stdout)
        self.assertIn("r1", out.stdout)
        self.assertIn("r2", out.stdout)
        log = atcs[0].read_log()
        self.assertEqual(log.count("local mode (each replica"), 2, "logged once per outage")


if __name__ == "__main__":
    unittest.main()
