"""RPC frames and error descriptions (no device)."""

from __future__ import annotations

import pytest

from aiordma.exceptions import ProtocolError
from aiordma.rpc.frames import Frame, FrameKind, error_body, parse_error_body


@pytest.mark.parametrize(
    "frame",
    [
        Frame(FrameKind.REQUEST, 1, "get"),
        Frame(FrameKind.REQUEST, 2**64 - 1, "ünïcode"),
        Frame(FrameKind.REPLY, 7),
        Frame(FrameKind.ERROR, 8),
        Frame(FrameKind.CANCEL, 9),
    ],
)
def test_frames_round_trip(frame: Frame) -> None:
    assert Frame.unpack(frame.pack()) == frame


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x01", "too short"),
        (bytes([9, 0, 0, 0]) + bytes(8), "unknown RPC frame kind 9"),
        (Frame(FrameKind.REQUEST, 1, "get").pack()[:-1], "does not match"),
        (Frame(FrameKind.REPLY, 1).pack()[:2] + b"\x01\x00" + bytes(8) + b"x", "REPLY frame with"),
        (bytes([1, 0, 0, 0]) + bytes(8), "REQUEST frame without"),
        (bytes([1, 0, 1, 0]) + bytes(8) + b"\xff", "not UTF-8"),
    ],
)
def test_malformed_frames_raise_protocol_error(data: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        Frame.unpack(data)


def test_method_names_are_bounded() -> None:
    with pytest.raises(ValueError, match="at most 255"):
        Frame(FrameKind.REQUEST, 1, "x" * 256).pack()


def test_error_descriptions_round_trip_and_reject_garbage() -> None:
    assert parse_error_body(error_body("KeyError", "'k'")) == ("KeyError", "'k'")
    with pytest.raises(ProtocolError, match="malformed"):
        parse_error_body(b"{not json")
