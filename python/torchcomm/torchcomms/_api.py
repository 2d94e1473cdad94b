"""torchcomms 0.3's Python API (``comms/torchcomms/_comms.pyi``) over
libtorchcomm's ctypes layer: ``new_comm``, ``TorchComm``, ``TorchWork``,
``ReduceOp``, windows. The hot path (a tensor in, one C call, a completed
work out) builds nothing it can keep from the last call."""
from __future__ import annotations

import collections
import ctypes as C
import enum
import os
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Type, Union

import torch

from .. import _lib
from .._buffers import _TORCH_NAMES
from .._lib import TorchCommError, check, invalid, lib
from ..comm import Comm, _device
from ..torch_store import from_torch
from ..window import Window

InitHandle = str
TC_ERR_UNSUPPORTED = 1004

_DTYPES = {getattr(torch, name): int(dt) for dt, name in _TORCH_NAMES.items() if hasattr(torch, name)}
_BACKENDS = ("gloo", "nccl")


def _unsupported(what: str) -> TorchCommError:
    """A name of torchcomms' API this library does not offer (docs/status.md)."""
    return TorchCommError(TC_ERR_UNSUPPORTED, f"{what} is not supported by libtorchcomm (see docs/status.md)", what)


def _ms(timeout: Any, what: str = "timeout") -> int:
    if isinstance(timeout, timedelta):
        secs = timeout.total_seconds()
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        secs = float(timeout)
    else:
        raise invalid(f"argument '{what}': {type(timeout).__name__} is not a timedelta", what)
    if secs <= 0:
        raise invalid(f"argument '{what}': {timeout} is not positive", what)
    return max(1, int(secs * 1000))


# -- reduce ops

class RedOpType(enum.Enum):
    """The kind of a ReduceOp (values: the C API's tc_reduce_kind)."""

    SUM = 0
    PRODUCT = 1
    MIN = 2
    MAX = 3
    BAND = 4
    BOR = 5
    BXOR = 6
    PREMUL_SUM = 7
    AVG = 8


class ReduceOp:
    """``ReduceOp.SUM`` ... ``ReduceOp.AVG``, or ``ReduceOp.PREMUL_SUM(factor)``
    with a float or a one-element tensor; ``.type`` is its RedOpType."""

    __slots__ = ("_type", "_factor", "_c")
    SUM: "ReduceOp"
    PRODUCT: "ReduceOp"
    MIN: "ReduceOp"
    MAX: "ReduceOp"
    BAND: "ReduceOp"
    BOR: "ReduceOp"
    BXOR: "ReduceOp"
    AVG: "ReduceOp"

    def __init__(self, type: RedOpType, factor: Any = None):
        if not isinstance(type, RedOpType):
            raise invalid(f"argument 'type': {type!r} is not a RedOpType", "ReduceOp")
        self._type = type
        self._factor = factor
        # Ops without a tensor factor have one C value for every call.
        self._c = None if isinstance(factor, torch.Tensor) else _lib.ReduceOpC(
            type.value, 1.0 if factor is None else float(factor), None)

    @staticmethod
    def PREMUL_SUM(factor: Any) -> "ReduceOp":  # noqa: N802 (torchcomms' name)
        if isinstance(factor, torch.Tensor):
            if factor.numel() != 1:
                raise invalid(f"argument 'factor': a tensor of {factor.numel()} elements, not one", "PREMUL_SUM")
            return ReduceOp(RedOpType.PREMUL_SUM, factor)
        if isinstance(factor, bool) or not isinstance(factor, (int, float)):
            raise invalid(f"argument 'factor': {type(factor).__name__} is neither a float nor a one-element tensor",
                          "PREMUL_SUM")
        return ReduceOp(RedOpType.PREMUL_SUM, float(factor))

    @property
    def type(self) -> RedOpType:
        return self._type

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RedOpType):
            return self._type == other
        return isinstance(other, ReduceOp) and self._type == other._type and self._factor is other._factor

    def __hash__(self) -> int:
        return hash(self._type)

    def __repr__(self) -> str:
        extra = "" if self._factor is None else f"({self._factor})"
        return f"ReduceOp.{self._type.name}{extra}"

    def _for(self, t: torch.Tensor) -> Any:
        """The C value for an operation on `t`, and what it must keep alive."""
        if self._c is not None:
            return self._c, None
        f = self._factor
        if not t.is_cuda:
            return _lib.ReduceOpC(RedOpType.PREMUL_SUM.value, float(f.item()), None), None
        # A device scalar of the operation's dtype, read by the device.
        f = f.to(device=t.device, dtype=t.dtype).contiguous()
        return _lib.ReduceOpC(RedOpType.PREMUL_SUM.value, 1.0, f.data_ptr()), f


for _name in ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "AVG"):
    setattr(ReduceOp, _name, ReduceOp(RedOpType[_name]))


def _op(op: Any, t: torch.Tensor) -> Any:
    if type(op) is ReduceOp:
        if op._c is not None:
            return op._c, None
        return op._for(t)
    if isinstance(op, RedOpType) and op is not RedOpType.PREMUL_SUM:
        return getattr(ReduceOp, op.name)._c, None
    raise invalid(f"argument 'op': {op!r} is not a ReduceOp", "op")


# -- tensors

