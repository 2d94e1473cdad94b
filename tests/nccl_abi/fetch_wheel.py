#!/usr/bin/env python3
"""Fetches the nvidia-nccl-cu13 wheel of one version and extracts from it only
lib/libnccl.so.2 and include/nccl.h, for the tests that use the real NCCL on a
machine without a GPU (`make nccl-wheel`).

    fetch_wheel.py --version 2.28.9 [--sha256 HEX] --out target/nccl-wheel/2.28.9

Result in OUT: lib/libnccl.so.2, include/nccl.h and wheel.json (what was
fetched, its sha256, how long it took). A complete OUT is reused as is.

The wheel comes through pip when pip is there (`pip download --no-deps`),
else straight from PyPI's JSON API with urllib. Its sha256 is checked against
the one PyPI lists for the file and against --sha256 when given (the Makefile
pins the default version's); a mismatch discards the download.

This script never fails the build for want of the wheel: when it cannot be
had (no network, no such version, a mismatch) it writes the reason to
OUT/SKIPPED, prints it and exits 0; the dependent tests then report SKIPPED
with that reason. Exit status 1 is kept for misuse (bad arguments).
"""

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import zipfile

PROJECT = "nvidia-nccl-cu13"
MEMBERS = {
    "nvidia/nccl/lib/libnccl.so.2": "lib/libnccl.so.2",
    "nvidia/nccl/include/nccl.h": "include/nccl.h",
}
TIMEOUT = 60


class Unavailable(Exception):
    pass


def log(msg):
    print(f"nccl-wheel: {msg}", flush=True)


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def machine_tag():
    m = platform.machine()
    if m in ("x86_64", "AMD64"):
        return "x86_64"
    if m in ("aarch64", "arm64"):
        return "aarch64"
    raise Unavailable(f"no {PROJECT} wheel for this machine ({m})")


def pypi_files(version):
    """The wheel files PyPI lists for `version`: [(filename, url, sha256)].
    Tries the per-version JSON first, then the project JSON (some mirrors
    serve only the latter); relative URLs are resolved against the JSON's."""
    errors = []
    for url, pick in (
        (f"https://pypi.org/pypi/{PROJECT}/{version}/json", lambda d: d.get("urls", [])),
        (f"https://pypi.org/pypi/{PROJECT}/json", lambda d: d.get("releases", {}).get(version)),
    ):
        try:
            with urllib.request.urlopen(url, timeout=TIMEOUT) as r:
                data = json.load(r)
        except Exception as e:  # network, HTTP 404, bad JSON
            errors.append(f"{url}: {e}")
            continue
        files = pick(data)
        if not files:
            errors.append(f"{url}: no files listed for version {version}")
            continue
        return [
            (f["filename"], urllib.parse.urljoin(url, f["url"]), f.get("digests", {}).get("sha256", ""))
            for f in files
            if f.get("filename", "").endswith(".whl")
        ]
    raise Unavailable("PyPI's JSON API did not answer: " + "; ".join(errors))


def choose(files, arch):
    for name, url, sha in files:
        if "manylinux" in name and name.endswith(f"_{arch}.whl"):
            return name, url, sha
    raise Unavailable(f"PyPI lists no manylinux {arch} wheel ({', '.join(n for n, _, _ in files)})")


def have_pip():
    try:
        return subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode == 0
    except OSError:
        return False


def download_pip(version, dest):
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir",
           "--retries", "1", "--timeout", "30", "-q", "-d", dest, f"{PROJECT}=={version}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    wheels = [f for f in os.listdir(dest) if f.endswith(".whl")]
    if r.returncode != 0 or len(wheels) != 1:
        lines = (r.stderr or r.stdout).strip().splitlines()
        errors = [l for l in lines if l.startswith("ERROR")] or lines[-1:]
        raise Unavailable(f"pip download failed (exit {r.returncode}): {' | '.join(errors) or 'no wheel'}")
    return os.path.join(dest, wheels[0])


