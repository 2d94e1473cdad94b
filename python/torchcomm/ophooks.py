"""Operation hooks (``Comm.add_pre_hook`` / ``add_post_hook``): what a hook
receives, and the ctypes callback that calls a Python function."""
from __future__ import annotations

import ctypes as C
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Tuple

from . import _lib
from ._buffers import DType


@dataclass(frozen=True)
class OpInfo:
    """One operation as a hook sees it (copied from ``tc_op_info_t``).
    Buffers are ``(address, count, dtype, peer)``; the addresses are the
    caller's (device addresses for CUDA buffers) and must not be written."""

    phase: str  # "pre" or "post"
    op_name: str
    comm_name: str
    seq: int
    rank: int
    size: int
    dtype: Optional[DType]  # None: a barrier, or a batch mixing types
    root: int
    peer: int
    async_op: bool
    inputs: List[Tuple[int, int, DType, int]]
    outputs: List[Tuple[int, int, DType, int]]
    status: int  # post: 0 or the operation's error code
    message: Optional[str]  # post: the error's detail
    completed: bool  # post: the operation finished (not only enqueued)
    tag: int = 0  # a send's or recv's tag; 0 otherwise
    # send, recv, batch: the tag of each input / output buffer, in order
    input_tags: List[int] = field(default_factory=list)
    output_tags: List[int] = field(default_factory=list)
    window_offset: int = 0  # a window put / get: the offset in the peer's window


def _buffers(ptr: Any, n: int) -> List[Tuple[int, int, DType, int]]:
    return [(ptr[i].ptr or 0, ptr[i].count, DType(ptr[i].dtype), ptr[i].peer) for i in range(n)]


def _tags(ptr: Any, n: int) -> List[int]:
    return [ptr[k] for k in range(n)] if ptr else []


def _info(p: Any) -> OpInfo:
    i = p.contents
    # Fields of version 2 only when the library wrote them.
    v2 = i.struct_size >= _lib.OpInfo.window_offset.offset + C.sizeof(C.c_size_t)
    tags = (i.tag, _tags(i.input_tags, i.num_inputs), _tags(i.output_tags, i.num_outputs)) if v2 else (0, [], [])
    offset = i.window_offset if v2 else 0
    return OpInfo(
        "pre" if i.phase == _lib.TC_HOOK_PRE else "post", (i.op_name or b"").decode(),
        (i.comm_name or b"").decode(errors="replace"), i.seq, i.rank, i.size,
        None if i.dtype < 0 else DType(i.dtype), i.root, i.peer, bool(i.async_op),
        _buffers(i.inputs, i.num_inputs), _buffers(i.outputs, i.num_outputs), i.status,
        None if not i.message else i.message.decode(errors="replace"), bool(i.completed), *tags, offset)


def callback(hook: Callable[[OpInfo], None]) -> Any:
    """The C callback for `hook`; keep it referenced while registered. ctypes
    takes the GIL on whatever thread the library calls it from (a post hook
    may run on the comm's progress thread). Exceptions are printed: none may
    reach the library."""

    def call(info: Any, _user: Any) -> None:
        try:
            hook(_info(info))
        except BaseException as e:  # noqa: B036 - nothing may unwind into C
            print(f"torchcomm operation hook raised {e!r}", file=sys.stderr)

    return _lib.OP_HOOK(call)


def add(comm_handle: Any, add_fn: Any, hook: Callable[[OpInfo], None], call: str) -> Tuple[int, Any]:
    """Registers `hook`; returns its id and the callback to keep."""
    if not callable(hook):
        raise _lib.invalid("'hook' is not callable", call)
    fn = callback(hook)
    hid = C.c_uint64()
    _lib.check(add_fn(comm_handle, fn, None, C.byref(hid)), call)
    return hid.value, fn
