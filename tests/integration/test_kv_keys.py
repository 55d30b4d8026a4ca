"""`atc kv-keys` against an independent reference (kv_keys_reference.py: Python's hashlib, cbor2 and
xxhash, written from the engines' description): the keys vLLM (sha256_cbor, xxhash_cbor, with seeds) and
SGLang publish for token lists of several shapes, including ids that take every CBOR integer width."""

import json
import os
import random
import subprocess
import unittest

from harness import AtcTestCase

REFERENCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kv_keys_reference.py")
PYTHON = "/usr/bin/python3"  # Debian's, with python3-cbor2 and python3-xxhash


class KvKeysTest(AtcTestCase):
    def setUp(self):
        super().setUp()
        self.ref = subprocess.Popen([PYTHON, REFERENCE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.addCleanup(self.stop_ref)

    def stop_ref(self):
        self.ref.stdin.close()
        self.ref.wait(timeout=10)

    def reference(self, fn, block, seed, tokens):
        self.ref.stdin.write(json.dumps({"hash": fn, "block_size": block, "seed": seed, "tokens": tokens}) + "\n")
        self.ref.stdin.flush()
        return json.loads(self.ref.stdout.readline())

    def atc(self, *args, stdin=None):
        return subprocess.run([os.environ["ATC_BIN"], "kv-keys", *map(str, args)], input=stdin,
                              capture_output=True, text=True, timeout=30)

    def test_matches_reference(self):
        rng = random.Random(7)
        # ids across every CBOR integer width: < 24, one byte, two, four
        widths = [0, 5, 23, 24, 255, 256, 65535, 65536, 128255, 4294967295]
        cases = 0
        for fn in ("sha256_cbor", "xxhash_cbor", "sglang"):
            for block in (1, 4, 16, 32):
                for seed in (0, 42, 18446744073709551615):
                    n = rng.choice([block - 1, block, 3 * block + 1, 10 * block])
                    tokens = [rng.choice(widths) if rng.random() < 0.3 else rng.randrange(128256)
                              for _ in range(n)]
                    want = self.reference(fn, block, seed, tokens)
                    got = self.atc("--hash", fn, "--block-size", block, "--seed", seed, *tokens)
                    self.assertEqual(got.returncode, 0, got.stderr)
                    self.assertEqual([int(x) for x in got.stdout.split()], want, (fn, block, seed, tokens))
                    self.assertEqual(len(want), n // block)
                    cases += 1
        self.assertEqual(cases, 36)

    def test_known_vector(self):
        # Fixed expectations, so that a change to both sides at once still shows: vLLM's NONE_HASH for
        # PYTHONHASHSEED=0 under sha256_cbor is SHA-256(b"\x61\x30").
        want = self.reference("sha256_cbor", 4, 0, [1, 2, 3, 4, 5, 6, 7, 8])
        got = self.atc("--block-size", "4", "1", "2", "3", "4", "5", "6", "7", "8")
        self.assertEqual([int(x) for x in got.stdout.split()], want)
        self.assertEqual(want, [2164874634404590027, 17270480062156288726])

    def test_stdin_and_signed(self):
        tokens = list(range(100, 164))
        want = self.reference("sglang", 16, 0, tokens)
        got = self.atc("--hash", "sglang", "--signed", stdin=json.dumps(tokens))
        self.assertEqual(got.returncode, 0, got.stderr)
        self.assertEqual([int(x) for x in got.stdout.split()], [k - (1 << 64) if k >= 1 << 63 else k for k in want])

    def test_usage_errors(self):
        for args in (["--hash", "sha256"], ["--block-size", "0"], ["--seed", "-1"], ["12", "x"],
                     ["4294967296"]):
            got = self.atc(*args)
            self.assertEqual(got.returncode, 2, args)
            self.assertIn("atc kv-keys", got.stderr)


if __name__ == "__main__":
    unittest.main()
