# cython: annotation_typing=True
"""What one side of a message channel knows, without any I/O (pure logic).

:class:`ChannelState` holds the protocol state of a
:class:`~aiordma.MessageChannel`: credits both ways, which send slots are
free, the messages that arrived and wait to be taken (and the peer's
revocations of them), the peer's announced ``max_message``, and which
credit update, if any, is due. Only :class:`~aiordma.channel.packets.Packets`
drives it, and does the I/O, as httpcore drives h11; keeping the decisions
here lets them be tested on a host without a device. (The bytes this side
exposes are counted apart, by :class:`~aiordma.channel.ledger.Ledger`.)

Per message, three events go in and each returns what the channel must do:
:meth:`~ChannelState.send` (a slot and a stamped header, or not yet),
:meth:`~ChannelState.arrived` (what ended, whether to offer the message to
a delivery hook, whether to repost the buffer) and :meth:`~ChannelState.take`
(the arrival, whether its sender is owed a DONE). :meth:`~ChannelState.update`
and :meth:`~ChannelState.sent` complete the sending side.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING

from aiordma.channel.credits import CreditWindow, DataCredits
from aiordma.channel.wire import HEADER_SIZE, LAST_CREDIT, WIRE, Header, Kind, WireCodes
from aiordma.exceptions import ProtocolError
from aiordma.verbs.memory import RemoteBuffer

if TYPE_CHECKING:
    from typing import TypeAlias

    from aiordma import _cython_shim as cython

    # For the type checker only (compiled, these methods return objects).
    Packet: TypeAlias = tuple[int, Header]
    """A packet :meth:`ChannelState.send` granted: its send slot and stamped header."""
    Arrived: TypeAlias = tuple[int, bool, bool]
    """What :meth:`ChannelState.arrived` returns."""
    Taken: TypeAlias = tuple["Arrival", bool]
    """What :meth:`ChannelState.take` returns."""
else:
    try:
        import cython
    except ImportError:  # no Cython: the declarations below mean nothing
        from aiordma import _cython_shim as cython


def hello_windows(header: Header) -> tuple[int, int]:
    """The data and control windows a HELLO announces (in its ``msg_id``)."""
    return header.msg_id & 0xFFFFFFFF, header.msg_id >> 32


@cython.cclass
class Arrival:
    """A message that arrived and waits to be taken.

    ``slot``: the receive buffer it sits in. ``size``: bytes of the packet
    (header, head and, when eager, body). ``saved``: head and body of an
    eager message, copied out when the connection failed. ``revoked``: the
    sender withdrew this rendezvous message (REVOKE). ``reading``: this side
    is reading the rendezvous body now. ``acked``: this side answered the
    sender's REVOKE (a DONE that says it will not read). A MEDIUM message
    also has ``pieces``, the ``(slot, length)`` of each PIECE that arrived
    and was not taken yet, and ``missing``, the body bytes still to arrive;
    ``taken`` holds its head and the body bytes a receive took before it
    was cancelled (``slot`` is then -1: the first buffer went back).
    """

    def __init__(
        self, slot: cython.int, header: Header, size: cython.Py_ssize_t,
        saved: bytes | None = None,
    ) -> None:  # fmt: skip
        self.slot = slot
        self.header = header
        self.size = size
        self.saved = saved
        self.revoked = False
        self.reading = False
        self.acked = False
        self.pieces: collections.deque[tuple[int, int]] | None = None
        self.missing = 0
        self.taken: bytes | None = None

    def __repr__(self) -> str:
        return (f"Arrival(slot={self.slot}, header={self.header!r}, size={self.size}, "
                f"revoked={self.revoked}, reading={self.reading}, acked={self.acked})")  # fmt: skip


_WIRE = cython.declare(WireCodes, WIRE)  # the wire's codes as C integers

# What each kind of packet spends: a data credit, a control credit but not
# the last (kept for updates), or any control credit.
_DATA = cython.declare(cython.int, 0)
_CONTROL = cython.declare(cython.int, 1)
_CONTROL_UPDATE = cython.declare(cython.int, 2)


@cython.cfunc
def _cost(code: cython.int) -> cython.int:
    """What a packet of kind ``code`` spends (the last control credit is kept for updates)."""
    if code in (_WIRE.eager, _WIRE.rendezvous, _WIRE.medium, _WIRE.piece, _WIRE.batch):
        return _DATA
    if code == _WIRE.control_credit:
        return _CONTROL_UPDATE
    return _CONTROL


@cython.cclass
class ChannelState:
    """Credits, send slots, arrivals and exposures of one channel side.

    ``buffers`` receive slots are split into a data ``window`` and a
    ``control_window`` (see :mod:`aiordma.channel.credits`); ``send_slots`` (as many
    by default) hold packets being sent. ``data`` replaces the data credits
    of a side whose receive buffers come from a shared pool.
    """

    def __init__(
        self,
        window: int,
        control_window: int,
        *,
        send_slots: int | None = None,
        data: DataCredits | None = None,
    ) -> None:
        self.data = DataCredits(window) if data is None else data
        self.control = CreditWindow(control_window)
        self.buffers = window + control_window
        send_slots = self.buffers if send_slots is None else send_slots
        if send_slots < 2:
            raise ValueError("a channel needs at least 2 send slots")
        self.send_slots = send_slots
        self.free_slots = list(range(send_slots))
        self.said_hello = False
        """Whether our HELLO went: it carries our first grants, so no credit
        update may go before it."""
        self.failed = False
        self.ready: collections.deque[Arrival] = collections.deque()
        self.filling: Arrival | None = None
        """The MEDIUM message whose pieces are still arriving."""
        self.acks_due: list[int] = []
        """Ids of revoked messages to answer with DONE once no read is in flight."""
        self.peer_max_message: int | None = None

    # -- the per-message events --------------------------------------------

    @cython.ccall
    def arrived(self, slot: cython.int, header: Header, size: cython.Py_ssize_t) -> Arrived:
        """A packet of ``size`` bytes landed in receive buffer ``slot``.

        Applies its credits and control meaning and queues a message (a
        BATCH's, the channel queues with :meth:`queue_batch`). Returns
        ``(ended, offer, repost)``: the id of the message whose exposure a
        DONE ended (0 if none); whether the packet is an eager message with
        nothing queued before it (the channel may hand it to a delivery
        hook, then :meth:`take` it); whether the buffer held control and is
        counted reposted (the channel reposts it now, or fails). Raises
        :class:`ProtocolError` (or ValueError, for impossible credits) when
        the peer broke the protocol.
        """
        code: cython.int = header.code
        filling: Arrival | None = self.filling
        if filling is not None and code in (
            _WIRE.eager,
            _WIRE.rendezvous,
            _WIRE.medium,
            _WIRE.batch,
        ):
            raise ProtocolError(
                f"a message began before the {filling.missing} bytes still missing of "
                "the medium message before it"
            )
        ended: cython.ulonglong = self._apply(header)
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
            return ended, False, False
        if code in (_WIRE.eager, _WIRE.rendezvous, _WIRE.medium):
            ready = self.ready
            arrival = Arrival(slot, header, size)
            ready.append(arrival)
            if code == _WIRE.medium:
                arrival.pieces = collections.deque()
                arrival.missing = header.length - (size - _WIRE.header_size - header.head_length)
                self.filling = arrival
            return ended, code == _WIRE.eager and len(ready) == 1, False
        if code == _WIRE.batch:  # the channel queues its messages (see queue_batch)
            return ended, False, False
        self.control.reposted(code != _WIRE.control_credit)
        return ended, False, True

    def queue_batch(self, slot: int, parts: list[tuple[int, bytes]]) -> None:
        """Queue the messages of the BATCH packet that :meth:`arrived` in
        ``slot``: one for each of ``parts`` (its head's length, and its head
        and body copied out). The last holds the buffer: it goes back, and
        its credit with it, when that one is taken, so a reader that falls
        behind still holds its sender back."""
        last = len(parts) - 1
        for i, (head, part) in enumerate(parts):
            header = Header(Kind.EAGER, 0, 0, len(part) - head, None, head)
            arrival = Arrival(slot if i == last else -1, header, HEADER_SIZE + len(part))
            arrival.saved = part
            self.ready.append(arrival)

    @cython.ccall
    def take(self) -> Taken:
        """The first queued message is taken. Returns it, and whether the
        sender must be told DONE (a rendezvous message whose REVOKE, if
        any, was not answered yet). Its buffer is counted reposted: the
        channel reposts it now, or fails (after :meth:`fail`, nothing is
        counted)."""
        arrival: Arrival = self.ready.popleft()
        if not self.failed and arrival.slot >= 0:
            self.data.reposted()
        done_due: cython.bint = arrival.header.code == _WIRE.rendezvous and not arrival.acked
        return arrival, done_due

    @cython.ccall
    def send(
        self, kind: Kind, msg_id: cython.ulonglong = 0, length: cython.ulonglong = 0,
        remote: RemoteBuffer | None = None, head_length: cython.int = 0,
    ) -> Packet | None:  # fmt: skip
        """A packet of ``kind`` is to go. If a send slot and the credit it
        costs are there, takes them and returns ``(slot, header)``, the
        header carrying the credits we owe (now counted as paid); else
        None, changing nothing. Nothing goes before our HELLO, which
        carries our first grants. What this took is not given back: the
        channel posts the packet from ``slot``, or fails."""
        code: cython.int = kind
        cost: cython.int = _cost(code)
        data: DataCredits = self.data
        control: CreditWindow = self.control
        if not self.free_slots or not (self.said_hello or code == _WIRE.hello):
            return None
        last: cython.int = 0
        if cost == _DATA:
            if not data.can_send():
                return None
            if data.available == 1:
                last = LAST_CREDIT
        elif cost == _CONTROL:
            if not control.can_send_data():
                return None
        elif control.available < 1:
            return None
        header = Header(kind, data.owed, msg_id, length, remote, head_length, control.owed, last)
        if code == _WIRE.hello:
            self.said_hello = True
        data.piggyback()
        if cost == _DATA:
            data.take()
            control.piggyback()
        elif cost == _CONTROL:
            control.take_for_data()
        else:
            control.take_for_update()
        return self.free_slots.pop(), header

    @cython.ccall
    def piece_taken(self) -> cython.bint:
        """A buffer of the MEDIUM message being taken (its first packet, or a
        PIECE) was copied out: it is counted reposted, before the message is
        whole. Returns whether the channel must repost it now (False once
        failed)."""
        if self.failed:
            return False
        self.data.reposted()
        return True

    def hello(self, max_message: int, head_length: int) -> Packet | None:
        """:meth:`send` for our HELLO: ``max_message``, and our windows (the
        grants ride on it as on any packet); its body of ``head_length``
        bytes follows the header."""
        windows: cython.ulonglong = self.control.window  # 64 bits before the shift
        windows = windows << 32 | self.data.window
        return self.send(Kind.HELLO, windows, max_message, None, head_length)

    @cython.ccall
    def update_due(self) -> cython.bint:
        """Whether a credit-only packet is due (:meth:`update` may still find
        no slot or credit for it)."""
        return self.said_hello and (
            self.data.should_send_update() or self.control.should_send_update()
        )

    @cython.ccall
    def update(self) -> Packet | None:
        """:meth:`send` for the credit-only packet due now, if one is due and can go."""
        if not self.said_hello:
            return None
        if self.data.should_send_update():
            packet = self.send(Kind.CREDIT)
            if packet is not None:
                return packet
        if self.control.should_send_update():
            return self.send(Kind.CONTROL_CREDIT)
        return None

    @cython.ccall
    def sent(self, slot: cython.int) -> None:
        """The packet in send ``slot`` went (or failed): the slot is free."""
        self.free_slots.append(slot)

    def fail(self) -> None:
        """The channel failed: buffers are no longer counted back (see :meth:`take`)."""
        self.failed = True

    # -- what the events are made of -----------------------------------------

    @cython.cfunc
    @cython.exceptval(0, check=True)
    def _apply(self, header: Header) -> cython.ulonglong:
        """Apply a packet's credits and control meaning; returns the id of
        the message whose exposure a DONE ended (0 if none)."""
        code: cython.int = header.code
        data: DataCredits = self.data
        if code == _WIRE.hello:
            if self.peer_max_message is not None:
                raise ProtocolError("a second HELLO")
            data_window, control_window = hello_windows(header)
            data.announced(data_window)
            self.control.announced(control_window)
            self.peer_max_message = header.length
        data.granted(header.credits)
        self.control.granted(header.control_credits)
        if code in (_WIRE.eager, _WIRE.rendezvous, _WIRE.medium, _WIRE.piece, _WIRE.batch):
            data.arrived(header.flags & LAST_CREDIT != 0)
        elif code == _WIRE.done:
            if header.msg_id == 0:  # ids start at 1 (see Ledger)
                raise ProtocolError("DONE for message 0, which no side exposes")
            return header.msg_id  # the ledger knows whether it was exposed
        elif code == _WIRE.revoke:
            arrival: Arrival
            for arrival in self.ready:
                exposed: Header = arrival.header
                if exposed.code == _WIRE.rendezvous and exposed.msg_id == header.msg_id:
                    arrival.revoked = True
                    if not arrival.reading and not arrival.acked:  # answered now, or
                        self._ack(arrival)  # once the read ends, or by the DONE that went
        return 0

    @cython.cfunc
    def _ack(self, arrival: Arrival) -> None:
        arrival.acked = True
        self.acks_due.append(arrival.header.msg_id)

    def read_stopped(self, arrival: Arrival) -> None:
        """A read of ``arrival``'s body failed or was cancelled (it stays queued);
        a REVOKE that came meanwhile is answered now."""
        arrival.reading = False
        if arrival.revoked and not arrival.acked:
            self._ack(arrival)

    def read_ended(self, arrival: Arrival) -> bool:
        """A read of ``arrival``'s body ahead of its receive landed whole (it
        stays queued): whether its sender is owed a DONE now, which then
        also answers a REVOKE that came meanwhile (taking it owes none)."""
        arrival.reading = False
        if arrival.acked:
            return False
        arrival.acked = True
        return True

    def unread(self, least: cython.Py_ssize_t) -> list[Arrival]:
        """The queued rendezvous messages of more than ``least`` bytes that
        nothing reads or read, and the sender did not withdraw, in order."""
        found: list[Arrival] = []
        arrival: Arrival
        header: Header
        for arrival in self.ready:
            header = arrival.header
            if (header.code == _WIRE.rendezvous and not arrival.reading and not arrival.acked
                    and not arrival.revoked and header.length > least):  # fmt: skip
                found.append(arrival)
        return found
