"""The Dask message layout (pure logic, on the host)."""

from __future__ import annotations

import pytest

from aiordma.dask import wire
from aiordma.exceptions import ProtocolError


def lead_of(frames: list[bytes], eager_limit: int) -> tuple[wire.Layout, bytes]:
    layout = wire.plan([len(f) for f in frames], eager_limit)
    inline = b"".join(f for f, i in zip(frames, layout.inline, strict=True) if i)
    return layout, wire.pack_header(layout) + inline


def test_small_frames_all_travel_in_the_lead() -> None:
    frames = [b"head", b"", b"x" * 100]
    layout, lead = lead_of(frames, 8000)
    assert layout.inline == (True, True, True)
    assert len(lead) == layout.lead_size <= 8000
    back = wire.unpack_header(lead)
    assert back == layout
    got = dict(wire.inline_frames(memoryview(lead), back))
    assert [bytes(got[i]) for i in range(3)] == frames


def test_a_frame_that_does_not_fit_travels_alone_and_later_small_ones_still_go_inline() -> None:
    frames = [b"a" * 10, b"b" * 5000, b"c" * 10]
    layout, lead = lead_of(frames, 1000)
    assert layout.inline == (True, False, True)
    assert len(lead) <= 1000
    got = dict(wire.inline_frames(memoryview(lead), wire.unpack_header(lead)))
    assert set(got) == {0, 2}
    assert bytes(got[2]) == b"c" * 10


def test_the_lead_never_exceeds_the_eager_limit_unless_the_header_alone_does() -> None:
    sizes = [7, 300, 0, 4096, 12, 1]
    for limit in (0, 10, 50, 400, 5000):
        layout = wire.plan(sizes, limit)
        assert layout.lead_size <= max(limit, layout.header_size)


def test_pieces_cover_a_frame_exactly() -> None:
    assert list(wire.pieces(0, 4)) == []
    assert list(wire.pieces(10, 4)) == [0, 4, 8]
    assert list(wire.pieces(8, 4)) == [0, 4]
    with pytest.raises(ValueError, match="positive"):
        wire.pieces(8, 0)


@pytest.mark.parametrize(
    ("lead", "says"),
    [
        (b"\x01\x00", "at least"),
        (b"\x07" + b"\x00\x00\x00\x00", "unknown Dask message version 7"),
        (b"\x01\x00\x00\x00\x02" + b"\x00" * 9, "cut short"),
        (b"\x01\x00\x00\x00\x01" + b"\x00" * 7 + b"\x05\x01", "announces 19"),
        (b"\x01\x00\x00\x00\x01" + b"\x00" * 8 + b"\x02", "inline flag is 2"),
        (b"\x01\xff\xff\xff\xff", r"frames \(at most"),
    ],
)
def test_a_malformed_header_is_a_protocol_error_saying_what_is_wrong(
    lead: bytes, says: str
) -> None:
    with pytest.raises(ProtocolError, match=says):
        wire.unpack_header(lead)
