"""The command line: help, version, check, and the shipped example configs."""

import json
import os
import re
import shutil
import subprocess
import unittest

from harness import ATC_BIN, SOURCE_DIR, AtcTestCase, stream_events


def run(*args, timeout=10, env=None):
    return subprocess.run([ATC_BIN, *args], capture_output=True, text=True, timeout=timeout, cwd=SOURCE_DIR,
                          env=env)


def read_doc(path):
    with open(os.path.join(SOURCE_DIR, path), encoding="utf-8") as f:
        return f.read()


def docs():
    """(path, text) of the README and every guide in docs/."""
    names = ["README.md"] + sorted(os.path.join("docs", n) for n in os.listdir(os.path.join(SOURCE_DIR, "docs"))
                                   if n.endswith(".md"))
    return [(n, read_doc(n)) for n in names]


def fenced_blocks(text):
    """(language, body, line of the opening fence) of every ``` block."""
    return [(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1)
            for m in re.finditer(r"(?ms)^```(\w*)\n(.*?)^```[ \t]*$", text)]


def strip_code(text):
    return re.sub(r"`[^`\n]*`", "", re.sub(r"(?ms)^```.*?^```[ \t]*$", "", text))


def section(text, heading):
    """The text under a heading, up to the next heading of the same level or above."""
    level = heading.split(" ", 1)[0]
    body = text.split("\n" + heading + "\n", 1)[1]
    return re.split(r"(?m)^#{1,%d} " % len(level), body, 1)[0]


def anchors(text):
    """GitHub's anchors of a markdown file: its headings' slugs and explicit ids."""
    found = set(re.findall(r'<a id="([^"]+)"', text))
    for heading in re.findall(r"(?m)^#+ (.+)$", re.sub(r"(?ms)^```.*?^```[ \t]*$", "", text)):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


