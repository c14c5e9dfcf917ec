"""Payload codecs (no device)."""

from __future__ import annotations

import pytest

from aiordma.rpc import JsonCodec, RawCodec


def test_raw_codec_passes_bytes_like_objects_through_untouched() -> None:
    codec = RawCodec()
    data = bytearray(b"abc")
    assert codec.encode(data) is data
    assert codec.encode(None) == b""
    assert codec.decode(data) is data
    with pytest.raises(TypeError, match="not str"):
        codec.encode("text")


def test_json_codec_round_trips() -> None:
    codec = JsonCodec()
    value = {"key": "k", "sizes": [1, 2.5, None]}
    encoded = codec.encode(value)
    assert isinstance(encoded, bytes)
    assert codec.decode(bytearray(encoded)) == value
