"""DNS discovery (discover: on a model): the addresses a name resolves to become endpoints that join
through `starting` and serve; an address gone from two resolutions in a row drains; a resolver that
answers SERVFAIL or stops answering keeps the last good set, with the failures counted and logged once.
A tiny DNS server in the test answers A queries from a dict the test changes; atc's resolver: points at
it. Two `atc sim` processes on 127.0.0.1 and 127.0.0.2 with the same port (A records carry no port)."""

import json
import os
import re
import socketserver
import struct
import threading

from harness import ATC_BIN, AtcTestCase, Process, chat, request, run_file, wait_for

NAME = "llm.test"


class Dns:
    """Answers A queries for NAME from self.records; AAAA with no records. mode: ok, servfail, silent."""

    def __init__(self):
        self.records = []
        self.mode = "ok"
        self.queries = 0  # A queries seen
        self.lock = threading.Lock()
        dns = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                data, sock = self.request
                reply = dns.answer(data)
                if reply is not None:
                    sock.sendto(reply, self.client_address)

        self.server = socketserver.ThreadingUDPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, data):
        qid, _flags = struct.unpack("!HH", data[:4])
        i = 12
        labels = []
        while data[i] != 0:
            labels.append(data[i + 1:i + 1 + data[i]].decode().lower())
            i += 1 + data[i]
        qtype = struct.unpack("!H", data[i + 1:i + 3])[0]
        question = data[12:i + 5]
        with self.lock:
            if qtype == 1:
                self.queries += 1
            mode, records = self.mode, list(self.records)
        if mode == "silent":
            return None
        if mode == "servfail":
            return struct.pack("!HHHHHH", qid, 0x8182, 1, 0, 0, 0) + question
        answers = [ip for ip in records if qtype == 1 and ".".join(labels) == NAME]
        out = struct.pack("!HHHHHH", qid, 0x8180, 1, len(answers), 0, 0) + question
        for ip in answers:
            out += struct.pack("!HHHIH", 0xC00C, 1, 1, 0, 4) + bytes(int(x) for x in ip.split("."))
        return out

    def set(self, mode=None, records=None):
        with self.lock:
            if mode is not None:
                self.mode = mode
            if records is not None:
                self.records = records

    def count(self):
        with self.lock:
            return self.queries

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


HEALTH = """
health:
  failure_threshold: 2
  recovery_threshold: 2
  fast_interval: 50ms
  down_interval: 200ms
  live: {interval: 100ms, timeout: 300ms}
  ready: {interval: 100ms, timeout: 300ms}
"""


class DiscoveryTest(AtcTestCase):
    def setUp(self):
        super().setUp()
        self.dns = Dns()
        self.addCleanup(self.dns.stop)

    def sims(self):
        a = self.start_sim("a", extra=["--decode-ms", "1"])
        b = Process([ATC_BIN, "sim", "--listen", f"127.0.0.2:{a.port}", "--model", "llama-3-8b", "--decode-ms",
                     "1"], self.tmp.name, "b")
        self.processes.append(b)
        return a.port

    def start(self, port):
        return self.start_atc(f"listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\nworkers: 2\n{HEALTH}"
                              f"models:\n  - name: llama-3-8b\n    discover: {{dns: {NAME}, port: {port}, "
                              f"interval: 200ms, resolver: '127.0.0.1:{self.dns.port}'}}\n")

    def discovery(self, atc):
        status, _, body = request("127.0.0.1", atc.admin_port, "GET", "/admin/endpoints")
        self.assertEqual(status, 200, body)
        return json.loads(body)["discovery"][0]

    def failures(self, atc):
        status, _, body = request("127.0.0.1", atc.admin_port, "GET", "/metrics")
        self.assertEqual(status, 200)
        m = re.search(rb'^atc_discovery_failures_total\{model="llama-3-8b"\} (\d+)$', body, re.M)
        self.assertIsNotNone(m, body[-2000:])
        return int(m.group(1))

    def both_serve(self, atc, port):
        ids = {f"llama-3-8b-127.0.0.1-{port}", f"llama-3-8b-127.0.0.2-{port}"}
        wait_for(lambda: {i for i, e in atc.endpoints().items() if e["state"] == "healthy"} == ids,
                 what="both discovered endpoints healthy")
        self.assertEqual({e["origin"] for e in atc.endpoints().values()}, {"dns"})
        served = {chat(atc.port, max_tokens=1)[1]["x-atc-endpoint"] for _ in range(40)}
        self.assertEqual(served, ids)
        return ids

    def test_two_records_serve_and_one_removed_drains_after_two_resolutions(self):
        port = self.sims()
        self.dns.set(records=["127.0.0.1", "127.0.0.2"])
        atc = self.start(port)
        self.both_serve(atc, port)
        d = self.discovery(atc)
        self.assertEqual((d["dns"], d["port"], sorted(d["addresses"]), d["failing"]),
                         (NAME, port, ["127.0.0.1", "127.0.0.2"], False))
        self.dns.set(records=["127.0.0.1"])
        asked = self.dns.count()
        gone = f"llama-3-8b-127.0.0.2-{port}"
        wait_for(lambda: gone not in atc.endpoints(), what="the removed address drained")
        self.assertGreaterEqual(self.dns.count() - asked, 2)  # not on the first resolution without it
        self.assertEqual(self.discovery(atc)["addresses"], ["127.0.0.1"])
        for _ in range(10):
            status, headers, _ = chat(atc.port, max_tokens=1)
            self.assertEqual((status, headers["x-atc-endpoint"]), (200, f"llama-3-8b-127.0.0.1-{port}"))
        self.assertIn(f"127.0.0.2 is gone from {NAME}: endpoint {gone} drains", atc.read_log())

    def test_servfail_and_silence_keep_the_set_and_count_failures(self):
        port = self.sims()
        self.dns.set(records=["127.0.0.1", "127.0.0.2"])
        atc = self.start(port)
        ids = self.both_serve(atc, port)
        self.assertEqual(self.failures(atc), 0)
        for mode in ("servfail", "silent"):
            self.dns.set(mode=mode)
            before = self.failures(atc)
            wait_for(lambda: self.failures(atc) >= before + 3, timeout=20, what=f"failures counted ({mode})")
            self.assertEqual(set(atc.endpoints()), ids)
            d = self.discovery(atc)
            self.assertEqual((d["failing"], sorted(d["addresses"])), (True, ["127.0.0.1", "127.0.0.2"]))
            self.assertTrue(d["last_error"])
            served = {chat(atc.port, max_tokens=1)[1]["x-atc-endpoint"] for _ in range(20)}
            self.assertEqual(served, ids)
        # one line for the whole episode (servfail then silence), one when it answers again
        self.assertEqual(atc.read_log().count(f"resolving {NAME} failed"), 1, atc.read_log()[-3000:])
        self.dns.set(mode="ok")
        wait_for(lambda: not self.discovery(atc)["failing"], timeout=20, what="resolves again")
        self.assertIn(f"{NAME} resolves again (2 address(es))", atc.read_log())
        self.assertEqual(set(atc.endpoints()), ids)


if __name__ == "__main__":
    raise SystemExit(run_file(os.path.abspath(__file__)))
