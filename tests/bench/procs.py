"""The processes of a tests/bench/run: backends and proxies on free loopback ports, and their cleanup.

Every process gets a session (so a process group) of its own and, through PR_SET_PDEATHSIG, a SIGTERM from
the kernel should the runner die; Children.stop_all() stops each group with SIGTERM, then SIGKILL after a
grace time, and is called on success, error and Ctrl-C alike. atc and the simulated servers bind port 0 and
say their port in a ready file; nginx and HAProxy cannot, so they get a port that was free a moment before
(bound and closed here) and are started again on another one if it was taken in between.
"""

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
PEERS = os.path.join(HERE, "peers")
MODEL = "llama-3-8b"
PR_SET_PDEATHSIG = 1

NGINX_MODULES = "/usr/lib/nginx/modules"
# What each tool is called in Debian 12, for apt-get.
PACKAGES = {
    "wrk": ["wrk"],
    "nginx": ["nginx", "libnginx-mod-http-lua"],
    "haproxy": ["haproxy"],
}

try:
    _LIBC = ctypes.CDLL(None, use_errno=True)
except OSError:
    _LIBC = None


class BenchError(Exception):
    pass


def _child_setup():
    """Runs in the child before exec: the kernel sends it SIGTERM when the runner goes away."""
    if _LIBC is not None:
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _group_alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


