"""torch.distributed on libtorchcomm: ``import torchcomm.distributed`` registers
the backend ``"torchcomm"``.

    import torch.distributed as dist
    import torchcomm.distributed  # noqa: F401
    dist.init_process_group("torchcomm")          # or "cpu:torchcomm,cuda:nccl"

Two implementations of one backend:

- C++ (csrc/backend.cpp, a torch extension compiled against the installed
  torch: by scripts/build-torch-ext.sh in the source tree, on first use into
  a per-user cache in an installed package; see _torch_ext): a
  ``c10d::Backend`` whose host operations call the C API directly and whose works follow the library's
  work handles (``is_completed()`` included). It wraps the Python backend
  below, which keeps the comms and the store bridge and runs what the C++
  side does not (CUDA and sparse tensors, dtypes and shapes it does not
  take, monitored_barrier, split, abort, shutdown).
- Python: ``TorchCommBackend``, a Python subclass of torch's C++ ``Backend``
  (c10d's ``PyBackend`` trampoline routes every method DDP, FSDP2, DTensor
  and torch's distributed tests call); torch wraps its works in a holder that
  forwards only ``wait()`` and ``get_future()``, so ``is_completed()`` on
  them stays False (docs/status.md).

The C++ one is used when its extension loads, else the Python one with a
log line saying why; ``TORCHCOMM_TORCH_BACKEND=python`` or ``cpp`` forces
one (``cpp`` fails when the extension does not load). Every operation runs
on a torchcomm ``Comm``: host tensors on the gloo backend, CUDA tensors on
the nccl backend (that comm is made on the first CUDA operation,
collectively). Nothing is forwarded to another torch backend.
docs/python.md compares the two (measured); docs/status.md lists what is
missing.
"""
from __future__ import annotations

import ctypes
import logging
import os
import threading
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d

from . import _lib, _torch_ext
from ._buffers import DType, to_torch_dtype
from ._lib import TorchCommError, check, lib
from .comm import ANY_SOURCE, Comm, RedOp, ReduceOp, Work
from .store import PrefixStore, Store
from .torch_store import from_torch

BACKEND_NAME = "torchcomm"

_REDOPS = {
    dist.ReduceOp.SUM: RedOp.SUM, dist.ReduceOp.PRODUCT: RedOp.PRODUCT, dist.ReduceOp.MIN: RedOp.MIN,
    dist.ReduceOp.MAX: RedOp.MAX, dist.ReduceOp.BAND: RedOp.BAND, dist.ReduceOp.BOR: RedOp.BOR,
    dist.ReduceOp.BXOR: RedOp.BXOR, dist.ReduceOp.AVG: RedOp.AVG,
}


def _reduce_op(op: Any) -> Any:
    """torch's ReduceOp (a PREMUL_SUM carries its factor) as ours."""
    kind = op.op if hasattr(op, "op") else op
    if kind == dist.ReduceOp.PREMUL_SUM:
        factor = op.factor
        if isinstance(factor, torch.Tensor):
            factor = factor.item() if factor.device.type == "cpu" else factor
        return ReduceOp.premul_sum(factor)
    try:
        return _REDOPS[kind]
    except KeyError:
        raise ValueError(f"torchcomm backend: reduce op {op} is not supported") from None


# The blocking all-reduce of one contiguous host tensor is what per-call cost
# is measured on (docs/python.md): it goes straight to tc_all_reduce.
_BLOCKING = _lib.op_options(False, None, None, None)
_FAST_OPS = {k: _lib.ReduceOpC(int(v), 1.0, None) for k, v in _REDOPS.items()}
_DTYPES = {}
for _dt in DType:
    try:
        _DTYPES[to_torch_dtype(_dt)] = int(_dt)
    except AttributeError:
        pass


def _timeout_s(opts: Any) -> Optional[float]:
    """An operation's own timeout in seconds, or None for the comm's."""
    t = getattr(opts, "timeout", None)
    if t is None:
        return None
    secs = t.total_seconds() if isinstance(t, timedelta) else float(t) / 1000
    return secs if secs > 0 else None


def _barrier_timeout_s(opts: Any, default: timedelta) -> float:
    """monitored_barrier's timeout in seconds: its own, even 0 (no time
    at all, as gloo reads it), else (unset: None or negative) the group's."""
    t = getattr(opts, "timeout", None)
    secs = None if t is None else t.total_seconds() if isinstance(t, timedelta) else float(t) / 1000
    return default.total_seconds() if secs is None or secs < 0 else secs


