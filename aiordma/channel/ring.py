"""A receive ring's space, as its writer and its owner account for it (pure logic).

A ring is registered memory one side exposes to its peer alone, for
writing only; the peer puts each medium message there whole, as one RDMA
WRITE WITH IMMEDIATE whose immediate is the record's sequence number. The
owner learns of a record from the receive completion that write consumes
(its ``byte_len`` is the record's length), never by looking at the memory.

Both sides place records by one rule, so no offset travels: records are
:data:`ALIGN`-byte aligned and follow each other; one that would run past
the end goes at the start instead, and the bytes it skipped count as its
own until it is freed. Records are freed in the order they came (messages
are taken in order), and the owner gives the space back in units of
:data:`ALIGN` bytes (:meth:`RingOwner.take_owed`), which the writer adds
to what it may use (:meth:`RingWriter.grant`).

A record is at most a quarter of the ring, so with what it may skip it
takes less than half: a writer waiting for room has more than half the
ring out, and once its reader has caught up, the owner owes more than
half, which is when it gives space back unasked (:meth:`RingOwner.due`).
No wait lasts longer than the reader's. A writer never has more than the
ring, so whatever a peer does it can overwrite only its own unread
records; the owner checks every record against the rule and its grants
and raises :class:`ProtocolError` (which closes that connection) at the
first that breaks them.

Call order, writer: ``reserve -> (post the write) -> ... grant``; owner:
``arrive -> ... free_oldest -> take_owed``.
"""

from __future__ import annotations

import collections
from typing import Final, NamedTuple

from aiordma.exceptions import ProtocolError

ALIGN: Final = 64
"""Records start on multiples of this many bytes; space is counted in these units."""
SEQUENCE_MASK: Final = 0xFFFF_FFFF
"""Sequence numbers are the immediate's 32 bits, wrapping."""
MAX_RING: Final = 0xFFFF * ALIGN
"""The largest ring: what one grant (16 bits of units) can give back at once."""
SHARE: Final = 4
"""A record takes at most ``1 / SHARE`` of its ring."""


def span(length: int) -> int:
    """Bytes a record of ``length`` bytes takes in a ring."""
    return -(-length // ALIGN) * ALIGN


def check_size(size: int) -> None:
    """Raise ValueError unless ``size`` can be a ring's size."""
    if size < SHARE * ALIGN or size % ALIGN or size > MAX_RING:
        raise ValueError(
            f"a ring of {size} bytes: it must be a multiple of {ALIGN}"
            f" from {SHARE * ALIGN} to {MAX_RING}"
        )


class Place(NamedTuple):
    """Where a record goes: its offset, its sequence number and the ring
    bytes it takes (its span and any bytes skipped before it)."""

    offset: int
    sequence: int
    taken: int


def _place(head: int, size: int, length: int) -> tuple[int, int]:
    """(offset, bytes taken) of a record of ``length`` bytes written after ``head``."""
    need = span(length)
    if head + need <= size:
        return head, need
    return 0, size - head + need  # the rest of the ring is skipped


class RingWriter:
    """The writer's view of its peer's ring of ``size`` bytes, ``free`` of
    them granted at the start (usually all)."""

    def __init__(self, size: int, free: int | None = None) -> None:
        check_size(size)
        self.size = size
        self.free = size if free is None else free
        """Bytes this side may still write (granted and not taken)."""
        self._head = 0
        self._sequence = 0

    def fits(self, length: int) -> bool:
        """Whether a record of ``length`` bytes may be written: at most a
        quarter of the ring (:data:`SHARE`)."""
        return length > 0 and span(length) <= self.size // SHARE

    def room_for(self, length: int) -> bool:
        """Whether :meth:`reserve` of ``length`` bytes would succeed now."""
        return self.fits(length) and _place(self._head, self.size, length)[1] <= self.free

    def reserve(self, length: int) -> Place | None:
        """The place of the next record, of ``length`` bytes, with its space
        taken; None (nothing taken) if the grants do not cover it yet."""
        if not self.fits(length):
            raise ValueError(
                f"a record of {length} bytes is more than a quarter of a ring of {self.size}"
            )
        offset, taken = _place(self._head, self.size, length)
        if taken > self.free:
            return None
        self.free -= taken
        self._head = (offset + span(length)) % self.size
        place = Place(offset, self._sequence, taken)
        self._sequence = (self._sequence + 1) & SEQUENCE_MASK
        return place

    def grant(self, units: int) -> None:
        """The owner gave back ``units`` of :data:`ALIGN` bytes;
        :class:`ProtocolError` if that is more than this side has written."""
        returned = units * ALIGN
        if units < 0 or self.free + returned > self.size:
            raise ProtocolError(
                f"peer returned {returned} ring bytes with {self.size - self.free} in use"
            )
        self.free += returned


class RingOwner:
    """The owner's view of its own ring of ``size`` bytes, ``granted`` of
    them given to the writer at the start (usually all)."""

    def __init__(self, size: int, granted: int | None = None) -> None:
        check_size(size)
        self.size = size
        self._writable = size if granted is None else granted
        """Bytes the writer may still take (granted, not yet taken)."""
        self._tail = 0
        self._sequence = 0
        self._held: collections.deque[int] = collections.deque()
        """Bytes each unfreed record takes, oldest first."""
        self._owed = 0
        """Bytes freed and not yet given back."""

    @property
    def held(self) -> int:
        """Records arrived and not yet freed."""
        return len(self._held)

    @property
    def owed(self) -> int:
        """Bytes freed and not yet given back (a multiple of :data:`ALIGN`)."""
        return self._owed

    def arrive(self, sequence: int, length: int) -> int:
        """A record of ``length`` bytes arrived with immediate ``sequence``:
        its offset, once checked against the rule and the grants
        (:class:`ProtocolError` if it breaks either)."""
        if sequence != self._sequence:
            raise ProtocolError(f"ring record {sequence} arrived where {self._sequence} was due")
        if length <= 0 or span(length) > self.size // SHARE:
            raise ProtocolError(f"ring record of {length} bytes in a ring of {self.size}")
        offset, taken = _place(self._tail, self.size, length)
        if taken > self._writable:
            raise ProtocolError(f"peer wrote {taken} ring bytes with {self._writable} granted")
        self._writable -= taken
        self._tail = (offset + span(length)) % self.size
        self._sequence = (self._sequence + 1) & SEQUENCE_MASK
        self._held.append(taken)
        return offset

    def free_oldest(self) -> int:
        """Free the oldest record's space (it has been taken); the bytes now owed."""
        if not self._held:
            raise RuntimeError("no ring record to free")
        self._owed += self._held.popleft()
        return self._owed

    def due(self) -> bool:
        """Whether the space owed must go back now, in a packet of its own
        if no other is going (half the ring or more); less rides on the
        packets that go anyway."""
        return self._owed * 2 >= self.size

    def take_owed(self, limit: int = 0xFFFF) -> int:
        """The units of :data:`ALIGN` bytes to give back now (at most
        ``limit``), counted as granted again."""
        units = min(self._owed // ALIGN, limit)
        self._owed -= units * ALIGN
        self._writable += units * ALIGN
        return units
