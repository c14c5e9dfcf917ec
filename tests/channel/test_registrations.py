"""Kept registrations of the application's buffers.

Which buffers are kept (second use of the same live object, LRU under the
capacity) is pure logic tested on the host with a recording registrar; what
the channel does with them runs on the lab device (asyncio and uvloop).
"""

from __future__ import annotations

import array
import asyncio
import hashlib
import weakref

import pytest

import aiordma
from aiordma import Access
from aiordma.channel.channel import MessageChannel
from aiordma.channel.open import prepare_channel
from aiordma.channel.registrations import RegistrationCache
from aiordma.verbs.memory import buffer_span
from tests.channel.test_channel import _payload, _recording_registrations, channel_to, echo
from tests.conftest import Lab

SIZE = 512 << 10
"""Above the medium limit: these messages go by rendezvous."""


class _Region:
    """What the cache needs of a registration (the host has no device)."""

    def __init__(self, obj: object, access: Access) -> None:
        self.obj, self.access = obj, access
        self.addr, self.length = buffer_span(obj)
        self.closed = False
        self.bound_windows = 0

    def segment(self, offset: int, length: int) -> tuple[_Region, int, int]:
        return (self, offset, length)

    def close(self) -> None:
        self.closed = True


class _Registrar:
    def __init__(self) -> None:
        self.made: list[_Region] = []

    def register(self, obj: object, access: Access) -> _Region:
        self.made.append(_Region(obj, access))
        return self.made[-1]


def _cache(capacity: int = 1 << 20) -> tuple[RegistrationCache, _Registrar]:
    registrar = _Registrar()
    return RegistrationCache(registrar, Access.LOCAL_WRITE, capacity), registrar  # type: ignore[arg-type]


def test_a_new_buffer_per_message_is_never_kept() -> None:
    cache, registrar = _cache()
    for _ in range(50):
        assert cache.segment_for(bytearray(4096)) is None
    assert registrar.made == []
    assert len(cache) == 0


def test_the_same_buffer_is_kept_from_its_second_use_and_found_by_any_view_inside() -> None:
    cache, registrar = _cache()
    buffer = bytearray(8192)
    assert cache.segment_for(buffer) is None
    kept = cache.segment_for(buffer)
    assert kept is not None
    (region,) = registrar.made
    assert kept == (region, 0, 8192)  # type: ignore[comparison-overlap]
    assert region.access == Access.LOCAL_WRITE
    inside = cache.segment_for(memoryview(buffer)[4096:6000])
    assert inside == (region, 4096, 1904)  # type: ignore[comparison-overlap]
    assert registrar.made == [region]
    assert cache.kept_bytes == 8192


def test_a_remembered_buffer_is_let_go_once_the_application_drops_it() -> None:
    cache, _ = _cache()
    buffer = array.array("b", bytes(4096))
    gone = weakref.ref(buffer)
    assert cache.segment_for(buffer) is None
    del buffer
    assert gone() is not None  # remembered until the next message
    assert cache.segment_for(bytearray(10)) is None
    assert gone() is None


def test_the_least_recently_used_go_first_once_over_the_capacity() -> None:
    cache, registrar = _cache(capacity=3 * 4096)
    buffers = [bytearray(4096) for _ in range(4)]
    for buffer in buffers[:3]:
        cache.segment_for(buffer)
        cache.segment_for(buffer)
    cache.segment_for(buffers[0])  # the first is used again: the second is oldest now
    cache.segment_for(buffers[3])
    cache.segment_for(buffers[3])
    assert [region.closed for region in registrar.made] == [False, True, False, False]
    assert cache.kept_bytes == 3 * 4096
    assert not cache.forget(buffers[1])
    assert cache.forget(memoryview(buffers[2])[:10])  # any view of it
    assert registrar.made[2].closed


def test_a_registration_a_window_still_uses_is_released_when_the_window_goes() -> None:
    cache, registrar = _cache()
    buffer = bytearray(4096)
    cache.segment_for(buffer)
    cache.segment_for(buffer)
    (region,) = registrar.made
    region.bound_windows = 1
    cache.clear()
    assert not region.closed
    region.bound_windows = 0
    cache.unbound(region)  # type: ignore[arg-type]
    assert region.closed


def test_a_capacity_of_zero_keeps_nothing() -> None:
    cache, registrar = _cache(capacity=0)
    buffer = bytearray(4096)
    for _ in range(3):
        assert cache.segment_for(buffer) is None
    assert registrar.made == []


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
        channel.watch_exposures(exposed.append)
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
