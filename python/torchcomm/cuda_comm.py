"""torch.cuda.comm over libtorchcomm's device groups (``tc_local_*``).

    import torchcomm.cuda_comm as comm
    copies = comm.broadcast(t, devices=[0, 1])

The six functions of torch.cuda.comm (torch.nn.parallel.comm), with its
argument names and defaults, argument checks, exception types and
messages, results (lists, tuples, the same tensors where torch returns the
input itself) and stream use; the copies and sums are the library's: NCCL
where every member of a call is a distinct CUDA device, copies otherwise
(see ``tc_local`` in torchcomm.h). One group per list of devices is made on
first use and kept for the life of the process. Differences from torch are
listed in docs/python.md (``torchcomm.cuda_comm``).
"""
from __future__ import annotations

import ctypes as C
import sys
import threading
import warnings
from contextlib import nullcontext
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch._utils import (
    _flatten_dense_tensors,
    _get_device_index,
    _handle_complex,
    _reorder_tensors_as,
    _take_tensors,
    _unflatten_dense_tensors,
)

from . import _lib
from ._buffers import DType, dtype_of
from ._lib import check, lib

__all__ = ["broadcast", "broadcast_coalesced", "reduce_add", "reduce_add_coalesced", "scatter", "gather"]

_CPU = -1  # a member's place: -1 for the CPU, else a CUDA device index
_groups: Dict[Tuple[int, ...], C.c_void_p] = {}
_groups_lock = threading.Lock()


# ------------------------------------------------------------------ helpers


def _group(places: Sequence[int]) -> C.c_void_p:
    """The group whose member i is places[i] (made once, then cached)."""
    key = tuple(places)
    with _groups_lock:
        g = _groups.get(key)
        if g is None:
            devs = [_lib.Device(_lib.TC_DEVICE_CPU, 0) if p == _CPU else _lib.Device(_lib.TC_DEVICE_CUDA, p) for p in key]
            g = C.c_void_p()
            check(lib.tc_local_new((_lib.Device * len(devs))(*devs), len(devs), None, C.byref(g)), "tc_local_new")
            _groups[key] = g
        return g


def _place(t: torch.Tensor) -> int:
    return _CPU if t.device.type == "cpu" else t.get_device()


# The dtypes torch.cuda.comm's NCCL path has an NCCL type for.
_NCCL_DTYPES = {getattr(torch, n) for n in ("float32", "float16", "float64", "int64", "int32", "int8", "uint8", "bool",
                                            "bfloat16", "float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)}
# c10's names of the others, as torch's message gives them.
_SCALAR_TYPE_NAMES = {getattr(torch, n): c for n, c in (("int16", "Short"), ("uint16", "UInt16"), ("uint32", "UInt32"),
                                                         ("uint64", "UInt64")) if hasattr(torch, n)}


def _refuse_as_torch_nccl(tensors: Sequence[torch.Tensor]) -> None:
    """torch.cuda.comm hands dense contiguous CUDA tensors on distinct
    devices (the source alone, too) to NCCL, which raises for a dtype it has
    no type for; other lists are copied. Raises as torch does there."""
    devices = [t.get_device() for t in tensors]
    if tensors[0].dtype in _NCCL_DTYPES or len(set(devices)) != len(devices):
        return
    if all(t.is_cuda and not t.is_sparse and t.is_contiguous() for t in tensors):
        dtype = tensors[0].dtype
        raise RuntimeError(f"Unconvertible NCCL type {_SCALAR_TYPE_NAMES.get(dtype, str(dtype).replace('torch.', ''))}")


def _ptrs(values: Sequence[Optional[int]]) -> Any:
    return (C.c_void_p * len(values))(*values)


def _stream_of(place: int, stream: Optional[torch.cuda.Stream] = None) -> Optional[int]:
    """The raw stream a member's work goes on: `stream`, else its device's current one."""
    if place == _CPU:
        return None
    return (stream if stream is not None else torch.cuda.current_stream(place)).cuda_stream


def _streams(places: Sequence[int]) -> Any:
    return _ptrs([_stream_of(p) for p in places])


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _on_legacy_stream(t: torch.Tensor) -> None:
    """`t` is read by the library on its device's legacy stream (a source
    outside the call's members): that stream waits for the current one, and
    the caching allocator keeps `t` until it is done."""
    if t.is_cuda:
        current, legacy = torch.cuda.current_stream(t.device), torch.cuda.default_stream(t.device)
        if current != legacy:
            legacy.wait_stream(current)
            t.record_stream(legacy)


def _target(out: torch.Tensor, dtype: torch.dtype, moved_shape: Optional[List[int]] = None) -> torch.Tensor:
    """What the library writes for `out`: `out` itself when it is contiguous
    with `dtype` (and no dimension is moved), else a contiguous staging
    tensor (of `moved_shape` when given) copied into `out` afterwards."""
    if moved_shape is None and out.is_contiguous() and out.dtype == dtype:
        return out
    return torch.empty(moved_shape if moved_shape is not None else out.shape, dtype=dtype, device=out.device)


def _wrap_dim(dim: int, t: torch.Tensor) -> int:
    n = max(t.dim(), 1)
    if not -n <= dim < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})")
    return dim % n


