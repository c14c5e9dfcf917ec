"""Addressing a queue pair without rdma_cm: :class:`Endpoint` and GID text forms."""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass
from typing import ClassVar, Final


def gid_to_bytes(gid: str) -> bytes:
    """The 16 raw bytes of a GID written as an IPv6 address (pyverbs' form)."""
    return ipaddress.IPv6Address(gid).packed


def gid_to_str(raw: bytes) -> str:
    """A raw 16-byte GID as the eight colon-separated groups pyverbs' ``GID`` parses."""
    return ":".join(raw[i : i + 2].hex() for i in range(0, 16, 2))


_ENDPOINT_FORMAT: Final = struct.Struct("<II16sH")


@dataclass(frozen=True, slots=True)
class Endpoint:
    """What a peer needs to connect to a queue pair without rdma_cm.

    Exchanged out of band (a socket, a file), as the classic pingpong tools
    do: QP number, starting packet sequence number, GID and LID.
    """

    qp_num: int
    psn: int
    gid: bytes
    lid: int = 0

    SIZE: ClassVar[int] = _ENDPOINT_FORMAT.size

    def to_bytes(self) -> bytes:
        """Pack into ``Endpoint.SIZE`` bytes, to send to the peer."""
        return _ENDPOINT_FORMAT.pack(self.qp_num, self.psn, self.gid, self.lid)

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> Endpoint:
        """Unpack what :meth:`to_bytes` made; raises ValueError on a wrong length."""
        if len(data) != cls.SIZE:
            raise ValueError(f"a packed Endpoint is {cls.SIZE} bytes, got {len(data)}")
        return cls(*_ENDPOINT_FORMAT.unpack(data))
