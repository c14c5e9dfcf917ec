"""A message channel's receive turn: taking queued messages, whatever their size.

A small message waiting at the head of the queue is taken without a turn
(:meth:`~aiordma.channel.packets.Packets.take_eager`, or the channel's
fast path through :meth:`Receiver.chosen`). Anything else takes the
receive turn, so messages are taken whole and in order: a small or saved
one is copied out, a MEDIUM one piece by piece as its PIECEs arrive, a
large one read by :class:`~aiordma.channel.rendezvous.Reader` where the
receiver chose. While the application takes large messages as new
objects, the next large one queued is read ahead into a new buffer (up to
the channel's ``read_ahead`` bytes), so the device works while the
application handles the one it has.

Call order: ``in_turn`` (any number at once: they queue), or ``chosen ->
Inbox.small_body -> Packets.consumed`` for the head of the queue.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from aiordma.channel.buffers import GIVE_BACK_AFTER, Into, buffer_length, buffer_view
from aiordma.channel.inbox import Phase
from aiordma.channel.link import Link
from aiordma.channel.packets import Packets
from aiordma.channel.registrations import RegistrationCache
from aiordma.channel.rendezvous import STAGED_READ_LIMIT, Reader
from aiordma.channel.wire import Kind
from aiordma.exceptions import BufferTooSmallError, MessageRevokedError
from aiordma.lifecycle import consume_outcome
from aiordma.metrics import Stats

if TYPE_CHECKING:
    from aiordma.channel.inbox import Arrival

Chooser = Callable[[bytes, int], "Into | None"]
"""Where a message's body goes, from its head and length (None: a new object)."""


