"""Ordered messages of any size over a :class:`~aiordma.Connection` (or any
:class:`~aiordma.channel.link.Link`).

Small messages travel eagerly: copied into a send slot of a pool registered
once, and sent into one of the peer's pre-posted receive buffers against a
credit (see :mod:`aiordma.channel.credits`), so no send ever meets an empty
receive queue. A receive buffer is re-posted, and its credit returned, only
once the application has taken the message out of it: a slow receiver holds
the sender back instead of queueing without bound. Medium messages go in
pieces through the same slots (:mod:`aiordma.channel.medium`), larger ones
by rendezvous (:mod:`aiordma.channel.rendezvous`). Each side announces its
``max_message`` once the connection is established, so a sender learns the
peer's limit before it sends anything too large for it.

:class:`MessageChannel` is the async shell: the public API, argument
checks, waiting, locks and tasks. Below it,
:class:`~aiordma.channel.packets.Packets` does everything per packet (and
alone drives the :class:`~aiordma.channel.state.ChannelState`); it reports
what the shell must do as :class:`~aiordma.channel.packets.Event` values.
One side's packets, in order: ``start -> HELLO -> (EAGER | BATCH |
MEDIUM PIECE* | CREDIT | CONTROL_CREDIT | RENDEZVOUS -> (DONE | REVOKE ->
DONE))* -> FAIL | CLOSE``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sys
from collections.abc import Awaitable, Callable, Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any, cast

from aiordma._checks import check_int
from aiordma.channel.buffers import (
    Body,
    Deliver,
    Into,
    body_length,
    check_into,
    give_back_memory,
)
from aiordma.channel.link import Link
from aiordma.channel.medium import send_medium, send_record
from aiordma.channel.options import ChannelKeywords, ChannelOptions
from aiordma.channel.outbox import Outbox
from aiordma.channel.packet_path import open_packet_path
from aiordma.channel.packets import Event
from aiordma.channel.receiver import Chooser, Receiver
from aiordma.channel.registrations import RegistrationCache
from aiordma.channel.rendezvous import Exposure, Exposures
from aiordma.channel.sender import Sender
from aiordma.channel.sizing import read_piece_for
from aiordma.channel.wire import Hello, Kind
from aiordma.cm.connection import Connection
from aiordma.exceptions import (
    ConnectionLostError,
    MessageTooLargeError,
    ProtocolError,
    ProtocolMismatchError,
    ResourceClosedError,
    again,
)
from aiordma.lifecycle import Closable, check_loop, check_thread
from aiordma.metrics import Stats
from aiordma.verbs.device import Device
from aiordma.verbs.memory import Access, MemoryRegion, Segment
from aiordma.verbs.queue_pair import check_registered_on

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from aiordma.verbs.window import MemoryWindow

log = logging.getLogger(__name__)


class _Failed:
    """What a failed channel's parts raise, without a reference to the channel."""

    __slots__ = ("error", "tb")

    def __init__(self, error: BaseException | None, tb: TracebackType | None) -> None:
        self.error, self.tb = error, tb

    def check(self) -> None:
        if self.error is not None:
            raise again(self.error, self.tb)


