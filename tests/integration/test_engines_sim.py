"""Each engine end to end: atc serve in front of `atc sim --engine vllm|sglang|llamacpp|tgi` (real processes
on loopback, port 0 and ready files, deadlines rather than sleeps).

For every engine: a stream's TTFT in the access log is the first event the client saw (the simulated
prefill makes it come about a second after the headers); a start-up is `starting`, then `healthy`, and
never counts towards panic; the key of --api-key, given to atc by api_key_env, gets 200 where its absence
gets the engine's 401 (a 502 upstream_credentials to the client) and appears in no output. SGLang's slow
/health stays healthy; TGI's overload 429 is retried on the other server; TGI's errors reach the client in
OpenAI's shape. Where cheap, the contrary runs too (engine: openai, tries: 1, the sim itself), so each test
can fail. Also: `engine:` in a simulate: entry is the profile of the endpoints it starts.
"""

import json
import os
import secrets
import subprocess
import threading
import time
import unittest

from harness import (ATC_BIN, SLACK, SOURCE_DIR, AtcTestCase, chat, request, stream_events, wait_access_lines,
                     wait_for)

MODEL = "llama-3-8b"
ENGINES = ("vllm", "sglang", "llamacpp", "tgi")
PREFILL_TPS = 2000  # with PROMPT_WORDS, the first event comes about a second after the request
PROMPT_WORDS = 1600

POLICY = """
-- the endpoints in their configured order: the first that can take it (tried ones cannot)
return function(req, fleet)
  for _, ep in ipairs(fleet:endpoints(req.model)) do
    if ep.available then return ep end
  end
  return atc.queue()
end
"""


def config(urls, engine, *, top="", model_extra="", health_extra="", scrape=False):
    """One model of the sims at @p urls (endpoints e0, e1, ...) with short health intervals; the live
    timeout and the start-up grace left to the engine's profile."""
    eps = "\n".join(f'      - {{id: e{i}, url: "{u}"}}' for i, u in enumerate(urls))
    return f"""
listen: 127.0.0.1:0
admin: 127.0.0.1:0
{top}
health:
  fast_interval: 50ms
  down_interval: 100ms
  live: {{interval: 100ms}}
  ready: {{interval: 100ms, timeout: 2s}}
  deep: {{enabled: false}}
  scrape: {{{"interval: 200ms" if scrape else "enabled: false"}}}
{health_extra}
models:
  - name: {MODEL}
    engine: {engine}
{model_extra}
    endpoints:
{eps}
"""


def admin_json(atc, path):
    status, _, body = request("127.0.0.1", atc.admin_port, "GET", path)
    assert status == 200, body
    return json.loads(body)


def long_prompt(tag):
    """A prompt of PROMPT_WORDS words that shares no prefix with another tag's (no cache hit)."""
    return f"{tag} " + "word " * PROMPT_WORDS


