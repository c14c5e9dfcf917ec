"""Connections that come with a message channel: the ``prepare`` hook that
makes one, :func:`~aiordma.open_channel` (the client) and :func:`~aiordma.start_channel_server`.

The hook sets the channel up before the peer can send (its receives are
posted when it returns), on both sides; ``open_channel`` then waits for the
server's HELLO, so a connection it returns is one the server holds too.

Settings travel as two values made once at the public edge: the
connection's (:class:`~aiordma.ConnectOptions` or
:class:`~aiordma.ServeOptions`) and the channel's
(:class:`~aiordma.ChannelOptions`). The ``*_with`` functions take them
made; the layers above (RPC, streams, Dask, transfer agents) call those.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, overload

from aiordma._checks import check_type
from aiordma.channel.channel import MessageChannel
from aiordma.channel.link import Link
from aiordma.channel.options import ChannelKeywords, ChannelOptions, TuningKeywords
from aiordma.channel.shared_receive import SharedReceiveQueue
from aiordma.cm.connect import connect_with
from aiordma.cm.connection import Connection, Prepare
from aiordma.cm.options import (
    ConnectKeywords,
    ConnectOptions,
    EndpointOptions,
    ServeKeywords,
    ServeOptions,
    unexpected_keywords,
)
from aiordma.cm.server import Server, start_server_with
from aiordma.exceptions import ConnectionLostError, ProtocolMismatchError
from aiordma.lifecycle import is_async_callable
from aiordma.verbs.options import QueuePairOptions

if TYPE_CHECKING:
    from typing_extensions import Unpack


class OpenKeywords(ConnectKeywords, ChannelKeywords, total=False):
    """:func:`~aiordma.open_channel`'s keywords: the connection's settings and the
    channel's options (for typing ``**``)."""


class ServeChannelKeywords(ServeKeywords, ChannelKeywords, total=False):
    """:func:`~aiordma.start_channel_server`'s keywords: the server's settings and the
    channel's options."""


class OpenTuningKeywords(ConnectKeywords, TuningKeywords, total=False):
    """What a layer that sets the channel's protocol itself (RPC, streams)
    lets its callers pass when connecting."""


class ServeTuningKeywords(ServeKeywords, TuningKeywords, total=False):
    """What a layer that sets the channel's protocol itself lets its callers
    pass when serving."""


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
    """A ``prepare`` hook giving each connection a :class:`MessageChannel`
    with ``options`` (its keyword arguments) in ``conn.prepared``, then runs
    ``then(conn)`` if given (its result is discarded).

    The options are checked now, once, not per connection (those that
    depend on the queue pair's sizes only when a connection has one).
    """
    return channel_factory_with(ChannelOptions.of(options), then)


def channel_factory_with(
    options: ChannelOptions, then: Prepare | None = None
) -> Callable[[Connection], Awaitable[MessageChannel]]:
    """:func:`~aiordma.channel_factory` with the options made already."""
    check_type("options", options, ChannelOptions, "an aiordma.ChannelOptions")

    async def prepare(conn: Connection) -> MessageChannel:
        channel = MessageChannel(conn, options)
        await channel._start()
        if then is not None:
            conn.prepared = channel
            result = then(conn)
            if inspect.isawaitable(result):
                await result
        return channel

    return prepare


def check_options(options: ChannelOptions, settings: EndpointOptions) -> None:
    """Refuse channel options that cannot work with the connection's settings
    before anything connects (TypeError or ValueError naming the option):
    the sizes against the queue pair's (the defaults if none) and the
    shared receive queue's. Both must be of their kind (TypeError)."""
    check_type("options", options, ChannelOptions, "an aiordma.ChannelOptions")
    qp_options = settings.options or QueuePairOptions()
    shared = settings.shared_receive
    if shared is not None and not isinstance(shared, SharedReceiveQueue):
        raise TypeError(f"shared_receive must be an aiordma.SharedReceiveQueue, not {shared!r}")
    options.layout(
        qp_options.recv_depth,
        qp_options.send_depth,
        None if shared is None else shared.buffer_size,
    )


@overload
def split_keywords(
    kind: type[ConnectOptions], keywords: Mapping[str, Any], *, caller: str,
    protocol: str | None = None, elsewhere: Mapping[str, str] | None = None,
) -> tuple[ConnectOptions, ChannelOptions]: ...  # fmt: skip


@overload
def split_keywords(
    kind: type[ServeOptions], keywords: Mapping[str, Any], *, caller: str,
    protocol: str | None = None, elsewhere: Mapping[str, str] | None = None,
) -> tuple[ServeOptions, ChannelOptions]: ...  # fmt: skip


def split_keywords(
    kind: type[ConnectOptions] | type[ServeOptions], keywords: Mapping[str, Any], *,
    caller: str, protocol: str | None = None, elsewhere: Mapping[str, str] | None = None,
) -> tuple[ConnectOptions | ServeOptions, ChannelOptions]:  # fmt: skip
    """A public function's keywords as the connection's settings (a ``kind``,
    checked) and the channel's options, with ``protocol`` set by the layer
    that calls. Any other name is refused with a TypeError naming ``caller``
    and where the name belongs (``elsewhere``: what the calling layer says
    of names of its own, such as RPC's ``Service`` arguments); the sizes
    are checked against the settings by the ``*_with`` function they go to."""
    settings, rest = kind.take(keywords)
    unknown = sorted(set(rest) - _CHANNEL_FIELDS)
    if unknown:
        raise unexpected_keywords(
            kind, unknown, caller, also=_CHANNEL_FIELDS - {"protocol"}, elsewhere=elsewhere
        )
    if protocol is not None:
        rest["protocol"] = protocol
    return settings, ChannelOptions.of(rest)


