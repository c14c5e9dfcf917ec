# cython: annotation_typing=True
"""The header every message-channel packet starts with, and its codec.

A packet is one RDMA send into one of the peer's pre-posted receive buffers.
Its 40-byte header says what it is, returns receive credits to the peer
(piggybacked on any packet) and, for a rendezvous, where the body can be
read from. A message is an optional short *head* (framing for the layer
above, e.g. an RPC call id) and a *body*: an eager packet carries both after
the header, a rendezvous packet carries the head and advertises the body.

Malformed headers raise :class:`ProtocolError`, which closes the
connection that sent them.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from aiordma.channel.buffers import buffer_view
from aiordma.channel.ring import check_size
from aiordma.exceptions import ProtocolError, ProtocolMismatchError
from aiordma.verbs.memory import RemoteBuffer

if TYPE_CHECKING:
    from aiordma import _cython_shim as cython
else:
    try:
        import cython
    except ImportError:  # no Cython: the declarations below mean nothing
        from aiordma import _cython_shim as cython

MAGIC: Final = 0xA5
VERSION: Final = 7
"""2 added REVOKE and HELLO; 3 made HELLO carry each side's windows and first
grants, and data packets say when they spend the last credit; 4 made HELLO
carry a :class:`Hello` (the sender's receive buffer size and protocol); 5
added MEDIUM and PIECE; 6 added BATCH; 7 added RECORD, the receive ring a
HELLO announces and the ring space every header gives back. A peer
speaking another version is refused at its first packet."""

_HEADER: Final = struct.Struct("<BBBBHHQQQIHH")
HEADER_SIZE: Final = _HEADER.size
_HELLO: Final = struct.Struct("<IQII")
_ENTRY: Final = struct.Struct("<II")
ENTRY_SIZE: Final = _ENTRY.size
"""Bytes before each message of a BATCH packet: its head's and body's lengths."""
MAX_PROTOCOL: Final = 32
"""Bytes a protocol name may take (UTF-8)."""
MIN_BUFFER: Final = 128
"""The smallest receive buffer a channel may have: a HELLO with the longest
protocol name fits, with room to spare."""


class Kind(enum.IntEnum):
    """What a packet carries."""

    EAGER = 1
    """The whole message follows the header in this packet."""
    RENDEZVOUS = 2
    """The message is in the sender's memory, at the advertised remote buffer."""
    DONE = 3
    """The receiver has read the rendezvous message ``msg_id``; the sender may reuse it."""
    CREDIT = 4
    """Returns credits (sent when half a window of data credits is owed)."""
    CONTROL_CREDIT = 5
    """Returns control credits only (sent when half the control window is owed)."""
    REVOKE = 6
    """The sender withdrew rendezvous message ``msg_id`` (cancelled, or not read
    in time): its memory is no longer readable."""
    HELLO = 7
    """Sent first, once, when the connection is established: ``length`` is the
    largest message the sender accepts (its ``max_message``), ``msg_id`` its
    control window (high 32 bits) and data window (low 32 bits), its
    credits are the sender's first grants (nothing is granted before), and
    its head is a :class:`Hello`."""
    MEDIUM = 8
    """The first packet of a message too large for one packet but sent by
    copy (no exposure): ``length`` is the whole body's, and the packet
    carries the head and the body's first bytes; PIECE packets bring the
    rest, next on the data path (nothing else of the sender's data goes
    between them)."""
    PIECE = 9
    """The next ``length`` bytes of the MEDIUM message being received."""
    BATCH = 10
    """Several small messages in one packet (one data credit): ``msg_id`` of
    them in ``length`` bytes, each an entry of its head's and body's lengths
    (:data:`ENTRY_SIZE` bytes) followed by the head and the body."""
    RECORD = 11
    """A whole message written into the receiver's ring (one RDMA WRITE WITH
    IMMEDIATE, which consumes a receive buffer and a data credit, and
    :mod:`~aiordma.channel.ring` space): the header, then ``head_length``
    bytes of head and ``length`` of body, as an EAGER packet's."""


@cython.cclass
class WireCodes:
    """The kinds' codes and the header's size as C integers, for typed code.

    Compiled, a comparison with a field is one load (with the enum, a
    call). The fields are declared once, in ``wire.pxd``, one for each
    :class:`Kind` (named in lower case: a kind with no field fails at
    import); the values come from the enum and :data:`HEADER_SIZE`. Each
    compiled module of the channel holds :data:`WIRE` in one typed
    variable. Read-only by contract (settable only so that ``__init__``
    can fill the fields by name).
    """

    def __init__(self) -> None:
        for kind in Kind:
            setattr(self, kind.name.lower(), kind.value)
        self.header_size = HEADER_SIZE

    if TYPE_CHECKING:  # the fields typed code reads, for mypy (wire.pxd for Cython)
        eager: int
        rendezvous: int
        done: int
        credit: int
        control_credit: int
        revoke: int
        hello: int
        medium: int
        piece: int
        batch: int
        record: int


WIRE: Final = WireCodes()
"""The one :class:`WireCodes`."""
_WIRE = cython.declare(WireCodes, WIRE)

LAST_CREDIT: Final = 1
"""Flag: this data packet spent the sender's last data credit (a receiver
lending from a shared pool takes it as a sign to lend more)."""
_FLAGS: Final = LAST_CREDIT


@cython.cclass
class Header:
    """One packet's header: made for every packet sent and received, so it
    is an extension type with C fields when compiled (``wire.pxd``).

    ``kind``; ``credits``: buffers the sender re-posted for consumed data
    messages since it last said so; ``msg_id``; ``length``: the body's
    length (EAGER, RENDEZVOUS); ``remote``: where a RENDEZVOUS body can be
    read (its length is ``length``); ``head_length``: bytes of head that
    follow the header (EAGER, RENDEZVOUS); ``control_credits``: buffers the
    sender re-posted after control packets (DONE, CREDIT, CONTROL_CREDIT);
    ``flags``: :data:`LAST_CREDIT`, or nothing; ``ring``: units of receive
    ring the sender gives back (:mod:`~aiordma.channel.ring`). Compared by
    value (compiled, its fields are read-only; treat them so on the pure
    path too).
    """

    def __init__(
        self, kind: Kind, credits: cython.int, msg_id: cython.ulonglong = 0,
        length: cython.ulonglong = 0, remote: RemoteBuffer | None = None,
        head_length: cython.int = 0, control_credits: cython.int = 0, flags: cython.int = 0,
        ring: cython.int = 0,
    ) -> None:  # fmt: skip
        self.kind = kind
        self.code: int = kind
        self.credits = credits
        self.msg_id = msg_id
        self.length = length
        self.remote = remote
        self.head_length = head_length
        self.control_credits = control_credits
        self.flags = flags
        self.ring = ring

    def _fields(self) -> tuple[object, ...]:
        return (self.kind, self.credits, self.msg_id, self.length, self.remote,
                self.head_length, self.control_credits, self.flags, self.ring)  # fmt: skip

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Header):
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return (f"Header(kind={self.kind!r}, credits={self.credits}, msg_id={self.msg_id}, "
                f"length={self.length}, remote={self.remote!r}, head_length={self.head_length}, "
                f"control_credits={self.control_credits}, flags={self.flags}, "
                f"ring={self.ring})")  # fmt: skip

    def pack_into(self, buf: memoryview | bytearray) -> None:
        """Write the header at the start of ``buf``."""
        if not (
            0 <= self.credits < 1 << 16
            and 0 <= self.control_credits < 1 << 16
            and 0 <= self.ring < 1 << 16
        ):
            raise ValueError("credits must fit in 16 bits")
        if len(buf) < HEADER_SIZE:
            raise ValueError(f"a header needs {HEADER_SIZE} bytes, not {len(buf)}")
        remote = self.remote
        addr = remote.addr if remote is not None else 0
        rkey = remote.rkey if remote is not None else 0
        if cython.compiled and store_into(buf, self, addr, rkey):
            return  # stored in C (wire.pxd)
        _HEADER.pack_into(buf, 0, MAGIC, VERSION, self.code, self.flags, self.credits,
                          self.control_credits, self.msg_id, self.length, addr, rkey,
                          self.head_length, self.ring)  # fmt: skip

    def pack(self) -> bytes:
        """The header as bytes."""
        buf = bytearray(HEADER_SIZE)
        self.pack_into(buf)
        return bytes(buf)

    @staticmethod
    def unpack(data: bytes | bytearray | memoryview, max_length: int) -> Header:
        """Parse and check a received header; ``max_length`` bounds message sizes."""
        size: cython.Py_ssize_t = len(data)
        if size < HEADER_SIZE:
            raise ProtocolError(f"packet of {size} bytes is shorter than a header")
        if cython.compiled:
            header = load_from(data, size, max_length)  # loaded in C (wire.pxd)
            if header is not None:
                return header
        magic, version, kind, flags, credits, control, msg_id, length, addr, rkey, head, ring = (
            _HEADER.unpack_from(data)
        )
        return checked(magic, version, kind, flags, credits, control, msg_id, length, addr,
                       rkey, head, ring, size - HEADER_SIZE, max_length)  # fmt: skip


