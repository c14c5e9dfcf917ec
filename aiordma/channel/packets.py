# cython: annotation_typing=True
"""A message channel's packet core: everything per packet, below the async shell.

:class:`Packets` owns one side's packets and the
:class:`~aiordma.channel.state.ChannelState` they drive (nothing else
touches it): the send and receive slots and their layout, stamping and
posting a packet, parsing what landed and applying it, arrivals and a
MEDIUM message's pieces, the eager limit both HELLOs decide, the send and
receive turns, owed credits, and what is saved of the arrivals when the
channel fails. A small message is one call on each side:
:meth:`Packets.send_eager` to send it, :meth:`Packets.take_eager` to take
it once it arrived. Compiled (``packets.pxd``), those calls run in C with no
Python frame between the application and the verbs.

Its one I/O dependency is the queue pair's :class:`~aiordma.channel.link.Lane`.
What the shell must do (fail, check the peer's HELLO, end an exposure,
answer revocations, send a DONE, wait for send-queue room) it is told
through one callable, ``report(event, value)`` (see :class:`Event`); it
never calls back into the shell otherwise.

Call order: ``attach -> post_receives? -> (send_hello | try_send | send_eager
| sent | arrived | take_eager | take_eagers | consumed | pump)* -> fail`` (``fail`` once;
afterwards nothing is posted and the receive slots are not read).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from aiordma import metrics
from aiordma.channel.buffers import Body, Into, buffer_view
from aiordma.channel.credits import DataCredits
from aiordma.channel.state import Arrival as Arrival  # (the records the shell reads)
from aiordma.channel.state import ChannelState
from aiordma.channel.wire import (
    ENTRY_SIZE,
    HEADER_SIZE,
    WIRE,
    Header,
    Hello,
    Kind,
    WireCodes,
    batch_entries,
    pack_batch,
)
from aiordma.exceptions import DeviceError, ProtocolError, RdmaError, ResourceClosedError
from aiordma.metrics import tally

if TYPE_CHECKING:
    from typing import Protocol

    from aiordma import _cython_shim as cython
    from aiordma.channel.link import Lane
    from aiordma.metrics import Stats
    from aiordma.verbs.memory import RemoteBuffer

    class SharedPool(Protocol):
        @property
        def closed(self) -> bool: ...

        def repost(self, index: int) -> None: ...
else:
    try:
        import cython
    except ImportError:  # no Cython: the declarations below mean nothing
        from aiordma import _cython_shim as cython

_WIRE = cython.declare(WireCodes, WIRE)  # the wire's codes as C integers

Bytes = bytes | bytearray
View = memoryview  # (an alias: typed with it, Cython would check its own memoryview type)


class Event(enum.IntEnum):
    """What :class:`Packets` tells its shell to do, with the value it reports."""

    FAILED = 1
    """The channel failed (value: the error): a post or repost failed."""
    BROKEN = 2
    """The peer broke the protocol (value: the :class:`ProtocolError` or ValueError)."""
    HEARD = 3
    """The peer's HELLO came (value: its :class:`~aiordma.channel.wire.Hello`;
    the eager limit is fitted to it already)."""
    ENDED = 4
    """The peer's DONE ended the exposure of a message (value: its id)."""
    ANSWER = 5
    """Revocations are due an answer, once no read is in flight (see :meth:`Packets.acks`)."""
    DONE_DUE = 6
    """A large message was taken: its sender is owed a DONE (value: its id)."""
    WAIT_ROOM = 7
    """A credit update is due and the send queue is full: call
    :meth:`Packets.room_came` once there is room."""


Report = Callable[[Event, object], None]

POSTED = 0
""":meth:`Packets.try_send`: the packet went."""
NO_ROOM = 1
""":meth:`Packets.try_send`: the send queue is full."""
NO_CREDIT = 2
""":meth:`Packets.try_send`: no send slot or no credit for it yet."""
_POSTED = cython.declare(cython.int, POSTED)


@cython.cfunc
@cython.inline
def _fits(header: Header) -> cython.bint:
    """Whether the header's credits fit their 16 bits (else packing it raises)."""
    return 0 <= header.credits < 0x10000 and 0 <= header.control_credits < 0x10000


_NO_TARGET = memoryview(bytearray())
"""What :meth:`Packets.fill` copies into when nothing is being filled."""


def _report_nothing(event: Event, value: object) -> None:
    """A failed channel's packets report nothing."""


