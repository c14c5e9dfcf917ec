"""The message packet header: round trips and rejection of malformed packets (no device)."""

from __future__ import annotations

import struct

import pytest

from aiordma import RemoteBuffer
from aiordma.channel.wire import (
    ENTRY_SIZE,
    HEADER_SIZE,
    LAST_CREDIT,
    MAX_PROTOCOL,
    MIN_BUFFER,
    VERSION,
    WIRE,
    Header,
    Hello,
    Kind,
    batch_entries,
    pack_batch,
)
from aiordma.exceptions import ProtocolError

LIMIT = 64 << 20


def test_eager_header_round_trips_with_its_payload() -> None:
    header = Header(Kind.EAGER, credits=3, msg_id=7, length=5)
    packet = header.pack() + b"hello"
    assert len(header.pack()) == HEADER_SIZE
    assert Header.unpack(packet, LIMIT) == header


def test_the_layout_is_the_documented_struct_whichever_path_packs_it() -> None:
    """Compiled, the header is stored and loaded field by field in C; its
    bytes must be those of ``<BBBBHHQQQIHH``, every field at its widest."""
    layout = struct.Struct("<BBBBHHQQQIHH")
    remote = RemoteBuffer(0xFEDC_BA98_7654_3210, (1 << 64) - 1, 0xFFFF_FFFE)
    header = Header(Kind.RENDEZVOUS, 0xFFFF, (1 << 64) - 1, (1 << 64) - 1, remote, 0xFFFE,
                    0xFFFD, LAST_CREDIT, 0xFFFC)  # fmt: skip
    packed = bytearray(b"\xaa" * HEADER_SIZE)
    header.pack_into(packed)
    most = (1 << 64) - 1
    expected = layout.pack(0xA5, VERSION, Kind.RENDEZVOUS, LAST_CREDIT, 0xFFFF, 0xFFFD,
                           most, most, remote.addr, remote.rkey, 0xFFFE, 0xFFFC)  # fmt: skip
    assert bytes(packed) == expected
    carried = expected + bytes(0xFFFE)
    assert Header.unpack(carried, (1 << 64) - 1) == header
    assert Header.unpack(memoryview(bytearray(carried)), (1 << 64) - 1) == header
    with pytest.raises(ValueError, match="40 bytes"):
        header.pack_into(bytearray(HEADER_SIZE - 1))


def test_the_codes_typed_code_compares_with_are_the_kinds_and_the_header_size() -> None:
    """Compiled modules compare with ``WIRE``'s fields, not the enum: one for
    every kind, holding its value, and the header's size beside them."""
    assert {kind: getattr(WIRE, kind.name.lower()) for kind in Kind} == {k: k.value for k in Kind}
    assert WIRE.header_size == HEADER_SIZE == 40


def test_rendezvous_header_carries_the_readable_buffer_and_the_head() -> None:
    remote = RemoteBuffer(0x7F0000001000, 16 << 20, 0x1234)
    header = Header(Kind.RENDEZVOUS, 0, 9, 16 << 20, remote, head_length=4)
    assert Header.unpack(header.pack() + b"head", LIMIT) == header
    with pytest.raises(ProtocolError, match="says 4 head bytes, carries 0"):
        Header.unpack(header.pack(), LIMIT)


def test_eager_head_and_body_lengths_add_up() -> None:
    header = Header(Kind.EAGER, 0, 1, length=3, head_length=2)
    assert Header.unpack(header.pack() + b"hibod", LIMIT) == header


def test_a_medium_message_starts_with_its_head_and_continues_in_pieces() -> None:
    first = Header(Kind.MEDIUM, 0, 1, length=10, head_length=2)
    assert Header.unpack(first.pack() + b"hi" + b"body", LIMIT) == first  # 4 of 10 bytes
    piece = Header(Kind.PIECE, 0, 1, length=6)
    assert Header.unpack(piece.pack() + b"rest!!", LIMIT) == piece


