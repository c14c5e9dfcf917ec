"""Handles behind pyverbs objects: the official attribute first, a search second.

Newer pyverbs exposes what the drivers need (``CQ.cq`` from rdma-core 54,
``CompChannel.fd`` from 57, ``QP.qp`` from 61); older ones hide it. A C
handle is then searched for by the compiled core (``find_cq``/``find_qp``,
which also check an official one). A hidden descriptor is an ordinary fd
of this process, so the new entry of ``/proc/self/fd`` whose link matches
appears when the object is created; entries are compared as (fd, link
target) pairs, as a number alone can be reused between the two listings.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from aiordma.exceptions import DeviceError


class _Closable(Protocol):
    def close(self) -> None: ...


T = TypeVar("T", bound=_Closable)

_lock = threading.Lock()


def _fd_table() -> set[tuple[int, str]]:
    table = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            table.add((int(name), os.readlink(f"/proc/self/fd/{name}")))
        except OSError:
            continue
    return table


def create_with_fd(
    create: Callable[[], T], target: str, exposed: Callable[[T], int | None]
) -> tuple[T, int]:
    """Call ``create()`` and return the object with its descriptor.

    ``exposed(obj)`` returns the descriptor where pyverbs provides it; else
    the one new fd linking to ``target`` is found by comparing fd tables.
    """
    with _lock:
        before = _fd_table()
        obj = create()
        fd = exposed(obj)
        if fd is not None:
            return obj, fd
        new = [fd for fd, link in _fd_table() - before if link == target]
    if len(new) != 1:
        obj.close()
        raise DeviceError(
            f"could not identify the new {target} descriptor ({len(new)} candidates); "
            "is another thread creating channels at the same time?"
        )
    return obj, new[0]


def official_handle(obj: Any, name: str) -> int:
    """The C address pyverbs exposes as ``obj.<name>``, or 0 where it exposes none."""
    value = getattr(obj, name, None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
