"""What a message channel runs on."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiordma.metrics import Stats
from aiordma.verbs.device import Device
from aiordma.verbs.memory import Access, MemoryRegion
from aiordma.verbs.queue_pair import QueuePair


class Link(Protocol):
    """What a :class:`~aiordma.MessageChannel` needs from the connection it runs on.

    A connected queue pair on a device, memory registration there (released
    with the link), closing, when both peers can send (``on_established``:
    the channel's HELLO waits for it) and where its metrics count
    (``add_stats``), and whether the peer is on the same device
    (``loopback``). :class:`~aiordma.Connection` is one.
    """

    @property
    def qp(self) -> QueuePair: ...

    @property
    def device(self) -> Device: ...

    @property
    def loopback(self) -> bool: ...

    def register(self, obj: Any, access: Access | None = None) -> MemoryRegion: ...

    def alloc(self, size: int, access: Access = Access.LOCAL_WRITE) -> MemoryRegion: ...

    def close(self) -> Awaitable[None]: ...

    async def wait_closed(self) -> None: ...

    def is_closing(self) -> bool: ...

    def on_established(self, callback: Callable[[], None]) -> None: ...

    def add_stats(self, stats: Stats) -> None: ...


class Lane(Protocol):
    """What the channel's packet core posts through: fixed send and receive
    slots of the queue pair (:meth:`~aiordma.QueuePair.open_lane` makes one)."""

    def send(self, slot: int, length: int) -> None:
        """Post the first ``length`` bytes of send slot ``slot``."""

    def hold(self) -> None:
        """Stage the sends that follow, to go as one chain at :meth:`flush`."""

    def flush(self) -> int:
        """Post the staged sends; 0, or an errno (then :attr:`unposted` names
        the send slots that did not go)."""

    @property
    def unposted(self) -> list[int]:
        """The send slots the last failed :meth:`flush` did not post."""

    def recv(self, slot: int) -> None:
        """Post receive slot ``slot``."""

    def send_room(self) -> bool:
        """Whether a send posted now finds room in the send queue."""