class _TcWork(_c10d.Work):
    """A torch Work over torchcomm work handles: ``wait()`` waits for all of
    them; ``get_future()`` completes (with `result`) when they have."""

    def __init__(self, backend: "TorchCommBackend", works: Sequence[Work], result: Any,
                 any_source: bool = False):
        super().__init__()
        self._backend, self._works, self._result = backend, list(works), result
        self._future: Optional[torch.futures.Future] = None
        self._error: Optional[BaseException] = None
        self._lock = threading.Lock()
        # A receive from any source learns its sender from its handle,
        # which _finish frees: read it there.
        self._any_source = any_source
        self._source: Optional[int] = None

    def _finish(self) -> None:
        """Waits for every handle once; remembers the first failure."""
        with self._lock:
            works, self._works = self._works, []
            for w in works:
                try:
                    w.wait()
                    if self._any_source:
                        self._source = w.source()
                except TorchCommError as e:
                    self._error = self._error or e
                w.free()

    def _source_rank(self) -> int:
        """The sender of a receive from any source (torch's ``dist.recv``
        without ``src`` and ``work._source_rank()``), once it completed."""
        if not self._any_source:
            raise RuntimeError("torchcomm backend: _source_rank: not a receive from any source")
        self.wait()
        assert self._source is not None
        return self._source

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        self._finish()
        if self._error is not None:
            raise RuntimeError(f"torchcomm backend: {self._error}") from self._error
        return True

    def is_completed(self) -> bool:
        with self._lock:
            return all(w.is_completed() for w in self._works)

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self) -> Any:
        return self._error

    def result(self) -> Any:
        self.wait()
        return self._result

    def get_future(self) -> torch.futures.Future:
        with self._lock:
            if self._future is not None:
                return self._future
            # The future handed out follows `_done` through a callback: a
            # callback that raises marks it failed in C++ (DDP's reducer
            # reads that); Future.set_exception would mark it succeeded
            # with the exception as its value.
            self._done = torch.futures.Future()
            self._future = self._done.then(self._outcome)
        completer = self._backend._completer
        if completer.on_thread():
            # A future's callback asks for another future (PowerSGD waits on
            # it inside its callback): the thread that would complete it is
            # this one, so it is completed here, in issue order still.
            self._complete_future()
        else:
            completer.watch(self)
        return self._future

    def _outcome(self, _done: Any) -> Any:
        if self._error is not None:
            raise RuntimeError(f"torchcomm backend: {self._error}")
        return self._result

    def _complete_future(self) -> None:
        self._finish()
        self._done.set_result(None)


class _Completer:
    """One thread per backend that completes the futures of works in issue
    order (operations of one comm complete in order), so that DDP's comm
    hooks and its reducer see their futures done without polling. The
    futures' callbacks run on it, one at a time: operations they issue are
    issued in the same order on every rank."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._queue: List[_TcWork] = []
        self._thread: Optional[threading.Thread] = None

    def on_thread(self) -> bool:
        return self._thread is not None and threading.current_thread() is self._thread

    def watch(self, work: _TcWork) -> None:
        with self._cv:
            self._queue.append(work)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="torchcomm-futures", daemon=True)
                self._thread.start()
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue:
                    self._cv.wait()
                work = self._queue.pop(0)
            work._complete_future()


def _completed(result: Any) -> Any:
    """A finished operation's torch Work (its future holds `result`)."""
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(result)
    return _c10d._create_work_from_future(fut)


def _our_store(store: Any, key: str) -> Store:
    """Our store for a group whose torch store is `store` (the store bridge:
    a native client over a TCPStore, torch's own methods otherwise), the
    group's keys under `key`."""
    return PrefixStore(f"torchcomm-{key}", from_torch(store))


def _comm_name(name: str) -> str:
    """A comm name torchcomm accepts (no '/', at most 256 bytes)."""
    return name.replace("/", "_")[:256]


