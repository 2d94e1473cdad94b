"""One-sided windows: register memory, put into a peer's, signal, wait."""
from __future__ import annotations

import ctypes as C
from typing import Any

from ._buffers import as_buffer
from ._lib import check, lib
from .comm import Comm, Memory, Work


class Window:
    """A one-sided window over `comm` (``tc_window_t``). Collective: every
    rank creates its windows in the same order. It keeps the comm's
    resources alive until freed. ``put``, ``signal`` and ``wait_signal`` take
    the operation options of Comm (``async_op``, ``timeout``, ``hints``)."""

    def __init__(self, comm: Comm):
        h = C.c_void_p()
        check(lib.tc_window_new(comm.handle, C.byref(h)), "tc_window_new")
        self._comm, self._h, self._keep = comm, h, None  # type: ignore[var-annotated]

    @property
    def handle(self) -> C.c_void_p:
        if not self._h:
            raise ValueError("the window is freed")
        return self._h

    def register(self, buf: Any) -> None:
        """Collective; `buf` (an array, tensor, buffer or Memory) stays in
        use until ``deregister``."""
        if isinstance(buf, Memory):
            ptr, nbytes, keep = buf.ptr, buf.nbytes, buf
        else:
            b = as_buffer(buf, True, "buf")
            ptr, nbytes, keep = b.ptr, b.nbytes, b.keep
        check(lib.tc_window_register(self.handle, ptr, nbytes), "tc_window_register")
        self._keep = keep

    def deregister(self) -> None:
        check(lib.tc_window_deregister(self.handle), "tc_window_deregister")
        self._keep = None

    def put(self, src: Any, dst_rank: int, dst_offset: int = 0, **o: Any) -> Work:
        """Writes `src` into `dst_rank`'s buffer at byte offset `dst_offset`."""
        b = as_buffer(src, False, "src")
        return self._comm._op("tc_window_put", [b], o, lambda c, w: lib.tc_window_put(
            self.handle, b.ptr, b.nbytes, dst_rank, dst_offset, c, w))

    def get(self, dst: Any, src_rank: int, src_offset: int = 0, **o: Any) -> Work:
        """Reads len(dst) bytes at byte offset `src_offset` of `src_rank`'s
        buffer into `dst`."""
        b = as_buffer(dst, True, "dst")
        return self._comm._op("tc_window_get", [b], o, lambda c, w: lib.tc_window_get(
            self.handle, b.ptr, b.nbytes, src_rank, src_offset, c, w))

    def signal(self, peer: int, **o: Any) -> Work:
        return self._comm._op("tc_window_signal", [], o, lambda c, w: lib.tc_window_signal(self.handle, peer, c, w))

    def wait_signal(self, peer: int, **o: Any) -> Work:
        return self._comm._op("tc_window_wait_signal", [], o,
                              lambda c, w: lib.tc_window_wait_signal(self.handle, peer, c, w))

    def map_remote(self, rank: int) -> int:
        """The local address of `rank`'s registered buffer (see the C doc)."""
        p = C.c_void_p()
        check(lib.tc_window_map_remote(self.handle, rank, C.byref(p)), "tc_window_map_remote")
        return p.value or 0

    def free(self) -> None:
        if self._h:
            lib.tc_window_free(self._h)
            self._h = None

    def __del__(self) -> None:
        self.free()

    def __enter__(self) -> "Window":
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()


