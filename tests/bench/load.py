"""The load of tests/bench/run: wrk for small requests, and asyncio clients for streams (a keep-alive one at
fixed concurrency, and one that holds thousands of slow streams open at once). Plus /proc meters."""

import asyncio
import errno
import json
import os
import select
import socket
import time

from procs import MODEL, BenchError, HERE, log_tail

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


def cpu_times(pid):
    """(user, system) CPU seconds of a live process and all its threads, from /proc ((0, 0) if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return 0.0, 0.0
    fields = stat[stat.rfind(")") + 2:].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def cpu_seconds(pid):
    return sum(cpu_times(pid))


def rss_kib(pid):
    """Resident memory of a process in KiB (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE_KIB
    except OSError:
        return 0


def listen_overflows():
    """TcpExt ListenOverflows of this network namespace: connections dropped because a listen queue was
    full (the client then waits for a SYN retransmit, 1 s, then 3 s). Counts every process's listeners."""
    try:
        with open("/proc/net/netstat") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for names, values in zip(lines[::2], lines[1::2]):
        if names.startswith("TcpExt:"):
            row = dict(zip(names.split()[1:], values.split()[1:]))
            return int(row.get("ListenOverflows", 0))
    return None


class CpuMeter:
    """CPU seconds a set of processes used since the meter was made (used(): user + system; kernel():
    system alone)."""

    def __init__(self, pids):
        self.pids = list(pids)
        self.start = [cpu_times(p) for p in self.pids]

    def used(self):
        return sum(sum(cpu_times(p)) - sum(s) for p, s in zip(self.pids, self.start))

    def kernel(self):
        return sum(cpu_times(p)[1] - s[1] for p, s in zip(self.pids, self.start))


def percentile(sorted_values, q):
    if not sorted_values:
        return float("nan")
    k = max(0, min(len(sorted_values) - 1, int(round(q / 100 * len(sorted_values) + 0.5)) - 1))
    return sorted_values[k]


def chat_body(stream, max_tokens):
    return json.dumps({"model": MODEL, "max_tokens": max_tokens, "stream": stream,
                       "messages": [{"role": "user", "content": "Tell me a story."}]}).encode()


def post_request(addr, body):
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {addr[0]}:{addr[1]}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


# --- wrk -----------------------------------------------------------------------------------------------


def run_wrk(kids, name, addr, duration, connections, threads, delay_ms=None):
    """wrk with chat.lua against addr for duration seconds; returns its ATC-BENCH line as a dict, plus
    "loader_cpu" (wrk's own CPU seconds). delay_ms: each connection waits this long between requests
    (paced load); the latency wrk reports leaves the wait out."""
    env = dict(os.environ, ATC_BENCH_MODEL=MODEL)
    if delay_ms:
        env["ATC_BENCH_DELAY_MS"] = str(delay_ms)
    secs = max(1, round(duration))
    cmd = ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{secs}s", "--timeout", "5s",
           "-s", os.path.join(HERE, "chat.lua"), f"http://{addr[0]}:{addr[1]}/v1/chat/completions"]
    p = kids.spawn(name, cmd, env=env)
    # wait4 rather than wait: it also gives wrk's CPU time, which tells how much of the machine the loader
    # took. Polled, so that a wrk that hangs is killed after its time.
    deadline = time.monotonic() + secs + 15
    while True:
        pid, status, usage = os.wait4(p.pid, os.WNOHANG)
        if pid == p.pid:
            p.returncode = os.waitstatus_to_exitcode(status)
            break
        if time.monotonic() > deadline:
            kids.stop(p)
            raise BenchError(f"wrk ({name}) did not finish within {secs + 15}s")
        time.sleep(0.05)
    kids.stop(p)
    out = log_tail(p, 1 << 20)
    for line in reversed(out.splitlines()):  # the last one: a log reused under the same name keeps older runs
        if line.startswith("ATC-BENCH "):
            r = json.loads(line[len("ATC-BENCH "):])
            r["loader_cpu"] = usage.ru_utime + usage.ru_stime
            r["errors"] = sum(r[k] for k in ("connect_errors", "read_errors", "write_errors", "status_errors",
                                             "timeouts"))
            r["rps"] = r["requests"] / (r["duration_us"] / 1e6)
            return r
    raise BenchError(f"wrk exited with {p.returncode} without a result:\n{out[-2000:]}")


# --- streams at fixed concurrency ------------------------------------------------------------------------

FIRST_TOKEN = b'"delta":{"content"'  # the first event carrying a token (the role-only event comes before)


