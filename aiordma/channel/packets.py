# cython: annotation_typing=True
"""A message channel's packets: out of its send slots, into its receive slots.

:class:`Packets` is the per-packet half of a
:class:`~aiordma.MessageChannel`: it stamps and copies a packet into a send
slot and posts it, and, called by the completion drain, parses what landed
in a receive slot, applies it to the :class:`~aiordma.channel.state.ChannelState`,
reposts control buffers, returns owed credits and wakes the task waiting
for the channel to change. A small message is one call on each side:
:meth:`Packets.send_eager` to send it, :meth:`Packets.take_eager` to take
it once it arrived. Compiled (``packets.pxd``), those calls run in C with no
Python frame between the application and the verbs; the channel keeps
what waits (credit, room, large messages) and how it fails.

Call order: ``attach -> (post | send_eager | sent | arrived | take_eager |
consumed | pump)* -> fail`` (``fail`` once; afterwards nothing is posted and
the receive slots are not read).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from aiordma.channel.buffers import Body, Into, buffer_view
from aiordma.channel.state import Arrival, ChannelState
from aiordma.channel.wire import HEADER_SIZE, Header, Hello, Kind
from aiordma.exceptions import ProtocolError, RdmaError, ResourceClosedError

if TYPE_CHECKING:
    from typing import Protocol

    from aiordma import _cython_shim as cython
    from aiordma.metrics import Stats

    class Owner(Protocol):
        """What the packets need of their channel: the rare and slow paths."""

        def _fail(self, exc: BaseException) -> None: ...

        def _heard(self, hello: Hello) -> None: ...

        def _protocol_error(self, exc: Exception) -> None: ...

        def _ended(self, msg_id: int) -> None: ...

        def _answer_revokes(self) -> None: ...

        def _send_done(self, msg_id: int) -> None: ...

        def _wait_room(self) -> None: ...

    class SharedPool(Protocol):
        def repost(self, index: int) -> None: ...
else:
    try:
        import cython
    except ImportError:  # no Cython: the declarations below mean nothing
        from aiordma import _cython_shim as cython

# Kinds as C integers (wire.Kind; tests/channel/test_state.py checks state's copies).
_EAGER = cython.declare(cython.int, 1)
_RENDEZVOUS = cython.declare(cython.int, 2)
_HELLO_KIND = cython.declare(cython.int, 7)
_HEADER_SIZE = cython.declare(cython.Py_ssize_t, 40)  # wire.HEADER_SIZE

Bytes = bytes | bytearray
View = memoryview  # (an alias: typed with it, Cython would check its own memoryview type)


@cython.cfunc
@cython.inline
def _fits(header: Header) -> cython.bint:
    """Whether the header's credits fit their 16 bits (else packing it raises)."""
    return 0 <= header.credits < 0x10000 and 0 <= header.control_credits < 0x10000