def _tensor(t: Any, what: str) -> Any:
    """(address, elements, dtype, CUDA stream or None) of a tensor argument."""
    if not isinstance(t, torch.Tensor):
        raise invalid(f"argument '{what}': {type(t).__name__} is not a torch.Tensor", what)
    dt = _DTYPES.get(t.dtype)
    if dt is None:
        raise invalid(f"argument '{what}': dtype {t.dtype} is not supported", what)
    if not t.is_contiguous():
        raise invalid(f"argument '{what}': the tensor is not contiguous", what)
    if t.is_cuda:
        return t.data_ptr(), t.numel(), dt, torch.cuda.current_stream(t.device).cuda_stream
    return t.data_ptr(), t.numel(), dt, None


def _tensor_list(ts: Any, what: str, n: int, count: int, dt: int) -> Any:
    """A C array of the addresses of `n` tensors of `count` elements of `dt`."""
    if not isinstance(ts, (list, tuple)):
        raise invalid(f"argument '{what}': {type(ts).__name__} is not a list of tensors", what)
    if len(ts) != n:
        raise invalid(f"argument '{what}': {len(ts)} tensors, the comm has {n} ranks", what)
    arr = (C.c_void_p * n)()
    for i, t in enumerate(ts):
        p, c, d, _ = _tensor(t, f"{what}[{i}]")
        if c != count or d != dt:
            raise invalid(f"argument '{what}[{i}]': {c} elements of {t.dtype}, expected {count} like the other "
                          "tensor argument", what)
        arr[i] = p
    return arr


# -- work

# Works dropped before completion, freed once done. A deque: append and
# popleft are atomic, and no lock is taken (a __del__ run by the garbage
# collector inside a locked section would deadlock on it).
_orphans: "collections.deque[TorchWork]" = collections.deque()


def _sweep(block: bool = False) -> None:
    pending = []
    while True:
        try:
            pending.append(_orphans.popleft())
        except IndexError:
            break
    for w in pending:
        if block:
            lib.tc_work_wait_blocking(w._h)
        done = C.c_int()
        if lib.tc_work_is_completed(w._h, C.byref(done)) != 0 or done.value:
            w._done()
        else:
            _orphans.append(w)


class TorchWork:
    """The completion of one operation. ``wait()``: a host operation has
    completed when it returns; a CUDA one is ordered before later work of
    the caller's current stream (the host does not block). A work dropped
    before completion is safe: its tensors stay referenced until it
    completes."""

    __slots__ = ("_h", "_keep", "_cuda", "_finish")

    def __init__(self, handle: Any, keep: Any = None, cuda: bool = False, finish: Optional[Callable[[], None]] = None):
        self._h, self._keep, self._cuda, self._finish = handle, keep, cuda, finish

    def is_completed(self) -> bool:
        if self._h is None:
            return True
        done = C.c_int()
        check(lib.tc_work_is_completed(self._h, C.byref(done)), "tc_work_is_completed")
        if done.value:
            self._done()
        return bool(done.value)

    def wait(self) -> None:
        if self._h is None:
            return
        stream = torch.cuda.current_stream().cuda_stream if self._cuda else None
        check(lib.tc_work_wait(self._h, stream), "tc_work_wait")
        self._done()

    def wait_blocking(self) -> None:
        """Blocks the host until the operation completed (CUDA too)."""
        if self._h is not None:
            check(lib.tc_work_wait_blocking(self._h), "tc_work_wait_blocking")
            self._done()

    def _set_status(self, status: Any) -> None:
        raise _unsupported("TorchWork._set_status")

    def _done(self) -> None:
        """Runs the finishing step (copies out of staging) once, frees the handle."""
        finish, self._finish = self._finish, None
        if finish is not None:
            finish()
        if self._h is not None and not self._cuda:
            lib.tc_work_free(self._h)
            self._h, self._keep = None, None

    def __del__(self) -> None:
        # No library call here (the garbage collector may run this anywhere):
        # the next operation's sweep frees the handle once the work is done.
        if self._h is not None:
            _orphans.append(TorchWork(self._h, self._keep, False, self._finish))
            self._h = None


_DONE = TorchWork(None)


class WorkStatus(enum.Enum):
    NOT_STARTED = 0
    INPROGRESS = 1
    COMPLETED = 2
    TIMEDOUT = 3
    ERROR = 4


# -- options (plain records, as torchcomms has them)

class CommOptions:
    def __init__(self) -> None:
        self.abort_process_on_timeout_or_error: bool = True
        self.timeout: timedelta = timedelta(seconds=600)
        self.store: Any = None
        self.name: str = ""
        self.enable_reconfigure: bool = False
        self.hints: Dict[str, str] = {}


class _OpOptions:
    def __init__(self) -> None:
        self.timeout: Optional[timedelta] = None
        self.hints: Dict[str, str] = {}


def _options_class(name: str) -> Type[_OpOptions]:
    return type(name, (_OpOptions,), {"__doc__": f"torchcomms' {name}: timeout and hints."})


SendOptions = _options_class("SendOptions")
RecvOptions = _options_class("RecvOptions")
BatchP2POptions = _options_class("BatchP2POptions")
BroadcastOptions = _options_class("BroadcastOptions")
AllReduceOptions = _options_class("AllReduceOptions")
ReduceOptions = _options_class("ReduceOptions")
AllGatherOptions = _options_class("AllGatherOptions")
AllGatherSingleOptions = _options_class("AllGatherSingleOptions")
ReduceScatterOptions = _options_class("ReduceScatterOptions")
ReduceScatterSingleOptions = _options_class("ReduceScatterSingleOptions")
AllToAllOptions = _options_class("AllToAllOptions")
AllToAllSingleOptions = _options_class("AllToAllSingleOptions")
AllToAllvSingleOptions = _options_class("AllToAllvSingleOptions")
BarrierOptions = _options_class("BarrierOptions")
ScatterOptions = _options_class("ScatterOptions")
GatherOptions = _options_class("GatherOptions")
AllGatherPInitOptions = _options_class("AllGatherPInitOptions")
AllGatherPExecOptions = _options_class("AllGatherPExecOptions")


