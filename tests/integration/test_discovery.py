"""DNS discovery (discover: on a model): the addresses a name resolves to become endpoints that join
through `starting` and serve; an address gone from two resolutions in a row drains; a resolver that
answers SERVFAIL or stops answering keeps the last good set, with the failures counted and logged once.
A tiny DNS server in the test answers A queries from a dict the test changes; atc's resolver: points at
it. Two `atc sim` processes on 127.0.0.1 and 127.0.0.2 with the same port (A records carry no port).
With srv: the same server answers SRV queries (RFC 2782): two targets on different ports, one with its
address in the additional section as Kubernetes' DNS sends it, one that atc must look up itself."""

import json
import os
import re
import socketserver
import struct
import threading

from harness import ATC_BIN, AtcTestCase, Process, chat, request, run_file, wait_for

NAME = "llm.test"
SRV_NAME = "_http._tcp.llm.test"


def encode_name(name):
    return b"".join(bytes([len(label)]) + label.encode() for label in name.split(".")) + b"\0"


class Dns:
    """Answers A queries for NAME from self.records, and for other names from self.hosts; AAAA with no
    records. SRV queries for SRV_NAME from self.srv, a list of (port, target), with the A records of the
    targets in self.glue in the additional section. mode: ok, servfail, silent, truncated (TC set, no
    records)."""

    def __init__(self):
        self.records = []
        self.hosts = {}
        self.srv = []
        self.glue = set()
        self.mode = "ok"
        self.queries = 0  # A queries seen (for NAME)
        self.srv_queries = 0
        self.asked = []  # (name, qtype) of every query
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
        name = ".".join(labels)
        with self.lock:
            self.asked.append((name, qtype))
            self.queries += qtype == 1 and name == NAME
            self.srv_queries += qtype == 33
            mode, records, hosts = self.mode, list(self.records), dict(self.hosts)
            srv, glue = list(self.srv), set(self.glue)
        if mode == "silent":
            return None
        if mode == "servfail":
            return struct.pack("!HHHHHH", qid, 0x8182, 1, 0, 0, 0) + question
        if mode == "truncated" and qtype == 33:
            return struct.pack("!HHHHHH", qid, 0x8380, 1, 0, 0, 0) + question

        def a(owner, ip):
            return owner + struct.pack("!HHIH", 1, 1, 5, 4) + bytes(int(x) for x in ip.split("."))

        if qtype == 33 and name == SRV_NAME:
            answers, extra = b"", b""
            for port, target in srv:
                rdata = struct.pack("!HHH", 10, 50, port) + encode_name(target)
                answers += struct.pack("!HHHIH", 0xC00C, 33, 1, 5, len(rdata)) + rdata
                if target in glue:
                    extra += b"".join(a(encode_name(target), ip) for ip in hosts.get(target, []))
            nextra = sum(len(hosts.get(t, [])) for _, t in srv if t in glue)
            return struct.pack("!HHHHHH", qid, 0x8580, 1, len(srv), 0, nextra) + question + answers + extra
        ips = (records if name == NAME else hosts.get(name, [])) if qtype == 1 else []
        out = struct.pack("!HHHHHH", qid, 0x8180, 1, len(ips), 0, 0) + question
        for ip in ips:
            out += a(b"\xc0\x0c", ip)
        return out

    def asked_for(self, name, qtype):
        with self.lock:
            return sum(1 for q in self.asked if q == (name, qtype))

    def set(self, mode=None, records=None, srv=None):
        with self.lock:
            if mode is not None:
                self.mode = mode
            if records is not None:
                self.records = records
            if srv is not None:
                self.srv = srv

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

    def test_srv_targets_on_two_ports_serve_and_a_record_removed_drains(self):
        a = self.start_sim("a", extra=["--decode-ms", "1"])
        b = self.start_sim("b", extra=["--decode-ms", "1"])
        ta, tb = "a.pods.llm.test", "b.pods.llm.test"
        self.dns.hosts = {ta: ["127.0.0.1"], tb: ["127.0.0.1"]}
        self.dns.glue = {ta}  # b's address is not in the answer: atc asks for it
        self.dns.set(srv=[(a.port, ta), (b.port, tb)])
        atc = self.start_atc(f"listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\nworkers: 2\n{HEALTH}"
                             f"models:\n  - name: llama-3-8b\n    discover: {{srv: {SRV_NAME}, "
                             f"interval: 200ms, resolver: '127.0.0.1:{self.dns.port}'}}\n")
        ids = {f"llama-3-8b-127.0.0.1-{a.port}", f"llama-3-8b-127.0.0.1-{b.port}"}
        wait_for(lambda: {i for i, e in atc.endpoints().items() if e["state"] == "healthy"} == ids,
                 what="both SRV targets healthy")
        self.assertEqual({e["origin"] for e in atc.endpoints().values()}, {"dns"})
        served = {chat(atc.port, max_tokens=1)[1]["x-atc-endpoint"] for _ in range(40)}
        self.assertEqual(served, ids)
        d = self.discovery(atc)
        self.assertEqual((d["srv"], d["dns"], d["port"], sorted(d["addresses"]), d["failing"]),
                         (SRV_NAME, None, None, sorted([f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"]), False))
        self.assertEqual(self.dns.asked_for(ta, 1), 0)  # its A record came in the additional section
        self.assertGreater(self.dns.asked_for(tb, 1), 0)

        # b's record gone: its endpoint drains after two answers without it; a serves on
        self.dns.set(srv=[(a.port, ta)])
        gone = f"llama-3-8b-127.0.0.1-{b.port}"
        wait_for(lambda: gone not in atc.endpoints(), what="the removed target drained")
        for _ in range(10):
            status, headers, _ = chat(atc.port, max_tokens=1)
            self.assertEqual((status, headers["x-atc-endpoint"]), (200, f"llama-3-8b-127.0.0.1-{a.port}"))
        self.assertIn(f"127.0.0.1:{b.port} is gone from {SRV_NAME}: endpoint {gone} drains", atc.read_log())

        # an answer with TC set (atc does not ask again over TCP) fails: the set stays, the failure shows
        self.dns.set(mode="truncated")
        before = self.failures(atc)
        wait_for(lambda: self.failures(atc) >= before + 2, what="truncated answers counted")
        d = self.discovery(atc)
        self.assertEqual((d["failing"], d["addresses"]), (True, [f"127.0.0.1:{a.port}"]))
        self.assertIn("truncated", d["last_error"])
        self.assertEqual(set(atc.endpoints()), {f"llama-3-8b-127.0.0.1-{a.port}"})
        self.assertIn(f"resolving {SRV_NAME} failed (answer truncated", atc.read_log())


if __name__ == "__main__":
    raise SystemExit(run_file(os.path.abspath(__file__)))
