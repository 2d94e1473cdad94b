"""Compiles torch.distributed's C++ "torchcomm" backend
(python/torchcomm/csrc/backend.cpp, one translation unit) against the torch
of the Python running this, into build/torch-ext/<torch and Python>/ (see
python/torchcomm/_torch_ext.py). Flags, include and library paths come from
torch.utils.cpp_extension; the compiler is $CXX (default c++); no ninja or
setuptools needed. Cached: nothing is done while the module is newer than its
inputs and was made by the same command.

    python scripts/build_torch_ext.py [--force]

Prints one line: "built ... in N s", "up to date ...", or
"SKIPPED: <reason>" (no compiler, no torch or Python headers) and exits 0 then;
exits 1 when the compiler failed.
"""
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _ext_module():
    spec = importlib.util.spec_from_file_location("_torch_ext", ROOT / "python" / "torchcomm" / "_torch_ext.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def skip(reason):
    print(f"build-torch-ext: SKIPPED: {reason}; torch.distributed's torchcomm backend stays the Python one")
    sys.exit(0)


def main():
    force = "--force" in sys.argv[1:]
    try:
        import torch
        from torch.utils import cpp_extension
    except Exception as e:  # noqa: BLE001 (any failure to import torch means no build)
        skip(f"torch cannot be imported ({e})")
    ext = _ext_module()
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        skip(f"no C++ compiler ({cxx}; make deps installs g++)")
    includes = cpp_extension.include_paths()
    if not (Path(includes[0]) / "torch" / "csrc" / "distributed" / "c10d" / "Backend.hpp").is_file():
        skip(f"torch {torch.__version__} has no c10d headers under {includes[0]}")
    py_include = Path(sysconfig.get_path("include"))
    if not (py_include / "Python.h").is_file():
        skip(f"no Python headers ({py_include}/Python.h; Debian: python3-dev, which make deps installs)")
    out = ext.built_path(ROOT)
    src = ext.SOURCE
    header = ROOT / "include" / "torchcomm.h"
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    cmd = [cxx, "-O2", "-std=c++20", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall", "-Wextra",
           "-Wno-unused-parameter", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-DTORCH_API_INCLUDE_EXTENSION_H",
           f"-DTORCH_EXTENSION_NAME={ext.EXT_NAME}", f"-I{ROOT / 'include'}"]
    cmd += [f"-isystem{p}" for p in includes] + [f"-isystem{py_include}"]
    cmd += [str(src)] + [f"-L{p}" for p in cpp_extension.library_paths()]
    cmd += ["-lc10", "-ltorch_cpu", "-ltorch", "-ltorch_python", "-o"]
    stamp = out.with_suffix(".cmd")
    line = shlex.join(cmd + [str(out)])
    inputs = [src, header, Path(__file__), ROOT / "python" / "torchcomm" / "_torch_ext.py"]
    if (not force and out.is_file() and stamp.is_file() and stamp.read_text() == line
            and out.stat().st_mtime >= max(p.stat().st_mtime for p in inputs)):
        print(f"build-torch-ext: up to date: {out.relative_to(ROOT)}")
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}")
    t0 = time.monotonic()
    r = subprocess.run(cmd + [str(tmp)])
    if r.returncode != 0:
        tmp.unlink(missing_ok=True)
        print(f"build-torch-ext: FAILED: {cxx} exited with {r.returncode} compiling {src.relative_to(ROOT)}")
        return 1
    os.replace(tmp, out)
    stamp.write_text(line)
    print(f"build-torch-ext: built {out.relative_to(ROOT)} in {time.monotonic() - t0:.0f} s "
          f"(torch {torch.__version__}, {cxx})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