@cython.ccall
def checked(
    magic: cython.int, version: cython.int, kind: cython.int, flags: cython.int,
    credits: cython.int, control: cython.int, msg_id: cython.ulonglong,
    length: cython.ulonglong, addr: cython.ulonglong, rkey: cython.uint, head: cython.int,
    ring: cython.int, carried: cython.Py_ssize_t, limit: cython.ulonglong,
) -> Header:  # fmt: skip
    """The header with these fields, read from a packet carrying ``carried``
    bytes after it; :class:`ProtocolError` if the peer could not have sent
    it, or its message exceeds ``limit`` bytes."""
    if magic != MAGIC or version != VERSION:
        raise ProtocolError(f"not an aiordma message packet (magic {magic:#x}, v{version})")
    k = _KINDS.get(kind)
    if k is None:
        raise ProtocolError(f"unknown packet kind {kind}")
    if flags & ~_FLAGS:
        raise ProtocolError(f"unknown packet flags {flags:#x}")
    if length > limit and kind != _WIRE.hello and kind != _WIRE.batch:
        raise ProtocolError(f"message of {length} bytes exceeds the limit of {limit}")
    remote = None
    if kind == _WIRE.rendezvous:
        if length == 0 or addr == 0:
            raise ProtocolError("rendezvous without a readable buffer")
        remote = RemoteBuffer(addr, length, rkey)
        if head != carried:
            raise ProtocolError(f"rendezvous packet says {head} head bytes, carries {carried}")
    elif kind == _WIRE.eager or kind == _WIRE.record:
        if head + length != carried:
            raise ProtocolError(
                f"{k.name.lower()} packet says {head} + {length} bytes but carries {carried}"
            )
    elif kind == _WIRE.medium:
        if length == 0 or head >= carried or head + length <= carried:
            raise ProtocolError(f"medium packet says {head} + {length} bytes but carries {carried}")
    elif kind == _WIRE.piece:
        if head or length == 0 or length != carried:
            raise ProtocolError(f"piece says {head} + {length} bytes but carries {carried}")
    elif kind == _WIRE.hello:
        if head != carried:
            raise ProtocolError(f"HELLO packet says {head} head bytes, carries {carried}")
    elif kind == _WIRE.batch:
        if head or length != carried or msg_id == 0 or msg_id * ENTRY_SIZE > length:
            raise ProtocolError(
                f"batch says {msg_id} messages in {head} + {length} bytes but carries {carried}"
            )
    elif head or carried or length:
        raise ProtocolError(f"{k.name} packet with a payload")
    header: Header = Header.__new__(Header)  # compiled: no argument parsing
    header.kind = k
    header.code = kind
    header.credits = credits
    header.msg_id = msg_id
    header.length = length
    header.remote = remote
    header.head_length = head
    header.control_credits = control
    header.flags = flags
    header.ring = ring
    return header


