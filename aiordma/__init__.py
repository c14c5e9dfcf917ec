"""aiordma: asyncio-native RDMA on pyverbs.

Work requests are coroutines resolved by completions that the event loop
delivers; see :class:`Device`, :class:`MemoryRegion` and :class:`QueuePair`.
"""

from __future__ import annotations

# _compiled first: it decides which per-message modules run compiled, before
# any is imported; _pyverbs fails early, with install instructions.
from aiordma import _compiled, _pyverbs  # noqa: F401
from aiordma.channel.channel import MessageChannel
from aiordma.channel.open import (
    channel_factory,
    open_channel,
    prepare_channel,
    start_channel_server,
)
from aiordma.channel.options import ChannelOptions
from aiordma.channel.shared_receive import SharedReceiveQueue
from aiordma.cm.accept import RejectConnection
from aiordma.cm.auth import PresharedKey
from aiordma.cm.connect import connect
from aiordma.cm.connection import Connection
from aiordma.cm.options import ConnectionRequest, ConnectOptions, ServeOptions
from aiordma.cm.server import Server, start_server
from aiordma.exceptions import (
    AuthenticationError,
    BufferTooSmallError,
    CompletionError,
    ConnectionLostError,
    ConnectionRejectedError,
    DeviceError,
    ExposureTimeoutError,
    MemoryLimitError,
    MessageRevokedError,
    MessageTooLargeError,
    NoListenerError,
    NotPreparedError,
    ProtocolError,
    ProtocolMismatchError,
    QueuePairError,
    RdmaError,
    RemoteAccessError,
    ResourceBusyError,
    ResourceClosedError,
    TransferError,
    WrongLoopError,
)
from aiordma.streams import open_connection, start_stream_server
from aiordma.verbs.attributes import DeviceAttributes
from aiordma.verbs.completion import CompletionQueue, Opcode, WorkCompletion
from aiordma.verbs.device import Device, connect_loopback_pair
from aiordma.verbs.endpoint import Endpoint
from aiordma.verbs.memory import Access, Local, MemoryRegion, RemoteBuffer, Segment
from aiordma.verbs.options import QueuePairOptions, Read, Send, Write
from aiordma.verbs.queue_pair import QueuePair
from aiordma.verbs.window import MemoryWindow

__all__ = [
    "Access",
    "AuthenticationError",
    "BufferTooSmallError",
    "ChannelOptions",
    "CompletionError",
    "CompletionQueue",
    "ConnectOptions",
    "Connection",
    "ConnectionLostError",
    "ConnectionRejectedError",
    "ConnectionRequest",
    "Device",
    "DeviceAttributes",
    "DeviceError",
    "Endpoint",
    "ExposureTimeoutError",
    "Local",
    "MemoryLimitError",
    "MemoryRegion",
    "MemoryWindow",
    "MessageChannel",
    "MessageRevokedError",
    "MessageTooLargeError",
    "NoListenerError",
    "NotPreparedError",
    "Opcode",
    "PresharedKey",
    "ProtocolError",
    "ProtocolMismatchError",
    "QueuePair",
    "QueuePairError",
    "QueuePairOptions",
    "RdmaError",
    "Read",
    "RejectConnection",
    "RemoteAccessError",
    "RemoteBuffer",
    "ResourceBusyError",
    "ResourceClosedError",
    "Segment",
    "Send",
    "ServeOptions",
    "Server",
    "SharedReceiveQueue",
    "TransferError",
    "WorkCompletion",
    "Write",
    "WrongLoopError",
    "channel_factory",
    "connect",
    "connect_loopback_pair",
    "info",
    "open_channel",
    "open_connection",
    "prepare_channel",
    "start_channel_server",
    "start_server",
    "start_stream_server",
]
__version__ = "0.1.0.dev0"


def info() -> dict[str, str]:
    """What this installation runs on: versions, and which per-message path
    is in use (the compiled core, or pure Python and why)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    from aiordma.verbs import per_message_path

    try:
        pyverbs = version("pyverbs")
    except PackageNotFoundError:  # the distribution's python3-pyverbs has no pip metadata
        pyverbs = "installed (version unknown to pip)"
    return {
        "aiordma": __version__,
        "python": platform.python_version(),
        "pyverbs": pyverbs,
        "per-message path": per_message_path(),
    }