_CHANNEL_FIELDS: Final = frozenset(field.name for field in dataclasses.fields(ChannelOptions))


async def open_channel(
    host: str, port: int, *, prepare: Prepare | None = None, **keywords: Unpack[OpenKeywords]
) -> MessageChannel:
    """Connect and return the connection's :class:`MessageChannel`, like
    :func:`asyncio.open_connection` returns a stream.

    ``keywords`` are :func:`aiordma.connect`'s settings
    (:class:`~aiordma.ConnectOptions`: ``auth``, ``timeout``, ``device``...)
    and :class:`MessageChannel`'s options (:class:`~aiordma.ChannelOptions`),
    checked before anything connects. The peer must serve channels too
    (:func:`~aiordma.start_channel_server`, or ``prepare=prepare_channel``). The
    connection is ``channel.conn``, and closing the channel closes it.
    ``prepare``, if given, runs after the channel is set up (its result is
    discarded). With ``shared_receive`` the channel draws its receive
    buffers from that :class:`~aiordma.SharedReceiveQueue` (for clients of
    many servers).

    It returns once the server's channel has said HELLO, so the server
    holds the connection too: a server that dropped it during set-up (its
    ``handshake_timeout`` expired under load, say) raises
    :class:`ConnectionLostError` here, a peer speaking another protocol
    :class:`ProtocolMismatchError` (a plain channel's peer is a plain
    channel server: an RPC or stream server is refused), and no HELLO
    within ``timeout`` ``TimeoutError``; the connection is closed in each case.
    """
    settings, options = split_keywords(ConnectOptions, keywords, caller="aiordma.open_channel")
    return await open_channel_with(host, port, settings, options, prepare)


async def open_channel_with(
    host: str, port: int, settings: ConnectOptions, options: ChannelOptions,
    prepare: Prepare | None = None,
) -> MessageChannel:  # fmt: skip
    """:func:`~aiordma.open_channel` with its settings and options made
    already; the options' sizes are checked against the settings first."""
    check_type("settings", settings, ConnectOptions, "an aiordma.ConnectOptions")
    check_options(options, settings)
    timeout = settings.timeout
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    conn = await connect_with(host, port, settings, channel_factory_with(options, prepare))
    channel = channel_of(conn)
    try:
        async with asyncio.timeout_at(deadline):
            await channel._peer_limit()
        theirs = channel.peer_protocol
        if not options.protocol and theirs:
            # A plain server takes any peer (its handler decides, as
            # rpc.Service.serve does); a plain client speaks plain messages,
            # so a server that names a protocol is not its peer.
            raise ProtocolMismatchError("", theirs, "{}:{}".format(*conn.peer_address))
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
    host: str | None = None, port: int = 0, *, prepare: Prepare | None = None,
    **keywords: Unpack[ServeChannelKeywords],
) -> Server:  # fmt: skip
    """Like :func:`aiordma.start_server`, handing each client's
    :class:`MessageChannel` to ``client_connected_cb``.

    ``keywords`` are :func:`aiordma.start_server`'s settings
    (:class:`~aiordma.ServeOptions`: ``accept``, ``auth``,
    ``handshake_timeout``...) and :class:`MessageChannel`'s options
    (:class:`~aiordma.ChannelOptions`), checked before anything listens.
    ``prepare``, if given, runs after the channel is set up (its result is
    discarded; ``conn.prepared`` stays the channel). ``auth`` serves only
    clients holding the same key, as for :func:`aiordma.start_server`.

    With ``shared_receive`` (a :class:`~aiordma.SharedReceiveQueue`) every
    client's channel draws its receive buffers from that one pool instead
    of posting its own: memory grows with the traffic, not with the number
    of clients (see the flow-control guide).

    ``client_connected_cb`` must be an async function (the channel is
    closed when it returns): anything else raises ``TypeError`` here.
    """
    settings, options = split_keywords(
        ServeOptions, keywords, caller="aiordma.start_channel_server"
    )
    return await start_channel_server_with(
        client_connected_cb, host, port, settings, options, prepare
    )


async def start_channel_server_with(
    client_connected_cb: Callable[[MessageChannel], Awaitable[object] | None],
    host: str | None, port: int, settings: ServeOptions, options: ChannelOptions,
    prepare: Prepare | None = None,
) -> Server:  # fmt: skip
    """:func:`~aiordma.start_channel_server` with its settings and options
    made already; the options' sizes are checked against the settings first."""
    _check_handler(client_connected_cb)
    check_type("settings", settings, ServeOptions, "an aiordma.ServeOptions")
    check_options(options, settings)

    def handle(conn: Connection) -> Awaitable[object] | None:
        return client_connected_cb(channel_of(conn))

    return await start_server_with(
        handle, host, port, settings, channel_factory_with(options, prepare)
    )


def _check_handler(client_connected_cb: object) -> None:
    if not is_async_callable(client_connected_cb):
        raise TypeError(
            "client_connected_cb must be an async function taking the channel "
            f"(async def handler(channel): ...), not {client_connected_cb!r}: the "
            "channel is closed when it returns"
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
