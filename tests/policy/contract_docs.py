#!/usr/bin/env python3
"""The contract tables in the READMEs are generated from stdlib/atc/contract.lua (`atc test --contract`).

    tests/policy/contract_docs.py [--atc build/atc] [--write] [FILE...]

Checks that each FILE (default: scripts/README.md) holds, between its `<!-- contract:begin -->` and
`<!-- contract:end -->` lines, exactly what `atc test --contract` prints; exits 1 and says which file is
stale otherwise. With --write, rewrites those blocks instead."""

import argparse
import os
import subprocess
import sys

BEGIN, END = "<!-- contract:begin -->\n", "<!-- contract:end -->\n"


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--atc", default=os.environ.get("ATC_BIN", os.path.join(root, "build", "atc")))
    ap.add_argument("--write", action="store_true")
    ap.add_argument("files", nargs="*", default=[os.path.join(root, "scripts", "README.md")])
    args = ap.parse_args()
    tables = subprocess.run([args.atc, "test", "--contract"], check=True, capture_output=True, text=True).stdout
    stale = 0
    for path in args.files:
        with open(path) as f:
            text = f.read()
        start, end = text.find(BEGIN), text.find(END)
        if start < 0 or end < start:
            print(f"{path}: no {BEGIN.strip()} ... {END.strip()} block", file=sys.stderr)
            stale += 1
            continue
        new = text[: start + len(BEGIN)] + tables + text[end:]
        if new == text:
            continue
        if args.write:
            with open(path, "w") as f:
                f.write(new)
            print(f"{path}: contract tables rewritten")
        else:
            print(f"{path}: the contract tables differ from stdlib/atc/contract.lua; "
                  f"run tests/policy/contract_docs.py --write", file=sys.stderr)
            stale += 1
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