@cython.cclass
class Packets:
    """The packets of one channel side through its send and receive slots.

    ``window``, ``control_window`` and ``send_slots`` size the state (``data``
    replaces its data credits when ``shared``, the shared receive queue the
    receive slots belong to, lends them). ``send_view`` and ``recv_view``
    are views of the channel's two registered regions, held for the
    channel's life (the receive one until :meth:`fail`): slot ``i`` is bytes
    ``[i * size, (i + 1) * size)``. ``stats`` counts messages and bytes;
    ``report`` is told what the shell must do.

    Its parts, in this order below: set-up, what the shell reads, the send
    and receive turns, sending (eager, medium chains, pieces), receiving
    (arrivals, taking, copying pieces from the drain, reposting), credits
    and wake-ups, failing. It holds the waiting tasks' futures itself, not
    the shell: the completion drain calls :meth:`arrived` in C, and waking
    the one future that waits from there, in the same call, is what made a
    message's wake-up cheap (decision records 0006 and 0010: a round trip
    wakes each side once). The parts stay in one class for that reason;
    each is a section of it.
    """

    def __init__(
        self, report: Report, window: int, control_window: int, send_slots: int,
        data: DataCredits | None, send_view: memoryview, recv_view: memoryview, size: int,
        max_message: int, stats: Stats, shared: SharedPool | None,
        loop: asyncio.AbstractEventLoop,
    ) -> None:  # fmt: skip
        self.state = ChannelState(window, control_window, send_slots=send_slots, data=data)
        self.lane: Lane | None = None
        self.size = size
        self.send_view = send_view
        self.recv_view = recv_view
        self.recv_open = True
        self.max_message = max_message
        self.eager_limit = size - HEADER_SIZE
        """Head and body bytes a single packet carries (lowered to fit the
        peer's receive buffers once its HELLO came)."""
        self.deliver: Callable[[bytes, memoryview], bool] | None = None
        self.failed = False
        self.senders = 0
        """Sends holding or waiting for the channel's send turn: while there
        are any, :meth:`send_eager` leaves the message to wait its turn."""
        self.receivers = 0
        """Receives holding or waiting for the receive turn (likewise for
        :meth:`take_eager`)."""
        self.room_pending = False
        """A credit update waits for room in the send queue (see :meth:`room_came`)."""
        self.waiters: list[asyncio.Future[None]] = []
        """Tasks waiting for any change (:meth:`changed`)."""
        self.receiving: list[asyncio.Future[None]] = []
        """Tasks waiting for a message or a piece to arrive (:meth:`arrivals`)."""
        self._report = report
        self._stats = stats
        self._shared = shared
        self._loop = loop
        self._sink: Arrival | None = None
        """The MEDIUM message whose PIECEs are copied as they land (:meth:`fill`)."""
        self._sink_target: View = _NO_TARGET
        self._sink_offset = 0

    def let_go(self) -> None:
        """The channel failed: report nothing more to it (no reference back to it)."""
        self._report = _report_nothing

    def attach(self, lane: Lane) -> None:
        """The lane the packets go out through (made with this object's
        :meth:`sent` and :meth:`arrived` as its callbacks)."""
        self.lane = lane

    def post_receives(self) -> None:
        """Post every receive slot (not on a shared queue: the pool posts those)."""
        assert self.lane is not None
        for index in range(self.state.buffers):
            self.lane.recv(index)

    # -- what the shell reads ----------------------------------------------

    @property
    def peer_max_message(self) -> int | None:
        """The peer's ``max_message``, once its HELLO came."""
        return self.state.peer_max_message

    @property
    def said_hello(self) -> bool:
        """Whether our HELLO went."""
        return self.state.said_hello

    def credits(self) -> tuple[int, int]:
        """Data and control credits this side may spend now."""
        return self.state.data.available, self.state.control.available

    # -- turns -------------------------------------------------------------

    @cython.ccall
    def turn(self, send: cython.bint, step: cython.int) -> None:
        """A send (``send``) or a receive enters (``step`` 1) or leaves (-1)
        the line for its turn: while anyone is in it, the one-call paths
        leave their message to it, so order is kept."""
        if send:
            self.senders += step
        else:
            self.receivers += step

    def deliver_to(self, deliver: Callable[[bytes, memoryview], bool] | None) -> None:
        """Offer small messages to ``deliver`` as they arrive (see
        ``MessageChannel.deliver_to``)."""
        self.deliver = deliver

    # -- sending -----------------------------------------------------------

    @cython.ccall
    def post(self, slot: cython.int, header: Header, head: Bytes, body: Body | None) -> None:
        """Post the packet :meth:`ChannelState.send` granted (send slot
        ``slot``, stamped ``header``) with ``head`` and ``body`` (None, or a
        bytes-like part of a message) after the header; room in the send
        queue was checked. If that fails, so does the channel: the credits
        it spent cannot be given back."""
        try:
            start: cython.Py_ssize_t = slot * self.size
            at: cython.Py_ssize_t = _WIRE.header_size  # where the head goes
            end: cython.Py_ssize_t = at + len(head)
            copied: cython.Py_ssize_t = 0
            done: cython.bint = False
            view = self.send_view
            if cython.compiled and _fits(header):
                remote = header.remote
                if remote is None:
                    store_header(address_of(view, True) + start, header, 0, 0)
                else:
                    store_header(address_of(view, True) + start, header, remote.addr, remote.rkey)
                done = copy_in(view, start + at, head, self.size - at) >= 0
                if done and body is not None:
                    copied = copy_in(view, start + end, body, self.size - end)
                    done = copied >= 0
            if not done:
                slot_view = view[start : start + self.size]
                header.pack_into(slot_view)
                slot_view[at:end] = head
                if body is not None:  # EAGER's whole body, or MEDIUM's or PIECE's part of it
                    with buffer_view(body) as source:
                        copied = len(source)
                        slot_view[end : end + copied] = source
            self.lane.send(slot, end + copied)  # type: ignore[union-attr]
        except BaseException as exc:
            self.state.sent(slot)
            self._report(Event.FAILED, exc)
            raise

    def send_hello(self, max_message: int, hello: bytes) -> bool:
        """Post our HELLO (``max_message``, our windows and first grants, and
        ``hello`` after the header) now; False if the send queue is full."""
        assert self.lane is not None
        if not self.lane.send_room():
            return False
        packet = self.state.hello(max_message, len(hello))
        assert packet is not None  # the first packet: a slot and a credit are there
        self.post(packet[0], packet[1], hello, None)
        return True

    @cython.ccall
    @cython.exceptval(-1, check=True)
    def try_send(
        self, kind: Kind, msg_id: cython.ulonglong, length: cython.ulonglong,
        remote: RemoteBuffer | None, head: Bytes, body: Body | None,
    ) -> cython.int:  # fmt: skip
        """Post a packet of ``kind`` now if the send queue, a send slot and the
        credit it costs are there: :data:`POSTED`, else :data:`NO_ROOM` or
        :data:`NO_CREDIT` (what to wait for), changing nothing."""
        if not self.lane.send_room():  # type: ignore[union-attr]
            return NO_ROOM
        packet = self.state.send(kind, msg_id, length, remote, len(head))
        if packet is None:
            return NO_CREDIT
        slot: cython.int
        header: Header
        slot, header = packet
        self.post(slot, header, head, body)
        return POSTED

    @cython.ccall
    def send_eager(self, head: Bytes, body: Body, size: cython.Py_ssize_t) -> cython.bint:
        """Send a message of one packet (``head`` and ``body`` of ``size``
        bytes, which fit) now, if nobody waits ahead and the send queue, a
        send slot and a credit are there; False if it must wait its turn."""
        if self.senders or self.failed:
            return False
        if self.try_send(Kind.EAGER, 0, size, None, head, body) != _POSTED:
            return False
        self._count("messages_sent", "bytes_sent", size)
        return True

    @cython.ccall
    def send_eagers(
        self, bodies: Sequence[Body], sizes: Sequence[int], start: cython.Py_ssize_t,
        in_turn: cython.bint,
    ) -> cython.Py_ssize_t:  # fmt: skip
        """Post the small messages ``bodies[start:]`` (``sizes`` bytes each,
        each fitting one packet with no head) that the send queue, the send
        slots and the credits let go now, as one chain; returns the index of
        the first not sent. Neighbours that fit one packet together go as
        one BATCH (one credit, one work request). Sends nothing if others
        wait for the send turn, unless the caller holds it (``in_turn``)."""
        count: cython.Py_ssize_t = len(bodies)
        i: cython.Py_ssize_t = start
        n: cython.Py_ssize_t
        size: cython.Py_ssize_t
        total: cython.Py_ssize_t
        entry: cython.Py_ssize_t = ENTRY_SIZE
        if (self.senders and not in_turn) or self.failed or i >= count:
            return i
        self.lane.hold()  # type: ignore[union-attr]
        try:
            while i < count and not self.failed:
                n = 0
                total = 0
                while i + n < count and total + entry + sizes[i + n] <= self.eager_limit:
                    total += entry + sizes[i + n]
                    n += 1
                if n > 1:
                    batch = pack_batch(bodies[i : i + n], sizes[i : i + n], total)
                    if self.try_send(Kind.BATCH, n, total, None, b"", batch) != _POSTED:
                        break
                else:
                    n = 1
                    if self.try_send(Kind.EAGER, 0, sizes[i], None, b"", bodies[i]) != _POSTED:
                        break
                while n > 0:
                    size = sizes[i]
                    self._count("messages_sent", "bytes_sent", size)
                    i += 1
                    n -= 1
        finally:
            self._flush()
        return i

    @cython.ccall
    def send_medium(self, head: Bytes, view: View, size: cython.Py_ssize_t) -> cython.Py_ssize_t:
        """Post a MEDIUM message's first packet (``head`` and the start of its
        body ``view`` of ``size`` bytes) and the PIECEs that can go with it
        now, as one chain; returns how far the body is sent (0: the first
        packet cannot go yet, nothing was posted). The caller holds the send
        turn."""
        room: cython.Py_ssize_t = self.eager_limit - len(head)
        offset: cython.Py_ssize_t = 0
        self.lane.hold()  # type: ignore[union-attr]
        try:
            if self.try_send(Kind.MEDIUM, 0, size, None, head, view[:room]) == _POSTED:
                offset = self._pieces(view, room, size)
        finally:
            self._flush()
        return offset

    @cython.ccall
    def send_pieces(
        self, view: View, offset: cython.Py_ssize_t, size: cython.Py_ssize_t
    ) -> cython.Py_ssize_t:
        """Post the PIECEs of a MEDIUM message (its body ``view`` of ``size``
        bytes, sent up to ``offset``) that the send queue, the send slots
        and the credits let go now, as one chain; returns how far it is
        sent. The caller holds the send turn and waits for whatever stops it."""
        self.lane.hold()  # type: ignore[union-attr]
        try:
            offset = self._pieces(view, offset, size)
        finally:
            self._flush()
        return offset

    @cython.cfunc
    @cython.exceptval(-1, check=True)
    def _pieces(
        self, view: View, offset: cython.Py_ssize_t, size: cython.Py_ssize_t
    ) -> cython.Py_ssize_t:
        """:meth:`send_pieces`' staging, inside the lane's hold."""
        limit: cython.Py_ssize_t = self.eager_limit
        n: cython.Py_ssize_t
        slot: cython.int
        header: Header
        while offset < size and not self.failed and self.lane.send_room():  # type: ignore[union-attr]
            n = min(limit, size - offset)
            packet = self.state.send(Kind.PIECE, 0, n, None, 0)
            if packet is None:
                break
            slot, header = packet
            self.post(slot, header, b"", view[offset : offset + n])
            offset += n
        return offset

    @cython.cfunc
    def _flush(self) -> None:
        """Post what the lane staged. If the provider refused part of it, so
        does the channel fail (the credits spent cannot be given back)."""
        rc: cython.int = self.lane.flush()  # type: ignore[union-attr]
        if rc:
            for slot in self.lane.unposted:  # type: ignore[union-attr]
                self.state.sent(slot)
            exc = DeviceError(rc, f"ibv_post_send failed: {os.strerror(rc)}")
            self._report(Event.FAILED, exc)
            raise exc

    @cython.ccall
    def sent(self, slot: cython.int) -> None:
        """The packet in send slot ``slot`` went (called from the completion drain)."""
        self.state.sent(slot)
        self.pump()

    # -- receiving ---------------------------------------------------------

    @cython.ccall
    def arrived(self, slot: cython.int, size: cython.Py_ssize_t) -> None:
        """A packet of ``size`` bytes landed in receive slot ``slot`` (called
        from the completion drain)."""
        if self.failed:
            if self._shared is not None:
                self._shared.repost(slot)
            return
        state = self.state
        start: cython.Py_ssize_t = slot * self.size
        ended: cython.ulonglong
        offer: cython.bint
        repost: cython.bint
        try:
            if cython.compiled and _WIRE.header_size <= size <= self.size:
                header = load_header(address_of(self.recv_view, False) + start, size,
                                     self.max_message)  # fmt: skip
            else:
                header = Header.unpack(self.recv_view[start : start + size], self.max_message)
            if header.code == _WIRE.hello:
                hello = Hello.unpack(self.recv_view[start + _WIRE.header_size : start + size])
                self.eager_limit = min(self.size, hello.buffer_size) - _WIRE.header_size
                self._report(Event.HEARD, hello)
                if self.failed:  # the shell refused it (another protocol): not applied
                    return
            offered: cython.Py_ssize_t = 1
            ended, offer, repost = state.arrived(slot, header, size)
            if header.code == _WIRE.batch:
                offer = not state.ready
                offered = self._split(slot, header, start + _WIRE.header_size)
        except (ProtocolError, ValueError) as err:
            self._report(Event.BROKEN, err)
            return
        if header.code == _WIRE.credit or header.code == _WIRE.control_credit:
            self._add("credit_updates_received")
        if ended:
            self._report(Event.ENDED, ended)
        if state.acks_due:
            self._report(Event.ANSWER, None)
        sink = self._sink
        if sink is not None and header.code == _WIRE.piece:
            self._sink_offset = self._copy_pieces(sink, self._sink_target, self._sink_offset)
            if self._sink_offset == sink.header.length:
                self._sink = None  # whole: its task wakes below
        if repost:
            self.repost(slot)
        elif offer and self.deliver is not None and self._all_delivered(offered):
            # Taken (or dropped) by the hook: nothing arrived for a receiving
            # task, which is not woken; credits the packet carried may have
            # come for a sending one.
            self._update()
            if self.waiters:
                self._wake(False)
            return
        self.pump()

    @cython.cfunc
    @cython.exceptval(-1, check=True)
    def _split(
        self, slot: cython.int, header: Header, start: cython.Py_ssize_t
    ) -> cython.Py_ssize_t:
        """Queue the messages of the BATCH packet in ``slot`` (its payload at
        ``start``), each copied out; how many."""
        with self.recv_view[start : start + header.length] as payload:
            entries = batch_entries(payload, header.msg_id, self.max_message)
            parts = [(head, bytes(payload[at : at + head + n])) for at, head, n in entries]
        self.state.queue_batch(slot, parts)
        return len(parts)

    @cython.cfunc
    @cython.exceptval(check=True)
    def _all_delivered(self, count: cython.Py_ssize_t) -> cython.bint:
        """Offer the first ``count`` queued messages (eager ones, just arrived)
        to the delivery hook in order, taking each it takes (or drops);
        whether it took them all."""
        ready = self.state.ready
        while count > 0:
            if self.failed or not ready or not self._delivered(ready[0]):
                return False
            self._take_first()
            count -= 1
        return True

    @cython.cfunc
    @cython.exceptval(check=True)
    def _delivered(self, arrival: Arrival) -> cython.bint:
        """Offer an eager message to the delivery hook, straight from its
        buffer (or its copy, a BATCH's); whether it is to be taken off the
        queue (taken by the hook, or dropped: the hook failed)."""
        header: Header = arrival.header
        start: cython.Py_ssize_t = 0
        if arrival.saved is None:
            start = arrival.slot * self.size + _WIRE.header_size
            whole = self.recv_view
        else:
            whole = memoryview(arrival.saved)
        end: cython.Py_ssize_t = start + header.head_length
        taken: cython.bint
        try:
            head = bytes(whole[start:end])
            with whole[end : end + header.length] as body:  # valid during the call only
                taken = self.deliver(head, body)  # type: ignore[misc]
            if taken:
                self.count_received(header)
            return taken
        except ProtocolError as err:
            self._report(Event.BROKEN, err)
        except Exception as exc:  # the hook's bug must not stall the channel
            self._loop.call_exception_handler(
                {"message": "message delivery hook failed", "exception": exc}
            )
        return True

    def first(self) -> Arrival | None:
        """The first queued message, if one is there and readable (after a
        failure, only what was saved of it)."""
        ready = self.state.ready
        if ready:
            arrival: Arrival = ready[0]
            if not self.failed or arrival.saved is not None:
                return arrival
        return None

    def eager_first(self) -> Arrival | None:
        """The first queued message if it is a small one nobody waits ahead
        for (it may be taken without a turn)."""
        ready = self.state.ready
        if ready and not self.failed and not self.receivers:
            arrival: Arrival = ready[0]
            if arrival.header.code == _WIRE.eager:
                return arrival
        return None

    def queued(self) -> int:
        """Messages queued (arrived and not taken)."""
        return len(self.state.ready)

    @cython.ccall
    def needs_turn(self) -> cython.bint:
        """Whether a receive that found nothing to take at once must take its
        turn (someone is ahead, a message is queued, or the channel failed)
        rather than wait for an arrival."""
        return self.receivers > 0 or len(self.state.ready) > 0 or self.failed

    @cython.ccall
    def take_eager(self, into: Into | None) -> bytes | int | None:
        """Take the first queued message now if it is a small one and nobody
        waits ahead: its body as bytes (``into`` None), or its length once
        copied into ``into`` (checked by the caller to take a body). None
        when it cannot be taken so (nothing queued, a larger message, a
        receive ahead, a failed channel, ``into`` too short: the slow path
        says why)."""
        ready = self.state.ready
        if not ready or self.receivers or self.failed:
            return None
        arrival: Arrival = ready[0]
        header: Header = arrival.header
        if header.code != _WIRE.eager:
            return None
        if into is not None:
            room: cython.Py_ssize_t
            if type(into) is bytearray:
                room = len(into)
            elif type(into) is memoryview:
                room = into.nbytes
            else:
                return None
            if room < header.length:
                return None
        body = self.small_body(arrival, into)
        self.consumed()
        self.count_received(header)
        return body

    @cython.ccall
    def take_eagers(self, limit: cython.Py_ssize_t) -> list[bytes | bytearray]:
        """Take queued small messages as :meth:`take_eager` (``into`` None)
        would, up to ``limit``, stopping at the first it cannot: their
        bodies in order (none when the first cannot be taken so)."""
        bodies: list[bytes | bytearray] = []
        while len(bodies) < limit:
            body = self.take_eager(None)
            if not isinstance(body, bytes):  # None (an int comes only with a buffer)
                break
            bodies.append(body)
        return bodies

    @cython.ccall
    @cython.exceptval(-2, check=True)
    def take_medium(self, into: Into) -> cython.Py_ssize_t:
        """Take the first queued message now if it is a MEDIUM one whose
        pieces have all arrived, nobody waits ahead and ``into`` (a
        ``bytearray`` or ``memoryview``) holds it: its length, once copied
        and its buffers given back. -1 when it cannot be taken so (pieces
        still to come, a receive ahead or resumed, another kind of message
        or buffer, ``into`` too short, a failed channel: the slow path
        takes it, or says why)."""
        ready = self.state.ready
        if not ready or self.receivers or self.failed:
            return -1
        arrival: Arrival = ready[0]
        header: Header = arrival.header
        if (header.code != _WIRE.medium or arrival.missing or arrival.taken is not None
                or arrival.saved is not None or arrival.revoked):  # fmt: skip
            return -1
        if type(into) is not bytearray and type(into) is not memoryview:
            return -1
        length: cython.Py_ssize_t = header.length
        with buffer_view(into) as target:
            if len(target) < length:
                return -1
            offset = self._first_packet(arrival, target)
            offset = self._copy_pieces(arrival, target, offset)
        self.consumed()
        self.count_received(header)
        return offset

    @cython.ccall
    def head(self, arrival: Arrival) -> bytes:
        """The head of a queued message."""
        header: Header = arrival.header
        if arrival.saved is not None:
            return arrival.saved[: header.head_length]
        if arrival.taken is not None:
            return arrival.taken[: header.head_length]
        start: cython.Py_ssize_t = arrival.slot * self.size + _WIRE.header_size
        return bytes(self.recv_view[start : start + header.head_length])

    @cython.ccall
    def small_body(self, arrival: Arrival, into: Into | None) -> bytes | int:
        """An eager (or saved) message's body: a copy, or its length once put
        in ``into`` (long enough: checked by the caller)."""
        header: Header = arrival.header
        length: cython.Py_ssize_t = header.length
        if arrival.saved is not None:
            body = arrival.saved[header.head_length :]
            if into is None:
                return body
            with buffer_view(into) as target:
                target[:length] = body
            return length
        start: cython.Py_ssize_t = arrival.slot * self.size + _WIRE.header_size + header.head_length
        if cython.compiled and self.recv_open:
            copied = copy_out(self.recv_view, start, length, into)
            if copied is not None:
                return copied
        data = self.recv_view[start : start + length]
        if into is None:
            return bytes(data)
        with buffer_view(into) as target:
            target[:length] = data
        return length

    @cython.ccall
    def take_pieces(
        self, arrival: Arrival, target: View, offset: cython.Py_ssize_t
    ) -> cython.Py_ssize_t:
        """Copy every PIECE of the MEDIUM message being taken that arrived
        into ``target`` (a flat writable view of its body, filled up to
        ``offset``), giving each buffer back as it is copied; returns how far
        the body is filled. The channel must not have failed."""
        offset = self._copy_pieces(arrival, target, offset)
        self.pump()
        return offset

    @cython.cfunc
    @cython.exceptval(-1, check=True)
    def _copy_pieces(
        self, arrival: Arrival, target: View, offset: cython.Py_ssize_t
    ) -> cython.Py_ssize_t:
        """:meth:`take_pieces` without the wake-up."""
        pieces = arrival.pieces
        slot: cython.int
        length: cython.Py_ssize_t
        start: cython.Py_ssize_t
        while pieces:
            slot, length = pieces.popleft()
            start = slot * self.size + _WIRE.header_size
            if not (cython.compiled and self.recv_open and copy_within(
                target, offset, self.recv_view, start, length
            )):  # fmt: skip
                target[offset : offset + length] = self.recv_view[start : start + length]
            offset += length
            if self.state.piece_taken():
                self.repost(slot)
        return offset

    def fill(self, arrival: Arrival, target: View, offset: int) -> None:
        """Copy the PIECEs of ``arrival`` (the MEDIUM message being taken, not
        yet whole, its pieces so far taken) into ``target`` as they land,
        from the completion drain; the receiving task is woken once the body
        is whole (or the channel changes state), not for each piece. Call
        order: ``fill -> (await arrivals) -> filled``."""
        self._sink = arrival
        self._sink_target = target
        self._sink_offset = offset

    def filled(self) -> int:
        """Stop :meth:`fill`; how far the body is filled."""
        self._sink = None
        self._sink_target = _NO_TARGET
        return self._sink_offset

    def begin_medium(self, arrival: Arrival, target: View) -> tuple[bytes, int]:
        """Start taking a MEDIUM message into ``target`` (a flat writable view
        of its body): copy what its first packet carried, or what a cancelled
        receive kept of it, and give its first buffer back. Returns its head
        and how far the body is filled."""
        header: Header = arrival.header
        head_length: cython.Py_ssize_t = header.head_length
        offset: cython.Py_ssize_t
        taken = arrival.taken
        if taken is not None:  # a cancelled receive copied this much
            head = taken[:head_length]
            offset = len(taken) - head_length
            target[:offset] = memoryview(taken)[head_length:]
            arrival.taken = None
            return head, offset
        start: cython.Py_ssize_t = arrival.slot * self.size + _WIRE.header_size
        head = bytes(self.recv_view[start : start + head_length])
        offset = self._first_packet(arrival, target)
        self.pump()
        return head, offset

    @cython.cfunc
    @cython.exceptval(-1, check=True)
    def _first_packet(self, arrival: Arrival, target: View) -> cython.Py_ssize_t:
        """Copy the body bytes of a MEDIUM message's first packet (still in
        its buffer) to the start of ``target`` and give the buffer back;
        how many were copied. No wake-up."""
        start: cython.Py_ssize_t = arrival.slot * self.size + _WIRE.header_size
        end: cython.Py_ssize_t = start + arrival.size - _WIRE.header_size
        start += arrival.header.head_length
        target[: end - start] = self.recv_view[start:end]
        if self.state.piece_taken():
            self.repost(arrival.slot)
        arrival.slot = -1
        return end - start

    def keep_taken(self, arrival: Arrival, head: bytes, target: View, offset: int) -> None:
        """A receive taking a MEDIUM message was cancelled with its body filled
        up to ``offset``: keep that, and the next receive resumes from it."""
        arrival.taken = head + bytes(target[:offset])

    def read_started(self, arrival: Arrival) -> None:
        """This side began reading a rendezvous message's body."""
        arrival.reading = True

    def read_stopped(self, arrival: Arrival) -> None:
        """The read of ``arrival``'s body failed or was cancelled (it stays
        queued); a REVOKE that came meanwhile is due an answer now."""
        self.state.read_stopped(arrival)

    def read_ended(self, arrival: Arrival) -> bool:
        """A read of ``arrival``'s body ahead of its receive landed whole (it
        stays queued); whether its sender is owed a DONE now."""
        return self.state.read_ended(arrival)

    def unread(self, least: int) -> list[Arrival]:
        """Queued rendezvous messages above ``least`` bytes nothing reads yet,
        in order (none once the channel failed)."""
        return [] if self.failed else self.state.unread(least)

    def acks(self) -> list[int]:
        """Take the ids of the revoked messages due an answer (a DONE each)."""
        due = self.state.acks_due
        self.state.acks_due = []
        return due

    @cython.ccall
    def repost(self, slot: cython.int) -> cython.bint:
        """Post receive buffer ``slot`` again; whether its credit may be granted."""
        shared = self._shared
        if shared is not None:
            if slot < 0:  # given back to the pool when the channel failed
                return False
            try:
                shared.repost(slot)
            except (RdmaError, ResourceClosedError) as exc:
                self._report(Event.FAILED, exc)
                return False
            return not self.failed
        if self.failed:
            return False
        try:
            self.lane.recv(slot)  # type: ignore[union-attr]
        except (RdmaError, ResourceClosedError) as exc:
            self._report(Event.FAILED, exc)
            return False
        return True

    @cython.ccall
    def consumed(self) -> None:
        """The first queued message was taken: its buffer goes back, its
        sender may be owed a DONE."""
        self._take_first()
        self.pump()

    @cython.cfunc
    def _take_first(self) -> None:
        arrival: Arrival
        done_due: cython.bint
        arrival, done_due = self.state.take()
        if arrival.slot >= 0:  # not a medium message's, given back already
            self.repost(arrival.slot)
        if done_due:
            self._report(Event.DONE_DUE, arrival.header.msg_id)

    @cython.cfunc
    def _count(self, name: str, amount_name: str, amount: cython.Py_ssize_t) -> None:
        """:meth:`Stats.count <aiordma.metrics.Stats.count>`, with no Python frame."""
        if metrics._on:
            tally(self._stats.counters, name, amount_name, amount)

    @cython.cfunc
    def _add(self, name: str) -> None:
        """:meth:`Stats.add <aiordma.metrics.Stats.add>` of one, with no Python frame."""
        if metrics._on:
            self._stats.counters[name] += 1

    @cython.ccall
    def count_received(self, header: Header) -> None:
        self._count("messages_received", "bytes_received", header.length)
        if header.code == _WIRE.rendezvous:
            self._add("large_received")

    # -- credits and wake-ups ----------------------------------------------

    @cython.ccall
    def pump(self) -> None:
        """Return owed credits if an update is due, and wake waiters (not the
        receiving task while the pieces it waits for are copied for it)."""
        self._update()
        if self._sink is not None:
            if self.waiters:
                self._wake(False)
        elif self.waiters or self.receiving:
            self.wake()

    @cython.cfunc
    def _update(self) -> None:
        """Return owed credits if an update is due."""
        if not self.failed and not self.room_pending and self.state.update_due():
            if not self.lane.send_room():  # type: ignore[union-attr]
                self.room_pending = True  # the shell calls room_came once there is room
                self._report(Event.WAIT_ROOM, None)
            else:
                packet = self.state.update()
                if packet is not None:
                    slot: cython.int
                    header: Header
                    slot, header = packet
                    try:
                        self.post(slot, header, b"", None)
                    except (RdmaError, ResourceClosedError):
                        return  # the channel failed
                    self._add("credit_updates_sent")

    def room_came(self) -> None:
        """The send queue has room again (or never will): the credit update
        :data:`Event.WAIT_ROOM` held back may go."""
        self.room_pending = False
        self.pump()

    @cython.ccall
    def wake(self) -> None:
        """Wake every task waiting in :meth:`changed` or :meth:`arrivals`."""
        self._wake(True)

    @cython.cfunc
    def _wake(self, receiving: cython.bint) -> None:
        """Wake the tasks waiting in :meth:`changed` (and in :meth:`arrivals`
        if ``receiving``)."""
        waiters = self.waiters
        self.waiters = []
        if receiving and self.receiving:
            waiters += self.receiving
            self.receiving = []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    @cython.ccall
    def changed(self) -> asyncio.Future[None]:
        """A future that resolves when credits, send slots, arrivals or the
        channel's state change (the caller checked the loop)."""
        fut: asyncio.Future[None] = self._loop.create_future()
        self.waiters.append(fut)
        return fut

    @cython.ccall
    def arrivals(self) -> asyncio.Future[None]:
        """:meth:`changed`, but not resolved by a message the delivery hook
        took: what a task waiting for the next message or piece awaits (a
        hook that takes every small message then costs it no wake-up)."""
        fut: asyncio.Future[None] = self._loop.create_future()
        self.receiving.append(fut)
        return fut

    # -- failing -----------------------------------------------------------

    def fail(self) -> None:
        """The channel failed: post nothing more and read no receive slot
        again. What already arrived whole stays readable, as TCP keeps it:
        small messages and whole MEDIUM ones are copied out first. Buffers
        of a shared queue go back to the pool, and the view of the receive
        slots is released, so the region can be unmapped."""
        if self.failed:
            return
        self.failed = True
        self.state.fail()
        if (
            self.recv_open
            and _usable(self.recv_view)  # a region of its own: released with it
            and (self._shared is None or not self._shared.closed)  # a pool's
        ):
            for arrival in self.state.ready:
                kind = arrival.header.code
                if kind == _WIRE.eager and arrival.saved is None:
                    start = arrival.slot * self.size
                    arrival.saved = bytes(
                        self.recv_view[start + _WIRE.header_size : start + arrival.size]
                    )
                elif (  # whole, and not being taken now
                    kind == _WIRE.medium
                    and arrival.missing == 0
                    and (arrival.slot >= 0 or arrival.taken is not None)
                ):
                    arrival.saved = self._medium_bytes(arrival)
        self.recv_open = False
        if self._shared is not None:  # a shared buffer goes back to the pool now
            for arrival in self.state.ready:
                if arrival.slot >= 0:
                    self._shared.repost(arrival.slot)
                    arrival.slot = -1
                while arrival.pieces:
                    self._shared.repost(arrival.pieces.popleft()[0])
        with contextlib.suppress(BufferError):  # a delivery hook still holds a body
            self.recv_view.release()
        self.wake()

    def _medium_bytes(self, arrival: Arrival) -> bytes:
        """A whole MEDIUM message's head and body, copied out of its buffers."""
        whole = self.recv_view
        parts: list[bytes] = []
        if arrival.taken is not None:
            parts.append(arrival.taken)
        else:
            start = arrival.slot * self.size
            parts.append(bytes(whole[start + HEADER_SIZE : start + arrival.size]))
        assert arrival.pieces is not None
        for slot, length in arrival.pieces:
            start = slot * self.size + HEADER_SIZE
            parts.append(bytes(whole[start : start + length]))
        return b"".join(parts)


def _usable(view: memoryview) -> bool:
    """Whether ``view`` was not released (its region is still mapped)."""
    try:
        return view.nbytes >= 0
    except ValueError:
        return False


if not cython.compiled:  # packets.pxd's and wire.pxd's C helpers, never called interpreted

    def address_of(buf: object, writable: bool) -> int:
        raise NotImplementedError

    def store_header(p: int, header: Header, addr: int, rkey: int) -> None:
        raise NotImplementedError

    def load_header(p: int, size: int, limit: int) -> Header:
        raise NotImplementedError

    def copy_in(view: object, offset: int, data: object, room: int) -> int:
        raise NotImplementedError

    def copy_out(view: object, offset: int, n: int, into: object) -> bytes | int | None:
        raise NotImplementedError

    def copy_within(target: object, offset: int, source: object, start: int, n: int) -> bool:
        raise NotImplementedError
