"""Communicators, work handles, batches, backend memory and registrations."""
from __future__ import annotations

import ctypes as C
import enum
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from . import _lib, ophooks
from ._buffers import Buf, as_buffer, raw
from ._lib import TC_ANY_SOURCE as ANY_SOURCE, check, invalid, lib, refusing
from .ophooks import OpInfo
from .store import Store, Timeout, _ms


class RedOp(enum.IntEnum):
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
    """A reduction: ``ReduceOp.SUM`` ... or ``ReduceOp.premul_sum(factor)``;
    a plain RedOp or its name ("sum") works wherever a ReduceOp does."""

    SUM = RedOp.SUM
    PRODUCT = RedOp.PRODUCT
    MIN = RedOp.MIN
    MAX = RedOp.MAX
    BAND = RedOp.BAND
    BOR = RedOp.BOR
    BXOR = RedOp.BXOR
    AVG = RedOp.AVG

    def __init__(self, kind: RedOp, factor: float = 1.0, factor_buffer: Any = None):
        self.kind = RedOp(kind)
        self.factor = float(factor)
        # One element of the operation's dtype (device memory for CUDA buffers).
        self.factor_buffer = None if factor_buffer is None else as_buffer(factor_buffer, False, "factor")

    @staticmethod
    def premul_sum(factor: Any) -> "ReduceOp":
        if isinstance(factor, (int, float)):
            return ReduceOp(RedOp.PREMUL_SUM, factor)
        return ReduceOp(RedOp.PREMUL_SUM, 1.0, factor)

    def c(self) -> _lib.ReduceOpC:
        ptr = self.factor_buffer.ptr if self.factor_buffer else None
        return _lib.ReduceOpC(int(self.kind), self.factor, ptr)


def _reduce_op(op: Any) -> ReduceOp:
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, str):
        return ReduceOp(RedOp[op.upper()])
    return ReduceOp(RedOp(op))


class WorkStatus(enum.IntEnum):
    NOT_STARTED = 0
    IN_PROGRESS = 1
    COMPLETED = 2
    TIMED_OUT = 3
    ERROR = 4


class Work:
    """The completion handle of one operation. It keeps the operation's
    buffers alive until it is waited for or dropped."""

    def __init__(self, handle: C.c_void_p, keep: Any = None, stream: Optional[int] = None):
        self._h: Optional[C.c_void_p] = handle
        self._keep = keep
        self._stream = stream

    def _handle(self) -> C.c_void_p:
        if not self._h:
            raise ValueError("the work handle is freed")
        return self._h

    def is_completed(self) -> bool:
        done = C.c_int()
        check(lib.tc_work_is_completed(self._handle(), C.byref(done)), "tc_work_is_completed")
        return bool(done.value)

    def status(self) -> WorkStatus:
        s = C.c_int32()
        check(lib.tc_work_status(self._handle(), C.byref(s)), "tc_work_status")
        return WorkStatus(s.value)

    def source(self) -> int:
        """The rank whose message this receive took (for a receive from
        `ANY_SOURCE`, the sender it matched); the receive must have completed
        successfully (wait first)."""
        r = C.c_int32()
        check(lib.tc_work_source(self._handle(), C.byref(r)), "tc_work_source")
        return r.value

    def wait(self, stream: Optional[int] = None) -> None:
        """Host work: returns when it finished. CUDA work: `stream` (default:
        the stream the operation was issued on) waits for it."""
        check(lib.tc_work_wait(self._handle(), stream if stream is not None else self._stream), "tc_work_wait")

    def wait_blocking(self) -> None:
        check(lib.tc_work_wait_blocking(self._handle()), "tc_work_wait_blocking")

    def free(self) -> None:
        """Releases the handle; the operation still runs to completion."""
        if self._h:
            lib.tc_work_free(self._h)
            self._h = None

    def __del__(self) -> None:
        self.free()


def _stream(bufs: Sequence[Buf], stream: Optional[int]) -> Optional[int]:
    if stream is not None:
        return stream
    for b in bufs:
        if b.cuda:
            return b.stream
    return None


def _same(b: Buf, like: Buf, count: int, what: str, call: str) -> None:
    if b.dtype != like.dtype:
        raise invalid(f"'{what}' is {b.dtype.name}, expected {like.dtype.name}", call)
    if b.count != count:
        raise invalid(f"'{what}' has {b.count} elements, expected {count}", call)


