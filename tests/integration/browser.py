"""A headless Chromium for the integration tests, driven through chromedriver's W3C WebDriver HTTP API with
the standard library only (no selenium: the tests install nothing but Debian packages).

chromedriver is started on port 0 and found by the port it prints, with a deadline; it and the browser it
starts run in a process group of their own, which stop() ends (TERM, then KILL).
"""

import base64
import json
import os
import re
import select
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request

CHROMIUM = os.environ.get("ATC_CHROMIUM") or shutil.which("chromium")
CHROMEDRIVER = os.environ.get("ATC_CHROMEDRIVER") or shutil.which("chromedriver")
ELEMENT = "element-6066-11e4-a52e-4f735466cecf"  # the W3C key of an element reference


def missing():
    """What is missing to run a browser test ("" when nothing is)."""
    return ", ".join(n for n, p in (("chromium", CHROMIUM), ("chromium-driver", CHROMEDRIVER))
                     if not p or not os.access(p, os.X_OK))


class WebDriverError(AssertionError):
    pass


class Browser:
    def __init__(self, workdir, width=1440, height=900):
        self.log_path = os.path.join(workdir, "chromedriver.log")
        self.session = None
        for attempt in range(3):  # on a loaded machine chromedriver has been seen not to start in time
            self.proc = subprocess.Popen([CHROMEDRIVER, "--port=0", "--log-path=" + self.log_path],
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                self.base = f"http://127.0.0.1:{self._wait_port()}"
                break
            except AssertionError:
                if attempt == 2:
                    raise
        args = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                "--disable-extensions", "--hide-scrollbars", f"--window-size={width},{height}",
                "--user-data-dir=" + os.path.join(workdir, "chromium-profile")]
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": CHROMIUM, "args": args}}}}
        self.session = self._call("POST", "/session", caps)["sessionId"]

    def _wait_port(self):
        deadline = time.monotonic() + 20
        out = b""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                if not chunk:
                    break
                out += chunk
                m = re.search(rb"started successfully on port (\d+)", out)
                if m:
                    return int(m.group(1))
        self.stop()
        raise AssertionError(f"chromedriver did not start: {out.decode(errors='replace')}")

    def _call(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        if method == "POST" and data is None:
            data = b"{}"
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return json.loads(r.read())["value"]
        except urllib.error.HTTPError as e:
            raise WebDriverError(f"{method} {path}: {e.code} {e.read().decode(errors='replace')[:800]}")

    def _s(self, path, method="POST", body=None):
        return self._call(method, f"/session/{self.session}{path}", body)

    def get(self, url):
        self._s("/url", body={"url": url})

    def execute(self, script, *args):
        """Runs @script (a function body) in the page and returns its value."""
        return self._s("/execute/sync", body={"script": script, "args": list(args)})

    def find_all(self, css):
        return [e[ELEMENT] for e in self._s("/elements", body={"using": "css selector", "value": css})]

    def find(self, css):
        found = self.find_all(css)
        if not found:
            raise WebDriverError(f"no element matches {css}")
        return found[0]

    def text(self, element):
        """The element's rendered text, as a user reads it."""
        return self._s(f"/element/{element}/text", "GET")

    def read(self, css, tries=5):
        """The rendered text of the first element matching @css, found again if the page re-rendered it
        between the find and the read (a stale element: the status page redraws its tables each refresh)."""
        for attempt in range(tries):
            try:
                return self.text(self.find(css))
            except WebDriverError as e:
                if "stale element" not in str(e) or attempt == tries - 1:
                    raise

    def attribute(self, element, name):
        return self._s(f"/element/{element}/attribute/{name}", "GET")

    def displayed(self, element):
        return self._s(f"/element/{element}/displayed", "GET")

    def click(self, element):
        """A real click: WebDriver scrolls to the element and fails if something else would get it."""
        self._s(f"/element/{element}/click")

    def type(self, element, text):
        self._s(f"/element/{element}/value", body={"text": text})

    def screenshot(self, path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(self._s("/screenshot", "GET")))

    def stop(self):
        if self.session is not None:
            try:
                self._s("", "DELETE")  # closes the browser
            except (WebDriverError, OSError):
                pass
            self.session = None
        # the group is chromedriver's and every browser process it started; it exists while any of them runs
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(10)
                break
            except subprocess.TimeoutExpired:
                continue
        self.proc.wait()
        self.proc.stdout.close()
