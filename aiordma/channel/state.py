# cython: annotation_typing=True
"""What one side of a message channel knows, without any I/O (pure logic).

:class:`ChannelState` holds the protocol state of a
:class:`~aiordma.MessageChannel`: credits both ways, which send slots are
free, the peer's announced ``max_message``, and which credit update, if
any, is due. Only :class:`~aiordma.channel.packets.Packets` drives it, and
does the I/O, as httpcore drives h11; keeping the decisions here lets them
be tested on a host without a device. (The messages that arrived are
:class:`~aiordma.channel.inbox.Inbox`'s; the bytes this side exposes are
counted by :class:`~aiordma.channel.ledger.Ledger`.)

Per packet, two events go in and each returns what the channel must do:
:meth:`~ChannelState.send` (a slot and a stamped header, or not yet) and
:meth:`~ChannelState.arrived` (what ended, whether to repost the buffer);
:meth:`~ChannelState.emptied` counts a receive buffer back, and
:meth:`~ChannelState.update` and :meth:`~ChannelState.sent` complete the
sending side.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiordma.channel.credits import CreditWindow, DataCredits
from aiordma.channel.ring import Place, RingOwner, RingWriter
from aiordma.channel.wire import LAST_CREDIT, WIRE, Header, Kind, WireCodes
from aiordma.exceptions import ProtocolError
from aiordma.verbs.memory import RemoteBuffer

if TYPE_CHECKING:
    from typing import TypeAlias

    from aiordma import _cython_shim as cython

    # For the type checker only (compiled, these methods return objects).
    Packet: TypeAlias = tuple[int, Header]
    """A packet :meth:`ChannelState.send` granted: its send slot and stamped header."""
    Outcome: TypeAlias = tuple[int, bool]
    """What :meth:`ChannelState.arrived` returns."""
    Record: TypeAlias = tuple[Header, Place]
    """A record :meth:`ChannelState.record` granted: its stamped header and its place."""
else:
    try:
        import cython
    except ImportError:  # no Cython: the declarations below mean nothing
        from aiordma import _cython_shim as cython


def hello_windows(header: Header) -> tuple[int, int]:
    """The data and control windows a HELLO announces (in its ``msg_id``)."""
    return header.msg_id & 0xFFFFFFFF, header.msg_id >> 32


_WIRE = cython.declare(WireCodes, WIRE)  # the wire's codes as C integers

# What each kind of packet spends: a data credit, a control credit but not
# the last (kept for updates), or any control credit.
_DATA = cython.declare(cython.int, 0)
_CONTROL = cython.declare(cython.int, 1)
_CONTROL_UPDATE = cython.declare(cython.int, 2)


@cython.cfunc
def _cost(code: cython.int) -> cython.int:
    """What a packet of kind ``code`` spends (the last control credit is kept for updates)."""
    if code in (
        _WIRE.eager,
        _WIRE.rendezvous,
        _WIRE.medium,
        _WIRE.piece,
        _WIRE.batch,
        _WIRE.record,
    ):
        return _DATA
    if code == _WIRE.control_credit:
        return _CONTROL_UPDATE
    return _CONTROL


@cython.cclass
class ChannelState:
    """Credits and send slots of one channel side.

    ``buffers`` receive slots are split into a data ``window`` and a
    ``control_window`` (see :mod:`aiordma.channel.credits`); ``send_slots`` (as many
    by default) hold packets being sent. ``data`` replaces the data credits
    of a side whose receive buffers come from a shared pool. ``ring`` bytes
    of receive ring (0: none) take this side's RECORDs; the peer's ring is
    :attr:`ring_out` once its HELLO announced one.
    """

    def __init__(
        self,
        window: int,
        control_window: int,
        *,
        send_slots: int | None = None,
        data: DataCredits | None = None,
        ring: int = 0,
    ) -> None:
        self.data = DataCredits(window) if data is None else data
        self.ring_in: RingOwner | None = RingOwner(ring) if ring else None
        """This side's receive ring (all of it granted by our HELLO)."""
        self.ring_out: RingWriter | None = None
        """The peer's receive ring, once its HELLO announced one."""
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
        self.peer_max_message: int | None = None

    # -- the per-message events --------------------------------------------

    @cython.ccall
    def arrived(self, header: Header) -> Outcome:
        """A packet landed: apply its credits and control meaning. Returns
        ``(ended, repost)``: the id of the message whose exposure a DONE
        ended (0 if none); whether the buffer held control and is counted
        reposted (the channel reposts it now, or fails). What a message's
        packet carries is the inbox's. Raises :class:`ProtocolError` (or
        ValueError, for impossible credits) when the peer broke the protocol.
        """
        code: cython.int = header.code
        ended: cython.ulonglong = self._apply(header)
        if code in (_WIRE.eager, _WIRE.rendezvous, _WIRE.medium, _WIRE.piece, _WIRE.batch):
            return ended, False
        if code == _WIRE.record:  # its bytes are in the ring: the buffer goes back now
            self.data.reposted()
        else:
            self.control.reposted(code != _WIRE.control_credit)
        return ended, True

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
        ring: cython.int = 0
        if self.ring_in is not None and code != _WIRE.hello:  # (the HELLO grants it all)
            ring = self.ring_in.take_owed()
        header = Header(
            kind, data.owed, msg_id, length, remote, head_length, control.owed, last, ring
        )
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

    def record(self, length: int, head_length: int) -> Record | None:
        """A RECORD of ``length`` body bytes after a head of ``head_length``
        is to be written into the peer's ring (which holds it: see
        :meth:`fits_ring`). If a data credit and the ring space are there,
        takes them and returns the stamped header and the record's place;
        else None, changing nothing. No send slot: the record is written
        from the caller's staging memory."""
        ring = self.ring_out
        data: DataCredits = self.data
        if ring is None or not self.said_hello or not data.can_send():
            return None
        place = ring.reserve(_WIRE.header_size + head_length + length)
        if place is None:
            return None
        owed: cython.int = 0 if self.ring_in is None else self.ring_in.take_owed()
        last: cython.int = LAST_CREDIT if data.available == 1 else 0
        header = Header(
            Kind.RECORD, data.owed, 0, length, None, head_length, self.control.owed, last, owed
        )
        data.piggyback()
        data.take()
        self.control.piggyback()
        return header, place

    def fits_ring(self, size: int) -> bool:
        """Whether a message of ``size`` bytes (head and body) goes as one RECORD."""
        ring = self.ring_out
        return ring is not None and ring.fits(_WIRE.header_size + size)

    def ring_arrived(self, sequence: int, size: int) -> int:
        """A RECORD of ``size`` bytes was written into our ring with
        immediate ``sequence``: its offset (:class:`ProtocolError` if the
        peer broke the ring's rules, or we have no ring)."""
        if self.ring_in is None:
            raise ProtocolError("a RECORD written to a side that announced no ring")
        return self.ring_in.arrive(sequence, size)

    def ring_freed(self) -> None:
        """The oldest RECORD was taken: its ring space is owed to the peer."""
        if self.ring_in is not None:
            self.ring_in.free_oldest()

    @cython.ccall
    def emptied(self) -> cython.bint:
        """A message's receive buffer was taken or copied out (a MEDIUM
        message's before it is whole): it is counted reposted. Returns
        whether the channel must repost it now (False once failed)."""
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
            self.data.should_send_update()
            or self.control.should_send_update()
            or (self.ring_in is not None and self.ring_in.due())
        )

    @cython.ccall
    def update(self) -> Packet | None:
        """:meth:`send` for the credit-only packet due now, if one is due and can go."""
        if not self.said_hello:
            return None
        if self.data.should_send_update() or (self.ring_in is not None and self.ring_in.due()):
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
        """The channel failed: buffers are no longer counted back (see :meth:`emptied`)."""
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
        if header.ring:
            if self.ring_out is None:
                raise ProtocolError("the peer gave back ring space but announced no ring")
            self.ring_out.grant(header.ring)
        if code in (
            _WIRE.eager,
            _WIRE.rendezvous,
            _WIRE.medium,
            _WIRE.piece,
            _WIRE.batch,
            _WIRE.record,
        ):
            data.arrived(header.flags & LAST_CREDIT != 0)
        elif code == _WIRE.done:
            if header.msg_id == 0:  # ids start at 1 (see Ledger)
                raise ProtocolError("DONE for message 0, which no side exposes")
            return header.msg_id  # the ledger knows whether it was exposed
        return 0
