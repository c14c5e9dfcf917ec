"""Payload codecs (no device)."""

from __future__ import annotations

from array import array
from typing import cast

import numpy
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


def test_raw_codec_sends_any_contiguous_buffer_and_refuses_strided_ones() -> None:
    codec = RawCodec()
    values = numpy.arange(1000, dtype=numpy.float64)
    encoded: object = codec.encode(values)
    assert encoded is values  # an ndarray is bytes-like: no copy
    words = array("I", range(10))
    assert codec.encode(words) is cast(object, words)
    with pytest.raises(TypeError, match=r"C-contiguous.*numpy\.ascontiguousarray"):
        codec.encode(values[::2])
    with pytest.raises(TypeError, match="not dict"):
        codec.encode({"a": 1})


def test_json_codec_round_trips() -> None:
    codec = JsonCodec()
    value = {"key": "k", "sizes": [1, 2.5, None]}
    encoded = codec.encode(value)
    assert isinstance(encoded, bytes)
    assert codec.decode(bytearray(encoded)) == value
