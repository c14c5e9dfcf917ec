"""Layer 3: message channels with credit flow control and rendezvous.

A :class:`~aiordma.channel.channel.MessageChannel` runs on any
:class:`~aiordma.channel.link.Link` (a connection), using public names of
:mod:`aiordma.cm` and :mod:`aiordma.verbs` only. ``wire``, ``credits``,
``state`` and ``ledger`` are pure protocol logic with host tests.

This package is the channel layer's public face for the layers above it
(``aiordma.rpc``, ``aiordma.dask``, ``aiordma.streams``,
``aiordma.transfer``): its own names, the settings values and the
connections and memory a channel runs on, which those layers take from
here rather than from ``cm`` or ``verbs`` (an import contract in
``pyproject.toml`` holds them to it), and the doors they need below a
channel: its device, loop and path (``MessageChannel.device``, ``loop``,
``loopback``) and one-sided bulk work (``start_bulk``, ``post_block``).
``tests/test_doors.py`` refuses any other way down, such as
``channel.conn.qp``.
"""

from aiordma.channel.buffers import (
    GIVE_BACK_AFTER,
    Body,
    Into,
    body_length,
    buffer_length,
    buffer_view,
    check_into,
    give_back_memory,
)
from aiordma.channel.bulk import BulkDone, RunningBulk, post_block, start_bulk
from aiordma.channel.channel import MessageChannel
from aiordma.channel.open import (
    OpenKeywords,
    OpenTuningKeywords,
    ServeChannelKeywords,
    ServeTuningKeywords,
    channel_factory,
    channel_factory_with,
    channel_of,
    open_channel,
    open_channel_with,
    prepare_channel,
    split_keywords,
    start_channel_server,
    start_channel_server_with,
)
from aiordma.channel.options import DEFAULT_MAX_MESSAGE, ChannelKeywords, ChannelOptions
from aiordma.channel.shared_receive import SharedReceiveQueue
from aiordma.channel.sizing import read_piece_for
from aiordma.cm.accept import RejectConnection
from aiordma.cm.auth import PresharedKey
from aiordma.cm.connection import Connection, Prepare
from aiordma.cm.options import (
    Accept,
    ConnectionRequest,
    ConnectKeywords,
    ConnectOptions,
    ServeKeywords,
    ServeOptions,
)
from aiordma.cm.server import Server
from aiordma.verbs.device import Device
from aiordma.verbs.discovery import find_roce_endpoint
from aiordma.verbs.memory import Access, MemoryRegion, Segment
from aiordma.verbs.options import QueuePairOptions

__all__ = [
    "DEFAULT_MAX_MESSAGE",
    "GIVE_BACK_AFTER",
    "Accept",
    "Access",
    "Body",
    "BulkDone",
    "ChannelKeywords",
    "ChannelOptions",
    "ConnectKeywords",
    "ConnectOptions",
    "Connection",
    "ConnectionRequest",
    "Device",
    "Into",
    "MemoryRegion",
    "MessageChannel",
    "OpenKeywords",
    "OpenTuningKeywords",
    "Prepare",
    "PresharedKey",
    "QueuePairOptions",
    "RejectConnection",
    "RunningBulk",
    "Segment",
    "ServeChannelKeywords",
    "ServeKeywords",
    "ServeOptions",
    "ServeTuningKeywords",
    "Server",
    "SharedReceiveQueue",
    "body_length",
    "buffer_length",
    "buffer_view",
    "channel_factory",
    "channel_factory_with",
    "channel_of",
    "check_into",
    "find_roce_endpoint",
    "give_back_memory",
    "open_channel",
    "open_channel_with",
    "post_block",
    "prepare_channel",
    "read_piece_for",
    "split_keywords",
    "start_bulk",
    "start_channel_server",
    "start_channel_server_with",
]

_RENAMED = {
    "serve_channels_with": "start_channel_server_with",
    "factory_with": "channel_factory_with",
}
"""Names before 0.1 (one rule now: ``X`` and ``X_with``), kept for one release."""


def __getattr__(name: str) -> object:
    if name in _RENAMED:
        import warnings

        new = _RENAMED[name]
        warnings.warn(f"aiordma.channel.{name} is now {new}", DeprecationWarning, stacklevel=2)
        return globals()[new]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
