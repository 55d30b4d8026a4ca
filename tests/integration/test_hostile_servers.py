"""Hostile servers: each misbehaviour is a defined answer to the client, counted against the server,
never a hang. A tiny raw-socket server plays the misbehaving inference server."""

import json
import time
import unittest

from harness import AtcTestCase, RawServer, post_raw, chat, request, stream_events


def BadServer(behaviour):
    """A raw-socket server answering every request with @p behaviour(conn)."""
    return RawServer(lambda conn, body: behaviour(conn))


def garbage(conn):
    conn.sendall(b"this is not HTTP at all\r\n\r\n")


def endless_header(conn):
    conn.sendall(b"HTTP/1.1 200 OK\r\nX-Long: ")
    for _ in range(200):  # 200 KiB of one header, more than atc's 64 KiB limit
        conn.sendall(b"a" * 1024)
    time.sleep(2)


def truncated_chunked(conn):
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                 b"40\r\n{\"id\":\"x\",\"object\":\"chat.completion\",")  # promises 64 bytes, sends fewer


def stall_mid_stream(conn):
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
    event = b'data: {"choices":[{"delta":{"content":"hi "}}]}\n\n'
    conn.sendall(b"%x\r\n%s\r\n" % (len(event), event))
    time.sleep(5)  # then nothing


def invalid_sse(conn):
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
    for piece in (b'data: {"choices":[{"delta":{"content":"ok "}}]}\n\n', b"<html>502 Bad Gateway</html>\n\n"):
        conn.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        time.sleep(0.05)
    conn.sendall(b"0\r\n\r\n")


def bare_cr_in_a_header(conn):
    body = b'{"id":"x","object":"chat.completion","choices":[]}'
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\rX-Injected: 1\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))


def stall_after_json_headers(conn):
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"id\"")
    time.sleep(3)  # then nothing: the idle timeout ends it before the client saw a byte


class HostileServerTest(AtcTestCase):
    def atc_for(self, server):
        return self.start_atc(f"""
            listen: 127.0.0.1:0
            admin: 127.0.0.1:0
            health: {{enabled: false}}
            upstream:
              first_byte_timeout: 1s
              idle_timeout: 500ms
              tries: 1
            models:
              - name: m
                endpoints:
                  - {{id: bad, url: "http://127.0.0.1:{server.port}"}}
        """)

    def assert_counted(self, atc):
        ep = atc.endpoints()["bad"]
        self.assertEqual(ep["errors_total"], 1)  # counted against the server
        self.assertEqual(ep["inflight"], 0)  # and its slot freed

    def test_a_timeout_after_the_upstream_headers_is_one_clean_504(self):
        import http.client
        atc = self.atc_for(BadServer(stall_after_json_headers))
        conn = http.client.HTTPConnection("127.0.0.1", atc.port, timeout=10)
        conn.request("POST", "/v1/chat/completions", body=json.dumps(
            {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}),
            headers={"content-type": "application/json"})
        resp = conn.getresponse()
        body = resp.read()
        self.assertEqual(resp.status, 504, body)
        types = [v for k, v in resp.getheaders() if k.lower() == "content-type"]
        self.assertEqual(types, ["application/json"], "one Content-Type, atc's, not the upstream's too")
        self.assertEqual(json.loads(body)["error"]["type"], "timeout")
        conn.close()

    def test_garbage_instead_of_http_is_502(self):
        atc = self.atc_for(BadServer(garbage))
        status, _, body = chat(atc.port, model="m")
        self.assertEqual(status, 502)
        self.assertIn("invalid HTTP response", json.loads(body)["error"]["message"])
        self.assert_counted(atc)

    def test_a_bare_cr_in_an_upstream_header_is_502(self):
        # The Content-Type is passed on: a bare CR in it would reach the client, a line break to some.
        atc = self.atc_for(BadServer(bare_cr_in_a_header))
        status, headers, body = chat(atc.port, model="m")
        self.assertEqual(status, 502, body)
        self.assertNotIn("\r", headers.get("content-type", ""))
        self.assertIn("invalid HTTP response", json.loads(body)["error"]["message"])
        self.assert_counted(atc)

    def test_an_endless_header_is_502_not_a_hang(self):
        atc = self.atc_for(BadServer(endless_header))
        start = time.monotonic()
        status, _, body = chat(atc.port, model="m")
        self.assertEqual(status, 502)
        self.assertLess(time.monotonic() - start, 5)
        self.assert_counted(atc)

    def test_a_truncated_chunked_body_reaches_the_client_as_truncated(self):
        atc = self.atc_for(BadServer(truncated_chunked))
        sock = post_raw(atc.port, {"model": "m", "messages": [{"role": "user", "content": "x"}]}, timeout=10)
        got = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
        sock.close()
        # The connection is cut without the chunked terminator (atc may not even have flushed the status
        # line yet): no client can take it for a whole answer.
        self.assertTrue(got == b"" or got.startswith(b"HTTP/1.1 200"), got[:100])
        self.assertFalse(got.endswith(b"0\r\n\r\n"), got[-100:])
        self.assert_counted(atc)

    def test_a_stream_that_stalls_ends_with_an_error_event(self):
        atc = self.atc_for(BadServer(stall_mid_stream))
        start = time.monotonic()
        status, _, events = stream_events(atc.port, {"model": "m", "stream": True,
                                                     "messages": [{"role": "user", "content": "x"}]})
        self.assertEqual(status, 200)
        self.assertLess(time.monotonic() - start, 4)  # the idle timeout (500 ms), not the server's 5 s
        self.assertIn("hi", events[0][1])
        err = json.loads(events[-1][1])["error"]
        self.assertEqual((err["type"], err["code"]), ("timeout", "upstream_timeout"))
        self.assert_counted(atc)
        # The client saw a 200, then the error event: the request metrics count it as broken, so an
        # error-ratio panel shows the incident.
        _, _, metrics = request("127.0.0.1", atc.admin_port, "GET", "/metrics")
        self.assertIn(b'atc_requests_broken_total{model="m",endpoint="bad"} 1\n', metrics)
        # atc still serves: the same client can ask again and get the same defined answer
        status, _, _ = stream_events(atc.port, {"model": "m", "stream": True, "messages": []})
        self.assertEqual(status, 200)

    def test_a_200_with_an_invalid_event_stream_ends_with_an_error_event(self):
        atc = self.atc_for(BadServer(invalid_sse))
        status, _, events = stream_events(atc.port, {"model": "m", "stream": True,
                                                     "messages": [{"role": "user", "content": "x"}]})
        self.assertEqual(status, 200)
        self.assertIn("ok", events[0][1])  # the valid part went through
        self.assertFalse(any("html" in data for _, data in events))  # the garbage did not
        err = json.loads(events[-1][1])["error"]
        self.assertIn("invalid event stream", err["message"])
        self.assert_counted(atc)


if __name__ == "__main__":
    unittest.main(verbosity=2)
