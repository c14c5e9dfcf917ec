"""Ordered messages of any size over a :class:`~aiordma.Connection` (or any
:class:`~aiordma.channel.link.Link`).

Small messages travel eagerly: copied into a send slot of a pool registered
once, and sent into one of the peer's pre-posted receive buffers against a
credit (see :mod:`aiordma.channel.credits`), so no send ever meets an empty
receive queue. A receive buffer is re-posted, and its credit returned, only
once the application has taken the message out of it: a slow receiver holds
the sender back instead of queueing without bound. Larger messages go by
rendezvous (:mod:`aiordma.channel.rendezvous`). Each side announces its
``max_message`` once the connection is established, so a sender learns the
peer's limit before it sends anything too large for it.

:class:`MessageChannel` does the I/O; what may be sent, what arrived and
which credit update is due are decided by its
:class:`~aiordma.channel.state.ChannelState`. One side's packets, in order:
``start -> HELLO -> (EAGER | CREDIT | CONTROL_CREDIT | RENDEZVOUS -> (DONE
| REVOKE -> DONE))* -> FAIL | CLOSE``. Per message it calls the state once
on each side: ``send`` (a slot and a stamped header, then one post),
``arrived`` (from the completion drain) and ``take`` (when the application
or the delivery hook takes the message).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

from aiordma.channel._tasks import spawn
from aiordma.channel.buffers import (
    Body,
    Into,
    body_length,
    buffer_length,
    buffer_view,
    check_into,
)
from aiordma.channel.credits import DataCredits
from aiordma.channel.link import Link
from aiordma.channel.options import (
    DEFAULT_EXPOSURE_TIMEOUT,
    DEFAULT_MAX_MESSAGE,
    DEFAULT_MEDIUM_LIMIT,
    DEFAULT_REGISTRATION_CACHE,
    DEFAULT_WINDOW,
    ChannelOptions,
)
from aiordma.channel.packets import Packets
from aiordma.channel.pool import SharedReceiveQueue
from aiordma.channel.registrations import RegistrationCache
from aiordma.channel.rendezvous import READ_PIECE, Exposure, Exposures, Reader
from aiordma.channel.state import Arrival, ChannelState
from aiordma.channel.wire import HEADER_SIZE, Hello, Kind
from aiordma.cm.connection import Connection
from aiordma.exceptions import (
    BufferTooSmallError,
    ConnectionLostError,
    MessageRevokedError,
    MessageTooLargeError,
    ProtocolError,
    ProtocolMismatchError,
    RdmaError,
    ResourceClosedError,
)
from aiordma.metrics import Stats
from aiordma.verbs import Closable
from aiordma.verbs.completion import check_loop
from aiordma.verbs.memory import Access, MemoryRegion, RemoteBuffer, Segment

log = logging.getLogger(__name__)

Chooser = Callable[[bytes, int], "Into | None"]

Deliver = Callable[[bytes, memoryview], bool]
"""Takes a small message as it arrives: its head and a view of its body,
valid only during the call. Returns False to leave it queued instead."""


class MessageChannel(Closable):
    """Ordered, flow-controlled messages on one connection.

    Create it in the connection's ``prepare`` hook on both sides (see
    :func:`prepare_channel`), or use :func:`open_channel` and
    :func:`start_channel_server`, so its receive buffers are posted before
    the peer can send. The channel owns the connection's receive queue.
    Each side announces its ``max_message`` when the connection is
    established; sending a message larger than the peer's raises
    :class:`MessageTooLargeError` on the sending side.

    Every message may carry a small ``head`` besides its body (see
    :meth:`send_message` and :meth:`recv_message_with_head`): protocols
    built on the channel, such as :mod:`aiordma.rpc`, put their framing
    there, so the body can still land, unsplit and uncopied, in the
    receiver's own buffer.

    Messages too large for one packet but at most ``medium_limit`` bytes
    (256 KiB by default; 0: none) are copied through the registered slots
    in several packets, against the same credits, so nothing is registered
    or exposed for them. Larger ones, and bodies in registered memory
    (:class:`MemoryRegion`, :class:`Segment`), are read by the peer where
    they are: exposed through a memory window or a registration of their
    own, for at most ``exposure_timeout`` seconds (None: until read), and at most
    ``max_exposed`` bytes at once (further large sends wait). By default
    that is 60 s, and 256 MiB or ``max_message`` if larger.

    A plain buffer that a second large message is received into or sent
    from keeps its registration (local only; a sent one is exposed through
    a memory window where the device has them), up to
    ``registration_cache`` bytes each way (64 MiB by default; 0: none),
    least recently used evicted first. Such a buffer cannot be resized or
    closed until it is evicted, :meth:`forget_buffer` is called, or the
    channel fails or closes. This side reads large messages in RDMA reads
    of ``read_piece`` bytes (64 KiB by default), four at a time.

    The channel posts ``window`` data and ``control_window`` control
    receive buffers of ``buffer_size`` bytes (32, 8 and 8 KiB by default),
    and keeps ``send_slots`` packets in flight (as many as it has receive
    buffers). On a connection made with a
    :class:`~aiordma.SharedReceiveQueue` it posts none: it draws its
    buffers from the pool (``buffer_size`` is the pool's; the control
    window defaults to 4, ``send_slots`` to 8, and ``window`` bounds what
    it may borrow). Each side announces its ``buffer_size`` in its HELLO,
    and neither sends a packet larger than the other's buffers, so the two
    need not match.
    ``window`` is at least 2, ``control_window`` at least 4 and
    ``buffer_size`` at least 128 bytes (:class:`~aiordma.channel.options.ChannelOptions`
    checks them, also before :func:`open_channel` connects).

    ``protocol`` names what the channel carries (``""``: plain messages;
    :mod:`aiordma.rpc` and ``aiordma.streams`` set their own). Both sides
    announce it; when both name one and they differ, the channel fails on
    both sides with :class:`ProtocolMismatchError` and the connection
    closes. A plain channel accepts any peer (the layer above it decides).
    """

    def __init__(
        self,
        conn: Link,
        *,
        window: int = DEFAULT_WINDOW,
        control_window: int | None = None,
        buffer_size: int | None = None,
        max_message: int = DEFAULT_MAX_MESSAGE,
        max_exposed: int | None = None,
        exposure_timeout: float | None = DEFAULT_EXPOSURE_TIMEOUT,
        send_slots: int | None = None,
        protocol: str = "",
        medium_limit: int = DEFAULT_MEDIUM_LIMIT,
        registration_cache: int = DEFAULT_REGISTRATION_CACHE,
        read_piece: int = READ_PIECE,
    ) -> None:
        qp = conn.qp
        shared = qp.shared_receive
        if shared is not None and not isinstance(shared, SharedReceiveQueue):
            raise TypeError(
                f"a message channel draws on an aiordma.SharedReceiveQueue, not {shared!r}"
            )
        layout = ChannelOptions(
            window=window, control_window=control_window, buffer_size=buffer_size,
            max_message=max_message, max_exposed=max_exposed, exposure_timeout=exposure_timeout,
            send_slots=send_slots, protocol=protocol, medium_limit=medium_limit,
            registration_cache=registration_cache, read_piece=read_piece,
        ).layout(
            qp.options.recv_depth, qp.options.send_depth,
            None if shared is None else shared.buffer_size,
        )  # fmt: skip
        buffer_size, control_window, send_slots = (
            layout.buffer_size, layout.control_window, layout.send_slots,
        )  # fmt: skip
        buffers = window + control_window
        # Kept registrations of the application's buffers: local only for
        # reads into them; a window exposes a kept one being sent.
        self._stats = Stats("channel", self._gauges)
        self._kept_into = RegistrationCache(
            conn, Access.LOCAL_WRITE, registration_cache, self._stats
        )
        self._kept_from = RegistrationCache(conn, Access.MW_BIND, registration_cache, self._stats)
        self.link: Link = conn
        """The connection (or other :class:`~aiordma.channel.link.Link`) the channel runs on."""
        self.max_message = max_message
        self.protocol = protocol
        """What this channel carries (``""``: plain messages, any peer)."""
        self.exposure_timeout = exposure_timeout
        """Seconds a large message stays readable for the peer (None: no limit)."""
        self.medium_limit = medium_limit
        """Bodies up to this size travel by copy in several packets, not by rendezvous."""
        self._qp = qp
        self._loop = qp.loop
        self._size = buffer_size
        self._hello = layout.hello
        self._peer_protocol: str | None = None
        """Our HELLO's head: our buffer size and protocol."""
        self._shared = shared
        data: DataCredits | None = None
        if shared is not None:
            data = shared.join(qp, self._on_packet, self._fail, window, control_window)
            self._recv_mr = shared.mr
        else:
            self._recv_mr = conn.alloc(buffers * buffer_size)
        self._state = ChannelState(
            window, control_window, layout.max_exposed, send_slots=send_slots, data=data
        )
        self._send_mr = conn.alloc(send_slots * buffer_size)
        # Views of both regions for the channel's life (the receive one until
        # it fails): one view per packet would cost more than the copy.
        self._recv_view = self._recv_mr.view(scoped=shared is None)
        self._packets = Packets(
            self, self._state, self._send_mr.view(scoped=True), self._recv_view, buffer_size,
            max_message, self._stats, shared, self._loop,
        )  # fmt: skip
        # Packets go out of, and land in, fixed slots of the two regions.
        own_buffers = 0 if shared is not None else buffers
        self._lane = qp.open_lane(
            self._send_mr, send_slots, None if shared is not None else self._recv_mr,
            own_buffers, buffer_size, self._packets.sent, self._packets.arrived, self._fail,
        )  # fmt: skip
        self._packets.attach(self._lane)
        self._send_lock = asyncio.Lock()
        self._recv_lock = asyncio.Lock()
        self._error: BaseException | None = None
        self._error_tb: TracebackType | None = None
        self._exposures = Exposures(
            conn, self._state, exposure_timeout, self._stats, check=self._check,
            changed=self._changed, wake=self._wake, send_control=self._send_control_soon,
            cache=self._kept_from,
        )  # fmt: skip
        self._reader = Reader(conn, self._state, self._answer_revokes, self._kept_into, read_piece)
        conn.add_stats(self._stats)

    def stats(self) -> dict[str, Any]:
        """This channel's metrics, as plain data (see :mod:`aiordma.metrics`):
        ``messages_sent``/``_received``, ``bytes_sent``/``_received`` (bodies),
        ``large_sent``/``_received`` (by rendezvous), ``credit_stalls`` (sends
        that waited for credit), ``large_revoked``, ``exposure_timeouts`` and
        ``registrations_reused`` (large messages that found their buffer's
        registration kept); gauges ``exposed_bytes``, ``exposures``,
        ``kept_registrations`` and ``kept_bytes``. The connection's
        :meth:`~aiordma.Connection.stats` includes them."""
        return self._stats.snapshot()

    def _gauges(self) -> dict[str, int]:
        return {
            "exposed_bytes": self._state.exposed_bytes,
            "exposures": len(self._exposures),
            "kept_registrations": len(self._kept_into) + len(self._kept_from),
            "kept_bytes": self._kept_into.kept_bytes + self._kept_from.kept_bytes,
        }

    def _count_sent(self, size: int, large: bool) -> None:
        self._stats.count("messages_sent", "bytes_sent", size)
        if large:
            self._stats.add("large_sent")

    def __repr__(self) -> str:
        state = (
            f"failed: {self._error!r}"
            if self._error
            else f"credits={self._state.data.available}+{self._state.control.available}"
        )
        return f"<MessageChannel {self.link!r} {state}>"

    @property
    def conn(self) -> Connection:
        """The :class:`~aiordma.Connection` the channel runs on (TypeError if
        it runs on another kind of :class:`~aiordma.channel.link.Link`)."""
        if not isinstance(self.link, Connection):
            raise TypeError(f"this channel runs on {self.link!r}, not on a Connection")
        return self.link

    @property
    def eager_limit(self) -> int:
        """Messages (head included) up to this size travel in a single packet
        (lowered to fit the peer's receive buffers once its HELLO came)."""
        return self._packets.eager_limit

    @property
    def max_exposed(self) -> int:
        """Bytes of large messages this side may hold exposed to the peer at once."""
        return self._state.max_exposed

    @property
    def peer_protocol(self) -> str | None:
        """What the peer's channel said it carries (``""``: plain messages);
        None until its HELLO has come."""
        return self._peer_protocol

    @property
    def peer_max_message(self) -> int | None:
        """The peer's ``max_message``, once its announcement arrived."""
        return self._state.peer_max_message

    @property
    def exposed_bytes(self) -> int:
        """Bytes of large messages currently exposed to the peer by this side."""
        return self._state.exposed_bytes

    async def _start(self) -> None:
        if self._shared is None:  # a shared queue's buffers are posted already
            for index in range(self._state.buffers):
                self._lane.recv(index)
        self.link.on_established(self._say_hello)

    def _say_hello(self) -> None:
        """Announce our max_message and windows, and grant our first credits
        (both peers' receives are posted by now). It goes at once: nothing
        else may go before it (see :meth:`ChannelState.send`)."""
        if self._error is not None and not isinstance(self._error, ProtocolMismatchError):
            return
        if not self._lane.send_room():  # cannot be, on a fresh queue pair; but never lose it
            spawn(self._post_hello_later())
            return
        packet = self._state.hello(self.max_message, len(self._hello))
        assert packet is not None  # the first packet: a slot and a credit are there
        with contextlib.suppress(RdmaError, ResourceClosedError):  # the channel failed
            self._packets.post(*packet, self._hello, None)
        self._hello_went()

    def _hello_went(self) -> None:
        if isinstance(self._error, ProtocolMismatchError):
            self.link.close()  # the peer now learns of the mismatch from our HELLO too
        self._wake()

    async def _post_hello_later(self) -> None:
        try:
            await self._qp.wait_send_room()
            packet = self._state.hello(self.max_message, len(self._hello))
            assert packet is not None
            self._packets.post(*packet, self._hello, None)
        except (RdmaError, ResourceClosedError) as exc:
            self._fail(exc)
        self._hello_went()

    async def _peer_limit(self) -> int:
        """The peer's max_message (waiting for its announcement if need be)."""
        while self._state.peer_max_message is None:
            self._check()
            await self._changed()
        return self._state.peer_max_message

    # -- events ------------------------------------------------------------

    async def _changed(self) -> None:
        """Wait until credits, send slots, arrivals or the channel's state change."""
        await self._packets.changed()  # callers checked the loop

    def _wake(self) -> None:
        self._packets.wake()

    def _check(self) -> None:
        if self._error is not None:
            # Its traceback as it failed: raising one object again and again
            # would otherwise grow it by every raise.
            raise self._error.with_traceback(self._error_tb)

    def _fail(self, exc: BaseException) -> None:
        if self._error is not None:
            return
        self._error, self._error_tb = exc, exc.__traceback__
        self._state.fail()
        whole = self._recv_view
        if not self._recv_mr.closed:  # keep what already arrived readable, as TCP does
            for arrival in self._state.ready:
                kind = arrival.header.kind
                if kind == Kind.EAGER:
                    start = arrival.slot * self._size
                    arrival.saved = bytes(whole[start + HEADER_SIZE : start + arrival.size])
                elif (  # whole, and not being taken now
                    kind == Kind.MEDIUM
                    and arrival.missing == 0
                    and (arrival.slot >= 0 or arrival.taken is not None)
                ):
                    arrival.saved = self._medium_bytes(arrival)
        self._packets.fail()  # nothing reads packets from now on
        if self._shared is not None:  # a shared buffer goes back to the pool now
            for arrival in self._state.ready:
                if arrival.slot >= 0:
                    self._shared.repost(arrival.slot)
                    arrival.slot = -1
                while arrival.pieces:
                    self._shared.repost(arrival.pieces.popleft()[0])
        self._exposures.fail(exc)
        self._kept_into.clear()
        self._kept_from.clear()
        self._wake()

    def _protocol_error(self, exc: Exception) -> None:
        error = exc if isinstance(exc, ProtocolError) else ProtocolError(str(exc))
        self._fail(error)
        if not isinstance(error, ProtocolMismatchError):
            log.warning("closing %r: peer broke the message protocol: %s", self.link, error)
            self.link.close()
            return
        log.warning("closing %r: %s", self.link, error)
        if self._state.said_hello:
            self.link.close()
        # else: once our HELLO went (see _say_hello), so that the peer fails as we do

    # -- receiving ---------------------------------------------------------

    def _on_packet(self, index: int, error: BaseException | None, size: int) -> None:
        """A packet landed in shared receive buffer ``index``, or failed to."""
        if error is not None:
            self._fail(error)
            return
        self._packets.arrived(index, size)

    def _heard(self, hello: Hello) -> None:
        """The peer's HELLO: check its protocol; fit our packets to its buffers."""
        self._peer_protocol = hello.protocol
        self._state.heard(hello, self.protocol, self._peer_name())
        self._packets.eager_limit = min(self._size, hello.buffer_size) - HEADER_SIZE

    def _peer_name(self) -> str:
        peer = getattr(self.link, "peer_address", None)  # optional for a Link
        return f"{peer[0]}:{peer[1]}" if peer else "the peer"

    def deliver_to(self, deliver: Deliver | None) -> None:
        """Hand small messages to ``deliver`` as they arrive (None: stop).

        A message the hook takes is never seen by :meth:`recv_message`; one
        it refuses, and every message while earlier ones are queued (and all
        large ones), is queued as usual, so order is kept. This saves a
        task wake-up per message, which is what request/reply protocols
        such as :mod:`aiordma.rpc` pay for latency.
        """
        self._packets.deliver = deliver

    async def _next_arrival(self) -> Arrival:
        ready = self._state.ready
        while True:
            if ready:
                arrival = ready[0]
                if self._error is None or arrival.saved is not None:
                    return arrival
            self._check()
            await self._changed()

    def _answer_revokes(self) -> None:
        """Tell the sender, by DONE, that revoked messages will not be read,
        once no read is in flight (so no read can meet a revoked key)."""
        if self._reader.busy or self._error is not None:
            return
        for msg_id in self._state.acks_due:
            spawn(self._send_control(Kind.DONE, msg_id))
        self._state.acks_due.clear()

    def _ended(self, msg_id: int) -> None:
        """The peer's DONE ended the exposure of ``msg_id``."""
        self._exposures.ended(msg_id)

    def _send_done(self, msg_id: int) -> None:
        """Tell the sender of ``msg_id`` it was read (or will not be)."""
        spawn(self._send_control(Kind.DONE, msg_id))

    async def wait_message(self) -> None:
        """Wait until a message has arrived, without taking it.

        Raises as :meth:`recv_message` would once the channel has failed and
        nothing that arrived before is left.
        """
        check_loop(self._loop)
        await self._next_arrival()

    def next_length(self) -> int | None:
        """The body length of the next message to be received, if it has
        arrived (after :meth:`wait_message`); None if none has. Its body has
        not been read yet when it is large: a receiver may decide from this
        whether to take it now."""
        ready = self._state.ready
        return ready[0].header.length if ready else None

    async def recv_message_with_head(
        self, choose: Chooser | None = None
    ) -> tuple[bytes, bytes | bytearray | int]:
        """The next message as ``(head, body)``.

        ``body`` is a new object (``bytes`` for small messages, the
        ``bytearray`` an RDMA read landed in for large ones), unless
        ``choose(head, body_length)`` returns somewhere for it to land: then
        the body is put there and ``body`` is its length. ``choose`` decides
        per message, from its head (``None``: a new object). Raises
        :class:`BufferTooSmallError`, leaving the message queued, when the
        chosen buffer is too short, and :class:`MessageRevokedError` (with
        the message's head) for a large message its sender withdrew.
        """
        check_loop(self._loop)
        packets = self._packets
        ready = self._state.ready
        if (
            ready
            and ready[0].header.kind == Kind.EAGER
            and not packets.failed
            and not packets.receivers
        ):
            # A small message is already here: take it without a task switch.
            arrival = ready[0]
            head, into = self._chosen(arrival, choose)
            small = packets.small_body(arrival, into)
            packets.consumed()
            packets.count_received(arrival.header)
            return head, small
        packets.receivers += 1
        try:
            return await self._recv_in_turn(choose)
        finally:
            packets.receivers -= 1

    async def _recv_in_turn(self, choose: Chooser | None) -> tuple[bytes, bytes | bytearray | int]:
        """:meth:`recv_message_with_head` once earlier receives are done."""
        async with self._recv_lock:
            arrival = await self._next_arrival()
            header = arrival.header
            head, into = self._chosen(arrival, choose)
            body: bytes | bytearray | int
            if arrival.saved is not None or header.kind == Kind.EAGER:
                body = self._packets.small_body(arrival, into)
            elif header.kind == Kind.MEDIUM:
                body = await self._take_pieces(arrival, into)
            elif into is None:
                landed = bytearray(header.length)
                await self._reader.read_body(arrival, landed, keep=False)
                body = landed
            else:
                await self._reader.read_body(arrival, into)
                body = header.length
            self._packets.consumed()
            self._packets.count_received(header)
            return head, body

    def _chosen(self, arrival: Arrival, choose: Chooser | None) -> tuple[bytes, Into | None]:
        """The message's head and where its body goes (None: a new object);
        raises for a revoked message (consuming it) or a buffer too small."""
        header = arrival.header
        head = self._packets.head(arrival)
        if arrival.revoked:
            self._packets.consumed()
            raise MessageRevokedError(
                f"the sender withdrew message {header.msg_id} ({header.length} bytes) "
                "before it was read: its send was cancelled or it was not read within "
                "the sender's exposure_timeout",
                head,
            )
        into = choose(head, header.length) if choose is not None else None
        if into is not None and buffer_length(into) < header.length:
            raise BufferTooSmallError(header.length, buffer_length(into))
        return head, into

    async def _take_pieces(self, arrival: Arrival, into: Into | None) -> bytearray | int:
        """Copy a MEDIUM message's body out piece by piece, each buffer given
        back (and its credit owed) as soon as it is copied, so a message
        larger than the window flows. Cancelled, what was copied is kept on
        the arrival, and the next receive resumes from it."""
        header = arrival.header
        head_length = header.head_length
        landed = bytearray(header.length) if into is None else None
        target = buffer_view(landed if landed is not None else into)  # type: ignore[arg-type]
        whole = self._recv_view
        with target:
            taken = arrival.taken
            if taken is not None:  # a cancelled receive copied this much
                head = taken[:head_length]
                offset = len(taken) - head_length
                target[:offset] = memoryview(taken)[head_length:]
                arrival.taken = None
            else:
                start = arrival.slot * self._size + HEADER_SIZE
                end = start + arrival.size - HEADER_SIZE
                offset = end - start - head_length
                target[:offset] = whole[start + head_length : end]
                head = bytes(whole[start : start + head_length])
                self._give_back(arrival.slot)
                arrival.slot = -1
            pieces = arrival.pieces
            assert pieces is not None
            try:
                while offset < header.length:
                    self._check()  # failed: the buffers are no longer readable
                    if not pieces:
                        await self._changed()
                        continue
                    offset = self._packets.take_pieces(arrival, target, offset)
            except BaseException:
                if self._error is None:  # cancelled: the next receive resumes
                    arrival.taken = head + bytes(target[:offset])
                raise
        self._packets.pump()
        return landed if landed is not None else header.length

    def _give_back(self, slot: int) -> None:
        """A buffer of the MEDIUM message being taken was copied out."""
        if self._state.piece_taken():
            self._packets.repost(slot)
        self._packets.pump()

    def _medium_bytes(self, arrival: Arrival) -> bytes:
        """A whole MEDIUM message's head and body, copied out of its buffers."""
        whole = self._recv_view
        if arrival.taken is not None:
            parts = [arrival.taken]
        else:
            start = arrival.slot * self._size
            parts = [bytes(whole[start + HEADER_SIZE : start + arrival.size])]
        assert arrival.pieces is not None
        for slot, length in arrival.pieces:
            start = slot * self._size + HEADER_SIZE
            parts.append(bytes(whole[start : start + length]))
        return b"".join(parts)

    async def recv_message(self) -> bytes | bytearray:
        """The next message, in the order they were sent.

        Small messages come back as ``bytes``; larger ones as a
        ``bytearray`` (above :data:`~aiordma.channel.rendezvous.STAGED_READ_LIMIT`,
        the one the RDMA read landed in, with no copy). Cancelling leaves
        the message queued for the next receive. A head the sender added
        is dropped (see :meth:`recv_message_with_head`).
        """
        check_loop(self._loop)
        packets = self._packets
        body: bytes | bytearray | int | None = packets.take_eager(None)  # as recv_message_into does
        while body is None:
            if packets.receivers or self._state.ready or packets.failed:
                _, body = await self.recv_message_with_head()
                break
            await packets.changed()
            body = packets.take_eager(None)
        assert body is not None
        assert not isinstance(body, int)
        return body

    async def recv_message_into(self, buffer: Into) -> int:
        """Receive the next message into ``buffer``; returns its length.

        Large messages are read by the adapter straight into ``buffer`` when
        it is registered memory, or when larger than
        :data:`~aiordma.channel.rendezvous.STAGED_READ_LIMIT` (it is registered for
        the read); others go through the channel's registered staging
        buffer and are copied. Raises :class:`BufferTooSmallError`, leaving
        the message queued, when it does not fit. If cancelled during a
        large read the message stays queued, but a ``buffer`` read into
        directly may still be written to until that read completes. Raises
        ``TypeError``/``ValueError`` at once for a buffer nothing can land
        in (``bytes``, a closed or read-only region).
        """
        check_into(buffer)
        check_loop(self._loop)
        packets = self._packets
        # A small message taken as it is (or once it comes) needs no task
        # switch and no receive turn; anything else takes the long way.
        n: bytes | bytearray | int | None = packets.take_eager(buffer)
        while n is None:
            if packets.receivers or self._state.ready or packets.failed:
                _, n = await self.recv_message_with_head(lambda _head, _n: buffer)
                break
            await packets.changed()
            n = packets.take_eager(buffer)
        assert isinstance(n, int)
        return n

    def __aiter__(self) -> MessageChannel:
        return self

    async def __anext__(self) -> bytes | bytearray:
        try:
            return await self.recv_message()
        except (ConnectionLostError, ResourceClosedError):
            raise StopAsyncIteration from None

    # -- sending -----------------------------------------------------------

    async def send_message(self, data: Body, *, head: bytes = b"") -> None:
        """Send ``data`` as one message, with an optional small ``head``.

        Small messages are copied into a registered send buffer: this returns
        once that is posted, and ``data`` may be reused at once. So are
        plain bodies up to ``medium_limit``, in several packets; cancelled
        after the first went, the rest is copied and still delivered.
        Larger ones, and registered memory, are read by the peer from
        ``data`` itself, and this returns once the peer has them; ``data``
        must not change meanwhile. Waits for credit
        when the peer is slow to receive, and for room under ``max_exposed``.
        Cancelling a large send, or the peer not reading it within
        ``exposure_timeout`` (:class:`ExposureTimeoutError`), revokes it:
        its memory stops being readable and the peer's receive of it raises
        :class:`MessageRevokedError`. Raises :class:`MessageTooLargeError`
        for a message larger than this side's or the peer's ``max_message``,
        and :class:`TypeError` for a body that is not a C-contiguous buffer
        (a strided view: send a contiguous copy), before anything is sent:
        the channel stays usable.

        ``head`` travels in the message's first packet, whatever the body's
        size, and at most ``eager_limit`` bytes; the receiver gets it from
        :meth:`recv_message_with_head` (or its ``choose`` callback, before
        deciding where the body goes).
        """
        posted = await self._post(data, head)
        if posted is None:
            return
        msg_id, exposure, size = posted
        try:
            await asyncio.shield(exposure.done)
        except asyncio.CancelledError:
            if not exposure.done.done():
                self._exposures.revoke(msg_id, asyncio.CancelledError())
            raise
        self._count_sent(size, True)

    async def post_message(self, data: Body, *, head: bytes = b"") -> asyncio.Future[None]:
        """:meth:`send_message`, but return once the message is posted, with a
        future that resolves when the peer has it.

        For a message copied into send buffers that is at once. A large one
        stays readable for the peer until it reads it (or ``exposure_timeout``
        passes: the future then fails with :class:`ExposureTimeoutError`);
        ``data`` must not change until the future is done, and cancelling the
        future revokes the message if the peer has not read it. Posting still
        waits for credit and for room under ``max_exposed``, so a writer that
        does not wait for delivery is held back as by a socket's buffer.
        """
        delivered: asyncio.Future[None] = self._loop.create_future()
        posted = await self._post(data, head)
        if posted is None:
            delivered.set_result(None)
            return delivered
        msg_id, exposure, size = posted

        def settle(done: asyncio.Future[None]) -> None:
            if delivered.done():
                return
            if done.cancelled():
                delivered.cancel()
            elif done.exception() is not None:
                delivered.set_exception(done.exception())  # type: ignore[arg-type]
            else:
                self._count_sent(size, True)
                delivered.set_result(None)

        def withdrawn(future: asyncio.Future[None]) -> None:
            if future.cancelled() and not exposure.done.done():
                self._exposures.revoke(msg_id, asyncio.CancelledError())

        exposure.done.add_done_callback(settle)
        delivered.add_done_callback(withdrawn)
        return delivered

    async def _post(self, data: Body, head: bytes) -> tuple[int, Exposure, int] | None:
        """Check and post a message: None once a copied one is posted, or a
        large one's id, exposure and size once its announcement is."""
        check_loop(self._loop)
        size = len(data) if type(data) is bytes or type(data) is bytearray else body_length(data)
        if size > self.max_message:
            raise MessageTooLargeError(
                f"message of {size} bytes exceeds this channel's max_message of {self.max_message}"
            )
        if type(head) is not bytes and not isinstance(head, bytes | bytearray):
            raise TypeError(f"a message head must be bytes, not {type(head).__name__}")
        packets = self._packets
        if len(head) > packets.eager_limit:
            raise ValueError(f"message head of {len(head)} bytes exceeds {packets.eager_limit}")
        peer_limit = self._state.peer_max_message
        if peer_limit is None:
            peer_limit = await self._peer_limit()
            if len(head) > packets.eager_limit:  # the peer's buffers are smaller than ours
                raise ValueError(f"message head of {len(head)} bytes exceeds {packets.eager_limit}")
        if size > peer_limit:
            raise MessageTooLargeError(
                f"message of {size} bytes exceeds the peer's max_message of {peer_limit} "
                "(the receiving side sets it)"
            )
        if len(head) + size <= packets.eager_limit:
            # Nobody ahead of us and credit there: posted without a task switch.
            if packets.send_eager(head, data, size):
                return None
            await self._send_in_turn(Kind.EAGER, 0, size, None, head, data)
            self._count_sent(size, False)
            return None
        if (
            size <= self.medium_limit
            and len(head) < self.eager_limit
            and not isinstance(data, MemoryRegion | Segment)  # registered: no copy
        ):
            await self._send_pieces(head, data, size)
            self._count_sent(size, False)
            return None
        msg_id, exposure = await self._exposures.expose(data, size)
        try:
            await self._send_in_turn(Kind.RENDEZVOUS, msg_id, size, exposure.remote, head, None)
        except BaseException:
            self._exposures.withdraw(msg_id)
            exposure.done.cancel()
            raise
        self._exposures.posted(msg_id)  # its deadline starts once the peer can know of it
        return msg_id, exposure, size

    async def _send_pieces(self, head: bytes, data: Body, size: int) -> None:
        """Send a MEDIUM message: its head and first bytes, then PIECEs, each
        copied into a send slot as credit allows. Once the first packet went,
        the message goes whole: cancelled, the rest is copied and sent by a
        task (which holds the send lock until it is done)."""
        self._packets.senders += 1
        handed = False
        try:
            await self._send_lock.acquire()
        except BaseException:
            self._packets.senders -= 1
            raise
        try:
            with buffer_view(data) as view:
                offset = 0
                try:
                    room = self.eager_limit - len(head)
                    await self._post_when_possible(Kind.MEDIUM, 0, size, None, head, view[:room])
                    offset = room
                    while offset < size:
                        offset = self._packets.send_pieces(view, offset, size)  # what can go now
                        if offset < size:  # wait for what it needs, then send one
                            piece = view[offset : offset + self.eager_limit]
                            await self._post_when_possible(
                                Kind.PIECE, 0, len(piece), None, b"", piece
                            )
                            offset += len(piece)
                except asyncio.CancelledError:
                    if offset:  # begun: the peer must get all of it
                        rest = bytes(view[offset:size])
                        spawn(self._finish_pieces(rest))
                        handed = True
                    raise
        finally:
            if not handed:
                self._end_turn()

    async def _finish_pieces(self, rest: bytes) -> None:
        """The end of a MEDIUM message whose send was cancelled; releases the send lock."""
        try:
            view, offset = memoryview(rest), 0
            while offset < len(rest):
                piece = view[offset : offset + self.eager_limit]
                await self._post_when_possible(Kind.PIECE, 0, len(piece), None, b"", piece)
                offset += len(piece)
        except (RdmaError, ResourceClosedError, ConnectionError) as exc:
            log.debug("could not finish a cancelled message: %r", exc)
        finally:
            self._end_turn()

    async def _send_in_turn(
        self, kind: Kind, msg_id: int, length: int, remote: RemoteBuffer | None,
        head: bytes, body: Body | None,
    ) -> None:  # fmt: skip
        """:meth:`_post_when_possible` once earlier sends are done."""
        self._packets.senders += 1
        try:
            async with self._send_lock:
                await self._post_when_possible(kind, msg_id, length, remote, head, body)
        finally:
            self._packets.senders -= 1

    def _end_turn(self) -> None:
        """A send that took its turn by hand (a MEDIUM message) is done."""
        self._send_lock.release()
        self._packets.senders -= 1

    async def _post_when_possible(
        self, kind: Kind, msg_id: int, length: int, remote: RemoteBuffer | None,
        head: bytes, body: Body | None,
    ) -> None:  # fmt: skip
        """Post a packet once send-queue room, a send slot and the credit it costs are there."""
        stalled = False
        while True:
            self._check()
            if not self._lane.send_room():
                await self._qp.wait_send_room()
                continue
            packet = self._state.send(kind, msg_id, length, remote, len(head))
            if packet is not None:
                self._packets.post(*packet, head, body)
                return
            if not stalled:
                stalled = True
                self._stats.add("credit_stalls")
            await self._changed()

    def _send_control_soon(self, kind: Kind, msg_id: int) -> None:
        if self._error is None:
            spawn(self._send_control(kind, msg_id))

    async def _send_control(self, kind: Kind, msg_id: int) -> None:
        try:
            await self._post_when_possible(kind, msg_id, 0, None, b"", None)
        except (RdmaError, ResourceClosedError, ConnectionResetError) as exc:
            log.debug("could not send %s for %d: %r", kind.name, msg_id, exc)

    def _wait_room(self) -> None:
        """A credit update is due and the send queue is full: send it once
        there is room (the packets call this, and wait for it)."""
        spawn(self._pump_later())

    async def _pump_later(self) -> None:
        try:
            await self._qp.wait_send_room()
        except BaseException:
            return
        finally:
            self._packets.room_pending = False
        self._packets.pump()

    def forget_buffer(self, buffer: Any) -> bool:
        """Stop keeping ``buffer``'s registration (see ``registration_cache``),
        so that it can be resized or closed; whether one was kept."""
        into = self._kept_into.forget(buffer)
        return self._kept_from.forget(buffer) or into

    # -- lifecycle ---------------------------------------------------------

    def is_closing(self) -> bool:
        """True once the channel's connection is closing or closed."""
        return self.link.is_closing()

    def close(self) -> Awaitable[None]:
        """Close the channel's connection (see :meth:`aiordma.Connection.close`)."""
        return self.link.close()

    async def wait_closed(self) -> None:
        """Wait until the channel's connection is closed."""
        await self.link.wait_closed()
