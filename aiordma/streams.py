"""asyncio streams over RDMA: ``open_connection`` and ``start_stream_server``.

They hand out genuine :class:`asyncio.StreamReader` and
:class:`asyncio.StreamWriter` objects, so code written for asyncio streams
runs unchanged; underneath, a transport of our own carries the byte stream
as messages on a :class:`~aiordma.MessageChannel`:

- written bytes are buffered as a socket transport buffers them, and sent
  in messages of up to :data:`MESSAGE_SIZE` (the channel's credits and
  rendezvous then pace the writer: ``drain()`` waits while the peer is slow);
- received messages are fed to the reader; a reader holding more than twice
  its ``limit`` pauses the transport, which stops taking messages, so the
  peer's credits run out and it waits in turn;
- ``write_eof()`` and ``close()`` send one empty message, which the peer's
  reader sees as end of file (a connection lost without it is an error,
  as a reset socket is).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiordma.channel import (
    ConnectOptions,
    MessageChannel,
    OpenTuningKeywords,
    Prepare,
    ServeOptions,
    Server,
    ServeTuningKeywords,
    body_length,
    open_channel_with,
    split_keywords,
    start_channel_server_with,
)
from aiordma.exceptions import RdmaError
from aiordma.lifecycle import check_thread

if TYPE_CHECKING:
    from typing_extensions import Unpack

log = logging.getLogger(__name__)

PROTOCOL = "aiordma.streams"
"""What a stream's message channel announces (an RPC peer, say, is refused)."""
DEFAULT_LIMIT = 2**16
"""The readers' buffer limit, as for :func:`asyncio.open_connection`."""

MESSAGE_SIZE = 1 << 20
"""The largest message a stream is sent in: small enough that a paused
reader holds at most about this much beyond its limit, large enough that
bulk data travels by rendezvous in few round trips."""

WRITE_HIGH_WATER = 1 << 20
"""Buffered bytes above which ``drain()`` waits (a socket transport's is 64 KiB;
a larger buffer lets the writer fill whole messages)."""

ClientConnected = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[object] | None]


