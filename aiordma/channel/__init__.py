"""Layer 3: message channels with credit flow control and rendezvous.

A :class:`~aiordma.channel.channel.MessageChannel` runs on any
:class:`~aiordma.channel.link.Link` (a connection), using public names of
:mod:`aiordma.cm` and :mod:`aiordma.verbs` only. ``wire``, ``credits``,
``state`` and ``ledger`` are pure protocol logic with host tests.

This package is the channel layer's public face for the layers above it
(``aiordma.rpc``, ``aiordma.dask``, ``aiordma.streams``): its own names,
and those of the connections and memory a channel runs on, which those
layers take from here rather than from ``cm`` or ``verbs`` (an import
contract in ``pyproject.toml`` holds them to it).
"""

from aiordma.channel.channel import MessageChannel
from aiordma.channel.open import (
    OpenKeywords,
    channel_factory,
    channel_of,
    open_channel,
    prepare_channel,
    start_channel_server,
)
from aiordma.channel.options import DEFAULT_MAX_MESSAGE, ChannelKeywords, ChannelOptions
from aiordma.channel.pool import SharedReceiveQueue
from aiordma.cm.auth import PresharedKey
from aiordma.cm.connection import Connection, Prepare
from aiordma.cm.server import Accept, ConnectionRequest, RejectConnection, Server
from aiordma.verbs.device import Device
from aiordma.verbs.discovery import find_roce_endpoint
from aiordma.verbs.memory import Access, MemoryRegion, Segment
from aiordma.verbs.queue_pair import QueuePairOptions

__all__ = [
    "DEFAULT_MAX_MESSAGE",
    "Accept",
    "Access",
    "ChannelKeywords",
    "ChannelOptions",
    "Connection",
    "ConnectionRequest",
    "Device",
    "MemoryRegion",
    "MessageChannel",
    "OpenKeywords",
    "Prepare",
    "PresharedKey",
    "QueuePairOptions",
    "RejectConnection",
    "Segment",
    "Server",
    "SharedReceiveQueue",
    "channel_factory",
    "channel_of",
    "find_roce_endpoint",
    "open_channel",
    "prepare_channel",
    "start_channel_server",
]