class CliTest(AtcTestCase):
    def test_version_and_help(self):
        out = run("--version")
        self.assertEqual(out.returncode, 0)
        self.assertRegex(out.stdout, r"^atc \d+\.\d+\.\d+")
        out = run("--help")
        self.assertEqual(out.returncode, 0)
        for cmd in ("serve", "check", "sim"):
            self.assertIn(cmd, out.stdout)
        for cmd, flags in (("serve", ["--config", "--ready-file"]), ("check", ["--config"]),
                           ("sim", ["--listen", "--model", "--max-seqs", "--prefill-tps", "--decode-ms",
                                    "--kv-blocks", "--error-rate", "--hang-rate", "--not-ready-for",
                                    "--die-after", "--seed"])):
            with self.subTest(cmd):
                out = run(cmd, "--help")
                self.assertEqual(out.returncode, 0, out.stderr)
                for flag in flags:
                    self.assertIn(flag, out.stdout)
        # atc policy: in the command list, with a help of its own
        self.assertRegex(run("--help").stdout, r"(?m)^  policy .*canary.*promote.*rollback.*shadow")
        out = run("policy", "--help")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertTrue(out.stdout.startswith("usage: atc policy canary SHARE"), out.stdout)
        for word in ("promote", "rollback", "shadow clear", "armed"):
            self.assertIn(word, out.stdout)
        self.assertNotIn("atc drain", out.stdout)
        self.assertIn("atc policy --help", read_doc("README.md"))
        # every reference policy atc replay knows by name is in its help
        names = {n[:-4] for n in os.listdir(os.path.join(SOURCE_DIR, "examples", "policies")) if n.endswith(".lua")}
        replay_help = run("replay", "--help").stdout
        self.assertEqual({n for n in names if n not in replay_help}, set())
        self.assertRegex(read_doc("README.md"), r"(?m)^  explain: false +#")
        out = run("frobnicate")
        self.assertEqual(out.returncode, 2)
        self.assertIn("unknown command", out.stderr)

    def test_check_accepts_the_examples(self):
        for name in ("quickstart.yaml", "fleet.yaml"):
            with self.subTest(name):
                out = run("check", "-c", os.path.join("examples", name))
                self.assertEqual(out.returncode, 0, out.stderr)
                self.assertIn("ok", out.stdout)

    def test_check_accepts_the_kubernetes_example(self):
        # The atc config of examples/kubernetes/atc.yaml's ConfigMap passes atc check, laid out as the
        # Deployment mounts it (the config in config/, the atc-policy ConfigMap made from scripts/ in
        # policy/), and it discovers the Service and model of examples/kubernetes/vllm.yaml.
        manifest = read_doc(os.path.join("examples", "kubernetes", "atc.yaml"))
        block = re.search(r"(?m)^  atc\.yaml: \|\n((?:    .*\n|\n)+)", manifest)
        self.assertIsNotNone(block, "no atc.yaml: | in the ConfigMap")
        config = "".join(l[4:] + "\n" for l in block.group(1).splitlines())
        root = os.path.join(self.tmp.name, "etc-atc")
        os.makedirs(os.path.join(root, "config"))
        os.symlink(os.path.join(os.path.abspath(SOURCE_DIR), "scripts"), os.path.join(root, "policy"))
        self.assertIn("mountPath: /etc/atc/config,", manifest)
        self.assertIn("mountPath: /etc/atc/policy,", manifest)
        with open(os.path.join(root, "config", "atc.yaml"), "w") as f:
            f.write(config)
        out = run("check", "-c", os.path.join(root, "config", "atc.yaml"))
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("ok (1 model(s), 0 endpoint(s), policy compiled)", out.stdout)
        # the admin port is loopback and no container port; the SRV name is vllm.yaml's Service's
        self.assertRegex(config, r"(?m)^admin: 127\.0\.0\.1:8081 ")
        self.assertEqual(re.findall(r"containerPort: (\d+)", manifest), ["8080"])
        vllm = read_doc(os.path.join("examples", "kubernetes", "vllm.yaml"))
        service = vllm.split("kind: Service", 1)[1].split("---", 1)[0]
        name, namespace = re.search(r"name: (\S+)\n  namespace: (\S+)", service).groups()
        port = re.search(r"- name: (\S+) ", service).group(1)
        self.assertIn("clusterIP: None", service)
        self.assertRegex(config, rf"(?m)^ +srv: _{port}\._tcp\.{name}\.{namespace}\.svc\.cluster\.local$")
        served = re.search(r"--served-model-name=(\S+)", vllm).group(1)
        self.assertRegex(config, rf"(?m)^  - name: {re.escape(served)} ")

    def test_check_reports_the_policy_at_its_entry_key(self):
        # The quick start's own check: the policy's init sees the simulated endpoints, so it does not
        # warn that the models it serves are not served.
        out = run("check", "-c", os.path.join("examples", "quickstart.yaml"))
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertNotRegex(out.stderr, r"no endpoint serves '(llama-3-8b|qwen-2\.5-1\.5b)'")
        path = os.path.join(self.tmp.name, "p.yaml")
        policy = os.path.join(self.tmp.name, "p.lua")
        cases = {
            "missing": (None, r"cannot read .*p\.lua: No such file"),
            "syntax": ("return function(\n", r"p\.lua:2: .*expected"),
            "no route function": ("return 42\n", r"must return a function route\(req, fleet\)"),
            "fails a test request": ("return function(req) error('boom') end\n",
                                     r"p\.lua:1: boom \(on a test request"),
        }
        for name, (source, message) in cases.items():
            with self.subTest(name):
                if source is None:
                    if os.path.exists(policy):
                        os.remove(policy)
                else:
                    with open(policy, "w") as f:
                        f.write(source)
                with open(path, "w") as f:
                    f.write("models:\n  - name: m\nsimulate:\n  - model: m\npolicy:\n  budget: 5ms\n"
                            "  entry:   p.lua\n")
                out = run("check", "-c", path)
                self.assertEqual(out.returncode, 1, out.stdout)
                self.assertRegex(out.stderr, "(?m)^" + re.escape(path) + r":7:12: key 'policy\.entry': .*" + message)
                self.assertNotIn("ok", out.stdout)
        # A YAML error elsewhere does not hide the policy's: both in one run.
        with open(path, "w") as f:
            f.write("models:\n  - name: m\nsimulate:\n  - model: m\npolicy:\n  budget: 5ms\n"
                    "  entry:   p.lua\nbogus: 1\n")
        out = run("check", "-c", path)
        self.assertEqual(out.returncode, 1, out.stdout)
        self.assertRegex(out.stderr, "(?m)^" + re.escape(path) + r":8:1: .*bogus")
        self.assertRegex(out.stderr, "(?m)^" + re.escape(path) + r":7:12: key 'policy\.entry': .*boom")

    def test_check_reports_every_error_with_line_and_column(self):
        path = os.path.join(self.tmp.name, "bad.yaml")
        with open(path, "w") as f:
            f.write("listen: 127.0.0.1:99999\n"
                    "models:\n"
                    "  - name: m\n"
                    "    endpoints:\n"
                    "      - id: a\n"
                    "        url: ftp://x\n"
                    "        capacity: 0\n"
                    "      - id: a\n"
                    "        url: http://127.0.0.1:9001\n"
                    "bogus: 1\n")
        out = run("check", "-c", path)
        self.assertEqual(out.returncode, 1)
        lines = out.stderr.strip().splitlines()
        self.assertGreaterEqual(len(lines), 5, out.stderr)
        for line in lines:
            self.assertRegex(line, re.escape(path) + r":\d+:\d+: ")
        text = out.stderr
        self.assertRegex(text, r":1:\d+: .*listen")      # port out of range
        self.assertRegex(text, r":6:\d+: .*url")         # not http://
        self.assertRegex(text, r":7:\d+: .*capacity")    # zero
        self.assertRegex(text, r":8:\d+: .*duplicate")   # id 'a' again
        self.assertRegex(text, r":10:\d+: .*bogus")      # unknown key

    def test_durations_and_sizes_need_a_unit(self):
        # `connect_timeout: 2` silently meant 2 ms; now every bare number of a duration or size is an
        # error at its own line:col, with the others of the file; 0 needs no unit.
        path = os.path.join(self.tmp.name, "bare.yaml")
        with open(path, "w") as f:
            f.write("upstream:\n"
                    "  connect_timeout: 2\n"
                    "  idle_timeout: 1.5\n"
                    "max_body: 4096\n"
                    "drain_timeout: 0\n"
                    "admission:\n"
                    "  aging: 0\n"
                    "models:\n"
                    "  - name: m\n"
                    "    endpoints:\n"
                    "      - {id: a, url: \"http://127.0.0.1:9001\"}\n")
        out = run("check", "-c", path)
        self.assertEqual(out.returncode, 1, out.stdout)
        text = out.stderr
        self.assertRegex(text, re.escape(path) + r":2:20: key 'upstream.connect_timeout': needs a unit: .*2s")
        self.assertRegex(text, re.escape(path) + r":3:17: key 'upstream.idle_timeout': needs a unit")
        self.assertRegex(text, re.escape(path) + r":4:11: key 'max_body': needs a unit: .*MiB")
        self.assertEqual(len(text.strip().splitlines()), 3, text)  # the zeros are fine

    def test_record_headers_are_bounded(self):
        path = os.path.join(self.tmp.name, "rec.yaml")
        models = "models:\n  - name: m\n    endpoints:\n      - {id: a, url: \"http://127.0.0.1:9001\"}\n"
        for headers, message in (("[" + ", ".join(f"h{i}" for i in range(17)) + "]", "at most 16 headers"),
                                 ("[x-tenant, \"bad name\"]", "a header name is 1-63 letters")):
            with self.subTest(message):
                with open(path, "w") as f:
                    f.write(f"record:\n  dir: {self.tmp.name}\n  headers: {headers}\n" + models)
                out = run("check", "-c", path)
                self.assertEqual(out.returncode, 1, out.stdout)
                self.assertRegex(out.stderr, re.escape(path) + r":3:\d+: key 'record.headers': " + message)
        with open(path, "w") as f:
            f.write(f"record:\n  dir: {self.tmp.name}\n  headers: [x-tenant, X-Region]\n" + models)
        out = run("check", "-c", path)
        self.assertEqual(out.returncode, 0, out.stderr)

    def test_too_little_policy_memory_is_an_error_every_command_prints(self):
        policy = os.path.join(self.tmp.name, "policy.lua")
        with open(policy, "w") as f:
            f.write("return function(req, fleet) return fleet:endpoints(req.model)[1] end\n")
        test = os.path.join(self.tmp.name, "one_test.lua")
        with open(test, "w") as f:
            f.write("return { passes = function() end }\n")
        path = os.path.join(self.tmp.name, "small.yaml")
        with open(path, "w") as f:
            f.write(f"listen: 127.0.0.1:0\npolicy:\n  entry: {policy}\n  memory: 20KiB\n"
                    "models:\n  - name: m\nsimulate:\n  - model: m\n")
        message = r"policy\.memory 20KiB is too small to build the sandbox: not enough memory"
        out = run("check", "-c", path)
        self.assertEqual(out.returncode, 1, out.stdout)
        self.assertRegex(out.stderr, message)
        self.assertNotIn("ok", out.stdout)
        out = run("serve", "-c", path)
        self.assertEqual(out.returncode, 1)
        self.assertRegex(out.stderr, message)
        out = run("test", "-c", path, test)
        self.assertEqual(out.returncode, 1)
        self.assertRegex(out.stdout, "FAIL " + re.escape(test) + ": " + message)
        self.assertIn("0 passed, 1 failed", out.stdout)
        # Enough memory: the same files pass, so the failures above were the memory's.
        with open(path, "w") as f:
            f.write(f"listen: 127.0.0.1:0\npolicy:\n  entry: {policy}\n  memory: 4MiB\n"
                    "models:\n  - name: m\nsimulate:\n  - model: m\n")
        out = run("check", "-c", path)
        self.assertEqual(out.returncode, 0, out.stderr)
        out = run("test", "-c", path, test)
        self.assertEqual(out.returncode, 0, out.stdout)

    def test_reloads_say_what_they_reread_and_refuse_what_takes_a_restart(self):
        from harness import dead_port, request
        import signal
        out = run("reload", "--help")
        self.assertIn("--yaml", out.stdout)
        self.assertIn("the YAML is not read", out.stdout)
        self.assertIn("SIGHUP", run("serve", "--help").stdout)
        # `atc reload --config FILE` names a file; it never means "the YAML too"
        out = run("reload", "--config", "--admin", "127.0.0.1:1")
        self.assertEqual(out.returncode, 2)
        self.assertIn("--config takes a FILE", out.stderr)
        policy = os.path.join(self.tmp.name, "p.lua")
        with open(policy, "w") as f:
            f.write("return function(req, fleet) return fleet:endpoints(req.model)[1] end\n")
        admin = dead_port()
        good = (f"listen: 127.0.0.1:0\nadmin: 127.0.0.1:{admin}\npolicy:\n  entry: {policy}\n  watch: false\n"
                "models:\n  - name: m\nsimulate:\n  - model: m\n    count: 1\n")
        atc = self.start_atc(good)
        cfg = atc.config_path

        def write(text):
            with open(cfg, "w") as f:
                f.write(text)

        def policy_version():
            return json.loads(request("127.0.0.1", admin, "GET", "/admin/policy")[2])["version"]

        out = run("reload", "-c", cfg)  # the file gives the address; only the policy is re-read
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("reloaded the policy", out.stdout)
        self.assertEqual(policy_version(), 2)
        # a broken YAML on SIGHUP: atc logs it, with the position, and nothing changes
        write(good + "bogus: 1\n")
        atc.signal(signal.SIGHUP, "SIGHUP: reloading")
        wait = __import__("harness").wait_for
        wait(lambda: "config reload failed" in atc.read_log(), timeout=5, what="the failure logged")
        self.assertRegex(atc.read_log(), re.escape(cfg) + r":\d+:\d+: unknown key 'bogus'")
        # a change that takes a restart is refused, by each way in, and said so
        for name, text in (("listen", good.replace("listen: 127.0.0.1:0", "listen: 127.0.0.1:1")),
                           ("simulate", good.replace("count: 1", "count: 2")),
                           ("record (added or removed)", good + "record:\n  dir: traces\n")):
            with self.subTest(name):
                write(text)
                status, _, body = request("127.0.0.1", admin, "POST", "/admin/config/reload")
                self.assertEqual(status, 422, body)
                self.assertIn(f"'{name}' changed, which takes a restart", json.loads(body)["error"]["message"])
                out = run("reload", "--yaml", "-c", cfg)
                self.assertEqual(out.returncode, 1)
                self.assertIn("takes a restart", out.stderr)
                self.assertIn(f"config reload refused: {cfg}: '{name}' changed", atc.read_log())
        self.assertEqual(len(atc.endpoints()), 1)
        self.assertFalse(os.path.exists(os.path.join(self.tmp.name, "traces")))  # record: was not half-applied
        # the shipped systemd unit's reload fails on a broken file and succeeds on a good one
        with open(os.path.join(SOURCE_DIR, "examples", "systemd", "atc.service")) as f:
            reload_lines = [l.split("=", 1)[1].strip() for l in f if l.startswith("ExecReload=")]
        self.assertTrue(reload_lines)

        def systemctl_reload():
            for line in reload_lines:
                cmd = (line.replace("/usr/local/bin/atc", ATC_BIN).replace("/etc/atc/atc.yaml", cfg)
                       .replace("$MAINPID", str(atc.proc.pid)))
                if subprocess.run(cmd, shell=True, capture_output=True, timeout=10).returncode != 0:
                    return False  # systemd stops at the first command that fails
            return True

        write(good + "bogus: 1\n")
        self.assertFalse(systemctl_reload())
        write(good)
        self.assertTrue(systemctl_reload())

    def test_readme_has_the_two_set_up_commands(self):
        readme = read_doc("README.md")
        setup = section(readme, "## Set up")
        blocks = [body for lang, body, _ in fenced_blocks(setup) if lang == "sh"]
        # 1: one line that installs, builds and starts atc on the simulated fleet
        install = next((b.strip() for b in blocks if b.startswith("apt-get update && apt-get install -y ")), None)
        self.assertIsNotNone(install, setup)
        self.assertNotIn("\n", install)
        self.assertTrue(install.endswith(' && cmake -S . -B build && cmake --build build -j"$(nproc)"'
                                         " && ./build/atc serve -c examples/quickstart.yaml"), install)
        # everything the quick start installs, tests/run installs too
        with open(os.path.join(SOURCE_DIR, "tests", "run")) as f:
            run_script = f.read()
        packages = install.split("apt-get install -y ", 1)[1].split(" && ", 1)[0].split()
        listed = set(re.findall(r"[\w.+-]+", run_script.split("packages=(", 1)[1].split(")", 1)[0]))
        self.assertEqual([p for p in packages if p not in listed], [])
        # 2: the whole suite
        self.assertIn("tests/run\n", blocks)
        commands = section(readme, "## Commands")
        for cmd in ("atc status", "atc reload", "atc drain", "atc enable", "atc policy", "cmake --install"):
            self.assertIn(cmd, commands)
        self.assertLessEqual(readme.count("\n"), 400)

    def test_docs_yaml_blocks_pass_check(self):
        # Every YAML block of the README and docs/ is a config atc check accepts, relative paths resolving
        # as in the repository (a fragment without models: gets one endpoint).
        root = os.path.join(self.tmp.name, "cfg")
        os.makedirs(os.path.join(root, "lib"))
        for name in ("scripts", "examples"):
            os.symlink(os.path.join(os.path.abspath(SOURCE_DIR), name), os.path.join(root, name))
        models = 'models:\n  - name: llama-3-8b\n    endpoints:\n      - {id: x, url: "http://127.0.0.1:9001"}\n'
        count = 0
        for doc, text in docs():
            for lang, body, line in fenced_blocks(text):
                if lang != "yaml":
                    continue
                count += 1
                with self.subTest(f"{doc}:{line}"):
                    path = os.path.join(root, "block.yaml")
                    with open(path, "w") as f:
                        f.write(body if re.search(r"(?m)^models:", body) else body + models)
                    # the variables its api_key_env names are set, as an operator following the doc would
                    env = dict(os.environ, **{v: "sk-doc" for v in re.findall(r"api_key_env: *(\w+)", body)})
                    out = run("check", "-c", path, env=env)
                    self.assertEqual(out.returncode, 0, f"{doc}:{line}: atc check refuses:\n{out.stderr}")
        self.assertGreaterEqual(count, 6)
        self.assertRegex(read_doc("README.md"), r"watch: true +# the default")

    def test_docs_commands_exist_and_the_tour_runs(self):
        # Every atc command of a shell block (and of the README's command list) exists, with every flag
        # it is given; every script it names exists. The tour's offline commands run as written.
        targets = read_doc("CMakeLists.txt") + read_doc(os.path.join("tests", "CMakeLists.txt"))
        helps = {}

        def help_of(words):
            key = tuple(words)
            if key not in helps:
                helps[key] = run(*words, "--help")
            return helps[key]

        for doc, text in docs():
            lines = []
            for lang, body, line in fenced_blocks(text):
                if lang == "sh":
                    lines += [(line, l) for l in body.replace("\\\n", " ").splitlines()]
                elif lang == "" and doc == "README.md" and "atc serve -c FILE" in body:
                    lines += [(line, c) for l in body.splitlines() for c in l.split("  ")[0].split(", ")]
            for line, cmd in lines:
                for part in re.split(r"&&|\|\||\||;|>", cmd.split(" #")[0]):
                    words = part.split()
                    if not words:
                        continue
                    with self.subTest(f"{doc}:{line}: {part.strip()}"):
                        if words[0] in ("atc", "build/atc", "./build/atc"):
                            sub = words[1:2] if len(words) > 1 and re.fullmatch(r"[a-z]+", words[1]) else []
                            if sub == ["trace"] and len(words) > 2:
                                sub.append(words[2])  # atc trace import --help
                            out = help_of(sub)
                            self.assertEqual(out.returncode, 0, f"atc {' '.join(sub)} --help: {out.stderr}")
                            for flag in re.findall(r"(?<![\w-])--[a-z][\w-]*", part):
                                self.assertTrue(flag in out.stdout, f"atc {' '.join(sub)} --help names no {flag}")
                        elif words[0].startswith("build/"):  # a program the build makes
                            made = re.search(r"add_executable\(" + re.escape(os.path.basename(words[0])) + r"\b", targets)
                            self.assertTrue(made, f"{words[0]}: no such target in the CMakeLists")
                        elif "/" in words[0]:
                            self.assertTrue(os.path.exists(os.path.join(SOURCE_DIR, words[0])), words[0])

    def test_every_command_of_the_readme_runs_as_written(self):
        # Every line of the README's sh blocks made of atc, curl and sed commands runs as written and exits
        # 0 (issue 31), in a copy of the tree the commands read and edit (scripts/, examples/, tests/: the
        # policy tests read tests/bench/kv_precise/ too), so that the tour's sed edits the copy. The ones that talk to a running atc (and
        # curl) reach one this test starts from examples/quickstart.yaml on free ports: the README's
        # -c examples/quickstart.yaml becomes --admin, its port 8080 the front port. Left out: the set-up
        # line (apt-get, the build, serve: this test's atc is that serve) and tests/run.
        tree = os.path.join(self.tmp.name, "tree")
        for d in ("scripts", "examples", "tests"):
            shutil.copytree(os.path.join(SOURCE_DIR, d), os.path.join(tree, d),
                            ignore=shutil.ignore_patterns("__pycache__"))
        quickstart = read_doc(os.path.join("examples", "quickstart.yaml"))
        self.assertIn("127.0.0.1:8080", quickstart)
        self.assertIn("127.0.0.1:8081", quickstart)
        atc = self.start_atc(quickstart.replace("127.0.0.1:8080", "127.0.0.1:0")
                             .replace("127.0.0.1:8081", "127.0.0.1:0")
                             .replace("../scripts/", os.path.join(tree, "scripts") + "/"))
        # docs/policies.md's atc test example, saved where it says, runs with the README's atc test too
        testing = section(read_doc(os.path.join("docs", "policies.md")), "## Testing a policy: atc test")
        example = [b for lang, b, _ in fenced_blocks(testing) if lang == "lua"]
        self.assertEqual(len(example), 1)
        self.assertIn("Saved as `tests/policy/capacity_test.lua`", testing)
        with open(os.path.join(tree, "tests", "policy", "capacity_test.lua"), "w") as f:
            f.write(example[0])
        for lang, body, _ in fenced_blocks(testing):
            for cmd in (body.splitlines() if lang == "sh" else []):
                out = subprocess.run(cmd.split(" #")[0].replace("atc", ATC_BIN, 1), shell=True, capture_output=True,
                                     text=True, timeout=120, cwd=tree)
                self.assertEqual(out.returncode, 0, f"docs/policies.md: {cmd}\n{out.stdout}{out.stderr}")
                self.assertIn("ok   tests/policy/capacity_test.lua: no endpoint is ever given", out.stdout)
        online = ("status", "reload", "drain", "enable", "policy")
        ran = []
        for lang, body, line in fenced_blocks(read_doc("README.md")):
            if lang != "sh":
                continue
            for cmd in body.replace("\\\n", " ").splitlines():
                parts = [p.split() for p in cmd.split("&&")]
                if not all(p and p[0] in ("build/atc", "./build/atc", "atc", "curl", "sed") for p in parts):
                    continue
                if any(p[0] != "curl" and p[0] != "sed" and p[1:2] == ["serve"] for p in parts):
                    continue
                written = cmd
                if any(p[0] == "curl" or p[1:2] and p[1] in online for p in parts):
                    cmd = (cmd.replace("-c examples/quickstart.yaml", f"--admin 127.0.0.1:{atc.admin_port}")
                           .replace("127.0.0.1:8080", f"127.0.0.1:{atc.port}"))
                cmd = re.sub(r"(^|&& )(\./build/atc|build/atc|atc) ", lambda m: m.group(1) + ATC_BIN + " ", cmd)
                with self.subTest(f"README.md:{line}: {written}"):
                    out = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=120, cwd=tree)
                    self.assertEqual(out.returncode, 0, f"README.md:{line}: {written}\n{out.stdout}{out.stderr}")
                    if parts[0][0] == "curl":  # curl exits 0 on any status: the answer must be atc's 200
                        self.assertRegex(out.stdout, r"(?s)^HTTP/1.1 200 .*\nx-atc-endpoint: ", out.stdout)
                    ran.append(written)
        words = " ".join(ran)
        for needed in ("curl ", "atc status", "sed ", "atc reload", "atc test", "atc replay"):
            self.assertIn(needed, words, f"the README's tour has no {needed.strip()} any more: {ran}")
        # The tour's sed still matches its line (else it edits nothing and the reload reloads the same)
        with open(os.path.join(tree, "scripts", "affinity.lua")) as f:
            self.assertRegex(f.read(), r"(?m)^local SESSION_SLACK = 2\.0 ")
        self.assertGreaterEqual(self.policy_status(atc)["version"], 2)

    def test_docs_links_resolve(self):
        # Relative links name files that exist, and anchors name headings (or ids) that exist.
        for doc, text in docs():
            base = os.path.dirname(os.path.join(SOURCE_DIR, doc))
            for target in re.findall(r"\]\(([^)\s]+)\)", strip_code(text)):
                if re.match(r"[a-z]+:", target):
                    continue
                with self.subTest(f"{doc}: {target}"):
                    path, _, anchor = target.partition("#")
                    full = os.path.normpath(os.path.join(base, path)) if path else os.path.join(SOURCE_DIR, doc)
                    self.assertTrue(os.path.exists(full), f"{doc}: {target}: no such file")
                    if anchor:
                        self.assertTrue(full.endswith(".md"), target)
                        with open(full) as f:
                            self.assertIn(anchor, anchors(f.read()), f"{doc}: {target}: no such anchor")
        self.assertGreaterEqual(len([d for d, _ in docs() if d.startswith("docs/")]), 6)
        # the section `atc trace import --help` sends the reader to exists under that name
        where, name = re.search(r"see (\S+) '([^']+)'", run("trace", "import", "--help").stdout).groups()
        self.assertRegex(read_doc(where), r"(?m)^#+ " + re.escape(name) + "$")

    def test_decision_latency_is_one_figure(self):
        # one figure for the decision latency: the benchmark table's, in docs/benchmarks.md and scripts/README.md
        bench = read_doc(os.path.join("docs", "benchmarks.md"))
        row = re.search(r"\| Lua policy scripts/policy\.lua, interpreted \| ([\d.]+) \| ([\d.]+) \|", bench)
        p50, p99 = (f"{float(x):.1f} µs" for x in row.groups())
        self.assertIn(f"{p50} at p50 and {p99} at p99", read_doc(os.path.join("scripts", "README.md")))
        self.assertIn(f"takes {p50} at p50", read_doc(os.path.join("docs", "policies.md")))

    def test_cmake_install_gives_an_atc_that_finds_its_stdlib(self):
        build = os.path.dirname(os.path.abspath(ATC_BIN))
        prefix = os.path.join(self.tmp.name, "prefix")
        out = subprocess.run(["cmake", "--install", build, "--prefix", prefix], capture_output=True, text=True,
                             timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        installed = os.path.join(prefix, "bin", "atc")
        self.assertTrue(os.path.exists(os.path.join(prefix, "share", "atc", "stdlib", "atc", "verdict.lua")))
        env = {k: v for k, v in os.environ.items() if k != "ATC_STDLIB"}
        out = subprocess.run([installed, "check", "-c", os.path.join("examples", "quickstart.yaml")],
                             capture_output=True, text=True, timeout=30, cwd=SOURCE_DIR, env=env)
        self.assertEqual(out.returncode, 0, out.stderr)

    def test_atc_test_paths_print_without_a_doubled_slash(self):
        tests = os.path.join(self.tmp.name, "t")
        os.mkdir(tests)
        with open(os.path.join(tests, "x_test.lua"), "w") as f:
            f.write("return { fails = function() error('nope') end }\n")
        out = run("test", "--scripts", "scripts/", tests + "/")  # as a shell completes directories
        self.assertEqual(out.returncode, 1, out.stdout + out.stderr)
        self.assertIn(os.path.join(tests, "x_test.lua"), out.stdout)
        self.assertNotIn("//", out.stdout + out.stderr)

    def test_atc_test_replays_the_policy_the_test_required_and_shows_its_log(self):
        tests = os.path.join(self.tmp.name, "t")
        os.mkdir(tests)
        with open(os.path.join(tests, "last.lua"), "w") as f:  # every request to the model's last endpoint
            f.write("local M = {}\n"
                    "function M.route(req, fleet)\n"
                    "  local eps = fleet:endpoints(req.model)\n"
                    "  atc.log('last for', req.id)\n"
                    "  return eps[#eps]\n"
                    "end\n"
                    "return M\n")
        with open(os.path.join(tests, "first.lua"), "w") as f:
            f.write("return function(req, fleet) return fleet:endpoints(req.model)[1] end\n")
        replay = ('t.replay { trace = "tests/policy/fixtures/sessions.jsonl", limit = 12,\n'
                  '  fleet = { { model = "llama-3-8b", count = 3, capacity = 100, max_seqs = 100 } } }\n')
        with open(os.path.join(tests, "last_test.lua"), "w") as f:
            f.write('local t = require "atc.test"\n'
                    'local last = require "last"\n'
                    't.test("replays last", function()\n'
                    '  local decisions, report = ' + replay +
                    '  t.expect(report.policy).to_contain("last.lua")\n'
                    '  for _, d in ipairs(decisions) do t.expect(d.endpoint, d.id).to_be("llama-3-8b-sim-3") end\n'
                    'end)\n'
                    't.test("quiet", function() end)\n')
        with open(os.path.join(tests, "two_test.lua"), "w") as f:
            f.write('local t = require "atc.test"\n'
                    'local last, first = require "last", require "first"\n'
                    't.test("ambiguous", function() ' + replay.replace("\n", " ") + ' end)\n'
                    't.test("said which", function()\n'
                    '  local decisions = t.replay { trace = "tests/policy/fixtures/sessions.jsonl", limit = 3,\n'
                    '    policy = first, fleet = { { model = "llama-3-8b", count = 3, capacity = 100 } } }\n'
                    '  t.expect(decisions[1].endpoint).to_be("llama-3-8b-sim-1")\n'
                    'end)\n')
        out = run("test", "--scripts", "scripts", tests, timeout=60)
        text = out.stdout + out.stderr
        self.assertEqual(out.returncode, 1, text)  # the ambiguous one fails
        self.assertIn("3 passed, 1 failed", out.stdout)
        # The module the test required was replayed, not scripts/policy.lua (which spreads the load).
        self.assertNotIn("replays last", "".join(l for l in out.stdout.splitlines(True) if l.startswith("FAIL")))
        self.assertRegex(out.stdout, r'FAIL .*two_test\.lua:3: ambiguous: t\.replay: this test required several '
                                     r'policies \("last", "first"\): say which to replay with policy = require')
        # Its atc.log lines are printed under the test that ran it, with the policy's file:line.
        lines = out.stdout.splitlines()
        at = lines.index(next(l for l in lines if l.startswith("ok ") and "replays last" in l))
        self.assertRegex(lines[at + 1], r"^ +log: .*last\.lua:4: last for c5-t0$")
        self.assertFalse(any("quiet" in l for l in lines), text)  # a passing test that logged nothing: no line

    def test_serve_with_a_bad_config_exits_1_without_listening(self):
        path = os.path.join(self.tmp.name, "bad.yaml")
        with open(path, "w") as f:
            f.write("models: 3\n")
        out = run("serve", "-c", path)
        self.assertEqual(out.returncode, 1)
        self.assertIn(f"{path}:1:", out.stderr)

    def test_quickstart_streams_with_an_endpoint_header(self):
        with open(os.path.join(SOURCE_DIR, "examples", "quickstart.yaml")) as f:
            text = f.read()
        # The same file, on free ports; policy paths resolve against the original directory.
        text = re.sub(r"(?m)^listen: \S+", "listen: 127.0.0.1:0", text)
        text = re.sub(r"(?m)^admin: \S+", "admin: 127.0.0.1:0", text)
        text = text.replace("../scripts/policy.lua", os.path.join(SOURCE_DIR, "scripts", "policy.lua"))
        atc = self.start_atc(text)
        body = {"model": "llama-3-8b", "stream": True, "max_tokens": 16,
                "messages": [{"role": "user", "content": "Hello!"}]}
        status, headers, events = stream_events(atc.port, body)
        self.assertEqual(status, 200)
        self.assertRegex(headers["x-atc-endpoint"], r"^llama-3-8b-sim-[123]$")
        self.assertEqual(events[-1][1], "[DONE]")
        self.assertGreater(len(events), 10)
        json.loads(events[0][1])


if __name__ == "__main__":
    unittest.main(verbosity=2)