@pytest.mark.parametrize(
    ("packet", "message"),
    [
        (b"\x00" * 10, "shorter than a header"),
        (b"\x00" * HEADER_SIZE, "not an aiordma message packet"),
        (bytes([0xA5, VERSION, 99]) + bytes(HEADER_SIZE - 3), "unknown packet kind 99"),
        (Header(Kind.EAGER, 0, 1, 6).pack() + b"short", "says 0 \\+ 6 bytes but carries 5"),
        (Header(Kind.EAGER, 0, 1, 2, head_length=2).pack() + b"abc", "says 2 \\+ 2 bytes"),
        (Header(Kind.CREDIT, 0).pack() + b"x", "CREDIT packet with a payload"),
        (Header(Kind.EAGER, 0, 1, LIMIT + 1).pack(), "exceeds the limit"),
        (Header(Kind.RENDEZVOUS, 0, 1, 100).pack(), "without a readable buffer"),
        (Header(Kind.MEDIUM, 0, 1, 4, head_length=2).pack() + b"hibody", "medium packet says"),
        (Header(Kind.MEDIUM, 0, 1, 9, head_length=2).pack() + b"hi", "medium packet says"),
        (Header(Kind.MEDIUM, 0, 1, 0).pack() + b"x", "medium packet says 0 \\+ 0"),
        (Header(Kind.PIECE, 0, 1, 4).pack() + b"abc", "piece says 0 \\+ 4 bytes"),
        (Header(Kind.PIECE, 0, 1, 0).pack(), "piece says 0 \\+ 0"),
        (Header(Kind.PIECE, 0, 1, 2, head_length=1).pack() + b"abc", "piece says 1 \\+ 2"),
        (Header(Kind.BATCH, 0, 0, 8).pack() + bytes(8), "batch says 0 messages"),
        (Header(Kind.BATCH, 0, 2, 8).pack() + bytes(8), "batch says 2 messages in 0 \\+ 8"),
        (Header(Kind.BATCH, 0, 1, 9).pack() + bytes(8), "but carries 8"),
        (Header(Kind.BATCH, 0, 1, 8, head_length=1).pack() + bytes(9), "in 1 \\+ 8 bytes"),
    ],
)
def test_malformed_packets_raise_protocol_error(packet: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        Header.unpack(packet, LIMIT)


def test_a_batch_round_trips_its_messages_and_says_where_each_is() -> None:
    """A batch's total may exceed the limit, which holds for each message."""
    bodies = [b"", b"one", bytearray(b"three"), memoryview(bytes(range(8))).cast("I")]
    sizes = [0, 3, 5, 8]
    payload = pack_batch(bodies, sizes, 4 * ENTRY_SIZE + 16)
    packet = Header(Kind.BATCH, 0, 4, len(payload)).pack() + bytes(payload)
    header = Header.unpack(packet, 8)
    assert (header.kind, header.msg_id, header.length) == (Kind.BATCH, 4, len(payload))
    entries = batch_entries(payload, 4, 8)
    assert [bytes(payload[at : at + head + n]) for at, head, n in entries] == [
        b"", b"one", b"three", bytes(range(8))
    ]  # fmt: skip
    assert [head for _, head, _ in entries] == [0, 0, 0, 0]
    with pytest.raises(ValueError, match="a batch of 40 bytes, not 41"):
        pack_batch(bodies[1:], sizes[1:], 41)


@pytest.mark.parametrize(
    ("payload", "count", "message"),
    [
        (bytes(4), 1, "entry runs past its 4 bytes"),
        (struct.pack("<II", 0, 5) + b"abc", 1, "message runs past its 11 bytes"),
        (struct.pack("<II", 2, 1) + b"abc" + bytes(4), 2, "entry runs past its 15 bytes"),
        (struct.pack("<II", 0, 3) + b"abcd", 1, "leaves 1 of its bytes over"),
        (struct.pack("<II", 0, 9) + bytes(9), 1, "9 bytes exceeds the limit of 8"),
    ],
)
def test_a_malformed_batch_raises_protocol_error(payload: bytes, count: int, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        batch_entries(payload, count, 8)


def test_credits_must_fit_the_field() -> None:
    with pytest.raises(ValueError, match="16 bits"):
        Header(Kind.CREDIT, credits=1 << 16).pack()
    with pytest.raises(ValueError, match="16 bits"):
        Header(Kind.CREDIT, 0, control_credits=1 << 16).pack()


def test_both_credit_counts_round_trip() -> None:
    header = Header(Kind.CONTROL_CREDIT, credits=3, control_credits=65535)
    assert Header.unpack(header.pack(), LIMIT) == header


def test_hello_carries_a_limit_larger_than_ours_and_revoke_nothing() -> None:
    hello = Header(Kind.HELLO, 0, 0, 1 << 40).pack()
    assert Header.unpack(hello, 1 << 20).length == 1 << 40  # the peer's limit, not a message
    revoke = Header.unpack(Header(Kind.REVOKE, 3, 17).pack(), 1 << 20)
    assert (revoke.kind, revoke.credits, revoke.msg_id) == (Kind.REVOKE, 3, 17)
    with pytest.raises(ProtocolError, match="REVOKE packet with a payload"):
        Header.unpack(Header(Kind.REVOKE, 0, 17).pack() + b"x", 1 << 20)
    with pytest.raises(ProtocolError, match="HELLO packet says 0 head bytes, carries 1"):
        Header.unpack(Header(Kind.HELLO, 0, 0, 5).pack() + b"x", 1 << 20)


def test_hello_announces_buffer_size_and_protocol() -> None:
    said = Hello(4096, "aiordma.rpc").pack()
    packet = Header(Kind.HELLO, 0, 0, 1 << 20, head_length=len(said)).pack() + said
    header = Header.unpack(packet, 1 << 20)
    assert Hello.unpack(packet[HEADER_SIZE : HEADER_SIZE + header.head_length]) == (
        4096,
        "aiordma.rpc",
        None,
    )
    assert Hello.unpack(Hello(MIN_BUFFER, "").pack()) == (MIN_BUFFER, "", None)
    ring = RemoteBuffer(0x7F00_0000_1000, 1 << 20, 0x1234_5678)
    assert HEADER_SIZE + len(Hello(0, "x" * MAX_PROTOCOL, ring).pack()) <= MIN_BUFFER


def test_hello_announces_a_receive_ring() -> None:
    ring = RemoteBuffer(0x7F00_0000_1000, 1 << 20, 0x1234_5678)
    assert Hello.unpack(Hello(4096, "", ring).pack()) == (4096, "", ring)


def test_a_record_carries_a_whole_message_and_ring_space_rides_on_any_header() -> None:
    header = Header(Kind.RECORD, 1, length=5000, head_length=3, ring=77)
    packet = header.pack() + b"abc" + bytes(5000)
    assert Header.unpack(packet, LIMIT) == header
    assert Header.unpack(Header(Kind.CREDIT, 2, ring=0xFFFF).pack(), LIMIT).ring == 0xFFFF
    with pytest.raises(ProtocolError, match="record packet says 3 \\+ 5000 bytes but carries"):
        Header.unpack(packet[:-1], LIMIT)
    with pytest.raises(ValueError, match="16 bits"):
        Header(Kind.CREDIT, 0, ring=1 << 16).pack()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "HELLO announcement of 0 bytes"),
        (Hello(4096, "x").pack() + b"y" * MAX_PROTOCOL, "HELLO announcement of"),
        (Hello(MIN_BUFFER - 1, "").pack(), f"receive buffers of {MIN_BUFFER - 1} bytes"),
        (Hello(4096, "").pack() + b"\xff", "invalid UTF-8"),
        (Hello(4096, "", RemoteBuffer(1 << 20, 100, 1)).pack(), "announced a ring of 100 bytes"),
        (Hello(4096, "", RemoteBuffer(0, 1 << 20, 1)).pack(), "ring at address 0"),
    ],
)
def test_malformed_hello_announcements_are_refused(data: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        Hello.unpack(data)


def test_a_protocol_name_is_bounded() -> None:
    with pytest.raises(ValueError, match="exceeds 32 bytes"):
        Hello(4096, "x" * (MAX_PROTOCOL + 1)).pack()
