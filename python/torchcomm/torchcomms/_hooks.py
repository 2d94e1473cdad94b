"""torchcomms' operation-hook names (``OpName``, the ``*PreHookArgs`` and
``*PostHookArgs`` classes). ``TorchComm.register_pre_hook`` and
``register_post_hook`` are not supported here (they raise; docs/status.md),
so no object of these classes is ever made; the names exist so that code
that imports or annotates with them loads."""
from __future__ import annotations

import enum
from typing import Dict, Union

_OPS = ["send", "recv", "broadcast", "all_reduce", "reduce", "all_gather", "all_gather_v", "all_gather_single",
        "reduce_scatter", "reduce_scatter_v", "reduce_scatter_single", "all_to_all_single", "all_to_all_v_single",
        "all_to_all", "barrier", "scatter", "gather", "gather_single", "split", "new_window", "finalize"]

OpName = enum.Enum("OpName", [(op, i) for i, op in enumerate(_OPS)])  # type: ignore[misc]
OpName.__doc__ = "Operation name given to hooks."


def _camel(op: str) -> str:
    special = {"all_to_all_v_single": "AllToAllVSingle", "all_gather_v": "AllGatherV",
               "reduce_scatter_v": "ReduceScatterV"}
    return special.get(op) or "".join(part.capitalize() for part in op.split("_"))


class CollectivePostHookArgs:
    """Argument of a post hook (hooks are not supported here)."""


_classes: Dict[str, type] = {"CollectivePostHookArgs": CollectivePostHookArgs}
for _op in _OPS:
    _pre = f"{_camel(_op)}PreHookArgs"
    _post = f"{_camel(_op)}PostHookArgs"
    _classes[_pre] = type(_pre, (), {"__doc__": "Argument of a pre hook (hooks are not supported here)."})
    _base = CollectivePostHookArgs if _op not in ("split", "new_window", "finalize") else object
    _classes[_post] = type(_post, (_base,), {"__doc__": "Argument of a post hook (hooks are not supported here)."})
globals().update(_classes)

PreHookArgs = Union[tuple(c for n, c in _classes.items() if n.endswith("PreHookArgs"))]  # type: ignore[misc]
PostHookArgs = Union[tuple(c for n, c in _classes.items() if n.endswith("PostHookArgs")  # type: ignore[misc]
                           and n != "CollectivePostHookArgs")]

__all__ = ["OpName", "PreHookArgs", "PostHookArgs", *_classes]
