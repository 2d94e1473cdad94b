"""Sparse all-reduce (``tc_sparse_all_reduce``) of torch sparse COO tensors
or (indices, values, shape) numpy arrays."""
from __future__ import annotations

import ctypes as C
import sys
from typing import Any, Optional, Sequence, Tuple

from . import _lib
from ._buffers import DType, as_buffer, to_numpy_dtype, to_torch_dtype
from ._lib import invalid, lib

CALL = "tc_sparse_all_reduce"


def _input(indices: Any, values: Any, shape: Optional[Sequence[int]]) -> Tuple[Any, Any, Tuple[int, ...], bool]:
    """(indices int64 [sparse_dim, nnz], values [nnz, *dense], shape, is_torch)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(indices, torch.Tensor) and indices.layout == torch.sparse_coo:
        if values is not None or shape is not None:
            raise invalid("pass a torch sparse tensor alone, without 'values' or 'shape'", CALL)
        t = indices
        return t._indices().contiguous(), t._values().contiguous(), tuple(t.shape), True
    if values is None or shape is None:
        raise invalid("pass a torch sparse COO tensor, or 'indices', 'values' and 'shape'", CALL)
    import numpy as np

    idx = np.asarray(indices)
    # A cast to int64 would truncate 0.7 to 0: only integers are indices
    # (of any width or byte order: the cast then keeps their values).
    if idx.size and idx.dtype.kind not in ("i", "u"):
        raise invalid(f"'indices' must be integers, not {idx.dtype}", CALL)
    if idx.size and idx.dtype.kind == "u" and idx.max() > np.iinfo(np.int64).max:
        raise invalid(f"'indices' holds {idx.max()}, beyond int64", CALL)
    idx = np.ascontiguousarray(idx, dtype=np.int64)
    if idx.ndim != 2:
        raise invalid(f"'indices' must be 2-D (sparse_dim x nnz), not {idx.ndim}-D", CALL)
    vals = np.ascontiguousarray(values)
    shape = tuple(int(s) for s in shape)
    if tuple(vals.shape) != (idx.shape[1], *shape[idx.shape[0]:]):
        raise invalid(f"'values' has shape {tuple(vals.shape)}, expected "
                      f"{(idx.shape[1], *shape[idx.shape[0]:])} (nnz, *dense sizes)", CALL)
    return idx, vals, shape, False


def sparse_all_reduce(comm: Any, op: Any, indices: Any, values: Any, shape: Optional[Sequence[int]],
                      o: dict) -> Any:
    idx, vals, shape, is_torch = _input(indices, values, shape)
    sparse_dim = idx.shape[0]
    if not 1 <= sparse_dim <= len(shape):
        raise invalid(f"sparse_dim {sparse_dim} is not in 1..{len(shape)}", CALL)
    if o.get("async_op"):
        raise invalid("sparse_all_reduce is blocking in Python (async_op is not supported)", CALL)
    i_buf, v_buf = as_buffer(idx, False, "indices"), as_buffer(vals, False, "values")
    c_shape = (C.c_int64 * len(shape))(*shape)
    inp = _lib.SparseCoo(sparse_dim, len(shape) - sparse_dim, c_shape, idx.shape[1],
                         C.cast(i_buf.ptr, C.POINTER(C.c_int64)), v_buf.ptr, int(v_buf.dtype))
    out = _lib.SparseCoo()
    comm._op(CALL, [i_buf, v_buf, c_shape], o, lambda c, w: lib.tc_sparse_all_reduce(
        comm.handle, C.byref(inp), op.c(), C.byref(out), c, w))
    return _take(out, is_torch)


def _take(out: _lib.SparseCoo, is_torch: bool) -> Any:
    """Copies the library's result into numpy/torch, then frees its arrays."""
    try:
        ndim = out.sparse_dim + out.dense_dim
        shape = tuple(out.shape[k] for k in range(ndim))
        nnz, dtype = out.nnz, DType(out.dtype)
        dense = shape[out.sparse_dim:]
        row = 1
        for d in dense:
            row *= d
        import numpy as np

        idx = np.ctypeslib.as_array(out.indices, (out.sparse_dim * nnz,)).copy() if nnz else \
            np.empty(0, dtype=np.int64)
        idx = idx.reshape(out.sparse_dim, nnz)
        nbytes = nnz * row * dtype.itemsize
        raw = (C.c_char * nbytes).from_address(out.values) if nbytes else bytearray(0)
        if is_torch:
            import torch

            v = torch.frombuffer(bytearray(raw), dtype=to_torch_dtype(dtype)) if nbytes else \
                torch.empty(0, dtype=to_torch_dtype(dtype))
            t = torch.sparse_coo_tensor(torch.from_numpy(idx), v.view(nnz, *dense), shape, is_coalesced=True,
                                        check_invariants=False)  # valid by construction
            return t
        vals = np.frombuffer(bytes(raw), dtype=to_numpy_dtype(dtype)).reshape(nnz, *dense).copy()
        return idx, vals, shape
    finally:
        for p in (C.cast(out.shape, C.c_void_p), C.cast(out.indices, C.c_void_p), out.values):
            lib.tc_free(p)
