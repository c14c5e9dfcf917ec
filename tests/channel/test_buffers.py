"""What a message body may be, checked before anything is sent (host only)."""

from __future__ import annotations

import numpy as np
import pytest

from aiordma.channel.buffers import body_length


@pytest.mark.parametrize(
    "body",
    [b"abcd", bytearray(4), memoryview(b"abcdef")[1:5], np.zeros(1, dtype=np.float32)],
    ids=["bytes", "bytearray", "slice", "array"],
)
def test_contiguous_buffers_are_bodies_of_their_byte_length(body: object) -> None:
    assert body_length(body) == 4


@pytest.mark.parametrize(
    "body",
    [memoryview(bytearray(100))[::2], np.arange(100)[::2], np.zeros((4, 3), order="F")],
    ids=["strided view", "strided array", "fortran order"],
)
def test_strided_buffers_are_refused_naming_the_fix(body: object) -> None:
    with pytest.raises(TypeError, match=r"C-contiguous.*contiguous copy"):
        body_length(body)


@pytest.mark.parametrize("body", ["text", 42, None], ids=["str", "int", "none"])
def test_what_is_no_buffer_is_refused_naming_its_type(body: object) -> None:
    with pytest.raises(TypeError, match=f"not {type(body).__name__}"):
        body_length(body)
