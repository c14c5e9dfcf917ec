"""What transfer agents say to each other on their channel, and the metadata they export.

Each connection between two agents carries one message channel. Its
messages start with a kind byte:

* ``H`` HELLO, the first message each way: the sender's :class:`Identity`.
* ``N`` NOTE, a notification: the rest is the sender's bytes, delivered to
  the receiving agent's :meth:`~aiordma.transfer.Agent.notifications`.

An :class:`Identity` (agent id, and where it listens, if it does) is also
what :meth:`~aiordma.transfer.Agent.metadata` exports, so a peer can be
reached from its metadata alone. Pure logic: tested on the host.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from aiordma.exceptions import ProtocolError

HELLO: Final = b"H"
NOTE: Final = b"N"
MAGIC: Final = b"AXA1"
_IDENTITY: Final = struct.Struct("<4sQHH")
"""Magic, agent id, port, length of the host that follows (UTF-8)."""
MAX_HOST: Final = 255


@dataclass(frozen=True, slots=True)
class Identity:
    """An agent as its peers know it: its id, and its listening address if any."""

    agent: int
    host: str | None = None
    port: int = 0

    def to_bytes(self) -> bytes:
        host = (self.host or "").encode()
        if len(host) > MAX_HOST:
            raise ValueError(f"an agent's host is at most {MAX_HOST} bytes of UTF-8")
        return _IDENTITY.pack(MAGIC, self.agent, self.port, len(host)) + host

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> Identity:
        """Unpack; raises :class:`~aiordma.ProtocolError` naming what is wrong."""
        view = memoryview(data).cast("B")
        if len(view) < _IDENTITY.size:
            raise ProtocolError(f"an agent's metadata is at least {_IDENTITY.size} bytes, "
                                f"got {len(view)}")  # fmt: skip
        magic, agent, port, size = _IDENTITY.unpack_from(view)
        if magic != MAGIC:
            raise ProtocolError("not a transfer agent's metadata (wrong magic)")
        if len(view) != _IDENTITY.size + size:
            raise ProtocolError(f"an agent's metadata with a {size}-byte host is "
                                f"{_IDENTITY.size + size} bytes, got {len(view)}")  # fmt: skip
        try:
            host = bytes(view[_IDENTITY.size :]).decode()
        except UnicodeDecodeError:
            raise ProtocolError("an agent's host is not UTF-8") from None
        return cls(agent, host or None, port)


def hello(identity: Identity) -> bytes:
    """The HELLO message of ``identity``."""
    return HELLO + identity.to_bytes()


def note(data: bytes | bytearray | memoryview) -> bytes:
    """The NOTE message carrying ``data``."""
    return NOTE + bytes(data)


def parse(message: bytes | bytearray) -> Identity | bytes:
    """A received message: the peer's :class:`Identity` (HELLO) or a
    notification's bytes (NOTE); :class:`~aiordma.ProtocolError` otherwise."""
    kind = bytes(message[:1])
    if kind == HELLO:
        return Identity.from_bytes(memoryview(message)[1:])
    if kind == NOTE:
        return bytes(message[1:])
    raise ProtocolError(f"unknown transfer agent message kind {kind!r}")
