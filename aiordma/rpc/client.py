"""The calling side: many calls in flight on one connection, matched by id."""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass, field
from typing import Any

from aiordma.connection import Connection
from aiordma.connection import connect as connect_rdma
from aiordma.device import Device
from aiordma.exceptions import ResourceClosedError
from aiordma.messaging import (
    DEFAULT_MAX_MESSAGE,
    BufferTooSmallError,
    Into,
    MessageChannel,
    _bytes_view,
    _length,
    channel_factory,
)
from aiordma.queue_pair import QueuePairOptions
from aiordma.rpc.codecs import Codec, RawCodec
from aiordma.rpc.errors import RemoteError, UnknownMethodError
from aiordma.rpc.frames import Frame, FrameKind, parse_error_body
from aiordma.wire import ProtocolError

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Call:
    method: str
    future: asyncio.Future[Any]
    into: Into | None
    error: BaseException | None = field(default=None)


class Client:
    """Calls remote methods over one RDMA connection (see :func:`connect`).

    Any number of calls may be in flight; replies complete them in whatever
    order they arrive. Closing the client, or losing the connection, fails
    every outstanding call at once.
    """

    def __init__(self, conn: Connection, *, codec: Codec | None = None) -> None:
        if not isinstance(conn.prepared, MessageChannel):
            raise TypeError("the connection needs a MessageChannel (prepare=prepare_channel)")
        self.conn = conn
        self._channel: MessageChannel = conn.prepared
        self._codec: Codec = codec or RawCodec()
        self._ids = itertools.count(1)
        self._pending: dict[int, _Call] = {}
        self._error: BaseException | None = None
        self._reader = asyncio.get_running_loop().create_task(self._read_replies())
        self._background: set[asyncio.Task[None]] = set()
        self._channel.deliver_to(self._on_reply)

    def __repr__(self) -> str:
        return f"<rpc.Client {self.conn!r} pending={len(self._pending)}>"

    async def call(
        self,
        method: str,
        payload: Any = None,
        *,
        timeout: float | None = None,  # noqa: ASYNC109  (per call, as the issue asks)
        into: Into | None = None,
    ) -> Any:
        """Call ``method`` with ``payload`` and return its decoded result.

        With ``into``, the result's bytes land in that buffer (by RDMA read,
        with no copy, when large) and the call returns their count. Raises
        :class:`RemoteError` if the handler raised, :class:`UnknownMethodError`
        if there is no such method, and ``TimeoutError`` after ``timeout``
        seconds (a late reply is then discarded). Cancelling a call leaves
        the other calls alone and asks the server to cancel its handler.
        """
        if self._error is not None:
            raise self._error
        call_id = next(self._ids)
        head = Frame(FrameKind.REQUEST, call_id, method).pack()
        body = self._codec.encode(payload)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[call_id] = _Call(method, fut, into)
        try:
            async with asyncio.timeout(timeout):
                await self._channel._send(head, body)
                return await fut
        except BaseException:
            if self._pending.pop(call_id, None) is not None and self._error is None:
                self._spawn(self._send_cancel(call_id))
            raise

    async def _send_cancel(self, call_id: int) -> None:
        try:
            await self._channel._send(Frame(FrameKind.CANCEL, call_id).pack(), b"")
        except Exception as exc:
            log.debug("could not cancel call %d: %r", call_id, exc)

    def _choose(self, head: bytes, length: int) -> Into | None:
        frame = Frame.unpack(head)
        return self._into(frame, self._pending.get(frame.call_id), length)

    @staticmethod
    def _into(frame: Frame, call: _Call | None, length: int) -> Into | None:
        """Where a reply of ``length`` bytes lands: the caller's ``into=``, or None
        for a new object (with ``call.error`` set if ``into`` is too small)."""
        if call is None or call.into is None or frame.kind != FrameKind.REPLY:
            return None
        if _length(call.into) < length:
            call.error = BufferTooSmallError(length, _length(call.into))
            return None
        return call.into

    def _on_reply(self, head: bytes, body: memoryview) -> bool:
        """A small reply, straight from the receive buffer (see MessageChannel.deliver_to)."""
        frame = self._reply_frame(head)
        call = self._pending.pop(frame.call_id, None)
        if call is None or call.future.done():
            return True  # the caller gave up: a late reply
        into = self._into(frame, call, len(body))
        if into is None:
            self._complete(call, frame.kind, bytes(body))
        else:
            with _bytes_view(into) as target:
                target[: len(body)] = body
            self._complete(call, frame.kind, len(body))
        return True

    @staticmethod
    def _reply_frame(head: bytes) -> Frame:
        frame = Frame.unpack(head)
        if frame.kind not in (FrameKind.REPLY, FrameKind.ERROR):
            raise ProtocolError(f"a server sent a {frame.kind.name} frame")
        return frame

    async def _read_replies(self) -> None:
        """Replies the delivery hook leaves queued: large ones, read by RDMA."""
        try:
            while True:
                head, body = await self._channel._receive(self._choose)
                frame = self._reply_frame(head)
                call = self._pending.pop(frame.call_id, None)
                if call is None or call.future.done():
                    continue  # the caller gave up: a late reply
                self._complete(call, frame.kind, body)
        except ProtocolError as exc:
            log.warning("closing %r: %s", self.conn, exc)
            self.conn.close()
            self._fail(exc)
        except BaseException as exc:
            self._fail(exc)

    def _complete(self, call: _Call, kind: FrameKind, body: bytes | bytearray | int) -> None:
        if call.error is not None:
            call.future.set_exception(call.error)
        elif kind == FrameKind.ERROR:
            assert not isinstance(body, int)
            remote_type, message = parse_error_body(body)
            cls = UnknownMethodError if remote_type == "UnknownMethodError" else RemoteError
            call.future.set_exception(cls(call.method, remote_type, message))
        elif isinstance(body, int):
            call.future.set_result(body)
        else:
            try:
                call.future.set_result(self._codec.decode(body))
            except Exception as exc:
                call.future.set_exception(exc)

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = (
                exc if isinstance(exc, Exception) else ResourceClosedError("RPC client closed")
            )
        pending, self._pending = self._pending, {}
        for call in pending.values():
            if not call.future.done():
                call.future.set_exception(self._error)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- lifecycle ---------------------------------------------------------

    def close(self) -> None:
        """Close the connection; outstanding calls fail with ResourceClosedError."""
        self._fail(ResourceClosedError("RPC client closed"))
        self.conn.close()

    async def wait_closed(self) -> None:
        """Wait until the connection is closed and the reply reader has stopped."""
        await self.conn.wait_closed()
        if not self._reader.done():
            self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
        await self.wait_closed()


async def connect(
    host: str,
    port: int,
    *,
    codec: Codec | None = None,
    max_message: int = DEFAULT_MAX_MESSAGE,
    timeout: float | None = 10.0,  # noqa: ASYNC109  (as aiordma.connect)
    device: Device | None = None,
    options: QueuePairOptions | None = None,
) -> Client:
    """Connect to an RPC server (see :func:`aiordma.rpc.start_server`)."""
    conn = await connect_rdma(
        host,
        port,
        timeout=timeout,
        device=device,
        options=options,
        prepare=channel_factory(max_message=max_message),
    )
    return Client(conn, codec=codec)
