"""torchcomm: libtorchcomm from Python (ctypes, no compiler needed).

    import numpy as np, torchcomm as tc
    comm = tc.Comm("gloo")            # rank, size and store from the launcher
    x = np.ones(4, dtype=np.float32)
    comm.all_reduce(x, tc.ReduceOp.SUM)

Buffers: numpy arrays, torch tensors (CPU; CUDA through data_ptr() on the
current stream), DLPack exporters, anything with the buffer protocol, or
``tc.raw(ptr, count, dtype)``, in this machine's byte order (others are
refused). Failures raise ``TorchCommError`` with the
C result ``code``, its ``name`` and the library's ``detail``.
"""
from __future__ import annotations

import ctypes as _C
from typing import Callable, Optional, Tuple

from ._buffers import Buf, DType, as_buffer, dtype_of, raw, to_numpy_dtype, to_torch_dtype
from ._lib import ERROR_NAMES, TorchCommError, check as _check, lib as _cdll
from .comm import ANY_SOURCE, AllGatherP, Batch, Comm, Memory, RedOp, ReduceOp, Registration, Work, WorkStatus
from .ophooks import OpInfo
from .reducer import GradBucket, Hook, Reducer
from .store import FileStore, PrefixStore, Store, TCPStore
from .window import Window

__all__ = [
    "ANY_SOURCE", "AllGatherP", "Batch", "Buf", "Comm", "DType", "ERROR_NAMES", "FileStore", "GradBucket", "Hook", "Memory", "OpInfo",
    "PrefixStore", "RedOp", "ReduceOp", "Reducer", "Registration", "Store", "TCPStore", "TorchCommError", "Window", "Work",
    "WorkStatus", "as_buffer", "dtype_of", "library", "raw", "result_string", "set_log_callback", "to_numpy_dtype",
    "to_torch_dtype", "version",
]

library = _cdll
"""The loaded ctypes library (every tc_* function declared)."""


def version() -> Tuple[int, int, int]:
    """The loaded library's (major, minor, patch)."""
    v = [_C.c_int(), _C.c_int(), _C.c_int()]
    _check(_cdll.tc_get_version(*[_C.byref(x) for x in v]), "tc_get_version")
    return (v[0].value, v[1].value, v[2].value)


def result_string(code: int) -> str:
    return _cdll.tc_result_string(code).decode()


_log_sink = None


def set_log_callback(callback: Optional[Callable[[int, str], None]]) -> None:
    """Sends the library's log lines to `callback(level, line)` (any thread;
    it must not call back into torchcomm); None restores stderr."""
    global _log_sink
    from ._lib import LOG_CALLBACK

    if callback is None:
        fn = _C.cast(None, LOG_CALLBACK)
    else:
        def call(level: int, message: bytes, _user: object) -> None:
            try:
                callback(level, message.decode(errors="replace"))
            except Exception:  # never into the library
                pass
        fn = LOG_CALLBACK(call)
    _check(_cdll.tc_set_log_callback(fn, None), "tc_set_log_callback")
    # Kept (never freed) while set: library threads may still be calling it.
    _log_sink = fn if callback is not None else _log_sink
