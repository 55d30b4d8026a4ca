"""The guess's error in /metrics (issue 29): atc's prefix index guesses what a server holds from where atc
sent each prompt; the server's own usage.prompt_tokens_details.cached_tokens says what it held. A prompt
sent to the server around atc is cached there without atc knowing: the guess says 0, the server says
more, and atc_prefix_guess_* count the difference per endpoint."""

import unittest

from harness import AtcTestCase, chat, request

POLICY = """
return function(req, fleet)
  return fleet:endpoints(req.model)[1]
end
"""


class PrefixGuessTest(AtcTestCase):
    def metrics(self, atc):
        status, _, body = request("127.0.0.1", atc.admin_port, "GET", "/metrics")
        self.assertEqual(status, 200)
        out = {}
        for line in body.decode().splitlines():
            if line.startswith("atc_prefix_guess_") and 'endpoint="s"' in line:
                out[line.split("{")[0][len("atc_prefix_guess_"):]] = int(line.split()[-1])
        return out

    def atc_in_front(self, sim, extra=""):
        """atc with the one endpoint s (and @p extra keys on it), always routed there."""
        return self.start_atc(f"""
            listen: 127.0.0.1:0
            admin: 127.0.0.1:0
            health: {{enabled: false}}
            policy: {{entry: {self.write_policy(POLICY)}}}
            models:
              - name: llama-3-8b
                endpoints:
                  - id: s
                    url: {sim.url}
                    {extra}
            """)

    def test_traffic_around_atc_shows_as_the_guess_error(self):
        sim = self.start_sim("s")
        atc = self.atc_in_front(sim)
        self.assertEqual(self.metrics(atc), {"answers_total": 0, "cached_tokens_total": 0,
                                             "reported_cached_tokens_total": 0, "error_tokens_total": 0})
        around = "a prompt another client sent straight to the server. " * 60
        status, _, _ = chat(sim.port, content=around)  # around atc: the server caches it, atc never sees it
        self.assertEqual(status, 200)
        status, _, _ = chat(atc.port, content=around)
        self.assertEqual(status, 200)
        m = self.metrics(atc)
        self.assertEqual(m["answers_total"], 1)
        self.assertEqual(m["cached_tokens_total"], 0)  # the guess: never sent there
        self.assertGreater(m["reported_cached_tokens_total"], 500)  # the server: most of it cached
        self.assertEqual(m["error_tokens_total"], m["reported_cached_tokens_total"])

        # A prompt atc sent itself: the guess credits the server with it on the repeat, as the server does.
        mine = "a prompt that only ever goes through atc. " * 60
        for _ in range(2):
            status, _, _ = chat(atc.port, content=mine)
            self.assertEqual(status, 200)
        m2 = self.metrics(atc)
        self.assertEqual(m2["answers_total"], 3)
        self.assertGreater(m2["cached_tokens_total"], 500)
        self.assertGreater(m2["reported_cached_tokens_total"] - m["reported_cached_tokens_total"], 500)

    def test_a_long_answer_pushes_an_older_prompt_out_of_the_guess(self):
        # A 1,024-token cache. Prompt A (~400 tokens) is cached; then a short prompt whose 1,000-token answer
        # takes the room, so the server evicts A's blocks (vLLM frees a request's blocks to the end of its
        # free queue when it ends, and allocation takes from the front). atc counts an answer's tokens
        # into the server's LRU clock when the request ends (relay.c release_endpoint): sent again, A is
        # guessed 0 cached, as the server says. Counting prompts only, the guess would say ~400.
        sim = self.start_sim("s", extra=["--kv-blocks", "64", "--decode-ms", "0.2"])
        atc = self.atc_in_front(sim, "kv_tokens: 1024")
        a = "an older prompt the long answer pushes out. " * 36
        for content, max_tokens in [(a, 8), ("write a long story", 1000), (a, 8)]:
            status, _, body = chat(atc.port, content=content, max_tokens=max_tokens)
            self.assertEqual(status, 200, body)
        m = self.metrics(atc)
        self.assertEqual(m["answers_total"], 3)
        self.assertEqual(m["reported_cached_tokens_total"], 0)  # the server evicted A
        self.assertEqual(m["cached_tokens_total"], 0)  # and the guess knows it
        self.assertEqual(m["error_tokens_total"], 0)


if __name__ == "__main__":
    unittest.main()
