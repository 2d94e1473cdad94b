"""Element types and buffers: numpy arrays, torch tensors (CPU, or CUDA
through data_ptr() on the current stream), DLPack exporters and anything with
the buffer protocol, seen as (address, element count, dtype)."""
from __future__ import annotations

import ctypes as C
import enum
import sys
from typing import Any, NamedTuple, Optional

from ._lib import check, invalid, lib


class DType(enum.IntEnum):
    """Element types of the C API (``TC_FLOAT32`` ...)."""

    FLOAT32 = 0
    FLOAT64 = 1
    FLOAT16 = 2
    BFLOAT16 = 3
    INT8 = 4
    UINT8 = 5
    INT32 = 6
    INT64 = 7
    BOOL = 8
    UINT32 = 9
    UINT64 = 10
    FLOAT8_E4M3 = 11
    FLOAT8_E5M2 = 12

    @property
    def itemsize(self) -> int:
        n = C.c_size_t()
        check(lib.tc_dtype_size(int(self), C.byref(n)), "tc_dtype_size")
        return n.value


# numpy dtype names (bfloat16 and float8 have none in numpy itself).
_NUMPY_NAMES = {
    DType.FLOAT32: "float32", DType.FLOAT64: "float64", DType.FLOAT16: "float16", DType.INT8: "int8",
    DType.UINT8: "uint8", DType.INT32: "int32", DType.INT64: "int64", DType.BOOL: "bool",
    DType.UINT32: "uint32", DType.UINT64: "uint64",
}
_TORCH_NAMES = {**_NUMPY_NAMES, DType.BFLOAT16: "bfloat16", DType.FLOAT8_E4M3: "float8_e4m3fn",
                DType.FLOAT8_E5M2: "float8_e5m2"}
# struct-module format characters of the buffer protocol (native sizes).
_FORMATS = {"f": DType.FLOAT32, "d": DType.FLOAT64, "e": DType.FLOAT16, "b": DType.INT8, "B": DType.UINT8,
            "?": DType.BOOL, "c": DType.UINT8}
for _ch in "hHiIlLqQnN":
    _size = C.sizeof({"h": C.c_short, "i": C.c_int, "l": C.c_long, "q": C.c_longlong,
                      "n": C.c_ssize_t}[_ch.lower()])
    _kind = {4: (DType.INT32, DType.UINT32), 8: (DType.INT64, DType.UINT64)}.get(_size)
    if _kind:
        _FORMATS[_ch] = _kind[_ch.isupper()]
# A format's byte-order prefix naming this machine's order.
_NATIVE_ORDER = "<" if sys.byteorder == "little" else ">"


def to_numpy_dtype(dt: DType) -> Any:
    import numpy as np

    if dt not in _NUMPY_NAMES:
        raise invalid(f"{dt.name} has no numpy dtype")
    return np.dtype(_NUMPY_NAMES[dt])


def to_torch_dtype(dt: DType) -> Any:
    import torch

    return getattr(torch, _TORCH_NAMES[dt])


def _non_native(what: Optional[str], order: str) -> Exception:
    """The refusal of elements stored in the other byte order: the library
    reads every element in this machine's order, so they would be garbage
    (and a result written in place would be garbage to the caller)."""
    arg = f"'{what}'" if what else "the dtype"
    return invalid(f"{arg} has non-native byte order ({order}); torchcomm reads elements in this machine's "
                   f"({sys.byteorder}-endian) byte order: convert it first, e.g. "
                   "a.astype(a.dtype.newbyteorder('='))")


def dtype_of(obj: Any, what: Optional[str] = None) -> DType:
    """The DType of a numpy/torch dtype, an array or tensor, a DType or its
    name. A numpy dtype of non-native byte order is refused, naming `what`."""
    if isinstance(obj, DType):
        return obj
    if isinstance(obj, str):
        return DType[obj.upper()]
    dt = getattr(obj, "dtype", obj)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(dt, torch.dtype):
        name = str(dt).replace("torch.", "")
        for k, v in _TORCH_NAMES.items():
            if v == name:
                return k
        raise invalid(f"torch dtype {dt} has no torchcomm dtype")
    np = sys.modules.get("numpy")
    if np is not None:
        dt = np.dtype(dt)
        if not dt.isnative:
            raise _non_native(what, f"dtype {dt.str!r}")
        name = dt.name
        for k, v in _NUMPY_NAMES.items():
            if v == name:
                return k
    raise invalid(f"{dt!r} has no torchcomm dtype")