class TorchCommBackend(_c10d.Backend):
    """torch.distributed's ``Backend`` over torchcomm communicators."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta, name: str = "default",
                 store_key: str = "group"):
        super().__init__(rank, size)
        self._rank, self._size, self._timeout, self._name = rank, size, timeout, name
        self._store = _our_store(store, store_key)
        self._comms: Dict[str, Comm] = {"cpu": self._new_comm("cpu")}
        self._cpu_handle = self._comms["cpu"].handle
        self._done = _completed([])  # the Work of every finished blocking operation
        self._completer = _Completer()
        self._coalescing: Optional[List[Any]] = None
        self._aborted = False

    # -- comms per device type
    def _new_comm(self, device: str) -> Comm:
        kind = "gloo" if device == "cpu" else "nccl"
        dev = "cpu" if device == "cpu" else f"cuda:{torch.cuda.current_device()}"
        store = PrefixStore(kind, self._store)
        return Comm(kind, dev, name=_comm_name(f"pg{self._name}-{kind}"), rank=self._rank, world_size=self._size, store=store,
                    timeout=self._timeout.total_seconds(), abort_on_error=False)

    def _comm(self, tensor: torch.Tensor) -> Comm:
        device = tensor.device.type
        comm = self._comms.get(device)
        if comm is None:
            if device != "cuda":
                raise ValueError(f"torchcomm backend: {device} tensors are not supported (cpu, cuda)")
            comm = self._comms[device] = self._new_comm(device)
        return comm

    def _run(self, comm: Comm, opts: Any, result: Any, issue: Callable[..., Work]) -> Any:
        """Issues one operation; a Work for torch."""
        t = _timeout_s(opts)
        if self._coalescing is not None:
            w = issue(async_op=True, timeout=t)
            self._coalescing.append(w)
            return _completed(result)
        if getattr(opts, "asyncOp", True) or comm.device != "cpu":
            return _TcWork(self, [issue(async_op=True, timeout=t)], result)
        issue(timeout=t).free()
        return _completed(result)

    def _many(self, opts: Any, result: Any, issues: Sequence[Callable[..., Work]]) -> Any:
        t = _timeout_s(opts)
        works = [f(async_op=True, timeout=t) for f in issues]
        if self._coalescing is not None:
            self._coalescing.extend(works)
            return _completed(result)
        return _TcWork(self, works, result)

    # -- identity
    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return BACKEND_NAME

    @property
    def options(self) -> Any:
        # Defined here: torch's inherited getter calls back into this
        # subclass for its options and recurses without end.
        return _c10d.Backend.Options(BACKEND_NAME, self._timeout)

    @property
    def supports_splitting(self) -> bool:
        return True

    @property
    def supports_coalescing(self) -> bool:
        return True

    # -- collectives
    def allreduce(self, tensors: List[torch.Tensor], opts: Any) -> Any:
        if len(tensors) == 1 and not opts.asyncOp and self._coalescing is None:
            t, rop = tensors[0], opts.reduceOp
            c_op, dt = _FAST_OPS.get(rop.op), _DTYPES.get(t.dtype)
            if (c_op is not None and dt is not None and t.device.type == "cpu" and t.is_contiguous()
                    and _timeout_s(opts) is None):
                check(lib.tc_all_reduce(self._cpu_handle, t.data_ptr(), t.numel(), dt, c_op, _BLOCKING, None),
                      "tc_all_reduce")
                return self._done
        op = _reduce_op(opts.reduceOp)
        comm = self._comm(tensors[0])
        if tensors[0].is_sparse:
            return self._sparse_all_reduce(comm, tensors, op)
        if len(tensors) == 1:
            t = tensors[0]
            return self._run(comm, opts, tensors, lambda **o: comm.all_reduce(t, op, **o))
        return self._many(opts, tensors, [lambda t=t, **o: comm.all_reduce(t, op, **o) for t in tensors])

    def _sparse_all_reduce(self, comm: Comm, tensors: List[torch.Tensor], op: Any) -> Any:
        """Sparse COO tensors (SUM, AVG): each is replaced in place by the
        coalesced sum, as torch's gloo does. Blocking."""
        if self._coalescing is not None:
            raise RuntimeError("torchcomm backend: sparse all_reduce cannot be coalesced")
        for t in tensors:
            t.copy_(comm.sparse_all_reduce(t, op=op))
        return _completed(tensors)

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any) -> Any:
        op = _reduce_op(opts.reduceOp)
        comm = self._comm(tensors[0])
        return self._many(opts, tensors, [lambda t=t, **o: comm.all_reduce(t, op, **o) for t in tensors])

    def broadcast(self, tensors: List[torch.Tensor], opts: Any) -> Any:
        t = tensors[opts.rootTensor]
        comm = self._comm(t)
        return self._run(comm, opts, tensors, lambda **o: comm.broadcast(t, opts.rootRank, **o))

    def reduce(self, tensors: List[torch.Tensor], opts: Any) -> Any:
        t, op = tensors[opts.rootTensor], _reduce_op(opts.reduceOp)
        comm = self._comm(t)
        return self._run(comm, opts, tensors, lambda **o: comm.reduce(t, opts.rootRank, op, **o))

    def allgather(self, outputs: List[List[torch.Tensor]], inputs: List[torch.Tensor], opts: Any) -> Any:
        comm = self._comm(inputs[0])
        return self._many(opts, outputs, [lambda out=out, inp=inp, **o: comm.all_gather(out, inp, **o)
                                          for out, inp in zip(outputs, inputs)])

    def allgather_coalesced(self, outputs: List[List[torch.Tensor]], inputs: List[torch.Tensor],
                            opts: Any) -> Any:
        """`outputs[r][k]` receives rank r's `inputs[k]`."""
        comm = self._comm(inputs[0])
        per_input = [[outputs[r][k] for r in range(self._size)] for k in range(len(inputs))]
        return self._many(opts, outputs, [lambda out=out, inp=inp, **o: comm.all_gather(out, inp, **o)
                                          for out, inp in zip(per_input, inputs)])

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> Any:
        comm = self._comm(input)
        return self._run(comm, opts, [output], lambda **o: comm.all_gather_single(output, input, **o))

    def all_gather_single_coalesced(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor],
                                    opts: Any) -> Any:
        comm = self._comm(inputs[0])
        return self._many(opts, outputs, [lambda out=out, inp=inp, **o: comm.all_gather_single(out, inp, **o)
                                          for out, inp in zip(outputs, inputs)])

    def reduce_scatter(self, outputs: List[torch.Tensor], inputs: List[List[torch.Tensor]], opts: Any) -> Any:
        op = _reduce_op(opts.reduceOp)
        comm = self._comm(outputs[0])
        return self._many(opts, outputs, [lambda out=out, inp=inp, **o: comm.reduce_scatter(out, inp, op, **o)
                                          for out, inp in zip(outputs, inputs)])

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> Any:
        op = _reduce_op(opts.reduceOp)
        comm = self._comm(input)
        return self._run(comm, opts, [output], lambda **o: comm.reduce_scatter_single(output, input, op, **o))

    def reduce_scatter_single_coalesced(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor],
                                        opts: Any) -> Any:
        op = _reduce_op(opts.reduceOp)
        comm = self._comm(inputs[0])
        return self._many(opts, outputs, [
            lambda out=out, inp=inp, **o: comm.reduce_scatter_single(out, inp, op, **o)
            for out, inp in zip(outputs, inputs)])

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_splits: List[int],
                          input_splits: List[int], opts: Any) -> Any:
        comm = self._comm(input)
        if not output_splits and not input_splits:
            return self._run(comm, opts, [output], lambda **o: comm.all_to_all_single(output, input, **o))
        n = self._size
        out_splits = output_splits or [output.shape[0] // n] * n
        in_splits = input_splits or [input.shape[0] // n] * n
        out_row = output[0].numel() if output.dim() and output.shape[0] else 0
        in_row = input[0].numel() if input.dim() and input.shape[0] else 0
        oc, ic = [s * out_row for s in out_splits], [s * in_row for s in in_splits]
        return self._run(comm, opts, [output], lambda **o: comm.all_to_all_v_single(output, oc, input, ic, **o))

    def alltoall(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any) -> Any:
        comm = self._comm(inputs[0])
        counts = {t.numel() for t in [*inputs, *outputs]}
        if len(counts) == 1:
            return self._run(comm, opts, outputs, lambda **o: comm.all_to_all(outputs, inputs, **o))
        # Sizes differ per peer: one batch of sends and receives.
        def issue(**o: Any) -> Work:
            batch = comm.batch()
            for peer in range(self._size):
                batch.send(inputs[peer], peer).recv(outputs[peer], peer)
            try:
                return batch.issue(**o)
            finally:
                batch.free()
        return self._run(comm, opts, outputs, issue)

    def gather(self, outputs: List[List[torch.Tensor]], inputs: List[torch.Tensor], opts: Any) -> Any:
        comm, root = self._comm(inputs[0]), opts.rootRank
        outs = outputs[0] if outputs and self._rank == root else None
        return self._run(comm, opts, outputs, lambda **o: comm.gather(outs, inputs[0], root, **o))

    def scatter(self, outputs: List[torch.Tensor], inputs: List[List[torch.Tensor]], opts: Any) -> Any:
        comm, root = self._comm(outputs[0]), opts.rootRank
        ins = inputs[0] if inputs and self._rank == root else None
        return self._run(comm, opts, outputs, lambda **o: comm.scatter(outputs[0], ins, root, **o))

    def barrier(self, opts: Any) -> Any:
        comm = self._comms["cpu"]
        return self._run(comm, opts, [], lambda **o: comm.barrier(**o))

    def monitored_barrier(self, opts: Any, wait_all_ranks: bool = False) -> None:
        """Rank 0 hears from every rank, then answers each; a rank that does
        not answer within the timeout is named in the error (all of them
        with `wait_all_ranks`). The errors are worded as gloo's, which
        programs and torch's tests match."""
        comm = self._comms["cpu"]
        t = _barrier_timeout_s(opts, self._timeout)
        ms = int(t * 1000)
        token = torch.zeros(1, dtype=torch.int32)
        if self._rank != 0:
            try:
                comm.send(token, 0, tag=0x7B000001, timeout=t)
                comm.recv(token, 0, tag=0x7B000002, timeout=t)
            except TorchCommError as e:
                raise RuntimeError(f"Rank {self._rank} successfully reached monitoredBarrier, but received "
                                   f"errors while waiting for send/recv from rank 0: {e}") from e
            return
        if t <= 0 and self._size > 1:
            comm.abort()  # as below: the ranks waiting for the answer fail now
            raise RuntimeError(f"Rank 0 timed out in monitoredBarrier after {ms} ms. "
                               "No ranks successfully processed in monitoredBarrier.")
        works = {r: comm.recv(torch.zeros(1, dtype=torch.int32), r, tag=0x7B000001, async_op=True, timeout=t)
                 for r in range(1, self._size)}
        missing = []
        for r, w in works.items():
            try:
                w.wait()
            except TorchCommError as e:
                missing.append((r, e))
                if not wait_all_ranks:
                    break
        if missing:
            comm.abort()  # the others' receives would wait for rank 0 forever
            if wait_all_ranks:
                ranks = ", ".join(str(r) for r, _ in missing)
                raise RuntimeError(f"Ranks {ranks} failed to pass monitoredBarrier in {ms} ms")
            r, e = missing[0]
            raise RuntimeError(f"Rank {r} failed to pass monitoredBarrier in {ms} ms: {e}")
        for r in range(1, self._size):
            comm.send(token, r, tag=0x7B000002, timeout=t)

    # -- point to point
    def send(self, tensors: List[torch.Tensor], dst: int, tag: int) -> Any:
        t = tensors[0]
        comm = self._comm(t)
        if self._coalescing is not None:
            self._coalescing.append(("send", t, dst, tag))
            return _completed(tensors)
        return _TcWork(self, [comm.send(t, dst, tag=tag, async_op=True)], tensors)

    def recv(self, tensors: List[torch.Tensor], src: int, tag: int) -> Any:
        t = tensors[0]
        comm = self._comm(t)
        if self._coalescing is not None:
            self._coalescing.append(("recv", t, src, tag))
            return _completed(tensors)
        return _TcWork(self, [comm.recv(t, src, tag=tag, async_op=True)], tensors)

    def recv_anysource(self, tensors: List[torch.Tensor], tag: int) -> Any:
        t = tensors[0]
        comm = self._comm(t)
        if self._coalescing is not None:
            raise RuntimeError("torchcomm backend: a receive from any source cannot be coalesced "
                               "(batch_isend_irecv, _coalescing_manager): issue it alone")
        return _TcWork(self, [comm.recv(t, ANY_SOURCE, tag=tag, async_op=True)], tensors, any_source=True)

    # -- coalescing (batch_isend_irecv, _coalescing_manager)
    def start_coalescing(self) -> None:
        if self._coalescing is not None:
            raise RuntimeError("torchcomm backend: coalescing already started")
        self._coalescing = []

    def end_coalescing(self) -> Any:
        items, self._coalescing = self._coalescing or [], None
        works = [w for w in items if isinstance(w, Work)]
        p2p = [x for x in items if isinstance(x, tuple)]
        if p2p:
            comm = self._comm(p2p[0][1])
            batch = comm.batch()
            try:
                for kind, t, peer, tag in p2p:
                    (batch.send if kind == "send" else batch.recv)(t, peer, tag)
                works.append(batch.issue(async_op=True))
            finally:
                batch.free()
        return _TcWork(self, works, [])

    # -- groups and lifetime
    def split(self, store: Any, ranks: List[int], opts: Any) -> Any:
        """The backend of this rank's part of a split_group: a new comm over
        the store torch passes (disjoint parts are made concurrently, which
        tc_comm_split's one-list-for-all does not offer)."""
        if self._rank not in ranks:
            return None
        timeout = getattr(opts, "_timeout", None) or self._timeout
        key = "split-" + ".".join(map(str, ranks))
        return TorchCommBackend(store, ranks.index(self._rank), len(ranks), timeout, f"{self._name}-{key}",
                                store_key=key)

    def set_timeout(self, timeout: timedelta) -> None:
        self._timeout = timeout
        for c in self._comms.values():
            c.set_timeout(timeout)

    def abort(self) -> None:
        self._aborted = True
        for c in self._comms.values():
            c.abort()

    def shutdown(self) -> None:
        """Finalizes and frees the comms. A comm aborted earlier (its
        failure was raised where it happened, e.g. by monitored_barrier) is
        only freed, as gloo's shutdown does; any other failure finalize
        reports is raised."""
        for c in list(self._comms.values()):
            try:
                if not self._aborted:
                    c.finalize()
            except TorchCommError as e:
                if e.name != "TC_ERR_ABORTED":
                    raise
                _log.info("torchcomm backend: shutdown of an aborted comm: %s", e)
            finally:
                c.destroy()
        self._comms.clear()


_log = logging.getLogger(__name__)
_ext: Any = None  # the loaded C++ extension, False when it cannot be had
_ext_why = ""


def implementation() -> str:
    """``"cpp"`` or ``"python"``: which backend ``init_process_group`` makes
    here (``TORCHCOMM_TORCH_BACKEND``, else C++ when its extension loads).
    Raises when ``cpp`` is asked for and the extension does not load."""
    choice = os.environ.get("TORCHCOMM_TORCH_BACKEND", "").strip().lower() or "auto"
    if choice not in ("auto", "cpp", "python"):
        raise ValueError(f"TORCHCOMM_TORCH_BACKEND={choice!r}: expected 'python' or 'cpp'")
    if choice == "python":
        return "python"
    if _extension() is None:
        if choice == "cpp":
            raise RuntimeError(f"torchcomm backend: TORCHCOMM_TORCH_BACKEND=cpp, but the C++ backend "
                               f"cannot be loaded: {_ext_why}")
        return "python"
    return "cpp"


def _extension() -> Any:
    """The C++ extension with the C API bound, or None (logged once)."""
    global _ext, _ext_why
    if _ext is None:
        path = None
        try:
            path = _torch_ext.locate()
            ext = _torch_ext.load(path)
            ext.bind_library({name: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
                              for name in ext.needed_symbols()})
            _ext = ext
        except Exception as e:  # noqa: BLE001 (any failure means the Python backend)
            _ext, _ext_why = False, f"{path or 'extension'}: {e}"
            if os.environ.get("TORCHCOMM_TORCH_BACKEND", "").strip().lower() != "cpp":
                _log.warning("torchcomm backend: using the Python implementation: the C++ one cannot be "
                             "loaded: %s", _ext_why)
    return _ext or None


def _wrap(backend: TorchCommBackend) -> Any:
    """The backend torch gets for the Python `backend`: the C++ one over it,
    or itself."""
    if implementation() == "python":
        return backend
    handle = ctypes.cast(backend._cpu_handle, ctypes.c_void_p).value
    return _extension().CppBackend(backend, handle, backend._rank, backend._size, backend._timeout, _wrap)


def _create(dist_opts: Any, backend_opts: Any) -> Any:
    return _wrap(TorchCommBackend(dist_opts.store, dist_opts.group_rank, dist_opts.group_size, dist_opts.timeout,
                                  str(dist_opts.group_id or "default")))


def register() -> None:
    """Registers the ``"torchcomm"`` backend (done on import; idempotent)."""
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu", "cuda"])


register()
