"""Asyncio RPC over RDMA.

A :class:`Service` maps method names to async handlers and is served with
:func:`start_server`; :func:`connect` returns a :class:`Client` whose
:meth:`Client.call` awaits the result. Calls and replies are messages on a
:class:`~aiordma.channel.channel.MessageChannel`: small ones travel in a single
send, large ones are read by the receiver straight from the sender's memory.
"""

from __future__ import annotations

from aiordma.rpc.client import Client, connect
from aiordma.rpc.codecs import Codec, JsonCodec, RawCodec
from aiordma.rpc.errors import RemoteError, RpcError, UnknownMethodError
from aiordma.rpc.server import Handler, Service, current_connection, start_server

__all__ = [
    "Client",
    "Codec",
    "Handler",
    "JsonCodec",
    "RawCodec",
    "RemoteError",
    "RpcError",
    "Service",
    "UnknownMethodError",
    "connect",
    "current_connection",
    "start_server",
]
