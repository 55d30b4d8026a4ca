#!/usr/bin/env python3
"""A synthetic conversation trace in Mooncake's format, for checking a policy on traffic unlike the
traces it was fitted on: `examples/replay/conversations.py [SEED] [--sessions] > conversations.jsonl`,
then `atc replay -c examples/replay/mooncake.yaml --trace conversations.jsonl --format mooncake ...`.
With --sessions each chat's turns carry its session ("session": "chat-N", which atc's import reads as
a client's x-atc-session); the requests are the same.

900 multi-turn chats over about 20 minutes, each opening with one of 24 shared system prompts (1-8
blocks of 512 tokens); every turn resends the conversation so far plus the user's new 1-5 blocks, and
the answer joins the context; turns are 25 s apart on average plus the time to read the answer. Beside
them, 1,500 one-off documents of 3-30 blocks that share nothing. Deterministic for a seed: about 8,000
requests, 10k prompt tokens on average, 72% of prompt blocks repeating an earlier prefix."""
import json
import random
import sys

BLOCK_TOKENS = 512  # Mooncake's hash_ids: one id per 512-token block


def main():
    args = [a for a in sys.argv[1:] if a != "--sessions"]
    sessions = "--sessions" in sys.argv[1:]
    rng = random.Random(int(args[0]) if args else 11)
    next_id = [10**6]

    def fresh(n):
        out = list(range(next_id[0], next_id[0] + n))
        next_id[0] += n
        return out

    systems = [fresh(rng.randint(1, 8)) for _ in range(24)]
    events = []
    for chat in range(900):
        ids = list(rng.choice(systems))
        t = rng.uniform(0, 1200) * 1000
        for _ in range(rng.randint(1, 14)):
            ids = ids + fresh(rng.randint(1, 5))
            out = int(rng.lognormvariate(4.6, 0.8)) + 5
            events.append({"timestamp": int(t), "input_length": len(ids) * BLOCK_TOKENS + rng.randint(0, BLOCK_TOKENS - 1),
                           "output_length": out, "hash_ids": ids})
            if sessions:
                events[-1]["session"] = "chat-%d" % chat
            ids = ids + fresh(out // BLOCK_TOKENS)
            t += rng.expovariate(1 / 25000.0) + out * 15
    for _ in range(1500):
        n = rng.randint(3, 30)
        events.append({"timestamp": int(rng.uniform(0, 1200) * 1000), "input_length": n * BLOCK_TOKENS,
                       "output_length": rng.randint(20, 300), "hash_ids": fresh(n)})
    events.sort(key=lambda e: e["timestamp"])
    for e in events:
        print(json.dumps(e))


if __name__ == "__main__":
    main()
