"""A message channel's send turn, and posting that waits for what a packet needs.

Messages go out whole and in order: a send that cannot go at once (the
one-call path, :meth:`~aiordma.channel.outbox.Outbox.send_eager`, found
someone ahead, or no credit) takes the channel's send turn and posts its
packets once the send queue has room and a send slot and a credit are
there. Control packets (DONE, REVOKE) and a credit update that met a full
send queue go from tasks of their own.

Call order of a send that waits: ``take_turn -> (post | wait_to_post)* ->
end_turn`` (or ``in_turn``, which is that for one packet).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from aiordma.channel.buffers import Body
from aiordma.channel.packets import NO_ROOM, POSTED, Packets
from aiordma.channel.wire import Kind
from aiordma.exceptions import RdmaError, ResourceClosedError
from aiordma.lifecycle import spawn
from aiordma.metrics import Stats
from aiordma.verbs.memory import RemoteBuffer
from aiordma.verbs.queue_pair import QueuePair

log = logging.getLogger(__name__)


class Sender:
    """Posts ``packets`` on ``qp`` in turn; ``check()`` raises once the channel failed."""

    def __init__(
        self, packets: Packets, qp: QueuePair, stats: Stats, check: Callable[[], None]
    ) -> None:
        self._packets = packets
        self._qp = qp
        self._stats = stats
        self._check = check
        self._lock = asyncio.Lock()

    def let_go(self, check: Callable[[], None]) -> None:
        """The channel failed: check with ``check`` (which raises its error) from now on."""
        self._check = check

    async def take_turn(self) -> None:
        """Wait for the send turn (sends before this one are done)."""
        self._packets.turn(True, 1)
        try:
            await self._lock.acquire()
        except BaseException:
            self._packets.turn(True, -1)
            raise

    def end_turn(self) -> None:
        """The send holding the turn is done."""
        self._lock.release()
        self._packets.turn(True, -1)

    async def in_turn(
        self, kind: Kind, msg_id: int, length: int, remote: RemoteBuffer | None,
        head: bytes, body: Body | None,
    ) -> None:  # fmt: skip
        """:meth:`post` one packet once earlier sends are done."""
        await self.take_turn()
        try:
            await self.post(kind, msg_id, length, remote, head, body)
        finally:
            self.end_turn()

    async def post(
        self, kind: Kind, msg_id: int, length: int, remote: RemoteBuffer | None,
        head: bytes, body: Body | None,
    ) -> None:  # fmt: skip
        """Post a packet once send-queue room, a send slot and the credit it costs are there."""
        packets = self._packets
        stalled = False
        while True:
            self._check()
            status = packets.try_send(kind, msg_id, length, remote, head, body)
            if status == POSTED:
                return
            if status == NO_ROOM:
                await self._qp.wait_send_room()
                continue
            if not stalled:
                stalled = True
                self._stats.add("credit_stalls")
            await packets.waiting.changed()

    async def wait_to_post(self, stalled: bool = False) -> bool:
        """Wait for what the next packet needs once a one-call post stopped
        short: room in the send queue, or a change in credits and send slots
        (a credit stall, counted once per send: pass back what the last call
        returned). Raises once the channel failed."""
        self._check()
        packets = self._packets
        if not packets.lane.send_room():
            await self._qp.wait_send_room()
            return stalled
        if not stalled:
            self._stats.add("credit_stalls")
        await packets.waiting.changed()
        return True

    def hello(
        self, max_message: int, hello: bytes, went: Callable[[], None],
        failed: Callable[[BaseException], None],
    ) -> None:  # fmt: skip
        """Post our HELLO now (or once the send queue has room, which a fresh
        queue pair always has), then call ``went()``; ``failed`` is told if
        it cannot go later."""
        try:
            if not self._packets.send_hello(max_message, hello):
                spawn(self._hello_later(max_message, hello, went, failed))
                return
        except (RdmaError, ResourceClosedError):
            pass  # the channel failed (the packets reported it)
        went()

    async def _hello_later(
        self, max_message: int, hello: bytes, went: Callable[[], None],
        failed: Callable[[BaseException], None],
    ) -> None:  # fmt: skip
        try:
            await self._qp.wait_send_room()
            if not self._packets.send_hello(max_message, hello):
                raise ResourceClosedError("no room in the send queue for the channel's HELLO")
        except (RdmaError, ResourceClosedError) as exc:
            failed(exc)
        went()

    def control_soon(self, kind: Kind, msg_id: int) -> None:
        """Send a DONE or REVOKE from a task of its own."""
        if not self._packets.failed:
            spawn(self._control(kind, msg_id))

    async def _control(self, kind: Kind, msg_id: int) -> None:
        try:
            await self.post(kind, msg_id, 0, None, b"", None)
        except (RdmaError, ResourceClosedError, ConnectionResetError) as exc:
            log.debug("could not send %s for %d: %r", kind.name, msg_id, exc)

    def update_later(self) -> None:
        """A credit update met a full send queue: send it once there is room."""
        spawn(self._update_later())

    async def _update_later(self) -> None:
        try:
            await self._qp.wait_send_room()
        except BaseException:
            return
        finally:
            self._packets.room_came()
