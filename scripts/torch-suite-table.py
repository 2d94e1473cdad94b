#!/usr/bin/env python3
"""The table of docs/testing.md from torch_suite.py's result files: one row
per test, a column per backend (PASS / FAIL / SKIP with the reason), then
the tests that pass on the first backend's comparison side (the last file)
and not on the first, listed first.

    torch-suite-table.py OURS.json GLOO.json
"""
import json
import os
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sides = []
    for path in sys.argv[1:]:
        name = os.path.splitext(os.path.basename(path))[0]
        try:
            with open(path) as f:
                sides.append((name, json.load(f)))
        except FileNotFoundError:
            sides.append((name, {}))
    (ours_name, ours), (ref_name, ref) = sides
    tests = sorted(set(ours) | set(ref))

    def cell(res, t):
        if t not in res:
            return "not run"
        status, reason = res[t]
        return status if not reason or status == "PASS" else f"{status}: {reason.replace('|', '/')[:120]}"

    regressions = [t for t in tests if ref.get(t, [""])[0] == "PASS" and ours.get(t, [""])[0] not in ("PASS", "")]
    for name, res in sides:
        c = {s: sum(1 for v in res.values() if v[0] == s) for s in ("PASS", "FAIL", "SKIP", "KNOWN")}
        print(f"- {name}: {len(res)} tests run, {c['PASS']} passed, {c['FAIL']} failed, {c['SKIP']} skipped, "
              f"{c['KNOWN']} known failures")
    print(f"- passing on {ref_name} and not on {ours_name}: {len(regressions)}"
          + (f" ({', '.join(regressions)})" if regressions else ""))
    print()
    print(f"| test | {ours_name} | {ref_name} |")
    print("|---|---|---|")
    for t in regressions + [t for t in tests if t not in regressions]:
        print(f"| {t} | {cell(ours, t)} | {cell(ref, t)} |")


if __name__ == "__main__":
    main()
