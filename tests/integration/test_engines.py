"""Fronting real engines (engine:, api_key_env:, forward_authorization:): atc serve in front of a small fake
server in this process that behaves like the engine where atc's handling differs (SGLang's slow /health,
llama.cpp's loading 503, vLLM's --api-key), on free loopback ports, with deadlines rather than sleeps.
Each behaviour is also run with `engine: openai`, which must show the old verdict: the test can fail.
Also: every YAML block of docs/engines.md passes `atc check`.
"""

import http.server
import json
import os
import re
import secrets
import subprocess
import threading
import time
import unittest

from harness import ATC_BIN, SOURCE_DIR, AtcTestCase, chat, request, wait_for

MODEL = "llama-3-8b"


class FakeEngine:
    """An inference server in a thread. slow_health: seconds /health takes (SGLang: one generation and a
    one-second poll). loading: until loaded is set, every path but /, /models and /v1/models answers
    llama.cpp's 503 "Loading model". key: every /v1 path needs "Authorization: Bearer <key>", as vLLM's
    --api-key. seen_auth keeps the Authorization header of each chat request (None when absent)."""

    def __init__(self, slow_health=0.0, loading=False, key=None):
        self.slow_health, self.key = slow_health, key
        self.loaded = threading.Event()
        if not loading:
            self.loaded.set()
        self.health_calls = 0
        self.seen_auth = []
        self.lock = threading.Lock()
        engine = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def answer(self, status, body):
                data = json.dumps(body).encode() if not isinstance(body, bytes) else body
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def handle_any(self):
                n = int(self.headers.get("Content-Length") or 0)
                if n:
                    self.rfile.read(n)
                path = self.path.split("?")[0]
                if path == "/v1/chat/completions":
                    with engine.lock:
                        engine.seen_auth.append(self.headers.get("Authorization"))
                if not engine.loaded.is_set() and path not in ("/", "/models", "/v1/models"):
                    return self.answer(503, {"error": {"code": 503, "message": "Loading model",
                                                       "type": "unavailable_error"}})
                if engine.key and path.startswith("/v1") and \
                        self.headers.get("Authorization") != "Bearer " + engine.key:
                    return self.answer(401, {"error": "Unauthorized"})
                if path == "/health":
                    with engine.lock:
                        engine.health_calls += 1
                    time.sleep(engine.slow_health)  # the fake server's own pace, not the test's
                    return self.answer(200, b"")
                if path == "/v1/models":
                    return self.answer(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
                if path == "/metrics":
                    return self.answer(200, b"vllm:num_requests_running 0\n")
                if path == "/v1/chat/completions":
                    return self.answer(200, {"id": "x", "object": "chat.completion", "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": "hi"},
                         "finish_reason": "stop"}]})
                return self.answer(404, {"error": "not found"})

            do_GET = do_POST = handle_any

        class Server(http.server.ThreadingHTTPServer):
            def handle_error(self, request, client_address):
                pass  # atc closing a probe's connection early is not news

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def config(url, engine, extra_ep="", top=""):
    """One model, one endpoint; short intervals; the live timeout left to the engine's profile."""
    return f"""
listen: 127.0.0.1:0
admin: 127.0.0.1:0
{top}
health:
  fast_interval: 50ms
  down_interval: 200ms
  live: {{interval: 200ms}}
  ready: {{interval: 200ms, timeout: 500ms}}
  deep: {{enabled: false}}
  scrape: {{enabled: false}}
models:
  - name: {MODEL}
    engine: {engine}
    endpoints:
      - {{id: e1, url: "{url}"{extra_ep}}}
"""


def admin_json(atc, path):
    status, _, body = request("127.0.0.1", atc.admin_port, "GET", path)
    assert status == 200, body
    return json.loads(body)


