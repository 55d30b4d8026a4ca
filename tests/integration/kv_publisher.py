"""A fake engine publishing KV-cache events as vLLM does, for test_kv_events.py. Written from vLLM's wire
format (vllm/distributed/kv_events.py, ZmqEventPublisher), not from atc's code: three frames per message
(topic, 8-byte big-endian sequence number, msgpack EventBatch); a ROUTER replay socket that answers
[identity, empty, start_seq] with [identity, empty, seq, payload] for each buffered batch from start_seq,
then [identity, empty, -1 as 8 signed bytes, empty].

Runs under Debian's /usr/bin/python3 (python3-zmq, python3-msgpack). It binds an XPUB socket (a PUB that
also hears subscriptions, so the test knows when atc has subscribed) and a ROUTER on free loopback ports,
prints {"pub": ..., "replay": ...} and then reads one JSON command per line from stdin, answering "ok"
(or a JSON value) per line:
  {"op": "wait_subscribed"}
  {"op": "batch", "seq": N, "encoding": "array"|"map", "events": [["stored", [keys], medium|null],
     ["removed", [keys], medium|null], ["cleared"], ["other"]], "publish": true|false}
  {"op": "raw", "seq": N, "hex": "..."}     a payload as given (garbage)
  {"op": "frames", "hex": ["..", ..]}       a message of any frames
  {"op": "replay", "mode": "answer"|"silent"}
"""

import json
import sys
import threading
import time

import msgpack
import zmq

ctx = zmq.Context()
pub = ctx.socket(zmq.XPUB)
pub.bind("tcp://127.0.0.1:*")
router = ctx.socket(zmq.ROUTER)
router.bind("tcp://127.0.0.1:*")
buffer = []  # (seq, payload)
lock = threading.Lock()
mode = {"replay": "answer", "requests": 0}


def event(e, encoding):
    kind = e[0]
    if kind == "stored":
        fields = {"block_hashes": e[1], "parent_block_hash": None, "token_ids": list(range(16 * len(e[1]))),
                  "block_size": 16, "lora_id": None, "medium": e[2], "lora_name": None}
        order = ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"]
        tag = "BlockStored"
        if e[2] is None:  # an older build: no medium and nothing after it
            order = order[:5]
            del fields["medium"], fields["lora_name"]
    elif kind == "removed":
        fields = {"block_hashes": e[1], "medium": e[2]}
        order = ["block_hashes", "medium"] if e[2] is not None else ["block_hashes"]
        tag = "BlockRemoved"
        if e[2] is None:
            del fields["medium"]
    elif kind == "cleared":
        fields, order, tag = {}, [], "AllBlocksCleared"
    else:
        fields, order, tag = {"x": 1}, ["x"], "SomeFutureEvent"
    if encoding == "array":  # msgspec array_like=True, tag=True: the tag first, then the fields in order
        return [tag] + [fields[k] for k in order]
    return dict({"type": tag}, **fields)  # msgspec's default: a map with the tag under "type"


def batch(events, encoding):
    evs = [event(e, encoding) for e in events]
    if encoding == "array":
        return msgpack.packb([time.time(), evs, 0])
    return msgpack.packb({"ts": time.time(), "events": evs, "data_parallel_rank": 0})


def send(seq, payload, publish=True):
    with lock:
        buffer.append((seq, payload))
    if publish:
        pub.send_multipart([b"", seq.to_bytes(8, "big"), payload])


def serve_replay():
    poller = zmq.Poller()
    poller.register(router, zmq.POLLIN)
    while True:
        if not poller.poll(100):
            continue
        frames = router.recv_multipart()
        mode["requests"] += 1
        if mode["replay"] != "answer" or len(frames) != 3:
            continue
        ident, _, start = frames
        start = int.from_bytes(start, "big")
        with lock:
            items = [(s, p) for s, p in buffer if s >= start]
        for s, p in items:
            router.send_multipart([ident, b"", s.to_bytes(8, "big"), p])
        router.send_multipart([ident, b"", (-1).to_bytes(8, "big", signed=True), b""])


def main():
    print(json.dumps({"pub": pub.getsockopt(zmq.LAST_ENDPOINT).decode(),
                      "replay": router.getsockopt(zmq.LAST_ENDPOINT).decode()}), flush=True)
    threading.Thread(target=serve_replay, daemon=True).start()
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        out = "ok"
        if op == "wait_subscribed":
            if not pub.poll(10000):
                out = "timeout"
            else:
                pub.recv()
        elif op == "batch":
            send(cmd["seq"], batch(cmd["events"], cmd.get("encoding", "array")), cmd.get("publish", True))
        elif op == "raw":
            send(cmd["seq"], bytes.fromhex(cmd["hex"]))
        elif op == "frames":
            pub.send_multipart([bytes.fromhex(h) for h in cmd["hex"]])
        elif op == "replay":
            mode["replay"] = cmd["mode"]
        elif op == "requests":
            out = json.dumps(mode["requests"])
        print(out, flush=True)


main()
