"""Connections that come with a message channel: the ``prepare`` hook that
makes one, :func:`open_channel` (the client) and :func:`start_channel_server`.

The hook sets the channel up before the peer can send (its receives are
posted when it returns), on both sides; ``open_channel`` then waits for the
server's HELLO, so a connection it returns is one the server holds too.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from aiordma.channel.channel import MessageChannel
from aiordma.channel.link import Link
from aiordma.channel.options import ChannelKeywords, ChannelOptions, TuningKeywords
from aiordma.channel.pool import SharedReceiveQueue
from aiordma.cm.auth import PresharedKey
from aiordma.cm.connect import connect as connect_rdma
from aiordma.cm.connection import Connection, Prepare
from aiordma.cm.server import DEFAULT_HANDSHAKE_TIMEOUT, Accept, Server
from aiordma.cm.server import start_server as start_rdma_server
from aiordma.exceptions import ConnectionLostError
from aiordma.lifecycle import is_async_callable
from aiordma.verbs.device import Device
from aiordma.verbs.queue_pair import QueuePairOptions

if TYPE_CHECKING:
    from typing_extensions import Unpack


class OpenKeywords(TuningKeywords, total=False):
    """What the layers above forward to :func:`~aiordma.open_channel` besides its
    channel options (for typing ``**``)."""

    shared_receive: SharedReceiveQueue | None


async def prepare_channel(conn: Link) -> MessageChannel:
    """The ``prepare`` hook giving each connection a :class:`MessageChannel`
    with the default options in ``conn.prepared`` (``channel_factory()``).

    It sets up a channel on any :class:`~aiordma.channel.link.Link` the same way: its
    receives are posted when this returns, before the peer may send.
    """
    channel = MessageChannel(conn)
    await channel._start()
    return channel


def channel_factory(
    then: Prepare | None = None, /, **options: Unpack[ChannelKeywords]
) -> Callable[[Connection], Awaitable[MessageChannel]]:
    """The ``prepare`` hook that gives each connection a :class:`MessageChannel`
    with ``options`` (its keyword arguments) in ``conn.prepared``, then runs
    ``then`` if given (which sees the channel there; its result is discarded).

    The options are checked now, once, not per connection (those that
    depend on the queue pair's sizes only when a connection has one).
    """
    ChannelOptions.of(options).layout(None, None, None)

    async def prepare(conn: Connection) -> MessageChannel:
        channel = MessageChannel(conn, **options)
        await channel._start()
        if then is not None:
            conn.prepared = channel
            result = then(conn)
            if inspect.isawaitable(result):
                await result
        return channel

    return prepare


def check_options(
    options: Mapping[str, Any],
    qp_options: QueuePairOptions | None = None,
    shared: SharedReceiveQueue | None = None,
) -> None:
    """Refuse bad channel options before anything connects (TypeError or
    ValueError naming the option), checking the sizes against ``qp_options``
    (the defaults if None) and ``shared`` when given."""
    qp_options = qp_options or QueuePairOptions()
    if shared is not None and not isinstance(shared, SharedReceiveQueue):
        raise TypeError(f"shared_receive must be an aiordma.SharedReceiveQueue, not {shared!r}")
    ChannelOptions.of(options).layout(
        qp_options.recv_depth,
        qp_options.send_depth,
        None if shared is None else shared.buffer_size,
    )


async def open_channel(
    host: str,
    port: int,
    *,
    private_data: bytes = b"",
    timeout: float | None = 10.0,  # noqa: ASYNC109  (as aiordma.connect)
    device: Device | None = None,
    options: QueuePairOptions | None = None,
    prepare: Prepare | None = None,
    auth: PresharedKey | bytes | None = None,
    shared_receive: SharedReceiveQueue | None = None,
    **channel_options: Unpack[ChannelKeywords],
) -> MessageChannel:
    """Connect and return the connection's :class:`MessageChannel`, like
    :func:`asyncio.open_connection` returns a stream.

    The peer must serve channels too (:func:`start_channel_server`, or
    ``prepare=prepare_channel``). ``channel_options`` are
    :class:`MessageChannel`'s keyword arguments; the connection is
    ``channel.conn``, and closing the channel closes it. ``prepare``, if
    given, runs after the channel is set up (its result is discarded).
    ``auth`` authenticates both peers, as for :func:`aiordma.connect`.
    With ``shared_receive`` the channel draws its receive buffers from that
    :class:`~aiordma.SharedReceiveQueue` (for clients of many servers).

    It returns once the server's channel has said HELLO, so the server
    holds the connection too: a server that dropped it during set-up (its
    ``handshake_timeout`` expired under load, say) raises
    :class:`ConnectionLostError` here, a peer speaking another protocol
    :class:`ProtocolMismatchError`, and no HELLO within ``timeout``
    ``TimeoutError``; the connection is closed in each case.
    """
    check_options(channel_options, options, shared_receive)
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    conn = await connect_rdma(
        host,
        port,
        private_data=private_data,
        timeout=timeout,
        device=device,
        options=options,
        prepare=channel_factory(prepare, **channel_options),
        auth=auth,
        shared_receive=shared_receive,
    )
    channel: MessageChannel = conn.prepared
    try:
        async with asyncio.timeout_at(deadline):
            await channel._peer_limit()
    except BaseException as exc:
        conn.close()
        if not isinstance(exc, Exception):  # cancelled: the close goes on by itself
            raise
        await conn.wait_closed()
        if isinstance(exc, TimeoutError):
            raise TimeoutError(
                f"{host}:{port} accepted the connection but its channel did not confirm it "
                f"(HELLO) within {timeout} s"
            ) from exc
        if not isinstance(exc, ConnectionError):  # a mismatch; a server with no channel (RNR)
            raise
        raise ConnectionLostError(
            f"{host}:{port} dropped the connection before its channel confirmed it; a "
            "loaded server may have given up the set-up (its handshake_timeout)"
        ) from exc
    return channel


async def start_channel_server(
    client_connected_cb: Callable[[MessageChannel], Awaitable[object] | None],
    host: str | None = None,
    port: int = 0,
    *,
    accept: Accept | None = None,
    backlog: int = 128,
    device: Device | None = None,
    options: QueuePairOptions | None = None,
    prepare: Prepare | None = None,
    auth: PresharedKey | bytes | None = None,
    shared_receive: SharedReceiveQueue | None = None,
    handshake_timeout: float | None = DEFAULT_HANDSHAKE_TIMEOUT,
    **channel_options: Unpack[ChannelKeywords],
) -> Server:
    """Like :func:`aiordma.start_server`, handing each client's
    :class:`MessageChannel` to ``client_connected_cb``.

    ``channel_options`` are :class:`MessageChannel`'s keyword arguments.
    ``prepare``, if given, runs after the channel is set up (its result is
    discarded; ``conn.prepared`` stays the channel). ``auth`` serves only
    clients holding the same key, as for :func:`aiordma.start_server`.

    With ``shared_receive`` (a :class:`~aiordma.SharedReceiveQueue`) every
    client's channel draws its receive buffers from that one pool instead
    of posting its own: memory grows with the traffic, not with the number
    of clients (see the flow-control guide). ``handshake_timeout`` is
    :func:`aiordma.start_server`'s.

    ``client_connected_cb`` must be an async function (the channel is
    closed when it returns): anything else raises ``TypeError`` here.
    """
    if not is_async_callable(client_connected_cb):
        raise TypeError(
            "client_connected_cb must be an async function taking the channel "
            f"(async def handler(channel): ...), not {client_connected_cb!r}: the "
            "channel is closed when it returns"
        )
    check_options(channel_options, options, shared_receive)
    prepare_both = channel_factory(prepare, **channel_options)

    def handle(conn: Connection) -> Awaitable[object] | None:
        return client_connected_cb(conn.prepared)

    return await start_rdma_server(
        handle,
        host,
        port,
        accept=accept,
        backlog=backlog,
        device=device,
        options=options,
        prepare=prepare_both,
        auth=auth,
        shared_receive=shared_receive,
        handshake_timeout=handshake_timeout,
    )


def channel_of(link: MessageChannel | Connection) -> MessageChannel:
    """``link`` if it is a channel, else the channel a connection was prepared
    with (TypeError, saying how to make one, if it has none)."""
    if isinstance(link, MessageChannel):
        return link
    prepared = getattr(link, "prepared", None)
    if not isinstance(prepared, MessageChannel):
        raise TypeError(
            "this needs a MessageChannel: give one, or a connection made with "
            "prepare=aiordma.prepare_channel"
        )
    return prepared
