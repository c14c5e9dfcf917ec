"""What one side of a message channel knows, without any I/O (pure logic).

:class:`ChannelState` holds the protocol state of a
:class:`~aiordma.MessageChannel`: credits both ways, which send slots are
free, the messages that arrived and wait to be taken, the large messages
this side holds exposed (and the bytes they cover), those it revoked, the
peer's announced ``max_message``, and which credit update, if any, is due.
The channel does the I/O (receive buffers, posting, RDMA reads,
registrations, timers and waking tasks), as httpcore drives h11; keeping
the decisions here lets them be tested on a host without a device.

Per message, three events go in and each returns what the channel must do:
:meth:`~ChannelState.send` (a slot and a stamped header, or not yet),
:meth:`~ChannelState.arrived` (what ended, whether to offer the message to
a delivery hook, whether to repost the buffer) and :meth:`~ChannelState.take`
(the arrival, whether its sender is owed a DONE). :meth:`~ChannelState.update`
and :meth:`~ChannelState.sent` complete the sending side.
"""

from __future__ import annotations

import collections
import enum
import itertools
from dataclasses import dataclass

from aiordma.channel.credits import CreditWindow, DataCredits
from aiordma.channel.wire import LAST_CREDIT, Header, Hello, Kind
from aiordma.exceptions import ProtocolError, ProtocolMismatchError
from aiordma.verbs.memory import RemoteBuffer


def hello_windows(header: Header) -> tuple[int, int]:
    """The data and control windows a HELLO announces (in its ``msg_id``)."""
    return header.msg_id & 0xFFFFFFFF, header.msg_id >> 32


class Cost(enum.Enum):
    """What sending a packet spends."""

    DATA = "a data credit"
    CONTROL = "a control credit, not the last"
    CONTROL_UPDATE = "any control credit"


_COST = {
    Kind.EAGER: Cost.DATA,
    Kind.RENDEZVOUS: Cost.DATA,
    Kind.HELLO: Cost.CONTROL,
    Kind.DONE: Cost.CONTROL,
    Kind.REVOKE: Cost.CONTROL,
    Kind.CREDIT: Cost.CONTROL,
    Kind.CONTROL_CREDIT: Cost.CONTROL_UPDATE,
}
"""What each kind of packet spends: the last control credit is kept for updates."""


