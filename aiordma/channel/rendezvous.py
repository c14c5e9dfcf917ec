"""Large messages by rendezvous: this side's exposures, and its reader of the peer's.

The sender exposes exactly a message's bytes, through a memory window or a
registration of their own, for remote *reading* only, and advertises them;
the receiver reads them with RDMA reads straight into the memory it
chooses, then says it is done (DONE), and only then does the exposure end.
An exposure also ends when its send is cancelled or it is not read within
``exposure_timeout`` (it is revoked: REVOKE, and the bytes stay readable
until the peer answers, since it may be reading them), or when the channel
fails; the bytes held exposed at once are bounded by ``max_exposed``.

:class:`Exposures` and :class:`Reader` do the I/O; which message may be
exposed, ended or revoked, and the bytes exposed, are counted by a
:class:`~aiordma.channel.ledger.Ledger`. They reach the channel only
through the callbacks they are given.

Call order of one exposure: ``expose -> posted -> (ended | revoke -> (ended
| the timeout))``, or ``expose -> withdraw`` when its announcement could not
be sent; ``fail`` ends every one.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiordma.channel import sizing
from aiordma.channel.buffers import Body, Into, buffer_view
from aiordma.channel.ledger import Ledger
from aiordma.channel.link import Link
from aiordma.channel.registrations import RegistrationCache, release_mr
from aiordma.channel.sender import Sender
from aiordma.channel.wire import Kind
from aiordma.exceptions import ExposureTimeoutError, ResourceBusyError, again
from aiordma.lifecycle import consume_outcome
from aiordma.metrics import Stats
from aiordma.verbs.completion import WorkCompletion
from aiordma.verbs.memory import Access, MemoryRegion, RemoteBuffer, Segment
from aiordma.verbs.options import Read
from aiordma.verbs.window import MemoryWindow

log = logging.getLogger(__name__)

STAGED_READ_LIMIT = 256 << 10
"""Large messages up to this size, bound for memory the channel did not
register, are read into one registered staging buffer and copied out: a
copy costs less than registering and deregistering the destination
(``docs/decisions/0004-compiled-core.md``, "Staged reads")."""


@dataclass(slots=True)
class Exposure:
    """The I/O side of a large message's exposure: its registration or memory
    window, the future its sender awaits, and its deadline."""

    key: MemoryRegion | MemoryWindow
    """What grants the peer access: a registration of exactly the message's
    bytes, or a window over them (revoked without deregistering)."""
    size: int
    done: asyncio.Future[None]
    """Resolved once the peer has read the message (or failed: revoked, the channel failed)."""
    unexposed: asyncio.Future[None]
    """Resolved once the peer can no longer read the bytes."""
    timer: asyncio.TimerHandle | None = None

    @property
    def remote(self) -> RemoteBuffer:
        key = self.key
        return key.remote if isinstance(key, MemoryWindow) else key.remote()

    def revoke(self) -> None:
        """The peer's access ends now (or, for a registration still in use
        by local work, once that work completes)."""
        key = self.key
        if isinstance(key, MemoryWindow):
            key.invalidate()
        elif not key.closed:
            release_mr(key)


class Exposures:
    """This side's large messages exposed to the peer, by message id.

    ``check()`` raises once the channel failed, ``changed()`` waits until
    its state may have changed, ``wake()`` says that it did, and
    ``send_control(kind, msg_id)`` sends a REVOKE (in the background). Each
    callable in :attr:`watchers` is told of every new exposure.
    """

    def __init__(
        self,
        link: Link,
        max_exposed: int,
        exposure_timeout: float | None,
        stats: Stats,
        *,
        check: Callable[[], None],
        changed: Callable[[], Awaitable[None]],
        wake: Callable[[], None],
        send_control: Callable[[Kind, int], None],
        cache: RegistrationCache,
    ) -> None:
        self._link = link
        self._cache = cache
        self.ledger = Ledger(max_exposed)
        """The exposed messages' ids and the bytes they cover."""
        self._loop = link.qp.loop
        self.exposure_timeout = exposure_timeout
        self._stats = stats
        self._check = check
        self._changed = changed
        self._wake = wake
        self._send_control = send_control
        self._held: dict[int, Exposure] = {}
        self._withdrawn: dict[int, Exposure] = {}
        """Revoked exposures, readable until the peer answers the REVOKE."""
        self.watchers: list[Callable[[Exposure], None]] = []

    def __len__(self) -> int:
        return len(self._held)

    async def expose(self, body: Body, size: int) -> tuple[int, Exposure]:
        """Expose exactly ``body``'s bytes for remote reading, once they fit
        under ``max_exposed``; the peer can read nothing else with the rkey.

        Memory registered with ``Access.MW_BIND`` is exposed through a memory
        window bound on this channel's queue pair (nothing is registered), and
        so is a buffer whose registration the channel keeps (one sent from
        before, where the device has windows); anything else through its own
        registration.
        """
        while not self.ledger.room_for(size):
            self._check()
            await self._changed()
        self._check()
        key: MemoryRegion | MemoryWindow | None = self._window_over(body)
        if key is None and self._link.qp.device.attributes.memory_windows:
            try:
                kept = self._cache.segment_for(body)
            except TypeError:  # not contiguous
                kept = None
            if kept is not None:
                key = self._window_over(kept)
        if key is None:
            source = body.view() if isinstance(body, MemoryRegion | Segment) else body
            try:
                key = self._link.register(source, Access.REMOTE_READ)
            except TypeError:  # not contiguous
                key = self._link.register(bytes(memoryview(source)), Access.REMOTE_READ)
        msg_id = self.ledger.expose(size)
        exposure = Exposure(key, size, self._loop.create_future(), self._loop.create_future())
        self._held[msg_id] = exposure
        for watcher in self.watchers:
            watcher(exposure)
        return msg_id, exposure

    def let_go(self, check: Callable[[], None], changed: Callable[[], Awaitable[None]]) -> None:
        """The channel failed (every exposure ended): check with ``check``
        (which raises its error), and wait with ``changed``, from now on."""
        self._check = check
        self._changed = changed

    def _window_over(self, body: Body) -> MemoryWindow | None:
        """A window exposing exactly ``body``, bound (in send-queue order, so
        before the rendezvous that names it) on this channel's queue pair;
        None where a window cannot do that."""
        if not isinstance(body, MemoryRegion | Segment):
            return None
        segment = body[:] if isinstance(body, MemoryRegion) else body
        region = segment.mr
        qp = self._link.qp
        attributes = qp.device.attributes
        if region.closed or not region.access & Access.MW_BIND or not attributes.memory_windows:
            return None
        if not attributes.bounded_windows and len(segment) != len(region):
            return None  # its rkey would reach the whole region (rxe)
        try:
            return qp.bind_window_nowait(segment, Access.REMOTE_READ)
        except (ResourceBusyError, ValueError):  # queue full, or another device's memory
            return None

    async def announce(
        self, sender: Sender, body: Body, size: int, head: bytes
    ) -> tuple[int, Exposure]:
        """Expose ``body`` (``size`` bytes) and send its RENDEZVOUS, with
        ``head``, in its turn; returns its id and exposure. Its
        ``exposure_timeout`` starts once the peer can know of it."""
        msg_id, exposure = await self.expose(body, size)
        try:
            await sender.in_turn(Kind.RENDEZVOUS, msg_id, size, exposure.remote, head, None)
        except BaseException:
            self.withdraw(msg_id)
            exposure.done.cancel()
            raise
        self.posted(msg_id)
        return msg_id, exposure

    async def read_by_peer(
        self, msg_id: int, exposure: Exposure, until_unexposed: bool = False
    ) -> None:
        """Wait until the peer has read the message; cancelled, it is revoked.
        With ``until_unexposed``, a message revoked for its timeout (or
        failed with the channel) raises only once the peer can no longer
        read its bytes."""
        failure: Exception | None = None
        try:
            await asyncio.shield(exposure.done)
        except asyncio.CancelledError:
            if not exposure.done.done():
                self.revoke(msg_id, asyncio.CancelledError())
            raise
        except Exception as exc:
            failure = exc
        if failure is not None:
            # The future keeps its error: raised as it is, it would hold this
            # frame (and the sender's, with the message's bytes) in a cycle.
            failure.__traceback__ = None
            if until_unexposed:
                await asyncio.shield(exposure.unexposed)
            raise again(failure, None)

    def delivery(self, msg_id: int, exposure: Exposure) -> asyncio.Future[None]:
        """A future of the peer having read the message; cancelling it
        revokes the message if the peer has not read it.

        Its failure is marked retrieved: a writer may drop these futures
        (fire and forget), and what fails them is news of its own already:
        the channel's end, or an exposure timeout (logged as a warning).
        Awaiting one still raises."""
        delivered: asyncio.Future[None] = self._loop.create_future()

        def settle(done: asyncio.Future[None]) -> None:
            if delivered.done():
                return
            if done.cancelled():
                delivered.cancel()
            elif (error := done.exception()) is not None:
                delivered.set_exception(error)
                delivered.exception()  # see above: no "never retrieved" report
            else:
                delivered.set_result(None)

        def withdrawn(future: asyncio.Future[None]) -> None:
            if future.cancelled() and not exposure.done.done():
                self.revoke(msg_id, asyncio.CancelledError())

        exposure.done.add_done_callback(settle)
        delivered.add_done_callback(withdrawn)
        return delivered

    def posted(self, msg_id: int) -> None:
        """The message's announcement went: its ``exposure_timeout`` starts."""
        exposure = self._held.get(msg_id)
        if self.exposure_timeout is not None and exposure is not None and not exposure.done.done():
            exposure.timer = self._loop.call_later(self.exposure_timeout, self.revoke, msg_id, None)

    def withdraw(self, msg_id: int) -> None:
        """The announcement could not be sent: end the exposure (the peer never knew of it)."""
        if self.ledger.withdraw(msg_id):
            self._unexpose(self._held.pop(msg_id))

    def ended(self, msg_id: int) -> None:
        """The peer said DONE: it read the message, or answered its revocation
        (:class:`ProtocolError` if this side does not hold it exposed)."""
        self.ledger.done(msg_id)
        exposure = self._held.pop(msg_id, None) or self._withdrawn.pop(msg_id)
        self._unexpose(exposure)
        if not exposure.done.done():  # read: the send is done
            exposure.done.set_result(None)
            self._stats.count("messages_sent", "bytes_sent", exposure.size)
            self._stats.add("large_sent")

    def fail(self, exc: BaseException) -> None:
        """The channel failed: every exposure ends, and its sender gets ``exc``."""
        for msg_id in self.ledger.clear():
            exposure = self._held.pop(msg_id, None) or self._withdrawn.pop(msg_id)
            if not exposure.done.done():
                exposure.done.set_exception(again(exc, exc.__traceback__))  # see again()
                exposure.done.exception()
            self._unexpose(exposure)

    def _unexpose(self, exposure: Exposure) -> None:
        """End an exposure's I/O (the ledger already stopped counting it): the
        rkey stops working now (or once local work on it is done)."""
        if exposure.timer is not None:
            exposure.timer.cancel()
            exposure.timer = None
        exposure.revoke()
        if isinstance(exposure.key, MemoryWindow):
            self._cache.unbound(exposure.key.segment.mr)
        if not exposure.unexposed.done():
            exposure.unexposed.set_result(None)
        self._wake()

    def revoke(self, msg_id: int, cause: BaseException | None) -> None:
        """Withdraw an unread large message (its send was cancelled, or ``cause``
        is None: it timed out) and tell the peer. The caller stops waiting now;
        the bytes stay readable until the peer answers (it may be reading
        them: a revoked key would fail its read and the connection), or for
        ``exposure_timeout`` more at most."""
        if not self.ledger.revoke(msg_id):
            return
        self._stats.add("large_revoked" if cause is not None else "exposure_timeouts")
        exposure = self._withdrawn[msg_id] = self._held.pop(msg_id)
        if exposure.timer is not None:
            exposure.timer.cancel()
            exposure.timer = None
        if self.exposure_timeout is not None:
            exposure.timer = self._loop.call_later(
                self.exposure_timeout, self._forget_withdrawn, msg_id
            )
        if not exposure.done.done():
            if cause is None:
                error = ExposureTimeoutError(
                    f"the peer did not read message {msg_id} ({exposure.size} bytes) within "
                    f"exposure_timeout ({self.exposure_timeout} s); it was revoked"
                )
                log.warning("%r: %s", self._link, error)
                exposure.done.set_exception(error)
            else:
                exposure.done.cancel()
        self._send_control(Kind.REVOKE, msg_id)

    def _forget_withdrawn(self, msg_id: int) -> None:
        """The peer did not answer a REVOKE within ``exposure_timeout``: end the exposure."""
        if self.ledger.forget_revoked(msg_id):
            exposure = self._withdrawn.pop(msg_id)
            exposure.timer = None
            log.warning("%r: the peer did not answer the revocation of message %d within "
                        "%s s; its memory is no longer readable", self._link, msg_id,
                        self.exposure_timeout)  # fmt: skip
            self._unexpose(exposure)


