"""One ownership protocol for the verbs resources a device creates.

A child (queue pair, shared receive queue, memory region) is adopted by the
device that made it when it is created and disowned when it is gone; the
device releases the children still alive when it closes, in one fixed
order: the users of memory before the memory (the shape of pyverbs'
``add_ref`` and ``close_weakrefs``). Completion-queue room is a lease: a
child takes it from its owner once and gives it back once.

Call order of a child: ``_adopt -> [_lease_cq] -> ... -> _release_cq -> _disown``,
or ``_adopt -> _owner_closing`` when its device closes first.

How each object closes is :mod:`aiordma.lifecycle`'s.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar, Final, Protocol

if TYPE_CHECKING:
    from pyverbs.device import Context
    from pyverbs.pd import PD

    from aiordma.verbs.attributes import DeviceAttributes
    from aiordma.verbs.completion import CompletionQueue
    from aiordma.verbs.memory import Access, MemoryRegion

ORDER: Final = ("queue pair", "shared receive queue", "memory region")
"""The kinds of children, in the order a closing owner releases them."""
WEAK: Final = frozenset({"memory region"})
"""Kinds held weakly: a region nobody references any more needs no release."""


class Child(Protocol):
    """A resource its device releases if it is still alive when the device closes."""

    kind: ClassVar[str]
    """One of :data:`ORDER`."""

    def _owner_closing(self) -> None:
        """Release at once: the device is closing (work in flight or not)."""


class Children:
    """The children one owner holds, by kind."""

    __slots__ = ("_kinds",)

    def __init__(self) -> None:
        self._kinds: dict[str, Any] = {
            kind: weakref.WeakSet() if kind in WEAK else set() for kind in ORDER
        }

    def adopt(self, child: Child) -> None:
        self._kinds[child.kind].add(child)

    def disown(self, child: Child) -> None:
        self._kinds[child.kind].discard(child)

    def __contains__(self, child: Child) -> bool:
        return child in self._kinds[child.kind]

    def of(self, kind: str) -> Iterator[Any]:
        """The children of ``kind`` alive now (a copy: safe to release while iterating)."""
        return iter(list(self._kinds[kind]))

    def release_all(self) -> None:
        """Release every child, kind by kind in :data:`ORDER`; one that fails
        to release does not keep the others (its error is raised at the end)."""
        first: BaseException | None = None
        for kind in ORDER:
            children = list(self._kinds[kind])
            self._kinds[kind].clear()
            for child in children:
                try:
                    child._owner_closing()
                except Exception as exc:
                    first = first or exc
        if first is not None:
            raise first


class Owner(Protocol):
    """What a child needs from the device that created it."""

    name: str
    attributes: DeviceAttributes

    @property
    def context(self) -> Context: ...

    @property
    def pd(self) -> PD: ...

    def register(self, obj: Any, access: Access | None = None) -> MemoryRegion: ...

    def alloc(self, size: int, access: Access = ...) -> MemoryRegion: ...

    def gid_index(self, port: int = 1, family: int = 4) -> int: ...

    def _lease_cq(self, entries: int) -> CompletionQueue:
        """A completion queue of the running loop with ``entries`` reserved on it."""

    def _release_cq(self, cq: CompletionQueue, entries: int) -> None:
        """Give back a lease (once); the queue closes when nobody uses it."""

    def _adopt(self, child: Child) -> None: ...

    def _disown(self, child: Child) -> None: ...

    def _holds(self, child: Child) -> bool: ...
