"""The baseline: the same patterns over asyncio TCP streams, to the same address.

A small RPC protocol (length-prefixed frames, many calls in flight, matched
by id) with the three methods the RDMA peer's :func:`~aiordma.bench.peer.service`
serves: ``echo`` (the payload back), ``sink`` (an empty reply) and
``source`` (as many bytes as the payload's decimal number says). Every
benchmark mode maps to one of them:

* ``write_lat``, ``write_bw``, ``send_rate``: ``sink`` with ``size`` bytes
  (data out, a short acknowledgement back, as a signalled RDMA write);
* ``read_lat``, ``read_bw``, ``rpc_bw``: ``source`` of ``size`` bytes;
* ``send_lat``, ``rpc_lat``, ``msg_lat``, ``msg_reg_lat``: ``echo`` of ``size`` bytes;
* ``msg_bw``, ``msg_reg_bw``, ``rpc_sink``: ``sink`` of ``size`` bytes.

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

_REQUEST = struct.Struct("<QQB")  # payload length, call id, method
_REPLY = struct.Struct("<QQ")  # payload length, call id
METHODS = ("echo", "sink", "source")
READER_LIMIT = 4 << 20
"""The stream reader limit on both ends (asyncio pauses reading at twice it)."""

PATTERN = {
    "write_lat": "sink",
    "write_bw": "sink",
    "send_rate": "sink",
    "read_lat": "source",
    "read_bw": "source",
    "rpc_bw": "source",
    "rpc_fetch": "source",
    "rpc_sink": "sink",
    "msg_lat": "echo",
    "msg_reg_lat": "echo",
    "msg_bw": "sink",
    "msg_reg_bw": "sink",
    "send_lat": "echo",
    "rpc_lat": "echo",
}
"""The TCP call standing in for each benchmark mode."""


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Serve one TCP connection: each call is answered in the order it arrives."""
    blobs: dict[int, bytes] = {}
    try:
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
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def start_server(host: str) -> asyncio.Server:
    """Listen for TCP benchmark clients on ``host`` (any free port)."""
    return await asyncio.start_server(handle, host, 0, limit=READER_LIMIT)


class Client:
    """The calling side of :func:`handle`; any number of calls may be in flight."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer
        self._pending: dict[int, asyncio.Future[bytes]] = {}
        self._ids = itertools.count()
        self._task = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def connect(cls, host: str, port: int) -> Client:
        return cls(*await asyncio.open_connection(host, port, limit=READER_LIMIT))

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
    """The method and payload of the TCP call that stands in for ``mode`` at ``size``."""
    method = PATTERN[mode]
    return method, (str(size).encode() if method == "source" else bytes(size))