def _nothing() -> None:
    """What a failed channel's reader calls when its reads end."""


class _Window:
    """Room for pieces in flight, shared by a channel's reads; a read of the
    message being taken is given room before a read ahead, so reading ahead
    only fills what the message being taken leaves.

    Call order, per piece: ``take`` (or ``take_now`` returning True) ->
    ``give`` once it has landed.
    """

    def __init__(self, size: int) -> None:
        self._free = size
        self._waiting: tuple[collections.deque[asyncio.Future[None]], ...] = (
            collections.deque(),  # reads of the message being taken
            collections.deque(),  # reads ahead
        )

    def take_now(self) -> bool:
        """Take room for one piece if there is some (nobody waits then)."""
        if self._free:
            self._free -= 1
            return True
        return False

    async def take(self, ahead: bool) -> None:
        """Take room for one piece, waiting behind earlier takers of the same
        kind, and behind every read of a message being taken if ``ahead``."""
        if self.take_now():
            return
        handed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting[ahead].append(handed)
        try:
            await handed
        except asyncio.CancelledError:
            if handed.done() and not handed.cancelled():  # handed over as it was cancelled
                self.give()
            elif handed in self._waiting[ahead]:  # (else give() dropped it already)
                self._waiting[ahead].remove(handed)
            raise

    def give(self) -> None:
        """A piece landed (or was never posted): its room goes to the first
        waiting read, or is free."""
        for waiting in self._waiting:
            while waiting:
                handed = waiting.popleft()
                if not handed.done():
                    handed.set_result(None)
                    return
        self._free += 1


