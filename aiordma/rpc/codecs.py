"""Payload codecs: how RPC arguments and results become message bodies."""

from __future__ import annotations

import json
from typing import Any, Protocol

from aiordma.channel import MemoryRegion, Segment
from aiordma.channel.buffers import Body


class Codec(Protocol):
    """Turns call arguments and results into message bodies and back."""

    def encode(self, obj: Any) -> Body:
        """The body to send for ``obj`` (a registered region is sent without copies)."""
        ...

    def decode(self, data: bytes | bytearray) -> Any:
        """The object a received body stands for."""
        ...


class RawCodec:
    """Bytes-like payloads as they are: the default, and the zero-copy one.

    Results of large calls decode to the ``bytearray`` the RDMA read landed in.
    """

    def encode(self, obj: Any) -> Body:
        """``obj`` itself: bytes-like objects and registered memory pass through untouched."""
        if obj is None:
            return b""
        if isinstance(obj, bytes | bytearray | memoryview | MemoryRegion | Segment):
            return obj
        raise TypeError(
            f"RawCodec sends bytes-like objects or registered memory, not {type(obj).__name__}"
        )

    def decode(self, data: bytes | bytearray) -> Any:
        """``data`` as it arrived: ``bytes``, or the ``bytearray`` a large message landed in."""
        return data


class JsonCodec:
    """JSON-serialisable objects, UTF-8 encoded."""

    def encode(self, obj: Any) -> Body:
        """``obj`` as compact UTF-8 JSON."""
        return json.dumps(obj, separators=(",", ":")).encode()

    def decode(self, data: bytes | bytearray) -> Any:
        """The JSON value in ``data``."""
        return json.loads(data)
