# cython: annotation_typing=True
"""The messages that arrived and wait to be taken: each one's owner and its one state.

:class:`Inbox` holds one channel side's queue of arrived messages, in
order, and is the only object that changes one. Each queued message is an
:class:`Arrival` whose :class:`Phase` says where its bytes are and who
handles it; every change of phase goes through one step,
:meth:`Inbox.step`, checked against :data:`TRANSITIONS` (asyncpg's
``_set_state``), so a message cannot be read ahead twice, answered twice
or taken while read. What a step owes the sender (a DONE answering a
REVOKE, or one ending an exposure) comes back from it.

The inbox also splits BATCH packets, reassembles MEDIUM messages from
their PIECEs (copying them as they land when a receive waits, see
:meth:`Inbox.fill`), copies messages out for the take paths, keeps the read
ahead's bookkeeping and saves what arrived whole when the channel fails.
It does no I/O: the receive buffers whose bytes were copied out are listed
in :attr:`Inbox.freed`, which :class:`~aiordma.channel.packets.Packets`
(the wire) reposts after each call. Compiled (``inbox.pxd``), Packets calls
it in C, with no Python frame on the wake-up path.

Call order: ``(arrived | revoke | fill | filled | sink | step | take)* ->
close`` (``close`` once; afterwards only :attr:`~Phase.COPIED` messages are read).
"""

from __future__ import annotations

import collections
import contextlib
import enum
from typing import TYPE_CHECKING

from aiordma.channel.buffers import Into, buffer_view
from aiordma.channel.wire import HEADER_SIZE, WIRE, Header, Kind, WireCodes, batch_entries
from aiordma.exceptions import ProtocolError

if TYPE_CHECKING:
    from typing import TypeAlias

    from aiordma import _cython_shim as cython

    Taken: TypeAlias = tuple["Arrival", int]
    """What :meth:`Inbox.take` returns: the message and what it owed (:class:`Owed`)."""
else:
    try:
        import cython
    except ImportError:  # no Cython: the declarations below mean nothing
        from aiordma import _cython_shim as cython

_WIRE = cython.declare(WireCodes, WIRE)  # the wire's codes as C integers

View = memoryview  # (an alias: typed with it, Cython would check its own memoryview type)


class Phase(enum.IntEnum):
    """Where a queued message's bytes are, and who handles it."""

    IN_BUFFER = 0
    """Eager or MEDIUM: its head and body are in receive buffers (``slot`` and ``pieces``)."""
    COPIED = 1
    """Its head and body are in ``copied`` (a BATCH's message, or one saved
    when the channel failed); ``slot``, if any, is the buffer it still holds."""
    TAKING = 2
    """MEDIUM: a receive copies it out (its first buffer went back)."""
    KEPT = 3
    """MEDIUM: a cancelled receive kept its head and the body it copied in
    ``copied``; the next receive resumes from there."""
    ANNOUNCED = 4
    """Rendezvous: its body waits in the sender's memory; nothing reads it."""
    READING = 5
    """Rendezvous: its receive reads the body."""
    AHEAD = 6
    """Rendezvous: its body is read ahead of its receive, into ``landed``."""
    LANDED = 7
    """Rendezvous: read ahead whole into ``landed``; its sender was told DONE."""
    REVOKED_READING = 8
    """Rendezvous: its sender withdrew it (REVOKE) while its receive reads it."""
    REVOKED_AHEAD = 9
    """Rendezvous: withdrawn while read ahead."""
    REVOKED = 10
    """Rendezvous: withdrawn, and the sender answered or to be: taking it raises."""
    TAKEN = 11
    """Off the queue."""
    IN_RING = 12
    """RECORD: its head and body are in the receive ring, at ``ring``."""


