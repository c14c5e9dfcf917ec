"""The baseline: the same patterns over asyncio TCP streams, to the same address.

Each mode is compared with the plainest good asyncio code for its pattern.
A connection's first byte picks one of three protocols:

* ``ping`` (:class:`Framed`, :meth:`Framed.ping`): length-prefixed frames,
  each echoed back as it arrives; for the ping-pong modes ``msg_lat``,
  ``msg_reg_lat`` and ``send_lat``.
* ``stream`` (:meth:`Framed.send`, :meth:`Framed.flush`): frames written
  back to back and dropped by the server, which answers an empty frame
  once it has read everything before it; for ``msg_bw``, ``msg_into_bw``, ``msg_reg_bw``,
  ``write_bw`` and ``send_rate``.
* an RPC (:class:`Client`: call ids, many calls in flight, futures) with
  the three methods the RDMA peer's :func:`~aiordma.bench.peer.service`
  serves: ``echo`` (the payload back), ``sink`` (an empty reply) and
  ``source`` (as many bytes as the payload's decimal number says); for
  the ``rpc_*`` modes, and for one-sided operations that wait for an
  answer (``write_lat``: ``sink``; ``read_*``: ``source``).

Both ends use a stream reader limit of :data:`READER_LIMIT` (4 MiB):
with asyncio's default (64 KiB) the transport stops reading whenever
128 KiB are buffered, which caps large transfers.

Bandwidth modes keep ``depth`` calls in flight, as the RDMA modes keep
``depth`` operations in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import struct

_FRAME = struct.Struct("<I")  # payload length (ping and stream)
_REQUEST = struct.Struct("<QQB")  # payload length, call id, method
_REPLY = struct.Struct("<QQ")  # payload length, call id
METHODS = ("echo", "sink", "source")
PLAIN = ("ping", "stream")
"""The two framed protocols (everything else is a method of the RPC)."""
_SELECT = {"ping": b"P", "stream": b"S", "rpc": b"R"}
"""The first byte of a connection: which protocol it speaks."""
READER_LIMIT = 4 << 20
"""The stream reader limit on both ends (asyncio pauses reading at twice it)."""

PATTERN = {
    "write_lat": "sink",
    "write_bw": "stream",
    "send_rate": "stream",
    "read_lat": "source",
    "read_bw": "source",
    "rpc_bw": "source",
    "rpc_fetch": "source",
    "rpc_sink": "sink",
    "msg_lat": "ping",
    "msg_reg_lat": "ping",
    "msg_bw": "stream",
    "msg_into_bw": "stream",
    "msg_rate": "stream",
    "msg_reg_bw": "stream",
    "xfer_read": "source",
    "xfer_write": "stream",
    "send_lat": "ping",
    "rpc_lat": "echo",
}
"""The TCP pattern (a framed protocol, or an RPC method) standing in for each mode."""


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Serve one TCP connection in the protocol its first byte names."""
    try:
        select = await reader.readexactly(1)
        if select == _SELECT["rpc"]:
            await _serve_rpc(reader, writer)
        elif select in (_SELECT["ping"], _SELECT["stream"]):
            await _serve_frames(reader, writer, echo=select == _SELECT["ping"])
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def _serve_frames(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, echo: bool
) -> None:
    """Echo every frame (``ping``), or drop them and answer each empty one (``stream``)."""
    while True:
        header = await reader.readexactly(_FRAME.size)
        (length,) = _FRAME.unpack(header)
        payload = await reader.readexactly(length) if length else b""
        if echo or not length:
            writer.writelines((header, payload))
            await writer.drain()


async def _serve_rpc(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Each call is answered in the order it arrives."""
    blobs: dict[int, bytes] = {}
    while True:
        length, call_id, method = _REQUEST.unpack(await reader.readexactly(_REQUEST.size))
        payload = await reader.readexactly(length)
        name = METHODS[method]
        if name == "echo":
            result = payload
        elif name == "sink":
            result = b""
        else:
            size = int(payload)
            result = blobs.setdefault(size, bytes(size))
        writer.write(_REPLY.pack(len(result), call_id))
        writer.write(result)
        await writer.drain()


async def start_server(host: str) -> asyncio.Server:
    """Listen for TCP benchmark clients on ``host`` (any free port)."""
    return await asyncio.start_server(handle, host, 0, limit=READER_LIMIT)


async def _open(
    host: str, port: int, protocol: str
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(host, port, limit=READER_LIMIT)
    writer.write(_SELECT[protocol])
    return reader, writer


class Framed:
    """The client of the ``ping`` or ``stream`` protocol: length-prefixed
    frames and nothing else (no ids, no futures, no task)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer

    @classmethod
    async def connect(cls, host: str, port: int, protocol: str) -> Framed:
        """Open a connection speaking ``protocol`` (``ping`` or ``stream``)."""
        if protocol not in PLAIN:
            raise ValueError(f"not a framed protocol: {protocol!r}")
        return cls(*await _open(host, port, protocol))

    async def _frame(self) -> bytes:
        (length,) = _FRAME.unpack(await self._reader.readexactly(_FRAME.size))
        return await self._reader.readexactly(length) if length else b""

    async def ping(self, payload: bytes) -> bytes:
        """Send one frame and wait for its echo (``ping``)."""
        self._writer.writelines((_FRAME.pack(len(payload)), payload))
        await self._writer.drain()
        return await self._frame()

    async def send(self, payload: bytes) -> None:
        """Send one frame, waiting only while the transport's buffer is full (``stream``)."""
        self._writer.writelines((_FRAME.pack(len(payload)), payload))
        await self._writer.drain()

    async def flush(self) -> None:
        """Wait until the server has read every frame sent (``stream``)."""
        self._writer.write(_FRAME.pack(0))
        await self._writer.drain()
        await self._frame()

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(ConnectionError):
            await self._writer.wait_closed()

    async def __aenter__(self) -> Framed:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Client:
    """The calling side of :func:`handle`; any number of calls may be in flight."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer
        self._pending: dict[int, asyncio.Future[bytes]] = {}
        self._ids = itertools.count()
        self._task = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def connect(cls, host: str, port: int) -> Client:
        return cls(*await _open(host, port, "rpc"))

    async def _read(self) -> None:
        try:
            while True:
                length, call_id = _REPLY.unpack(await self._reader.readexactly(_REPLY.size))
                data = await self._reader.readexactly(length)
                fut = self._pending.pop(call_id)
                if not fut.done():
                    fut.set_result(data)
        except BaseException as exc:
            error = exc if isinstance(exc, Exception) else ConnectionResetError("client closed")
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(error)
            self._pending.clear()
            raise

    async def call(self, method: str, payload: bytes = b"") -> bytes:
        if self._task.done():
            raise ConnectionResetError("the TCP benchmark connection is gone")
        call_id = next(self._ids)
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._pending[call_id] = fut
        self._writer.write(_REQUEST.pack(len(payload), call_id, METHODS.index(method)))
        self._writer.write(payload)
        await self._writer.drain()
        return await fut

    async def close(self) -> None:
        self._task.cancel()
        self._writer.close()
        await asyncio.gather(self._task, return_exceptions=True)
        with contextlib.suppress(ConnectionError):
            await self._writer.wait_closed()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def request_for(mode: str, size: int) -> tuple[str, bytes]:
    """The pattern (a framed protocol or an RPC method) and payload that
    stand in for ``mode`` at ``size``."""
    method = PATTERN[mode]
    return method, (str(size).encode() if method == "source" else bytes(size))