class Receiver:
    """Takes ``packets``' queued messages in turn; large bodies through its
    :attr:`reader`, on ``link``, in pieces of ``read_piece`` bytes, keeping
    registrations in ``cache``; one of at most ``read_ahead`` bytes may be
    read before it is asked for. ``check()`` raises once the channel failed;
    ``send_done(msg_id)`` tells the sender a message was read, or a revoked
    one will not be; reads ahead are counted in ``stats``."""

    def __init__(
        self, packets: Packets, link: Link, cache: RegistrationCache, read_piece: int,
        read_ahead: int, check: Callable[[], None], send_done: Callable[[int], None],
        stats: Stats,
    ) -> None:  # fmt: skip
        self._packets = packets
        self._inbox = packets.inbox
        self._read_ahead_limit = read_ahead
        self._stats = stats
        self.reader = Reader(link, self.answer_revokes, cache, read_piece)
        self._check = check
        self._send_done = send_done
        self._lock = asyncio.Lock()
        self.landed_large = False
        """Whether a body of :data:`GIVE_BACK_AFTER` bytes or more landed in a new buffer."""
        self._ahead_read: asyncio.Task[None] | None = None
        """The last read ahead started: while ``inbox.ahead`` is set, that
        message's read. Whether a message is read ahead, and how far it got,
        is the inbox's alone; this is only the I/O, never cleared to say so."""

    def let_go(self, check: Callable[[], None]) -> None:
        """The channel failed: check with ``check`` (which raises its error)
        from now on, answer no more revocations, and stop reading ahead."""
        self._check = check
        self.reader.let_go()
        if self._ahead_read is not None:
            self._ahead_read.cancel()

    def answer_revokes(self) -> None:
        """Tell the sender, by DONE, that revoked messages will not be read,
        once no read is in flight (so no read can meet a revoked key)."""
        if self.reader.busy or self._packets.failed:
            return
        for msg_id in self._inbox.acks():
            self._send_done(msg_id)

    async def next_arrival(self) -> Arrival:
        """The first queued message, once one is there (raises once the
        channel failed and nothing that arrived before is left)."""
        while (arrival := self._inbox.first()) is None:
            self._check()
            await self._packets.waiting.arrivals()
        return arrival

    async def in_turn(self, choose: Chooser | None) -> tuple[bytes, bytes | bytearray | int]:
        """The next message as ``(head, body)`` (see
        ``MessageChannel.recv_message_with_head``), once earlier receives are done."""
        packets = self._packets
        packets.turn(False, 1)
        try:
            async with self._lock:
                return await self._take(choose)
        finally:
            packets.turn(False, -1)

    async def _take(self, choose: Chooser | None) -> tuple[bytes, bytes | bytearray | int]:
        inbox = self._inbox
        arrival = await self.next_arrival()
        header = arrival.header
        ahead = arrival is inbox.ahead
        if ahead and not await self._landed(arrival):
            ahead = False  # (landed first: it may be revoked, and no DONE may meet the read)
        head, into = self.chosen(arrival, choose)
        body: bytes | bytearray | int
        if arrival.phase == Phase.COPIED or header.kind in (Kind.EAGER, Kind.RECORD):
            body = inbox.small_body(arrival, into)
        elif header.kind == Kind.MEDIUM:
            body = await self._take_pieces(arrival, into)
        elif ahead:
            body = self._take_read_ahead(arrival, into)
        else:
            landed = bytearray(header.length) if into is None else None
            if landed is not None and header.length >= GIVE_BACK_AFTER:
                self.landed_large = True
            target = landed if landed is not None else into
            assert header.remote is not None
            assert target is not None
            inbox.read_started(arrival)
            inbox.new_objects = landed is not None
            self._read_ahead()
            try:  # a buffer made for the message keeps no registration
                await self.reader.read_body(header.remote, target, keep=landed is None)
            except BaseException:
                self._stopped(arrival)
                raise
            body = landed if landed is not None else header.length
        self._packets.consumed()
        if header.kind == Kind.RENDEZVOUS:
            self._read_ahead()
        return head, body

    def _stopped(self, arrival: Arrival) -> None:
        """A read of ``arrival``'s body failed or was cancelled: a REVOKE that
        came meanwhile is answered now."""
        self._inbox.read_stopped(arrival)
        self.answer_revokes()

    def _read_ahead(self) -> None:
        """Start reading the next large message queued into a new buffer,
        while the application takes them so and none is read ahead yet (one
        at most, up to the ``read_ahead`` bytes given; one small enough for
        the staging buffer is left to its receive)."""
        inbox = self._inbox
        if not inbox.new_objects or inbox.ahead is not None or not self._read_ahead_limit:
            return
        for arrival in inbox.unread(STAGED_READ_LIMIT):
            length = arrival.header.length
            if length > self._read_ahead_limit:
                return
            landed = bytearray(length)
            if length >= GIVE_BACK_AFTER:
                self.landed_large = True
            inbox.read_ahead(arrival, landed)
            self._ahead_read = asyncio.ensure_future(self._read_one_ahead(arrival, landed))
            self._ahead_read.add_done_callback(consume_outcome)
            self._stats.add("large_read_ahead")
            return

    async def _read_one_ahead(self, arrival: Arrival, landed: bytearray) -> None:
        """Read a queued message's body into ``landed``; once it is whole, its
        sender is told DONE, so its exposure ends before it is taken."""
        header = arrival.header
        assert header.remote is not None
        try:
            await self.reader.read_body(header.remote, landed, keep=False, ahead=True)
        except BaseException:
            self._stopped(arrival)
            raise
        if self._inbox.read_landed(arrival):
            self._send_done(header.msg_id)

    async def _landed(self, arrival: Arrival) -> bool:
        """Wait for the read ahead of ``arrival`` to land; False if it failed
        but the channel did not (the message is then read in its turn, as if
        not read ahead). Cancelled, the read goes on or has landed (the
        message stays queued); the channel failed, its error is raised."""
        read = self._ahead_read
        assert read is not None
        try:
            await asyncio.shield(read)
        except BaseException:
            if not read.done() or not (read.cancelled() or read.exception()):
                raise  # this receive was cancelled, as the read went on or landed
            self._check()
            if arrival.phase == Phase.LANDED:  # whole: only telling its sender failed
                return True
            self._inbox.forget_ahead()
            return False
        return True

    def _take_read_ahead(self, arrival: Arrival, into: Into | None) -> bytearray | int:
        """The body of a message read ahead, landed: its new buffer, or
        (``into`` chosen) copied there."""
        landed = arrival.landed
        assert landed is not None
        if into is None:
            return landed
        self._inbox.new_objects = False  # the application chooses buffers now
        buffer_view(into)[: len(landed)] = landed
        return len(landed)

    def chosen(self, arrival: Arrival, choose: Chooser | None) -> tuple[bytes, Into | None]:
        """The message's head and where its body goes (None: a new object);
        raises for a revoked message (consuming it) or a buffer too small."""
        header = arrival.header
        head = self._inbox.head(arrival)
        if self._inbox.withdrawn(arrival):
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
        larger than the window flows; the pieces that land while this task
        waits are copied from the completion drain, which wakes it once the
        body is whole. Cancelled, what was copied is kept, and the next
        receive resumes from it."""
        packets = self._packets
        length = arrival.header.length
        landed = bytearray(length) if into is None else None
        with buffer_view(landed if landed is not None else into) as target:  # type: ignore[arg-type]
            head, offset = packets.begin_medium(arrival, target)
            try:
                while offset < length:
                    self._check()  # failed: the buffers are no longer readable
                    offset = packets.take_pieces(arrival, target, offset)
                    if offset == length:
                        break
                    self._inbox.fill(arrival, target, offset)  # the rest copied as it lands
                    try:
                        await packets.waiting.arrivals()
                    finally:
                        offset = self._inbox.filled()
            except BaseException:
                if not packets.failed:  # cancelled: the next receive resumes
                    self._inbox.keep(arrival, head, target, offset)
                raise
        return landed if landed is not None else length
