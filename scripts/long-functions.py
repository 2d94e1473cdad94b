#!/usr/bin/env python3
"""Lists Rust functions longer than a limit, longest first.

Usage: scripts/long-functions.py [--max N] [--files] [PATH ...]

PATH: files or folders (default: src). A function's length is the lines from
its `fn` line to its closing brace, doc comments and attributes left out;
nested functions count inside their parent too, and closures are part of
the function that holds them. Braces inside strings, chars and comments are
skipped. --files lists files over 700 lines instead. Prints one
"LINES path:line name" row per item; exit 0 (a report, not a check).
"""
import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FN = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?"
                r"(?:extern\s+\"[^\"]*\"\s+)?fn\s+(\w+)")


def code_chars(text):
    """The text with string, char and comment contents blanked (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"' or (c == "r" and re.match(r'r#*"', text[i:i + 10])):
            m = re.match(r'r(#*)"', text[i:i + 10])
            if m:
                end = '"' + m.group(1)
                j = text.find(end, i + len(m.group(0)))
                j = n if j < 0 else j + len(end)
            else:
                j = i + 1
                while j < n and text[j] != '"':
                    j += 2 if text[j] == "\\" else 1
                j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "'" and re.match(r"'(\\.[^']*|[^\\'])'", text[i:i + 12]):
            m = re.match(r"'(\\.[^']*|[^\\'])'", text[i:i + 12])
            out.append(" " * len(m.group(0)))
            i += len(m.group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(path):
    with open(path) as f:
        text = f.read()
    lines = code_chars(text).split("\n")
    found = []
    for start, line in enumerate(lines):
        m = FN.match(line)
        if not m:
            continue
        depth, opened = 0, False
        for end in range(start, len(lines)):
            for ch in lines[end]:
                if ch == "{":
                    depth += 1
                    opened = True
                elif ch == "}":
                    depth -= 1
                elif ch == ";" and not opened and depth == 0:
                    break  # a declaration without a body
            else:
                if opened and depth == 0:
                    found.append((end - start + 1, start + 1, m.group(1)))
                    break
                continue
            break
    return found, len(text.split("\n")) - 1


def rust_files(paths):
    for p in paths:
        if os.path.isfile(p):
            yield p
        for dirpath, _, names in os.walk(p):
            for name in sorted(names):
                if name.endswith(".rs"):
                    yield os.path.join(dirpath, name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max", type=int, default=80)
    ap.add_argument("--files", action="store_true")
    ap.add_argument("paths", nargs="*")
    a = ap.parse_args()
    os.chdir(ROOT)
    rows = []
    for path in rust_files(a.paths or ["src"]):
        fns, total = functions(path)
        if a.files:
            if total > 700:
                rows.append((total, f"{total:5d} {path}"))
            continue
        rows += [(n, f"{n:5d} {path}:{line} {name}") for n, line, name in fns if n > a.max]
    for _, row in sorted(rows, key=lambda r: -r[0]):
        print(row)


if __name__ == "__main__":
    sys.exit(main())