class StreamConn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection that runs one request at a time and decodes the response body
    (chunked or with a length), noting when the response head, the first token event and the end arrive."""

    def __init__(self):
        self.transport = None
        self.waiter = None
        self.closed = False
        self.buf = bytearray()
        self.state = "idle"

    def connection_made(self, transport):
        self.transport = transport

    def connection_lost(self, exc):
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError(f"connection lost: {exc}"))

    def request(self, data):
        self.waiter = asyncio.get_running_loop().create_future()
        self.state = "head"
        self.status = 0
        self.body = bytearray()
        self.head_at = self.first_at = None
        self.keep = True
        self.transport.write(data)
        return self.waiter

    def data_received(self, data):
        if self.head_at is None:
            self.head_at = time.monotonic()
        self.buf += data
        try:
            self._parse()
        except Exception as e:  # a malformed response: fail the request, drop the connection
            if not self.waiter.done():
                self.waiter.set_exception(ConnectionError(f"bad response: {e}"))
            self.transport.close()

    def _on_body(self, piece):
        before = len(self.body)
        self.body += piece
        if self.first_at is None and self.body.find(FIRST_TOKEN, max(0, before - len(FIRST_TOKEN))) >= 0:
            self.first_at = time.monotonic()

    def _finish(self):
        self.state = "done"
        now = time.monotonic()
        if self.first_at is None:
            self.first_at = now
        if not self.waiter.done():
            self.waiter.set_result((self.status, self.head_at, self.first_at, now, self.body.count(b"data: "),
                                    len(self.body)))
        if not self.keep:
            self.closed = True
            self.transport.close()

    def _parse(self):
        buf = self.buf
        while True:
            if self.state == "head":
                i = buf.find(b"\r\n\r\n")
                if i < 0:
                    return
                lines = bytes(buf[:i]).decode("latin-1").split("\r\n")
                del buf[:i + 4]
                self.status = int(lines[0].split(" ", 2)[1])
                headers = {}
                for line in lines[1:]:
                    k, _, v = line.partition(":")
                    headers[k.strip().lower()] = v.strip().lower()
                self.keep = headers.get("connection") != "close"
                if "chunked" in headers.get("transfer-encoding", ""):
                    self.state = "size"
                else:
                    self.remaining = int(headers.get("content-length", "0"))
                    self.state = "length"
                    if self.remaining == 0:
                        self._finish()
                        return
            elif self.state == "size":
                i = buf.find(b"\r\n")
                if i < 0:
                    return
                size = int(bytes(buf[:i]).split(b";")[0], 16)
                del buf[:i + 2]
                if size == 0:
                    self.state = "trailer"
                else:
                    self.remaining = size
                    self.state = "data"
            elif self.state in ("data", "length"):
                if not buf:
                    return
                take = min(self.remaining, len(buf))
                self._on_body(buf[:take])
                del buf[:take]
                self.remaining -= take
                if self.remaining == 0:
                    if self.state == "length":
                        self._finish()
                        return
                    self.state = "crlf"
            elif self.state == "crlf":
                if len(buf) < 2:
                    return
                del buf[:2]
                self.state = "size"
            elif self.state == "trailer":
                i = buf.find(b"\r\n")
                if i < 0:
                    return
                empty = i == 0
                del buf[:i + 2]
                if empty:
                    self._finish()
                    return
            else:  # "idle" or "done": bytes outside a response; nothing is pipelined, so not expected
                return


async def stream_load(addrs, streams, duration, tokens):
    """streams connections, each running streaming requests back to back for duration seconds; connection i
    goes to addrs[i % len(addrs)]."""
    requests = [post_request(addr, chat_body(True, tokens)) for addr in addrs]
    loop = asyncio.get_running_loop()
    ttfb, ttft, total = [], [], []
    counts = {"events": 0, "bytes": 0, "errors": 0, "short": 0}
    start = time.monotonic()
    deadline = start + duration

    async def worker(i):
        addr, request = addrs[i % len(addrs)], requests[i % len(addrs)]
        conn = None
        while time.monotonic() < deadline:
            try:
                if conn is None or conn.closed:
                    _, conn = await loop.create_connection(StreamConn, addr[0], addr[1])
                t0 = time.monotonic()
                status, head, first, end, events, nbytes = await asyncio.wait_for(conn.request(request), 30)
            except (OSError, ConnectionError, asyncio.TimeoutError):
                counts["errors"] += 1
                if conn is not None and conn.transport is not None:
                    conn.transport.close()
                conn = None
                await asyncio.sleep(0.01)
                continue
            if status != 200:
                counts["errors"] += 1
                continue
            if events < tokens:  # a stream that ended early (an error event, or cut)
                counts["short"] += 1
            ttfb.append(head - t0)
            ttft.append(first - t0)
            total.append(end - t0)
            counts["events"] += events
            counts["bytes"] += nbytes
        if conn is not None and conn.transport is not None:
            conn.transport.close()

    await asyncio.gather(*(worker(i) for i in range(streams)))
    wall = time.monotonic() - start
    for v in (ttfb, ttft, total):
        v.sort()
    return {"streams_per_s": len(total) / wall, "events_per_s": counts["events"] / wall,
            "events": counts["events"], "completed": len(total), "errors": counts["errors"] + counts["short"],
            "wall": wall,
            "ttfb_p50_ms": percentile(ttfb, 50) * 1e3, "ttfb_p99_ms": percentile(ttfb, 99) * 1e3,
            "ttft_p50_ms": percentile(ttft, 50) * 1e3, "ttft_p99_ms": percentile(ttft, 99) * 1e3,
            "total_p50_ms": percentile(total, 50) * 1e3, "total_p99_ms": percentile(total, 99) * 1e3}


# --- thousands of slow streams held open at once ---------------------------------------------------------

DONE = b"data: [DONE]"
EVENT = b"data: "
LAST_CHUNK = b"0\r\n\r\n"


class _Stream:
    __slots__ = ("sock", "request", "status", "head", "events", "done_seen", "tail", "connected")

    def __init__(self, sock, request):
        self.sock, self.request = sock, request
        self.status = None
        self.head = b""
        self.events = 0
        self.done_seen = False
        self.tail = b""
        self.connected = False


class Hold:
    """Opens n streaming requests, each on its own connection, spread evenly over ramp seconds (at most
    `connecting` connects pending at once, to stay inside the server's listen backlog), stream i to
    addrs[i % len(addrs)]; counts how many are open at once (status line received, end not yet) and how many
    complete (status 200, at least `tokens` events, the [DONE] event and the last chunk); samples the
    resident memory of one process (rss_pid, if any) every 50 ms.

    A plain epoll loop rather than asyncio: 8,000 streams of an event every 100 ms are 80,000 reads a second,
    which asyncio's per-read overhead turns into a whole core on a machine that has two."""

    def __init__(self, addrs, n, tokens, ramp, timeout, rss_pid=None, connecting=100):
        self.addrs, self.n, self.tokens, self.ramp, self.timeout = addrs, n, tokens, ramp, timeout
        self.rss_pid, self.connecting = rss_pid, connecting

    def run(self):
        requests = [post_request(addr, chat_body(True, self.tokens)) for addr in self.addrs]
        ep = select.epoll()
        streams = {}
        opened = pending = open_now = peak = completed = failed = 0
        rss_peak = rss_at_peak = 0
        timeline = []
        start = time.monotonic()
        deadline = start + self.timeout
        next_sample = start

        def finish(fd, st, ok):
            nonlocal open_now, completed, failed
            ep.unregister(fd)
            st.sock.close()
            del streams[fd]
            if st.status == 200:
                open_now -= 1
            if ok:
                completed += 1
            else:
                failed += 1

        try:
            while completed + failed < self.n:
                now = time.monotonic()
                if now > deadline:
                    break
                # Open what the ramp allows by now.
                due = self.n if self.ramp <= 0 else min(self.n, int(self.n * (now - start) / self.ramp) + 1)
                while opened < due and pending < self.connecting:
                    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    sock.setblocking(False)
                    which = opened % len(self.addrs)
                    err = sock.connect_ex(self.addrs[which])
                    if err not in (0, errno.EINPROGRESS):
                        sock.close()
                        failed += 1
                        opened += 1
                        continue
                    st = _Stream(sock, requests[which])
                    streams[sock.fileno()] = st
                    ep.register(sock.fileno(), select.EPOLLOUT | select.EPOLLIN)
                    opened += 1
                    pending += 1
                if now >= next_sample:
                    next_sample = now + 0.05
                    if self.rss_pid is not None:
                        rss = rss_kib(self.rss_pid)
                        rss_peak = max(rss_peak, rss)
                        if open_now == peak:
                            rss_at_peak = max(rss_at_peak, rss)
                    if not timeline or now - start >= timeline[-1][0] + 0.5:
                        timeline.append((round(now - start, 1), open_now))
                for fd, ev in ep.poll(0.01):
                    st = streams.get(fd)
                    if st is None:
                        continue
                    if not st.connected:
                        pending -= 1
                        st.connected = True
                        if st.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0:
                            finish(fd, st, False)
                            continue
                        st.sock.send(st.request)  # a few hundred bytes: a fresh socket takes them at once
                        ep.modify(fd, select.EPOLLIN)
                        continue
                    try:
                        data = st.sock.recv(65536)
                    except BlockingIOError:
                        continue
                    except OSError:
                        finish(fd, st, False)
                        continue
                    if not data:
                        finish(fd, st, False)
                        continue
                    if st.status is None:
                        st.head += data
                        k = st.head.find(b"\r\n\r\n")
                        if k < 0:
                            continue
                        try:
                            st.status = int(st.head[:k].split(b" ", 2)[1])
                        except (IndexError, ValueError):
                            st.status = 0
                        data, st.head = st.head[k + 4:], b""
                        if st.status != 200:
                            finish(fd, st, False)
                            continue
                        open_now += 1
                        peak = max(peak, open_now)
                    chunk = st.tail + data
                    st.events += chunk.count(EVENT)  # the tail is shorter than EVENT: nothing counted twice
                    if not st.done_seen and DONE in chunk:
                        st.done_seen = True
                    st.tail = chunk[-(len(DONE) - 1):]
                    if st.done_seen and chunk.endswith(LAST_CHUNK):
                        finish(fd, st, st.events >= self.tokens)
        finally:
            wall = time.monotonic() - start
            unfinished = self.n - completed - failed
            for st in streams.values():
                st.sock.close()
            ep.close()
        return {"streams": self.n, "peak_open": peak, "completed": completed, "failed": failed + unfinished,
                "timed_out": unfinished > 0, "wall": wall, "rss_peak_kib": rss_peak,
                "rss_at_peak_open_kib": rss_at_peak, "timeline": timeline}
