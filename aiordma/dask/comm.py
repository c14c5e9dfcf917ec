"""The ``rdma://`` comm: Dask messages over an aiordma :class:`~aiordma.MessageChannel`.

One Dask comm is one rdma_cm connection with its message channel. Each
Dask message is serialized to frames by distributed (``to_frames``) and
sent as :mod:`aiordma.dask.wire` lays out: small frames together in one
packet, large ones exposed where they are (a NumPy array's own memory)
and RDMA-read by the receiver into a block of registered memory lent to
the frame (:mod:`aiordma.dask.landing`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from distributed.comm.addressing import parse_host_port, unparse_host_port
from distributed.comm.core import (
    BaseListener,
    Comm,
    CommClosedError,
    Connector,
    FatalCommClosedError,
)
from distributed.comm.utils import from_frames, to_frames
from distributed.utils import nbytes

from aiordma.channel import (
    ConnectionRequest,
    MessageChannel,
    RejectConnection,
    Server,
    open_channel_with,
    start_channel_server_with,
)
from aiordma.dask import wire
from aiordma.dask.addresses import rdma_host
from aiordma.dask.config import Settings, settings
from aiordma.dask.landing import DEFAULT_CAPACITY as DEFAULT_POOL
from aiordma.dask.landing import frame_for
from aiordma.exceptions import AuthenticationError, ConnectionRejectedError, RdmaError

log = logging.getLogger(__name__)

SCHEME = "rdma"
PREFIX = f"{SCHEME}://"

REFUSAL = b"not an aiordma Dask comm"
"""What a Dask listener rejects other clients with."""

HELLO = b"aiordma-dask/1"
"""Private data both sides send when connecting, so that a Dask comm
connects only to a Dask comm listener (anything else is refused at once,
not left to fail in the middle of distributed's handshake)."""

Handler = Callable[[Comm], Awaitable[None] | None]


def _says(private_data: bytes, expected: bytes) -> bool:
    # rdma_cm pads private data with zeros.
    return private_data.rstrip(b"\0") == expected


class RdmaComm(Comm):
    """One established ``rdma://`` connection, as a Dask :class:`~distributed.comm.core.Comm`."""

    def __init__(
        self,
        channel: MessageChannel,
        local_addr: str,
        peer_addr: str,
        deserialize: bool = True,
        pool_bytes: int = DEFAULT_POOL,
    ) -> None:
        super().__init__(deserialize=deserialize)
        self._channel: MessageChannel | None = channel
        self._local_addr = local_addr
        self._peer_addr = peer_addr
        self._closed = False
        self._piece = channel.max_message
        self._undelivered: set[asyncio.Future[None]] = set()
        """Large frames written and not yet read by the peer."""
        self._pool_bytes = pool_bytes
        """Frames larger than this are sent as several messages."""

    @property
    def local_address(self) -> str:
        """``rdma://host:port`` of this side of the connection."""
        return self._local_addr

    @property
    def peer_address(self) -> str:
        """``rdma://host:port`` of the peer (a listener's address, for a connecting comm)."""
        return self._peer_addr

    @property
    def channel(self) -> MessageChannel | None:
        """The message channel this comm runs on (None once closed)."""
        return self._channel

    def _live(self, writing: bool) -> MessageChannel:
        """The channel, unless this side closed it (or, to write, the connection
        is closing: reads still get what arrived before the peer closed)."""
        channel = self._channel
        if channel is None or self._closed or (writing and channel.is_closing()):
            self._closed = True
            raise CommClosedError(f"{self!r} is closed")
        return channel

    def _failed(self, exc: BaseException) -> CommClosedError:
        """Abort after a failure in the middle of a message (what is left on the
        wire can no longer be told apart) and say why, as distributed expects."""
        self.abort()
        return CommClosedError(f"in {self!r}: {type(exc).__name__}: {exc}")

    async def read(self, deserializers: Any = None) -> Any:
        """The next message; ``CommClosedError`` once the connection is closed or lost."""
        channel = self._live(writing=False)
        try:
            frames = await self._read_frames(channel)
        except (RdmaError, OSError) as exc:
            raise self._failed(exc) from exc
        except BaseException:
            self.abort()  # cancelled half-way: the rest of the message is lost
            raise
        try:
            return await from_frames(
                frames,
                deserialize=self.deserialize,
                deserializers=deserializers,
                allow_offload=self.allow_offload,
            )
        except EOFError as exc:
            raise self._failed(exc) from exc

    async def _read_frames(self, channel: MessageChannel) -> list[Any]:
        landed: list[bytearray] = []

        def into(head: bytes, size: int) -> bytearray:
            # A writable buffer, so that NumPy arrays built on inline frames are too.
            landed.append(bytearray(size))
            return landed[0]

        await channel.recv_message_with_head(into)
        lead = landed[0]
        layout = wire.unpack_header(lead)
        inline = dict(wire.inline_frames(memoryview(lead), layout))
        frames: list[Any] = []
        device = channel.device
        try:
            for index, size in enumerate(layout.sizes):
                frame = inline.get(index)
                if frame is None:
                    frame, segment = frame_for(device, size, self._pool_bytes)
                    frames.append(frame)
                    target = frame if segment is None else segment
                    # The sender chose the pieces (its piece-size); each
                    # message continues the frame where the last one ended.
                    start = 0
                    while start < size:
                        got = await channel.recv_message_into(target[start:size])
                        if got == 0:
                            raise RdmaError(f"an empty piece with {size - start} bytes to come")
                        start += got
                else:
                    frames.append(frame)
        except BaseException:
            # A read of this message may still land in its frames until the
            # connection is gone: they go back to the pool only then.
            holding = asyncio.ensure_future(_hold_until_closed(channel, frames))
            _holding.add(holding)
            holding.add_done_callback(_holding.discard)
            raise
        return frames

    def _delivered(self, delivered: asyncio.Future[None]) -> None:
        self._undelivered.discard(delivered)
        if not delivered.cancelled() and delivered.exception() is not None:
            # Not read in time, or the connection failed: the peer cannot
            # have the whole message, so neither side may go on.
            log.warning("%r: a large frame was not delivered: %s", self, delivered.exception())
            self.abort()

    async def write(self, msg: Any, serializers: Any = None, on_error: str = "message") -> int:
        """Send ``msg``; returns once it is handed over: its large frames stay
        readable for the peer (their memory is the message's own, and must
        not change) until it reads them, or ``exposure-timeout`` passes and
        the comm fails. Returns the bytes sent."""
        channel = self._live(writing=True)
        frames = await to_frames(
            msg,
            allow_offload=self.allow_offload,
            serializers=serializers,
            on_error=on_error,
            context={
                "sender": self.local_info,
                "recipient": self.remote_info,
                **self.handshake_options,
            },
            frame_split_size=self._piece,
        )
        sizes = [nbytes(f) for f in frames]
        piece = min(self._piece, channel.peer_max_message or self._piece)
        layout = wire.plan(sizes, channel.eager_limit)
        lead = bytearray(wire.pack_header(layout))
        for frame, inline in zip(frames, layout.inline, strict=True):
            if inline:
                lead += frame
        try:
            await channel.send_message(lead)
            for frame, size, inline in zip(frames, sizes, layout.inline, strict=True):
                if inline:
                    continue
                view = memoryview(frame).cast("B")
                for start in wire.pieces(size, piece):
                    # Posted, not awaited: the peer reads it when it reads
                    # the message, as a socket's buffer holds what was written.
                    delivered = await channel.post_message(view[start : start + piece])
                    if not delivered.done():
                        self._undelivered.add(delivered)
                        delivered.add_done_callback(self._delivered)
        except (RdmaError, OSError) as exc:
            raise self._failed(exc) from exc
        except BaseException:
            self.abort()  # cancelled half-way: the peer would read a torn message
            raise
        return sum(sizes)

    async def close(self) -> None:
        """Close after the messages already written are delivered (as a socket's
        close; their large frames wait for the peer at most ``exposure-timeout``)."""
        channel, self._channel = self._channel, None
        self._closed = True
        if channel is not None:
            if self._undelivered:
                await asyncio.wait(set(self._undelivered))
            await channel.close()

    def abort(self) -> None:
        """Close now; the connection's release finishes in the background."""
        channel, self._channel = self._channel, None
        self._closed = True
        if channel is not None:
            channel.close()

    def closed(self) -> bool:
        """True once this side closed or aborted, or the connection was lost."""
        if not self._closed and (self._channel is None or self._channel.is_closing()):
            self._closed = True
        return self._closed

    async def _wait_closed(self) -> None:
        channel = self._channel
        if channel is not None:
            await channel.wait_closed()

    @property
    def extra_info(self) -> dict[str, Any]:
        """Nothing beyond the addresses (no certificates: ``rdma://`` is not encrypted)."""
        return {}


_holding: set[asyncio.Future[None]] = set()


async def _hold_until_closed(channel: MessageChannel, frames: list[Any]) -> None:
    """Keep ``frames`` (and the pool blocks under them) until ``channel`` is closed."""
    try:
        await channel.wait_closed()
    finally:
        frames.clear()


def _check_encryption(address: str, connection_args: dict[str, Any]) -> None:
    if connection_args.get("require_encryption"):
        raise RuntimeError(
            "encryption required by Dask configuration, refusing communication from/to "
            f"{PREFIX}{address}: rdma:// is not encrypted"
        )


def _address(addr: tuple[str, int]) -> str:
    return PREFIX + unparse_host_port(addr[0], addr[1])


class RdmaConnector(Connector):
    """Opens ``rdma://`` comms; distributed's ``connect`` retries it until its timeout."""

    prefix = PREFIX
    """The scheme with its ``://``, as distributed's own connectors have it."""

    async def connect(self, address: str, deserialize: bool = True, **connection_args: Any) -> Comm:
        """Connect to ``address`` (``host:port``); raises ``OSError`` to be
        retried, ``FatalCommClosedError`` for a peer that is no Dask comm or
        one that does not hold the same ``auth-key``."""
        _check_encryption(address, connection_args)
        host, port = parse_host_port(address)
        config = settings()
        try:
            channel = await open_channel_with(
                host, port, config.connect_options(HELLO), config.channel_options()
            )
        except AuthenticationError as exc:
            # Not retryable: distributed retries an OSError until its
            # connect timeout, and would report only that it timed out.
            raise FatalCommClosedError(
                f"{PREFIX}{address}: {exc} (distributed.comm.rdma.auth-key must be the "
                "same on both sides)"
            ) from exc
        except ConnectionRejectedError as exc:
            if not _says(exc.private_data, REFUSAL):
                raise  # refused for another reason: distributed retries until its timeout
            raise FatalCommClosedError(
                f"{PREFIX}{address} refused the connection: it is a Dask listener that "
                "does not speak this version's protocol"
            ) from exc
        except OSError:
            raise  # nobody listening yet, no route...: distributed retries until its timeout
        except RdmaError as exc:
            # Not a Dask comm listener (it refused our hello, or serves no
            # message channel): retrying would not help.
            raise FatalCommClosedError(
                f"{PREFIX}{address} is not an aiordma Dask comm listener: {exc}"
            ) from exc
        conn = channel.conn
        if not _says(conn.peer_private_data, HELLO):
            await channel.close()
            raise FatalCommClosedError(
                f"{PREFIX}{address} accepted, but is not an aiordma Dask comm listener"
            )
        return RdmaComm(
            channel, _address(conn.local_address), PREFIX + address, deserialize=deserialize,
            pool_bytes=config.landing_pool,
        )  # fmt: skip


class RdmaListener(BaseListener):
    """Listens for ``rdma://`` comms and hands each, after the handshake, to ``comm_handler``."""

    prefix = PREFIX
    """The scheme with its ``://`` (distributed's workers build addresses with it)."""

    def __init__(
        self,
        address: str,
        comm_handler: Handler,
        deserialize: bool = True,
        allow_offload: bool = True,
        default_host: str | None = None,
        default_port: int = 0,
        **connection_args: Any,
    ) -> None:
        super().__init__()
        _check_encryption(address, connection_args)
        self.ip, self.port = parse_host_port(address, default_port)
        self.default_host = default_host
        self.comm_handler = comm_handler
        self.deserialize = deserialize
        self.allow_offload = allow_offload
        self._server: Server | None = None
        self._bound: tuple[str, int] | None = None
        self._config: Settings | None = None

    async def start(self) -> None:
        """Start listening (``OSError`` for an address of no RDMA device).

        No host (``rdma://``, ``rdma://:port``) listens on every address of
        both families and, as for ``tcp://``, reports ``0.0.0.0``; a wildcard
        host listens on every RDMA-capable address of its family.
        """
        host = self.ip or None
        config = self._config = settings()
        self._server = await start_channel_server_with(
            self._on_channel, host, self.port, config.serve_options(self._accept),
            config.channel_options(),
        )  # fmt: skip
        bound_host, bound_port = self._server.addresses[0]
        self._bound = ("0.0.0.0" if host is None else bound_host, bound_port)

    @staticmethod
    def _accept(request: ConnectionRequest) -> bytes:
        if not _says(request.private_data, HELLO):
            raise RejectConnection(REFUSAL)
        return HELLO

    def stop(self) -> None:
        """Stop listening; comms already established, or still shaking hands,
        stay open (a distributed ``Server`` aborts the latter itself, as for
        ``tcp://``)."""
        server = self._server
        if server is not None and not server.is_closing():
            server.close()

    async def wait_closed(self) -> None:
        """Wait until the listener stopped and every comm it accepted is closed."""
        if self._server is not None:
            await self._server.wait_closed()

    async def _on_channel(self, channel: MessageChannel) -> None:
        conn = channel.conn
        comm = RdmaComm(
            channel,
            _address(conn.local_address),
            _address(conn.peer_address),
            deserialize=self.deserialize,
            pool_bytes=self._config.landing_pool if self._config else DEFAULT_POOL,
        )
        comm.allow_offload = self.allow_offload
        if self._server is None or self._server.is_closing():
            # Stopped after accepting: do not leave the peer waiting.
            comm.abort()
            return
        try:
            await self.on_connection(comm)
        except CommClosedError:
            log.info("connection from %s closed before the handshake completed", comm.peer_address)
            return
        result = self.comm_handler(comm)
        if result is not None:
            await result
        # The connection lives as long as the comm, which distributed closes
        # when it is done with it (its handler returns at once).
        await comm._wait_closed()

    def _bound_address(self) -> tuple[str, int]:
        if self._bound is None:
            raise ValueError("invalid operation on a listener that was not started")
        return self._bound

    def get_host_port(self) -> tuple[str, int]:
        """The (host, port) listened on; the port is real even if 0 was asked."""
        return self._bound_address()

    @property
    def listen_address(self) -> str:
        """``rdma://host:port`` listened on (the host may be a wildcard)."""
        return _address(self._bound_address())

    @property
    def contact_address(self) -> str:
        """``rdma://host:port`` peers connect to: a wildcard host becomes the
        address of this machine's first active RDMA port."""
        host, port = self._bound_address()
        if host in ("0.0.0.0", "::", ""):
            host = self.default_host or rdma_host(6 if host == "::" else 4)
        return PREFIX + unparse_host_port(host, port)
