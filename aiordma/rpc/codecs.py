"""Payload codecs: how RPC arguments and results become message bodies."""

from __future__ import annotations

import json
from typing import Any, Protocol, cast

from aiordma.channel import Body, MemoryRegion, Segment, body_length


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

    Any C-contiguous buffer is sent as its bytes (``bytes``, ``bytearray``,
    ``memoryview``, ``array.array``, a numpy array...), as is registered
    memory. Results of large calls decode to the ``bytearray`` the RDMA read
    landed in.
    """

    def encode(self, obj: Any) -> Body:
        """``obj`` itself: bytes-like objects and registered memory pass through
        untouched; TypeError for anything else, or for a strided view."""
        if obj is None:
            return b""
        if isinstance(obj, bytes | bytearray | memoryview | MemoryRegion | Segment):
            return obj
        body_length(obj)  # TypeError naming it unless a contiguous buffer
        return cast(Body, obj)  # any buffer: the channel sends it as it lies in memory

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


def as_codec(codec: object) -> Codec:
    """``codec``, or :class:`RawCodec` for None; TypeError naming ``codec``
    for anything without ``encode`` and ``decode`` methods (a name such as
    ``"json"`` included: give the object, ``JsonCodec()``)."""
    if codec is None:
        return RawCodec()
    if isinstance(codec, type):
        raise TypeError(f"codec must be a codec object, not the class {codec.__name__}: "
                        f"give {codec.__name__}()")  # fmt: skip
    if not (callable(getattr(codec, "encode", None)) and callable(getattr(codec, "decode", None))):
        hint = ": for JSON give codec=aiordma.rpc.JsonCodec()" if isinstance(codec, str) else ""
        raise TypeError(
            "codec must be an object with encode() and decode() methods (an "
            f"aiordma.rpc.Codec), not {type(codec).__name__}{hint}"
        )
    return cast(Codec, codec)
