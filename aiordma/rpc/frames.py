"""The RPC frame that heads every RPC message, and its codec (pure logic).

Each RPC message is one channel message: this frame as its head, the
encoded payload as its body. Replies carry the call's id, so calls on one
connection complete in any order.
"""

from __future__ import annotations

import enum
import json
import struct
from dataclasses import dataclass
from typing import Final

from aiordma.exceptions import ProtocolError

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


@dataclass(frozen=True, slots=True)
class Frame:
    kind: FrameKind
    call_id: int
    method: str = ""

    def pack(self) -> bytes:
        name = self.method.encode()
        if len(name) > MAX_METHOD:
            raise ValueError(f"method name is {len(name)} bytes; at most {MAX_METHOD} allowed")
        return _FRAME.pack(self.kind, 0, len(name), self.call_id) + name

    @classmethod
    def unpack(cls, data: bytes) -> Frame:
        if len(data) < _FRAME.size:
            raise ProtocolError(f"RPC frame of {len(data)} bytes is too short")
        kind, _flags, name_len, call_id = _FRAME.unpack_from(data)
        try:
            k = FrameKind(kind)
        except ValueError:
            raise ProtocolError(f"unknown RPC frame kind {kind}") from None
        if len(data) != _FRAME.size + name_len:
            raise ProtocolError("RPC frame length does not match its method name")
        if (k == FrameKind.REQUEST) != (name_len > 0):
            raise ProtocolError(f"{k.name} frame {'without' if name_len == 0 else 'with'} a method")
        try:
            method = bytes(data[_FRAME.size :]).decode()
        except UnicodeDecodeError:
            raise ProtocolError("RPC method name is not UTF-8") from None
        return cls(k, call_id, method)


def error_body(type_name: str, message: str) -> bytes:
    """Describe a handler's exception for the caller."""
    return json.dumps({"type": type_name, "message": message}).encode()


def parse_error_body(body: bytes | bytearray) -> tuple[str, str]:
    try:
        info = json.loads(body)
        return str(info["type"]), str(info["message"])
    except (ValueError, KeyError, TypeError):
        raise ProtocolError("malformed RPC error description") from None