class EnginesSimTest(AtcTestCase):
    def sim(self, engine, *flags, name=None):
        return self.start_sim(name=name or f"sim-{engine}", model=MODEL, extra=("--engine", engine, *flags))

    def wait_healthy(self, atc, ep="e0", timeout=15):
        wait_for(lambda: atc.endpoints()[ep]["state"] == "healthy", timeout=timeout, what=f"{ep} healthy")

    # ---- TTFT ----

    def ttft_through_atc(self, engine, sim_flags=(), atc_top="", model_extra="", headers_late=False):
        """Streams one long-prompt request through atc to a sim of @p engine; returns (the client's
        seconds to the first event, the access log's line)."""
        sim = self.sim(engine, "--prefill-tps", str(PREFILL_TPS), *sim_flags)
        log = os.path.join(self.tmp.name, f"access-{engine}.log")
        atc = self.start_atc(config([sim.url], engine, top=f"access_log: {log}\n{atc_top}",
                                    model_extra=model_extra), name=f"atc-{engine}")
        self.wait_healthy(atc)
        # the sim itself: headers at once (llama.cpp: with the first token), the first event after prefill
        status, _, events = stream_events(sim.port, {"model": MODEL, "stream": True, "max_tokens": 4,
                                                     "messages": [{"role": "user", "content": long_prompt("direct")}]},
                                          headers=self.sim_auth)
        self.assertEqual(status, 200)
        self.assertGreater(events[0][0], 0.8, f"{engine}: the sim's prefill is long enough to measure")
        body = {"model": MODEL, "stream": True, "max_tokens": 4,
                "messages": [{"role": "user", "content": long_prompt("through-atc")}]}
        status, _, events = stream_events(atc.port, body, timeout=30)
        self.assertEqual(status, 200, events)
        self.assertEqual(events[-1][1], "[DONE]")
        first = events[0][0]
        self.assertGreater(first, 0.8, f"{engine}: the first event came after prefill")
        line = wait_access_lines(log, 1)[0]
        self.assertIsNotNone(line["ttft_ms"], line)
        # within 10% of the first token the client saw (atc saw it a little earlier, never later)
        self.assertLessEqual(abs(line["ttft_ms"] - first * 1000), 0.10 * first * 1000,
                             f"{engine}: ttft_ms {line['ttft_ms']} against the client's {first * 1000:.0f} ms")
        return atc, sim, first, line

    sim_auth = None

    def test_ttft_is_the_first_event_on_each_engine(self):
        for engine in ENGINES:
            with self.subTest(engine=engine):
                self.ttft_through_atc(engine)

    def test_done_when_vllm_with_a_key_ttft_healthy_and_the_key_nowhere(self):
        """Issue 27's first Done-when: a server that answers as vLLM does (headers at once, its first event
        about 1.0 s later, --api-key set, the key given to atc by api_key_env): ttft_ms between 900 and
        1,400, the endpoint healthy, the key in no output."""
        key = "sk-atc-e2e-" + secrets.token_hex(16)
        self.set_key(key)
        self.sim_auth = {"Authorization": "Bearer " + key}
        atc, sim, first, line = self.ttft_through_atc("vllm", sim_flags=("--api-key", key),
                                                      model_extra="    api_key_env: ATC_E2E_KEY")
        self.assertGreaterEqual(line["ttft_ms"], 900, line)
        self.assertLessEqual(line["ttft_ms"], 1000 + 400 * SLACK, line)
        ep = atc.endpoints()["e0"]
        self.assertEqual((ep["state"], ep["engine"], ep["api_key"]), ("healthy", "vllm", "set"), ep)
        self.assert_key_in_no_output(atc, key)

    # ---- api keys ----

    def set_key(self, key):
        os.environ["ATC_E2E_KEY"] = key
        self.addCleanup(os.environ.pop, "ATC_E2E_KEY", None)

    def assert_key_in_no_output(self, atc, key):
        outputs = {p: request("127.0.0.1", atc.admin_port, "GET", p)[2].decode(errors="replace")
                   for p in ("/admin/endpoints", "/admin/config", "/metrics", "/")}
        st = subprocess.run([ATC_BIN, "status", "--admin", f"127.0.0.1:{atc.admin_port}"], capture_output=True,
                            text=True, timeout=10)
        self.assertEqual(st.returncode, 0, st.stderr)
        outputs["atc status"] = st.stdout + st.stderr
        ck = subprocess.run([ATC_BIN, "check", "-c", atc.config_path], capture_output=True, text=True,
                            timeout=10, cwd=SOURCE_DIR)
        self.assertEqual(ck.returncode, 0, ck.stderr)
        outputs["atc check"] = ck.stdout + ck.stderr
        atc.stop()
        outputs["atc log"] = atc.read_log()
        for name in os.listdir(self.tmp.name):
            if name.startswith("access"):
                with open(os.path.join(self.tmp.name, name)) as fh:
                    outputs[name] = fh.read()
        for where, text in outputs.items():
            self.assertNotIn(key, text, f"the key leaked into {where}")
            self.assertNotIn(key[-16:], text, f"part of the key leaked into {where}")

    def test_api_key_each_engine(self):
        """Each engine with --api-key: without api_key_env atc's endpoint is refused (the engine's 401 in
        last_error, 502 upstream_credentials to the client); with it, healthy and 200 (health checks and
        scrapes carry it too: llama.cpp guards /metrics); the key in no output."""
        key = "sk-atc-e2e-" + secrets.token_hex(16)
        self.set_key(key)
        for engine in ENGINES:
            with self.subTest(engine=engine):
                sim = self.sim(engine, "--api-key", key)
                log = os.path.join(self.tmp.name, f"access-{engine}.log")
                # without the key: the client is not blamed (502), the endpoint says why
                bare = self.start_atc(config([sim.url], engine), name=f"atc-{engine}-bare")
                status, _, body = chat(bare.port, max_tokens=2, headers={"Authorization": "Bearer client-own"})
                self.assertEqual(status, 502, body)
                self.assertEqual(json.loads(body)["error"]["code"], "upstream_credentials")
                # the refused request says so in last_error on every engine, also where the probes
                # are not guarded (llama.cpp, TGI); vLLM's and SGLang's ready probe is refused too
                wait_for(lambda: "401" in (bare.endpoints()["e0"]["last_error"] or ""), timeout=10,
                         what=f"{engine}: the 401 in last_error")
                self.assertIn("api_key_env", bare.endpoints()["e0"]["last_error"])
                if engine in ("vllm", "sglang"):
                    self.assertEqual(bare.endpoints()["e0"]["state"], "unhealthy")
                bare.stop()
                self.assertIn("e0: the server refused atc's credentials (401)", bare.read_log())
                # with it
                atc = self.start_atc(config([sim.url], engine, top=f"access_log: {log}",
                                            model_extra="    api_key_env: ATC_E2E_KEY", scrape=True),
                                     name=f"atc-{engine}")
                self.wait_healthy(atc)
                status, _, body = chat(atc.port, max_tokens=2)
                self.assertEqual(status, 200, body)
                self.assertEqual(json.loads(body)["choices"][0]["message"]["role"], "assistant")
                status, _, events = stream_events(atc.port, {"model": MODEL, "stream": True, "max_tokens": 2,
                                                             "messages": [{"role": "user", "content": "hi"}]})
                self.assertEqual((status, events[-1][1]), (200, "[DONE]"))
                wait_for(lambda: admin_json(atc, "/admin/endpoints")["health"]["probes_total"] >= 10, timeout=10,
                         what="more probes with the key")
                ep = atc.endpoints()["e0"]
                self.assertEqual((ep["state"], ep["engine"], ep["api_key"]), ("healthy", engine, "set"), ep)
                self.assertEqual(len(wait_access_lines(log, 2)), 2)
                self.assert_key_in_no_output(atc, key)

    # ---- start-up ----

    def test_startup_is_starting_then_healthy_without_panic(self):
        """A sim loading for 3 s (vLLM, SGLang, TGI: refused connections; llama.cpp: its 503 "Loading
        model"): starting, then healthy, never unhealthy and no panic. With engine: openai the same
        start-up is unhealthy and the model panics."""
        for engine in ENGINES:
            with self.subTest(engine=engine):
                sim = self.sim(engine, "--not-ready-for", "3s")
                atc = self.start_atc(config([sim.url], engine), name=f"atc-{engine}")
                seen = []

                def state():
                    data = admin_json(atc, "/admin/endpoints")
                    s = data["endpoints"][0]["state"]
                    if not seen or seen[-1] != s:
                        seen.append(s)
                    self.assertFalse(data["health"]["models"][0]["panic"], (engine, data["health"]))
                    return s == "healthy"

                wait_for(state, timeout=20, what=f"{engine} healthy")
                self.assertIn("starting", seen, engine)
                self.assertNotIn("unhealthy", seen, (engine, seen))
                self.assertEqual(admin_json(atc, "/admin/endpoints")["health"]["panics_total"], 0)
                status, _, body = chat(atc.port, max_tokens=2)
                self.assertEqual(status, 200, body)
                atc.stop()
                sim.stop()

        sim = self.sim("llamacpp", "--not-ready-for", "3s", name="sim-openai")
        atc = self.start_atc(config([sim.url], "openai"), name="atc-openai")
        wait_for(lambda: admin_json(atc, "/admin/endpoints")["health"]["models"][0]["panic"], timeout=10,
                 what="panic with engine: openai")
        self.assertEqual(atc.endpoints()["e0"]["state"], "unhealthy")

    # ---- SGLang's slow /health ----

    def test_sglang_slow_health_stays_healthy(self):
        """SGLang's /health answers after about a second: with engine: sglang the endpoint stays healthy
        through several checks; with a live timeout of 500 ms written beside it, unhealthy."""
        sim = self.sim("sglang")
        atc = self.start_atc(config([sim.url], "sglang"))
        self.wait_healthy(atc)
        probes = admin_json(atc, "/admin/endpoints")["health"]["probes_total"]
        seen = set()

        def more_probes():
            data = admin_json(atc, "/admin/endpoints")
            seen.add(data["endpoints"][0]["state"])
            return data["health"]["probes_total"] >= probes + 6

        wait_for(more_probes, timeout=20, what="six more probes")
        self.assertEqual(seen, {"healthy"})
        ep = atc.endpoints()["e0"]
        self.assertEqual((ep["engine"], ep["live"]), ("sglang", True), ep)

        # The sim's /health takes 1,000 ms, exactly openai's live timeout: which of the two comes first is
        # a race (test_engines.py's fake takes 1.2 s against engine: openai). A shorter timeout written
        # beside engine: sglang wins over the profile's 5 s: unhealthy (without a start-up grace, in which
        # a probe that times out before the first healthy reads "starting", as a refused one does).
        t0 = time.monotonic()
        self.assertEqual(request("127.0.0.1", sim.port, "GET", "/health")[0], 200)
        self.assertGreater(time.monotonic() - t0, 0.9)
        atc2 = self.start_atc(config([sim.url], "sglang", health_extra="  live: {interval: 100ms, timeout: 500ms}\n  startup_grace: 0s")
                              .replace("  live: {interval: 100ms}\n", "", 1), name="atc-short")
        wait_for(lambda: atc2.endpoints()["e0"]["state"] == "unhealthy", timeout=15,
                 what="unhealthy with live.timeout: 500ms")
        self.assertIn("no answer within 500ms", atc2.endpoints()["e0"]["last_error"])

    # ---- TGI ----

    def hold(self, sim):
        """A request straight to @p sim that holds one of its places until the test ends."""
        from harness import post_raw
        sock = post_raw(sim.port, {"model": MODEL, "max_tokens": 100000,
                                   "messages": [{"role": "user", "content": "hold"}]})
        self.addCleanup(sock.close)
        return sock

    def test_tgi_overload_429_is_retried_on_the_other_server(self):
        """Done-when: engine: tgi, a model of two servers, the first one full (--max-concurrent 1, its one
        place held): its 429 "overloaded" is retried on the second, 10 of 10 succeed, each counted
        against the first. With tries: 1 the same 429 reaches the client, OpenAI-shaped."""
        full = self.sim("tgi", "--max-concurrent", "1", name="sim-full")
        spare = self.sim("tgi", name="sim-spare")
        self.hold(full)
        status, _, body = chat(full.port, max_tokens=1)
        self.assertEqual((status, json.loads(body)["error_type"]), (429, "overloaded"))
        log = os.path.join(self.tmp.name, "access.log")
        pol = self.write_policy(POLICY)
        atc = self.start_atc(config([full.url, spare.url], "tgi",
                                    top=f"access_log: {log}\npolicy: {{entry: {pol}}}\nupstream: {{tries: 2}}"))
        self.wait_healthy(atc, "e0")
        self.wait_healthy(atc, "e1")
        results = []

        def one():
            results.append(chat(atc.port, max_tokens=2))

        threads = [threading.Thread(target=one) for _ in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        self.assertEqual([s for s, _, _ in results], [200] * 10, [b for _, _, b in results])
        self.assertTrue(all(h.get("x-atc-endpoint") == "e1" for _, h, _ in results))
        # each try on the full one was its 429, retried (passive health may take it out of the policy's
        # choice after a few: then a request goes to e1 at once)
        retries = sum(line["retries"] for line in wait_access_lines(log, 10))
        self.assertGreaterEqual(retries, 1)
        self.assertEqual(atc.endpoints()["e0"]["errors_total"], retries)

        atc1 = self.start_atc(config([full.url, spare.url], "tgi",
                                     top=f"policy: {{entry: {pol}}}\nupstream: {{tries: 1}}"), name="atc-tries1")
        self.wait_healthy(atc1, "e0")
        status, _, body = chat(atc1.port, max_tokens=2)
        self.assertEqual(status, 429, body)
        err = json.loads(body)["error"]
        self.assertEqual((err["message"], err["type"], err["code"]),
                         ("Model is overloaded", "rate_limit_error", "overloaded"))

    def test_tgi_errors_reach_the_client_in_openai_shape(self):
        """TGI answers {"error": "...", "error_type": "validation"} with 422 (and, in a stream, a 200 whose
        one event is that error): the client sees {"error": {"message", "type", "param", "code"}}."""
        sim = self.sim("tgi")
        status, _, body = chat(sim.port, max_tokens=0)  # the sim's own shape, as TGI's
        self.assertEqual(status, 422)
        native = json.loads(body)
        self.assertIsInstance(native["error"], str)
        self.assertEqual(native["error_type"], "validation")

        atc = self.start_atc(config([sim.url], "tgi"))
        self.wait_healthy(atc)
        status, headers, body = chat(atc.port, max_tokens=0)
        self.assertEqual(status, 422, body)
        self.assertEqual(headers["content-type"], "application/json")
        self.assertEqual(json.loads(body), {"error": {"message": native["error"], "type": "invalid_request_error",
                                                      "param": None, "code": "validation"}})
        status, _, events = stream_events(atc.port, {"model": MODEL, "stream": True, "max_tokens": 0,
                                                     "messages": [{"role": "user", "content": "hi"}]})
        self.assertEqual(status, 200)
        err = json.loads(events[0][1])["error"]
        self.assertEqual((err["message"], err["code"]), (native["error"], "validation"))
        self.assertIn("type", err)


class SimulateEngineTest(AtcTestCase):
    """`engine:` in a simulate: entry: the simulated server wears that engine's face and the endpoints it
    starts take that engine's profile, unless their model names one."""

    def serve(self, model_engine, name="atc"):
        return self.start_atc(f"""
listen: 127.0.0.1:0
admin: 127.0.0.1:0
health:
  fast_interval: 50ms
  live: {{interval: 100ms}}
  ready: {{interval: 100ms, timeout: 2s}}
  deep: {{enabled: false}}
  scrape: {{enabled: false}}
models:
  - name: {MODEL}
{model_engine}
simulate:
  - {{model: {MODEL}, engine: sglang, decode_ms: 1}}
""", name=name)

    def test_simulate_engine_is_the_endpoints_profile(self):
        atc = self.serve("")
        wait_for(lambda: next(iter(atc.endpoints().values()))["state"] == "healthy", timeout=10,
                 what="the simulated endpoint healthy")
        probes = admin_json(atc, "/admin/endpoints")["health"]["probes_total"]
        seen = set()

        def more_probes():
            data = admin_json(atc, "/admin/endpoints")
            seen.add(data["endpoints"][0]["state"])
            return data["health"]["probes_total"] >= probes + 6

        wait_for(more_probes, timeout=20, what="six more probes of SGLang's slow /health")
        self.assertEqual(seen, {"healthy"})
        ep = next(iter(atc.endpoints().values()))
        self.assertEqual(ep["engine"], "sglang", ep)
        self.assertEqual(chat(atc.port, max_tokens=2)[0], 200)

        # the model's own engine: wins (openai: a 1 s live timeout against SGLang's slow /health)
        atc2 = self.serve("    engine: openai", name="atc2")
        wait_for(lambda: next(iter(atc2.endpoints().values()))["state"] == "unhealthy", timeout=15,
                 what="unhealthy with the model's engine: openai")
        self.assertEqual(next(iter(atc2.endpoints().values()))["engine"], "openai")

    def test_a_simulated_servers_key_is_the_one_atc_sends_it(self):
        atc = self.start_atc(f"""
listen: 127.0.0.1:0
admin: 127.0.0.1:0
models:
  - name: {MODEL}
simulate:
  - {{model: {MODEL}, engine: vllm, api_key: sk-sim-own, decode_ms: 1}}
""")
        wait_for(lambda: next(iter(atc.endpoints().values()))["state"] == "healthy", timeout=10,
                 what="the keyed simulated endpoint healthy (its ready probe needs the key)")
        self.assertEqual(next(iter(atc.endpoints().values()))["api_key"], "set")
        status, _, body = chat(atc.port, max_tokens=2)
        self.assertEqual(status, 200, body)

    def test_simulate_entries_of_one_model_disagreeing_on_engine(self):
        path = os.path.join(self.tmp.name, "two.yaml")
        with open(path, "w") as fh:
            fh.write(f"models:\n  - name: {MODEL}\nsimulate:\n  - {{model: {MODEL}, engine: sglang}}\n"
                     f"  - {{model: {MODEL}, engine: tgi}}\n")
        out = subprocess.run([ATC_BIN, "check", "-c", path], capture_output=True, text=True, timeout=10)
        self.assertEqual(out.returncode, 1, out.stdout)
        self.assertIn(f"{path}:5:33: key 'simulate[1].engine': another simulate entry of model '{MODEL}' is "
                      f"sglang: set engine: on the model", out.stderr)
        with open(path, "w") as fh:
            fh.write(f"models:\n  - name: {MODEL}\n    engine: vllm\nsimulate:\n  - {{model: {MODEL}, engine: sglang}}\n"
                     f"  - {{model: {MODEL}, engine: tgi}}\n")
        out = subprocess.run([ATC_BIN, "check", "-c", path], capture_output=True, text=True, timeout=10)
        self.assertEqual(out.returncode, 0, out.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