class _ChannelTransport(asyncio.Transport):
    """A byte-stream transport on a message channel, driving a stream protocol."""

    def __init__(
        self,
        channel: MessageChannel,
        protocol: asyncio.StreamReaderProtocol,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        super().__init__()
        self._channel = channel
        self._protocol = protocol
        self._loop = loop
        self._buffer = bytearray()
        self._high = WRITE_HIGH_WATER
        self._low = WRITE_HIGH_WATER // 4
        self._paused_writing = False
        self._eof_asked = False
        self._eof_sent = False
        self._eof_received = False
        self._closing = False
        self._lost = False
        self._reading = asyncio.Event()
        self._reading.set()
        self._flushing: asyncio.Task[None] | None = None
        self.closed: asyncio.Future[None] = loop.create_future()
        """Done once the connection is released (``connection_lost`` called)."""
        conn = channel.conn
        self._extra = {
            "peername": conn.peer_address,
            "sockname": conn.local_address,
            "channel": channel,
        }
        protocol.connection_made(self)
        self._pump = loop.create_task(self._read_pump())

    # -- reading ---------------------------------------------------------

    async def _read_pump(self) -> None:
        channel = self._channel
        try:
            while True:
                await self._reading.wait()
                data = await channel.recv_message()
                if not data:
                    self._eof_received = True
                    if not self._protocol.eof_received():
                        self.close()
                    # Half closed: this side may still write, until the
                    # peer's close (or loss) ends the connection.
                    await channel.wait_closed()
                    self._connection_lost(None)
                    return
                self._protocol.data_received(data)  # type: ignore[arg-type]  # extends a bytearray
        except (RdmaError, OSError) as exc:
            self._connection_lost(exc if not self._closing else None)
        except asyncio.CancelledError:
            pass

    def is_reading(self) -> bool:
        return self._reading.is_set() and not self._lost

    def pause_reading(self) -> None:
        self._reading.clear()

    def resume_reading(self) -> None:
        self._reading.set()

    # -- writing ---------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._eof_asked:
            raise RuntimeError("cannot write after write_eof() or close()")
        if type(data) is not bytes and type(data) is not bytearray:
            body_length(data)  # TypeError for a strided view or Python objects
        if self._lost or not data:
            return
        self._buffer += data
        if not self._paused_writing and len(self._buffer) > self._high:
            self._paused_writing = True
            self._protocol.pause_writing()
        self._flush_soon()

    def _flush_soon(self) -> None:
        if self._flushing is None or self._flushing.done():
            self._flushing = self._loop.create_task(self._flush())

    async def _flush(self) -> None:
        channel = self._channel
        sending_data = False
        try:
            while self._buffer:
                sending_data = True
                size = min(len(self._buffer), MESSAGE_SIZE, channel.max_message,
                           channel.peer_max_message or channel.max_message)  # fmt: skip
                chunk = bytes(self._buffer[:size])
                del self._buffer[:size]
                await channel.send_message(chunk)
                if self._paused_writing and len(self._buffer) <= self._low:
                    self._paused_writing = False
                    self._protocol.resume_writing()
            sending_data = False
            if self._eof_asked and not self._eof_sent:
                self._eof_sent = True
                await channel.send_message(b"")
            if self._closing:
                await channel.close()
                self._connection_lost(None)
        except (RdmaError, OSError) as exc:
            self._buffer.clear()
            # Once the peer sent its end of file, or when all our data went
            # and only our end of file or the close was left, the stream
            # ended cleanly: the peer just went first.
            clean = self._eof_received or not sending_data
            self._connection_lost(None if clean else exc)

    def get_write_buffer_size(self) -> int:
        return len(self._buffer)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low, self._high

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        high = WRITE_HIGH_WATER if high is None else high
        low = high // 4 if low is None else low
        if not 0 <= low <= high:
            raise ValueError(f"high ({high}) must be >= low ({low}) must be >= 0")
        self._high, self._low = high, low

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        if self._eof_asked:
            return
        self._eof_asked = True
        self._flush_soon()

    # -- closing ---------------------------------------------------------

    def is_closing(self) -> bool:
        return self._closing or self._lost

    def close(self) -> None:
        """Send what is buffered and end of file, then close the connection."""
        if self._closing or self._lost:
            return
        check_thread(self._loop, "the stream's close()")
        self._closing = True
        self._eof_asked = True
        self._flush_soon()

    def abort(self) -> None:
        """Close the connection now, dropping what is buffered."""
        if self._lost:
            return
        check_thread(self._loop, "the stream's abort()")
        self._closing = True
        self._buffer.clear()
        self._channel.close()
        self._connection_lost(None)

    def _connection_lost(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._lost = True
        if self._flushing is not None and self._flushing is not asyncio.current_task():
            self._flushing.cancel()
        if self._pump is not asyncio.current_task():
            self._pump.cancel()
        closing = self._channel.close()  # releases the connection (idempotent)
        self._protocol.connection_lost(exc)

        def released(_: object) -> None:
            if not self.closed.done():
                self.closed.set_result(None)

        asyncio.ensure_future(closing).add_done_callback(released)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._extra.get(name, default)


def _streams(
    channel: MessageChannel, limit: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, _ChannelTransport]:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=limit, loop=loop)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    transport = _ChannelTransport(channel, protocol, loop)
    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    return reader, writer, transport


async def open_connection(
    host: str, port: int, *, limit: int = DEFAULT_LIMIT, prepare: Prepare | None = None,
    **keywords: Unpack[OpenTuningKeywords],
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:  # fmt: skip
    """Connect and return ``(reader, writer)``, like :func:`asyncio.open_connection`.

    The peer must serve streams (:func:`start_stream_server`). ``keywords``
    are :func:`aiordma.connect`'s settings (:class:`~aiordma.ConnectOptions`:
    ``timeout``, ``auth``, ``options``...) and channel options
    (:class:`~aiordma.ChannelOptions`), as for :func:`aiordma.open_channel`.
    ``writer.close()`` sends what is buffered and closes the connection;
    ``writer.get_extra_info("peername")`` is the peer's address.
    """
    if limit <= 0:
        raise ValueError("limit must be positive")
    settings, options = split_keywords(
        ConnectOptions, keywords, caller="aiordma.open_connection", protocol=PROTOCOL
    )
    channel = await open_channel_with(host, port, settings, options, prepare)
    reader, writer, _ = _streams(channel, limit)
    return reader, writer


async def start_stream_server(
    client_connected_cb: ClientConnected, host: str | None = None, port: int = 0, *,
    limit: int = DEFAULT_LIMIT, prepare: Prepare | None = None,
    **keywords: Unpack[ServeTuningKeywords],
) -> Server:  # fmt: skip
    """Serve streams, like :func:`asyncio.start_server`.

    ``client_connected_cb(reader, writer)`` runs for each client (it may be
    a coroutine function). As with asyncio, the connection stays open until
    the writer is closed (or the peer goes), even after the callback
    returns. ``keywords`` are :func:`aiordma.start_server`'s settings
    (:class:`~aiordma.ServeOptions`) and channel options, as for
    :func:`aiordma.start_channel_server`.
    """
    if limit <= 0:
        raise ValueError("limit must be positive")

    async def handle(channel: MessageChannel) -> None:
        reader, writer, transport = _streams(channel, limit)
        try:
            result = client_connected_cb(reader, writer)
            if result is not None:
                await result
        except Exception:
            log.exception("stream handler failed for %s", transport.get_extra_info("peername"))
            transport.abort()
        await transport.closed

    settings, options = split_keywords(
        ServeOptions, keywords, caller="aiordma.start_stream_server", protocol=PROTOCOL
    )
    return await start_channel_server_with(handle, host, port, settings, options, prepare)
