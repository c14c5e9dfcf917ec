"""How one Dask message, a list of frames, travels as channel messages.

A Dask message becomes one *lead* channel message and then one channel
message per piece of each frame that is not inline:

- the lead's body is a header (the version, the frame count, each
  frame's size and whether it is inline) followed by the inline frames'
  bytes; small frames go inline while the lead stays one eager packet, so
  a small Dask message is one packet;
- every other frame follows in order, cut in pieces of at most ``piece``
  bytes (the channel's ``max_message``); each piece is read by the
  receiver straight into the frame's buffer, allocated once from the size
  the header announced.

This module is pure logic (no I/O), unit-tested on the host.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final

from aiordma.exceptions import ProtocolError

VERSION: Final = 1
_PREFIX: Final = struct.Struct("!BI")  # version, frame count
_FRAME: Final = struct.Struct("!QB")  # size, inline
MAX_FRAMES: Final = 1 << 20
"""More frames than this in one message is taken for a corrupt header."""


@dataclass(frozen=True, slots=True)
class Layout:
    """Each frame's size, and which ones travel inline in the lead message."""

    sizes: tuple[int, ...]
    inline: tuple[bool, ...]

    @property
    def header_size(self) -> int:
        return _PREFIX.size + _FRAME.size * len(self.sizes)

    @property
    def lead_size(self) -> int:
        """Bytes of the lead message: the header and the inline frames."""
        inline = sum(s for s, i in zip(self.sizes, self.inline, strict=True) if i)
        return self.header_size + inline


def plan(sizes: Sequence[int], eager_limit: int) -> Layout:
    """Put each frame inline, in order, if the lead message still fits
    ``eager_limit`` bytes with it; the others travel on their own."""
    total = _PREFIX.size + _FRAME.size * len(sizes)
    inline: list[bool] = []
    for size in sizes:
        fits = total + size <= eager_limit
        inline.append(fits)
        if fits:
            total += size
    return Layout(tuple(sizes), tuple(inline))


def pack_header(layout: Layout) -> bytes:
    """The lead message's header (the inline frames' bytes follow it)."""
    out = bytearray(_PREFIX.pack(VERSION, len(layout.sizes)))
    for size, inline in zip(layout.sizes, layout.inline, strict=True):
        out += _FRAME.pack(size, inline)
    return bytes(out)


def unpack_header(lead: bytes | bytearray | memoryview) -> Layout:
    """Read a lead message's header; raises :class:`ProtocolError` if it is
    not one, or if the inline frames it announces are not all there."""
    if len(lead) < _PREFIX.size:
        raise ProtocolError(
            f"a Dask message header is at least {_PREFIX.size} bytes, got {len(lead)}"
        )
    version, count = _PREFIX.unpack_from(lead)
    if version != VERSION:
        raise ProtocolError(
            f"unknown Dask message version {version} (this side speaks {VERSION}): "
            "is the peer an aiordma Dask comm of the same version?"
        )
    if count > MAX_FRAMES:
        raise ProtocolError(f"a Dask message of {count} frames (at most {MAX_FRAMES})")
    layout_end = _PREFIX.size + _FRAME.size * count
    if len(lead) < layout_end:
        raise ProtocolError(f"a Dask message header of {count} frames is cut short")
    sizes: list[int] = []
    inline: list[bool] = []
    for offset in range(_PREFIX.size, layout_end, _FRAME.size):
        size, flag = _FRAME.unpack_from(lead, offset)
        if flag > 1:
            raise ProtocolError(f"a Dask frame's inline flag is {flag}")
        sizes.append(size)
        inline.append(bool(flag))
    layout = Layout(tuple(sizes), tuple(inline))
    if len(lead) != layout.lead_size:
        raise ProtocolError(
            f"a Dask message's lead is {len(lead)} bytes, its header announces {layout.lead_size}"
        )
    return layout


def inline_frames(lead: memoryview, layout: Layout) -> Iterator[tuple[int, memoryview]]:
    """``(index, view)`` of each inline frame inside the lead message."""
    offset = layout.header_size
    for index, (size, inline) in enumerate(zip(layout.sizes, layout.inline, strict=True)):
        if inline:
            yield index, lead[offset : offset + size]
            offset += size


def pieces(size: int, piece: int) -> range:
    """Start offsets of the pieces a frame of ``size`` bytes is sent in (none if empty)."""
    if piece <= 0:
        raise ValueError("piece must be positive")
    return range(0, size, piece)
