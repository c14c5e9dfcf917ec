# cython: annotation_typing=True
"""A message channel's packet core: the wire, below the async shell.

:class:`Packets` owns one side's packets and the
:class:`~aiordma.channel.state.ChannelState` they drive (nothing else
touches it): the send slots, posting a packet, parsing what landed and
applying its credits, the eager limit both HELLOs decide, the send and
receive turns, reposting receive buffers, owed credits and waking the
waiting tasks. What a message's packets carry goes to its
:class:`~aiordma.channel.inbox.Inbox`, the queued messages' one owner;
the buffers a take copied out are reposted here after it. A small message
is one call on each side (:meth:`Outbox.send_eager
<aiordma.channel.outbox.Outbox.send_eager>`, :meth:`Packets.take_eager`),
in C when compiled (``packets.pxd``), with no Python frame between the
application and the verbs.

Its one I/O dependency is the queue pair's :class:`~aiordma.channel.link.Lane`.
What the shell must do (fail, check the peer's HELLO, end an exposure,
answer revocations, send a DONE, wait for send-queue room) it is told
through one callable, ``report(event, value)`` (see :class:`Event`); it
never calls back into the shell otherwise.

Call order: ``attach -> post_receives? -> (send_hello | try_send | hold | flush
| post | sent | arrived | take_eager | take_eagers | take_medium | begin_medium |
take_pieces | consumed | pump)* -> fail`` (``fail`` once; afterwards nothing
is posted and the receive slots are not read).
"""

from __future__ import annotations

