"""The status page (GET / on the admin port) in a real browser: atc serve in front of `atc sim` processes,
the page loaded in headless Chromium through chromedriver (browser.py), and the assertions made on what
the page renders, as an operator would read it.

Without chromium the tests skip, unless ATC_REQUIRE_BROWSER=1 (tests/run sets it): then they fail, so the
suite cannot pass by not running them. The screenshot of the main test is kept as an artifact beside the
binary (build/artifacts/status_page.png); ATC_UPDATE_SCREENSHOT=1 also copies it to docs/, the image the
README shows.
"""

import json
import os
import re
import shutil
import threading
import unittest

import browser
from harness import ATC_BIN, SOURCE_DIR, AtcTestCase, chat, request, wait_for

ARTIFACTS = os.path.join(os.path.dirname(os.path.abspath(ATC_BIN)), "artifacts")

HEALTH = """
health:
  failure_threshold: 2
  recovery_threshold: 2
  fast_interval: 50ms
  down_interval: 200ms
  live: {interval: 200ms, timeout: 300ms}
  ready: {interval: 200ms, timeout: 300ms}
  scrape: {interval: 200ms, timeout: 300ms}
"""


def config(models, extra=""):
    """A config of @models {model: [(id, url)]} with short health intervals and @extra."""
    out = f"listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\n{extra}{HEALTH}models:\n"
    for model, eps in models.items():
        out += f"  - name: {model}\n    endpoints:\n"
        out += "".join(f'      - {{id: {i}, url: "{u}", capacity: 8}}\n' for i, u in eps)
    return out