def _moved_shape(shape: Sequence[int], dim: int, size: int) -> List[int]:
    """`shape` with dimension `dim` (of `size`) first."""
    rest = [s for i, s in enumerate(shape) if i != dim]
    return [size] + rest


def _reducible(t: torch.Tensor) -> Tuple[int, int, int]:
    """(address, element count, TC dtype) of a contiguous tensor to sum
    (complex numbers as pairs of reals)."""
    r = torch.view_as_real(t) if t.is_complex() else t
    return r.data_ptr(), r.numel(), int(dtype_of(r.dtype))


def _bucket_bytes(buffer_size: Any) -> int:
    if not isinstance(buffer_size, int) or isinstance(buffer_size, bool) or buffer_size < 0:
        raise TypeError(f"argument 'buffer_size' must be a non-negative int, not {buffer_size!r}")
    return max(buffer_size, 1)  # 0: every tensor its own bucket, as in torch (0 means the default in C)


# ---------------------------------------------------------------- broadcast


def broadcast(tensor: torch.Tensor, devices: Optional[Sequence[Any]] = None, *,
              out: Optional[Sequence[torch.Tensor]] = None) -> List[torch.Tensor]:
    """Broadcasts a tensor (CPU or CUDA) to the GPUs `devices`, or into the
    CUDA tensors `out` (exactly one of the two). Returns the copies, with
    `tensor` itself for its own device (torch.cuda.comm.broadcast)."""
    tensor = _handle_complex(tensor)
    if not ((devices is None) ^ (out is None)):
        raise RuntimeError(
            f"Exactly one of 'devices' and 'out' must be specified, but got devices={devices} and out={out}"
        )
    if devices is not None:
        return _broadcast(tensor, [_get_device_index(d) for d in devices])
    return _broadcast_out(tensor, out)


def _broadcast_out_impl(tensor: torch.Tensor, outs: List[torch.Tensor]) -> List[torch.Tensor]:
    """Copies `tensor` into each of `outs` (CUDA tensors of its shape)."""
    src = tensor.contiguous()
    todo = [o for o in outs if not (o.data_ptr() == src.data_ptr() and o.device == src.device
                                    and o.dtype == src.dtype and o.is_contiguous())]
    if not todo or src.numel() == 0:
        return outs
    targets = [_target(o, src.dtype) for o in todo]
    places = [_place(src)] + [_place(t) for t in targets]
    dsts = _ptrs([src.data_ptr()] + [t.data_ptr() for t in targets])
    check(lib.tc_local_broadcast(_group(places), src.data_ptr(), 0, dsts, _nbytes(src), DType.UINT8,
                                 _streams(places)), "tc_local_broadcast")
    for o, t in zip(todo, targets):
        if t is not o:
            o.copy_(t, non_blocking=True)
    return outs


