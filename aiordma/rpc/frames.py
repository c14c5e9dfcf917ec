# cython: annotation_typing=True
"""The RPC frame that heads every RPC message, and its codec (pure logic).

Each RPC message is one channel message: this frame as its head, the
encoded payload as its body. Replies carry the call's id, so calls on one
connection complete in any order. Every call packs two frames and parses
two, so :class:`Frame` is an extension type when compiled (``frames.pxd``;
see :mod:`aiordma._compiled`).
"""

from __future__ import annotations

import enum
import json
import struct
from typing import TYPE_CHECKING, Final

from aiordma.exceptions import ProtocolError

if TYPE_CHECKING:
    from aiordma import _cython_shim as cython
else:
    try:
        import cython
    except ImportError:  # no Cython: the declarations below mean nothing
        from aiordma import _cython_shim as cython

_FRAME: Final = struct.Struct("<BBHQ")
MAX_METHOD: Final = 255
PROTOCOL: Final = "aiordma.rpc"
"""What an RPC client's and server's message channels announce (see
``MessageChannel(protocol=)``): a peer speaking another protocol is refused."""


class FrameKind(enum.IntEnum):
    REQUEST = 1
    """Call ``method``; the body is the encoded argument."""
    REPLY = 2
    """The call returned; the body is the encoded result."""
    ERROR = 3
    """The call failed; the body describes the error (see :func:`error_body`)."""
    CANCEL = 4
    """The caller gave up; the handler may be cancelled. No reply follows."""


@cython.cclass
class Frame:
    """An RPC message's head: its ``kind``, the ``call_id`` a reply answers,
    and the ``method`` a REQUEST calls (``""`` for the others). Compared by
    value; its fields are read-only compiled (treat them so on the pure
    path too)."""

    def __init__(self, kind: FrameKind, call_id: cython.ulonglong, method: str = "") -> None:
        self.kind = kind
        self.call_id = call_id
        self.method = method

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Frame):
            return NotImplemented
        return (self.kind, self.call_id, self.method) == (other.kind, other.call_id, other.method)

    def __hash__(self) -> int:
        return hash((self.kind, self.call_id, self.method))

    def __repr__(self) -> str:
        return f"Frame(kind={self.kind!r}, call_id={self.call_id}, method={self.method!r})"

    def pack(self) -> bytes:
        if not self.method:
            return _FRAME.pack(self.kind, 0, 0, self.call_id)
        name = self.method.encode()
        if len(name) > MAX_METHOD:
            raise ValueError(f"method name is {len(name)} bytes; at most {MAX_METHOD} allowed")
        return _FRAME.pack(self.kind, 0, len(name), self.call_id) + name

    @staticmethod
    @cython.locals(kind=cython.int, name_len=cython.Py_ssize_t, size=cython.Py_ssize_t)
    def unpack(data: bytes | bytearray | memoryview) -> Frame:
        size = len(data)
        if size < _FRAME_SIZE:
            raise ProtocolError(f"RPC frame of {size} bytes is too short")
        kind, _flags, name_len, call_id = _FRAME.unpack_from(data)
        k = _KINDS.get(kind)
        if k is None:
            raise ProtocolError(f"unknown RPC frame kind {kind}")
        if size != _FRAME_SIZE + name_len:
            raise ProtocolError("RPC frame length does not match its method name")
        if (kind == _REQUEST) != (name_len > 0):
            raise ProtocolError(f"{k.name} frame {'without' if name_len == 0 else 'with'} a method")
        method = ""
        if name_len:
            try:
                method = bytes(data[_FRAME_SIZE:]).decode()
            except UnicodeDecodeError:
                raise ProtocolError("RPC method name is not UTF-8") from None
        frame: Frame = Frame.__new__(Frame)  # compiled: no argument parsing
        frame.kind = k
        frame.call_id = call_id
        frame.method = method
        return frame


_KINDS: Final = {int(k): k for k in FrameKind}
_REQUEST = cython.declare(cython.int, FrameKind.REQUEST)  # C integers for typed code
_FRAME_SIZE = cython.declare(cython.Py_ssize_t, _FRAME.size)


def error_body(type_name: str, message: str) -> bytes:
    """Describe a handler's exception for the caller."""
    return json.dumps({"type": type_name, "message": message}).encode()


def parse_error_body(body: bytes | bytearray) -> tuple[str, str]:
    try:
        info = json.loads(body)
        return str(info["type"]), str(info["message"])
    except (ValueError, KeyError, TypeError):
        raise ProtocolError("malformed RPC error description") from None