def _tag(tag: int, call: str) -> int:
    if not 0 <= tag < 2**32:
        raise invalid(f"'tag' {tag} is not a 32-bit unsigned integer", call)
    return tag


def _counts(counts: Sequence[int]) -> "C.Array[C.c_size_t]":
    return (C.c_size_t * len(counts))(*[int(c) for c in counts])


class Comm:
    """A communicator (``tc_comm_t``). Collective: every rank creates it.

    ``backend``: "gloo" (host memory) or "nccl" (CUDA memory); ``device``:
    "cpu", "cuda" or "cuda:N". Rank, world size and store come from the
    arguments or, when None, the launcher's environment. Operations take
    ``async_op`` (return at once; use the Work), ``timeout`` (seconds),
    ``stream`` (CUDA; default: the tensors' current stream) and ``hints``.
    """

    def __init__(self, backend: str = "gloo", device: str = "cpu", *, name: Optional[str] = None,
                 timeout: Timeout = None, abort_on_error: Optional[bool] = None, rank: Optional[int] = None,
                 world_size: Optional[int] = None, store: Optional[Store] = None,
                 hints: Optional[Dict[str, str]] = None, enable_reconfigure: bool = False,
                 _handle: Optional[C.c_void_p] = None):
        self._hook: Any = None
        self._op_hooks: Dict[int, Any] = {}  # id -> C callback the library may call
        self._dependents: List[Any] = []
        if _handle is not None:
            self._h: Optional[C.c_void_p] = _handle
            return
        self._h = None
        h = C.c_void_p()
        opts, keep = _comm_options(name, timeout, abort_on_error, rank, world_size, store, hints)
        opts.enable_reconfigure = int(bool(enable_reconfigure))
        check(lib.tc_comm_new(backend.encode(), _device(device), C.byref(opts), C.byref(h)), "tc_comm_new")
        del keep
        self._h = h

    def init_handle(self) -> str:
        """This comm's init handle (tc_comm_get_init_handle): the string its
        members pass to ``reconfigure``; the same for the comm's lifetime."""
        s = C.c_char_p()
        check(lib.tc_comm_get_init_handle(self.handle, C.byref(s)), "tc_comm_get_init_handle")
        return (s.value or b"").decode()

    def reconfigure(self, uuid: int, init_handles: Any, timeout: Timeout = None,
                    hints: Optional[Dict[str, str]] = None) -> None:
        """Re-forms this comm in place from the members' init handles
        (tc_comm_reconfigure; collective over the new members, blocking):
        a list or tuple ranks them in its order, a set or frozenset in the
        handles' byte order."""
        if isinstance(init_handles, (set, frozenset)):
            form, items = _lib.TC_INIT_HANDLES_SET, list(init_handles)
        elif isinstance(init_handles, (list, tuple)):
            form, items = _lib.TC_INIT_HANDLES_LIST, list(init_handles)
        else:
            raise invalid(f"argument 'init_handles': {type(init_handles).__name__} is neither a list nor a set",
                          "tc_comm_reconfigure")
        if not all(isinstance(h, str) for h in items):
            raise invalid("argument 'init_handles': every handle must be a str", "tc_comm_reconfigure")
        if isinstance(uuid, bool) or not isinstance(uuid, int):
            raise invalid(f"argument 'uuid': {type(uuid).__name__} is not an int", "tc_comm_reconfigure")
        arr = (C.c_char_p * len(items))(*[h.encode() for h in items])
        opts = _lib.op_options(False, None if timeout is None else _ms(timeout) / 1000, None, hints)
        check(lib.tc_comm_reconfigure(self.handle, uuid, arr, len(items), form, C.byref(opts), None),
              "tc_comm_reconfigure")

    @property
    def handle(self) -> C.c_void_p:
        if not self._h:
            raise ValueError("the comm is destroyed")
        return self._h

    # -- queries
    @property
    def rank(self) -> int:
        return self._get_int(lib.tc_comm_get_rank, "tc_comm_get_rank")

    @property
    def size(self) -> int:
        return self._get_int(lib.tc_comm_get_size, "tc_comm_get_size")

    @property
    def name(self) -> str:
        return self._get_str(lib.tc_comm_get_name, "tc_comm_get_name")

    @property
    def backend(self) -> str:
        return self._get_str(lib.tc_comm_get_backend, "tc_comm_get_backend")

    @property
    def device(self) -> str:
        d = _lib.Device()
        check(lib.tc_comm_get_device(self.handle, C.byref(d)), "tc_comm_get_device")
        return "cpu" if d.type == _lib.TC_DEVICE_CPU else f"cuda:{d.index}"

    def ranks(self) -> List[int]:
        """This comm's ranks in the root comm's numbering (tc_comm_get_ranks)."""
        n = C.c_size_t(0)
        check(lib.tc_comm_get_ranks(self.handle, None, C.byref(n)), "tc_comm_get_ranks")
        arr = (C.c_int * n.value)()
        check(lib.tc_comm_get_ranks(self.handle, arr, C.byref(n)), "tc_comm_get_ranks")
        return list(arr)

    @property
    def backend_version(self) -> str:
        return self._get_str(lib.tc_comm_get_backend_version, "tc_comm_get_backend_version")

    def set_timeout(self, timeout: Union[float, timedelta]) -> None:
        """Default timeout (seconds or timedelta, > 0) of operations issued
        later on this rank."""
        secs = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
        check(lib.tc_comm_set_timeout(self.handle, int(secs * 1000)), "tc_comm_set_timeout")

    def set_hints(self, hints: Dict[str, str]) -> None:
        """Changes hints a live comm can change, all or nothing."""
        arr = _lib.hint_array(hints)
        check(lib.tc_comm_set_hints(self.handle, arr, len(arr) if arr is not None else 0), "tc_comm_set_hints")

    def add_pre_hook(self, hook: Callable[[OpInfo], None]) -> int:
        """`hook(info)` runs before each later operation (see OpInfo); the
        id is for remove_hook. The comm keeps `hook` until then."""
        return self._add_op_hook(lib.tc_comm_add_pre_hook, hook, "tc_comm_add_pre_hook")

    def add_post_hook(self, hook: Callable[[OpInfo], None]) -> int:
        """`hook(info)` runs when each later operation ends; for async host
        operations on the comm's progress thread (it takes the GIL there)."""
        return self._add_op_hook(lib.tc_comm_add_post_hook, hook, "tc_comm_add_post_hook")

    def remove_hook(self, hook_id: int) -> None:
        """When this returns the hook is not running and never called again."""
        check(lib.tc_comm_remove_hook(self.handle, int(hook_id)), "tc_comm_remove_hook")
        self._op_hooks.pop(int(hook_id), None)

    def _add_op_hook(self, add_fn: Any, hook: Callable[[OpInfo], None], call: str) -> int:
        hook_id, fn = ophooks.add(self.handle, add_fn, hook, call)
        self._op_hooks[hook_id] = fn
        return hook_id

    def async_error(self) -> Optional[_lib.TorchCommError]:
        """The failure that aborted the comm, or None while it is healthy."""
        rc = lib.tc_comm_get_async_error(self.handle)
        return None if rc == 0 else _lib.TorchCommError(rc, lib.tc_last_error().decode(), "tc_comm_get_async_error")

    def dump_flight_recorder(self) -> str:
        p = C.c_void_p()
        check(lib.tc_comm_dump_flight_recorder(self.handle, C.byref(p)), "tc_comm_dump_flight_recorder")
        try:
            return C.string_at(p).decode(errors="replace")
        finally:
            lib.tc_free(p)

    def set_abort_hook(self, hook: Optional[Callable[[int, str], None]]) -> None:
        """`hook(code, message)` runs once when the comm becomes aborted (on a
        library thread); None removes it. Exceptions it raises are printed."""
        if hook is None:
            fn = C.cast(None, _lib.ABORT_HOOK)
        else:
            def call(code: int, message: bytes, _user: Any) -> None:
                try:
                    hook(code, message.decode(errors="replace"))
                except Exception as e:  # never into the library
                    print(f"torchcomm abort hook raised {e!r}")
            fn = _lib.ABORT_HOOK(call)
        check(lib.tc_comm_set_abort_hook(self.handle, fn, None), "tc_comm_set_abort_hook")
        self._hook = fn if hook is not None else None

    def split(self, ranks: Sequence[int], name: str, **options: Any) -> Optional["Comm"]:
        """Sub-communicator of `ranks` (parent ranks, the same list on every
        rank); an empty list opts out and returns None."""
        arr = (C.c_int * len(ranks))(*ranks) if ranks else None
        opts, keep = _comm_options(None, **options) if options else (None, None)
        out = C.c_void_p()
        check(lib.tc_comm_split(self.handle, arr, len(ranks), name.encode(), C.byref(opts) if opts else None,
                                C.byref(out)), "tc_comm_split")
        del keep
        return Comm(_handle=out) if out else None

    def shrink(self, exclude_ranks: Sequence[int], name: str, **options: Any) -> "Comm":
        """The comm of the ranks not in `exclude_ranks` (parent ranks, the
        same set on every remaining rank), in their old order; works on an
        aborted comm too. Only the remaining ranks call it (tc_comm_shrink)."""
        arr = (C.c_int * len(exclude_ranks))(*exclude_ranks) if exclude_ranks else None
        opts, keep = _comm_options(None, **options) if options else (None, None)
        out = C.c_void_p()
        check(lib.tc_comm_shrink(self.handle, arr, len(exclude_ranks), name.encode(),
                                 C.byref(opts) if opts else None, C.byref(out)), "tc_comm_shrink")
        del keep
        return Comm(_handle=out)

    def finalize(self) -> None:
        check(lib.tc_comm_finalize(self.handle), "tc_comm_finalize")

    def abort(self) -> None:
        check(lib.tc_comm_abort(self.handle), "tc_comm_abort")

    def destroy(self) -> None:
        """Frees live backend memory and registrations, then the comm (aborted
        first, with a warning, if not finalized)."""
        if self._h:
            for d in reversed(self._dependents):
                d._release()
            self._dependents.clear()
            lib.tc_comm_destroy(self._h)
            self._h = None
            self._op_hooks.clear()  # no longer called

    def __del__(self) -> None:
        self.destroy()

    def __enter__(self) -> "Comm":
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    # -- memory
    def mem_alloc(self, nbytes: int) -> "Memory":
        p = C.c_void_p()
        check(lib.tc_mem_alloc(self.handle, int(nbytes), C.byref(p)), "tc_mem_alloc")
        m = Memory(self, p.value, int(nbytes))
        self._dependents.append(m)
        return m

    def register(self, buf: Any) -> "Registration":
        b = as_buffer(buf, False, "buf")
        h = C.c_void_p()
        check(lib.tc_comm_register(self.handle, b.ptr, b.nbytes, C.byref(h)), "tc_comm_register")
        r = Registration(self, h.value, b.keep)
        self._dependents.append(r)
        return r

    # -- point to point
    def send(self, buf: Any, peer: int, **o: Any) -> Work:
        b = as_buffer(buf, False, "buf")
        return self._op("tc_send", [b], o, lambda c, w: lib.tc_send(self.handle, b.ptr, b.count, b.dtype, peer, c, w))

    def recv(self, buf: Any, peer: int, **o: Any) -> Work:
        """Receives from `peer`, or with `peer=ANY_SOURCE` from whichever other
        rank's send of the tag comes first: `Work.source()` tells which (host
        comms only)."""
        b = as_buffer(buf, True, "buf")
        return self._op("tc_recv", [b], o, lambda c, w: lib.tc_recv(self.handle, b.ptr, b.count, b.dtype, peer, c, w))

    def batch(self) -> "Batch":
        h = C.c_void_p()
        check(lib.tc_batch_begin(self.handle, C.byref(h)), "tc_batch_begin")
        return Batch(self, h)

    # -- collectives
    @refusing("tc_broadcast")
    def broadcast(self, buf: Any, root: int, **o: Any) -> Work:
        b = as_buffer(buf, True, "buf")
        return self._op("tc_broadcast", [b], o,
                        lambda c, w: lib.tc_broadcast(self.handle, b.ptr, b.count, b.dtype, root, c, w))

    @refusing("tc_reduce")
    def reduce(self, buf: Any, root: int, op: Any = RedOp.SUM, **o: Any) -> Work:
        b, r = as_buffer(buf, True, "buf"), _reduce_op(op)
        return self._op("tc_reduce", [b, r], o,
                        lambda c, w: lib.tc_reduce(self.handle, b.ptr, b.count, b.dtype, root, r.c(), c, w))

    @refusing("tc_all_reduce")
    def all_reduce(self, buf: Any, op: Any = RedOp.SUM, **o: Any) -> Work:
        b, r = as_buffer(buf, True, "buf"), _reduce_op(op)
        return self._op("tc_all_reduce", [b, r], o,
                        lambda c, w: lib.tc_all_reduce(self.handle, b.ptr, b.count, b.dtype, r.c(), c, w))

    @refusing("tc_all_gather")
    def all_gather(self, outputs: Sequence[Any], input: Any, **o: Any) -> Work:
        i = as_buffer(input, False, "input")
        outs = self._list(outputs, True, "outputs", i, i.count, "tc_all_gather")
        return self._op("tc_all_gather", [i, outs], o, lambda c, w: lib.tc_all_gather(
            self.handle, outs[0], i.ptr, i.count, i.dtype, c, w))

    @refusing("tc_all_gather_single")
    def all_gather_single(self, output: Any, input: Any, **o: Any) -> Work:
        out, i = as_buffer(output, True, "output"), as_buffer(input, False, "input")
        _same(out, i, i.count * self.size, "output", "tc_all_gather_single")
        return self._op("tc_all_gather_single", [out, i], o, lambda c, w: lib.tc_all_gather_single(
            self.handle, out.ptr, i.ptr, i.count, i.dtype, c, w))

    @refusing("tc_all_gather_v")
    def all_gather_v(self, output: Any, counts: Sequence[int], input: Any, **o: Any) -> Work:
        out, i = as_buffer(output, True, "output"), as_buffer(input, False, "input")
        _same(out, i, sum(counts), "output", "tc_all_gather_v")
        cs = _counts(counts)
        return self._op("tc_all_gather_v", [out, i, cs], o, lambda c, w: lib.tc_all_gather_v(
            self.handle, out.ptr, cs, i.ptr, i.dtype, c, w))

    @refusing("tc_reduce_scatter")
    def reduce_scatter(self, output: Any, inputs: Sequence[Any], op: Any = RedOp.SUM, **o: Any) -> Work:
        out, r = as_buffer(output, True, "output"), _reduce_op(op)
        ins = self._list(inputs, False, "inputs", out, out.count, "tc_reduce_scatter")
        return self._op("tc_reduce_scatter", [out, ins, r], o, lambda c, w: lib.tc_reduce_scatter(
            self.handle, out.ptr, ins[0], out.count, out.dtype, r.c(), c, w))

    @refusing("tc_reduce_scatter_single")
    def reduce_scatter_single(self, output: Any, input: Any, op: Any = RedOp.SUM, **o: Any) -> Work:
        out, i, r = as_buffer(output, True, "output"), as_buffer(input, False, "input"), _reduce_op(op)
        _same(i, out, out.count * self.size, "input", "tc_reduce_scatter_single")
        return self._op("tc_reduce_scatter_single", [out, i, r], o, lambda c, w: lib.tc_reduce_scatter_single(
            self.handle, out.ptr, i.ptr, out.count, out.dtype, r.c(), c, w))

    @refusing("tc_reduce_scatter_v")
    def reduce_scatter_v(self, output: Any, input: Any, counts: Sequence[int], op: Any = RedOp.SUM,
                         **o: Any) -> Work:
        out, i, r = as_buffer(output, True, "output"), as_buffer(input, False, "input"), _reduce_op(op)
        _same(i, out, sum(counts), "input", "tc_reduce_scatter_v")
        cs = _counts(counts)
        return self._op("tc_reduce_scatter_v", [out, i, r, cs], o, lambda c, w: lib.tc_reduce_scatter_v(
            self.handle, out.ptr, i.ptr, cs, out.dtype, r.c(), c, w))

    @refusing("tc_all_to_all")
    def all_to_all(self, outputs: Sequence[Any], inputs: Sequence[Any], **o: Any) -> Work:
        if not inputs:
            raise invalid("'inputs' is empty", "tc_all_to_all")
        first = as_buffer(inputs[0], False, "inputs")
        ins = self._list(inputs, False, "inputs", first, first.count, "tc_all_to_all")
        outs = self._list(outputs, True, "outputs", first, first.count, "tc_all_to_all")
        return self._op("tc_all_to_all", [ins, outs], o, lambda c, w: lib.tc_all_to_all(
            self.handle, outs[0], ins[0], first.count, first.dtype, c, w))

    @refusing("tc_all_to_all_single")
    def all_to_all_single(self, output: Any, input: Any, **o: Any) -> Work:
        out, i = as_buffer(output, True, "output"), as_buffer(input, False, "input")
        _same(out, i, i.count, "output", "tc_all_to_all_single")
        if i.count % self.size:
            raise invalid("'input' is not a multiple of the comm's size", "tc_all_to_all_single")
        return self._op("tc_all_to_all_single", [out, i], o, lambda c, w: lib.tc_all_to_all_single(
            self.handle, out.ptr, i.ptr, i.count // self.size, i.dtype, c, w))

    @refusing("tc_all_to_all_v_single")
    def all_to_all_v_single(self, output: Any, output_counts: Sequence[int], input: Any,
                            input_counts: Sequence[int], **o: Any) -> Work:
        out, i = as_buffer(output, True, "output"), as_buffer(input, False, "input")
        _same(out, i, sum(output_counts), "output", "tc_all_to_all_v_single")
        _same(i, i, sum(input_counts), "input", "tc_all_to_all_v_single")
        oc, ic = _counts(output_counts), _counts(input_counts)
        return self._op("tc_all_to_all_v_single", [out, i, oc, ic], o, lambda c, w: lib.tc_all_to_all_v_single(
            self.handle, out.ptr, oc, i.ptr, ic, i.dtype, c, w))

    @refusing("tc_barrier")
    def barrier(self, **o: Any) -> Work:
        return self._op("tc_barrier", [], o, lambda c, w: lib.tc_barrier(self.handle, c, w))

    @refusing("tc_scatter")
    def scatter(self, output: Any, inputs: Optional[Sequence[Any]], root: int, **o: Any) -> Work:
        """`inputs`: one buffer per rank on `root`; None elsewhere."""
        out = as_buffer(output, True, "output")
        ins = self._list(inputs or [], False, "inputs", out, out.count, "tc_scatter")
        return self._op("tc_scatter", [out, ins], o, lambda c, w: lib.tc_scatter(
            self.handle, out.ptr, ins[0], out.count, out.dtype, root, c, w))

    @refusing("tc_gather")
    def gather(self, outputs: Optional[Sequence[Any]], input: Any, root: int, **o: Any) -> Work:
        """`outputs`: one buffer per rank on `root`; None elsewhere."""
        i = as_buffer(input, False, "input")
        outs = self._list(outputs or [], True, "outputs", i, i.count, "tc_gather")
        return self._op("tc_gather", [i, outs], o, lambda c, w: lib.tc_gather(
            self.handle, outs[0], i.ptr, i.count, i.dtype, root, c, w))

    @refusing("tc_gather_single")
    def gather_single(self, output: Any, input: Any, root: int, **o: Any) -> Work:
        """`output`: size * input's count elements on `root` (rank r's block
        at r * count); None elsewhere."""
        i = as_buffer(input, False, "input")
        out = None
        if output is not None:
            out = as_buffer(output, True, "output")
            _same(out, i, i.count * self.size, "output", "tc_gather_single")
        elif self.rank == root:
            raise invalid("'output' is needed on the root", "tc_gather_single")
        return self._op("tc_gather_single", [i, out], o, lambda c, w: lib.tc_gather_single(
            self.handle, out.ptr if out else None, i.ptr, i.count, i.dtype, root, c, w))

    @refusing("tc_all_gather_p_init")
    def all_gather_p(self, output: Any, **o: Any) -> "AllGatherP":
        """A persistent all-gather into `output` (size blocks of the per-rank
        count). Collective. Use ``with`` or ``close()``."""
        return AllGatherP(self, output, o)

    @refusing("tc_broadcast_coalesced")
    def broadcast_coalesced(self, bufs: Sequence[Any], root: int, buffer_bytes: int = 250 * 1024 * 1024,
                            **o: Any) -> Work:
        """Broadcasts root's `bufs` (host memory, any dtypes) into every
        rank's, packed per dtype into messages of at most `buffer_bytes`."""
        bs = [as_buffer(x, True, f"bufs[{i}]") for i, x in enumerate(bufs)]
        ptrs = (C.c_void_p * len(bs))(*[b.ptr for b in bs])
        dtypes = (C.c_int32 * len(bs))(*[int(b.dtype) for b in bs])
        cs = _counts([b.count for b in bs])
        return self._op("tc_broadcast_coalesced", [*bs, ptrs, dtypes, cs], o, lambda c, w: lib.tc_broadcast_coalesced(
            self.handle, ptrs, cs, dtypes, len(bs), int(buffer_bytes), root, c, w))

    @refusing("tc_sparse_all_reduce")
    def sparse_all_reduce(self, indices: Any, values: Any = None, shape: Optional[Sequence[int]] = None,
                          op: Any = RedOp.SUM, **o: Any) -> Any:
        """Sums (SUM or AVG) a sparse COO tensor across the ranks: a torch
        sparse tensor (returns a coalesced torch sparse tensor), or
        `indices` [sparse_dim, nnz], `values` [nnz, *dense sizes] and
        `shape` as numpy arrays (returns such an (indices, values, shape)
        tuple). Blocking."""
        from .sparse import sparse_all_reduce

        return sparse_all_reduce(self, _reduce_op(op), indices, values, shape, o)

    # -- helpers
    def _op(self, call: str, keep: List[Any], o: Dict[str, Any], fn: Callable[[Any, Any], int]) -> Work:
        async_op = bool(o.pop("async_op", False))
        timeout, stream, hints = o.pop("timeout", None), o.pop("stream", None), o.pop("hints", None)
        tag = int(o.pop("tag", 0))
        if o:
            raise TypeError(f"{call}: unknown option(s) {', '.join(o)}")
        bufs = [b for b in keep if isinstance(b, Buf)]
        stream = _stream(bufs, stream)
        opts = _lib.op_options(async_op, None if timeout is None else _ms(timeout) / 1000, stream, hints)
        opts.tag = _tag(tag, call)
        w = C.c_void_p()
        check(fn(C.byref(opts), C.byref(w)), call)
        return Work(w, keep if async_op else None, stream)

    def _list(self, items: Sequence[Any], writable: bool, what: str, like: Buf, count: int, call: str) -> Any:
        """A list of buffers (one per rank, or none) as a C pointer array;
        element 0 is the array (None when empty), element 1 the buffers."""
        if not items:
            return [None, []]
        if len(items) != self.size:
            raise invalid(f"'{what}' needs one buffer per rank ({self.size}), not {len(items)}", call)
        bufs = [as_buffer(x, writable, what) for x in items]
        for b in bufs:
            _same(b, like, count, what, call)
        arr = (C.c_void_p * len(bufs))(*[b.ptr for b in bufs])
        return [C.cast(arr, C.POINTER(C.c_void_p)), bufs, arr]

    def _get_int(self, fn: Any, call: str) -> int:
        v = C.c_int()
        check(fn(self.handle, C.byref(v)), call)
        return v.value

    def _get_str(self, fn: Any, call: str) -> str:
        v = C.c_char_p()
        check(fn(self.handle, C.byref(v)), call)
        return (v.value or b"").decode()


def _device(device: str) -> _lib.Device:
    kind, _, idx = device.partition(":")
    if kind == "cpu":
        return _lib.Device(_lib.TC_DEVICE_CPU, 0)
    if kind == "cuda":
        return _lib.Device(_lib.TC_DEVICE_CUDA, int(idx) if idx else -1)
    raise invalid(f"device {device!r} is neither 'cpu' nor 'cuda[:N]'", "tc_comm_new")


def _comm_options(name: Optional[str] = None, timeout: Timeout = None, abort_on_error: Optional[bool] = None,
                  rank: Optional[int] = None, world_size: Optional[int] = None, store: Optional[Store] = None,
                  hints: Optional[Dict[str, str]] = None) -> Any:
    u = _lib.TC_UNSET
    o = _lib.CommOptions(C.sizeof(_lib.CommOptions), _lib.TC_COMM_OPTIONS_MAGIC, _lib.TC_COMM_OPTIONS_VERSION,
                         None if name is None else name.encode(), u if timeout is None else _ms(timeout),
                         u if abort_on_error is None else int(bool(abort_on_error)), u if rank is None else rank,
                         u if world_size is None else world_size, store.handle if store else None, None, 0)
    arr = _lib.hint_array(hints)
    if arr is not None:
        o.hints, o.num_hints = C.cast(arr, C.POINTER(_lib.Hint)), len(arr)
    return o, arr


class Batch:
    """Sends and receives issued together as one operation."""

    def __init__(self, comm: Comm, handle: C.c_void_p):
        self._comm, self._h, self._keep = comm, handle, []  # type: ignore[var-annotated]

    def send(self, buf: Any, peer: int, tag: int = 0) -> "Batch":
        """Entries of one (peer, tag) pair up in order."""
        b = as_buffer(buf, False, "buf")
        t = _tag(int(tag), "tc_batch_send_tagged")
        check(lib.tc_batch_send_tagged(self._h, b.ptr, b.count, b.dtype, peer, t), "tc_batch_send_tagged")
        self._keep.append(b)
        return self

    def recv(self, buf: Any, peer: int, tag: int = 0) -> "Batch":
        b = as_buffer(buf, True, "buf")
        t = _tag(int(tag), "tc_batch_recv_tagged")
        check(lib.tc_batch_recv_tagged(self._h, b.ptr, b.count, b.dtype, peer, t), "tc_batch_recv_tagged")
        self._keep.append(b)
        return self

    def issue(self, **o: Any) -> Work:
        keep, self._keep = self._keep, []
        return self._comm._op("tc_batch_issue", keep, o, lambda c, w: lib.tc_batch_issue(self._h, c, w))

    def free(self) -> None:
        if self._h:
            lib.tc_batch_free(self._h)
            self._h = None

    def __del__(self) -> None:
        self.free()


class Memory:
    """Backend memory from ``Comm.mem_alloc`` (``ptr``, ``nbytes``)."""

    def __init__(self, comm: Comm, ptr: int, nbytes: int):
        self._comm, self.ptr, self.nbytes = comm, ptr, nbytes

    def buffer(self, dtype: Any, count: Optional[int] = None) -> Buf:
        """The memory as a buffer argument of `dtype` (whole by default)."""
        b = raw(self.ptr, 0, dtype)
        return raw(self.ptr, self.nbytes // b.dtype.itemsize if count is None else count, dtype)

    def numpy(self, dtype: Any = "uint8") -> Any:
        """A numpy view (host memory only); valid until freed."""
        import numpy as np

        from ._buffers import to_numpy_dtype, dtype_of

        dt = to_numpy_dtype(dtype_of(dtype, "dtype"))
        arr = (C.c_char * self.nbytes).from_address(self.ptr)
        return np.frombuffer(arr, dtype=dt)

    def free(self) -> None:
        if self.ptr:
            ptr, self.ptr = self.ptr, 0
            self._comm._dependents.remove(self)
            check(lib.tc_mem_free(self._comm.handle, ptr), "tc_mem_free")

    def _release(self) -> None:
        if self.ptr:
            lib.tc_mem_free(self._comm._h, self.ptr)
            self.ptr = 0


class Registration:
    """A buffer registered with ``Comm.register``; ``deregister()`` ends it."""

    def __init__(self, comm: Comm, handle: Optional[int], keep: Any):
        self._comm, self.handle, self._keep, self._live = comm, handle, keep, True

    def deregister(self) -> None:
        if self._live:
            self._live = False
            self._comm._dependents.remove(self)
            check(lib.tc_comm_deregister(self._comm.handle, self.handle), "tc_comm_deregister")

    def _release(self) -> None:
        if self._live:
            self._live = False
            lib.tc_comm_deregister(self._comm._h, self.handle)


class AllGatherP:
    """A persistent all-gather (``tc_all_gather_p_t``) from
    ``Comm.all_gather_p``: ``output`` and the per-rank count are fixed,
    ``exec(input)`` runs it again and again. ``close()`` (or leaving a
    ``with`` block) frees it; executions already issued complete on their
    own. It keeps ``output`` referenced until closed."""

    def __init__(self, comm: Comm, output: Any, o: Dict[str, Any]):
        self._h: Optional[C.c_void_p] = None
        out = as_buffer(output, True, "output")
        if out.count % comm.size:
            raise invalid(f"'output' has {out.count} elements, not a multiple of {comm.size}", "tc_all_gather_p_init")
        self._comm, self._out, self.count = comm, out, out.count // comm.size
        h = C.c_void_p()
        comm._op("tc_all_gather_p_init", [out], o, lambda c, _w: lib.tc_all_gather_p_init(
            comm.handle, out.ptr, self.count, out.dtype, c, C.byref(h)))
        self._h = h
        comm._dependents.append(self)

    @refusing("tc_all_gather_p_exec", lambda self, *a, **k: self._comm)
    def exec(self, input: Any, **o: Any) -> Work:
        """`input`: `count` elements of the output's dtype (may be this
        rank's own block of the output)."""
        if not self._h:
            raise ValueError("the persistent all-gather is closed")
        i = as_buffer(input, False, "input")
        _same(i, self._out, self.count, "input", "tc_all_gather_p_exec")
        return self._comm._op("tc_all_gather_p_exec", [i, self._out], o,
                              lambda c, w: lib.tc_all_gather_p_exec(self._h, i.ptr, c, w))

    def close(self) -> None:
        if self._h:
            self._comm._dependents.remove(self)
            self._release()

    def _release(self) -> None:
        if self._h:
            lib.tc_all_gather_p_free(self._h)
            self._h, self._out = None, None  # type: ignore[assignment]

    def __del__(self) -> None:
        self._release()

    def __enter__(self) -> "AllGatherP":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
