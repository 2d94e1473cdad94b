"""Compiles torch.distributed's C++ "torchcomm" backend
(python/torchcomm/csrc/backend.cpp) against the torch of the Python running
this, into build/torch-ext/<torch and Python>/. The command, the cache and
the lock are python/torchcomm/_torch_build.py's, the same an installed
package uses for its per-user cache: nothing is done while the module was
made by the same command from the same sources.

    python scripts/build_torch_ext.py [--force]

Prints one line: "built ... in N s", "up to date ...", or
"SKIPPED: <reason>" (no torch, compiler, torch or Python headers) and exits 0
then; exits 1 when the compiler failed (its output printed).
"""
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _builder():
    """_torch_build without importing the torchcomm package (which loads
    libtorchcomm)."""
    spec = importlib.util.spec_from_file_location("_torch_build", ROOT / "python" / "torchcomm" / "_torch_build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    b = _builder()
    try:
        import torch
    except Exception as e:  # noqa: BLE001 (any failure to import torch means no build)
        print(f"build-torch-ext: SKIPPED: torch cannot be imported ({e}); "
              "torch.distributed's torchcomm backend stays the Python one")
        return 0
    out = b.tree_path(ROOT)
    try:
        result = b.build(out, force="--force" in sys.argv[1:], retry_failed=True)
    except b.Unavailable as e:
        print(f"build-torch-ext: SKIPPED: {e}; torch.distributed's torchcomm backend stays the Python one")
        return 0
    except RuntimeError as e:
        log = out.with_suffix(".log")
        if log.is_file():
            sys.stdout.write(log.read_text()[-8000:])
        print(f"build-torch-ext: FAILED: {e}")
        return 1
    print(f"build-torch-ext: {result}: {out.relative_to(ROOT)} (torch {torch.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
