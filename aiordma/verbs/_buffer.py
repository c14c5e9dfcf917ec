"""Zero-copy access to the memory behind any buffer-protocol object.

A registered buffer must neither move nor be freed while the adapter may
touch it. Holding a buffer export (``PyObject_GetBuffer``) guarantees both:
a ``bytearray`` refuses to resize while exported, an ``mmap`` refuses to
close, and the object itself stays referenced. ctypes reaches the C API
because read-only objects (``bytes``, read-only ``memoryview``) cannot be
exported through ``ctypes.c_char.from_buffer``.
"""

from __future__ import annotations

import ctypes
import re
from typing import Any

# PyBUF_SIMPLE asks for one contiguous run of bytes: exactly what an MR needs.
_PyBUF_SIMPLE = 0
_FIELD_NAMES = re.compile(r":[^:]*:")


def holds_objects(format: str | None) -> bool:
    """Whether a buffer of this struct ``format`` (PEP 3118) holds Python
    object pointers (``'O'``, a numpy object array's or record's field)."""
    # No "O" at all is the common case (bytes, numbers): no pattern to run.
    return format is not None and "O" in format and "O" in _FIELD_NAMES.sub("", format)


def refuse_objects(format: str | None, what: str) -> None:
    """TypeError if a buffer of this ``format`` holds Python objects: its bytes
    are this process's object addresses, meaningless (and a leak) elsewhere."""
    if holds_objects(format):
        raise TypeError(
            f"{what} holds Python objects (buffer format {format!r}, a numpy object array?): "
            "its bytes are this process's object addresses, not the objects; convert it "
            "to a numeric dtype, or encode it (pickle, json) first"
        )


class _PyBuffer(ctypes.Structure):
    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.py_object),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.POINTER(ctypes.c_ssize_t)),
        ("strides", ctypes.POINTER(ctypes.c_ssize_t)),
        ("suboffsets", ctypes.POINTER(ctypes.c_ssize_t)),
        ("internal", ctypes.c_void_p),
    ]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None


class BufferExport:
    """A held export of ``obj``'s memory: its address and length stay valid until release."""

    __slots__ = ("_view", "address", "length", "readonly")

    def __init__(self, obj: Any) -> None:
        self._view: _PyBuffer | None = None
        view = _PyBuffer()
        try:
            _get_buffer(obj, ctypes.byref(view), _PyBUF_SIMPLE)
        except (TypeError, BufferError) as exc:
            raise TypeError(
                f"cannot register a {type(obj).__name__}: need a C-contiguous object "
                f"supporting the buffer protocol ({exc})"
            ) from exc
        self._view = view
        try:  # (a simple export carries no format: what the bytes are comes from a view)
            with memoryview(obj) as typed:
                refuse_objects(typed.format, f"the {type(obj).__name__} to register")
        except TypeError:
            self.release()
            raise
        self.address: int = view.buf or 0
        self.length: int = view.len
        self.readonly: bool = bool(view.readonly)

    @property
    def released(self) -> bool:
        return self._view is None

    def release(self) -> None:
        """Give the export back (idempotent); the object may then move or resize."""
        view, self._view = self._view, None
        if view is not None:
            _release_buffer(ctypes.byref(view))

    def __del__(self) -> None:
        self.release()
