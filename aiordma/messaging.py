"""Ordered messages of any size over a :class:`~aiordma.Connection`.

Small messages travel eagerly: copied into a registered send slot and sent
into one of the peer's pre-posted receive buffers, against a credit (see
:mod:`aiordma.credits`), so no send ever meets an empty receive queue.
Larger ones go by rendezvous: the sender exposes the message for remote
reading only, for exactly as long as the transfer takes, and advertises it;
the receiver reads it straight into its own memory with one RDMA read and
says it is done. Reading (rather than the sender writing) lets the receiver
choose where the bytes land and needs one control packet each way.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import itertools
import logging
from typing import Any

from aiordma.connection import Connection
from aiordma.credits import CreditWindow
from aiordma.exceptions import ConnectionLostError, ResourceClosedError
from aiordma.memory import Access, MemoryRegion, Segment
from aiordma.queue_pair import Send
from aiordma.wire import HEADER_SIZE, Header, Kind, ProtocolError

log = logging.getLogger(__name__)

DEFAULT_WINDOW = 32
DEFAULT_BUFFER = 8192
DEFAULT_MAX_MESSAGE = 64 << 20


class MessageTooLargeError(ValueError):
    """A message exceeds the channel's ``max_message``."""


class MessageChannel:
    """Ordered, flow-controlled messages on one connection.

    Create it in the connection's ``prepare`` hook on both sides (see
    :func:`prepare_channel`) so its receive buffers are posted before the
    peer can send.
    """

    def __init__(
        self,
        conn: Connection,
        *,
        window: int = DEFAULT_WINDOW,
        buffer_size: int = DEFAULT_BUFFER,
        max_message: int = DEFAULT_MAX_MESSAGE,
    ) -> None:
        if buffer_size <= HEADER_SIZE:
            raise ValueError(f"buffer_size must exceed the {HEADER_SIZE}-byte header")
        if window > conn.qp.options.recv_depth or window > conn.qp.options.send_depth:
            raise ValueError("window exceeds the queue pair's send or receive depth")
        self.conn = conn
        self.max_message = max_message
        self.eager_limit = buffer_size - HEADER_SIZE
        self._size = buffer_size
        self._credits = CreditWindow(window)
        self._recv_mr = conn.alloc(window * buffer_size)
        self._send_mr = conn.alloc(window * buffer_size)
        self._free_slots = list(range(window))
        self._changed = asyncio.Condition()
        self._incoming: collections.deque[asyncio.Future[bytes]] = collections.deque()
        self._arrived = asyncio.Event()
        self._exposed: dict[int, tuple[MemoryRegion, asyncio.Future[None]]] = {}
        self._ids = itertools.count(1)
        self._send_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._error: BaseException | None = None

    def _recv_slot(self, index: int) -> Segment:
        return self._recv_mr[index * self._size : (index + 1) * self._size]

    async def _post_all(self) -> None:
        futures = await self.conn.post_recv_batch(
            [self._recv_slot(i) for i in range(self._credits.window)]
        )
        for index, fut in enumerate(futures):
            fut.add_done_callback(functools.partial(self._on_packet, index))

    # -- receiving -----------------------------------------------------------

    def _on_packet(self, index: int, fut: asyncio.Future[Any]) -> None:
        if fut.cancelled() or fut.exception() is not None:
            self._fail(fut.exception() or ResourceClosedError("channel closed"))
            return
        wc = fut.result()
        view = self._recv_mr.view()[index * self._size : index * self._size + wc.byte_len]
        try:
            header = Header.unpack(view, self.max_message)
        except ProtocolError as exc:
            log.warning("closing %r: %s", self.conn, exc)
            self._fail(exc)
            self.conn.close()
            return
        self._credits.granted(header.credits)
        if header.kind == Kind.EAGER:
            done: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
            done.set_result(bytes(view[HEADER_SIZE:]))
            self._deliver(done)
        elif header.kind == Kind.RENDEZVOUS:
            assert header.remote is not None
            pending: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
            self._deliver(pending)
            self._spawn(self._fetch(header, pending))
        elif header.kind == Kind.DONE:
            entry = self._exposed.pop(header.msg_id, None)
            if entry is not None and not entry[1].done():
                entry[1].set_result(None)
        self._spawn(self._repost(index, header.kind != Kind.CREDIT))
        self._spawn(self._wake())

    def _deliver(self, fut: asyncio.Future[bytes]) -> None:
        self._incoming.append(fut)
        self._arrived.set()

    async def _fetch(self, header: Header, result: asyncio.Future[bytes]) -> None:
        assert header.remote is not None
        target = self.conn.device.alloc(header.length)
        try:
            await self.conn.rdma_read(target, header.remote)
            result.set_result(bytes(target.view()))
        except BaseException as exc:
            if not result.done():
                result.set_exception(exc)
            raise
        finally:
            await target.aclose()
        await self._send_packet(Header(Kind.DONE, 0, header.msg_id), b"", data=True)

    async def _repost(self, index: int, for_data: bool) -> None:
        (fut,) = await self.conn.post_recv_batch([self._recv_slot(index)])
        fut.add_done_callback(functools.partial(self._on_packet, index))
        self._credits.reposted(for_data)
        await self._notify()

    async def recv_message(self) -> bytes:
        """The next message, in the order they were sent."""
        while not self._incoming:
            if self._error is not None:
                raise self._error
            self._arrived.clear()
            await self._arrived.wait()
        fut = self._incoming[0]
        try:
            return await fut
        finally:
            if self._incoming and self._incoming[0] is fut and fut.done():
                self._incoming.popleft()

    def __aiter__(self) -> MessageChannel:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self.recv_message()
        except (ConnectionLostError, ResourceClosedError):
            raise StopAsyncIteration from None

    # -- sending -----------------------------------------------------------

    async def send_message(self, data: bytes | bytearray | memoryview) -> None:
        """Send ``data``; returns once the peer has it (large) or it is acknowledged (small)."""
        size = len(data)
        if size > self.max_message:
            raise MessageTooLargeError(
                f"message of {size} bytes exceeds this channel's max_message of {self.max_message}"
            )
        if size <= self.eager_limit:
            await self._send_packet(Header(Kind.EAGER, 0, 0, size), data, data=True)
            return
        exposed = self.conn.device.register(bytes(data), Access.REMOTE_READ)
        msg_id = next(self._ids)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._exposed[msg_id] = (exposed, done)
        try:
            header = Header(Kind.RENDEZVOUS, 0, msg_id, size, exposed.remote())
            await self._send_packet(header, b"", data=True)
            await done
        finally:
            self._exposed.pop(msg_id, None)
            await exposed.aclose()

    async def _send_packet(self, header: Header, payload: Any, *, data: bool) -> None:
        """Send one packet. Messages (EAGER, RENDEZVOUS) are posted in call order;
        control packets skip the queue, so they never wait behind a message."""
        if header.kind in (Kind.EAGER, Kind.RENDEZVOUS):
            async with self._send_lock:
                sent = await self._post_packet(header, payload, data=data)
        else:
            sent = await self._post_packet(header, payload, data=data)
        await sent

    async def _post_packet(
        self, header: Header, payload: Any, *, data: bool
    ) -> asyncio.Future[Any]:
        async with self._changed:
            while not (self._has_credit(data) and self._free_slots):
                if self._error is not None:
                    raise self._error
                await self._changed.wait()
            if self._error is not None:
                raise self._error
            credits = self._credits.take_for_data() if data else self._credits.take_for_update()
            slot = self._free_slots.pop()
        try:
            view = self._send_mr.view()[slot * self._size : (slot + 1) * self._size]
            packet = Header(header.kind, credits, header.msg_id, header.length, header.remote)
            packet.pack_into(view)
            end = HEADER_SIZE + len(payload)
            view[HEADER_SIZE:end] = payload
            segment = self._send_mr[slot * self._size : slot * self._size + end]
            (sent,) = await self.conn.post_batch([Send(segment)])
        except BaseException:
            self._release_slot(slot)
            raise
        sent.add_done_callback(lambda _: self._release_slot(slot))
        return sent

    def _release_slot(self, slot: int) -> None:
        self._free_slots.append(slot)
        self._spawn(self._notify())

    def _has_credit(self, data: bool) -> bool:
        return self._credits.can_send_data() if data else self._credits.available >= 1

    async def _notify(self) -> None:
        """Return credits if an update is due, and wake senders."""
        if self._credits.should_send_update() and self._error is None:
            with contextlib.suppress(Exception):
                await self._send_packet(Header(Kind.CREDIT, 0), b"", data=False)
        await self._wake()

    async def _wake(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # -- lifecycle ---------------------------------------------------------

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("message channel task ended: %r", task.exception())

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
            self._arrived.set()
            for _, fut in self._exposed.values():
                if not fut.done():
                    fut.set_exception(exc)
            self._spawn(self._notify())


async def prepare_channel(conn: Connection) -> MessageChannel:
    """A ``prepare`` hook giving each connection a :class:`MessageChannel` in ``conn.prepared``."""
    channel = MessageChannel(conn)
    await channel._post_all()
    return channel
