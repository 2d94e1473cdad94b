"""The gradient reducer (``tc_reducer_*``): bucketed gradient exchange as
DDP does it, with built-in or Python communication hooks."""
from __future__ import annotations

import ctypes as C
import enum
import sys
from typing import Any, Callable, List, Optional, Sequence, Tuple

from . import _lib
from ._buffers import DType, as_buffer, dtype_of, to_numpy_dtype, to_torch_dtype
from ._lib import check, lib, refusing
from .comm import Comm, Work


class Hook(enum.IntEnum):
    """Built-in communication hooks (``TC_HOOK_*``)."""

    ALLREDUCE = 0
    FP16_COMPRESS = 1
    BF16_COMPRESS = 2
    NOOP = 3
    POWERSGD = 4


class _Owner:
    """The C reducer, freed when the last reference to this goes: the
    Reducer's (dropped by ``free()``) and those of the views of its memory.
    A view keeps only this, not the Reducer: after ``free()`` the reducer's
    calls raise while the memory under a view stays valid. `keep`: what an
    unfinished iteration's exchanges may still read or write, released
    after ``tc_reducer_free`` has waited for them."""

    def __init__(self, h: C.c_void_p):
        self.h: Optional[C.c_void_p] = h
        self.keep: List[Any] = []

    def __del__(self) -> None:
        if self.h:
            lib.tc_reducer_free(self.h)
            self.h = None


def _view(ptr: Optional[int], count: int, dtype: DType, shape: Any, as_torch: bool, owner: _Owner) -> Any:
    """numpy array or torch tensor over `count` elements at `ptr` (no copy),
    keeping `owner` alive: numpy's base and torch's storage hold `raw`, so
    every view derived from it (slices, reshapes, torch.from_numpy) does."""
    nbytes = count * dtype.itemsize
    if as_torch:
        import torch

        if not ptr or not nbytes:
            return torch.empty(shape, dtype=to_torch_dtype(dtype))
        raw = (C.c_char * nbytes).from_address(ptr)
        raw.owner = owner
        return torch.frombuffer(raw, dtype=to_torch_dtype(dtype), count=count).view(shape)
    import numpy as np

    if not ptr or not nbytes:
        return np.empty(shape, dtype=to_numpy_dtype(dtype))
    raw = (C.c_char * nbytes).from_address(ptr)
    raw.owner = owner
    return np.frombuffer(raw, dtype=to_numpy_dtype(dtype), count=count).reshape(shape)


class GradBucket:
    """The bucket a hook exchanges (valid during the hook's call only):
    ``index``, ``num_buckets``, ``is_last``, ``dtype``, ``count``, and per
    gradient ``grad_indices``, ``offsets``, ``lengths`` (elements)."""

    def __init__(self, comm: Comm, c: _lib.GradBucketC, reducer: "Reducer", owner: _Owner):
        self.comm = comm
        # `c` is the library's memory: `owner` keeps it (and the views) valid.
        self._c, self._reducer, self._owner = c, reducer, owner
        self.index, self.num_buckets, self.is_last = c.index, c.num_buckets, bool(c.is_last)
        self.count, self.dtype = c.count, DType(c.dtype)
        n = c.num_grads
        self.grad_indices = [c.grad_indices[k] for k in range(n)]
        self.offsets = [c.offsets[k] for k in range(n)]
        self.lengths = [c.lengths[k] for k in range(n)]

    @property
    def buffer(self) -> Any:
        """The flat buffer as a numpy view (not for bfloat16: use ``tensor``)."""
        return _view(self._c.buffer, self.count, DType(self._c.dtype), (self.count,), False, self._owner)

    @property
    def tensor(self) -> Any:
        """The flat buffer as a torch tensor view."""
        return _view(self._c.buffer, self.count, DType(self._c.dtype), (self.count,), True, self._owner)

    def set_buffer(self, buf: Any) -> None:
        """Exchange `buf` (the bucket's element count, a floating-point dtype)
        instead; the reducer casts its final contents back into the bucket.
        It is kept alive until the iteration ends."""
        b = as_buffer(buf, True, "buf")
        if b.count != self.count:
            raise _lib.invalid(f"'buf' has {b.count} elements, the bucket {self.count}", "set_buffer")
        floats = (DType.FLOAT32, DType.FLOAT64, DType.FLOAT16, DType.BFLOAT16)
        if b.dtype not in floats:
            raise _lib.invalid(f"'buf' is {DType(b.dtype).name.lower()}: the reducer casts only "
                               "float32, float64, float16 and bfloat16 back into a bucket", "set_buffer")
        self._c.buffer, self._c.dtype = b.ptr, int(b.dtype)
        self._reducer._iteration_keep.append(b)