class Buf(NamedTuple):
    """One buffer as the C API sees it; `keep` holds what must stay alive."""

    ptr: int
    count: int
    dtype: DType
    cuda: bool
    stream: Optional[int]
    keep: Any

    @property
    def nbytes(self) -> int:
        return self.count * self.dtype.itemsize


def _torch_buffer(t: Any, writable: bool, what: str) -> Buf:
    if not t.is_contiguous():
        raise invalid(f"'{what}' is not contiguous")
    if writable and t.requires_grad and t.is_leaf:
        raise invalid(f"'{what}' is a leaf tensor that requires grad; pass tensor.data or a detached tensor")
    stream = None
    if t.is_cuda:
        import torch

        stream = torch.cuda.current_stream(t.device).cuda_stream
    return Buf(t.data_ptr(), t.numel(), dtype_of(t.dtype), bool(t.is_cuda), stream, t)


def _numpy_buffer(a: Any, writable: bool, what: str) -> Buf:
    if not a.flags.c_contiguous:
        raise invalid(f"'{what}' is not C-contiguous")
    if writable and not a.flags.writeable:
        raise invalid(f"'{what}' is read-only")
    return Buf(a.ctypes.data, a.size, dtype_of(a.dtype, what), False, None, a)


def _memoryview_buffer(obj: Any, writable: bool, what: str, dtype: Optional[DType]) -> Buf:
    mv = memoryview(obj)
    if not mv.c_contiguous:
        raise invalid(f"'{what}' is not contiguous")
    fmt = mv.format.lstrip("@=")
    order, code = fmt[:1], fmt[1:]
    if order in ("<", ">", "!") and order != _NATIVE_ORDER and code not in ("b", "B", "?", "c"):
        raise _non_native(what, f"buffer format {mv.format!r}")
    dt = dtype if dtype is not None else _FORMATS.get(fmt)
    if dt is None:
        raise invalid(f"'{what}' has buffer format {mv.format!r}, which maps to no dtype")
    if mv.nbytes % dt.itemsize:
        raise invalid(f"'{what}' has {mv.nbytes} bytes, not a multiple of {dt.name}'s size")
    count = mv.nbytes // dt.itemsize
    if mv.readonly:
        if writable:
            raise invalid(f"'{what}' is read-only")
        copy = (C.c_char * mv.nbytes).from_buffer_copy(mv)  # inputs only: a copy is enough
        return Buf(C.addressof(copy), count, dt, False, None, copy)
    arr = (C.c_char * mv.nbytes).from_buffer(mv.cast("B"))
    return Buf(C.addressof(arr), count, dt, False, None, (arr, mv))


def as_buffer(obj: Any, writable: bool, what: str, dtype: Optional[DType] = None) -> Buf:
    """Views `obj` as a C buffer. `writable`: the operation writes it."""
    if isinstance(obj, Buf):
        return obj
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return _torch_buffer(obj, writable, what)
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, np.ndarray):
        return _numpy_buffer(obj, writable, what)
    if hasattr(obj, "__dlpack__") and np is not None and hasattr(np, "from_dlpack"):
        try:
            return _numpy_buffer(np.from_dlpack(obj), writable, what)
        except (TypeError, BufferError, RuntimeError):
            pass  # e.g. device memory: fall through to the buffer protocol
    try:
        return _memoryview_buffer(obj, writable, what, dtype)
    except TypeError:
        raise invalid(
            f"'{what}' ({type(obj).__name__}) is not a numpy array, torch tensor, DLPack exporter or buffer", what
        ) from None


def raw(ptr: int, count: int, dtype: Any, cuda: bool = False, stream: Optional[int] = None) -> Buf:
    """A buffer from an address (e.g. from tc_mem_alloc or another library)."""
    return Buf(int(ptr), int(count), dtype_of(dtype, "dtype"), cuda, stream, None)
