"""Where the C++ torch.distributed backend (csrc/backend.cpp) is built and how
it is loaded. Imports neither torch nor libtorchcomm until asked, so that
scripts/build_torch_ext.py can use it before either is loaded.

The extension is compiled against one torch (its headers and libraries) and
one Python, so its path names both: ``build/torch-ext/<tag>/`` of the source
tree, `<tag>` from `tag()`; ``TORCHCOMM_TORCH_EXT`` names another file.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any, Optional

EXT_NAME = "torchcomm_torch_ext"
SOURCE = Path(__file__).resolve().parent / "csrc" / "backend.cpp"


def tag() -> str:
    """The torch version and Python of this interpreter, as a directory name."""
    import torch

    return f"torch-{torch.__version__}-{sys.implementation.cache_tag}".replace("+", "_")


def built_path(root: Path) -> Path:
    """The extension built under the source tree `root` for this interpreter."""
    return root / "build" / "torch-ext" / tag() / f"{EXT_NAME}.so"


def find() -> Optional[Path]:
    """``TORCHCOMM_TORCH_EXT``, else the source tree's build when it exists."""
    env = os.environ.get("TORCHCOMM_TORCH_EXT")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parent  # python/torchcomm in the source tree
    path = built_path(here.parent.parent)
    return path if path.is_file() else None


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