@cython.cclass
class Packets:
    """The packets of one channel through its send and receive slots.

    ``send_view`` and ``recv_view`` are views of the channel's two
    registered regions, held for the channel's life (the receive one until
    :meth:`fail`): slot ``i`` is bytes ``[i * size, (i + 1) * size)``.
    ``shared`` is the shared receive queue the receive slots belong to, if
    any. ``stats`` counts messages and bytes.
    """

    def __init__(
        self, owner: Owner, state: ChannelState, send_view: memoryview, recv_view: memoryview,
        size: int, max_message: int, stats: Stats, shared: SharedPool | None,
        loop: asyncio.AbstractEventLoop,
    ) -> None:  # fmt: skip
        self.state = state
        self.lane: Any = None
        """The queue pair's packet lane, once :meth:`attach` gave it."""
        self.size = size
        self.send_view = send_view
        self.recv_view = recv_view
        self.recv_open = True
        self.max_message = max_message
        self.eager_limit = size - HEADER_SIZE
        """Head and body bytes a single packet carries (lowered to fit the
        peer's receive buffers once its HELLO came)."""
        self.deliver: Any = None
        """Takes small messages as they arrive (see ``MessageChannel.deliver_to``)."""
        self.failed = False
        self.senders = 0
        """Sends holding or waiting for the channel's send turn: while there
        are any, :meth:`send_eager` leaves the message to wait its turn."""
        self.receivers = 0
        """Receives holding or waiting for the receive turn (likewise for
        :meth:`take_eager`)."""
        self.room_pending = False
        """A credit update waits for room in the send queue (the owner's task)."""
        self.waiters: list[asyncio.Future[None]] = []
        self._owner = owner
        self._stats = stats
        self._shared = shared
        self._loop = loop

    def attach(self, lane: Any) -> None:
        """The lane the packets go out through (made with this object's
        :meth:`sent` and :meth:`arrived` as its callbacks)."""
        self.lane = lane

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
            end: cython.Py_ssize_t = _HEADER_SIZE + len(head)
            copied: cython.Py_ssize_t = 0
            done: cython.bint = False
            view = self.send_view
            if cython.compiled and _fits(header):
                remote = header.remote
                if remote is None:
                    store_header(address_of(view, True) + start, header, 0, 0)
                else:
                    store_header(address_of(view, True) + start, header, remote.addr, remote.rkey)
                done = copy_in(view, start + _HEADER_SIZE, head, self.size - _HEADER_SIZE) >= 0
                if done and body is not None:
                    copied = copy_in(view, start + end, body, self.size - end)
                    done = copied >= 0
            if not done:
                slot_view = view[start : start + self.size]
                header.pack_into(slot_view)
                slot_view[_HEADER_SIZE:end] = head
                if body is not None:  # EAGER's whole body, or MEDIUM's or PIECE's part of it
                    with buffer_view(body) as source:
                        copied = len(source)
                        slot_view[end : end + copied] = source
            self.lane.send(slot, end + copied)
        except BaseException as exc:
            self.state.sent(slot)
            self._owner._fail(exc)
            raise

    @cython.ccall
    def send_eager(self, head: Bytes, body: Body, size: cython.Py_ssize_t) -> cython.bint:
        """Send a message of one packet (``head`` and ``body`` of ``size``
        bytes, which fit) now, if nobody waits ahead and the send queue, a
        send slot and a credit are there; False if it must wait its turn."""
        if self.senders or self.failed or not self.lane.send_room():
            return False
        packet = self.state.send(Kind.EAGER, 0, size, None, len(head))
        if packet is None:
            return False
        slot: cython.int
        header: Header
        slot, header = packet
        self.post(slot, header, head, body)
        self._stats.count("messages_sent", "bytes_sent", size)
        return True

    @cython.ccall
    def send_pieces(
        self, view: View, offset: cython.Py_ssize_t, size: cython.Py_ssize_t
    ) -> cython.Py_ssize_t:
        """Post the PIECEs of a MEDIUM message (its body ``view`` of ``size``
        bytes, sent up to ``offset``) that the send queue, the send slots
        and the credits let go now; returns how far it is sent. The caller
        holds the send turn and waits for whatever stops it."""
        limit: cython.Py_ssize_t = self.eager_limit
        n: cython.Py_ssize_t
        slot: cython.int
        header: Header
        while offset < size and not self.failed and self.lane.send_room():
            n = min(limit, size - offset)
            packet = self.state.send(Kind.PIECE, 0, n, None, 0)
            if packet is None:
                break
            slot, header = packet
            self.post(slot, header, b"", view[offset : offset + n])
            offset += n
        return offset

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
            if cython.compiled and _HEADER_SIZE <= size <= self.size:
                header = load_header(address_of(self.recv_view, False) + start, size,
                                     self.max_message)  # fmt: skip
            else:
                header = Header.unpack(self.recv_view[start : start + size], self.max_message)
            if header.code == _HELLO_KIND:
                self._owner._heard(
                    Hello.unpack(self.recv_view[start + _HEADER_SIZE : start + size])
                )
            ended, offer, repost = state.arrived(slot, header, size)
        except (ProtocolError, ValueError) as err:
            self._owner._protocol_error(err)
            return
        if ended:
            self._owner._ended(ended)
        if state.acks_due:
            self._owner._answer_revokes()
        if repost:
            self.repost(slot)
        elif offer and self.deliver is not None and self._delivered(slot, header):
            self.consumed()
            return
        self.pump()

    @cython.cfunc
    @cython.exceptval(check=True)
    def _delivered(self, slot: cython.int, header: Header) -> cython.bint:
        """Offer an eager message to the delivery hook, straight from its
        buffer; whether it is to be taken off the queue (taken by the hook,
        or dropped: the hook failed)."""
        start: cython.Py_ssize_t = slot * self.size + _HEADER_SIZE
        end: cython.Py_ssize_t = start + header.head_length
        taken: cython.bint
        whole = self.recv_view
        try:
            head = bytes(whole[start:end])
            with whole[end : end + header.length] as body:  # valid during the call only
                taken = self.deliver(head, body)
            if taken:
                self.count_received(header)
            return taken
        except ProtocolError as err:
            self._owner._protocol_error(err)
        except Exception as exc:  # the hook's bug must not stall the channel
            self._loop.call_exception_handler(
                {"message": "message delivery hook failed", "exception": exc}
            )
        return True

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
        if header.code != _EAGER:
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
    def head(self, arrival: Arrival) -> bytes:
        """The head of a queued message."""
        header: Header = arrival.header
        if arrival.saved is not None:
            return arrival.saved[: header.head_length]
        if arrival.taken is not None:
            return arrival.taken[: header.head_length]
        start: cython.Py_ssize_t = arrival.slot * self.size + _HEADER_SIZE
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
        start: cython.Py_ssize_t = arrival.slot * self.size + _HEADER_SIZE + header.head_length
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
        pieces = arrival.pieces
        slot: cython.int
        length: cython.Py_ssize_t
        start: cython.Py_ssize_t
        while pieces:
            slot, length = pieces.popleft()
            start = slot * self.size + _HEADER_SIZE
            if not (cython.compiled and self.recv_open and copy_within(
                target, offset, self.recv_view, start, length
            )):  # fmt: skip
                target[offset : offset + length] = self.recv_view[start : start + length]
            offset += length
            if self.state.piece_taken():
                self.repost(slot)
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
                self._owner._fail(exc)
                return False
            return not self.failed
        if self.failed:
            return False
        try:
            self.lane.recv(slot)
        except (RdmaError, ResourceClosedError) as exc:
            self._owner._fail(exc)
            return False
        return True

    @cython.ccall
    def consumed(self) -> None:
        """The first queued message was taken: its buffer goes back, its
        sender may be owed a DONE."""
        arrival: Arrival
        done_due: cython.bint
        arrival, done_due = self.state.take()
        if arrival.slot >= 0:  # not a medium message's, given back already
            self.repost(arrival.slot)
        if done_due:
            self._owner._send_done(arrival.header.msg_id)
        self.pump()

    @cython.ccall
    def count_received(self, header: Header) -> None:
        self._stats.count("messages_received", "bytes_received", header.length)
        if header.code == _RENDEZVOUS:
            self._stats.add("large_received")

    # -- credits and wake-ups ----------------------------------------------

    @cython.ccall
    def pump(self) -> None:
        """Return owed credits if an update is due, and wake waiters."""
        if not self.failed and not self.room_pending and self.state.update_due():
            if not self.lane.send_room():  # the owner tries again once there is room
                self.room_pending = True
                self._owner._wait_room()
            else:
                packet = self.state.update()
                if packet is not None:
                    slot: cython.int
                    header: Header
                    slot, header = packet
                    try:  # noqa: SIM105 (compiled, a try costs nothing; a context manager, calls)
                        self.post(slot, header, b"", None)
                    except (RdmaError, ResourceClosedError):
                        pass  # the channel failed
        if self.waiters:
            self.wake()

    @cython.ccall
    def wake(self) -> None:
        """Wake every task waiting in :meth:`changed`."""
        waiters = self.waiters
        self.waiters = []
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

    # -- failing -----------------------------------------------------------

    def fail(self) -> None:
        """The channel failed: post nothing more, read no receive slot
        again (the view of them is released, so the region can be unmapped)."""
        self.failed = True
        self.recv_open = False
        with contextlib.suppress(BufferError):  # a delivery hook still holds a body
            self.recv_view.release()


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
