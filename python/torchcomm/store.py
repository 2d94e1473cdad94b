"""Key-value stores: TCP (torch's TCPStore protocol), file, prefix views, and
stores served by a Python object's methods (callbacks)."""
from __future__ import annotations

import ctypes as C
import threading
from datetime import timedelta
from typing import Any, Callable, Optional, Sequence, Union

from . import _lib
from ._lib import TC_ERR_REMOTE, TC_ERR_TIMEOUT, check, lib, take_bytes

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


class CallbackStore(Store):
    """A store whose operations call the methods of a Python object with the
    methods of torch.distributed's ``Store`` (``set``, ``get``, ``add``,
    ``check``, ``wait(keys, timeout)``, and if it has them ``delete_key``,
    ``compare_set``, ``num_keys``), through ``tc_store_new_callbacks``.

    The library may call those methods from its own threads (each call takes
    the GIL); an exception becomes the failing call's error (TC_ERR_TIMEOUT
    when it says it timed out), with its type and text. `timeout` (default:
    the object's ``timeout`` attribute, if any) bounds the library's waits.
    The object is kept alive until the store and every comm made with it are
    gone."""

    def __init__(self, obj: object, timeout: Timeout = None):
        if timeout is None:
            timeout = getattr(obj, "timeout", None)
            timeout = timeout if isinstance(timeout, timedelta) else None
        token = _register(obj)
        cb = _callbacks(token, _ms(timeout))
        h = C.c_void_p()
        try:
            check(lib.tc_store_new_callbacks(C.byref(cb), C.byref(h)), "tc_store_new_callbacks")
        except BaseException:
            _live.pop(token, None)
            raise
        super().__init__(h)


# Python objects served through callbacks, by the token given as user_data;
# the store's destroy callback drops its entry.
_live: "dict[int, object]" = {}
_next_token = [0]
_token_lock = threading.Lock()


def _register(obj: object) -> int:
    with _token_lock:
        _next_token[0] += 1
        token = _next_token[0]
        _live[token] = obj
    return token


def _is_timeout(e: BaseException) -> bool:
    if isinstance(e, TimeoutError):
        return True
    text = str(e).lower()
    return "timeout" in text or "timed out" in text


def _guarded(fn: Callable[..., int]) -> Callable[..., int]:
    """Runs a callback body; an exception becomes an error code and message."""

    def call(user_data: int, *args: Any) -> int:
        reply = args[-1]
        try:
            fn(_live[user_data], *args)
            return 0
        except BaseException as e:  # nothing may unwind into the library
            try:
                lib.tc_store_reply_error(reply, f"{type(e).__name__}: {e}".encode(errors="replace"))
            except BaseException:
                pass
            return TC_ERR_TIMEOUT if _is_timeout(e) else TC_ERR_REMOTE

    return call


def _key_list(keys: Any, n: int) -> "list[str]":
    return [keys[i].decode() for i in range(n)]


def _reply(reply: int, value: Any) -> None:
    v = _bytes(value)
    check(lib.tc_store_reply_value(reply, v, len(v)), "tc_store_reply_value")


def _cb_set(obj: Any, key: bytes, value: int, n: int, _r: int) -> None:
    obj.set(key.decode(), C.string_at(value, n) if n else b"")


def _cb_get(obj: Any, key: bytes, r: int) -> None:
    _reply(r, obj.get(key.decode()))


def _cb_add(obj: Any, key: bytes, delta: int, out: Any, _r: int) -> None:
    out[0] = int(obj.add(key.decode(), delta))


def _cb_check(obj: Any, keys: Any, n: int, ready: Any, _r: int) -> None:
    ready[0] = 1 if obj.check(_key_list(keys, n)) else 0


def _cb_wait(obj: Any, keys: Any, n: int, timeout_ms: int, _r: int) -> None:
    obj.wait(_key_list(keys, n), timedelta(milliseconds=timeout_ms))


def _cb_delete(obj: Any, key: bytes, deleted: Any, _r: int) -> None:
    deleted[0] = 1 if obj.delete_key(key.decode()) else 0


def _cb_compare_set(obj: Any, key: bytes, e: int, elen: int, d: int, dlen: int, r: int) -> None:
    expected = C.string_at(e, elen) if elen else b""
    desired = C.string_at(d, dlen) if dlen else b""
    _reply(r, obj.compare_set(key.decode(), expected, desired))


def _cb_num_keys(obj: Any, n: Any, _r: int) -> None:
    n[0] = int(obj.num_keys())


def _cb_destroy(user_data: int) -> None:
    _live.pop(user_data, None)


# One set of C function pointers for every callback store, alive for the
# process (library threads may call them until the last store is gone).
_FUNCS = {
    "set": _lib.STORE_SET(_guarded(_cb_set)),
    "get": _lib.STORE_GET(_guarded(_cb_get)),
    "add": _lib.STORE_ADD(_guarded(_cb_add)),
    "check": _lib.STORE_CHECK(_guarded(_cb_check)),
    "wait": _lib.STORE_WAIT(_guarded(_cb_wait)),
    "delete_key": _lib.STORE_DELETE(_guarded(_cb_delete)),
    "compare_set": _lib.STORE_COMPARE_SET(_guarded(_cb_compare_set)),
    "num_keys": _lib.STORE_NUM_KEYS(_guarded(_cb_num_keys)),
    "destroy": _lib.STORE_DESTROY(_cb_destroy),
}
_OPTIONAL = ("delete_key", "compare_set", "num_keys")


def _provides(obj: object, name: str) -> bool:
    """True when `obj` has method `name`: a Python subclass of torch's Store
    that does not define it inherits the base class's, which only raises
    "not implemented" (torch's own stores implement them all)."""
    if not callable(getattr(obj, name, None)):
        return False
    if type(obj).__module__.startswith("torch"):
        return True
    owner = next((k for k in type(obj).__mro__ if name in vars(k)), None)
    return not (owner is not None and owner.__name__ == "Store" and owner.__module__.startswith("torch"))


def _callbacks(token: int, timeout_ms: int) -> _lib.StoreCallbacks:
    obj = _live[token]
    cb = _lib.StoreCallbacks(C.sizeof(_lib.StoreCallbacks), _lib.TC_STORE_CALLBACKS_MAGIC,
                             _lib.TC_STORE_CALLBACKS_VERSION, token)
    for name, fn in _FUNCS.items():
        if name in _OPTIONAL and not _provides(obj, name):
            continue
        setattr(cb, name, fn)
    cb.timeout_ms = timeout_ms if timeout_ms > 0 else _lib.TC_UNSET
    return cb
