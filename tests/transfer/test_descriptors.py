"""Descriptor lists: making, slicing, joining, packing (no device)."""

from __future__ import annotations

from array import array

import pytest

from aiordma.exceptions import ProtocolError
from aiordma.transfer.descriptors import Descriptor, DescriptorList, RegionInfo
from aiordma.verbs.memory import RemoteBuffer

READ_WRITE = 0x1 | 0x2 | 0x4  # LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ
A = RegionInfo(0x10000, 4096, lkey=11, rkey=21, access=READ_WRITE)
B = RegionInfo(0x90000, 8192, lkey=12, rkey=22, access=READ_WRITE)


def spans(region: RegionInfo, *pairs: tuple[int, int], agent: int = 7) -> DescriptorList:
    return DescriptorList.spans(agent, region, pairs)


def test_spans_name_their_blocks_with_the_local_key() -> None:
    dl = spans(A, (0, 100), (512, 64))
    assert len(dl) == 2
    assert dl.nbytes == 164
    assert dl[0] == Descriptor(0x10000, 100, 11)
    assert dl[1] == Descriptor(0x10200, 64, 11)


@pytest.mark.parametrize(
    ("pair", "message"),
    [
        ((4000, 200), "outside its region"),
        ((-1, 8), "must not be negative"),
        ((0, -5), "must not be negative"),
    ],
)
def test_spans_outside_or_negative_are_refused(pair: tuple[int, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        spans(A, (0, 8), pair)


def test_slices_take_and_joins() -> None:
    a = spans(A, *[(64 * i, 64) for i in range(10)])
    b = spans(B, (0, 8192))
    assert [d.addr for d in a[2:4]] == [A.base + 128, A.base + 192]
    assert [d.addr for d in a.take([9, 0, 5])] == [A.base + 576, A.base, A.base + 320]
    with pytest.raises(IndexError):
        a.take([10])
    joined = a[:2] + b
    assert len(joined) == 3
    assert joined.regions == (A, B)
    assert joined[2] == Descriptor(B.base, 8192, 12)
    assert (joined + b).regions == (A, B)
    assert len(joined + b) == 4
    with pytest.raises(ValueError, match="same agent"):
        a + spans(B, (0, 1), agent=8)


def test_packed_form_round_trips_with_rkeys() -> None:
    dl = spans(A, (0, 100), (200, 300)) + spans(B, (4096, 4096))
    data = dl.to_bytes()
    assert len(data) == 24 + 2 * 24 + 20 * 3
    back = DescriptorList.from_bytes(data)
    assert back.remote
    assert back.agent == 7
    assert list(back) == [(A.base, 100, 21), (A.base + 200, 300, 21), (B.base + 4096, 4096, 22)]
    assert back[1:].to_bytes() == DescriptorList.from_bytes(back[1:].to_bytes()).to_bytes()


def test_local_only_regions_do_not_pack() -> None:
    local = RegionInfo(0x1000, 64, lkey=1, rkey=0, access=0x1)
    with pytest.raises(ValueError, match="local access only"):
        spans(local, (0, 8)).to_bytes()


def test_malformed_packed_lists_are_protocol_errors() -> None:
    good = spans(A, (0, 100)).to_bytes()
    with pytest.raises(ProtocolError, match="at least"):
        DescriptorList.from_bytes(good[:10])
    with pytest.raises(ProtocolError, match="magic"):
        DescriptorList.from_bytes(b"XXXX" + good[4:])
    with pytest.raises(ProtocolError, match="bytes, got"):
        DescriptorList.from_bytes(good + b"\0")
    outside = bytearray(good)
    outside[-12:-4] = (5000).to_bytes(8, "little")  # the block's length, past the region
    with pytest.raises(ProtocolError, match="outside its region"):
        DescriptorList.from_bytes(bytes(outside))


def test_lists_check_their_arrays() -> None:
    with pytest.raises(ValueError, match="one address, length and region"):
        DescriptorList(1, (A,), array("Q", [A.base]), array("Q"), array("I", [0]))
    with pytest.raises(ValueError, match="names region 1 of 1"):
        DescriptorList(1, (A,), array("Q", [A.base]), array("Q", [1]), array("I", [1]))


def test_split_carves_each_block() -> None:
    whole = spans(A, (0, 4096)) + spans(B, (0, 1000))
    parts = whole.split(1024)
    assert [(d.addr - (A.base if d.key == 11 else B.base), d.length) for d in parts] == [
        (0, 1024), (1024, 1024), (2048, 1024), (3072, 1024), (0, 1000)]  # fmt: skip
    with pytest.raises(ValueError, match="positive"):
        whole.split(0)


def test_unpacking_what_is_not_bytes_names_the_argument() -> None:
    """Issue 62 (the transfer guide promises it)."""
    with pytest.raises(TypeError, match="data must be bytes, not str: encode it"):
        DescriptorList.from_bytes("blocks")  # type: ignore[arg-type]
    not_bytes = r"data must be bytes \(or a bytearray or memoryview\), not None"
    with pytest.raises(TypeError, match=not_bytes):
        DescriptorList.from_bytes(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=not_bytes):
        RemoteBuffer.from_bytes(None)  # type: ignore[arg-type]
