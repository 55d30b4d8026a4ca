"""The official OpenAI Node SDK (openai on npm, pinned by openai_sdk/package-lock.json) against atc in
front of simulated servers: what a real client sees, streaming and not, its errors and a cancelled
stream. The SDK is installed with `npm ci` once per build directory (Node.js and the npm registry are
what tests/run installs and reaches)."""

import json
import os
import shutil
import subprocess
import unittest

from harness import ATC_BIN, SOURCE_DIR, AtcTestCase, request, wait_for

SDK_SRC = os.path.join(SOURCE_DIR, "tests", "integration", "openai_sdk")


def sdk_dir():
    """openai_sdk/ copied beside the atc under test, with its node_modules installed from the lockfile
    (again when the lockfile changed)."""
    dest = os.path.join(os.path.dirname(os.path.abspath(ATC_BIN)), "openai_sdk")

    def read(path):
        with open(path) as f:
            return f.read()

    installed = os.path.join(dest, "package-lock.json")
    os.makedirs(dest, exist_ok=True)
    for name in ("package.json", "client.mjs"):
        shutil.copy(os.path.join(SDK_SRC, name), dest)
    if not (os.path.isdir(os.path.join(dest, "node_modules", "openai")) and os.path.exists(installed)
            and read(installed) == read(os.path.join(SDK_SRC, "package-lock.json"))):
        shutil.copy(os.path.join(SDK_SRC, "package-lock.json"), dest)
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=dest, check=True,
                       timeout=300, stdout=subprocess.DEVNULL)
    return dest


def running(sim):
    """vllm:num_requests_running of a simulated server's /metrics."""
    body = request("127.0.0.1", sim.port, "GET", "/metrics")[2].decode()
    return sum(float(line.split()[-1]) for line in body.splitlines()
               if line.startswith("vllm:num_requests_running{"))


class OpenAISdkTest(AtcTestCase):
    def test_the_official_sdk_talks_to_atc(self):
        sims = [self.start_sim(f"s{k}") for k in (1, 2)]
        policy = os.path.join(SOURCE_DIR, "scripts", "policy.lua")
        atc = self.start_atc(f"""
            listen: 127.0.0.1:0
            admin: 127.0.0.1:0
            policy: {{entry: "{policy}"}}
            models:
              - name: llama-3-8b
                endpoints:
                  - {{id: s1, url: "{sims[0].url}"}}
                  - {{id: s2, url: "{sims[1].url}"}}
            """)
        done = subprocess.run(["node", "client.mjs", f"http://127.0.0.1:{atc.port}/v1"], cwd=sdk_dir(),
                              capture_output=True, text=True, timeout=120)
        self.assertEqual(done.returncode, 0, done.stderr)
        out = json.loads(done.stdout)

        self.assertIn("llama-3-8b", out["models"])
        chat = out["chat"]
        self.assertTrue(chat["content"])
        self.assertEqual((chat["finish"], chat["usage"]["completion_tokens"]), ("length", 5))
        stream = out["stream"]
        self.assertEqual((stream["deltas"], stream["finish"]), (6, "length"))
        self.assertEqual(stream["usage"]["completion_tokens"], 6)
        self.assertTrue(stream["text"])
        self.assertIn(out["headers"]["endpoint"], ("s1", "s2"))
        self.assertTrue(out["headers"]["request_id"])
        self.assertEqual(out["headers"]["object"], "chat.completion")
        self.assertTrue(out["completion"]["text"])
        self.assertEqual(out["completion"]["usage"]["completion_tokens"], 4)
        emb = out["embeddings"]
        self.assertEqual([e["index"] for e in emb], [0, 1, 2])
        self.assertEqual(len(emb[0]["embedding"]), 8)
        self.assertEqual(emb[0]["embedding"], emb[2]["embedding"])  # decoded from base64, the same input
        self.assertNotEqual(emb[0]["embedding"], emb[1]["embedding"])
        # errors as the SDK's typed exceptions: atc's own 404, the server's 400 passed on
        unknown = out["unknown_model"]
        self.assertEqual((unknown["error"], unknown["status"], unknown["code"]),
                         ("NotFoundError", 404, "model_not_found"))
        self.assertEqual((out["bad_request"]["error"], out["bad_request"]["status"]), ("BadRequestError", 400))
        self.assertIn("maximum context length", out["bad_request"]["message"])
        # a stream the client abandons (2,000 tokens: 24 s to run out by itself): atc cancels it upstream
        # and frees the slot
        self.assertGreaterEqual(out["aborted"]["chunks"], 3)
        wait_for(lambda: all(e["inflight"] == 0 for e in atc.endpoints().values()), timeout=5,
                 what="the aborted stream's slot freed")
        wait_for(lambda: all(running(s) == 0 for s in sims), timeout=5,
                 what="the aborted stream cancelled on its server")


if __name__ == "__main__":
    unittest.main()
