"""aiordma as a Ray Direct Transport: actors hand numpy arrays to each other by RDMA READ.

Call :func:`register` in the driver before making the actors, and give the
methods whose returned arrays should move this way
``@ray.method(tensor_transport="AIORDMA")``; the actors that receive them
need ``enable_tensor_transport=True``. A producer's arrays are registered
for remote reads where they are (no copy), a consumer reads all arrays of an
object in one descriptor-list READ, and the registration ends when Ray frees
the object. Each process runs one transfer agent on a loop thread of its
own; it uses no CPU while idle. See the Ray guide (``docs/guides/ray.md``).
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from aiordma._extras import missing

try:
    import numpy
except ImportError as exc:  # pragma: no cover - depends on the install
    raise missing("aiordma.ray moves numpy arrays, which needs numpy", "ray") from exc
if importlib.util.find_spec("ray") is None:  # pragma: no cover - depends on the install
    raise missing("aiordma.ray is a Ray Direct Transport, which needs Ray", "ray")

from aiordma.channel import PresharedKey
from aiordma.ray.exchange import ArrayExchange, Export
from aiordma.ray.specs import NAME, ArraySpec

if TYPE_CHECKING:
    from aiordma.ray.manager import (
        AiordmaFetch,
        AiordmaMetadata,
        AiordmaTransport,
        current_manager,
        transport_available,
        transport_class,
    )

_MANAGER = frozenset(
    ["AiordmaFetch", "AiordmaMetadata", "AiordmaTransport", "current_manager",
     "transport_available", "transport_class"]
)  # fmt: skip
"""Names of :mod:`aiordma.ray.manager`, which imports Ray (seconds): loaded
when first used, so a process that only exchanges arrays never imports it."""

__all__ = [
    "NAME",
    "AiordmaFetch",
    "AiordmaMetadata",
    "AiordmaTransport",
    "ArrayExchange",
    "ArraySpec",
    "Export",
    "current_manager",
    "register",
    "transport_available",
    "transport_class",
]


def register(name: str = NAME, *, auth: PresharedKey | bytes | None = None) -> str:
    """Register the transport with Ray under ``name`` (upper-cased, as Ray
    does); returns that name. ``auth``: a key every connection between the
    actors' agents proves (it travels to the actors with the registration,
    inside the cluster). Call it in the driver, before making the actors;
    calling it again with the same name and key does nothing."""
    from ray.experimental import register_tensor_transport

    from aiordma.ray.manager import transport_class

    if not isinstance(name, str) or not name:
        raise TypeError(f"the transport's name must be a non-empty str, not {name!r}")
    if auth is not None and not isinstance(auth, PresharedKey | bytes):
        raise TypeError(f"auth must be a PresharedKey or bytes, not {type(auth).__name__}")
    key = bytes.fromhex(auth.hex()) if isinstance(auth, PresharedKey) else auth
    if key is not None:
        PresharedKey(key)  # its checks (at least 16 bytes) here, not in the actors
    name = name.upper()
    if name in _registered:
        if _registered[name] != key:
            raise ValueError(f"the transport {name} is already registered, with another key: "
                             "register it once per process")  # fmt: skip
        return name  # again, as it was: nothing to do
    register_tensor_transport(name, ["cpu"], transport_class(name, key), numpy.ndarray)
    _registered[name] = key
    return name


_registered: dict[str, bytes | None] = {}
"""The names :func:`register` gave Ray in this process, with their keys."""


def __getattr__(name: str) -> object:
    if name in _MANAGER:
        from aiordma.ray import manager

        return getattr(manager, name)
    if name == "ArrayEngine":  # its name until 0.1: "engine" is the verbs layer's word
        import warnings

        warnings.warn("aiordma.ray.ArrayEngine is now ArrayExchange", DeprecationWarning,
                      stacklevel=2)  # fmt: skip
        return ArrayExchange
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