_KINDS: Final = {int(k): k for k in Kind}


_HEADER_SIZE = cython.declare(cython.Py_ssize_t, HEADER_SIZE)
View = memoryview  # (an alias: typed with it, Cython would check its own memoryview type)


@cython.ccall
@cython.exceptval(-1, check=True)
def write_packet(
    view: View, start: cython.Py_ssize_t, room: cython.Py_ssize_t, header: Header,
    head: bytes | bytearray, body: Any,
) -> cython.Py_ssize_t:  # fmt: skip
    """Write a packet into ``view[start : start + room]``: ``header``, then
    ``head`` and ``body`` (None, or a bytes-like part of a message, which
    fit); returns its length. Compiled, known memory is copied in C."""
    at: cython.Py_ssize_t = _HEADER_SIZE  # where the head goes
    end: cython.Py_ssize_t = at + len(head)
    copied: cython.Py_ssize_t = 0
    if cython.compiled and 0 <= header.credits < 0x10000 and 0 <= header.control_credits < 0x10000:
        remote = header.remote
        if remote is None:
            store_header(address_of(view, True) + start, header, 0, 0)
        else:
            store_header(address_of(view, True) + start, header, remote.addr, remote.rkey)
        if copy_in(view, start + at, head, room - at) >= 0:
            if body is None:
                return end
            copied = copy_in(view, start + end, body, room - end)
            if copied >= 0:
                return end + copied
    with view[start : start + room] as slot:
        header.pack_into(slot)
        slot[at:end] = head
        if body is not None:
            with buffer_view(body) as source:
                copied = len(source)
                slot[end : end + copied] = source
    return end + copied