def download_urllib(url, name, dest):
    path = os.path.join(dest, name)
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT) as r, open(path, "wb") as f:
            shutil.copyfileobj(r, f, 1 << 20)
    except Exception as e:
        raise Unavailable(f"download of {url} failed: {e}")
    return path


def fetch(version, pinned, out, use_pip=True):
    arch = machine_tag()
    listed = None
    json_error = ""
    try:
        listed = choose(pypi_files(version), arch)
    except Unavailable as e:
        json_error = str(e)
    tmp = tempfile.mkdtemp(prefix="nccl-wheel-", dir=os.path.dirname(os.path.abspath(out)))
    try:
        t0 = time.monotonic()
        how = None
        errors = []
        path = None
        if use_pip and have_pip():
            try:
                path = download_pip(version, tmp)
                how = "pip download"
            except Unavailable as e:
                errors.append(str(e))
        if path is None:
            if listed is None:
                errors.append(json_error)
                raise Unavailable("; ".join(errors))
            path = download_urllib(listed[1], listed[0], tmp)
            how = "urllib from PyPI"
        t_download = time.monotonic() - t0
        name = os.path.basename(path)
        if not name.endswith(f"_{arch}.whl"):
            raise Unavailable(f"{how} fetched {name}, not a {arch} wheel")

        digest = sha256_of(path)
        checked = []
        if listed is not None and listed[0] == name and listed[2]:
            if digest != listed[2]:
                raise Unavailable(f"{name}: sha256 {digest} differs from the {listed[2]} PyPI lists; discarded")
            checked.append("PyPI's listing")
        if pinned:
            if digest != pinned:
                raise Unavailable(f"{name}: sha256 {digest} differs from the pinned {pinned}; discarded")
            checked.append("the pinned value")
        if not checked:
            raise Unavailable(f"{name}: no sha256 to check it against (PyPI's JSON API: {json_error}; "
                              "no pinned value for this version)")

        t1 = time.monotonic()
        with zipfile.ZipFile(path) as z:
            for member, rel in MEMBERS.items():
                target = os.path.join(tmp, "x", rel)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with z.open(member) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
        t_extract = time.monotonic() - t1
        wheel_bytes = os.path.getsize(path)
        os.remove(path)
        for rel in MEMBERS.values():
            target = os.path.join(out, rel)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.replace(os.path.join(tmp, "x", rel), target)
        info = {
            "project": PROJECT, "version": version, "wheel": name, "sha256": digest,
            "sha256_checked_against": checked, "fetched_with": how, "wheel_bytes": wheel_bytes,
            "download_seconds": round(t_download, 2), "extract_seconds": round(t_extract, 2),
        }
        with open(os.path.join(out, "wheel.json"), "w") as f:
            json.dump(info, f, indent=1)
        log(f"{name} ({wheel_bytes / 1e6:.0f} MB, sha256 checked against {' and '.join(checked)}): "
            f"download {t_download:.1f} s ({how}), extraction {t_extract:.1f} s -> {out}/")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--version", required=True)
    ap.add_argument("--sha256", default="", help="expected sha256 of the wheel for this machine")
    ap.add_argument("--out", required=True)
    ap.add_argument("--no-pip", action="store_true", help="fetch with urllib even where pip is installed")
    a = ap.parse_args()
    out = a.out
    complete = all(os.path.isfile(os.path.join(out, rel)) for rel in MEMBERS.values()) and \
        os.path.isfile(os.path.join(out, "wheel.json"))
    if complete:
        log(f"{PROJECT} {a.version}: reusing {out}/")
        return 0
    os.makedirs(out, exist_ok=True)
    skipped = os.path.join(out, "SKIPPED")
    try:
        fetch(a.version, a.sha256.strip().lower(), out, use_pip=not a.no_pip)
        if os.path.exists(skipped):
            os.remove(skipped)
    except (Unavailable, OSError, zipfile.BadZipFile, KeyError) as e:
        reason = f"{PROJECT} {a.version} could not be had: {e}"
        with open(skipped, "w") as f:
            f.write(reason + "\n")
        log(reason)
        log("the tests that need the real libnccl will be SKIPPED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
