"""Packet lanes: fixed send and receive slots on real RC queue pairs (lab device)."""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

import aiordma
from aiordma import QueuePair
from aiordma.verbs._lane import PacketLane
from tests.conftest import Pair

SLOT = 64


@dataclass
class Owner:
    """Records what a lane reports, and lets a test await it."""

    sent: list[int] = field(default_factory=list)
    arrived: list[tuple[int, int]] = field(default_factory=list)
    failed: list[BaseException] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def on_sent(self, slot: int) -> None:
        self.sent.append(slot)
        self.changed.set()

    def on_arrived(self, slot: int, length: int) -> None:
        self.arrived.append((slot, length))
        self.changed.set()

    def on_failed(self, error: BaseException) -> None:
        self.failed.append(error)
        self.changed.set()

    async def until(self, done: Callable[[], bool], what: str) -> None:
        """Wait (at most 10 s) until ``done()`` holds."""
        async with asyncio.timeout(10):
            while not done():
                self.changed.clear()
                await self.changed.wait()
        assert done(), what


def _lane(
    device: aiordma.Device, qp: QueuePair, sends: int, recvs: int
) -> tuple[PacketLane, Owner, aiordma.MemoryRegion, aiordma.MemoryRegion]:
    owner = Owner()
    send_mr, recv_mr = device.alloc(sends * SLOT), device.alloc(max(1, recvs) * SLOT)
    lane = qp.open_lane(
        send_mr, sends, recv_mr, recvs, SLOT, owner.on_sent, owner.on_arrived, owner.on_failed
    )
    return lane, owner, send_mr, recv_mr


async def _close(*qps: QueuePair) -> None:
    for qp in qps:
        qp.close()
        await asyncio.wait_for(qp.wait_closed(), 10)


@pytest.mark.asyncio
@pytest.mark.both_loops("completion fd")
async def test_packets_go_from_send_slots_into_receive_slots(
    device: aiordma.Device, pair: Pair
) -> None:
    a, b = pair
    lane_a, sender, out, _ = _lane(device, a, sends=4, recvs=0)
    lane_b, receiver, _, inbox = _lane(device, b, sends=2, recvs=4)
    for slot in range(4):
        lane_b.recv(slot)
    assert inbox.inflight == 1  # held once, for the lane's life
    assert b.pending == 4
    for slot in range(3):
        out.view()[slot * SLOT : slot * SLOT + 5] = f"pkt-{slot}".encode()
        lane_a.send(slot, 5 + slot)
    await receiver.until(lambda: len(receiver.arrived) == 3, "three packets arrived")
    assert receiver.arrived == [(0, 5), (1, 6), (2, 7)]  # in order, into the slots posted first
    for slot in range(3):
        assert bytes(inbox.view()[slot * SLOT : slot * SLOT + 5]) == f"pkt-{slot}".encode()
    # Signalled every second send: the third is reported only by a later one.
    await sender.until(lambda: sender.sent[:2] == [0, 1], "the first two reported sent")
    lane_a.send(3, 1)
    await sender.until(lambda: len(sender.sent) == 4, "the third is settled by the fourth")
    assert sender.sent == [0, 1, 2, 3]
    assert receiver.arrived[3] == (3, 1)
    assert receiver.failed == sender.failed == []


@pytest.mark.asyncio
async def test_held_sends_go_as_one_chain_at_flush(device: aiordma.Device) -> None:
    options = aiordma.QueuePairOptions(send_depth=4, recv_depth=4)
    a, b = await aiordma.connect_loopback_pair(device, options)
    lane_a, sender, out, _ = _lane(device, a, sends=4, recvs=0)
    lane_b, receiver, _, inbox = _lane(device, b, sends=1, recvs=4)
    for slot in range(4):
        lane_b.recv(slot)
    assert lane_a.flush() == 0  # nothing held: nothing posted
    lane_a.hold()
    for slot in range(4):
        out.view()[slot * SLOT : slot * SLOT + 5] = f"pkt-{slot}".encode()
        lane_a.send(slot, 5 + slot)
    assert not lane_a.send_room()  # staged sends hold their room in the send queue
    assert lane_a.flush() == 0
    await receiver.until(lambda: len(receiver.arrived) == 4, "four packets arrived")
    assert receiver.arrived == [(0, 5), (1, 6), (2, 7), (3, 8)]
    for slot in range(4):
        assert bytes(inbox.view()[slot * SLOT : slot * SLOT + 5]) == f"pkt-{slot}".encode()
    await sender.until(lambda: len(sender.sent) == 4, "all four reported sent")
    assert sender.sent == [0, 1, 2, 3]
    lane_b.recv(0)
    lane_a.send(0, 1)  # not held any more: posted at once
    await receiver.until(lambda: len(receiver.arrived) == 5, "a fifth, unheld")
    assert receiver.failed == sender.failed == []
    await _close(a, b)


class _Refusing:
    """A queue pair's driver whose chains the provider takes only the first
    ``take`` requests of (ENOMEM for the rest)."""

    def __init__(self, driver: Any, take: int) -> None:
        self._driver = driver
        self._take = take

    def __getattr__(self, name: str) -> Any:
        return getattr(self._driver, name)

    def post_send_list(self, ids: list[int], flags: list[int], addrs: list[int],
                       lengths: list[int], lkey: int) -> tuple[int, int]:  # fmt: skip
        n = self._take
        rc, posted = self._driver.post_send_list(ids[:n], flags[:n], addrs[:n], lengths[:n], lkey)
        assert (rc, posted) == (0, n)
        return errno.ENOMEM, n