def _broadcast_out(tensor: torch.Tensor, out: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    out = list(out)
    for i, o in enumerate(out):
        if not o.is_cuda:
            raise RuntimeError(
                f"Expected all output tensors to be CUDA tensors, but output tensor at index {i} has device '{o.device}'"
            )
        if o.shape != tensor.shape:
            raise RuntimeError(
                f"Expected all output tensors to have same shape as the source tensor {list(tensor.shape)}, "
                f"but output tensor at index {i} has shape {list(o.shape)}"
            )
    _refuse_as_torch_nccl([tensor] + out)
    return _broadcast_out_impl(tensor, out)


def _broadcast(tensor: torch.Tensor, devices: List[int], sparse_part: bool = False) -> List[torch.Tensor]:
    """`sparse_part`: the indices or values of a sparse tensor, which torch
    copies whatever their dtype (NCCL never sees a sparse tensor)."""
    for d in devices:
        if d < 0:
            raise RuntimeError(f"Expected non-negative device index, but got {d}")
    own = tensor.get_device()
    if tensor.is_sparse:  # indices and values, each broadcast
        inds, vals = _broadcast(tensor._indices(), devices, sparse_part=True), _broadcast(tensor._values(), devices, sparse_part=True)
        return [tensor if d == own else torch.sparse_coo_tensor(i, v, tensor.shape, is_coalesced=tensor.is_coalesced())
                for d, i, v in zip(devices, inds, vals)]
    copies = [torch.empty(tensor.shape, dtype=tensor.dtype, device=torch.device("cuda", d)) for d in devices if d != own]
    if not sparse_part:
        _refuse_as_torch_nccl([tensor] + copies)
    _broadcast_out_impl(tensor, copies)
    it = iter(copies)
    return [next(it) if d != own else tensor for d in devices]


def broadcast_coalesced(tensors: Sequence[torch.Tensor], devices: Sequence[Any],
                        buffer_size: int = 10485760) -> List[List[torch.Tensor]]:
    """Broadcasts `tensors` (all on devices[0]) to every device of
    `devices`, in buckets of at most `buffer_size` bytes (the library's
    bucketing). Returns one list per device, the first being `tensors`
    themselves (torch.cuda.comm.broadcast_coalesced)."""
    devices = [_get_device_index(d) for d in devices]
    tensors = [_handle_complex(t) for t in tensors]
    return _broadcast_coalesced(tensors, devices, buffer_size)


def _broadcast_coalesced(tensors: List[torch.Tensor], devices: List[int], buffer_size: int) -> List[List[torch.Tensor]]:
    if not devices:
        raise RuntimeError("Expected at least one device to broadcast to")
    if not all(t.get_device() == devices[0] for t in tensors):
        raise RuntimeError(f"All tensors must be on devices[0]: {devices[0]}")
    bucket = _bucket_bytes(buffer_size)
    outputs: List[List[Any]] = [list(tensors)] + [[None] * len(tensors) for _ in devices[1:]]
    if not tensors:
        return outputs
    for d in devices:
        if d < 0:
            raise RuntimeError(f"Expected non-negative device index, but got {d}")
    if len(devices) == 1:
        return outputs
    for k in range(1, len(devices)):
        if devices[k] == devices[0]:
            outputs[k] = _source_device_row(tensors, buffer_size)
    others = [k for k in range(1, len(devices)) if devices[k] != devices[0]]
    if not others:
        return outputs
    dense = [i for i, t in enumerate(tensors) if not t.is_sparse]
    for i, t in enumerate(tensors):
        if t.is_sparse:
            copies = _broadcast(t, [devices[0]] + [devices[k] for k in others])
            for k, copy in zip(others, copies[1:]):
                outputs[k][i] = copy
    srcs = [tensors[i].contiguous() for i in dense]
    for k in others:
        for i, s in zip(dense, srcs):
            outputs[k][i] = torch.empty(s.shape, dtype=s.dtype, device=torch.device("cuda", devices[k]))
    if srcs:
        _lib_broadcast_coalesced(srcs, [[outputs[k][i] for i in dense] for k in others], bucket)
    return outputs


def _cpp_buckets(tensors: List[torch.Tensor], size_limit: int) -> List[List[int]]:
    """torch's C++ take_tensors, as indices: per tensor type (layout, dtype,
    device) in order, a bucket closed once it holds `size_limit` bytes."""
    groups: Dict[Any, List[int]] = {}
    sizes: Dict[Any, int] = {}
    buckets = []
    for i, t in enumerate(tensors):
        key = (t.layout, t.dtype, t.device)
        if t.is_sparse:  # torch counts the values with the indices' element size
            size = (t._indices().numel() + t._values().numel()) * t._indices().element_size()
        else:
            size = _nbytes(t)
        groups.setdefault(key, []).append(i)
        sizes[key] = sizes.get(key, 0) + size
        if sizes[key] >= size_limit:
            buckets.append(groups.pop(key))
            sizes[key] = 0
    return buckets + [b for b in groups.values() if b]


def _source_device_row(tensors: List[torch.Tensor], buffer_size: int) -> List[torch.Tensor]:
    """broadcast_coalesced's result for devices[0] listed again: nothing to
    copy, so as torch: each bucket flattened (a lone contiguous tensor's
    flat view is the tensor's memory) and split into new tensors."""
    row: List[Any] = [None] * len(tensors)
    for bucket in _cpp_buckets(tensors, buffer_size):
        ts = [tensors[i] for i in bucket]
        if ts[0].is_sparse:
            flat_i, flat_v = _flatten_dense_tensors([t._indices() for t in ts]), _flatten_dense_tensors([t._values() for t in ts])
            parts = zip(_unflatten_dense_tensors(flat_i, [t._indices() for t in ts]),
                        _unflatten_dense_tensors(flat_v, [t._values() for t in ts]))
            views = [torch.sparse_coo_tensor(i, v, t.shape, is_coalesced=t.is_coalesced()) for (i, v), t in zip(parts, ts)]
        else:
            views = _unflatten_dense_tensors(_flatten_dense_tensors(ts), ts)
        for i, v in zip(bucket, views):
            row[i] = v.detach()
    return row


def _lib_broadcast_coalesced(srcs: List[torch.Tensor], rows: List[List[torch.Tensor]], bucket: int) -> None:
    """Copies the contiguous `srcs` (on one device) into rows[k][t] (new
    contiguous tensors, one row per other member) in one call."""
    n = len(srcs)
    places = [_place(srcs[0])] + [_place(row[0]) for row in rows]
    dsts = [s.data_ptr() for s in srcs] + [t.data_ptr() for row in rows for t in row]
    check(lib.tc_local_broadcast_coalesced(
        _group(places), _ptrs([s.data_ptr() for s in srcs]), (C.c_size_t * n)(*[_nbytes(s) for s in srcs]),
        (C.c_int32 * n)(*[DType.UINT8] * n), n, bucket, _ptrs(dsts), _streams(places)),
        "tc_local_broadcast_coalesced")


# ------------------------------------------------------------------ scatter


def scatter(tensor: torch.Tensor, devices: Optional[Sequence[Any]] = None, chunk_sizes: Optional[Sequence[int]] = None,
            dim: int = 0, streams: Optional[Sequence[Optional[torch.cuda.Stream]]] = None, *,
            out: Optional[Sequence[torch.Tensor]] = None) -> Tuple[torch.Tensor, ...]:
    """Splits `tensor` (CPU or CUDA) along `dim` into chunks on `devices`
    (`chunk_sizes`, else torch.chunk's), or into the CUDA tensors `out`;
    `streams[i]` orders the copy to device i. A chunk already on its device
    is returned as a view of `tensor` (torch.cuda.comm.scatter)."""
    tensor = _handle_complex(tensor)
    if out is None:
        devices = [_get_device_index(d) for d in devices]  # type: ignore[union-attr]
        return tuple(_scatter(tensor, devices, chunk_sizes, dim, streams))
    if devices is not None:
        raise RuntimeError(f"'devices' must not be specified when 'out' is specified, but got devices={devices}")
    if chunk_sizes is not None:
        raise RuntimeError(
            f"'chunk_sizes' must not be specified when 'out' is specified, but got chunk_sizes={chunk_sizes}"
        )
    return tuple(_scatter_out(tensor, list(out), dim, streams))


def _stream_at(streams: Optional[Sequence[Any]], i: int, device: int) -> Optional[torch.cuda.Stream]:
    """streams[i] when given, checked against the device it must belong to."""
    s = streams[i] if streams is not None and i < len(streams) else None
    if s is not None and s.device_index != device:
        raise RuntimeError(
            f"Expected the device associated with the stream at index {i} (was {s.device_index}) "
            f"to match the device supplied at that index (expected {device})"
        )
    return s


def _scatter(tensor: torch.Tensor, devices: List[int], chunk_sizes: Optional[Sequence[int]], dim: int,
             streams: Optional[Sequence[Any]]) -> List[torch.Tensor]:
    if not devices:
        raise RuntimeError("Expected at least one device to scatter to")
    if chunk_sizes is not None and len(chunk_sizes) != len(devices):
        raise RuntimeError(
            "Expected devices and chunk_sizes to be of same length, but got "
            f"len(devices) = {len(devices)} and len(chunk_sizes) = {len(chunk_sizes)}"
        )
    dim = _wrap_dim(dim, tensor)
    chunks = list(tensor.split_with_sizes(list(chunk_sizes), dim) if chunk_sizes is not None
                  else tensor.chunk(len(devices), dim))
    copies = []
    for i in range(len(chunks)):
        d = devices[i]
        if d != tensor.get_device():
            s = _stream_at(streams, i, d)
            if d < 0:
                raise RuntimeError(f"Expected non-negative device index, but got {d}")
            copies.append((i, d, s, None))
    _copy_chunks(tensor, dim, chunks, copies)
    return chunks


def _scatter_out(tensor: torch.Tensor, out: List[torch.Tensor], dim: int,
                 streams: Optional[Sequence[Any]]) -> List[torch.Tensor]:
    if not out:
        raise RuntimeError("Expected at least one output tensor to scatter to")
    dim = _wrap_dim(dim, tensor)
    sizes, total = [], 0
    for i, o in enumerate(out):
        if not o.is_cuda:
            raise RuntimeError(
                f"Expected all output tensors to be CUDA tensors, but output tensor at index {i} has device '{o.device}'"
            )
        shape = list(o.shape)
        same_ndim = len(shape) == tensor.dim()
        if same_ndim:
            total += shape[dim]
            sizes.append(shape[dim])
            shape[dim] = tensor.size(dim)
        if not (same_ndim and shape == list(tensor.shape)):
            raise RuntimeError(
                f"Output tensor at index {i} has incorrect shape: {list(o.shape)}. Expected same shape except for "
                f"scatter dim {dim} as the source tensor: {list(tensor.shape)}"
            )
    if total != tensor.size(dim):
        raise RuntimeError(
            f"Total size for output tensors along scatter dim {dim} does not match the source tensor size at dim "
            f"{dim}. Expected {tensor.size(dim)}, but got total size {total}"
        )
    chunks = list(tensor.split_with_sizes(sizes, dim))
    copies = [(i, o.get_device(), _stream_at(streams, i, o.get_device()), o) for i, o in enumerate(out)]
    _copy_chunks(tensor, dim, chunks, copies)
    return chunks


def _copy_chunks(tensor: torch.Tensor, dim: int, chunks: List[torch.Tensor], copies: List[Tuple]) -> None:
    """Replaces chunks[i] by its copy on device d for each (i, d, stream,
    out) of `copies` (into `out` when given, else a new tensor laid out as
    torch's .to(memory_format=preserve) lays it out). Consecutive chunks go
    in one tc_local_scatter call."""
    if not copies:
        return
    src = tensor.movedim(dim, 0).contiguous()  # chunk i: consecutive rows
    row_bytes = _nbytes(src) // max(src.size(0), 1)
    starts, at = [], 0
    for c in chunks:
        starts.append(at)
        at += c.size(dim)
    run: List[Tuple] = []
    for entry in copies + [None]:  # type: ignore[list-item]
        if run and (entry is None or entry[0] != run[-1][0] + 1):
            _scatter_run(src, dim, chunks, run, starts[run[0][0]] * row_bytes, row_bytes)
            run = []
        if entry is not None:
            run.append(entry)


def _scatter_run(src: torch.Tensor, dim: int, chunks: List[torch.Tensor], run: List[Tuple], offset: int,
                 row_bytes: int) -> None:
    results, targets = [], []
    for i, d, s, out in run:
        with torch.cuda.stream(s) if s is not None else nullcontext():
            result = out if out is not None else torch.empty_like(chunks[i], device=torch.device("cuda", d))
            moved = None if dim == 0 else _moved_shape(chunks[i].shape, dim, chunks[i].size(dim))
            results.append(result)
            targets.append(_target(result, src.dtype, moved))
    places = [d for _, d, _, _ in run]
    if src.is_cuda and src.get_device() not in places:
        _on_legacy_stream(src)
    counts = [chunks[i].size(dim) * row_bytes for i, _, _, _ in run]
    if sum(counts):
        check(lib.tc_local_scatter(
            _group(places), src.data_ptr() + offset,
            _lib.Device(_lib.TC_DEVICE_CPU, 0) if not src.is_cuda else _lib.Device(_lib.TC_DEVICE_CUDA, src.get_device()),
            sum(counts), DType.UINT8, (C.c_size_t * len(run))(*counts), _ptrs([t.data_ptr() for t in targets]),
            _ptrs([_stream_of(d, s) for _, d, s, _ in run])), "tc_local_scatter")
    for (i, _, s, _), result, target in zip(run, results, targets):
        if target is not result:
            with torch.cuda.stream(s) if s is not None else nullcontext():
                result.copy_(target.movedim(0, dim) if dim else target, non_blocking=True)
        chunks[i] = result


# ------------------------------------------------------------------- gather


def gather(tensors: Sequence[torch.Tensor], dim: int = 0, destination: Any = None, *,
           out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Concatenates CUDA `tensors` along `dim` on `destination` (a CUDA
    device, "cpu" or -1 for the CPU, default the current device) or into
    `out` (CPU or CUDA) (torch.cuda.comm.gather)."""
    tensors = [_handle_complex(t) for t in tensors]
    if out is None:
        if destination == -1:
            warnings.warn(
                "Using -1 to represent CPU tensor is deprecated. Please use a "
                'device object or string instead, e.g., "cpu".',
                FutureWarning,
                stacklevel=2,
            )
        destination = _get_device_index(destination, allow_cpu=True, optional=True)
        return _gather(tensors, dim, destination)
    if destination is not None:
        raise RuntimeError(
            f"'destination' must not be specified when 'out' is specified, but got destination={destination}"
        )
    return _gather_out(tensors, out, dim)


def _gather_shape(tensors: List[torch.Tensor], dim: int, quote: str) -> Tuple[int, List[int]]:
    """Checks the inputs; returns the wrapped dim and the result's shape."""
    if not tensors:
        raise RuntimeError("Expected at least one tensor to gather from")
    first = tensors[0]
    dim = _wrap_dim(dim, first)
    expected, total = list(first.shape), 0
    for i, t in enumerate(tensors):
        if not t.is_cuda:
            raise RuntimeError(
                f"Expected all input tensors to be CUDA tensors, but tensor at index {i} has device {quote}{t.device}{quote}"
            )
        if t.dim() != len(expected):
            raise RuntimeError(
                "Expected all input tensors to have the same number of dimensions, but tensor at index "
                f"{i} has {t.dim()} dimensions, (expected {len(expected)})"
            )
        expected[dim] = t.size(dim)
        if list(t.shape) != expected:
            raise RuntimeError(f"Input tensor at index {i} has invalid shape {list(t.shape)}, but expected {expected}")
        total += t.size(dim)
    expected[dim] = total
    return dim, expected


def _memory_format(t: torch.Tensor) -> torch.memory_format:
    """torch's suggest_memory_format: channels-last strides or contiguous."""
    for fmt, ndim in ((torch.channels_last, 4), (torch.channels_last_3d, 5)):
        if t.dim() == ndim and not t.is_contiguous() and t.is_contiguous(memory_format=fmt):
            return fmt
    return torch.contiguous_format


def _gather(tensors: List[torch.Tensor], dim: int, destination: Optional[int]) -> torch.Tensor:
    dim, shape = _gather_shape(tensors, dim, "")
    fmt = _memory_format(tensors[0])
    if any(_memory_format(t) != fmt for t in tensors):
        fmt = torch.contiguous_format
    if destination == -1:
        device = torch.device("cpu")
    else:
        device = torch.device("cuda", destination if destination is not None else torch.cuda.current_device())
    result = torch.empty(shape, dtype=tensors[0].dtype, device=device, memory_format=fmt)
    return _gather_out_impl(tensors, result, dim)


def _gather_out(tensors: List[torch.Tensor], out: torch.Tensor, dim: int) -> torch.Tensor:
    dim, shape = _gather_shape(tensors, dim, "'")
    if list(out.shape) != shape:
        raise RuntimeError(f"Expected out tensor to have shape {shape}, but got {list(out.shape)}")
    return _gather_out_impl(tensors, out, dim)


def _gather_out_impl(tensors: List[torch.Tensor], out: torch.Tensor, dim: int) -> torch.Tensor:
    srcs = [t.movedim(dim, 0).to(out.dtype).contiguous() for t in tensors]
    target = _target(out, out.dtype, None if dim == 0 else _moved_shape(out.shape, dim, out.size(dim)))
    dst_place = _place(target)
    for s in srcs:
        if s.get_device() != dst_place:
            _on_legacy_stream(s)
    places = [s.get_device() for s in srcs]
    n = len(srcs)
    dst_device = _lib.Device(_lib.TC_DEVICE_CPU, 0) if dst_place == _CPU else _lib.Device(_lib.TC_DEVICE_CUDA, dst_place)
    check(lib.tc_local_gather(_group(places), _ptrs([s.data_ptr() for s in srcs]),
                              (C.c_size_t * n)(*[_nbytes(s) for s in srcs]), DType.UINT8, target.data_ptr(),
                              dst_device, _stream_of(dst_place)), "tc_local_gather")
    if target is not out:
        out.copy_(target.movedim(0, dim) if dim else target, non_blocking=out.is_cuda)
    return out


# --------------------------------------------------------------- reduce_add


def reduce_add(inputs: Sequence[torch.Tensor], destination: Optional[int] = None) -> torch.Tensor:
    """The elementwise sum of `inputs` (CUDA tensors of one shape) on
    `destination`, which must hold one of them (default: the current
    device) (torch.cuda.comm.reduce_add)."""
    destination = _get_device_index(destination, optional=True)
    input_size = inputs[0].size()
    root_index = None  # the input already on the destination
    for i, inp in enumerate(inputs):
        if inp.device.type == "cpu":
            raise AssertionError(f"reduce_add expects all inputs to be on GPUs, but input {i} is on CPU")
        if inp.get_device() == destination:
            root_index = i
        if inp.size() != input_size:
            got = "x".join(str(x) for x in inp.size())
            expected = "x".join(str(x) for x in input_size)
            raise ValueError(f"input {i} has invalid size: got {got}, but expected {expected}")
    if root_index is None:
        raise RuntimeError("reduce_add expects destination to be on the same GPU with one of the tensors")
    if len(inputs) == 1:
        return inputs[0]
    if any(t.is_sparse for t in inputs):  # torch sums sparse tensors with its own ops too
        device = inputs[root_index].device
        nonroot = [t for i, t in enumerate(inputs) if i != root_index]
        result = inputs[root_index] + nonroot[0].to(device=device, non_blocking=True)
        for other in nonroot[1:]:
            result.add_(other.to(device=device, non_blocking=True))
        return result
    for i, t in enumerate(inputs):
        if t.dtype != inputs[0].dtype:
            raise RuntimeError(f"reduce_add: input {i} has dtype {t.dtype}, input 0 has {inputs[0].dtype}")
    srcs = [t.contiguous() for t in inputs]
    result = torch.empty_like(srcs[root_index])
    places = [t.get_device() for t in srcs]
    ptr, count, dt = _reducible(result)
    check(lib.tc_local_reduce_add(_group(places), _ptrs([_reducible(s)[0] for s in srcs]), count, dt, ptr, root_index,
                                  _streams(places)), "tc_local_reduce_add")
    return result


def reduce_add_coalesced(inputs: Sequence[Sequence[torch.Tensor]], destination: Optional[int] = None,
                         buffer_size: int = 10485760) -> Tuple[torch.Tensor, ...]:
    """Sums, tensor by tensor, the lists `inputs` (one list of CUDA tensors
    per device) onto `destination`, in buckets of at most `buffer_size`
    bytes (the library's bucketing; sparse tensors are summed by
    reduce_add). Returns a tuple of new tensors
    (torch.cuda.comm.reduce_add_coalesced)."""
    rows: List[List[torch.Tensor]] = [[] for _ in inputs]  # dense tensors, one row per device
    output: List[Any] = []
    dense_at = []
    zipped = zip(*inputs, strict=True) if sys.version_info >= (3, 10) else zip(*inputs)  # type: ignore[call-overload]
    for tensor_at_gpus in zipped:
        if all(t.is_sparse for t in tensor_at_gpus):
            output.append(reduce_add(tensor_at_gpus, destination))
        else:
            for row, t in zip(rows, tensor_at_gpus):
                row.append(t.to_dense() if t.is_sparse else t)
            dense_at.append(len(output))
            output.append(None)
    if dense_at:
        for k, t in zip(dense_at, _reduce_add_dense(rows, destination, buffer_size)):
            output[k] = t
    return tuple(output)


def _reduce_add_dense(rows: List[List[torch.Tensor]], destination: Optional[int], buffer_size: int) -> List[torch.Tensor]:
    """reduce_add's checks on each device's row (as torch makes them on the
    rows' flattened buckets), then one tc_local_reduce_add_coalesced."""
    if isinstance(buffer_size, bool) or not isinstance(buffer_size, (int, float)):
        raise TypeError(f"argument 'buffer_size' must be a number, not {buffer_size!r}")
    destination = _get_device_index(destination, optional=True)
    root_index = None
    places = []
    for i, row in enumerate(rows):
        if any(t.device.type == "cpu" for t in row):
            raise AssertionError(f"reduce_add expects all inputs to be on GPUs, but input {i} is on CPU")
        devs = {t.device for t in row}
        if len(devs) > 1:
            a, b = sorted(devs, key=str)[:2]
            raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, {a} and {b}!")
        places.append(row[0].get_device())
        if places[-1] == destination:
            root_index = i
        got, expected = sum(t.numel() for t in row), sum(t.numel() for t in rows[0])
        if got != expected:
            raise ValueError(f"input {i} has invalid size: got {got}, but expected {expected}")
        for t, t0 in zip(row, rows[0]):
            if t.dtype != t0.dtype:
                raise RuntimeError(f"reduce_add_coalesced: input {i} has a {t.dtype} tensor where input 0 has {t0.dtype}")
    if root_index is None:
        raise RuntimeError("reduce_add expects destination to be on the same GPU with one of the tensors")
    if len(rows) == 1:  # nothing to sum: as torch, each bucket flattened and split into new tensors
        out = []
        for chunk in _take_tensors(rows[0], buffer_size):
            out += [t.data for t in _unflatten_dense_tensors(_flatten_dense_tensors(chunk), chunk)]
        return list(_reorder_tensors_as(out, rows[0]))
    srcs = [t.contiguous() for row in rows for t in row]
    dsts = [torch.empty(t.shape, dtype=t.dtype, device=rows[root_index][0].device) for t in rows[0]]
    n = len(dsts)
    info = [_reducible(t) for t in dsts]
    bucket = max(int(buffer_size), 1)  # torch's buckets hold at least one tensor
    check(lib.tc_local_reduce_add_coalesced(
        _group(places), _ptrs([_reducible(s)[0] for s in srcs]), (C.c_size_t * n)(*[c for _, c, _ in info]),
        (C.c_int32 * n)(*[d for _, _, d in info]), n, bucket, _ptrs([p for p, _, _ in info]), root_index,
        _streams(places)), "tc_local_reduce_add_coalesced")
    return dsts
