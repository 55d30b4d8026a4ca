#!/usr/bin/env python3
"""A synthetic trace in Mooncake's format whose arrivals and prefix sharing differ from both public traces
and from examples/replay/conversations.py, for judging a routing policy on data it was not fitted on:
`tests/bench/bursty_trace.py [SEED] > bursty.jsonl`, then `atc replay ... --trace bursty.jsonl --format
mooncake`.

Arrivals: a Markov-modulated Poisson process, calm (2 requests/s) and bursts (12/s) alternating with
exponential durations (mean 60 s calm, 15 s burst), over 15 minutes. Prefixes: every prompt opens with
the same 2-block system prompt (so a cold server always misses one more prefix than a warm one), then one
of 48 shared documents (Zipf popularity, 4-40 blocks), then its own 1-12 blocks; a quarter of the requests
are agent loops, 2-8 calls 1-4 s apart, each resending the previous call's prompt plus 1-3 new blocks.
Deterministic for a seed: about 4,500 requests."""
import json
import random
import sys

BLOCK_TOKENS = 512  # Mooncake's hash_ids: one id per 512-token block
DURATION_S = 900


def main():
    rng = random.Random(int(sys.argv[1]) if len(sys.argv) > 1 else 7)
    next_id = [2 * 10**6]

    def fresh(n):
        out = list(range(next_id[0], next_id[0] + n))
        next_id[0] += n
        return out

    system = fresh(2)
    docs = [fresh(rng.randint(4, 40)) for _ in range(48)]
    weights = [1.0 / (k + 1) for k in range(len(docs))]
    arrivals, t, burst = [], 0.0, False
    while t < DURATION_S:
        span = rng.expovariate(1 / (15.0 if burst else 60.0))
        rate = 12.0 if burst else 2.0
        u = t + rng.expovariate(rate)
        while u < min(t + span, DURATION_S):
            arrivals.append(u)
            u += rng.expovariate(rate)
        t += span
        burst = not burst
    events = []

    def emit(at, ids):
        events.append({"timestamp": int(at * 1000), "input_length": len(ids) * BLOCK_TOKENS + rng.randint(0, 300),
                       "output_length": max(2, int(rng.expovariate(1 / 120.0))), "hash_ids": ids})

    for at in arrivals:
        ids = system + rng.choices(docs, weights)[0] + fresh(rng.randint(1, 12))
        emit(at, ids)
        if rng.random() < 0.25:
            for _ in range(rng.randint(2, 8) - 1):
                at += rng.uniform(1, 4)
                ids = ids + fresh(rng.randint(1, 3))
                emit(at, ids)
    events.sort(key=lambda e: e["timestamp"])
    for e in events:
        print(json.dumps(e))


if __name__ == "__main__":
    main()
