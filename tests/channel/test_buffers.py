"""What a message body may be, checked before anything is sent (host only)."""

from __future__ import annotations

import numpy as np
import pytest

from aiordma.channel.buffers import body_length, check_into
from aiordma.verbs._buffer import BufferExport


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


OBJECTS = [
    np.array([1, "a"], dtype=object),
    np.array([object(), "secret"], dtype=object),
    np.zeros(2, dtype=[("Oa", "i4"), ("b", "O")]),  # an object field in a record
]


@pytest.mark.parametrize("body", OBJECTS, ids=["object array", "objects", "record"])
def test_buffers_of_python_objects_are_refused(body: object) -> None:
    """Issue 62: their bytes, this process's object addresses, were sent."""
    with pytest.raises(TypeError, match="holds Python objects"):
        body_length(body)
    with pytest.raises(TypeError, match="holds Python objects"):
        check_into(body)
    with pytest.raises(TypeError, match="holds Python objects"):
        BufferExport(body)  # what every registration takes


def test_a_record_whose_field_name_holds_an_o_is_plain_data() -> None:
    assert body_length(np.zeros(2, dtype=[("Oa", "i4"), ("b", "f8")])) == 24


@pytest.mark.parametrize(
    "into",
    [bytearray(8), memoryview(bytearray(8)), np.zeros(2, dtype=np.float32),
     memoryview(np.zeros((2, 2), dtype=np.uint16))],  # type: ignore[arg-type]
    ids=["bytearray", "memoryview", "array", "view of a 2-d array"],
)  # fmt: skip
def test_any_writable_contiguous_buffer_can_be_received_into(into: object) -> None:
    """Issue 62: a numpy array was refused, though ``memoryview(array)`` was taken."""
    assert check_into(into) is into


@pytest.mark.parametrize(
    ("into", "error", "says"),
    [
        (b"abc", TypeError, "read-only bytes"),
        (np.zeros(4)[::2], ValueError, "non-contiguous ndarray"),
        ("text", TypeError, "cannot receive into str"),
        (None, TypeError, "cannot receive into NoneType"),
    ],
)
def test_what_nothing_can_land_in_is_refused(into: object, error: type, says: str) -> None:
    readonly = np.zeros(4)
    readonly.flags.writeable = False
    with pytest.raises(TypeError, match="read-only ndarray"):
        check_into(readonly)
    with pytest.raises(error, match=says):
        check_into(into)