class Step(enum.IntEnum):
    """What happens to a queued message (see :data:`TRANSITIONS`)."""

    REVOKE = 0
    """Its sender withdrew it."""
    READ = 1
    """Its receive starts reading its body."""
    READ_AHEAD = 2
    """Its body starts being read before its receive."""
    STOP = 3
    """A read of its body failed or was cancelled."""
    LAND = 4
    """A read ahead landed whole."""
    BEGIN = 5
    """A receive starts copying a MEDIUM message out (or resumes)."""
    KEEP = 6
    """That receive was cancelled, keeping what it copied."""
    SAVE = 7
    """The channel failed: its bytes are copied out of the buffers."""
    TAKE = 8
    """It is taken off the queue."""


class Owed(enum.IntEnum):
    """What a step owes the message's sender."""

    NOTHING = 0
    ANSWER = 1
    """A DONE answering its REVOKE, sent once no read is in flight (:attr:`Inbox.acks_due`)."""
    DONE = 2
    """A DONE now: its exposure may end."""
    DROPPED = 3
    """Nothing, and it is not counted received (a withdrawn message taken)."""


_P = Phase
_S = Step
_O = Owed
TRANSITIONS: dict[tuple[Phase, Step], tuple[Phase, Owed]] = {
    # A REVOKE is answered at once if nothing reads the body, else once the
    # read stops; a DONE that went (read ahead) or goes (taken) answers it too.
    (_P.ANNOUNCED, _S.REVOKE): (_P.REVOKED, _O.ANSWER),
    (_P.READING, _S.REVOKE): (_P.REVOKED_READING, _O.NOTHING),
    (_P.AHEAD, _S.REVOKE): (_P.REVOKED_AHEAD, _O.NOTHING),
    (_P.LANDED, _S.REVOKE): (_P.REVOKED, _O.NOTHING),  # its DONE crossed the REVOKE
    (_P.REVOKED_READING, _S.REVOKE): (_P.REVOKED_READING, _O.NOTHING),
    (_P.REVOKED_AHEAD, _S.REVOKE): (_P.REVOKED_AHEAD, _O.NOTHING),
    (_P.REVOKED, _S.REVOKE): (_P.REVOKED, _O.NOTHING),
    (_P.ANNOUNCED, _S.READ): (_P.READING, _O.NOTHING),
    (_P.ANNOUNCED, _S.READ_AHEAD): (_P.AHEAD, _O.NOTHING),
    (_P.READING, _S.STOP): (_P.ANNOUNCED, _O.NOTHING),
    (_P.AHEAD, _S.STOP): (_P.ANNOUNCED, _O.NOTHING),
    (_P.REVOKED_READING, _S.STOP): (_P.REVOKED, _O.ANSWER),
    (_P.REVOKED_AHEAD, _S.STOP): (_P.REVOKED, _O.ANSWER),
    (_P.AHEAD, _S.LAND): (_P.LANDED, _O.DONE),
    (_P.REVOKED_AHEAD, _S.LAND): (_P.REVOKED, _O.DONE),  # the DONE answers the REVOKE
    (_P.IN_BUFFER, _S.BEGIN): (_P.TAKING, _O.NOTHING),
    (_P.KEPT, _S.BEGIN): (_P.TAKING, _O.NOTHING),
    (_P.TAKING, _S.KEEP): (_P.KEPT, _O.NOTHING),
    (_P.IN_BUFFER, _S.SAVE): (_P.COPIED, _O.NOTHING),
    (_P.KEPT, _S.SAVE): (_P.COPIED, _O.NOTHING),
    (_P.IN_BUFFER, _S.TAKE): (_P.TAKEN, _O.NOTHING),
    (_P.COPIED, _S.TAKE): (_P.TAKEN, _O.NOTHING),
    (_P.TAKING, _S.TAKE): (_P.TAKEN, _O.NOTHING),
    (_P.ANNOUNCED, _S.TAKE): (_P.TAKEN, _O.DONE),
    (_P.READING, _S.TAKE): (_P.TAKEN, _O.DONE),
    (_P.REVOKED_READING, _S.TAKE): (_P.TAKEN, _O.DONE),  # read whole: the DONE answers
    (_P.LANDED, _S.TAKE): (_P.TAKEN, _O.NOTHING),  # its DONE went when it landed
    (_P.REVOKED, _S.TAKE): (_P.TAKEN, _O.DROPPED),
    (_P.IN_RING, _S.SAVE): (_P.COPIED, _O.NOTHING),
    (_P.IN_RING, _S.TAKE): (_P.TAKEN, _O.NOTHING),
}
"""Every step a queued message may take: ``(phase, step) -> (next phase,
what is owed)``. Any other step is a bug of this side, and raises."""

