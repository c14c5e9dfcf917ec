"""What describes an array on the wire, and where arrays land: pure logic, host-tested.

An object Ray moves is a list of numpy arrays. The producer sends, for each,
its shape and dtype (:class:`ArraySpec`); the consumer lays all of them out
in one landing buffer (:func:`layout`), so one registration and one READ of
a descriptor list carry the whole object.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy

NAME = "AIORDMA"
"""The transport's default name (``@ray.method(tensor_transport="AIORDMA")``)."""

ALIGN = 64
"""Where each array starts in a landing buffer: a cache line, which is also
every numpy dtype's alignment."""


@dataclass(frozen=True)
class ArraySpec:
    """One array's shape and dtype (``numpy.dtype.str``, e.g. ``'<f8'``)."""

    shape: tuple[int, ...]
    dtype: str

    def __post_init__(self) -> None:
        if not isinstance(self.shape, tuple) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in self.shape
        ):
            raise ValueError(f"an array's shape is a tuple of sizes 0 or more, not {self.shape!r}")
        kind = numpy.dtype(self.dtype)  # TypeError names an unknown one
        if kind.hasobject:
            raise TypeError(f"dtype {kind} holds Python objects: their pointers cannot be moved")

    @property
    def nbytes(self) -> int:
        """The array's size in bytes."""
        count = 1
        for n in self.shape:
            count *= n
        return count * numpy.dtype(self.dtype).itemsize

    def as_ray(self) -> tuple[tuple[int, ...], numpy.dtype[Any]]:
        """The ``(shape, dtype)`` pair Ray's ``TensorTransportMetadata.tensor_meta`` holds."""
        return self.shape, numpy.dtype(self.dtype)

    @classmethod
    def from_ray(cls, pair: Sequence[Any]) -> ArraySpec:
        """The spec of a ``(shape, dtype)`` pair of ``tensor_meta``."""
        shape, dtype = pair
        return cls(tuple(int(n) for n in shape), numpy.dtype(dtype).str)


def exportable(value: object) -> numpy.ndarray[Any, Any]:
    """``value`` as an array whose memory can be registered as it is.

    A C-contiguous array is returned as is (no copy); any other layout is
    copied into a C-contiguous one (documented: the transport then holds the
    copy until the object is freed). Raises TypeError for what is not a
    numpy array or holds Python objects.
    """
    if not isinstance(value, numpy.ndarray):
        raise TypeError(f"the aiordma transport moves numpy arrays, not {type(value).__name__}")
    if value.dtype.hasobject:
        raise TypeError(
            f"an array of dtype {value.dtype} holds Python objects: their pointers cannot be moved"
        )
    if not value.flags.c_contiguous:
        value = numpy.ascontiguousarray(value)
    return value


def spec_of(array: numpy.ndarray[Any, Any]) -> ArraySpec:
    """The spec of an array."""
    return ArraySpec(tuple(int(n) for n in array.shape), array.dtype.str)


def layout(specs: Iterable[ArraySpec], align: int = ALIGN) -> tuple[list[int], int]:
    """Each array's offset in one landing buffer, and the buffer's size:
    arrays back to back, each starting on an ``align``-byte boundary."""
    offsets = []
    end = 0
    for spec in specs:
        start = -(-end // align) * align
        offsets.append(start)
        end = start + spec.nbytes
    return offsets, end


def views(
    buffer: numpy.ndarray[Any, Any], specs: Sequence[ArraySpec], offsets: Sequence[int]
) -> list[numpy.ndarray[Any, Any]]:
    """The arrays laid out in ``buffer`` (a flat ``uint8`` array), as views."""
    out = []
    for spec, offset in zip(specs, offsets, strict=True):
        part = buffer[offset : offset + spec.nbytes]
        out.append(part.view(numpy.dtype(spec.dtype)).reshape(spec.shape))
    return out


def check_target(target: object, spec: ArraySpec, index: int) -> numpy.ndarray[Any, Any]:
    """``target`` if an array can land in it as it is; ValueError or
    TypeError naming what does not match."""
    if not isinstance(target, numpy.ndarray):
        raise TypeError(f"target buffer {index} must be a numpy array, not {type(target).__name__}")
    if target.shape != spec.shape or target.dtype.str != spec.dtype:
        raise ValueError(
            f"target buffer {index} is {target.shape} {target.dtype.str}, the array "
            f"is {spec.shape} {spec.dtype}"
        )
    if not target.flags.c_contiguous or not target.flags.writeable:
        raise ValueError(f"target buffer {index} must be C-contiguous and writable")
    return target
