"""torch.distributed stores as libtorchcomm stores.

``from_torch(store)`` gives the ``torchcomm.Store`` that reaches the same
keys as a torch.distributed ``Store``:

- a ``TCPStore``: our own client connects to its host and port (our client
  speaks torch's wire protocol), so no call goes through Python;
- a ``PrefixStore`` (nested too) over a ``TCPStore``: that client under our
  prefix store with the same prefix (found by one probe key, set and
  deleted through the PrefixStore);
- any other store (``FileStore``, ``HashStore``, a Python subclass of
  ``Store``, a ``PrefixStore`` over one of those): served by the store's
  own methods through the C API's callback store (``CallbackStore``).
"""
from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any, Optional, Tuple

from .store import CallbackStore, PrefixStore, Store, TCPStore

__all__ = ["from_torch"]

_ANY_INTERFACE = ("", "0.0.0.0", "::")


def _timeout(store: Any) -> Optional[timedelta]:
    t = getattr(store, "timeout", None)
    return t if isinstance(t, timedelta) else None


def _prefix_of(prefix_store: Any) -> Optional[str]:
    """The prefix a torch PrefixStore adds (torch does not expose it): a
    probe key set through it shows up as ``<prefix>/<probe>`` in the store
    below. None when the store below cannot list its keys."""
    below = prefix_store.underlying_store
    probe = f"torchcomm-probe-{uuid.uuid4().hex}"
    prefix_store.set(probe, b"")
    try:
        keys = below.list_keys()
    except Exception:  # list_keys is optional in torch's Store
        return None
    finally:
        prefix_store.delete_key(probe)
    tail = "/" + probe
    found = [k for k in keys if k.endswith(tail)]
    return found[0][: -len(tail)] if len(found) == 1 else None


def _native(store: Any) -> Optional[Tuple[Store, Any]]:
    """Our native store for a torch TCPStore, or a PrefixStore chain over
    one, with the torch store it reaches; None for other stores."""
    import torch.distributed as dist

    if isinstance(store, dist.TCPStore):
        host = store.host if store.host not in _ANY_INTERFACE else "127.0.0.1"
        return TCPStore(host, store.port, timeout=_timeout(store)), store
    if isinstance(store, dist.PrefixStore):
        below = _native(store.underlying_store)
        if below is None:
            return None
        prefix = _prefix_of(store)
        if prefix is None:
            return None
        base, torch_store = below
        return PrefixStore(prefix, base), torch_store
    return None


def from_torch(store: Any) -> Store:
    """The libtorchcomm store for a torch.distributed ``Store`` (or any object
    with its methods; a ``torchcomm.Store`` is returned as is). The torch
    store object is kept alive as long as the result (the callback store
    calls it; a native client only needs its server)."""
    if isinstance(store, Store):
        return store
    native = _native(store)
    if native is not None:
        ours, torch_store = native
        ours._torch_store = torch_store  # type: ignore[attr-defined]  # keeps a hosted server up
        return ours
    for method in ("set", "get", "add", "check", "wait"):
        if not callable(getattr(store, method, None)):
            raise TypeError(f"argument 'store': {type(store).__name__} is not a store (it has no {method}())")
    return CallbackStore(store, _timeout(store))