class Reader:
    """Reads the peer's large messages: in pieces, at most a few at once,
    into registered memory directly (the application's, or a registration
    of its buffer the channel keeps or makes for the message), or through
    one staging buffer.

    ``idle()`` is called whenever the last read in flight lands: revocations
    that came meanwhile may be answered then.
    """

    def __init__(
        self,
        link: Link,
        idle: Callable[[], None],
        cache: RegistrationCache,
        piece: int = sizing.READ_PIECE,
    ) -> None:
        self._link = link
        self._cache = cache
        self.piece = piece
        """The size of each RDMA read."""
        self._idle = idle
        self._reads: set[asyncio.Future[WorkCompletion]] = set()
        """RDMA reads in flight (those of cancelled receives too)."""
        self._room = _Window(sizing.READS_IN_FLIGHT)
        """Pieces in flight, whatever message they are of: a read ahead shares
        one window with the message being taken, so it never paces the peer's
        adapter faster than one message's read does."""
        self._staging: MemoryRegion | None = None

    def let_go(self) -> None:
        """The channel failed: nothing is answered any more when reads end."""
        self._idle = _nothing

    @property
    def busy(self) -> bool:
        """Whether a read is in flight."""
        return bool(self._reads)

    def _landed(self, read: asyncio.Future[WorkCompletion]) -> None:
        self._reads.discard(read)
        self._room.give()
        if not self._reads:
            self._idle()

    async def read_body(
        self, remote: RemoteBuffer, target: Into, keep: bool = True, ahead: bool = False
    ) -> None:
        """RDMA-read ``remote`` (a rendezvous message's body) into the start of
        ``target``, whose registration may be kept only if ``keep`` (not for a
        buffer made for the message); ``ahead``: before it is asked for (its
        pieces wait for those of the message being taken)."""
        await self._read(target, remote, keep, ahead)

    async def _read(self, target: Into, remote: RemoteBuffer, keep: bool, ahead: bool) -> None:
        """RDMA-read ``remote`` into the start of ``target``."""
        own: MemoryRegion | None = None
        if isinstance(target, MemoryRegion):
            segment = target.segment(0, remote.length)
        elif isinstance(target, Segment):
            segment = target[: remote.length]
        elif remote.length <= STAGED_READ_LIMIT:
            # Reads run one at a time (under the receive lock), and a read
            # left behind by a cancelled receive lands before the next one
            # completes (RC order), so one staging buffer serves them all.
            if self._staging is None:
                self._staging = self._link.alloc(STAGED_READ_LIMIT)
            staged = self._staging.segment(0, remote.length)
            await self._read_pieces(staged, remote, ahead)
            with staged.view() as data:
                buffer_view(target)[: remote.length] = data
            return
        else:
            kept = self._cache.segment_for(target) if keep else None
            if kept is None:
                own = self._link.register(target, Access.LOCAL_WRITE)
                segment = own.segment(0, remote.length)
            else:
                segment = kept[: remote.length]
        try:
            await self._read_pieces(segment, remote, ahead)
        finally:
            if own is not None:
                release_mr(own)

    async def _read_pieces(self, local: Segment, remote: RemoteBuffer, ahead: bool) -> None:
        """RDMA-read ``remote`` into ``local`` in pieces of :attr:`piece`
        (sized by the path, :mod:`~aiordma.channel.sizing`), at most
        :data:`~aiordma.channel.sizing.READS_IN_FLIGHT` at once, counting
        every read of this reader's.

        One read of many megabytes makes the peer's adapter send every
        response packet at once, with nothing to pace it: across a real link
        a receiver that falls behind drops some, and each loss costs a
        retransmission of everything after it. A small window of pieces
        read fastest across the two-host lab's link, with and without packet
        loss (``docs/design.md`` has the figures), and the first bytes land
        while later pieces are still being asked for.
        """
        qp = self._link.qp
        size = remote.length
        step = self.piece
        starts = range(0, size, step)

        def piece(start: int) -> Read:
            end = min(start + step, size)
            return Read(local[start:end], remote[start:end])

        room = self._room
        pending: collections.deque[asyncio.Future[WorkCompletion]] = collections.deque()
        index, count = 0, len(starts)
        try:
            while index < count:
                await room.take(ahead)  # each read posted holds one, until it lands
                last = index + 1
                while last < count and room.take_now():
                    last += 1
                try:
                    reads = await qp.post_batch([piece(start) for start in starts[index:last]])
                except BaseException:
                    for _ in range(index, last):
                        room.give()
                    raise
                for read in reads:  # tracked until they land, awaited or not
                    self._reads.add(read)
                    read.add_done_callback(self._landed)
                pending.extend(reads)
                index = last
                while pending and pending[0].done():
                    pending.popleft().result()  # a failed piece raises now
            while pending:
                await pending.popleft()
        finally:
            for left in pending:  # cancelled or failed: nobody awaits the rest
                left.add_done_callback(consume_outcome)
