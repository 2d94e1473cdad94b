"""Key-value stores: TCP (torch's TCPStore protocol), file, and prefix views."""
from __future__ import annotations

import ctypes as C
from datetime import timedelta
from typing import Optional, Sequence, Union

from ._lib import check, lib, take_bytes

Value = Union[bytes, bytearray, str]
Timeout = Union[float, timedelta, None]


def _ms(timeout: Timeout) -> int:
    if timeout is None:
        return 0
    secs = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    return max(1, int(secs * 1000))


def _bytes(v: Value) -> bytes:
    return v.encode() if isinstance(v, str) else bytes(v)


def _keys(keys: Sequence[str]) -> "C.Array[C.c_char_p]":
    return (C.c_char_p * len(keys))(*[k.encode() for k in keys])


class Store:
    """A store handle (``tc_store_t``); values are bytes. Thread-safe."""

    def __init__(self, handle: C.c_void_p):
        self._h: Optional[C.c_void_p] = handle

    @property
    def handle(self) -> C.c_void_p:
        if not self._h:
            raise ValueError("the store is closed")
        return self._h

    def close(self) -> None:
        """Frees the handle (a hosted server lives while comms use it)."""
        if self._h:
            lib.tc_store_free(self._h)
            self._h = None

    def __del__(self) -> None:
        self.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def port(self) -> int:
        p = C.c_uint16()
        check(lib.tc_store_tcp_port(self.handle, C.byref(p)), "tc_store_tcp_port")
        return p.value

    def set(self, key: str, value: Value) -> None:
        v = _bytes(value)
        check(lib.tc_store_set(self.handle, key.encode(), v, len(v)), "tc_store_set")

    def get(self, key: str) -> bytes:
        """Waits (up to the store's timeout) for `key`."""
        ptr, n = C.c_void_p(), C.c_size_t()
        check(lib.tc_store_get_alloc(self.handle, key.encode(), C.byref(ptr), C.byref(n)), "tc_store_get_alloc")
        return take_bytes(ptr, n.value)

    def get_into(self, key: str, buf: bytearray) -> int:
        """Copies the value into `buf`; returns its size (TC_ERR_BUFFER_TOO_SMALL
        when it does not fit, copying nothing)."""
        n = C.c_size_t()
        arr = (C.c_char * len(buf)).from_buffer(buf) if len(buf) else None
        check(lib.tc_store_get(self.handle, key.encode(), arr, len(buf), C.byref(n)), "tc_store_get")
        return n.value

    def add(self, key: str, delta: int) -> int:
        out = C.c_int64()
        check(lib.tc_store_add(self.handle, key.encode(), int(delta), C.byref(out)), "tc_store_add")
        return out.value

    def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        """torch's compare_set: returns the value now current."""
        e, d = _bytes(expected), _bytes(desired)
        ptr, n = C.c_void_p(), C.c_size_t()
        check(lib.tc_store_compare_set(self.handle, key.encode(), e, len(e), d, len(d), C.byref(ptr),
                                       C.byref(n)), "tc_store_compare_set")
        return take_bytes(ptr, n.value)

    def check(self, keys: Sequence[str]) -> bool:
        ready = C.c_int()
        check(lib.tc_store_check(self.handle, _keys(keys), len(keys), C.byref(ready)), "tc_store_check")
        return bool(ready.value)

    def wait(self, keys: Sequence[str], timeout: Timeout = None) -> None:
        """Raises TorchCommError (TC_ERR_TIMEOUT) when a key is still missing."""
        check(lib.tc_store_wait(self.handle, _keys(keys), len(keys), _ms(timeout)), "tc_store_wait")

    def delete_key(self, key: str) -> bool:
        deleted = C.c_int()
        check(lib.tc_store_delete(self.handle, key.encode(), C.byref(deleted)), "tc_store_delete")
        return bool(deleted.value)

    def num_keys(self) -> int:
        n = C.c_int64()
        check(lib.tc_store_num_keys(self.handle, C.byref(n)), "tc_store_num_keys")
        return n.value


class TCPStore(Store):
    """A TCP store: with ``is_server`` hosts a server on `port` (0: any, see
    ``port``); otherwise connects to `host:port`. ``world_size`` -1 does not
    wait for workers. ``timeout`` bounds connecting and every get or wait."""

    def __init__(self, host: str, port: int, is_server: bool = False, world_size: int = -1,
                 timeout: Timeout = None):
        h = C.c_void_p()
        check(lib.tc_store_tcp_new(host.encode(), int(port), 1 if is_server else 0, int(world_size), _ms(timeout),
                                   C.byref(h)), "tc_store_tcp_new")
        super().__init__(h)


class FileStore(Store):
    """A store in the file at `path` on a filesystem every process shares."""

    def __init__(self, path: str, world_size: int = -1):
        h = C.c_void_p()
        check(lib.tc_store_file_new(str(path).encode(), int(world_size), C.byref(h)), "tc_store_file_new")
        super().__init__(h)


class PrefixStore(Store):
    """A view of `base` in which key k is ``prefix/k`` (torch's PrefixStore)."""

    def __init__(self, prefix: str, base: Store):
        h = C.c_void_p()
        check(lib.tc_store_prefix_new(base.handle, prefix.encode(), C.byref(h)), "tc_store_prefix_new")
        super().__init__(h)