@cython.ccall
def read_packet(
    view: View, start: cython.Py_ssize_t, size: cython.Py_ssize_t, room: cython.Py_ssize_t,
    limit: cython.ulonglong,
) -> Header:  # fmt: skip
    """The checked header of the packet of ``size`` bytes at ``view[start:]``,
    in a slot of ``room`` bytes; ``limit`` bounds message sizes."""
    if cython.compiled and _HEADER_SIZE <= size <= room:
        return load_header(address_of(view, False) + start, size, limit)
    return Header.unpack(view[start : start + size], limit)


def pack_batch(bodies: Sequence[Any], sizes: Sequence[int], total: int) -> bytearray:
    """A BATCH packet's payload (``total`` bytes) holding ``bodies`` (C-contiguous
    buffers of ``sizes`` bytes each) with no heads."""
    payload = bytearray(total)
    at = 0
    for body, size in zip(bodies, sizes, strict=True):
        _ENTRY.pack_into(payload, at, 0, size)
        at += ENTRY_SIZE
        with memoryview(body) as view, view.cast("B") as flat:
            payload[at : at + size] = flat
        at += size
    if at != total:
        raise ValueError(f"a batch of {at} bytes, not {total}")
    return payload


def batch_entries(
    payload: bytes | bytearray | memoryview, count: int, limit: int
) -> list[tuple[int, int, int]]:
    """Where each of the ``count`` messages of a BATCH ``payload`` is: its
    head's offset, its head's length and its body's length, in order.
    :class:`ProtocolError` unless they fill the payload exactly and no body
    exceeds ``limit`` bytes."""
    entries: list[tuple[int, int, int]] = []
    at = 0
    end = len(payload)
    for _ in range(count):
        if at + ENTRY_SIZE > end:
            raise ProtocolError(f"a batch's entry runs past its {end} bytes")
        head, length = _ENTRY.unpack_from(payload, at)
        at += ENTRY_SIZE
        if length > limit:
            raise ProtocolError(f"message of {length} bytes exceeds the limit of {limit}")
        if at + head + length > end:
            raise ProtocolError(f"a batch's message runs past its {end} bytes")
        entries.append((at, head, length))
        at += head + length
    if at != end:
        raise ProtocolError(f"a batch of {count} messages leaves {end - at} of its bytes over")
    return entries


