"""Kept registrations of the application's buffers (lab device, asyncio and uvloop)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator

import pytest

import aiordma
from aiordma import Access
from aiordma.channel.channel import MessageChannel
from aiordma.channel.open import prepare_channel
from tests.channel.test_channel import _payload, _recording_registrations, channel_to, echo
from tests.conftest import Lab, start_peer_server

SIZE = 512 << 10
"""Above the medium limit: these messages go by rendezvous."""


@pytest.fixture(scope="module")
def checksum_server(lab: Lab) -> Iterator[int]:
    yield from start_peer_server(lab, "checksums")


def _holding(registered: list[object], buffer: object) -> int:
    return sum(1 for obj in registered if obj is buffer)


@pytest.mark.asyncio
async def test_a_buffer_received_into_again_keeps_its_registration_until_forgotten(
    lab: Lab,
) -> None:
    async with channel_to(lab, echo) as channel:
        registered = _recording_registrations(channel.conn)
        target = bytearray(SIZE)
        for i in range(4):
            await channel.send_message(_payload(i, SIZE))
            assert await asyncio.wait_for(channel.recv_message_into(target), 60) == SIZE
            assert target == _payload(i, SIZE)
        # Registered for the first message only, kept from the second on.
        assert _holding(registered, target) == 2
        stats = channel.stats()
        assert stats["counters"]["registrations_reused"] == 2
        assert stats["gauges"]["kept_registrations"] == 1
        assert stats["gauges"]["kept_bytes"] == SIZE
        with pytest.raises(BufferError):  # its export is held while it is kept
            target.extend(b"x")
        assert channel.forget_buffer(target)
        assert not channel.forget_buffer(target)
        target.extend(b"x")
        assert channel.stats()["gauges"]["kept_registrations"] == 0


@pytest.mark.asyncio
async def test_a_slice_of_a_kept_buffer_is_received_into_without_registering(lab: Lab) -> None:
    async with channel_to(lab, echo) as channel:
        registered = _recording_registrations(channel.conn)
        whole = bytearray(2 * SIZE)
        for i in range(2):
            await channel.send_message(_payload(i, 2 * SIZE))
            assert await asyncio.wait_for(channel.recv_message_into(whole), 60) == 2 * SIZE
        before = len(registered)
        await channel.send_message(_payload(7, SIZE))
        view = memoryview(whole)[SIZE:]
        assert await asyncio.wait_for(channel.recv_message_into(view), 60) == SIZE
        assert whole[SIZE:] == _payload(7, SIZE)
        assert whole[:SIZE] == _payload(1, 2 * SIZE)[:SIZE]
        assert len(registered) == before + 1  # the echo's exposure of its copy, not ours
        view.release()
        channel.forget_buffer(whole)


@pytest.mark.asyncio
async def test_without_a_registration_cache_every_large_receive_registers(lab: Lab) -> None:
    async with channel_to(lab, echo, registration_cache=0) as channel:
        registered = _recording_registrations(channel.conn)
        target = bytearray(SIZE)
        for i in range(3):
            await channel.send_message(_payload(i, SIZE))
            assert await asyncio.wait_for(channel.recv_message_into(target), 60) == SIZE
            assert target == _payload(i, SIZE)
        assert _holding(registered, target) == 3
        assert channel.stats()["gauges"]["kept_registrations"] == 0
        target.extend(b"x")  # nothing holds it


@pytest.mark.asyncio
async def test_kept_registrations_stay_under_the_capacity(lab: Lab) -> None:
    capacity = SIZE + SIZE // 2
    async with channel_to(lab, echo, registration_cache=capacity) as channel:
        first, second = bytearray(SIZE), bytearray(SIZE)
        for i, target in enumerate((first, first, second, second, first)):
            await channel.send_message(_payload(i, SIZE))
            assert await asyncio.wait_for(channel.recv_message_into(target), 60) == SIZE
            assert target == _payload(i, SIZE)
            assert channel.stats()["gauges"]["kept_bytes"] <= capacity
        # ``second`` evicted ``first``, which then was seen once more only.
        assert channel.stats()["gauges"]["kept_registrations"] == 1
        first.extend(b"x")
        with pytest.raises(BufferError):
            second.extend(b"x")


@pytest.mark.asyncio
async def test_a_buffer_sent_again_is_exposed_through_windows_over_a_local_registration(
    lab: Lab, checksum_server: int
) -> None:
    async with await aiordma.connect(lab.addr, checksum_server, prepare=prepare_channel) as conn:
        channel: MessageChannel = conn.prepared
        if not conn.device.attributes.memory_windows:
            pytest.skip("the device has no memory windows")
        registered = _recording_registrations(conn)
        exposed: list[object] = []
        channel._exposures.watchers.append(lambda exposure: exposed.append(exposure.key))
        source = bytearray(SIZE)
        for i in range(3):
            source[:] = _payload(i, SIZE)  # what the peer reads is what is there now
            await asyncio.wait_for(channel.send_message(source), 60)
            digest = await asyncio.wait_for(channel.recv_message(), 60)
            assert digest == hashlib.sha256(_payload(i, SIZE)).digest()
        first, second, third = exposed
        assert isinstance(first, aiordma.MemoryRegion)  # seen once: its own registration
        assert first.access == Access.REMOTE_READ
        assert first.closed
        assert isinstance(second, aiordma.MemoryWindow)
        assert isinstance(third, aiordma.MemoryWindow)
        kept = second.segment.mr
        assert third.segment.mr is kept
        # The kept registration grants nothing remote; each window covered the
        # message's bytes and was revoked at DONE.
        assert kept.access == Access.MW_BIND
        assert (kept.addr, kept.length) == (second.remote.addr, SIZE)
        assert second.remote.rkey != kept.rkey
        assert not second.valid
        assert not third.valid
        assert [obj is source for obj in registered] == [True, True]
        assert channel.stats()["counters"]["registrations_reused"] == 1
        assert channel.forget_buffer(source)
        assert kept.closed
