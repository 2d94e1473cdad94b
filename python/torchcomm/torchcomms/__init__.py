"""torchcomms' Python API on libtorchcomm: a torchcomms program runs here
with its import line changed to ``import torchcomm.torchcomms as torchcomms``.

Every public name of torchcomms 0.3's ``_comms.pyi`` exists; the few this
library cannot offer raise ``TorchCommError`` (a ``RuntimeError``) with code
``TC_ERR_UNSUPPORTED`` and are listed in docs/status.md. Where torchcomms
and the C API differ, this module follows torchcomms (docs/python.md).
"""
from .._lib import TorchCommError
from ._api import (AllGatherOptions, AllGatherPExecOptions, AllGatherPHandle, AllGatherPInitOptions,
                   AllGatherSingleOptions, AllReduceOptions, AllToAllOptions, AllToAllSingleOptions,
                   AllToAllvSingleOptions, BarrierOptions, BatchP2POptions, BatchSendRecv, BroadcastOptions,
                   CommOptions, GatherOptions, InitHandle, P2POp, P2POpType, RecvOptions, ReconfigureOptions,
                   RedOpType, ReduceOp, ReduceOptions, ReduceScatterOptions, ReduceScatterSingleOptions,
                   RemovableHandle, ScatterOptions, SendOptions, Timeout, TorchComm, TorchCommBackend,
                   TorchCommWinAccessType, TorchCommWindow, TorchCommWindowAttr, TorchWork, WorkStatus,
                   _BackendWrapper, _is_backend_registered, get_mem_allocator, new_comm, register_backend)
from ._hooks import *  # noqa: F401,F403  (hook argument classes and OpName)
from ._hooks import __all__ as _hook_names
from . import objcol

__all__ = [
    "new_comm", "TorchComm", "ReduceOp", "TorchWork", "Timeout", "BatchP2POptions", "BatchSendRecv", "P2POp",
    "CommOptions", "TorchCommWindow", "register_backend", "TorchCommBackend", "RedOpType", "P2POpType",
    "WorkStatus", "TorchCommWinAccessType", "TorchCommWindowAttr", "ReconfigureOptions", "RemovableHandle",
    "InitHandle", "AllGatherPHandle", "SendOptions", "RecvOptions", "BroadcastOptions", "AllReduceOptions",
    "ReduceOptions", "AllGatherOptions", "AllGatherSingleOptions", "ReduceScatterOptions",
    "ReduceScatterSingleOptions", "AllToAllOptions", "AllToAllSingleOptions", "AllToAllvSingleOptions",
    "BarrierOptions", "ScatterOptions", "GatherOptions", "AllGatherPInitOptions", "AllGatherPExecOptions",
    "get_mem_allocator", "objcol", "TorchCommError", *_hook_names,
]