class Hello(NamedTuple):
    """What a HELLO announces besides limits and credits (its head)."""

    buffer_size: int
    """Bytes of each of the sender's receive buffers: no packet to it may be larger."""
    protocol: str
    """What the sender speaks on the channel (``""``: plain messages); both
    sides must speak the same."""
    ring: RemoteBuffer | None = None
    """The sender's receive ring, writable by this connection only (None:
    it has none, and medium messages to it travel in pieces)."""

    def pack(self) -> bytes:
        name = self.protocol.encode()
        if len(name) > MAX_PROTOCOL:
            raise ValueError(f"protocol name {self.protocol!r} exceeds {MAX_PROTOCOL} bytes")
        ring = self.ring
        if ring is None:
            return _HELLO.pack(self.buffer_size, 0, 0, 0) + name
        return _HELLO.pack(self.buffer_size, ring.addr, ring.rkey, ring.length) + name

    @classmethod
    def unpack(cls, data: bytes | bytearray | memoryview) -> Hello:
        """Parse a HELLO's head; :class:`~aiordma.ProtocolError` if it is malformed."""
        if not _HELLO.size <= len(data) <= _HELLO.size + MAX_PROTOCOL:
            raise ProtocolError(f"HELLO announcement of {len(data)} bytes")
        size, addr, rkey, ring_size = _HELLO.unpack_from(data)
        if size < MIN_BUFFER:
            raise ProtocolError(f"peer announced receive buffers of {size} bytes")
        try:
            protocol = bytes(data[_HELLO.size :]).decode()
        except UnicodeDecodeError:
            raise ProtocolError("HELLO names its protocol in invalid UTF-8") from None
        if not ring_size:
            return cls(size, protocol)
        try:
            check_size(ring_size)
        except ValueError as exc:
            raise ProtocolError(f"peer announced {exc}") from None
        if not addr:
            raise ProtocolError("peer announced a receive ring at address 0")
        return cls(size, protocol, RemoteBuffer(addr, ring_size, rkey))

    def check_protocol(self, ours: str, peer: str) -> None:
        """Raise :class:`~aiordma.ProtocolMismatchError` if both this HELLO and this side
        (``ours``) name a protocol and they differ; ``peer`` names the peer.
        A plain channel (``""``) carries any protocol: the layer above it
        decides, as ``rpc.Service.serve`` does."""
        if ours and self.protocol and self.protocol != ours:
            raise ProtocolMismatchError(ours, self.protocol, peer)


if not cython.compiled:  # wire.pxd's C helpers, named here for the interpreter and the type checker

    def address_of(buf: object, writable: bool) -> int:
        raise NotImplementedError  # only called compiled

    def store_header(p: int, header: Header, addr: int, rkey: int) -> None:
        raise NotImplementedError  # only called compiled

    def load_header(p: int, size: int, limit: int) -> Header:
        raise NotImplementedError  # only called compiled

    def copy_in(view: object, offset: int, data: object, room: int) -> int:
        raise NotImplementedError  # only called compiled

    def store_into(buf: object, header: Header, addr: int, rkey: int) -> bool:
        raise NotImplementedError  # only called compiled

    def load_from(data: object, size: int, limit: int) -> Header | None:
        raise NotImplementedError  # only called compiled
