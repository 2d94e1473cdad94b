"""Where the C++ torch.distributed backend (csrc/backend.cpp) is found and
how it is loaded. Imports neither torch nor libtorchcomm until asked.

The extension is compiled against one torch (its headers and libraries) and
one Python, so its path names both (`_torch_build.tag()`). In order:
``TORCHCOMM_TORCH_EXT`` names the file; in the source tree, the build of
scripts/build-torch-ext.sh (``build/torch-ext/<tag>/``); in an installed
package (the wheel), a per-user cache that the first process to need it
fills by compiling the shipped source (``$XDG_CACHE_HOME/torchcomm/
torch-ext/<tag>/``, locked so that ranks starting together build it once).
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import logging
import os
from pathlib import Path
from typing import Any, Optional

from . import _torch_build
from ._torch_build import EXT_NAME

_log = logging.getLogger("torchcomm.distributed")
# The source tree this package lies in, when it does (python/torchcomm).
_TREE = Path(__file__).resolve().parent.parent.parent
_IN_TREE = (_TREE / "scripts" / "build_torch_ext.py").is_file()


def find() -> Optional[Path]:
    """``TORCHCOMM_TORCH_EXT``, else the source tree's build when it exists
    (None in an installed package). Builds nothing."""
    env = os.environ.get("TORCHCOMM_TORCH_EXT")
    if env:
        return Path(env)
    path = _torch_build.tree_path(_TREE)
    return path if _IN_TREE and path.is_file() else None


def locate() -> Path:
    """The extension to load: `find()`'s, else, in an installed package, the
    per-user cache's, compiled now when missing or stale. Raises with the
    reason when there is none (not built in the source tree, no compiler,
    the compiler failed)."""
    env = os.environ.get("TORCHCOMM_TORCH_EXT")
    if env:
        return Path(env)
    if _IN_TREE:
        path = _torch_build.tree_path(_TREE)
        if not path.is_file():
            raise FileNotFoundError(f"not built for this torch and Python (scripts/build-torch-ext.sh; "
                                    f"expected at {path})")
        return path
    path = _torch_build.cache_path()
    try:
        result = _torch_build.build(path, announce=lambda m: _log.warning("torchcomm backend: %s", m))
    except _torch_build.Unavailable as e:
        raise RuntimeError(f"cannot compile {_torch_build.SOURCE.name}: {e}") from e
    if result != "up to date":
        _log.info("torchcomm backend: %s %s", result, path)
    return path


def load(path: Path) -> Any:
    """Imports the extension module at `path` (torch imported first)."""
    import torch  # noqa: F401  (the extension links against its libraries)
    import torch.distributed  # noqa: F401  (its classes derive from c10d's)

    loader = importlib.machinery.ExtensionFileLoader(EXT_NAME, str(path))
    spec = importlib.util.spec_from_file_location(EXT_NAME, str(path), loader=loader)
    if spec is None:
        raise ImportError(f"{path}: not loadable as an extension module")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