HookFn = Callable[[GradBucket], Work]


def _layout(g: Any, what: str) -> Tuple[Tuple[int, ...], DType, bool]:
    """(shape, dtype, is_torch) of a gradient given as array/tensor or
    (shape, dtype); `what` names it in errors."""
    torch = sys.modules.get("torch")
    if isinstance(g, tuple) and len(g) == 2:
        shape = (g[0],) if isinstance(g[0], int) else tuple(g[0])
        is_torch = torch is not None and isinstance(g[1], torch.dtype)
        if is_torch or isinstance(g[1], (str, DType)):
            return shape, dtype_of(g[1], what), is_torch
        import numpy as np

        return shape, dtype_of(np.dtype(g[1]), what), False
    is_torch = torch is not None and isinstance(g, torch.Tensor)
    return tuple(g.shape), dtype_of(g, what), is_torch


class Reducer:
    """A gradient reducer over `comm` for `grads` (numpy arrays or torch
    tensors, float32/float64/float16/bfloat16, host memory). Collective.

    With ``gradient_as_bucket_view=True`` the gradients live in the
    reducer's buckets: `grads` then only describe them (arrays/tensors, or
    ``(shape, dtype)`` pairs) and ``grad(i)`` gives each one as a view of the
    same kind. Each iteration: ``mark_ready(i)`` for every gradient (hooks
    run as buckets complete), then ``finalize()`` (or ``finalize_async()``).
    The default hook averages (``Hook.ALLREDUCE``). Use as a context
    manager, or call ``free()``: the reducer's calls raise from then on,
    while its memory lives on until the last view of it is gone.
    """

    @refusing("tc_reducer_new", lambda self, comm, *a, **k: comm)
    def __init__(self, comm: Comm, grads: Sequence[Any], *, bucket_cap_bytes: int = 0,
                 first_bucket_bytes: int = 0, gradient_as_bucket_view: bool = False):
        self._owner: Optional[_Owner] = None
        self._comm, self._hook, self._hook_error = comm, None, None  # type: ignore[var-annotated]
        self._iteration_keep: List[Any] = []
        self._view = bool(gradient_as_bucket_view)
        self._layouts = [_layout(g, f"grads[{i}]") for i, g in enumerate(grads)]
        n = len(grads)
        if self._view:
            self._grads: List[Any] = []
            ptrs = None
            counts = [_count(shape) for shape, _, _ in self._layouts]
        else:
            self._grads = list(grads)
            bufs = [as_buffer(g, True, f"grads[{i}]") for i, g in enumerate(grads)]
            ptrs = (C.c_void_p * n)(*[b.ptr for b in bufs])
            counts = [b.count for b in bufs]
            self._bufs = bufs
        dtypes = (C.c_int32 * n)(*[int(dt) for _, dt, _ in self._layouts])
        opts = _lib.ReducerOptions(C.sizeof(_lib.ReducerOptions), _lib.TC_REDUCER_OPTIONS_MAGIC,
                                   _lib.TC_REDUCER_OPTIONS_VERSION, int(bucket_cap_bytes),
                                   int(first_bucket_bytes), int(self._view))
        h = C.c_void_p()
        check(lib.tc_reducer_new(comm.handle, ptrs, (C.c_size_t * n)(*counts), dtypes, n, C.byref(opts),
                                 C.byref(h)), "tc_reducer_new")
        self._owner = _Owner(h)

    @property
    def handle(self) -> C.c_void_p:
        if not self._owner:
            raise ValueError("the reducer is freed")
        return self._owner.h  # type: ignore[return-value]

    @property
    def num_buckets(self) -> int:
        n = C.c_size_t()
        check(lib.tc_reducer_num_buckets(self.handle, C.byref(n)), "tc_reducer_num_buckets")
        return n.value

    def grad(self, i: int) -> Any:
        """Gradient `i`: the caller's object, or (bucket view) a view of its
        place in a bucket, shaped and typed as given."""
        if not self._view:
            if not 0 <= i < len(self._grads):
                raise _lib.invalid(f"'grad_index' {i} is out of range", "tc_reducer_get_grad")
            return self._grads[i]
        p = C.c_void_p()
        check(lib.tc_reducer_get_grad(self.handle, i, C.byref(p)), "tc_reducer_get_grad")
        shape, dtype, is_torch = self._layouts[i]
        return _view(p.value, _count(shape), dtype, shape, is_torch, self._owner)  # type: ignore[arg-type]

    def mark_ready(self, i: int) -> None:
        self._run(lambda: lib.tc_reducer_mark_ready(self.handle, i), "tc_reducer_mark_ready")

    def finalize(self) -> None:
        self._run(lambda: lib.tc_reducer_finalize(self.handle), "tc_reducer_finalize")
        self._iteration_keep = []

    def finalize_async(self) -> Work:
        """As finalize, returning at once; read no gradient before the work
        completes."""
        w = C.c_void_p()
        self._run(lambda: lib.tc_reducer_finalize_async(self.handle, C.byref(w)), "tc_reducer_finalize_async")
        keep, self._iteration_keep = self._iteration_keep, []
        return Work(w, [self, keep])

    def set_hook(self, hook: HookFn) -> None:
        """`hook(bucket)` issues the bucket's exchange on ``bucket.comm`` and
        returns its Work (an async operation); every rank must issue the
        same operations. It must not call this reducer. An exception it
        raises becomes its error result: the call that ran it raises
        TorchCommError, chained to that exception. Only between iterations."""

        def call(_state: Any, _comm: Any, bucket: Any, work: Any) -> int:
            try:
                w = hook(GradBucket(self._comm, bucket.contents, self, self._owner))  # type: ignore[arg-type]
                if not isinstance(w, Work) or not w._h:
                    raise TypeError(f"the hook returned {w!r}, not a live torchcomm.Work")
                self._iteration_keep.append(w._keep)
                work[0], w._h = w._h, None  # the reducer frees it
                return 0
            except _lib.TorchCommError as e:
                self._hook_error = e
                return e.code
            except BaseException as e:  # never into the library
                self._hook_error = e
                return 1003  # TC_ERR_INVALID_USAGE

        fn = _lib.COMM_HOOK(call)
        check(lib.tc_reducer_set_hook(self.handle, fn, None), "tc_reducer_set_hook")
        self._hook = fn  # alive while the library may call it

    def set_builtin_hook(self, kind: Any) -> None:
        kind = Hook[kind.upper()] if isinstance(kind, str) else Hook(kind)
        check(lib.tc_reducer_set_builtin_hook(self.handle, int(kind)), "tc_reducer_set_builtin_hook")
        self._hook = None

    def set_powersgd(self, *, matrix_approximation_rank: int = 1, start_powerSGD_iter: int = 1000,
                     min_compression_rate: float = 2.0, use_error_feedback: bool = True,
                     warm_start: bool = True, orthogonalization_epsilon: float = 0.0,
                     random_seed: int = 0) -> None:
        """PowerSGD (``tc_reducer_set_powersgd``) with torch's parameter names;
        each gradient is viewed as a shape[0] x rest matrix (1-D: a column),
        from the shapes the reducer was given."""
        rows = [shape[0] if shape else 1 for shape, _, _ in self._layouts]
        arr = (C.c_size_t * len(rows))(*rows)
        o = _lib.PowerSGDOptions(C.sizeof(_lib.PowerSGDOptions), _lib.TC_POWERSGD_OPTIONS_MAGIC,
                                 _lib.TC_POWERSGD_OPTIONS_VERSION, int(matrix_approximation_rank),
                                 int(start_powerSGD_iter), float(min_compression_rate),
                                 float(orthogonalization_epsilon), int(bool(use_error_feedback)),
                                 int(bool(warm_start)), int(random_seed), arr, len(rows))
        check(lib.tc_reducer_set_powersgd(self.handle, C.byref(o)), "tc_reducer_set_powersgd")

    def free(self) -> None:
        """Ends the reducer: its calls raise from now on. The library frees
        it now, or, while views of its memory remain (``grad(i)``, a hook's
        ``bucket.buffer``), when the last of them goes."""
        if self._owner:
            owner, self._owner = self._owner, None
            owner.keep, self._iteration_keep = self._iteration_keep, []
            self._hook = None

    def __del__(self) -> None:
        self.free()

    def __enter__(self) -> "Reducer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    def _run(self, fn: Callable[[], int], call: str) -> None:
        self._hook_error = None
        rc = fn()
        raised, self._hook_error = self._hook_error, None
        if rc == 0:
            return
        detail = lib.tc_last_error().decode(errors="replace")
        if raised is not None:
            detail += f" (the hook raised {raised!r})"
        raise _lib.TorchCommError(rc, detail, call) from raised


def _count(shape: Tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n