@dataclass(slots=True)
class Arrival:
    """A message that arrived and waits to be taken."""

    slot: int
    """The receive buffer it sits in."""
    header: Header
    size: int
    """Bytes of the packet (header, head and, when eager, body)."""
    saved: bytes | None = None
    """Head and body of an eager message, copied out when the connection failed."""
    revoked: bool = False
    """The sender withdrew this rendezvous message (REVOKE)."""
    reading: bool = False
    """This side is reading the rendezvous body now."""
    acked: bool = False
    """This side answered the sender's REVOKE (a DONE that says it will not read)."""


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
        max_exposed: int,
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
        self.failed = False
        """Whether our HELLO went: it carries our first grants, so no credit
        update may go before it."""
        self.ready: collections.deque[Arrival] = collections.deque()
        self.max_exposed = max_exposed
        self.exposed: dict[int, int] = {}
        """Sizes of the large messages this side holds exposed, by message id."""
        self.exposed_bytes = 0
        self.revoked: dict[int, int] = {}
        """Sizes of the messages this side revoked, by id: readable until the
        peer's DONE answers the REVOKE (it may be reading them)."""
        self.acks_due: list[int] = []
        """Ids of revoked messages to answer with DONE once no read is in flight."""
        self.peer_max_message: int | None = None
        self.peer_buffer_size: int | None = None
        """Bytes of each of the peer's receive buffers, once its HELLO came."""
        self._ids = itertools.count(1)

    # -- the per-message events --------------------------------------------

    def arrived(self, slot: int, header: Header, size: int) -> tuple[int, bool, bool]:
        """A packet of ``size`` bytes landed in receive buffer ``slot``.

        Applies its credits and control meaning and queues a message.
        Returns ``(ended, offer, repost)``: the id of the message whose
        exposure a DONE ended (0 if none); whether the packet is an eager
        message with nothing queued before it (the channel may hand it to
        a delivery hook, then :meth:`take` it); whether the buffer held
        control and is counted reposted (the channel reposts it now, or
        fails). Raises :class:`ProtocolError` (or ValueError, for
        impossible credits) when the peer broke the protocol.
        """
        ended = self._apply(header)
        kind = header.kind
        if kind == Kind.EAGER or kind == Kind.RENDEZVOUS:
            ready = self.ready
            ready.append(Arrival(slot, header, size))
            return ended, kind == Kind.EAGER and len(ready) == 1, False
        self.control.reposted(for_data=kind != Kind.CONTROL_CREDIT)
        return ended, False, True

    def take(self) -> tuple[Arrival, bool]:
        """The first queued message is taken. Returns it, and whether the
        sender must be told DONE (a rendezvous message whose REVOKE, if
        any, was not answered yet). Its buffer is counted reposted: the
        channel reposts it now, or fails (after :meth:`fail`, nothing is
        counted)."""
        arrival = self.ready.popleft()
        if not self.failed and arrival.slot >= 0:
            self.data.reposted()
        done_due = arrival.header.kind == Kind.RENDEZVOUS and not arrival.acked
        return arrival, done_due

    def send(
        self, kind: Kind, msg_id: int = 0, length: int = 0,
        remote: RemoteBuffer | None = None, head_length: int = 0,
    ) -> tuple[int, Header] | None:  # fmt: skip
        """A packet of ``kind`` is to go. If a send slot and the credit it
        costs are there, takes them and returns ``(slot, header)``, the
        header carrying the credits we owe (now counted as paid); else
        None, changing nothing. Nothing goes before our HELLO, which
        carries our first grants. What this took is not given back: the
        channel posts the packet from ``slot``, or fails."""
        cost = _COST[kind]
        data, control = self.data, self.control
        if not self.free_slots or not (self.said_hello or kind == Kind.HELLO):
            return None
        if cost is Cost.DATA:
            if not data.can_send():
                return None
            last = LAST_CREDIT if data.available == 1 else 0
        elif cost is Cost.CONTROL:
            if not control.can_send_data():
                return None
            last = 0
        elif control.available < 1:
            return None
        else:
            last = 0
        header = Header(kind, data.owed, msg_id, length, remote, head_length, control.owed, last)
        if kind == Kind.HELLO:
            self.said_hello = True
        data.piggyback()
        if cost is Cost.DATA:
            data.take()
            control.piggyback()
        elif cost is Cost.CONTROL:
            control.take_for_data()
        else:
            control.take_for_update()
        return self.free_slots.pop(), header

    def hello(self, max_message: int, head_length: int) -> tuple[int, Header] | None:
        """:meth:`send` for our HELLO: ``max_message``, and our windows (the
        grants ride on it as on any packet); its body of ``head_length``
        bytes follows the header."""
        windows = self.control.window << 32 | self.data.window
        return self.send(Kind.HELLO, windows, max_message, None, head_length)

    def update(self) -> tuple[int, Header] | None:
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

    def sent(self, slot: int) -> None:
        """The packet in send ``slot`` went (or failed): the slot is free."""
        self.free_slots.append(slot)

    def fail(self) -> None:
        """The channel failed: buffers are no longer counted back (see :meth:`take`)."""
        self.failed = True

    # -- what the events are made of -----------------------------------------

    def _apply(self, header: Header) -> int:
        """Apply a packet's credits and control meaning; returns the id of
        the message whose exposure a DONE ended (0 if none)."""
        kind = header.kind
        if kind == Kind.HELLO:
            if self.peer_max_message is not None:
                raise ProtocolError("a second HELLO")
            data_window, control_window = hello_windows(header)
            self.data.announced(data_window)
            self.control.announced(control_window)
            self.peer_max_message = header.length
        self.data.granted(header.credits)
        self.control.granted(header.control_credits)
        if kind == Kind.EAGER or kind == Kind.RENDEZVOUS:
            self.data.arrived(header.flags & LAST_CREDIT != 0)
        elif kind == Kind.DONE:
            if header.msg_id in self.exposed:
                self._unexposed(header.msg_id)
                return header.msg_id
            size = self.revoked.pop(header.msg_id, None)
            if size is None:
                raise ProtocolError(f"DONE for message {header.msg_id}, which is not exposed")
            self.exposed_bytes -= size  # read, or the peer answered our REVOKE
            return header.msg_id
        elif kind == Kind.REVOKE:
            for arrival in self.ready:
                if arrival.header.kind == Kind.RENDEZVOUS and arrival.header.msg_id == (
                    header.msg_id
                ):
                    arrival.revoked = True
                    if not arrival.reading:  # answered now; else once the read ends
                        self._ack(arrival)
        return 0

    def _ack(self, arrival: Arrival) -> None:
        arrival.acked = True
        self.acks_due.append(arrival.header.msg_id)

    def read_stopped(self, arrival: Arrival) -> None:
        """A read of ``arrival``'s body failed or was cancelled (it stays queued);
        a REVOKE that came meanwhile is answered now."""
        arrival.reading = False
        if arrival.revoked and not arrival.acked:
            self._ack(arrival)

    def heard(self, hello: Hello, protocol: str, peer: str) -> None:
        """The peer's HELLO announced ``hello``; ``protocol`` is what this side
        speaks. Raises :class:`ProtocolMismatchError` if both name a protocol
        and they differ (a plain channel, ``""``, carries any protocol: the
        layer above it decides, as ``rpc.Service.serve`` does)."""
        if protocol and hello.protocol and hello.protocol != protocol:
            raise ProtocolMismatchError(protocol, hello.protocol, peer)
        self.peer_buffer_size = hello.buffer_size

    # -- exposures ---------------------------------------------------------

    def room_for(self, size: int) -> bool:
        """Whether ``size`` more bytes may be exposed under ``max_exposed``."""
        return self.exposed_bytes + size <= self.max_exposed

    def expose(self, size: int) -> int:
        """Count a large message of ``size`` bytes as exposed; returns its id."""
        msg_id = next(self._ids)
        self.exposed[msg_id] = size
        self.exposed_bytes += size
        return msg_id

    def _unexposed(self, msg_id: int) -> int:
        size = self.exposed.pop(msg_id)
        self.exposed_bytes -= size
        return size

    def withdraw(self, msg_id: int) -> bool:
        """The send of ``msg_id`` failed before the peer learnt of it: forget it.
        Returns False if it was not exposed."""
        if msg_id not in self.exposed:
            return False
        self._unexposed(msg_id)
        return True

    def revoke(self, msg_id: int) -> bool:
        """Revoke an unread exposure: it stays readable (and counted) until the
        peer's DONE answers the REVOKE, since the peer may be reading it.
        Returns False if it had already ended."""
        size = self.exposed.pop(msg_id, None)
        if size is None:
            return False
        self.revoked[msg_id] = size
        return True

    def forget_revoked(self, msg_id: int) -> bool:
        """The peer did not answer a REVOKE in time: the exposure ends anyway.
        Returns False if the answer came."""
        size = self.revoked.pop(msg_id, None)
        if size is None:
            return False
        self.exposed_bytes -= size
        return True

    def clear_exposures(self) -> list[int]:
        """The channel failed: every exposure ends, revoked ones too. Returns their ids."""
        ids = [*self.exposed, *self.revoked]
        self.exposed.clear()
        self.revoked.clear()
        self.exposed_bytes = 0
        return ids