import asyncio
import enum
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from aiordma import metrics
from aiordma.channel.buffers import Body, Into
from aiordma.channel.credits import DataCredits
from aiordma.channel.inbox import Arrival, Inbox, Owed
from aiordma.channel.state import ChannelState
from aiordma.channel.waiters import Waiters
from aiordma.channel.wire import (
    HEADER_SIZE,
    WIRE,
    Header,
    Hello,
    Kind,
    WireCodes,
    read_packet,
    write_packet,
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
    """Revocations are due an answer, once no read is in flight (see
    :meth:`Inbox.acks <aiordma.channel.inbox.Inbox.acks>`)."""
    DONE_DUE = 6
    """A large message was taken: its sender is owed a DONE (value: its id)."""
    WAIT_ROOM = 7
    """A credit update is due and the send queue is full: call
    :meth:`Packets.room_came` once there is room."""


EventReport = Callable[[Event, object], None]

POSTED = 0
""":meth:`Packets.try_send`: the packet went."""
NO_ROOM = 1
""":meth:`Packets.try_send`: the send queue is full."""
NO_CREDIT = 2
""":meth:`Packets.try_send`: no send slot or no credit for it yet."""
_POSTED = cython.declare(cython.int, POSTED)
_DONE = cython.declare(cython.int, Owed.DONE)
_DROPPED = cython.declare(cython.int, Owed.DROPPED)


def _report_nothing(event: Event, value: object) -> None:
    """A failed channel's packets report nothing."""


@cython.cclass
class Packets:
    """The packets of one channel side through its send and receive slots.

    ``window``, ``control_window`` and ``send_slots`` size the state (``data``
    replaces its data credits when ``shared``, the shared receive queue the
    receive slots belong to, lends them). ``send_view`` and ``recv_view``
    are views of the channel's two registered regions, held for the
    channel's life (the receive one, by the :attr:`inbox`, until
    :meth:`fail`): slot ``i`` is bytes ``[i * size, (i + 1) * size)``.
    ``stats`` counts messages and bytes; ``report`` is told what the shell
    must do.

    Its parts, in this order below: set-up, what the shell reads, the send
    and receive turns, posting, receiving (arrivals, the one-call takes,
    reposting), credits and wake-ups (its :attr:`waiting` tasks, woken in C
    from the completion drain), failing.
    """

    def __init__(
        self, report: EventReport, window: int, control_window: int, send_slots: int,
        data: DataCredits | None, send_view: memoryview, recv_view: memoryview, size: int,
        max_message: int, stats: Stats, shared: SharedPool | None,
        loop: asyncio.AbstractEventLoop,
    ) -> None:  # fmt: skip
        self.state = ChannelState(window, control_window, send_slots=send_slots, data=data)
        self.inbox = Inbox(recv_view, size, max_message)
        self.lane: Lane = None  # type: ignore[assignment]  # (attach() sets it before any use)
        self.size = size
        self.send_view = send_view
        self.max_message = max_message
        self.eager_limit = size - HEADER_SIZE
        """Head and body bytes a single packet carries (lowered to fit the
        peer's receive buffers once its HELLO came)."""
        self.deliver: Callable[[bytes, memoryview], bool] | None = None
        """Where small messages are offered as they arrive (see
        ``MessageChannel.deliver_to``)."""
        self.failed = False
        self.senders = 0
        """Sends holding or waiting for the channel's send turn: while there
        are any, the one-call send leaves the message to wait its turn."""
        self.receivers = 0
        """Receives holding or waiting for the receive turn (likewise for
        :meth:`take_eager`)."""
        self.room_pending = False
        """A credit update waits for room in the send queue (see :meth:`room_came`)."""
        self.waiting = Waiters(loop)
        self._report = report
        self._stats = stats
        self._shared = shared
        self._loop = loop

    def let_go(self) -> None:
        """The channel failed: report nothing more to it (no reference back to it)."""
        self._report = _report_nothing

    def attach(self, lane: Lane) -> None:
        """The lane the packets go out through (made with this object's
        :meth:`sent` and :meth:`arrived` as its callbacks)."""
        self.lane = lane

    def post_receives(self) -> None:
        """Post every receive slot (not on a shared queue: the pool posts those)."""
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

    # -- sending -----------------------------------------------------------

    @cython.ccall
    def post(self, slot: cython.int, header: Header, head: Bytes, body: Body | None) -> None:
        """Post the packet :meth:`ChannelState.send` granted (send slot
        ``slot``, stamped ``header``) with ``head`` and ``body`` (None, or a
        bytes-like part of a message) after the header; room in the send
        queue was checked. If that fails, so does the channel: the credits
        it spent cannot be given back."""
        try:
            length = write_packet(self.send_view, slot * self.size, self.size, header, head, body)
            self.lane.send(slot, length)
        except BaseException as exc:
            self.state.sent(slot)
            self._report(Event.FAILED, exc)
            raise

    def send_hello(self, max_message: int, hello: bytes) -> bool:
        """Post our HELLO (``max_message``, our windows and first grants, and
        ``hello`` after the header) now; False if the send queue is full."""
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
        if not self.lane.send_room():
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
    def hold(self) -> None:
        """Stage the packets posted from now on, to post them as one chain at
        :meth:`flush`. Call order: ``hold -> (try_send | post)* -> flush``."""
        self.lane.hold()

    @cython.ccall
    def flush(self) -> None:
        """Post what :meth:`hold` staged. If the provider refused part of it, so
        does the channel fail (the credits spent cannot be given back)."""
        rc: cython.int = self.lane.flush()
        if rc:
            for slot in self.lane.unposted:
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
        """``size`` bytes landed in receive slot ``slot`` (from the completion drain)."""
        if self.failed:
            if self._shared is not None:
                self._shared.repost(slot)
            return
        inbox = self.inbox
        view = inbox.view
        start: cython.Py_ssize_t = slot * self.size
        ended: cython.ulonglong
        repost: cython.bint
        offered: cython.Py_ssize_t = 0
        try:
            header = read_packet(view, start, size, self.size, self.max_message)
            code: cython.int = header.code
            if code == _WIRE.hello:
                hello = Hello.unpack(view[start + _WIRE.header_size : start + size])
                self.eager_limit = min(self.size, hello.buffer_size) - _WIRE.header_size
                self._report(Event.HEARD, hello)
                if self.failed:  # the shell refused it (another protocol): not applied
                    return
            ended, repost = self.state.arrived(header)
            if code == _WIRE.revoke:
                inbox.revoke(header.msg_id)
            elif not repost:
                offered = inbox.arrived(slot, header, size)
        except (ProtocolError, ValueError) as err:
            self._report(Event.BROKEN, err)
            return
        if code == _WIRE.credit or code == _WIRE.control_credit:
            self._add("credit_updates_received")
        if ended:
            self._report(Event.ENDED, ended)
        if inbox.acks_due:
            self._report(Event.ANSWER, None)
        if code == _WIRE.piece and inbox.sink is not None:
            inbox.sink_pieces()  # whole: its task wakes below
            self._give_back()
        if repost:
            self.repost(slot)
        elif offered and self.deliver is not None and self._all_delivered(offered):
            # Taken (or dropped) by the hook: nothing arrived for a receiving
            # task, which is not woken; credits the packet carried may have
            # come for a sending one.
            self._update()
            self.waiting.wake(False)
            return
        self.pump()

    @cython.cfunc
    @cython.exceptval(check=True)
    def _all_delivered(self, count: cython.Py_ssize_t) -> cython.bint:
        """Offer the first ``count`` queued messages (eager ones, just arrived)
        to the delivery hook in order, taking each it takes (or drops);
        whether it took them all."""
        inbox = self.inbox
        while count > 0:
            arrival = inbox.eager_first()
            if self.failed or arrival is None or not self._delivered(arrival):
                return False
            self._take_first(False)
            count -= 1
        return True

    @cython.cfunc
    @cython.exceptval(check=True)
    def _delivered(self, arrival: Arrival) -> cython.bint:
        """Offer an eager message to the delivery hook, straight from its
        buffer (or its copy, a BATCH's); whether it is to be taken off the
        queue (taken by the hook, or dropped: the hook failed)."""
        taken: cython.bint
        try:
            head, body = self.inbox.offered(arrival)
            with body:  # valid during the call only
                taken = self.deliver(head, body)  # type: ignore[misc]
            if taken:
                self._count_received(arrival.header)
            return taken
        except ProtocolError as err:
            self._report(Event.BROKEN, err)
        except Exception as exc:  # the hook's bug must not stall the channel
            self._loop.call_exception_handler(
                {"message": "message delivery hook failed", "exception": exc}
            )
        return True

    @cython.ccall
    def eager_first(self) -> Arrival | None:
        """The first queued message if it is a small one nobody waits ahead
        for (it may be taken without a turn)."""
        if self.receivers or self.failed:
            return None
        return self.inbox.eager_first()

    @cython.ccall
    def needs_turn(self) -> cython.bint:
        """Whether a receive that found nothing to take at once must take its
        turn (someone is ahead, a message is queued, or the channel failed)
        rather than wait for an arrival."""
        return self.receivers > 0 or len(self.inbox.ready) > 0 or self.failed

    @cython.ccall
    def take_eager(self, into: Into | None) -> bytes | int | None:
        """Take the first queued message now if it is small and nobody waits
        ahead: its body as bytes (``into`` None), or its length once copied
        into ``into`` (checked by the caller). None when it cannot be taken so
        (nothing queued, a larger message, a receive ahead, a failed channel,
        ``into`` too short: the slow path says why)."""
        arrival = self.eager_first()
        if arrival is None:
            return None
        if into is not None:
            room: cython.Py_ssize_t
            if type(into) is bytearray:
                room = len(into)
            elif type(into) is memoryview:
                room = into.nbytes
            else:
                return None
            if room < arrival.header.length:
                return None
        body = self.inbox.small_body(arrival, into)
        self.consumed()
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
        if self.receivers or self.failed:
            return -1
        length: cython.Py_ssize_t = self.inbox.take_medium(into)
        if length >= 0:
            self.consumed()
        return length

    def begin_medium(self, arrival: Arrival, target: View) -> tuple[bytes, int]:
        """:meth:`Inbox.begin_medium <aiordma.channel.inbox.Inbox.begin_medium>`,
        giving back the buffer it copied."""
        head, offset = self.inbox.begin_medium(arrival, target)
        if self._give_back():
            self.pump()
        return head, offset

    @cython.ccall
    def take_pieces(
        self, arrival: Arrival, target: View, offset: cython.Py_ssize_t
    ) -> cython.Py_ssize_t:
        """:meth:`Inbox.copy_pieces <aiordma.channel.inbox.Inbox.copy_pieces>`,
        giving each buffer back. The channel must not have failed."""
        offset = self.inbox.copy_pieces(arrival, target, offset)
        self._give_back()
        self.pump()
        return offset

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
            self.lane.recv(slot)
        except (RdmaError, ResourceClosedError) as exc:
            self._report(Event.FAILED, exc)
            return False
        return True

    @cython.ccall
    def consumed(self) -> None:
        """The first queued message was taken: its buffer goes back, its
        sender may be owed a DONE, and it is counted received (unless its
        sender withdrew it)."""
        self._take_first(True)
        self.pump()

    @cython.cfunc
    def _take_first(self, count: cython.bint) -> None:
        arrival: Arrival
        owed: cython.int
        arrival, owed = self.inbox.take()
        if arrival.header.code == _WIRE.record:  # its ring space is owed now
            self.state.ring_freed()
        self._give_back()
        if owed == _DONE:
            self._report(Event.DONE_DUE, arrival.header.msg_id)
        if count and owed != _DROPPED:
            self._count_received(arrival.header)

    @cython.cfunc
    @cython.exceptval(check=True)
    def _give_back(self) -> cython.bint:
        """Repost the buffers the inbox freed, whether any were (the list is
        emptied in place, even if a repost raises: none is reposted twice)."""
        freed = self.inbox.freed
        if not freed:
            return False
        slot: cython.int
        try:
            for slot in freed:
                if self.state.emptied():
                    self.repost(slot)
        finally:
            freed.clear()
        return True

    @cython.cfunc
    def _add(self, name: str) -> None:
        """:meth:`Stats.add <aiordma.metrics.Stats.add>` of one, with no Python frame."""
        if metrics._on:
            self._stats.counters[name] += 1

    @cython.cfunc
    def _count_received(self, header: Header) -> None:
        """Count a message received, with no Python frame."""
        if metrics._on:
            tally(self._stats.counters, "messages_received", "bytes_received", header.length)
            if header.code == _WIRE.rendezvous:
                self._stats.counters["large_received"] += 1

    # -- credits and wake-ups ----------------------------------------------

    @cython.ccall
    def pump(self) -> None:
        """Return owed credits if an update is due, and wake waiters (not the
        receiving task while the pieces it waits for are copied for it)."""
        self._update()
        self.waiting.wake(self.inbox.sink is None)

    @cython.cfunc
    def _update(self) -> None:
        """Return owed credits if an update is due."""
        if not self.failed and not self.room_pending and self.state.update_due():
            if not self.lane.send_room():
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
        """Wake every waiting task."""
        self.waiting.wake(True)

    # -- failing -----------------------------------------------------------

    def fail(self) -> None:
        """The channel failed: post nothing more and read no receive slot
        again. What arrived whole stays readable, as TCP keeps it (the inbox
        copies it out); a shared queue's buffers go back to its pool."""
        if self.failed:
            return
        self.failed = True
        self.state.fail()
        inbox = self.inbox
        shared = self._shared
        save = (
            inbox.open
            and _usable(inbox.view)  # a region of its own: released with it
            and (shared is None or not shared.closed)  # a pool's
        )
        for slot in inbox.close(save, shared is not None):  # a shared buffer goes back now
            shared.repost(slot)  # type: ignore[union-attr]
        self.wake()


def _usable(view: memoryview) -> bool:
    """Whether ``view`` was not released (its region is still mapped)."""
    try:
        return view.nbytes >= 0
    except ValueError:
        return False
