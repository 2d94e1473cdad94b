"""Collectives of picklable Python objects over a TorchComm (torchcomms'
``objcol``): each object is serialized (``torch.save``; with
``TORCHCOMMS_SERIALIZATION=pickle``, pickle), sizes are exchanged first,
then the bytes, padded to the largest, on the comm's device."""
from __future__ import annotations

import io
import os
import pickle
from datetime import timedelta
from typing import Any, List, Optional

import torch

from ._api import TorchComm


def _dump(obj: object) -> bytes:
    f = io.BytesIO()
    if os.getenv("TORCHCOMMS_SERIALIZATION") == "pickle":
        pickle.dump(obj, f)
    else:
        torch.save(obj, f)
    return f.getvalue()


def _load(data: bytes, weights_only: bool) -> object:
    if os.getenv("TORCHCOMMS_SERIALIZATION") == "pickle":
        return pickle.loads(data)
    return torch.load(io.BytesIO(data), weights_only=weights_only)


def _bytes_tensor(data: bytes, size: int, device: torch.device) -> torch.Tensor:
    t = torch.zeros(size, dtype=torch.uint8)
    if data:
        t[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return t.to(device)


def _sizes(comm: TorchComm, n: int, timeout: Optional[timedelta]) -> List[int]:
    """Every rank's `n`, in rank order."""
    dev = comm.get_device()
    mine = torch.tensor([n], dtype=torch.int64, device=dev)
    out = torch.zeros(comm.get_size(), dtype=torch.int64, device=dev)
    comm.all_gather_single(out, mine, async_op=False, timeout=timeout)
    return [int(x) for x in out.cpu()]


def all_gather_object(comm: TorchComm, object_list: List[Any], obj: object, timeout: Optional[timedelta] = None,
                      weights_only: bool = True) -> None:
    """``object_list`` (one slot per rank) receives every rank's `obj`."""
    data = _dump(obj)
    sizes = _sizes(comm, len(data), timeout)
    width = max(sizes)
    dev = comm.get_device()
    out = torch.empty(width * comm.get_size(), dtype=torch.uint8, device=dev)
    comm.all_gather_single(out, _bytes_tensor(data, width, dev), async_op=False, timeout=timeout)
    host = out.cpu().numpy().tobytes()
    for r, n in enumerate(sizes):
        object_list[r] = _load(host[r * width: r * width + n], weights_only)


def gather_object(comm: TorchComm, obj: object, root: int, object_gather_list: Optional[List[Any]] = None,
                  timeout: Optional[timedelta] = None, weights_only: bool = True) -> None:
    """On `root`, ``object_gather_list`` (one slot per rank) receives every rank's `obj`."""
    data = _dump(obj)
    sizes = _sizes(comm, len(data), timeout)
    width = max(sizes)
    dev = comm.get_device()
    is_root = comm.get_rank() == root
    out = torch.empty(width * comm.get_size(), dtype=torch.uint8, device=dev) if is_root else None
    comm.gather_single(out, _bytes_tensor(data, width, dev), root, async_op=False, timeout=timeout)
    if is_root:
        if object_gather_list is None:
            raise ValueError("object_gather_list is needed on the root")
        host = out.cpu().numpy().tobytes()
        for r, n in enumerate(sizes):
            object_gather_list[r] = _load(host[r * width: r * width + n], weights_only)


def broadcast_object_list(comm: TorchComm, object_list: List[Any], root: int, timeout: Optional[timedelta] = None,
                          weights_only: bool = True) -> None:
    """Every rank's ``object_list`` (the same length everywhere) becomes root's."""
    dev = comm.get_device()
    is_root = comm.get_rank() == root
    blobs = [_dump(o) for o in object_list] if is_root else []
    sizes = torch.tensor([len(b) for b in blobs] if is_root else [0] * len(object_list), dtype=torch.int64,
                         device=dev)
    comm.broadcast(sizes, root, async_op=False, timeout=timeout)
    counts = [int(x) for x in sizes.cpu()]
    payload = _bytes_tensor(b"".join(blobs), sum(counts), dev)
    comm.broadcast(payload, root, async_op=False, timeout=timeout)
    if not is_root:
        host, at = payload.cpu().numpy().tobytes(), 0
        for i, n in enumerate(counts):
            object_list[i] = _load(host[at: at + n], weights_only)
            at += n


def scatter_object_list(comm: TorchComm, root: int, scatter_object_output_list: List[Any],
                        scatter_object_input_list: Optional[List[Any]] = None, timeout: Optional[timedelta] = None,
                        weights_only: bool = True) -> None:
    """``scatter_object_output_list[0]`` receives root's ``scatter_object_input_list[rank]``."""
    dev = comm.get_device()
    size = comm.get_size()
    is_root = comm.get_rank() == root
    if is_root and (scatter_object_input_list is None or len(scatter_object_input_list) != size):
        raise ValueError(f"scatter_object_input_list needs {size} objects on the root")
    blobs = [_dump(o) for o in scatter_object_input_list] if is_root else []  # type: ignore[union-attr]
    sizes = torch.tensor([len(b) for b in blobs] if is_root else [0] * size, dtype=torch.int64, device=dev)
    comm.broadcast(sizes, root, async_op=False, timeout=timeout)
    counts = [int(x) for x in sizes.cpu()]
    width = max(counts)
    out = torch.empty(width, dtype=torch.uint8, device=dev)
    ins = [_bytes_tensor(b, width, dev) for b in blobs] if is_root else []
    comm.scatter(out, ins, root, async_op=False, timeout=timeout)
    scatter_object_output_list[0] = _load(out.cpu().numpy().tobytes()[: counts[comm.get_rank()]], weights_only)


def send_object_list(comm: TorchComm, object_list: List[Any], dst: int, timeout: Optional[timedelta] = None) -> None:
    """Sends ``object_list`` to `dst`, which calls recv_object_list with a list of the same length."""
    dev = comm.get_device()
    blobs = [_dump(o) for o in object_list]
    comm.send(torch.tensor([len(b) for b in blobs], dtype=torch.int64, device=dev), dst, async_op=False,
              timeout=timeout)
    comm.send(_bytes_tensor(b"".join(blobs), sum(len(b) for b in blobs), dev), dst, async_op=False, timeout=timeout)


def recv_object_list(comm: TorchComm, object_list: List[Any], src: int, timeout: Optional[timedelta] = None,
                     weights_only: bool = True) -> None:
    """Fills ``object_list`` with the objects `src` sent (send_object_list)."""
    dev = comm.get_device()
    sizes = torch.zeros(len(object_list), dtype=torch.int64, device=dev)
    comm.recv(sizes, src, async_op=False, timeout=timeout)
    counts = [int(x) for x in sizes.cpu()]
    payload = torch.empty(sum(counts), dtype=torch.uint8, device=dev)
    comm.recv(payload, src, async_op=False, timeout=timeout)
    host, at = payload.cpu().numpy().tobytes(), 0
    for i, n in enumerate(counts):
        object_list[i] = _load(host[at: at + n], weights_only)
        at += n
