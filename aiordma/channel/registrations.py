"""Registrations of the application's own buffers, kept for the next message.

Registering memory costs more in a guest than moving a megabyte of it, and
an application that receives into (or sends from) the same buffer again and
again would pay that for every message. A :class:`RegistrationCache` keeps
such a buffer's registration after the message, and finds it again for any
message whose bytes lie inside it.

It is safe because a kept registration holds the buffer's export: the
object stays alive, cannot be resized, and its memory cannot be freed or
mapped again while the entry lives, so an address range inside an entry is
always the entry's memory. That is also its cost to the application: a kept
buffer cannot be resized or closed until it is evicted (least recently used
first, once the kept bytes pass ``capacity``), forgotten
(:meth:`RegistrationCache.forget`) or the connection closes. A buffer is kept
only the second time a message uses the same object while the application
still holds it, so buffers used once (a new ``bytearray`` per message) are
never kept, and one that is only remembered is let go as soon as the
application drops it (at the next message).

What a kept registration grants is fixed when it is made (``access``): the
receiver's are local only; the sender's are local only too, and expose a
message through a memory window bound over exactly its bytes.

Call order: ``segment_for`` before each message (None: register for this
one only), and ``unbound`` after each window over a segment it gave is
revoked; ``forget`` and
``clear`` at any time (an entry that work or a window still uses is
released once that is done).
"""

from __future__ import annotations

import collections
import sys
from typing import Any

from aiordma.channel.link import Link
from aiordma.exceptions import ResourceBusyError
from aiordma.lifecycle import spawn
from aiordma.metrics import Stats
from aiordma.verbs.memory import Access, MemoryRegion, Segment, buffer_span

DEFAULT_CAPACITY = 64 << 20
"""Bytes of the application's buffers a channel keeps registered, per direction."""

SIGHTINGS = 16
"""Buffers used once that are remembered, so that a second use is recognised."""

_UNREFERENCED = 4
"""``sys.getrefcount`` of a remembered buffer nobody else references, as
:meth:`RegistrationCache._sighted` looks at it."""


def _exporter(obj: Any) -> Any:
    """The object that owns ``obj``'s memory (``obj`` itself unless it is a view)."""
    return obj.obj if isinstance(obj, memoryview) else obj


def release_mr(mr: MemoryRegion) -> None:
    """Deregister ``mr`` now, or once the work still using it completes."""
    try:
        mr.close()
    except ResourceBusyError:
        spawn(mr.aclose())


class RegistrationCache:
    """The registrations of buffers a channel used more than once, by address range."""

    def __init__(
        self,
        link: Link,
        access: Access,
        capacity: int = DEFAULT_CAPACITY,
        stats: Stats | None = None,
    ) -> None:
        if capacity < 0:
            raise ValueError(f"registration_cache must not be negative, not {capacity}")
        self._link = link
        self._stats = stats
        self.access = access
        """What every kept registration allows."""
        self.capacity = capacity
        """Bytes kept registered at most (0: nothing is kept)."""
        self._entries: collections.OrderedDict[int, MemoryRegion] = collections.OrderedDict()
        """Kept registrations by start address, least recently used first."""
        self._seen: collections.OrderedDict[tuple[int, int, int], Any] = collections.OrderedDict()
        """Buffers used once, by exporter, address and length: held (not
        exported) so that a new object at the same address is not taken for
        them, and dropped once the application no longer references them."""
        self._orphans: set[MemoryRegion] = set()
        """Registrations no longer kept that windows still expose."""
        self.kept_bytes = 0
        """Bytes of the kept registrations."""

    def __len__(self) -> int:
        return len(self._entries)

    def segment_for(self, obj: Any) -> Segment | None:
        """A segment of a kept registration holding exactly ``obj``'s bytes:
        one made before, or made now if ``obj``'s memory was used once
        before; None if not (the caller registers for this message only)."""
        address, length = buffer_span(obj)
        for start, mr in self._entries.items():
            if start <= address and address + length <= start + mr.length and not mr.closed:
                self._entries.move_to_end(start)
                if self._stats is not None:
                    self._stats.add("registrations_reused")
                return mr.segment(address - start, length)
        if length == 0 or length > self.capacity or not self._sighted(obj, address, length):
            return None
        mr = self._link.register(obj, self.access)
        self._keep(mr)
        return mr.segment(0, length)

    def _sighted(self, obj: Any, address: int, length: int) -> bool:
        """Whether this very object's memory was used before (remembering it if not)."""
        exporter = _exporter(obj)
        key = (id(exporter), address, length)
        seen = self._seen
        for other, held in list(seen.items()):
            # Four references: the dict's, the tuple's, ``held`` and the call's.
            if sys.getrefcount(held) <= _UNREFERENCED and other != key:
                del seen[other]  # nobody else holds it: it will not be seen again
        if seen.get(key) is exporter:
            del seen[key]
            return True
        seen[key] = exporter
        if len(seen) > SIGHTINGS:
            seen.popitem(last=False)
        return False

    def _keep(self, mr: MemoryRegion) -> None:
        old = self._entries.pop(mr.addr, None)
        if old is not None:
            self._drop(old)
        self._entries[mr.addr] = mr
        self.kept_bytes += mr.length
        while self.kept_bytes > self.capacity:
            _, oldest = self._entries.popitem(last=False)
            self._drop(oldest)

    def _drop(self, mr: MemoryRegion) -> None:
        self.kept_bytes -= mr.length
        if mr.bound_windows:
            self._orphans.add(mr)  # released once its last window is revoked
        else:
            release_mr(mr)

    def unbound(self, mr: MemoryRegion) -> None:
        """A window over ``mr`` was revoked: release it if it is no longer kept."""
        if mr in self._orphans and not mr.bound_windows:
            self._orphans.discard(mr)
            release_mr(mr)

    def forget(self, obj: Any) -> bool:
        """Stop keeping the registrations that hold ``obj``'s memory (so that it
        can be resized or closed once work on it is done); whether any was kept."""
        address, length = buffer_span(obj)
        found = [
            start
            for start, mr in self._entries.items()
            if start < address + max(length, 1) and address < start + mr.length
        ]
        for start in found:
            self._drop(self._entries.pop(start))
        return bool(found)

    def clear(self) -> None:
        """Stop keeping every registration."""
        entries, self._entries = self._entries, collections.OrderedDict()
        for mr in entries.values():
            self._drop(mr)
        self._seen.clear()
