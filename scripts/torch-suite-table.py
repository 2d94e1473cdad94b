#!/usr/bin/env python3
"""The table of docs/testing.md from torch_suite.py's result files: one row
per test, a column per file (PASS / FAIL / SKIP / KNOWN with the reason).
The last file is the reference (gloo's run); the ones before it are runs on
ours (the plain run, the --as-gloo one). Tests that pass on the reference
and in none of our runs are listed first, and counted.

    torch-suite-table.py OURS.json [MORE_OURS.json ...] GLOO.json
"""
import json
import os
import sys


def load(path):
    name = os.path.splitext(os.path.basename(path))[0]
    try:
        with open(path) as f:
            return name, json.load(f)
    except FileNotFoundError:
        return name, {}


def cell(res, t):
    if t not in res:
        return "not run"
    status, reason = res[t]
    return status if not reason or status == "PASS" else f"{status}: {reason.replace('|', '/')[:120]}"


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    sides = [load(p) for p in sys.argv[1:]]
    ours, (ref_name, ref) = sides[:-1], sides[-1]
    tests = sorted(set().union(*(res for _, res in sides)))
    gaps = [t for t in tests
            if ref.get(t, [""])[0] == "PASS" and not any(res.get(t, [""])[0] == "PASS" for _, res in ours)]
    for name, res in sides:
        c = {s: sum(1 for v in res.values() if v[0] == s) for s in ("PASS", "FAIL", "SKIP", "KNOWN")}
        print(f"- {name}: {len(res)} tests run, {c['PASS']} passed, {c['FAIL']} failed, {c['SKIP']} skipped, "
              f"{c['KNOWN']} known failures")
    names = " or ".join(n for n, _ in ours)
    print(f"- passing on {ref_name} and not on {names}: {len(gaps)}" + (f" ({', '.join(gaps)})" if gaps else ""))
    print()
    print("| test | " + " | ".join(n for n, _ in sides) + " |")
    print("|---" * (len(sides) + 1) + "|")
    for t in gaps + [t for t in tests if t not in gaps]:
        print(f"| {t} | " + " | ".join(cell(res, t) for _, res in sides) + " |")


if __name__ == "__main__":
    main()
