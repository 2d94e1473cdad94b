#!/usr/bin/env python3
"""Checks that no import cycle joins the crate's top-level modules.

Usage: scripts/check-module-cycles.py [--src DIR] [--allow FILE] [--graph]

Reads every `crate::NAME` path in src/ (outside comments; `use crate::{a, b}`
groups included; `crate::log_info!` and other exported macros count as their
defining module), builds the graph of top-level modules (src/lib.rs's `mod`
items) and reports every strongly connected component of more than one module
as a cycle. An edge inside a cycle fails the check unless it is listed in the
allow-list file (scripts/module-cycles.allow: lines "from -> to"). --graph
prints every edge. Exit 0: no unlisted cyclic edge; 1: a new one; 2: usage.
"""
import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def top_modules(src):
    with open(os.path.join(src, "lib.rs")) as f:
        return re.findall(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", f.read(), re.M)


def code_of(path):
    """The file's text without // comments (doc comments name paths too)."""
    with open(path) as f:
        return "\n".join(re.sub(r"//.*", "", line) for line in f)


def files_of(src, module):
    one = os.path.join(src, module + ".rs")
    if os.path.isfile(one):
        yield one
    folder = os.path.join(src, module)
    for dirpath, _, names in os.walk(folder):
        for name in sorted(names):
            if name.endswith(".rs"):
                yield os.path.join(dirpath, name)


def group_heads(body):
    """First identifiers of the items of a `{...}` group, at depth one."""
    heads, depth, item = [], 0, ""
    for ch in body + ",":
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            m = re.match(r"\s*(\w+)", item)
            if m:
                heads.append(m.group(1))
            item = ""
        else:
            item += ch
    return heads


def graph(src):
    modules = top_modules(src)
    texts = {m: [code_of(p) for p in files_of(src, m)] for m in modules}
    macro_home = {}
    for m, ts in texts.items():
        for t in ts:
            for name in re.findall(r"macro_rules!\s*(\w+)", t):
                macro_home[name] = m
    edges = {m: set() for m in modules}
    for m, ts in texts.items():
        for t in ts:
            names = re.findall(r"\bcrate::(\w+)", t)
            for body in re.findall(r"\bcrate::\{([^;]*)\}\s*;", t):
                names += group_heads(body)
            for name in names:
                target = name if name in edges else macro_home.get(name)
                if target and target != m:
                    edges[m].add(target)
    return edges


def components(edges):
    """Strongly connected components (Tarjan), each a sorted list."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
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
            out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def read_allow(path):
    allowed = set()
    if not os.path.exists(path):
        return allowed
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                a, _, b = line.partition("->")
                allowed.add((a.strip(), b.strip()))
    return allowed


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--src", default=os.path.join(ROOT, "src"))
    p.add_argument("--allow", default=os.path.join(ROOT, "scripts", "module-cycles.allow"))
    p.add_argument("--graph", action="store_true", help="print every edge")
    args = p.parse_args()
    edges = graph(args.src)
    if args.graph:
        for m in sorted(edges):
            print(f"{m} -> {', '.join(sorted(edges[m])) or '(nothing)'}")
    cycles = [c for c in components(edges) if len(c) > 1]
    cyclic = {(a, b) for c in cycles for a in c for b in edges[a] if b in c}
    allowed = read_allow(args.allow)
    for c in cycles:
        print(f"module cycle: {' <-> '.join(c)}")
    new = sorted(cyclic - allowed)
    for a, b in sorted(allowed - cyclic):
        print(f"note: '{a} -> {b}' in {os.path.relpath(args.allow)} is no longer part of a cycle: delete it")
    if new:
        print("check-module-cycles: new edges inside an import cycle (not in the allow-list):")
        for a, b in new:
            print(f"  {a} -> {b}")
        print("Move the shared item to a module below both (see docs/architecture.md).")
        return 1
    print(f"check-module-cycles: {len(cycles)} known cycle(s), {len(cyclic)} allowed edge(s), none new")
    return 0


if __name__ == "__main__":
    sys.exit(main())