class EngineTest(AtcTestCase):
    def fake(self, **kw):
        f = FakeEngine(**kw)
        self.addCleanup(f.stop)
        return f

    def state(self, atc):
        return atc.endpoints()["e1"]["state"]

    def test_sglang_slow_health_stays_healthy(self):
        """SGLang's /health takes over a second: healthy with engine: sglang (a 5 s live timeout),
        unhealthy with engine: openai (1 s)."""
        f = self.fake(slow_health=1.2)
        atc = self.start_atc(config(f.url, "sglang"))
        wait_for(lambda: self.state(atc) == "healthy", timeout=10, what="e1 healthy")
        calls = f.health_calls
        wait_for(lambda: f.health_calls >= calls + 3, timeout=15, what="three more slow /health answers")
        ep = atc.endpoints()["e1"]
        self.assertEqual(ep["state"], "healthy", ep)
        self.assertEqual(ep["engine"], "sglang")
        self.assertTrue(ep["live"], ep)

        f2 = self.fake(slow_health=1.2)
        atc2 = self.start_atc(config(f2.url, "openai"), name="atc2")
        wait_for(lambda: self.state(atc2) == "unhealthy", timeout=10, what="e1 unhealthy with engine: openai")
        self.assertIn("no answer within 1000ms", atc2.endpoints()["e1"]["last_error"])

    def test_llamacpp_loading_is_starting_then_healthy(self):
        """llama.cpp's 503 "Loading model" while /v1/models answers: starting (and no panic) with
        engine: llamacpp, healthy once loaded; unhealthy (panic) with engine: openai."""
        f = self.fake(loading=True)
        atc = self.start_atc(config(f.url, "llamacpp"))
        wait_for(lambda: f.health_calls == 0 and admin_json(atc, "/admin/endpoints")["health"]["probes_total"]
                 >= 6, timeout=10, what="six probes of a loading server")
        data = admin_json(atc, "/admin/endpoints")
        ep = data["endpoints"][0]
        self.assertEqual(ep["state"], "starting", ep)
        self.assertIn("503", ep["last_error"])
        self.assertFalse(data["health"]["models"][0]["panic"], data["health"])
        self.assertEqual(data["health"]["panics_total"], 0)
        f.loaded.set()
        wait_for(lambda: self.state(atc) == "healthy", timeout=10, what="e1 healthy once loaded")

        f2 = self.fake(loading=True)
        atc2 = self.start_atc(config(f2.url, "openai"), name="atc2")
        wait_for(lambda: self.state(atc2) == "unhealthy", timeout=10, what="e1 unhealthy with engine: openai")
        wait_for(lambda: admin_json(atc2, "/admin/endpoints")["health"]["models"][0]["panic"], timeout=5,
                 what="panic with engine: openai")

    def test_refused_connections_within_grace_are_starting(self):
        """vLLM and TGI refuse connections until they are up: starting within health.startup_grace,
        unhealthy with startup_grace: 0s."""
        from harness import dead_port
        url = f"http://127.0.0.1:{dead_port()}"
        atc = self.start_atc(config(url, "vllm"))
        wait_for(lambda: admin_json(atc, "/admin/endpoints")["health"]["probes_total"] >= 6, timeout=10,
                 what="six probes")
        self.assertEqual(self.state(atc), "starting")
        atc2 = self.start_atc(config(url, "vllm").replace("health:\n", "health:\n  startup_grace: 0s\n"),
                              name="atc2")
        wait_for(lambda: self.state(atc2) == "unhealthy", timeout=10, what="unhealthy without a grace")

    def test_api_key(self):
        """A server that needs a key: refused without api_key_env (a configuration error on the endpoint,
        502 to the client), served with it; the key appears in no output; the client's Authorization is
        not forwarded."""
        key = "sk-atc-test-" + secrets.token_hex(16)
        os.environ["ATC_TEST_ENGINE_KEY"] = key
        self.addCleanup(os.environ.pop, "ATC_TEST_ENGINE_KEY", None)
        client_auth = {"Authorization": "Bearer client-token-123"}

        f = self.fake(key=key)
        atc = self.start_atc(config(f.url, "vllm"))
        wait_for(lambda: "refused atc's credentials" in atc.endpoints()["e1"]["last_error"], timeout=10,
                 what="the credentials error")
        ep = atc.endpoints()["e1"]
        self.assertEqual(ep["state"], "unhealthy")
        self.assertIn("401", ep["last_error"])
        self.assertIn("api_key_env", ep["last_error"])
        self.assertEqual(ep["api_key"], "not set")
        status, _, body = chat(atc.port, headers=client_auth)
        self.assertEqual(status, 502, body)
        err = json.loads(body)["error"]
        self.assertEqual(err["code"], "upstream_credentials")
        self.assertEqual(f.seen_auth, [None])  # the client's header stayed with atc

        access_log = os.path.join(self.tmp.name, "access.log")
        f2 = self.fake(key=key)
        atc2 = self.start_atc(config(f2.url, "vllm", extra_ep=", api_key_env: ATC_TEST_ENGINE_KEY",
                                     top=f"access_log: {access_log}"), name="atc2")
        wait_for(lambda: self.state(atc2) == "healthy", timeout=10, what="e1 healthy with the key")
        status, _, body = chat(atc2.port, headers=client_auth)
        self.assertEqual(status, 200, body)
        self.assertEqual(f2.seen_auth, ["Bearer " + key])  # atc's key, not the client's
        ep = atc2.endpoints()["e1"]
        self.assertEqual((ep["api_key"], ep["api_key_source"]), ("set", "env ATC_TEST_ENGINE_KEY"))

        outputs = {
            "/admin/endpoints": request("127.0.0.1", atc2.admin_port, "GET", "/admin/endpoints")[2].decode(),
            "/admin/config": request("127.0.0.1", atc2.admin_port, "GET", "/admin/config")[2].decode(),
        }
        st = subprocess.run([ATC_BIN, "status", "--admin", f"127.0.0.1:{atc2.admin_port}"], capture_output=True,
                            text=True, timeout=10)
        self.assertEqual(st.returncode, 0, st.stderr)
        self.assertIn("vllm", st.stdout)
        outputs["atc status"] = st.stdout + st.stderr
        ck = subprocess.run([ATC_BIN, "check", "-c", atc2.config_path], capture_output=True, text=True,
                            timeout=10, cwd=SOURCE_DIR)
        self.assertEqual(ck.returncode, 0, ck.stderr)
        outputs["atc check"] = ck.stdout + ck.stderr
        status_page = request("127.0.0.1", atc2.admin_port, "GET", "/")[2].decode(errors="replace")
        outputs["status page"] = status_page
        for p in (atc, atc2):
            p.stop()
        outputs["atc log"] = atc.read_log() + atc2.read_log()
        with open(access_log) as fh:
            outputs["access log"] = fh.read()
        self.assertTrue(outputs["access log"].strip(), "the access log has the request")
        for where, text in outputs.items():
            self.assertNotIn(key, text, f"the key leaked into {where}")
            self.assertNotIn(key[12:], text, f"part of the key leaked into {where}")

    def test_forward_authorization(self):
        """forward_authorization: true sends the client's own header (and a 401 is then the client's)."""
        f = self.fake(key="client-token-123")
        atc = self.start_atc(config(f.url, "openai", extra_ep=", forward_authorization: true")
                             .replace("  ready: {interval: 200ms, timeout: 500ms}", "  ready: {enabled: false}"))
        wait_for(lambda: self.state(atc) == "healthy", timeout=10, what="e1 healthy")
        status, _, body = chat(atc.port, headers={"Authorization": "Bearer client-token-123"})
        self.assertEqual(status, 200, body)
        status, _, body = chat(atc.port, headers={"Authorization": "Bearer wrong"})
        self.assertEqual(status, 401, body)
        self.assertEqual(f.seen_auth, ["Bearer client-token-123", "Bearer wrong"])

    def test_check_errors(self):
        """atc check: an unknown engine and a missing key are errors at their line:col; the key's value is
        never printed."""
        path = os.path.join(self.tmp.name, "bad.yaml")
        with open(path, "w") as fh:
            fh.write(f"models:\n  - name: m\n    engine: vllmx\n    endpoints:\n"
                     f"      - {{id: a, url: \"http://127.0.0.1:1\", api_key_env: ATC_NO_SUCH_VARIABLE_X}}\n"
                     f"      - {{id: b, url: \"http://127.0.0.1:2\", api_key_file: no-such-file}}\n")
        out = subprocess.run([ATC_BIN, "check", "-c", path], capture_output=True, text=True, timeout=10)
        self.assertEqual(out.returncode, 1, out.stdout)
        self.assertIn(f"{path}:3:13: key 'models[0].engine': must be one of: openai, vllm, sglang, llamacpp, "
                      f"tgi (got 'vllmx')", out.stderr)
        self.assertRegex(out.stderr, re.escape(path) + r":5:\d+: key 'models\[0\]\.endpoints\[0\]\.api_key_env': "
                         r"variable 'ATC_NO_SUCH_VARIABLE_X' is not set")
        self.assertRegex(out.stderr, re.escape(path) + r":6:\d+: key 'models\[0\]\.endpoints\[1\]\.api_key_file': "
                         r"file 'no-such-file' No such file")


class DocsTest(unittest.TestCase):
    def test_every_yaml_block_of_docs_engines_passes_atc_check(self):
        with open(os.path.join(SOURCE_DIR, "docs", "engines.md")) as fh:
            blocks = re.findall(r"```yaml\n(.*?)```", fh.read(), re.S)
        self.assertGreaterEqual(len(blocks), 4)
        env = dict(os.environ, VLLM_API_KEY="k1", SGLANG_API_KEY="k2", LLAMA_API_KEY="k3", TGI_API_KEY="k4")
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            for i, block in enumerate(blocks):
                path = os.path.join(d, f"block{i}.yaml")
                with open(path, "w") as fh:
                    fh.write(block)
                out = subprocess.run([ATC_BIN, "check", "-c", path], capture_output=True, text=True, timeout=10,
                                     env=env, cwd=SOURCE_DIR)
                self.assertEqual(out.returncode, 0, f"block {i}:\n{block}\n{out.stderr}")


if __name__ == "__main__":
    unittest.main()