_STEPS = cython.declare(cython.int, len(Step))


def _table() -> bytes:
    """:data:`TRANSITIONS` as one byte per ``(phase, step)``: 0 for no such
    step, else one more than the next phase plus 16 times what is owed
    (below 128, so a signed char reads it as well)."""
    table = bytearray(len(Phase) * len(Step))
    for (phase, step), (after, owed) in TRANSITIONS.items():
        table[phase * len(Step) + step] = 1 + (after | owed << 4)
    return bytes(table)


_TABLE = cython.declare(bytes, _table())

_IN_BUFFER = cython.declare(cython.int, Phase.IN_BUFFER)
_COPIED = cython.declare(cython.int, Phase.COPIED)
_TAKING = cython.declare(cython.int, Phase.TAKING)
_KEPT = cython.declare(cython.int, Phase.KEPT)
_ANNOUNCED = cython.declare(cython.int, Phase.ANNOUNCED)
_READING = cython.declare(cython.int, Phase.READING)
_AHEAD = cython.declare(cython.int, Phase.AHEAD)
_LANDED = cython.declare(cython.int, Phase.LANDED)
_REVOKED_READING = cython.declare(cython.int, Phase.REVOKED_READING)
_REVOKED_AHEAD = cython.declare(cython.int, Phase.REVOKED_AHEAD)
_REVOKED = cython.declare(cython.int, Phase.REVOKED)
_IN_RING = cython.declare(cython.int, Phase.IN_RING)
_ANSWER = cython.declare(cython.int, Owed.ANSWER)
_DONE = cython.declare(cython.int, Owed.DONE)
_REVOKE = cython.declare(cython.int, Step.REVOKE)
_READ = cython.declare(cython.int, Step.READ)
_READ_AHEAD = cython.declare(cython.int, Step.READ_AHEAD)
_STOP = cython.declare(cython.int, Step.STOP)
_LAND = cython.declare(cython.int, Step.LAND)
_BEGIN = cython.declare(cython.int, Step.BEGIN)
_KEEP = cython.declare(cython.int, Step.KEEP)
_SAVE = cython.declare(cython.int, Step.SAVE)
_TAKE = cython.declare(cython.int, Step.TAKE)


@cython.cclass
class Arrival:
    """A message that arrived and waits to be taken (its :class:`Phase` says how).

    ``slot``: the receive buffer it holds (-1: none, or none any more).
    ``size``: bytes of its first packet. ``copied``: its head and body
    copied out of the buffers (whole when :attr:`~Phase.COPIED`, the part
    a cancelled receive took when :attr:`~Phase.KEPT`). A MEDIUM message
    also has ``pieces``, the ``(slot, length)`` of each PIECE that arrived
    and was not copied yet, and ``missing``, the body bytes still to
    arrive. ``landed``: the buffer a read ahead puts its body in. ``ring``:
    where a RECORD starts in the receive ring (-1: not in the ring).
    """

    def __init__(self, slot: cython.int, header: Header, size: cython.Py_ssize_t,
                 phase: cython.int) -> None:  # fmt: skip
        self.slot = slot
        self.header = header
        self.size = size
        self.phase = phase
        self.copied: bytes | None = None
        self.pieces: collections.deque[tuple[int, int]] | None = None
        self.missing = 0
        self.landed: bytearray | None = None
        self.ring = -1

    def __repr__(self) -> str:
        return (f"Arrival({Phase(self.phase).name}, slot={self.slot}, header={self.header!r}, "
                f"size={self.size})")  # fmt: skip