class ReconfigureOptions:
    def __init__(self, uuid: int = 0, init_handles: Union[List[str], Set[str], None] = None,
                 timeout: Optional[timedelta] = None, hints: Optional[Dict[str, str]] = None) -> None:
        self.uuid = uuid
        self.init_handles = init_handles if init_handles is not None else []
        self.timeout = timeout
        self.hints = hints or {}


# -- the communicator

def _default_opts(async_op: bool) -> Any:
    return C.pointer(_lib.op_options(async_op, None, None, None))


_SYNC, _ASYNC = _default_opts(False), _default_opts(True)


def _opts(async_op: bool, hints: Optional[Dict[str, str]], timeout: Any, stream: Optional[int]) -> Any:
    if hints is None and timeout is None and stream is None:
        return _ASYNC if async_op else _SYNC
    o = _lib.op_options(async_op, None, stream, hints)
    if timeout is not None:
        o.timeout_ms = _ms(timeout)
    return C.pointer(o)


class TorchComm:
    """A communicator made by ``new_comm`` (or ``split``)."""

    def __init__(self, comm: Comm, backend: str, device: torch.device, options: CommOptions):
        self._comm, self._h = comm, comm.handle
        self._size: Optional[int] = None
        self._rank: Optional[int] = None
        if not options.enable_reconfigure:  # a reconfigurable comm has no members until reconfigure
            self._size, self._rank = comm.size, comm.rank
        self._backend, self._device, self._options = backend, device, options
        self._registrations: Dict[int, Any] = {}
        self._abort_hooks: Dict[int, Callable[[], None]] = {}

    # -- issuing
    def _issue(self, call: str, fn: Callable[[Any], int], async_op: bool, stream: Optional[int], keep: Any,
               finish: Optional[Callable[[], None]] = None) -> TorchWork:
        if _orphans:
            _sweep()
        if not async_op and stream is None:
            rc = fn(None)  # host memory, blocking: no work handle needed
            if rc:
                check(rc, call)
            if finish is not None:
                finish()
            if _orphans:  # earlier operations are complete now: finish them
                _sweep()
            return _DONE
        w = C.c_void_p()
        rc = fn(C.byref(w))
        if rc:
            check(rc, call)
        if not async_op:  # CUDA, enqueued on the current stream: later work there is ordered after it
            if finish is not None:
                finish()
            return TorchWork(w, keep, True)
        return TorchWork(w, keep, stream is not None, finish)

    # -- queries
    def get_rank(self) -> int:
        return self._rank if self._rank is not None else self._comm.rank  # the latter raises until formed

    def get_size(self) -> int:
        return self._size if self._size is not None else self._comm.size

    def get_name(self) -> str:
        return self._comm.name

    def get_backend(self) -> str:
        return self._backend

    def get_backend_version(self) -> str:
        return self._comm.backend_version

    def get_device(self) -> torch.device:
        return self._device

    def get_options(self) -> CommOptions:
        return self._options

    def get_backend_impl(self) -> Any:
        raise _unsupported("TorchComm.get_backend_impl")

    def unsafe_get_backend(self) -> Any:
        raise _unsupported("TorchComm.unsafe_get_backend")

    # -- management
    def finalize(self) -> None:
        self._comm.finalize()
        _sweep(block=True)

    def abort(self) -> None:
        self._comm.abort()

    def is_abort_supported(self) -> bool:
        return True

    def is_aborted(self) -> bool:
        return self._comm.async_error() is not None

    def set_timeout(self, timeout: timedelta) -> None:
        self._comm.set_timeout(_ms(timeout) / 1000)

    def set_hints(self, hints: Dict[str, str]) -> None:
        self._comm.set_hints(hints)

    def get_init_handle(self) -> InitHandle:
        return self._comm.init_handle()

    def reconfigure(self, uuid: int, init_handles: Any, timeout: Optional[timedelta] = None,
                    hints: Optional[Dict[str, str]] = None) -> TorchWork:
        """Re-forms the comm in place (blocking, as the library's call is):
        a list ranks the members in its order, a set in the handles' byte
        order; returns a completed work, as torchcomms returns one."""
        self._comm.reconfigure(uuid, init_handles, timeout, hints)
        self._size, self._rank = self._comm.size, self._comm.rank
        return _DONE

    def split(self, ranks: List[int], name: str, hints: Optional[Dict[str, str]] = None,
              timeout: Optional[timedelta] = None) -> Optional["TorchComm"]:
        if not isinstance(name, str):
            raise invalid(f"argument 'name': {type(name).__name__} is not a str", "split")
        if not isinstance(ranks, (list, tuple)) or not all(isinstance(r, int) for r in ranks):
            raise invalid("argument 'ranks': not a list of ints", "split")
        extra: Dict[str, Any] = {}
        if hints is not None:
            extra["hints"] = hints
        if timeout is not None:
            extra["timeout"] = _ms(timeout) / 1000
        child = self._comm.split(list(ranks), name, **extra)
        if child is None:
            return None
        opts = CommOptions()
        opts.__dict__.update(self._options.__dict__)
        opts.name, opts.hints = name, dict(hints or {})
        return TorchComm(child, self._backend, self._device, opts)

    def register_abort_hook(self, callback: Callable[[], None]) -> "RemovableHandle":
        hooks = self._abort_hooks
        key = id(callback) ^ len(hooks)

        def run(_code: int, _message: str) -> None:
            for h in list(hooks.values()):
                h()
        hooks[key] = callback
        self._comm.set_abort_hook(run)
        return RemovableHandle(lambda: hooks.pop(key, None))

    def register_pre_hook(self, callback: Any) -> "RemovableHandle":
        raise _unsupported("TorchComm.register_pre_hook")

    def register_post_hook(self, callback: Any) -> "RemovableHandle":
        raise _unsupported("TorchComm.register_post_hook")

    def get_mem_allocator(self) -> Any:
        raise _unsupported("TorchComm.get_mem_allocator")

    @property
    def mem_allocator(self) -> Any:
        raise _unsupported("TorchComm.mem_allocator")

    def tensor_register(self, tensor: Any) -> None:
        """Registers `tensor`'s memory with the backend until tensor_deregister."""
        _tensor(tensor, "tensor")
        self._registrations[tensor.data_ptr()] = self._comm.register(tensor)

    def tensor_deregister(self, tensor: Any) -> None:
        _tensor(tensor, "tensor")
        reg = self._registrations.pop(tensor.data_ptr(), None)
        if reg is None:
            raise invalid("argument 'tensor': not registered with tensor_register", "tensor_deregister")
        reg.deregister()

    # -- point to point
    def send(self, tensor: Any, dst: int, async_op: bool, hints: Optional[Dict[str, str]] = None,
             timeout: Optional[timedelta] = None) -> TorchWork:
        p, n, dt, s = _tensor(tensor, "tensor")
        o = _opts(async_op, hints, timeout, s)
        return self._issue("send", lambda w: lib.tc_send(self._h, p, n, dt, dst, o, w), async_op, s, tensor)

    def recv(self, tensor: Any, src: int, async_op: bool, hints: Optional[Dict[str, str]] = None,
             timeout: Optional[timedelta] = None) -> TorchWork:
        p, n, dt, s = _tensor(tensor, "tensor")
        o = _opts(async_op, hints, timeout, s)
        return self._issue("recv", lambda w: lib.tc_recv(self._h, p, n, dt, src, o, w), async_op, s, tensor)

    def batch_op_create(self) -> "BatchSendRecv":
        return BatchSendRecv(self)

    # -- collectives
    def broadcast(self, tensor: Any, root: int, async_op: bool, hints: Optional[Dict[str, str]] = None,
                  timeout: Optional[timedelta] = None) -> TorchWork:
        p, n, dt, s = _tensor(tensor, "tensor")
        o = _opts(async_op, hints, timeout, s)
        return self._issue("broadcast", lambda w: lib.tc_broadcast(self._h, p, n, dt, root, o, w), async_op, s,
                           tensor)

    def all_reduce(self, tensor: Any, op: ReduceOp, async_op: bool, hints: Optional[Dict[str, str]] = None,
                   timeout: Optional[timedelta] = None) -> TorchWork:
        p, n, dt, s = _tensor(tensor, "tensor")
        c, k = _op(op, tensor)
        o = _opts(async_op, hints, timeout, s)
        return self._issue("all_reduce", lambda w: lib.tc_all_reduce(self._h, p, n, dt, c, o, w), async_op, s,
                           (tensor, k))

    def reduce(self, tensor: Any, root: int, op: ReduceOp, async_op: bool, hints: Optional[Dict[str, str]] = None,
               timeout: Optional[timedelta] = None) -> TorchWork:
        p, n, dt, s = _tensor(tensor, "tensor")
        c, k = _op(op, tensor)
        o = _opts(async_op, hints, timeout, s)
        return self._issue("reduce", lambda w: lib.tc_reduce(self._h, p, n, dt, root, c, o, w), async_op, s,
                           (tensor, k))

    def all_gather(self, tensor_list: List[Any], tensor: Any, async_op: bool,
                   hints: Optional[Dict[str, str]] = None, timeout: Optional[timedelta] = None) -> TorchWork:
        p, n, dt, s = _tensor(tensor, "tensor")
        outs = _tensor_list(tensor_list, "tensor_list", self._size, n, dt)
        o = _opts(async_op, hints, timeout, s)
        return self._issue("all_gather", lambda w: lib.tc_all_gather(self._h, outs, p, n, dt, o, w), async_op, s,
                           (tensor, tensor_list, outs))

    def all_gather_v(self, tensor_list: List[Any], tensor: Any, async_op: bool,
                     hints: Optional[Dict[str, str]] = None, timeout: Optional[timedelta] = None) -> TorchWork:
        """Rank r's `tensor` lands in every rank's `tensor_list[r]` (sizes may differ)."""
        p, n, dt, s = _tensor(tensor, "tensor")
        if not isinstance(tensor_list, (list, tuple)) or len(tensor_list) != self._size:
            raise invalid(f"argument 'tensor_list': needs {self._size} tensors", "all_gather_v")
        counts = [_tensor(t, f"tensor_list[{i}]")[1] for i, t in enumerate(tensor_list)]
        if counts[self._rank] != n:
            raise invalid(f"argument 'tensor_list[{self._rank}]': {counts[self._rank]} elements, 'tensor' has {n}",
                          "all_gather_v")
        flat = torch.empty(sum(counts), dtype=tensor.dtype, device=tensor.device)
        cs = (C.c_size_t * self._size)(*counts)
        o = _opts(async_op, hints, timeout, s)

        def finish() -> None:
            for t, part in zip(tensor_list, flat.split(counts)):
                t.view(-1).copy_(part)
        return self._issue("all_gather_v", lambda w: lib.tc_all_gather_v(self._h, flat.data_ptr(), cs, p, dt, o, w),
                           async_op, s, (tensor, flat, cs), finish)

    def all_gather_single(self, output: Any, input: Any, async_op: bool, hints: Optional[Dict[str, str]] = None,
                          timeout: Optional[timedelta] = None) -> TorchWork:
        op_, on, odt, _ = _tensor(output, "output")
        ip, n, dt, s = _tensor(input, "input")
        if odt != dt or on != n * self._size:
            raise invalid(f"argument 'output': {on} elements of {output.dtype}, expected {n * self._size} of "
                          f"{input.dtype}", "all_gather_single")
        o = _opts(async_op, hints, timeout, s)
        return self._issue("all_gather_single", lambda w: lib.tc_all_gather_single(self._h, op_, ip, n, dt, o, w),
                           async_op, s, (output, input))

    def reduce_scatter(self, output: Any, input_list: List[Any], op: ReduceOp, async_op: bool,
                       hints: Optional[Dict[str, str]] = None, timeout: Optional[timedelta] = None) -> TorchWork:
        p, n, dt, s = _tensor(output, "output")
        ins = _tensor_list(input_list, "input_list", self._size, n, dt)
        c, k = _op(op, output)
        o = _opts(async_op, hints, timeout, s)
        return self._issue("reduce_scatter", lambda w: lib.tc_reduce_scatter(self._h, p, ins, n, dt, c, o, w),
                           async_op, s, (output, input_list, ins, k))

    def reduce_scatter_v(self, output: Any, input_list: List[Any], op: ReduceOp, async_op: bool,
                         hints: Optional[Dict[str, str]] = None, timeout: Optional[timedelta] = None) -> TorchWork:
        """Every rank's `input_list[r]` reduced into rank r's `output` (sizes may differ by r)."""
        p, n, dt, s = _tensor(output, "output")
        if not isinstance(input_list, (list, tuple)) or len(input_list) != self._size:
            raise invalid(f"argument 'input_list': needs {self._size} tensors", "reduce_scatter_v")
        counts = [_tensor(t, f"input_list[{i}]")[1] for i, t in enumerate(input_list)]
        if counts[self._rank] != n:
            raise invalid(f"argument 'output': {n} elements, 'input_list[{self._rank}]' has {counts[self._rank]}",
                          "reduce_scatter_v")
        flat = torch.cat([t.reshape(-1) for t in input_list])
        cs = (C.c_size_t * self._size)(*counts)
        c, k = _op(op, output)
        o = _opts(async_op, hints, timeout, s)
        return self._issue("reduce_scatter_v", lambda w: lib.tc_reduce_scatter_v(
            self._h, p, flat.data_ptr(), cs, dt, c, o, w), async_op, s, (output, flat, cs, k))

    def reduce_scatter_single(self, output: Any, input: Any, op: ReduceOp, async_op: bool,
                              hints: Optional[Dict[str, str]] = None,
                              timeout: Optional[timedelta] = None) -> TorchWork:
        p, n, dt, s = _tensor(output, "output")
        ip, inn, idt, _ = _tensor(input, "input")
        if idt != dt or inn != n * self._size:
            raise invalid(f"argument 'input': {inn} elements of {input.dtype}, expected {n * self._size} of "
                          f"{output.dtype}", "reduce_scatter_single")
        c, k = _op(op, output)
        o = _opts(async_op, hints, timeout, s)
        return self._issue("reduce_scatter_single", lambda w: lib.tc_reduce_scatter_single(
            self._h, p, ip, n, dt, c, o, w), async_op, s, (output, input, k))

    def all_to_all_single(self, output: Any, input: Any, async_op: bool, hints: Optional[Dict[str, str]] = None,
                          timeout: Optional[timedelta] = None) -> TorchWork:
        op_, on, odt, _ = _tensor(output, "output")
        ip, n, dt, s = _tensor(input, "input")
        if odt != dt or on != n:
            raise invalid(f"argument 'output': {on} elements of {output.dtype}, expected {n} of {input.dtype}",
                          "all_to_all_single")
        if n % self._size:
            raise invalid(f"argument 'input': {n} elements do not split into {self._size} ranks", "all_to_all_single")
        o = _opts(async_op, hints, timeout, s)
        per = n // self._size
        return self._issue("all_to_all_single", lambda w: lib.tc_all_to_all_single(self._h, op_, ip, per, dt, o, w),
                           async_op, s, (output, input))

    def all_to_all_v_single(self, output: Any, input: Any, output_split_sizes: List[int],
                            input_split_sizes: List[int], async_op: bool, hints: Optional[Dict[str, str]] = None,
                            timeout: Optional[timedelta] = None) -> TorchWork:
        """Split sizes count rows of dim 0 (an empty list: even splits)."""
        op_, on, odt, _ = _tensor(output, "output")
        ip, n, dt, s = _tensor(input, "input")
        if odt != dt:
            raise invalid(f"argument 'output': {output.dtype}, 'input' is {input.dtype}", "all_to_all_v_single")
        oc = self._split_counts(output, on, output_split_sizes, "output_split_sizes")
        ic = self._split_counts(input, n, input_split_sizes, "input_split_sizes")
        o = _opts(async_op, hints, timeout, s)
        return self._issue("all_to_all_v_single", lambda w: lib.tc_all_to_all_v_single(
            self._h, op_, oc, ip, ic, dt, o, w), async_op, s, (output, input, oc, ic))

    def _split_counts(self, t: Any, n: int, splits: Any, what: str) -> Any:
        rows = t.shape[0] if t.dim() else 1
        row = n // rows if rows else 0
        if not splits:
            if rows % self._size:
                raise invalid(f"argument '{what}': empty, and {rows} rows do not split evenly", what)
            splits = [rows // self._size] * self._size
        if len(splits) != self._size or any((not isinstance(x, int)) or x < 0 for x in splits):
            raise invalid(f"argument '{what}': needs {self._size} non-negative ints, got {splits!r}", what)
        if sum(splits) != rows:
            raise invalid(f"argument '{what}': sums to {sum(splits)} rows, the tensor has {rows}", what)
        return (C.c_size_t * self._size)(*[x * row for x in splits])

    def all_to_all(self, output_tensor_list: List[Any], input_tensor_list: List[Any], async_op: bool,
                   hints: Optional[Dict[str, str]] = None, timeout: Optional[timedelta] = None) -> TorchWork:
        if not isinstance(input_tensor_list, (list, tuple)) or not input_tensor_list:
            raise invalid("argument 'input_tensor_list': not a non-empty list of tensors", "all_to_all")
        _, n, dt, s = _tensor(input_tensor_list[0], "input_tensor_list[0]")
        ins = _tensor_list(input_tensor_list, "input_tensor_list", self._size, n, dt)
        outs = _tensor_list(output_tensor_list, "output_tensor_list", self._size, n, dt)
        o = _opts(async_op, hints, timeout, s)
        return self._issue("all_to_all", lambda w: lib.tc_all_to_all(self._h, outs, ins, n, dt, o, w), async_op, s,
                           (output_tensor_list, input_tensor_list, ins, outs))

    def barrier(self, async_op: bool, hints: Optional[Dict[str, str]] = None,
                timeout: Optional[timedelta] = None) -> TorchWork:
        s = torch.cuda.current_stream().cuda_stream if self._device.type == "cuda" else None
        o = _opts(async_op, hints, timeout, s)
        return self._issue("barrier", lambda w: lib.tc_barrier(self._h, o, w), async_op, s, None)

    def scatter(self, output_tensor: Any, input_tensor_list: List[Any], root: int, async_op: bool,
                hints: Optional[Dict[str, str]] = None, timeout: Optional[timedelta] = None) -> TorchWork:
        """`input_tensor_list` is read on the root only (elsewhere it may be empty)."""
        p, n, dt, s = _tensor(output_tensor, "output_tensor")
        ins = _tensor_list(input_tensor_list, "input_tensor_list", self._size, n, dt) \
            if self._rank == root or input_tensor_list else None
        o = _opts(async_op, hints, timeout, s)
        return self._issue("scatter", lambda w: lib.tc_scatter(self._h, p, ins, n, dt, root, o, w), async_op, s,
                           (output_tensor, input_tensor_list, ins))

    def gather(self, output_tensor_list: List[Any], input_tensor: Any, root: int, async_op: bool,
               hints: Optional[Dict[str, str]] = None, timeout: Optional[timedelta] = None) -> TorchWork:
        """`output_tensor_list` is written on the root only (elsewhere it may be empty)."""
        p, n, dt, s = _tensor(input_tensor, "input_tensor")
        outs = _tensor_list(output_tensor_list, "output_tensor_list", self._size, n, dt) \
            if self._rank == root or output_tensor_list else None
        o = _opts(async_op, hints, timeout, s)
        return self._issue("gather", lambda w: lib.tc_gather(self._h, outs, p, n, dt, root, o, w), async_op, s,
                           (output_tensor_list, input_tensor, outs))

    def gather_single(self, output: Any, input: Any, root: int, async_op: bool,
                      hints: Optional[Dict[str, str]] = None, timeout: Optional[timedelta] = None) -> TorchWork:
        """`output` (size x input's elements) is written on the root only; elsewhere it may be None."""
        ip, n, dt, s = _tensor(input, "input")
        op_ = None
        if self._rank == root or output is not None:
            op_, on, odt, _ = _tensor(output, "output")
            if odt != dt or on != n * self._size:
                raise invalid(f"argument 'output': {on} elements of {output.dtype}, expected {n * self._size} of "
                              f"{input.dtype}", "gather_single")
        o = _opts(async_op, hints, timeout, s)
        return self._issue("gather_single", lambda w: lib.tc_gather_single(self._h, op_, ip, n, dt, root, o, w),
                           async_op, s, (output, input))

    # -- persistent all-gather
    def all_gather_p_init(self, output: Any, hints: Optional[Dict[str, str]] = None,
                          timeout: Optional[timedelta] = None) -> Any:
        _tensor(output, "output")
        extra: Dict[str, Any] = {"hints": hints}
        if timeout is not None:
            extra["timeout"] = _ms(timeout) / 1000
        return self._comm.all_gather_p(output, **extra)

    def all_gather_p_exec(self, handle: Any, input: Any, async_op: bool, hints: Optional[Dict[str, str]] = None,
                          timeout: Optional[timedelta] = None) -> TorchWork:
        _tensor(input, "input")
        extra: Dict[str, Any] = {"hints": hints, "async_op": async_op}
        if timeout is not None:
            extra["timeout"] = _ms(timeout) / 1000
        return _adopt(handle.exec(input, **extra), input)

    def all_gather_p_free(self, handle: Any) -> None:
        handle.close()

    # -- windows
    def new_window(self, tensor: Any = None) -> "TorchCommWindow":
        w = TorchCommWindow(self)
        if tensor is not None:
            w.tensor_register(tensor)
        return w


def _adopt(work: Any, keep: Any) -> TorchWork:
    """A TorchWork taking over a torchcomm.Work's handle."""
    h, work._h = work._h, None
    cuda = work._stream is not None
    if h is None or not h.value:
        return _DONE
    return TorchWork(h, (keep, work._keep), cuda)


class RemovableHandle:
    def __init__(self, remove: Callable[[], Any]):
        self._remove: Optional[Callable[[], Any]] = remove

    def remove(self) -> None:
        if self._remove is not None:
            self._remove()
            self._remove = None


# -- batches of point-to-point

class P2POpType(enum.Enum):
    SEND = 0
    RECV = 1


class P2POp:
    def __init__(self, type: P2POpType, tensor: Any, peer: int) -> None:
        self.type, self.tensor, self.peer = type, tensor, peer


class BatchSendRecv:
    """Sends and receives issued together (``TorchComm.batch_op_create``)."""

    def __init__(self, comm: TorchComm):
        self._comm = comm
        self.ops: List[P2POp] = []

    def send(self, tensor: Any, dst: int) -> None:
        _tensor(tensor, "tensor")
        self.ops.append(P2POp(P2POpType.SEND, tensor, dst))

    def recv(self, tensor: Any, src: int) -> None:
        _tensor(tensor, "tensor")
        self.ops.append(P2POp(P2POpType.RECV, tensor, src))

    def issue(self, async_op: bool, options: Optional[BatchP2POptions] = None) -> TorchWork:
        batch = self._comm._comm.batch()
        try:
            for op in self.ops:
                (batch.send if op.type == P2POpType.SEND else batch.recv)(op.tensor, op.peer)
            extra: Dict[str, Any] = {"async_op": async_op}
            if options is not None:
                extra["hints"] = options.hints or None
                if options.timeout is not None:
                    extra["timeout"] = _ms(options.timeout) / 1000
            return _adopt(batch.issue(**extra), [op.tensor for op in self.ops])
        finally:
            batch.free()


# -- windows

class TorchCommWinAccessType(enum.Enum):
    WIN_ACCESS_TYPE_UNIFIED = 0
    WIN_ACCESS_TYPE_SEPARATE = 1


class TorchCommWindowAttr:
    def __init__(self) -> None:
        self.access_type = TorchCommWinAccessType.WIN_ACCESS_TYPE_SEPARATE


class TorchCommWindow:
    """One-sided window over a comm (``TorchComm.new_window``). Offsets count
    elements of the registered tensor's dtype."""

    def __init__(self, comm: TorchComm):
        self._comm = comm
        self._win = Window(comm._comm)
        self._tensor: Optional[torch.Tensor] = None

    @property
    def dtype(self) -> Any:
        return None if self._tensor is None else self._tensor.dtype

    @property
    def shape(self) -> List[int]:
        return [] if self._tensor is None else list(self._tensor.shape)

    @property
    def device(self) -> Any:
        return self._comm._device if self._tensor is None else self._tensor.device

    def get_size(self) -> int:
        return 0 if self._tensor is None else self._tensor.numel() * self._tensor.element_size()

    def get_tensor(self) -> Optional[torch.Tensor]:
        return self._tensor

    def tensor_register(self, tensor: Any, owning: bool = True) -> None:
        """Collective. The window keeps `tensor` referenced until deregistered."""
        _tensor(tensor, "tensor")
        self._win.register(tensor)
        self._tensor = tensor

    def tensor_deregister(self) -> None:
        self._win.deregister()
        self._tensor = None

    def _elem(self) -> int:
        if self._tensor is None:
            raise TorchCommError(1003, "the window has no registered tensor (tensor_register first)", "window")
        return self._tensor.element_size()

    def _extra(self, async_op: bool, hints: Optional[Dict[str, str]], timeout: Any) -> Dict[str, Any]:
        extra: Dict[str, Any] = {"async_op": async_op, "hints": hints}
        if timeout is not None:
            extra["timeout"] = _ms(timeout) / 1000
        return extra

    def put(self, tensor: Any, dst_rank: int, target_offset_nelems: int, async_op: bool,
            hints: Optional[Dict[str, str]] = None, timeout: Optional[timedelta] = None) -> TorchWork:
        _tensor(tensor, "tensor")
        off = int(target_offset_nelems) * self._elem()
        return _adopt(self._win.put(tensor, dst_rank, off, **self._extra(async_op, hints, timeout)), tensor)

    def get(self, tensor: Any, src_rank: int, src_offset_nelems: int, async_op: bool,
            hints: Optional[Dict[str, str]] = None, timeout: Optional[timedelta] = None) -> TorchWork:
        """Reads `tensor.numel()` elements at `src_offset_nelems` of `src_rank`'s
        registered tensor (libtorchcomm's addition; torchcomms has no get)."""
        _tensor(tensor, "tensor")
        off = int(src_offset_nelems) * self._elem()
        return _adopt(self._win.get(tensor, src_rank, off, **self._extra(async_op, hints, timeout)), tensor)

    def signal(self, dst_rank: int, async_op: bool, hints: Optional[Dict[str, str]] = None,
               timeout: Optional[timedelta] = None) -> TorchWork:
        return _adopt(self._win.signal(dst_rank, **self._extra(async_op, hints, timeout)), None)

    def wait_signal(self, peer_rank: int, async_op: bool, hints: Optional[Dict[str, str]] = None,
                    timeout: Optional[timedelta] = None) -> TorchWork:
        return _adopt(self._win.wait_signal(peer_rank, **self._extra(async_op, hints, timeout)), None)

    def map_remote_tensor(self, rank: int) -> torch.Tensor:
        """A local view of `rank`'s registered tensor (same host, host memory)."""
        t = self._tensor
        if t is None:
            raise TorchCommError(1003, "the window has no registered tensor (tensor_register first)", "window")
        addr = self._win.map_remote(rank)
        if t.is_cuda:
            raise _unsupported("TorchCommWindow.map_remote_tensor of CUDA memory")
        nbytes = t.numel() * t.element_size()
        if nbytes == 0:
            return torch.empty_like(t)
        raw = (C.c_char * nbytes).from_address(addr)
        return torch.frombuffer(raw, dtype=t.dtype).view(t.shape)

    def get_attr(self, peer_rank: int) -> TorchCommWindowAttr:
        attr = TorchCommWindowAttr()
        try:
            self._win.map_remote(peer_rank)
            attr.access_type = TorchCommWinAccessType.WIN_ACCESS_TYPE_UNIFIED
        except TorchCommError:
            pass
        return attr

    def get_device_window(self, signal_count: int = -1, counter_count: int = -1, barrier_count: int = 1) -> int:
        raise _unsupported("TorchCommWindow.get_device_window")

    def register_local_buffer(self, tensor: Any) -> int:
        raise _unsupported("TorchCommWindow.register_local_buffer")

    def deregister_local_buffer(self, handle: int) -> None:
        raise _unsupported("TorchCommWindow.deregister_local_buffer")


# -- creating comms

def _store(store: Any) -> Any:
    return None if store is None else from_torch(store)


def new_comm(backend: str, device: Any, name: Optional[str] = None,
             abort_process_on_timeout_or_error: Optional[bool] = None, timeout: Optional[timedelta] = None,
             is_high_priority_stream: Optional[bool] = None, store: Any = None, enable_reconfigure: bool = False,
             hints: Optional[Dict[str, str]] = None, *, high_priority_stream: Optional[bool] = None) -> TorchComm:
    """A communicator of every rank (collective). Rank and size come from the
    launcher's environment (TORCHCOMM_RANK/SIZE, torchrun's RANK/WORLD_SIZE,
    Open MPI's, Slurm's); `store` (any torch.distributed Store) or, when
    None, MASTER_ADDR/MASTER_PORT for the rendezvous."""
    if not isinstance(backend, str):
        raise invalid(f"argument 'backend': {type(backend).__name__} is not a str", "new_comm")
    if backend not in _BACKENDS:
        raise invalid(f"argument 'backend': {backend!r} is not a backend of libtorchcomm; it has "
                      f"{', '.join(repr(b) for b in _BACKENDS)}", "new_comm")
    try:
        dev = torch.device(device)
    except (TypeError, RuntimeError) as e:
        raise invalid(f"argument 'device': {device!r} is not a device ({e})", "new_comm") from None
    if dev.type not in ("cpu", "cuda"):
        raise invalid(f"argument 'device': {dev} is neither cpu nor cuda", "new_comm")
    if name is not None and not isinstance(name, str):
        raise invalid(f"argument 'name': {type(name).__name__} is not a str", "new_comm")
    all_hints = dict(hints or {})
    priority = is_high_priority_stream if is_high_priority_stream is not None else high_priority_stream
    if priority is not None and backend == "nccl":
        all_hints["nccl.high_priority_stream"] = "1" if priority else "0"
    ms = None if timeout is None else _ms(timeout) / 1000
    tc_store = _store(store)
    comm = Comm(backend, "cpu" if dev.type == "cpu" else str(dev), name=name, timeout=ms,
                abort_on_error=abort_process_on_timeout_or_error, store=tc_store, hints=all_hints or None,
                enable_reconfigure=enable_reconfigure)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", int(comm.device.partition(":")[2] or 0))
    opts = CommOptions()
    opts.abort_process_on_timeout_or_error = (abort_process_on_timeout_or_error
                                              if abort_process_on_timeout_or_error is not None
                                              else os.environ.get("TORCHCOMM_ABORT_ON_ERROR", "true").lower()
                                              not in ("0", "false", "no", "off"))
    opts.timeout = timeout if isinstance(timeout, timedelta) else timedelta(
        seconds=ms if ms is not None else float(os.environ.get("TORCHCOMM_TIMEOUT_SECONDS", "600")))
    opts.store, opts.name, opts.hints = store, comm.name, dict(hints or {})
    opts.enable_reconfigure = bool(enable_reconfigure)
    return TorchComm(comm, backend, dev, opts)


# -- names of torchcomms we cannot offer

class TorchCommBackend:
    """torchcomms' base class of out-of-tree backends (not supported here)."""

    def __init__(self) -> None:
        raise _unsupported("TorchCommBackend")


def register_backend(name: str, backend_class: Any) -> None:
    raise _unsupported("register_backend")


def _is_backend_registered(name: str) -> bool:
    return name in _BACKENDS


def get_mem_allocator(backend: str) -> Any:
    raise _unsupported("get_mem_allocator")


class _BackendWrapper:
    def __init__(self, comm: TorchComm) -> None:
        raise _unsupported("_BackendWrapper")

    def get_comm(self) -> TorchComm:
        raise _unsupported("_BackendWrapper.get_comm")

    def get_mem_allocator(self) -> Any:
        raise _unsupported("_BackendWrapper.get_mem_allocator")


class Timeout(timedelta):
    """torchcomms' timedelta subclass for timeouts."""


AllGatherPHandle = Any