@pytest.mark.asyncio
async def test_a_chain_refused_in_part_undoes_what_did_not_go(device: aiordma.Device) -> None:
    """The slots after the refused request are named and not posted; what
    went completes as usual, and the queue pair still closes promptly (no
    completion is awaited for what never went)."""
    a, b = await aiordma.connect_loopback_pair(device)
    engine = a._engine
    engine.driver = _Refusing(engine.driver, take=1)
    lane_a, sender, _, _ = _lane(device, a, sends=4, recvs=0)
    lane_b, receiver, _, _ = _lane(device, b, sends=1, recvs=4)
    for slot in range(4):
        lane_b.recv(slot)
    lane_a.hold()
    for slot in (2, 0, 3):
        lane_a.send(slot, 1)
    assert lane_a.flush() == errno.ENOMEM
    assert lane_a.unposted == [0, 3]
    assert lane_a.send_room()  # their room in the send queue is back
    await receiver.until(lambda: len(receiver.arrived) == 1, "the one that went arrived")
    for slot in (1, 0):  # the second is signalled (the run restarted): it settles all three
        lane_a.send(slot, 1)
    await sender.until(lambda: len(sender.sent) == 3, "what went reported sent")
    assert sender.sent == [2, 1, 0]  # once each, in order
    await asyncio.wait_for(_close(a, b), 10)
    assert sender.failed == []


@pytest.mark.asyncio
async def test_a_lane_refuses_slots_outside_it_and_closed_regions(
    device: aiordma.Device, pair: Pair
) -> None:
    a, b = pair
    lane, _, _, _ = _lane(device, a, sends=2, recvs=1)
    with pytest.raises(ValueError, match="send slot 2"):
        lane.send(2, 1)
    with pytest.raises(ValueError, match="send slot 0 of 65 bytes"):
        lane.send(0, SLOT + 1)
    with pytest.raises(ValueError, match="receive slot 1"):
        lane.recv(1)
    closed = device.alloc(SLOT)
    closed.close()
    with pytest.raises(aiordma.ResourceClosedError):
        b.open_lane(closed, 1, None, 0, SLOT, print, print, print)
    with pytest.raises(ValueError, match="inside its regions"):
        b.open_lane(device.alloc(SLOT), 2, None, 0, SLOT, print, print, print)
    with pytest.raises(ValueError, match="LOCAL_WRITE"):
        b.open_lane(device.alloc(SLOT), 1, device.register(b"x" * SLOT), 1, SLOT, print,
                    print, print)  # fmt: skip


@pytest.mark.asyncio
async def test_a_lane_shares_the_send_queue(device: aiordma.Device) -> None:
    options = aiordma.QueuePairOptions(send_depth=2, recv_depth=4)
    a, b = await aiordma.connect_loopback_pair(device, options)
    lane_a, sender, _, _ = _lane(device, a, sends=4, recvs=0)
    lane_b, receiver, _, _ = _lane(device, b, sends=1, recvs=4)
    for slot in range(4):
        lane_b.recv(slot)
    with pytest.raises(aiordma.ResourceBusyError, match="receive queue"):
        _lane(device, b, sends=1, recvs=1)  # the lane holds the whole receive queue
    lane_a.send(0, 1)
    lane_a.send(1, 1)
    assert not lane_a.send_room()
    with pytest.raises(aiordma.ResourceBusyError, match="send queue is full"):
        lane_a.send(2, 1)
    await sender.until(lambda: len(sender.sent) == 2, "both sends reported")
    assert lane_a.send_room()
    await receiver.until(lambda: len(receiver.arrived) == 2, "both arrived")
    await _close(a, b)


@pytest.mark.asyncio
@pytest.mark.both_loops("close")
async def test_closing_flushes_a_lane_and_frees_its_regions(device: aiordma.Device) -> None:
    a, b = await aiordma.connect_loopback_pair(device)
    lane, owner, out, inbox = _lane(device, b, sends=2, recvs=3)
    for slot in range(3):
        lane.recv(slot)
    await _close(b)  # wait_closed returns once the three flushes came
    assert owner.failed
    assert all(isinstance(e, aiordma.ResourceClosedError) for e in owner.failed)
    assert owner.arrived == []
    assert out.inflight == inbox.inflight == 0
    with pytest.raises(aiordma.ResourceClosedError):
        lane.recv(0)
    with pytest.raises(aiordma.ResourceClosedError):
        lane.send(0, 1)
    await _close(a)


@pytest.mark.asyncio
async def test_a_failed_peer_fails_the_lane_with_the_first_error(device: aiordma.Device) -> None:
    a, b = await aiordma.connect_loopback_pair(device)
    lane, owner, _, _ = _lane(device, a, sends=2, recvs=0)
    await _close(b)
    lane.send(0, 1)  # nobody receives it: the transport gives up
    await owner.until(lambda: bool(owner.failed), "the send failed")
    assert isinstance(owner.failed[0], aiordma.RdmaError)
    with pytest.raises(aiordma.QueuePairError):
        lane.send(1, 1)
    await _close(a)
