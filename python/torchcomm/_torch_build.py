"""Compiling the C++ torch.distributed backend (csrc/backend.cpp, one
translation unit) against the torch of this interpreter: the one compiler
command, used by scripts/build_torch_ext.py for the source tree's
build/torch-ext/ and by `_torch_ext` for an installed package's per-user
cache. Imports neither torch nor libtorchcomm until a build is asked for.

Flags, include and library paths come from torch.utils.cpp_extension (a
torch wheel ships its headers); the compiler is $CXX, else c++, else g++; no
ninja or setuptools needed. Builds are cached and locked: a module is made
again only when its command or its inputs' contents changed, several
processes asking at once build it once (the others wait on a lock), and a
failed build is remembered (with the compiler's output beside it) so that
every later process does not pay for failing again.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import List, Optional

EXT_NAME = "torchcomm_torch_ext"
SOURCE = Path(__file__).resolve().parent / "csrc" / "backend.cpp"
HEADER = "torchcomm.h"


def tag() -> str:
    """The torch version and Python of this interpreter, as a directory name."""
    import torch

    return f"torch-{torch.__version__}-{sys.implementation.cache_tag}".replace("+", "_")


def tree_path(root: Path) -> Path:
    """The extension built under the source tree `root` for this interpreter
    (scripts/build-torch-ext.sh, `make torch-ext`)."""
    return root / "build" / "torch-ext" / tag() / f"{EXT_NAME}.so"


def cache_path() -> Path:
    """The extension an installed package builds for this interpreter:
    $XDG_CACHE_HOME/torchcomm/torch-ext/<tag>/ (default ~/.cache)."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "torchcomm" / "torch-ext" / tag() / f"{EXT_NAME}.so"


class Unavailable(RuntimeError):
    """The extension cannot be built here; the message says why."""


def header_dir() -> Path:
    """Where torchcomm.h is: beside backend.cpp in a wheel, include/ in the
    source tree."""
    for d in (SOURCE.parent, SOURCE.parent.parent.parent.parent / "include"):
        if (d / HEADER).is_file():
            return d
    raise Unavailable(f"{HEADER} is neither beside {SOURCE} nor in the source tree's include/ "
                      "(this install did not come from the wheel)")


def compiler() -> str:
    """$CXX, else the first of c++ and g++ on PATH."""
    for cxx in [os.environ["CXX"]] if os.environ.get("CXX") else ["c++", "g++"]:
        if shutil.which(cxx):
            return cxx
    raise Unavailable(f"no C++ compiler ({os.environ.get('CXX') or 'c++ or g++'} not on PATH; "
                      "Debian: apt-get install g++)")


def command(out: Path) -> List[str]:
    """The compiler command writing the extension to `out`; raises
    Unavailable when torch, its headers, Python's headers or a compiler
    are missing."""
    try:
        import torch
        from torch.utils import cpp_extension
    except Exception as e:  # noqa: BLE001 (any failure to import torch means no build)
        raise Unavailable(f"torch cannot be imported ({e})") from e
    if not SOURCE.is_file():
        raise Unavailable(f"{SOURCE} is missing")
    includes = cpp_extension.include_paths()
    if not (Path(includes[0]) / "torch" / "csrc" / "distributed" / "c10d" / "Backend.hpp").is_file():
        raise Unavailable(f"torch {torch.__version__} has no c10d headers under {includes[0]}")
    py_include = Path(sysconfig.get_path("include"))
    if not (py_include / "Python.h").is_file():
        raise Unavailable(f"no Python headers ({py_include}/Python.h; Debian: apt-get install python3-dev)")
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    cmd = [compiler(), "-O2", "-std=c++20", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall", "-Wextra",
           "-Wno-unused-parameter", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-DTORCH_API_INCLUDE_EXTENSION_H",
           f"-DTORCH_EXTENSION_NAME={EXT_NAME}", f"-I{header_dir()}"]
    cmd += [f"-isystem{p}" for p in includes] + [f"-isystem{py_include}"]
    cmd += [str(SOURCE)] + [f"-L{p}" for p in cpp_extension.library_paths()]
    return cmd + ["-lc10", "-ltorch_cpu", "-ltorch", "-ltorch_python", "-o", str(out)]


def _key(cmd: List[str]) -> str:
    """The command and a digest of what it reads: equal keys, equal modules."""
    digest = hashlib.sha256()
    for p in (SOURCE, header_dir() / HEADER):
        digest.update(p.read_bytes())
    return f"{shlex.join(cmd)}\n{digest.hexdigest()}\n"


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text()
    except OSError:
        return None


def build(out: Path, force: bool = False, announce=None, retry_failed: bool = False) -> str:
    """Makes the extension at `out` unless it is current (`force`: in any
    case); returns "up to date" or "built in N s". `announce(message)` is
    called before a compile starts. A build that failed with the same key is
    not tried again unless `retry_failed`. Raises Unavailable (nothing to compile with) or
    RuntimeError (the compiler failed now or, with the same key, before:
    the message names the log)."""
    cmd = command(out)
    key = _key(cmd)
    stamp, failed, log = out.with_suffix(".key"), out.with_suffix(".failed"), out.with_suffix(".log")
    if not force and out.is_file() and _read(stamp) == key:
        return "up to date"
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not force and out.is_file() and _read(stamp) == key:
            return "up to date"  # another process built it while this one waited
        if not (force or retry_failed) and _read(failed) == key:
            raise RuntimeError(f"compiling it failed before (see {log}; delete {failed} to try again)")
        if announce:
            announce(f"compiling {SOURCE.name} with {cmd[0]} against torch into {out.parent} "
                     "(once per torch and Python; from half a minute to a few minutes)")
        tmp = out.with_name(f".{out.name}.{os.getpid()}")
        t0 = time.monotonic()
        with open(log, "w") as f:
            r = subprocess.run(cmd[:-1] + [str(tmp)], stdout=f, stderr=subprocess.STDOUT)
        if r.returncode != 0:
            tmp.unlink(missing_ok=True)
            failed.write_text(key)
            raise RuntimeError(f"{cmd[0]} exited with {r.returncode} compiling {SOURCE} (see {log})")
        os.replace(tmp, out)
        stamp.write_text(key)
        failed.unlink(missing_ok=True)
        return f"built in {time.monotonic() - t0:.0f} s"
