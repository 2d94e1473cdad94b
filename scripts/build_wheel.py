#!/usr/bin/env python3
"""Writes the torchcomm wheel (PEP 427) with the standard library only.

Usage: build_wheel.py OUT_DIR STAGE TC_RUN

The package is python/torchcomm (its .py files, subpackages included,
py.typed, and csrc/backend.cpp, which an installed package compiles on first
use into the torch extension) plus every file under STAGE at the same path
under torchcomm/: scripts/build-wheel.sh puts there libtorchcomm.so, the
gloo module libtorchcomm-gloo.so (the library loads it from its own
directory), the libraries it needs that a bare system lacks in .libs/, and
csrc/torchcomm.h; TC_RUN goes to the wheel's scripts (the environment's
bin/tc-run). Name, version, summary and requires-python come from
python/pyproject.toml, whose version must be Cargo.toml's. The tag is
py3-none-linux_<machine>: the Python code runs on any Python 3, the
libraries only on Linux of this architecture with glibc at least the build
machine's (not manylinux: no check of the symbol versions was made).
Nothing is downloaded and no build backend is needed, so the wheel builds
the same way on any machine with python3.
"""
import base64
import hashlib
import os
import platform
import re
import stat
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def project_field(text: str, key: str) -> str:
    """A string field of pyproject.toml's [project] table."""
    table = re.search(r"^\[project\]\n(.*?)(?=^\[|\Z)", text, re.S | re.M)
    m = table and re.search(rf'^{key}\s*=\s*"([^"]*)"', table.group(1), re.M)
    if not m:
        sys.exit(f"build_wheel: python/pyproject.toml has no [project] {key}")
    return m.group(1)


def extras(text: str) -> str:
    """METADATA lines of pyproject.toml's [project.optional-dependencies]."""
    table = re.search(r"^\[project\.optional-dependencies\]\n(.*?)(?=^\[|\Z)", text, re.S | re.M)
    lines = []
    for extra, deps in re.findall(r"^(\w+)\s*=\s*\[(.*)\]", table.group(1) if table else "", re.M):
        lines.append(f"Provides-Extra: {extra}\n")
        lines += [f'Requires-Dist: {d}; extra == "{extra}"\n' for d in re.findall(r'"([^"]+)"', deps)]
    return "".join(lines)


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def main() -> None:
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    out_dir, stage, tc_run = (Path(a) for a in sys.argv[1:])
    pyproject = (ROOT / "python" / "pyproject.toml").read_text()
    name = project_field(pyproject, "name")
    version = project_field(pyproject, "version")
    cargo = re.search(r'^version = "([^"]*)"', (ROOT / "Cargo.toml").read_text(), re.M)
    if not cargo or cargo.group(1) != version:
        sys.exit(f"build_wheel: python/pyproject.toml's version {version} is not Cargo.toml's")
    tag = f"py3-none-linux_{platform.machine()}"
    dist_info = f"{name}-{version}.dist-info"
    data_dir = f"{name}-{version}.data"

    pkg = ROOT / "python" / "torchcomm"
    sources = [p for p in sorted(pkg.rglob("*")) if "__pycache__" not in p.parts and p.is_file()
               and (p.suffix in (".py", ".cpp") or p.name == "py.typed")]
    staged = [p for p in sorted(stage.rglob("*")) if p.is_file()]
    files = [(f"torchcomm/{p.relative_to(pkg).as_posix()}", p) for p in sources]
    files += [(f"torchcomm/{p.relative_to(stage).as_posix()}", p) for p in staged]
    files.append((f"{data_dir}/scripts/tc-run", tc_run))
    names = [a for a, _ in files]
    if len(set(names)) != len(names):
        sys.exit(f"build_wheel: {stage} holds a file python/torchcomm has too")
    readme = (ROOT / "python" / "README.md").read_text()
    metadata = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        f"Summary: {project_field(pyproject, 'description')}\n"
        f"Requires-Python: {project_field(pyproject, 'requires-python')}\nLicense: BSD-3-Clause\n"
        f"{extras(pyproject)}"
        f"Description-Content-Type: text/markdown\n\n{readme}"
    )
    wheel_meta = f"Wheel-Version: 1.0\nGenerator: torchcomm scripts/build_wheel.py\nRoot-Is-Purelib: false\nTag: {tag}\n"

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}-{version}-{tag}.whl"
    records = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        def add(arcname: str, data: bytes, executable: bool) -> None:
            info = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = ((0o755 if executable else 0o644) | stat.S_IFREG) << 16
            z.writestr(info, data)
            records.append(record_line(arcname, data))

        for arcname, src in files:
            add(arcname, src.read_bytes(), os.access(src, os.X_OK) and not arcname.endswith(".py"))
        add(f"{dist_info}/METADATA", metadata.encode(), False)
        add(f"{dist_info}/WHEEL", wheel_meta.encode(), False)
        add(f"{dist_info}/top_level.txt", b"torchcomm\n", False)
        records.append(f"{dist_info}/RECORD,,")
        info = zipfile.ZipInfo(f"{dist_info}/RECORD", date_time=(2020, 1, 1, 0, 0, 0))
        info.external_attr = (0o644 | stat.S_IFREG) << 16
        z.writestr(info, "\n".join(records) + "\n")
    print(path)


if __name__ == "__main__":
    main()