class StatusPageTest(AtcTestCase):
    def setUp(self):
        self.browser = None
        gone = browser.missing()
        if gone:
            if os.environ.get("ATC_REQUIRE_BROWSER") == "1":
                self.fail(f"ATC_REQUIRE_BROWSER=1 but {gone} is not installed (apt-get install chromium "
                          "chromium-driver)")
            self.skipTest(f"{gone} not installed")
        super().setUp()
        stale = os.path.join(ARTIFACTS, f"{self._testMethodName}.failed.png")
        if os.path.exists(stale):
            os.remove(stale)

    def tearDown(self):
        result = getattr(self._outcome, "result", None)
        failed = result is not None and any(t is self for t, _ in result.failures + result.errors)
        if self.browser is not None:
            if failed:  # what the page showed when the test failed
                try:
                    self.browser.screenshot(os.path.join(ARTIFACTS, f"{self._testMethodName}.failed.png"))
                    print(self.browser.execute("return document.body.innerText"))
                except AssertionError as e:
                    print(f"no screenshot: {e}")
            self.browser.stop()
        super().tearDown()

    def open_browser(self):
        self.browser = browser.Browser(self.tmp.name)
        return self.browser

    # ---- what the page shows ----

    def cell(self, ep, col):
        return self.browser.read(f'tr[data-endpoint="{ep}"] td[data-col="{col}"]')

    def wait_cell(self, ep, col, pattern, timeout=10):
        try:
            return wait_for(lambda: re.search(pattern, self.cell_or_empty(ep, col)), timeout=timeout,
                            interval=0.05, what=f"{ep}'s {col} to match {pattern!r}")
        except AssertionError as e:  # what it reads when the wait ended, not when it began
            raise AssertionError(f"{e} (it reads {self.cell_or_empty(ep, col)!r})") from None

    def cell_or_empty(self, ep, col):
        try:
            return self.cell(ep, col)
        except browser.WebDriverError:
            return ""

    def button(self, ep):
        return self.browser.find(f'tr[data-endpoint="{ep}"] td[data-col="action"] button')

    def section_of(self, ep):
        return self.browser.execute(
            "return arguments[0].closest('section').querySelector('h2').firstChild.textContent",
            {browser.ELEMENT: self.browser.find(f'tr[data-endpoint="{ep}"]')})

    # ---- tests ----

    def test_rows_drain_enable_and_a_killed_server(self):
        sims = {n: self.start_sim(n, model=m, extra=["--decode-ms", "2"])
                for n, m in (("a", "llama-3-8b"), ("b", "llama-3-8b"), ("d", "llama-3-8b"), ("c", "qwen-2.5-1.5b"))}
        policy = os.path.join(SOURCE_DIR, "scripts", "policy.lua")
        atc = self.start_atc(config({"llama-3-8b": [(n, sims[n].url) for n in "abd"],
                                     "qwen-2.5-1.5b": [("c", sims["c"].url)]},
                                    extra=f"policy:\n  entry: {policy}\n"))
        wait_for(lambda: all(e["state"] == "healthy" for e in atc.endpoints().values()), what="all healthy")
        for _ in range(12):  # streamed: only a stream's first event is a TTFT sample
            self.assertEqual(chat(atc.port, max_tokens=4, stream=True)[0], 200)
        self.assertEqual(chat(atc.port, model="qwen-2.5-1.5b", max_tokens=4)[0], 200)
        page = f"http://127.0.0.1:{atc.admin_port}/"

        b = self.open_browser()
        b.get(page)
        # a row per endpoint, under its model, each healthy
        wait_for(lambda: len(b.find_all("tr[data-endpoint]")) == 4, what="four endpoint rows")
        ids = sorted(b.attribute(tr, "data-endpoint") for tr in b.find_all("tr[data-endpoint]"))
        self.assertEqual(ids, ["a", "b", "c", "d"])
        for ep in "abcd":
            self.wait_cell(ep, "state", r"^healthy")
            self.assertIn(sims[ep].url, self.cell(ep, "endpoint"))
            self.assertEqual(self.section_of(ep), "qwen-2.5-1.5b" if ep == "c" else "llama-3-8b")
            self.assertRegex(self.cell(ep, "inflight"), r"^0 / 8")
        # the last minute's traffic: 12 requests over a, b, d; their TTFT; no errors
        served = sum(e["recent"]["attempts"] for k, e in atc.endpoints().items() if k != "c")
        self.assertEqual(served, 12)
        busy = [ep for ep in "abd" if atc.endpoints()[ep]["recent"]["attempts"] > 0]
        for ep in busy:
            self.wait_cell(ep, "ttft", r"^\d+ ms$")
            self.assertRegex(self.cell(ep, "errors"), r"^0\.0 % \(0\)$")
            self.assertRegex(self.cell(ep, "rps"), r"^0\.\d\d$")
        self.wait_cell("c", "age", r"^\d+ ms$")  # its load was scraped a moment ago
        policy_text = b.read("#policy")
        self.assertRegex(policy_text, r"version\s+v1 ")
        self.assertRegex(policy_text, r"shadow / canary\s+none")

        # Drain a from the page: its row says so, the button turns to Enable, and the API agrees.
        self.assertEqual(b.text(self.button("a")), "Drain")
        b.click(self.button("a"))
        self.wait_cell("a", "state", r"^draining")
        self.wait_cell("a", "action", r"^Enable$")
        self.assertEqual(atc.endpoints()["a"]["state"], "draining")
        self.assertIn("draining", b.attribute(b.find('tr[data-endpoint="a"]'), "class"))
        for ep in "bcd":
            self.assertRegex(self.cell(ep, "state"), r"^healthy")
        b.click(self.button("a"))
        self.wait_cell("a", "state", r"^healthy")
        self.assertEqual(atc.endpoints()["a"]["state"], "healthy")
        self.assertIn("Drain", self.cell("a", "action"))

        # Kill b's server: its row turns unhealthy, with its failed check; the others stay healthy.
        sims["b"].proc.kill()
        sims["b"].proc.wait()
        self.wait_cell("b", "state", r"^unhealthy")
        self.assertIn("out", b.attribute(b.find('tr[data-endpoint="b"]'), "class").split())
        self.assertRegex(self.cell("b", "checks"), "^live \u2717 ready \u2717 deep")
        heading = b.read('section[data-model="llama-3-8b"] h2')
        self.assertRegex(heading, r"2 of 3 healthy")
        # its history strip now ends in red: the last segment is the unhealthy state
        last = b.execute("const h = document.querySelector('tr[data-endpoint=\"b\"] .history');"
                         "return h.lastElementChild.className")
        self.assertEqual(last, "unhealthy")
        for ep in "acd":
            self.assertRegex(self.cell(ep, "state"), r"^healthy")

        # For the screenshot: d left drained, and a little more traffic.
        b.click(self.button("d"))
        self.wait_cell("d", "state", r"^draining")
        for _ in range(6):
            chat(atc.port, max_tokens=4)
        self.wait_cell("a", "rps", r"^0\.[1-9]")
        shot = os.path.join(ARTIFACTS, "status_page.png")
        b.screenshot(shot)
        with open(shot, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
        if os.environ.get("ATC_UPDATE_SCREENSHOT") == "1":
            shutil.copyfile(shot, os.path.join(SOURCE_DIR, "docs", "status_page.png"))

    def test_with_admin_token_the_page_needs_it(self):
        sim = self.start_sim("a")
        atc = self.start_atc(config({"llama-3-8b": [("a", sim.url)]}, extra="admin_token: s3cret-token\n"))
        auth = {"authorization": "Bearer s3cret-token"}
        page = f"http://127.0.0.1:{atc.admin_port}/"
        b = self.open_browser()

        # Without the token: an error that says what is missing, and no data.
        b.get(page)
        wait_for(lambda: b.displayed(b.find("#auth-error")), what="the auth error")
        self.assertIn("admin_token", b.read("#auth-error"))
        self.assertEqual(b.find_all("tr[data-endpoint]"), [])

        # With the token in the URL fragment: the rows, and the token gone from the address bar.
        b.get("about:blank")
        b.get(page + "#token=s3cret-token")
        wait_for(lambda: b.find_all('tr[data-endpoint="a"]'), what="a's row")
        self.assertFalse(b.displayed(b.find("#auth")))
        self.assertNotIn("s3cret", b.execute("return location.href"))
        self.wait_cell("a", "state", r"^healthy")
        # Its drain button sends the token too.
        b.click(self.button("a"))
        self.wait_cell("a", "state", r"^draining")
        _, _, body = request("127.0.0.1", atc.admin_port, "GET", "/admin/endpoints", headers=auth)
        self.assertEqual(json.loads(body)["endpoints"][0]["state"], "draining")

        # A wrong token typed into the form is refused; the right one works.
        b.execute("sessionStorage.clear()")
        b.get("about:blank")
        b.get(page)
        wait_for(lambda: b.displayed(b.find("#auth-error")), what="the auth error")
        b.type(b.find("#token-input"), "wrong")
        b.click(b.find("#auth-form button"))
        wait_for(lambda: "refused" in b.read("#auth-error"), what="the token refused")
        self.assertEqual(b.find_all("tr[data-endpoint]"), [])
        b.type(b.find("#token-input"), "s3cret-token")
        b.click(b.find("#auth-form button"))
        wait_for(lambda: b.find_all('tr[data-endpoint="a"]'), what="a's row")
        self.wait_cell("a", "action", r"^Enable$")
        b.click(self.button("a"))
        self.wait_cell("a", "state", r"^healthy")

    def test_queues_by_priority(self):
        atc = self.start_atc("listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\nworkers: 1\n"
                             "admission: {queue: 8, deadline: 20s}\nmodels:\n  - name: m\n"
                             "simulate:\n  - {model: m, capacity: 1, decode_ms: 20}\n")
        wait_for(lambda: all(e["state"] == "healthy" for e in atc.endpoints().values()), what="healthy")
        b = self.open_browser()
        b.get(f"http://127.0.0.1:{atc.admin_port}/")
        wait_for(lambda: "nothing waiting" in b.read("#queues"), what="an empty queue")
        # one request holds the only slot for about 4 s; three wait behind it, two at priority 7
        clients = [threading.Thread(target=chat, args=(atc.port,), daemon=True,
                                    kwargs={"model": "m", "max_tokens": 200})]
        clients[0].start()
        wait_for(lambda: atc.endpoints()["m-sim-1"]["inflight"] == 1, what="the slot taken")
        for prio in (7, 7, 2):
            clients.append(threading.Thread(target=chat, args=(atc.port,), daemon=True, kwargs={
                "model": "m", "max_tokens": 1, "headers": {"x-atc-priority": str(prio)}}))
            clients[-1].start()
        row = '#queues tr[data-queue="m"]'
        wait_for(lambda: b.find_all(row), what="m's queue row")
        wait_for(lambda: b.read(row).split()[:2] == ["m", "3"], what=f"3 waiting (the row reads {b.read(row)!r})")
        heads = b.read("#queues thead").split()
        counts = dict(zip(heads[3:], b.read(row).split()[-10:]))
        self.assertEqual((counts["P7"], counts["P2"], counts["P0"]), ("2", "1", "0"))
        for c in clients:
            c.join(30)
        wait_for(lambda: "nothing waiting" in b.read("#queues"), what="the queue empty again")

    def test_two_replicas_the_fleet_wide_load_cluster_and_limits_cards(self):
        from test_cluster import REDIS, Redis
        if shutil.which(REDIS) is None:
            self.fail(f"{REDIS} is not installed")
        redis = Redis(self.tmp.name)
        self.processes.append(redis)
        sim = self.start_sim("s", model="m", extra=["--decode-ms", "100"])
        atcs = [self.start_atc(config({"m": [("s0", sim.url)]}, extra=(
            f"workers: 1\ncluster: {{redis: 'redis://127.0.0.1:{redis.port}/0', name: r{i}, sync_interval: 100ms}}\n"
            "limits:\n  tenants:\n    gold: {requests_per_minute: 100}\n")), name=f"atc{i}") for i in range(2)]
        a, other = atcs
        wait_for(lambda: a.endpoints()["s0"]["state"] == "healthy", what="s0 healthy")
        b = self.open_browser()
        b.get(f"http://127.0.0.1:{a.admin_port}/")
        # the rates have a figure well before a second refresh period
        wait_for(lambda: re.match(r"requests/s\s+\d+\.\d", b.read("#traffic")), timeout=1.2,
                 what="a rate within 1.2 s of the page's load, not after a second 1.5 s period")
        # the page is up before the requests start (a browser under TSan takes seconds to start), and
        # they last about 10 s, so their count is on the page for several refreshes
        clients = [threading.Thread(target=lambda: chat(other.port, model="m", max_tokens=100), daemon=True)
                   for _ in range(3)]
        for c in clients:
            c.start()
        # the other replica's 3 requests on the same endpoint, with their age, beside this one's 0
        self.wait_cell("s0", "inflight", r"^0 / 8 \+3 others \(\d+ ms old\)")
        cluster = b.read("#cluster")
        self.assertRegex(cluster, r"replica\s+r0")
        self.assertRegex(cluster, r"other replica\s+r1, synced \d+ ms ago")
        limits = b.read('#limits tr[data-tenant="gold"]')
        self.assertRegex(limits, r"^gold\s+\d+ of 100\s+no limit\s+0$")
        # the header says which atc
        self.assertRegex(b.read("#whoami"), r"^atc \d+\.\d+\.\d+ on \S+, up \d+ s$")
        self.assertRegex(b.read("#updated"), r"^updated \d{4}-\d\d-\d\d \d\d:\d\d:\d\d$")
        for c in clients:
            c.join(30)

    def test_the_admin_port_safety_rules_hold_for_the_page(self):
        sim = self.start_sim("a")
        atc = self.start_atc(config({"llama-3-8b": [("a", sim.url)]}))
        status, headers, body = request("127.0.0.1", atc.admin_port, "GET", "/")
        self.assertEqual(status, 200)
        self.assertTrue(headers["content-type"].startswith("text/html"))
        self.assertIn("frame-ancestors 'none'", headers["content-security-policy"])
        self.assertIn(b"<title>atc status</title>", body)
        self.assertNotIn(b"https://", body)  # nothing from the internet
        # DNS rebinding: a foreign Host gets no page; a form-type POST is refused
        self.assertEqual(request("127.0.0.1", atc.admin_port, "GET", "/", headers={"host": "evil.example"})[0], 403)
        self.assertEqual(request("127.0.0.1", atc.admin_port, "POST", "/admin/endpoints/a/drain", "x",
                                 headers={"content-type": "text/plain"})[0], 403)
        self.assertEqual(request("127.0.0.1", atc.admin_port, "POST", "/admin/endpoints/a/drain", "{}",
                                 headers={"origin": "http://evil.example"})[0], 403)
        self.assertIn(atc.endpoints()["a"]["state"], ("healthy", "starting"))  # not drained


if __name__ == "__main__":
    unittest.main()