_NO_TARGET = memoryview(bytearray())
"""What :meth:`Inbox.sink` copies into when nothing is being filled."""


@cython.cclass
class Inbox:
    """The queued messages of one channel side, in the receive slots of
    ``view`` (slot ``i`` is bytes ``[i * size, (i + 1) * size)``), none
    above ``max_message`` bytes."""

    def __init__(self, view: memoryview, size: cython.Py_ssize_t,
                 max_message: cython.ulonglong) -> None:  # fmt: skip
        self.view = view
        self.size = size
        self.max_message = max_message
        self.open = True
        """False once :meth:`close` ran: the buffers are no longer read."""
        self.ready: collections.deque[Arrival] = collections.deque()
        self.filling: Arrival | None = None
        """The MEDIUM message whose PIECEs are still arriving."""
        self.acks_due: list[int] = []
        """Ids of revoked messages to answer with DONE once no read is in flight."""
        self.freed: list[int] = []
        """Receive buffers copied out since the wire last reposted (it empties this)."""
        self.ahead: Arrival | None = None
        """The message read ahead of its receive (reading or landed), until taken."""
        self.new_objects = False
        """Whether the last large message was taken as a new object (then
        the next one queued is read ahead)."""
        self.sink: Arrival | None = None
        """The MEDIUM message whose PIECEs are copied as they land (:meth:`fill`)."""
        self.ring_view: memoryview = _NO_TARGET
        """The receive ring RECORDs are written into (empty: none)."""
        self._sink_target: View = _NO_TARGET
        self._sink_offset = 0

    # -- the one step ------------------------------------------------------

    @cython.ccall
    @cython.exceptval(-1, check=True)
    def step(self, arrival: Arrival, step: cython.int) -> cython.int:
        """Move ``arrival`` by ``step`` (:data:`TRANSITIONS`); returns what it
        owes (:class:`Owed`). A REVOKE's answer is queued in :attr:`acks_due`."""
        entry: cython.int = _TABLE[arrival.phase * _STEPS + step] - 1
        if entry < 0:
            raise RuntimeError(f"{arrival!r} cannot take the step {Step(step).name}")
        arrival.phase = entry & 0x0F
        owed: cython.int = entry >> 4
        if owed == _ANSWER:
            self.acks_due.append(arrival.header.msg_id)
        return owed

    # -- arriving ------------------------------------------------------------

    @cython.ccall
    @cython.exceptval(-1, check=True)
    def arrived(self, slot: cython.int, header: Header, size: cython.Py_ssize_t) -> cython.int:
        """A message's packet of ``size`` bytes (its credits applied) landed in
        ``slot``: queue what it carries. Returns how many messages may be
        offered to a delivery hook (the eager ones just queued, when nothing
        was queued before them). Raises :class:`ProtocolError` for a packet
        out of place."""
        code: cython.int = header.code
        filling: Arrival | None = self.filling
        if code == _WIRE.piece:
            if filling is None:
                raise ProtocolError("a PIECE with no medium message to continue")
            if header.length > filling.missing:
                raise ProtocolError(
                    f"a PIECE of {header.length} bytes where {filling.missing} are missing"
                )
            filling.pieces.append((slot, header.length))  # type: ignore[union-attr]
            filling.missing -= header.length
            if filling.missing == 0:
                self.filling = None
            return 0
        if filling is not None:
            raise ProtocolError(
                f"a message began before the {filling.missing} bytes still missing of "
                "the medium message before it"
            )
        ready = self.ready
        if code == _WIRE.batch:
            offered: cython.bint = not ready
            count: cython.Py_ssize_t = self._split(slot, header)
            return count if offered else 0
        arrival = Arrival(slot, header, size,
                          _ANNOUNCED if code == _WIRE.rendezvous else _IN_BUFFER)  # fmt: skip
        ready.append(arrival)
        if code == _WIRE.medium:
            arrival.pieces = collections.deque()
            arrival.missing = header.length - (size - _WIRE.header_size - header.head_length)
            self.filling = arrival
        return code == _WIRE.eager and len(ready) == 1

    @cython.cfunc
    @cython.exceptval(-1, check=True)
    def _split(self, slot: cython.int, header: Header) -> cython.Py_ssize_t:
        """Queue the messages of the BATCH packet in ``slot``, each copied out;
        how many. The last holds the buffer: it goes back, and its credit
        with it, when that one is taken, so a reader that falls behind
        still holds its sender back."""
        start: cython.Py_ssize_t = slot * self.size + _WIRE.header_size
        with self.view[start : start + header.length] as payload:
            entries = batch_entries(payload, header.msg_id, self.max_message)
            last: cython.Py_ssize_t = len(entries) - 1
            for i, (at, head, n) in enumerate(entries):
                part = Header(Kind.EAGER, 0, 0, n, None, head)
                arrival = Arrival(slot if i == last else -1, part, HEADER_SIZE + head + n,
                                  _COPIED)  # fmt: skip
                arrival.copied = bytes(payload[at : at + head + n])
                self.ready.append(arrival)
        return last + 1

    @cython.ccall
    def arrived_record(
        self, header: Header, offset: cython.Py_ssize_t, size: cython.Py_ssize_t
    ) -> None:
        """A RECORD of ``size`` bytes (its credits applied, its place checked)
        was written at ``offset`` of the ring: queue its message. Raises
        :class:`ProtocolError` while a MEDIUM message misses pieces."""
        if self.filling is not None:
            raise ProtocolError(
                f"a message began before the {self.filling.missing} bytes still missing of "
                "the medium message before it"
            )
        arrival = Arrival(-1, header, size, _IN_RING)
        arrival.ring = offset
        self.ready.append(arrival)

    @cython.ccall
    def revoke(self, msg_id: cython.ulonglong) -> None:
        """The sender withdrew its large message ``msg_id`` (if still queued:
        else its DONE crossed the REVOKE, which that answers)."""
        arrival: Arrival
        header: Header
        for arrival in self.ready:
            header = arrival.header
            if header.code == _WIRE.rendezvous and header.msg_id == msg_id:
                self.step(arrival, _REVOKE)

    def acks(self) -> list[int]:
        """Take the ids of the revoked messages due an answer (a DONE each)."""
        due = self.acks_due
        self.acks_due = []
        return due

    # -- reading -----------------------------------------------------------

    def first(self) -> Arrival | None:
        """The first queued message, if one is there and readable (once
        closed, only one copied out)."""
        ready = self.ready
        if ready:
            arrival: Arrival = ready[0]
            if self.open or arrival.phase == _COPIED:
                return arrival
        return None

    @cython.ccall
    def eager_first(self) -> Arrival | None:
        """The first queued message, if it is a small one and readable."""
        ready = self.ready
        if ready and self.open:
            arrival: Arrival = ready[0]
            if arrival.header.code == _WIRE.eager:
                return arrival
        return None

    def queued(self) -> int:
        """Messages queued (arrived and not taken)."""
        return len(self.ready)

    def withdrawn(self, arrival: Arrival) -> bool:
        """Whether the sender withdrew ``arrival`` (taking it raises)."""
        return arrival.phase in (_REVOKED, _REVOKED_READING, _REVOKED_AHEAD)

    @cython.cfunc
    def _source(self, arrival: Arrival) -> View:
        """The memory a queued message's packet is in: its receive buffer's
        region, or the ring (see :meth:`_start`)."""
        return self.ring_view if arrival.phase == _IN_RING else self.view

    @cython.cfunc
    @cython.exceptval(-1, check=True)
    def _start(self, arrival: Arrival) -> cython.Py_ssize_t:
        """Where a queued message's head starts in :meth:`_source`."""
        if arrival.phase == _IN_RING:
            return arrival.ring + _WIRE.header_size
        return arrival.slot * self.size + _WIRE.header_size

    @cython.ccall
    def head(self, arrival: Arrival) -> bytes:
        """The head of a queued message."""
        header: Header = arrival.header
        if arrival.copied is not None:
            return arrival.copied[: header.head_length]
        start: cython.Py_ssize_t = self._start(arrival)
        return bytes(self._source(arrival)[start : start + header.head_length])

    @cython.ccall
    def small_body(self, arrival: Arrival, into: Into | None) -> bytes | int:
        """An eager, copied or RECORD message's body: a copy, or its length
        once put in ``into`` (long enough: checked by the caller)."""
        header: Header = arrival.header
        length: cython.Py_ssize_t = header.length
        if arrival.phase == _COPIED:
            body = arrival.copied[header.head_length :]  # type: ignore[index]
            if into is None:
                return body
            with buffer_view(into) as target:
                target[:length] = body
            return length
        start: cython.Py_ssize_t = self._start(arrival) + header.head_length
        source = self._source(arrival)
        if cython.compiled and self.open:
            copied = copy_out(source, start, length, into)
            if copied is not None:
                return copied
        data = source[start : start + length]
        if into is None:
            return bytes(data)
        with buffer_view(into) as target:
            target[:length] = data
        return length

    def offered(self, arrival: Arrival) -> tuple[bytes, memoryview]:
        """An eager message's head, and a view of its body straight from its
        buffer (or its copy) for a delivery hook; the caller releases it."""
        header: Header = arrival.header
        start: cython.Py_ssize_t = 0
        if arrival.phase == _COPIED:
            whole = memoryview(arrival.copied)  # type: ignore[arg-type]
        else:
            start = arrival.slot * self.size + _WIRE.header_size
            whole = self.view
        end: cython.Py_ssize_t = start + header.head_length
        return bytes(whole[start:end]), whole[end : end + header.length]

    @cython.ccall
    def take(self) -> Taken:
        """Take the first queued message off: returns it and what it owed
        (:class:`Owed`); the buffer it held is :attr:`freed`."""
        arrival: Arrival = self.ready.popleft()
        owed: cython.int = self.step(arrival, _TAKE)
        if arrival.slot >= 0:  # (not a MEDIUM message's, given back already)
            self.freed.append(arrival.slot)
            arrival.slot = -1
        if arrival is self.ahead:
            self.ahead = None
        arrival.landed = None
        return arrival, owed

    # -- MEDIUM messages ---------------------------------------------------

    @cython.ccall
    @cython.exceptval(-2, check=True)
    def take_medium(self, into: Into) -> cython.Py_ssize_t:
        """Copy the first queued message into ``into`` (a ``bytearray`` or
        ``memoryview``) if it is a RECORD, or a MEDIUM one in its buffers
        whose pieces all arrived, and it fits: its length (a MEDIUM one is
        then :attr:`~Phase.TAKING`, its buffers :attr:`freed`; the caller
        :meth:`take` s it); -1 if not."""
        ready = self.ready
        if not ready or not self.open:
            return -1
        arrival: Arrival = ready[0]
        header: Header = arrival.header
        if type(into) is not bytearray and type(into) is not memoryview:
            return -1
        if arrival.phase == _IN_RING:  # a RECORD: whole in the ring
            room: cython.Py_ssize_t
            if type(into) is bytearray:
                room = len(into)
            elif type(into) is memoryview:
                room = into.nbytes
            else:
                return -1
            if room < header.length:
                return -1
            copied = self.small_body(arrival, into)
            assert isinstance(copied, int)
            return copied
        if header.code != _WIRE.medium or arrival.missing or arrival.phase != _IN_BUFFER:
            return -1
        with buffer_view(into) as target:
            if len(target) < header.length:
                return -1
            self.step(arrival, _BEGIN)
            offset = self._first_packet(arrival, target)
            return self.copy_pieces(arrival, target, offset)

    def begin_medium(self, arrival: Arrival, target: View) -> tuple[bytes, int]:
        """Start taking a MEDIUM message into ``target`` (a flat writable view
        of its body): copy what its first packet carried, or what a cancelled
        receive kept of it. Returns its head and how far the body is filled."""
        kept: cython.bint = arrival.phase == _KEPT
        self.step(arrival, _BEGIN)
        header: Header = arrival.header
        head_length: cython.Py_ssize_t = header.head_length
        if kept:  # a cancelled receive copied this much
            copied: bytes = arrival.copied  # type: ignore[assignment]
            arrival.copied = None
            offset: cython.Py_ssize_t = len(copied) - head_length
            target[:offset] = memoryview(copied)[head_length:]
            return copied[:head_length], offset
        start: cython.Py_ssize_t = arrival.slot * self.size + _WIRE.header_size
        head = bytes(self.view[start : start + head_length])
        return head, self._first_packet(arrival, target)

    @cython.cfunc
    @cython.exceptval(-1, check=True)
    def _first_packet(self, arrival: Arrival, target: View) -> cython.Py_ssize_t:
        """Copy the body bytes of a MEDIUM message's first packet to the start
        of ``target``, freeing its buffer; how many were copied."""
        start: cython.Py_ssize_t = arrival.slot * self.size + _WIRE.header_size
        end: cython.Py_ssize_t = start + arrival.size - _WIRE.header_size
        start += arrival.header.head_length
        target[: end - start] = self.view[start:end]
        self.freed.append(arrival.slot)
        arrival.slot = -1
        return end - start

    @cython.ccall
    @cython.exceptval(-1, check=True)
    def copy_pieces(
        self, arrival: Arrival, target: View, offset: cython.Py_ssize_t
    ) -> cython.Py_ssize_t:
        """Copy every PIECE of ``arrival`` (being taken) that arrived into
        ``target`` (a flat writable view of its body, filled up to
        ``offset``), freeing each buffer; returns how far the body is filled."""
        pieces = arrival.pieces
        slot: cython.int
        length: cython.Py_ssize_t
        start: cython.Py_ssize_t
        while pieces:
            slot, length = pieces.popleft()
            start = slot * self.size + _WIRE.header_size
            if not (cython.compiled and self.open and copy_within(
                target, offset, self.view, start, length
            )):  # fmt: skip
                target[offset : offset + length] = self.view[start : start + length]
            offset += length
            self.freed.append(slot)
        return offset

    def fill(self, arrival: Arrival, target: View, offset: int) -> None:
        """Copy the PIECEs of ``arrival`` (being taken, not yet whole, its
        pieces so far copied) into ``target`` as they land (:meth:`sink`);
        its receiving task is woken once the body is whole, not for each
        piece. Call order: ``fill -> (await arrivals) -> filled``."""
        self.sink = arrival
        self._sink_target = target
        self._sink_offset = offset

    def filled(self) -> int:
        """Stop :meth:`fill`; how far the body is filled."""
        self.sink = None
        self._sink_target = _NO_TARGET
        return self._sink_offset

    @cython.ccall
    @cython.exceptval(-1, check=True)
    def sink_pieces(self) -> cython.bint:
        """A PIECE landed: copy it (and any before it) for :meth:`fill`, if a
        receive waits for it; whether the body is now whole."""
        sink: Arrival | None = self.sink
        if sink is None:
            return False
        self._sink_offset = self.copy_pieces(sink, self._sink_target, self._sink_offset)
        if self._sink_offset == sink.header.length:
            self.sink = None  # whole: its task wakes
            return True
        return False

    def keep(self, arrival: Arrival, head: bytes, target: View, offset: int) -> None:
        """A receive taking a MEDIUM message was cancelled with its body filled
        up to ``offset``: keep that, and the next receive resumes from it."""
        self.step(arrival, _KEEP)
        arrival.copied = head + bytes(target[:offset])

    # -- large messages' reads ---------------------------------------------

    def unread(self, least: int) -> list[Arrival]:
        """The queued large messages of more than ``least`` bytes that nothing
        reads or read and the sender did not withdraw, in order (none once
        closed)."""
        if not self.open:
            return []
        found: list[Arrival] = []
        arrival: Arrival
        for arrival in self.ready:
            if arrival.phase == _ANNOUNCED and arrival.header.length > least:
                found.append(arrival)
        return found

    def read_started(self, arrival: Arrival) -> None:
        """``arrival``'s receive starts reading its body."""
        self.step(arrival, _READ)

    def read_ahead(self, arrival: Arrival, landed: bytearray) -> None:
        """``arrival``'s body starts being read into ``landed`` before its receive."""
        self.step(arrival, _READ_AHEAD)
        self.ahead = arrival
        arrival.landed = landed

    def read_landed(self, arrival: Arrival) -> bool:
        """A read ahead of ``arrival`` landed whole (it stays queued): whether
        its sender is owed a DONE now (that also answers a REVOKE that came
        meanwhile)."""
        return self.step(arrival, _LAND) == _DONE

    def read_stopped(self, arrival: Arrival) -> None:
        """A read of ``arrival``'s body failed or was cancelled (it stays
        queued); a REVOKE that came meanwhile is due an answer now."""
        self.step(arrival, _STOP)
        arrival.landed = None

    def forget_ahead(self) -> None:
        """The read ahead failed: its message is read in its turn."""
        self.ahead = None

    # -- closing -----------------------------------------------------------

    def close(self, save: bool, release: bool) -> list[int]:
        """The channel failed: read no buffer again, but copy out what arrived
        whole first if ``save`` (as TCP keeps it: small messages and whole
        MEDIUM ones), and release the view of the buffers. With
        ``release`` (the buffers are a shared pool's), returns every buffer
        the queue holds, each now held no more."""
        if not self.open:
            return []
        if save:
            arrival: Arrival
            for arrival in self.ready:
                if arrival.phase == _IN_RING:
                    start = arrival.ring + _WIRE.header_size
                    arrival.copied = bytes(self.ring_view[start : arrival.ring + arrival.size])
                    self.step(arrival, _SAVE)
                    continue
                if arrival.phase != _IN_BUFFER and arrival.phase != _KEPT:
                    continue
                code = arrival.header.code
                if code == _WIRE.eager:
                    start = arrival.slot * self.size
                    arrival.copied = bytes(
                        self.view[start + _WIRE.header_size : start + arrival.size]
                    )
                    self.step(arrival, _SAVE)
                elif code == _WIRE.medium and arrival.missing == 0:
                    arrival.copied = self._medium_bytes(arrival)
                    self.step(arrival, _SAVE)
        self.open = False
        held: list[int] = []
        if release:
            for arrival in self.ready:
                if arrival.slot >= 0:
                    held.append(arrival.slot)
                    arrival.slot = -1
                while arrival.pieces:
                    held.append(arrival.pieces.popleft()[0])
        with contextlib.suppress(BufferError):  # a delivery hook still holds a body
            self.view.release()
        self.ring_view = _NO_TARGET  # (its region releases it)
        return held

    def _medium_bytes(self, arrival: Arrival) -> bytes:
        """A whole MEDIUM message's head and body, copied out of its buffers."""
        view = self.view
        parts: list[bytes] = []
        if arrival.copied is not None:  # kept by a cancelled receive
            parts.append(arrival.copied)
        else:
            start = arrival.slot * self.size
            parts.append(bytes(view[start + HEADER_SIZE : start + arrival.size]))
        assert arrival.pieces is not None
        for slot, length in arrival.pieces:
            start = slot * self.size + HEADER_SIZE
            parts.append(bytes(view[start : start + length]))
        return b"".join(parts)


if not cython.compiled:  # inbox.pxd's C helpers, never called interpreted

    def copy_out(view: object, offset: int, n: int, into: object) -> bytes | int | None:
        raise NotImplementedError

    def copy_within(target: object, offset: int, source: object, start: int, n: int) -> bool:
        raise NotImplementedError