class MessageChannel(Closable):
    """Ordered, flow-controlled messages on one connection.

    Create it in the connection's ``prepare`` hook on both sides (see
    :func:`prepare_channel`), or use :func:`open_channel` and
    :func:`start_channel_server`, so its receive buffers are posted before
    the peer can send. The channel owns the connection's receive queue (or
    draws on its :class:`~aiordma.SharedReceiveQueue`). ``options`` (a
    :class:`~aiordma.channel.options.ChannelOptions`), or its fields as
    keyword arguments over it, size it and say what it carries; they are
    checked at once.

    Every message may carry a small ``head`` besides its body (see
    :meth:`send_message` and :meth:`recv_message_with_head`): protocols
    built on the channel, such as :mod:`aiordma.rpc`, put their framing
    there, so the body can still land, unsplit and uncopied, in the
    receiver's own buffer. Small messages take one packet; larger ones up
    to ``medium_limit`` several, copied (from registered memory too:
    copying is faster up to there); larger ones are read by the peer where
    they are, exposed for at most ``exposure_timeout`` and within
    ``max_exposed``. A plain buffer that a second large message is
    received into or sent from keeps its registration (see
    :meth:`forget_buffer`).
    """

    def __init__(
        self, conn: Link, options: ChannelOptions | None = None, /,
        **keywords: Unpack[ChannelKeywords],
    ) -> None:  # fmt: skip
        options = ChannelOptions.of(keywords, options or ChannelOptions())
        self.link: Link = conn
        """The connection (or other :class:`~aiordma.channel.link.Link`) the channel runs on."""
        self.max_message = options.max_message
        self.protocol = options.protocol
        """What this channel carries (``""``: plain messages, any peer)."""
        self.exposure_timeout = options.exposure_timeout
        """Seconds a large message stays readable for the peer (None: no limit)."""
        self.medium_limit = options.medium_limit
        """Bodies up to this size travel by copy in several packets, not by rendezvous."""
        self._qp = qp = conn.qp
        self._loop = qp.loop
        self._peer_protocol: str | None = None
        self._error: BaseException | None = None
        self._error_tb: TracebackType | None = None
        self._stats = Stats("channel", self._gauges)
        path = open_packet_path(conn, options, self._stats, self._on_event, self._fail)
        self._packets, self._shared, self._hello = path.packets, path.shared, path.layout.hello
        self._records = path.records
        self._outbox = Outbox(path.packets, self._stats)
        self._inbox = path.packets.inbox  # (read by the tests, as _data_credits)
        self._data_credits = path.packets.state.data
        self._regions = path.regions  # the link deregisters them while they live
        # Kept registrations of the application's buffers: local only for
        # reads into them; a window exposes a kept one being sent.
        cache = options.registration_cache
        self._kept_into = RegistrationCache(conn, Access.LOCAL_WRITE, cache, self._stats)
        self._kept_from = RegistrationCache(conn, Access.MW_BIND, cache, self._stats)
        self._sender = Sender(self._packets, qp, self._stats, self._check)
        self._exposures = Exposures(
            conn, path.layout.max_exposed, options.exposure_timeout, self._stats,
            check=self._check, changed=self._changed, wake=self._packets.wake,
            send_control=self._sender.control_soon, cache=self._kept_from,
        )  # fmt: skip
        self._receiver = Receiver(
            self._packets, conn, self._kept_into,
            read_piece_for(options.read_piece, conn.loopback),
            options.read_ahead, self._check,
            functools.partial(self._sender.control_soon, Kind.DONE), self._stats,
        )  # fmt: skip
        self._reader = self._receiver.reader
        conn.add_stats(self._stats)

    def stats(self) -> dict[str, Any]:
        """This channel's metrics, as plain data (see :mod:`aiordma.metrics`;
        the metrics guide lists them). The connection's
        :meth:`~aiordma.Connection.stats` includes them."""
        return self._stats.snapshot()

    def _gauges(self) -> dict[str, int]:
        return {
            "exposed_bytes": self._exposures.ledger.exposed_bytes,
            "exposures": len(self._exposures),
            "kept_registrations": len(self._kept_into) + len(self._kept_from),
            "kept_bytes": self._kept_into.kept_bytes + self._kept_from.kept_bytes,
        }

    def __repr__(self) -> str:
        data, control = self._packets.credits()
        state = f"failed: {self._error!r}" if self._error else f"credits={data}+{control}"
        return f"<MessageChannel {self.link!r} {state}>"

    @property
    def conn(self) -> Connection:
        """The :class:`~aiordma.Connection` the channel runs on (TypeError if
        it runs on another kind of :class:`~aiordma.channel.link.Link`)."""
        if not isinstance(self.link, Connection):
            raise TypeError(f"this channel runs on {self.link!r}, not on a Connection")
        return self.link

    @property
    def device(self) -> Device:
        """The device the channel's queue pair is on (to register memory
        that the channel or one-sided work will use)."""
        return self.link.device

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the channel runs on (every call is made from it)."""
        return self._loop

    @property
    def loopback(self) -> bool:
        """Whether the peer is on the same device (no wire between: reads and
        bulk work are sized larger, see ``aiordma.channel.sizing``)."""
        return self.link.loopback

    @property
    def eager_limit(self) -> int:
        """Messages (head included) up to this size travel in a single packet
        (lowered to fit the peer's receive buffers once its HELLO came)."""
        return self._packets.eager_limit

    @property
    def max_exposed(self) -> int:
        """Bytes of large messages this side may hold exposed to the peer at once."""
        return self._exposures.ledger.max_exposed

    @property
    def peer_protocol(self) -> str | None:
        """What the peer's channel said it carries (``""``: plain messages);
        None until its HELLO has come."""
        return self._peer_protocol

    @property
    def peer_max_message(self) -> int | None:
        """The peer's ``max_message``, once its announcement arrived."""
        return self._packets.peer_max_message

    @property
    def exposed_bytes(self) -> int:
        """Bytes of large messages currently exposed to the peer by this side."""
        return self._exposures.ledger.exposed_bytes

    @property
    def read_piece(self) -> int:
        """Bytes of each RDMA read that fetches a large message from the peer."""
        return self._reader.piece

    def watch_exposures(
        self, watcher: Callable[[MemoryRegion | MemoryWindow], None]
    ) -> Callable[[], None]:
        """Call ``watcher`` with what grants the peer read access to each large
        message this side exposes from now on (a registration of exactly its
        bytes, or a memory window over them), for auditing remote exposure;
        returns a callable that stops watching."""
        watchers = self._exposures.watchers

        def told(exposure: Exposure) -> None:
            watcher(exposure.key)

        watchers.append(told)

        def stop() -> None:
            if told in watchers:
                watchers.remove(told)

        return stop

    # -- HELLO -------------------------------------------------------------

    async def _start(self) -> None:
        if self._shared is None:  # a shared queue's buffers are posted already
            self._packets.post_receives()
        self.link.on_established(self._say_hello)

    def _say_hello(self) -> None:
        """Announce our max_message, windows and buffer size, and grant our
        first credits (both peers' receives are posted by now). It goes at
        once: nothing else may go before it."""
        if self._error is None or isinstance(self._error, ProtocolMismatchError):
            records = self._records
            ring = None if records is None or self._error is not None else records.expose(self._qp)
            hello = Hello(self._hello.buffer_size, self._hello.protocol, ring).pack()
            self._sender.hello(self.max_message, hello, self._hello_went, self._fail)

    def _hello_went(self) -> None:
        if isinstance(self._error, ProtocolMismatchError):
            self.link.close()  # the peer now learns of the mismatch from our HELLO too
        self._packets.wake()

    async def _peer_limit(self) -> int:
        """The peer's max_message (waiting for its announcement if need be)."""
        while (limit := self._packets.peer_max_message) is None:
            self._check()
            await self._changed()
        return limit

    def _heard(self, hello: Hello) -> None:
        """The peer's HELLO: its protocol must be ours, if both name one."""
        self._peer_protocol = hello.protocol
        peer = getattr(self.link, "peer_address", None)  # optional for a Link
        hello.check_protocol(self.protocol, f"{peer[0]}:{peer[1]}" if peer else "the peer")
        if self._records is not None:
            self._records.heard(hello.ring)

    # -- what the packets report -------------------------------------------

    def _on_event(self, event: Event, value: object) -> None:
        """What :class:`Packets` says must be done (see :class:`Event`, which
        says what ``value`` is for each)."""
        try:
            if event == Event.DONE_DUE:
                self._sender.control_soon(Kind.DONE, cast(int, value))
            elif event == Event.ANSWER:
                self._receiver.answer_revokes()
            elif event == Event.ENDED:
                self._exposures.ended(cast(int, value))
            elif event == Event.WAIT_ROOM:
                self._sender.update_later()
            elif event == Event.HEARD:
                self._heard(cast(Hello, value))
            elif event == Event.FAILED:
                self._fail(cast(BaseException, value))
            else:  # BROKEN
                self._protocol_error(cast(Exception, value))
        except (ProtocolError, ValueError) as exc:
            self._protocol_error(exc)

    # -- waiting and failing -----------------------------------------------

    async def _changed(self) -> None:
        """Wait until credits, send slots, arrivals or the channel's state change."""
        await self._packets.waiting.changed()  # callers checked the loop

    def _check_memory(self, body: object) -> None:
        """ValueError for registered memory of another :class:`Device` (even
        of this adapter) than the channel's: as its queue pair refuses it."""
        if isinstance(body, MemoryRegion | Segment):
            check_registered_on(
                self.link.qp.device, body if isinstance(body, MemoryRegion) else body.mr
            )

    def _check(self) -> None:
        if self._error is not None:
            # Its traceback as it failed: raising one object again and again
            # would otherwise grow it by every raise.
            raise again(self._error, self._error_tb)

    def _fail(self, exc: BaseException) -> None:
        if self._error is not None:
            return
        self._error, self._error_tb = exc, exc.__traceback__
        self._packets.fail()  # keeps what arrived whole; nothing reads packets from now on
        self._exposures.fail(exc)
        self._kept_into.clear()
        self._kept_from.clear()
        self._packets.wake()
        self._let_go()

    def _let_go(self) -> None:
        """A failed channel only raises its error from now on: its parts stop
        calling back into it, so no reference cycle keeps a closed channel,
        its connection and their buffers alive until the collector runs."""
        check = _Failed(self._error, self._error_tb).check
        self._stats.freeze()
        self._packets.let_go()
        if self._records is not None:
            self._records.let_go()
        self._sender.let_go(check)
        self._exposures.let_go(check, self._packets.waiting.changed)
        self._receiver.let_go(check)
        if self._receiver.landed_large:
            give_back_memory()

    def _protocol_error(self, exc: Exception) -> None:
        error = exc if isinstance(exc, ProtocolError) else ProtocolError(str(exc))
        self._fail(error)
        if not isinstance(error, ProtocolMismatchError):
            log.warning("closing %r: peer broke the message protocol: %s", self.link, error)
            self.link.close()
            return
        log.warning("closing %r: %s", self.link, error)
        if self._packets.said_hello:
            self.link.close()
        # else: once our HELLO went (see _say_hello), so that the peer fails as we do

    # -- receiving ---------------------------------------------------------

    def deliver_to(self, deliver: Deliver | None) -> None:
        """Hand small messages to ``deliver`` as they arrive (None: stop).

        A message the hook takes is never seen by :meth:`recv_message`; one
        it refuses, and every message while earlier ones are queued (and all
        large ones), is queued as usual, so order is kept. This saves a
        task wake-up per message, which is what request/reply protocols
        such as :mod:`aiordma.rpc` pay for latency.
        """
        self._packets.deliver = deliver

    async def wait_message(self) -> None:
        """Wait until a message has arrived, without taking it.

        Raises as :meth:`recv_message` would once the channel has failed and
        nothing that arrived before is left.
        """
        check_loop(self._loop)
        await self._receiver.next_arrival()

    def next_length(self) -> int | None:
        """The body length of the next message to be received, if it has
        arrived (after :meth:`wait_message`); None if none has. Its body has
        not been read yet when it is large: a receiver may decide from this
        whether to take it now."""
        arrival = self._packets.inbox.first()
        return None if arrival is None else arrival.header.length

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
        arrival = packets.eager_first()
        if arrival is not None:  # a small message is here: taken without a task switch
            head, into = self._receiver.chosen(arrival, choose)
            small = packets.inbox.small_body(arrival, into)
            packets.consumed()
            return head, small
        return await self._receiver.in_turn(choose)

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
            if packets.needs_turn():
                _, body = await self.recv_message_with_head()
                break
            await packets.waiting.arrivals()
            body = packets.take_eager(None)
        assert body is not None
        assert not isinstance(body, int)
        return body

    async def recv_messages(self, limit: int | None = None) -> list[bytes | bytearray]:
        """The messages queued now, in the order they were sent: at least one
        (waiting for it), at most ``limit`` (None: no bound).

        The mirror of :meth:`send_messages`: a reader of a stream of small
        messages takes what has arrived in one call rather than one call
        each. Each is what :meth:`recv_message` would return; a larger
        message only ever heads a list (small ones queued behind it follow
        it). Cancelling leaves every message queued.
        """
        most = sys.maxsize if limit is None else check_int("limit", limit, 1)
        check_loop(self._loop)
        packets = self._packets
        bodies = packets.take_eagers(most)
        if bodies:
            return bodies
        first = await self.recv_message()
        return [first, *packets.take_eagers(most - 1)]

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
        self._check_memory(buffer)
        packets = self._packets
        # A small message taken as it is (or once it comes), or a medium one
        # already whole, needs no task switch and no receive turn; anything
        # else takes the long way.
        n: bytes | bytearray | int | None = packets.take_eager(buffer)
        while n is None:
            if packets.needs_turn():
                whole = packets.take_medium(buffer)  # one whose pieces all came: no turn either
                if whole >= 0:
                    return whole
                # (No small message to take without a turn: take_eager saw to that.)
                _, n = await self._receiver.in_turn(lambda _head, _n: buffer)
                break
            await packets.waiting.arrivals()
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

    async def send_message(
        self, data: Body, *, head: bytes = b"", until_unexposed: bool = False
    ) -> None:
        """Send ``data`` as one message, with an optional small ``head``.

        Small messages are copied into a registered send buffer: this returns
        once that is posted, and ``data`` may be reused at once. So are
        bodies up to ``medium_limit``, in several packets, whether or not
        they are registered; cancelled after the first went, the rest is
        copied and still delivered. Larger ones are read by the peer from
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

        A revoked message's bytes stay readable until the peer answers the
        revocation (it may be reading them), or ``exposure_timeout`` more at
        most. With ``until_unexposed``, a large send that times out (or
        fails with the channel) raises only once the peer can no longer read
        ``data``, so it may be reused or freed at once; servers that bound
        the memory their replies hold, such as :mod:`aiordma.rpc`'s, count
        it until then.
        """
        if type(until_unexposed) is not bool:
            raise TypeError(f"until_unexposed must be a bool, not {until_unexposed!r}")
        posted = await self._post(data, head)
        if posted is not None:
            await self._exposures.read_by_peer(*posted, until_unexposed)

    async def send_messages(self, messages: Iterable[Body]) -> None:
        """Send each of ``messages`` as :meth:`send_message` would, in order.

        The small ones that the credits and the send queue let go at once
        are posted together: neighbours that fit one packet share it (one
        credit, one work request; the receiver still takes each as a
        message of its own), and the packets go as one chain, one doorbell.
        That is what makes a stream of small messages cheaper this way than
        one :meth:`send_message` each. The
        batch is checked first (sizes against both sides' ``max_message``,
        contiguity), so a bad message raises before any is sent. Messages of
        other tasks may go between runs of small ones and the larger ones,
        never inside a run. Cancelled, the messages not yet posted are not
        sent; those posted are delivered.
        """
        check_loop(self._loop)
        if isinstance(messages, bytes | bytearray | memoryview | str | MemoryRegion | Segment):
            raise TypeError(
                f"send_messages takes an iterable of messages, not one message "
                f"({type(messages).__name__}): use send_message(data), or send_messages([data])"
            )
        bodies = list(messages)
        sizes = [body_length(body) for body in bodies]
        for body in bodies:
            self._check_memory(body)
        peer_limit = self._packets.peer_max_message
        if peer_limit is None:
            peer_limit = await self._peer_limit()
        largest = max(sizes, default=0)
        if largest > self.max_message or largest > peer_limit:
            for size in sizes:
                self._check_size(size, peer_limit)  # raises for the first too large
        if largest <= self._packets.eager_limit:  # all small: no run to look for
            await self._send_small(bodies, sizes)
            return
        start, count = 0, len(bodies)
        while start < count:
            end = start
            while end < count and sizes[end] <= self._packets.eager_limit:
                end += 1
            if end > start:
                await self._send_small(bodies[start:end], sizes[start:end])
            if end < count:
                await self.send_message(bodies[end])
                end += 1
            start = end

    async def _send_small(self, bodies: list[Body], sizes: list[int]) -> None:
        """Post ``bodies`` (neighbours sharing packets), in order and in chains as credit
        allows: at once if nobody waits ahead, else in the send turn."""
        outbox = self._outbox
        done = outbox.send_eagers(bodies, sizes, 0, False)
        if done == len(bodies):
            return
        sender = self._sender
        await sender.take_turn()
        try:
            stalled = False
            while (done := outbox.send_eagers(bodies, sizes, done, True)) < len(bodies):
                # Wait for what the next needs; then it goes with what can follow.
                stalled = await sender.wait_to_post(stalled)
        finally:
            sender.end_turn()

    def _check_size(self, size: int, peer_limit: int | None) -> None:
        """Raise :class:`MessageTooLargeError` for a message either side refuses
        (the peer's limit checked once it is known). Callers test the limits
        inline and call this only for a message one of them refuses."""
        if size > self.max_message:
            raise MessageTooLargeError(
                f"message of {size} bytes exceeds this channel's max_message of {self.max_message}"
            )
        if peer_limit is not None and size > peer_limit:
            raise MessageTooLargeError(
                f"message of {size} bytes exceeds the peer's max_message of {peer_limit} "
                "(the receiving side sets it)"
            )

    async def post_message(self, data: Body, *, head: bytes = b"") -> asyncio.Future[None]:
        """:meth:`send_message`, but return once the message is posted, with a
        future that resolves when the peer has it.

        For a message copied into send buffers that is at once. A large one
        stays readable for the peer until it reads it (or ``exposure_timeout``
        passes: the future then fails with :class:`ExposureTimeoutError`);
        ``data`` must not change until the future is done, and cancelling the
        future revokes the message if the peer has not read it. Posting still
        waits for credit and for room under ``max_exposed``, so a writer that
        does not wait for delivery is held back as by a socket's buffer. A
        writer may drop the future: its failure (the channel closed, an
        exposure timeout, which is logged) is not reported as never retrieved.
        """
        posted = await self._post(data, head)
        if posted is not None:
            return self._exposures.delivery(*posted)
        delivered: asyncio.Future[None] = self._loop.create_future()
        delivered.set_result(None)
        return delivered

    async def _post(self, data: Body, head: bytes) -> tuple[int, Exposure] | None:
        """Check and post a message: None once a copied one is posted, or a
        large one's id and exposure once its announcement is."""
        check_loop(self._loop)
        if type(data) is bytes or type(data) is bytearray:
            size = len(data)
        else:
            size = body_length(data)
            self._check_memory(data)
        packets = self._packets
        peer_limit = packets.peer_max_message
        if size > self.max_message or (peer_limit is not None and size > peer_limit):
            self._check_size(size, peer_limit)
        if type(head) is not bytes and not isinstance(head, bytes | bytearray):
            raise TypeError(f"a message head must be bytes, not {type(head).__name__}")
        head_size = len(head)
        if head_size > packets.eager_limit:
            raise ValueError(f"message head of {head_size} bytes exceeds {packets.eager_limit}")
        if peer_limit is None:
            peer_limit = await self._peer_limit()
            if head_size > packets.eager_limit:  # the peer's buffers are smaller than ours
                raise ValueError(f"message head of {head_size} bytes exceeds {packets.eager_limit}")
            if size > peer_limit:
                self._check_size(size, peer_limit)
        if head_size + size <= packets.eager_limit:
            # Nobody ahead of us and credit there: posted without a task switch.
            if self._outbox.send_eager(head, data, size):
                return None
            await self._sender.in_turn(Kind.EAGER, 0, size, None, head, data)
            self._stats.count("messages_sent", "bytes_sent", size)
            return None
        if size <= self.medium_limit and head_size < self.eager_limit:  # registered too
            records = self._records
            if records is not None and packets.state.fits_ring(head_size + size):
                await send_record(self._sender, records, head, data, size)
            else:
                await send_medium(self._sender, self._outbox, head, data, size)
            self._stats.count("messages_sent", "bytes_sent", size)
            return None
        return await self._exposures.announce(self._sender, data, size, head)

    def forget_buffer(self, buffer: Any) -> bool:
        """Stop keeping ``buffer``'s registration (see ``registration_cache``),
        so that it can be resized or closed; whether one was kept."""
        into = self._kept_into.forget(buffer)
        return self._kept_from.forget(buffer) or into

    # -- lifecycle ---------------------------------------------------------

    def is_closing(self) -> bool:
        """True once the channel failed, or its connection is closing or closed."""
        return self._error is not None or self.link.is_closing()

    def close(self) -> Awaitable[None]:
        """Close the channel's connection (see :meth:`aiordma.Connection.close`)."""
        check_thread(self._loop, "MessageChannel.close()")
        return self.link.close()

    async def wait_closed(self) -> None:
        """Wait until the channel's connection is closed."""
        await self.link.wait_closed()
