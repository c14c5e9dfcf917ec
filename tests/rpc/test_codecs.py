"""Payload codecs (no device)."""

from __future__ import annotations

import asyncio
from array import array
from typing import cast

import numpy
import pytest

from aiordma.rpc import JsonCodec, RawCodec, Service, connect


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


def test_raw_codec_refuses_python_objects() -> None:
    """Issue 62: an object array's call returned this process's addresses."""
    with pytest.raises(TypeError, match="holds Python objects"):
        RawCodec().encode(numpy.array([1, "a"], dtype=object))


def test_what_is_no_codec_is_refused_at_once_naming_codec() -> None:
    """Issue 62: ``codec="json"`` was taken, and every call then failed."""
    with pytest.raises(TypeError, match=r"codec must be .* not str: for JSON give "
                       r"codec=aiordma.rpc.JsonCodec\(\)"):  # fmt: skip
        Service(codec="json")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"not the class JsonCodec: give JsonCodec\(\)"):
        Service(codec=JsonCodec)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="codec must be"):
        asyncio.run(connect("192.0.2.99", 9, codec="json"))  # type: ignore[arg-type]
    assert isinstance(Service().codec, RawCodec)


def test_the_services_limits_are_checked_naming_them() -> None:
    with pytest.raises(TypeError, match="max_concurrency must be an int, not str"):
        Service(max_concurrency="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_concurrency must be at least 1"):
        Service(max_concurrency=0)
    with pytest.raises(TypeError, match="max_held must be an int, not float"):
        Service(max_held=1.5)  # type: ignore[arg-type]