class Children:
    """Every process group the run started, stopped in reverse order."""

    def __init__(self, workdir):
        self.workdir = workdir
        self.procs = []

    def spawn(self, name, args, env=None, cwd=ROOT):
        log_path = os.path.join(self.workdir, f"{name}.log")
        with open(log_path, "ab") as log:
            # A session of its own: a Ctrl-C in the terminal reaches only the runner, which then stops the
            # children in order (the loaders first, so that servers drain quickly).
            p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd,
                                 env=env, start_new_session=True, preexec_fn=_child_setup)
        p.bench_name = name
        p.log_path = log_path
        self.procs.append(p)
        return p

    def stop(self, p, grace=5.0):
        """SIGTERM to the process group, SIGKILL to whatever of it is left after grace seconds."""
        if p.returncode is None and p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                p.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        # The leader may be gone while its group is not (nginx workers finishing their requests).
        deadline = time.monotonic() + grace
        while _group_alive(p.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if p.returncode is None:
            p.wait()
        if p in self.procs:
            self.procs.remove(p)

    def stop_all(self):
        for p in reversed(list(self.procs)):
            self.stop(p)


def log_tail(p, n=2000):
    try:
        with open(p.log_path, "rb") as f:
            return f.read()[-n:].decode(errors="replace")
    except OSError:
        return ""


def ready_path(kids, name):
    """Where a process says it is ready; never a stale file of an earlier process of the same name."""
    path = os.path.join(kids.workdir, f"{name}.ready")
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    return path


def wait_ready_file(p, path, timeout=15.0):
    deadline = time.monotonic() + timeout
    while True:
        if p.poll() is not None:
            raise BenchError(f"{p.bench_name} exited with {p.returncode}:\n{log_tail(p)}")
        try:
            with open(path) as f:
                return json.load(f)
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        if time.monotonic() > deadline:
            raise BenchError(f"{p.bench_name}: no ready file after {timeout}s:\n{log_tail(p)}")
        time.sleep(0.01)


def wait_listening(p, addr, timeout=15.0):
    """Waits until addr accepts connections; returns False if p exited first (its log says why)."""
    deadline = time.monotonic() + timeout
    while p.poll() is None:
        try:
            with socket.create_connection(addr, timeout=1):
                return True
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise BenchError(f"{p.bench_name}: not listening on {addr[0]}:{addr[1]} after {timeout}s:\n"
                             f"{log_tail(p)}")
        time.sleep(0.02)
    return False


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def hostport(listen):
    host, port = listen.rsplit(":", 1)
    return host, int(port)


def children_of(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


class Server:
    """One started backend or proxy: where it listens, which processes to meter (CPU) and which one's
    resident memory counts (the worker)."""

    def __init__(self, name, label, proc, addr, worker_pid=None):
        self.name, self.label, self.proc, self.addr = name, label, proc, addr
        self.worker_pid = worker_pid or proc.pid

    def pids(self):
        return [self.proc.pid] + [c for c in children_of(self.proc.pid)]


# --- backends ------------------------------------------------------------------------------------------


def start_static_backend(kids, build_dir, name):
    exe = os.path.join(build_dir, "tests", "static_backend")
    ready = ready_path(kids, name)
    p = kids.spawn(name, [exe, "--listen", "127.0.0.1:0", "--ready-file", ready])
    return Server(name, name, p, hostport(wait_ready_file(p, ready)["listen"]))


def start_sim(kids, atc_bin, name, flags):
    ready = ready_path(kids, name)
    p = kids.spawn(name, [atc_bin, "sim", "--listen", "127.0.0.1:0", "--model", MODEL, "--ready-file", ready,
                          *flags])
    return Server(name, name, p, hostport(wait_ready_file(p, ready)["listen"]))


# --- atc -------------------------------------------------------------------------------------------------


def atc_supports_workers(atc_bin, workdir):
    """Whether this atc build knows `workers:` (issue 8's worker threads): `atc check` on a config with it."""
    path = os.path.join(workdir, "workers-probe.yaml")
    with open(path, "w") as f:
        f.write("listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\nworkers: 2\nmodels:\n  - name: m\n    endpoints:\n"
                "      - {id: a, url: \"http://127.0.0.1:9\"}\n")
    try:
        r = subprocess.run([atc_bin, "check", "-c", path], capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0


def start_atc(kids, atc_bin, name, label, backends, *, policy, capacity, keepalive, workers=None, extra=()):
    """atc serve in front of backends; policy: the shipped scripts/policy.lua, or None for the built-in C
    balancer. workers: written to the config only when set (builds before worker threads reject the key).
    extra: more top-level config lines."""
    endpoints = "\n".join(
        f'      - {{id: {b.name}, url: "http://{b.addr[0]}:{b.addr[1]}", capacity: {capacity}}}' for b in backends)
    lines = ["listen: 127.0.0.1:0", "admin: 127.0.0.1:0", "drain_timeout: 1s", *extra]
    if workers is not None:
        lines.append(f"workers: {workers}")
    if policy:
        lines.append(f"policy: {{entry: \"{os.path.join(ROOT, 'scripts', 'policy.lua')}\"}}")
    lines += [f"upstream: {{keepalive: {keepalive}, tries: 2}}", "models:", f"  - name: {MODEL}", "    endpoints:",
              endpoints]
    config = os.path.join(kids.workdir, f"{name}.yaml")
    with open(config, "w") as f:
        f.write("\n".join(lines) + "\n")
    ready = ready_path(kids, name)
    p = kids.spawn(name, [atc_bin, "serve", "-c", config, "--ready-file", ready])
    return Server(name, label, p, hostport(wait_ready_file(p, ready)["listen"]))


# --- nginx + lua-nginx-module ----------------------------------------------------------------------------


def _nginx_config(prefix, port, backends, workers, keepalive):
    servers = ", ".join(f'{{"{b.addr[0]}", {b.addr[1]}}}' for b in backends)
    return f"""\
# Written by tests/bench/run. One worker (unless asked for more), a least-loaded pick in Lua for every
# request (peers/nginx_pick.lua), keep-alive to the backends, no access log, responses not buffered
# (as in front of an LLM server, where most answers stream).
load_module {NGINX_MODULES}/ndk_http_module.so;
load_module {NGINX_MODULES}/ngx_http_lua_module.so;
daemon off;
master_process on;
worker_processes {workers};
worker_rlimit_nofile 20000;
pid {prefix}/nginx.pid;
error_log stderr warn;
events {{
  worker_connections 19000;
}}
http {{
  access_log off;
  keepalive_requests 1000000;
  keepalive_timeout 60s;
  client_body_temp_path {prefix}/client_body;
  proxy_temp_path {prefix}/proxy;
  fastcgi_temp_path {prefix}/fastcgi;
  uwsgi_temp_path {prefix}/uwsgi;
  scgi_temp_path {prefix}/scgi;
  lua_package_path "{PEERS}/?.lua;;";
  init_by_lua_block {{
    pick = require "nginx_pick"
    pick.setup({{{servers}}})
  }}
  upstream fleet {{
    server 0.0.0.1;  # never used: balancer_by_lua sets the peer of every request
    balancer_by_lua_block {{ pick.balance() }}
    keepalive {keepalive};
    keepalive_requests 1000000;
    keepalive_timeout 60s;
  }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://fleet;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_read_timeout 60s;
      log_by_lua_block {{ pick.done() }}
    }}
  }}
}}
"""


def start_nginx(kids, name, label, backends, *, workers=1, keepalive=64):
    prefix = os.path.join(kids.workdir, name)
    os.makedirs(prefix, exist_ok=True)
    # Run as root, nginx's workers switch to nobody, who must be able to walk into the prefix.
    os.chmod(kids.workdir, 0o711)
    os.chmod(prefix, 0o711)
    for attempt in range(4):
        port = free_port()
        conf = os.path.join(prefix, "nginx.conf")
        with open(conf, "w") as f:
            f.write(_nginx_config(prefix, port, backends, workers, keepalive))
        p = kids.spawn(name, ["nginx", "-p", prefix, "-c", conf, "-e", "stderr"])
        if wait_listening(p, ("127.0.0.1", port)):
            break
        kids.stop(p)
        if "in use" not in log_tail(p) or attempt == 3:
            raise BenchError(f"{name} exited with {p.returncode}:\n{log_tail(p)}")
    deadline = time.monotonic() + 10
    while len(children_of(p.pid)) < workers and time.monotonic() < deadline:
        time.sleep(0.02)
    workers_pids = children_of(p.pid)
    return Server(name, label, p, ("127.0.0.1", port), worker_pid=workers_pids[0] if workers_pids else p.pid)


# --- HAProxy + Lua ---------------------------------------------------------------------------------------


def _haproxy_config(port, backends, threads):
    use = "\n".join(f"  use-server {b.name} if {{ var(txn.atc_server) -m str {b.name} }}" for b in backends)
    servers = "\n".join(f"  server {b.name} {b.addr[0]}:{b.addr[1]}" for b in backends)
    return f"""\
# Written by tests/bench/run. One thread (unless asked for more), a least-loaded pick in Lua for every
# request (peers/haproxy_pick.lua) through use-server, keep-alive to the backends, no log. http-no-delay:
# without it HAProxy sends with MSG_MORE while a chunked response is unfinished, and the kernel holds an SSE
# event up to 200 ms (the first token of a stream came ~100 ms late).
global
  nbthread {threads}
  maxconn 9500
  lua-load {PEERS}/haproxy_pick.lua
defaults
  mode http
  maxconn 9500
  timeout connect 2s
  timeout client 60s
  timeout server 60s
  option http-keep-alive
  http-reuse always
  option http-no-delay
frontend front
  bind 127.0.0.1:{port}
  http-request lua.atc_pick
  default_backend fleet
backend fleet
  http-response lua.atc_done
{use}
{servers}
"""


def start_haproxy(kids, name, label, backends, *, threads=1):
    for attempt in range(4):
        port = free_port()
        conf = os.path.join(kids.workdir, f"{name}.cfg")
        with open(conf, "w") as f:
            f.write(_haproxy_config(port, backends, threads))
        p = kids.spawn(name, ["haproxy", "-f", conf, "-db"])
        if wait_listening(p, ("127.0.0.1", port)):
            return Server(name, label, p, ("127.0.0.1", port))
        kids.stop(p)
        if "bind" not in log_tail(p).lower() or attempt == 3:
            raise BenchError(f"{name} exited with {p.returncode}:\n{log_tail(p)}")


# --- tools ---------------------------------------------------------------------------------------------


def _tool_present(tool):
    if tool == "nginx":
        return shutil.which("nginx") is not None and os.path.exists(
            os.path.join(NGINX_MODULES, "ngx_http_lua_module.so"))
    return shutil.which(tool) is not None


def ensure_tools(tools, install):
    """Installs the missing ones of tools (wrk, nginx, haproxy) with apt-get when allowed and possible.
    Returns {tool: why it is still missing}."""
    missing = [t for t in tools if not _tool_present(t)]
    if missing and install:
        if os.geteuid() != 0:
            return {t: "not installed (run as root to have the bench install it, or apt-get install -y "
                       f"{' '.join(PACKAGES[t])})" for t in missing}
        pkgs = [pkg for t in missing for pkg in PACKAGES[t]]
        print(f"bench: installing {' '.join(pkgs)} with apt-get", file=sys.stderr)
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        cmd = ["apt-get", "install", "-y", "--no-install-recommends", *pkgs]
        try:
            if subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, timeout=600).returncode != 0:
                subprocess.run(["apt-get", "update"], env=env, stdout=subprocess.DEVNULL, timeout=600)
                subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, timeout=600)
        except (OSError, subprocess.SubprocessError) as e:
            print(f"bench: apt-get failed: {e}", file=sys.stderr)
        missing = [t for t in tools if not _tool_present(t)]
    return {t: f"not installed (apt-get install -y {' '.join(PACKAGES[t])})" for t in missing}


def raise_nofile():
    """Raises this process's open-file limit to its hard limit; children inherit it."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
