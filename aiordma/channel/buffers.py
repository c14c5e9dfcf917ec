"""Message bodies and receive buffers: what they may be, their lengths and views (no I/O)."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from aiordma.verbs.memory import Access, MemoryRegion, Segment, refuse_objects

Body = bytes | bytearray | memoryview | MemoryRegion | Segment
"""What can be sent: any contiguous bytes-like object, or registered memory.

A :class:`MemoryRegion` or :class:`Segment` registered with
``Access.REMOTE_READ`` is sent without registering anything; anything else
larger than the eager limit is registered, read-only for the peer, for the
duration of the send.
"""

if TYPE_CHECKING:
    from typing_extensions import Buffer

    Into = MemoryRegion | Segment | Buffer
else:
    Into = MemoryRegion | Segment | bytearray | memoryview
"""Where a received body can land: registered memory, or any writable
C-contiguous buffer (a ``bytearray``, a writable ``memoryview``, a numpy
array...), registered for the duration of a read when the body is large."""

Chooser = Callable[[bytes, int], "Into | None"]

Deliver = Callable[[bytes, memoryview], bool]
"""Takes a small message as it arrives: its head and a view of its body,
valid only during the call. Returns False to leave it queued instead."""


def check_into(into: object) -> Into:
    """``into`` if a message can land in it; TypeError or ValueError saying why not."""
    if type(into) is bytearray:  # the usual buffer: always writable, flat bytes
        return into
    if isinstance(into, MemoryRegion | Segment):
        region = into if isinstance(into, MemoryRegion) else into.mr
        if region.closed:
            raise ValueError("cannot receive into a closed memory region")
        if not region.access & Access.LOCAL_WRITE:
            raise ValueError(
                "cannot receive into a region registered without Access.LOCAL_WRITE: "
                "the adapter could not write into it"
            )
        return into
    name = type(into).__name__
    try:
        view = memoryview(into)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"cannot receive into {name}: give a writable buffer (a bytearray, a writable "
            "memoryview, a numpy array...) or a registered MemoryRegion/Segment"
        ) from None
    with view:
        if view.readonly:
            raise TypeError(f"cannot receive into a read-only {name}")
        if not view.c_contiguous:
            raise ValueError(f"cannot receive into a non-contiguous {name}")
        refuse_objects(view.format, f"the receive buffer ({name})")
    return into  # type: ignore[return-value]


def body_length(body: object) -> int:
    """Bytes in a message body, checked before anything is sent: TypeError
    naming what is wrong unless ``body`` is a registered region or segment,
    or a C-contiguous bytes-like object (the bytes are copied or read in
    one piece, as they lie in memory)."""
    if type(body) is bytes or type(body) is bytearray:  # flat bytes: nothing to check
        return len(body)
    if isinstance(body, MemoryRegion | Segment):
        return body.length
    try:
        view = memoryview(body)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            "a message body must be a bytes-like object or a registered "
            f"MemoryRegion/Segment, not {type(body).__name__}"
        ) from None
    with view:
        if not view.c_contiguous:
            raise TypeError(
                f"a message body must be C-contiguous, and this {type(body).__name__} "
                "is a strided view: send a contiguous copy (bytes(view), or "
                "numpy.ascontiguousarray for an array)"
            )
        refuse_objects(view.format, f"the message body ({type(body).__name__})")
        return view.nbytes


def buffer_length(buffer: Body | Into) -> int:
    """Bytes in a message body or receive buffer (a region's or segment's length)."""
    if isinstance(buffer, MemoryRegion | Segment):
        return buffer.length
    return memoryview(buffer).nbytes


def buffer_view(buffer: Body | Into) -> memoryview:
    """A flat byte view of a message body or receive buffer (release it when done)."""
    if isinstance(buffer, MemoryRegion | Segment):
        return buffer.view()
    return memoryview(buffer).cast("B")


GIVE_BACK_AFTER = 1 << 20
"""Bodies this large, landed in new buffers, make a closing channel give
freed memory back to the system (:func:`give_back_memory`)."""


def give_back_memory() -> None:
    """Return the memory the C heap holds free to the system (glibc's
    ``malloc_trim``; nothing where there is none).

    Large bodies land in new ``bytearray`` s. Once one of them is freed,
    glibc serves later ones of that size from its heap instead of mapping
    them, and keeps what they free: a server that read large messages
    would hold their memory after its clients left.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim
