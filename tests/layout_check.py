#!/usr/bin/env python3
"""Layout check for engine/ (STYLE.md "Layout"): dependencies point down and files stay small.

Parses every `#include "dir/name.h"` in engine/**/*.c and *.h, folds each file onto its stem
(engine/fleet/endpoint.c and endpoint.h are one node, "fleet/endpoint"), and fails when
  - the stem graph has a cycle (two subsystems that include each other, directly or through others),
  - a file is longer than MAX_LINES,
  - an include does not name its folder or names a header that does not exist,
  - an include reaches up: engine/README.md ranks the folders in one line, "Layers, bottom up: base,
    request, ...", and a file may include only its own folder's headers and those of folders below it
    (so no two folders include each other), or a folder is missing from that line,
  - a .c file is not named (as `name.c`) in engine/README.md's map of the folders.
Usage: tests/layout_check.py [ENGINE_DIR]   (default: engine/ beside this tests/ directory)
"""
import os
import re
import sys

MAX_LINES = 1200

# Known exceptions, each with why it is still here. The check fails on anything not listed; an entry
# that no longer matches is reported so that it can be deleted.
KNOWN_CIRCLES = set()
KNOWN_LONG = set()
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
LAYERS = re.compile(r"^Layers, bottom up: (.*)$", re.M)


def readme(root):
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        return f.read()


def layers(root):
    """The folder ranks engine/README.md gives (its "Layers, bottom up:" line), or None."""
    m = LAYERS.search(readme(root))
    if not m:
        return None
    names = [n.strip(" `.") for n in m.group(1).split(",")]
    return {n: i for i, n in enumerate(names)}


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "engine")
    root = os.path.normpath(root)
    problems, notes, seen_long = [], [], set()
    rank = layers(root)
    if rank is None:
        problems.append('README.md: no "Layers, bottom up: ..." line ranking the folders')
        rank = {}
    mapped = readme(root)
    edges = {}  # stem -> {stem: "file:line" of the first include that made the edge}
    nfiles = 0
    for dirpath, _, names in os.walk(root):
        for name in sorted(names):
            if not name.endswith((".c", ".h")):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            stem = os.path.splitext(rel)[0]
            edges.setdefault(stem, {})
            nfiles += 1
            with open(path, encoding="utf-8", errors="replace") as f:
                lines = f.readlines()
            if len(lines) > MAX_LINES:
                msg = "%s: %d lines (limit %d)" % (rel, len(lines), MAX_LINES)
                (notes if rel in KNOWN_LONG else problems).append(msg + (" [known]" if rel in KNOWN_LONG else ""))
                seen_long.add(rel)
            if name.endswith(".c") and "`%s`" % name not in mapped:
                problems.append("%s: not named in README.md's map of the folders" % rel)
            if name.endswith(".c") and stem != "core/main" and not os.path.exists(path[:-2] + ".h"):
                notes.append("%s: no header of the same stem" % rel)
            for lineno, line in enumerate(lines, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                target = m.group(1)
                where = "%s:%d" % (rel, lineno)
                if "/" not in target:
                    problems.append('%s: #include "%s" does not name its folder' % (where, target))
                    continue
                if not os.path.exists(os.path.join(root, target)):
                    problems.append('%s: #include "%s": no such file under engine/' % (where, target))
                    continue
                dep = os.path.splitext(target)[0]
                here_dir, there_dir = rel.split(os.sep)[0], target.split("/")[0]
                if rank and there_dir != here_dir:
                    if here_dir not in rank or there_dir not in rank:
                        problems.append("%s: folder %s is not ranked in README.md's layers"
                                        % (where, there_dir if here_dir in rank else here_dir))
                    elif rank[there_dir] > rank[here_dir]:
                        problems.append('%s: #include "%s" reaches up (%s is above %s in README.md\'s layers)'
                                        % (where, target, there_dir, here_dir))
                if dep != stem:
                    edges[stem].setdefault(dep, where)
    seen_circles = set()
    for comp, cycle in find_cycles(edges):
        path = " -> ".join(cycle + [cycle[0]])
        hops = ", ".join(edges[a][b] for a, b in zip(cycle, cycle[1:] + cycle[:1]))
        msg = "include circle among %s: %s (%s)" % (", ".join(sorted(comp)), path, hops)
        if frozenset(comp) in KNOWN_CIRCLES:
            notes.append(msg + " [known]")
            seen_circles.add(frozenset(comp))
        else:
            problems.append(msg)
    for comp in KNOWN_CIRCLES - seen_circles:
        notes.append("known circle among %s is gone: delete it from KNOWN_CIRCLES" % ", ".join(sorted(comp)))
    for rel in KNOWN_LONG - seen_long:
        notes.append("%s is no longer over %d lines: delete it from KNOWN_LONG" % (rel, MAX_LINES))
    nedges = sum(len(v) for v in edges.values())
    for p in problems:
        print("layout: error: " + p)
    for n in notes:
        print("layout: note: " + n)
    print("layout: %d files, %d stems, %d include edges, %d problem(s), %d note(s)"
          % (nfiles, len(edges), nedges, len(problems), len(notes)))
    return 1 if problems else 0


def find_cycles(edges):
    """(component, one cycle through it) per strongly connected component of several stems (Tarjan)."""
    index, low, stack, on_stack, comps = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, {})):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(set(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    cycles = []
    for comp in comps:
        start = min(comp)
        # shortest path back to start inside the component (BFS), so the message is short
        prev, frontier, found = {start: None}, [start], None
        while frontier and found is None:
            nxt = []
            for v in frontier:
                for w in sorted(edges.get(v, {})):
                    if w not in comp:
                        continue
                    if w == start:
                        found = v
                        break
                    if w not in prev:
                        prev[w] = v
                        nxt.append(w)
                if found is not None:
                    break
            frontier = nxt
        cycle, v = [], found
        while v is not None:
            cycle.append(v)
            v = prev[v]
        cycles.append((comp, list(reversed(cycle))))
    return sorted(cycles, key=lambda c: sorted(c[0]))


if __name__ == "__main__":
    sys.exit(main())
