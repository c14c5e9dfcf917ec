"""Memory windows on rxe: access through a window, and its revocation."""

from __future__ import annotations

import gc

import pytest

import aiordma
from aiordma import Access
from tests.conftest import Pair, rdma_counts

BIND = Access.LOCAL_WRITE | Access.MW_BIND


@pytest.mark.asyncio
async def test_write_through_a_window_until_it_is_invalidated(
    device: aiordma.Device, pair: Pair
) -> None:
    owner, peer = pair
    target = device.alloc(4096, BIND)
    window = await owner.bind_window(target[1024:2048], Access.REMOTE_WRITE | Access.REMOTE_READ)
    assert window.valid
    assert window.type == device.attributes.memory_windows
    assert window.remote.addr == target.addr + 1024
    assert window.remote.length == 1024
    assert window.remote.rkey != target.rkey

    source = device.alloc(64)
    source.view()[:5] = b"hello"
    await peer.rdma_write(source[:5], window.remote[10:15])
    assert bytes(target.view()[1034:1039]) == b"hello"
    await peer.rdma_read(source[10:15], window.remote[10:15])
    assert bytes(source.view()[10:15]) == b"hello"

    window.invalidate()
    assert not window.valid
    window.invalidate()  # idempotent
    with pytest.raises(aiordma.RemoteAccessError):
        await peer.rdma_write(source[:5], window.remote[20:25])
    assert bytes(target.view()[1044:1049]) == bytes(5)  # nothing landed


@pytest.mark.asyncio
async def test_window_bounds_are_enforced_where_the_device_says_so(
    device: aiordma.Device, pair: Pair
) -> None:
    """A window's rkey reaches only the window's bytes, except on rxe, whose
    responder checks the range against the region (``check_rkey`` in
    ``rxe_resp.c``): ``bounded_windows`` says which, and the channel relies
    on windows for exposures only where it is True or the window is the
    whole region."""
    owner, peer = pair
    target = device.alloc(4096, BIND)
    target.view()[:4096] = bytes(range(256)) * 16
    local = device.alloc(4096)
    window = await owner.bind_window(target[256:512])  # REMOTE_READ by default
    await peer.rdma_read(local[:256], window.remote)
    assert bytes(local.view()[:256]) == bytes(target.view()[256:512])
    beyond = aiordma.RemoteBuffer(window.remote.addr, 512, window.remote.rkey)
    if device.attributes.bounded_windows:
        with pytest.raises(aiordma.RemoteAccessError):
            await peer.rdma_read(local[:512], beyond)
    else:
        assert device.attributes.vendor_id == 0xFFFFFF  # rxe
        await peer.rdma_read(local[:512], beyond)
        assert bytes(local.view()[:512]) == bytes(target.view()[256:768])


@pytest.mark.asyncio
async def test_a_read_window_refuses_writes(device: aiordma.Device, pair: Pair) -> None:
    owner, peer = pair
    target = device.alloc(4096, BIND)
    window = await owner.bind_window(target, Access.REMOTE_READ)
    with pytest.raises(aiordma.RemoteAccessError):
        await peer.rdma_write(device.register(b"nope"), window.remote[:4])
    assert bytes(target.view()[:4]) == bytes(4)


@pytest.mark.asyncio
async def test_a_type_2_window_works_only_through_its_queue_pair(device: aiordma.Device) -> None:
    if device.attributes.memory_windows != 2:
        pytest.fail(f"{device.name} has no type 2 windows; rxe has")
    owner, peer = await aiordma.connect_loopback_pair(device)
    other, stranger = await aiordma.connect_loopback_pair(device)
    try:
        target = device.alloc(4096, BIND)
        window = await owner.bind_window(target, Access.REMOTE_READ)
        local = device.alloc(64)
        await peer.rdma_read(local[:8], window.remote[:8])
        # Same device, same protection domain, another connection: refused.
        with pytest.raises(aiordma.RemoteAccessError):
            await stranger.rdma_read(local[:8], window.remote[:8])
    finally:
        for qp in (owner, peer, other, stranger):
            qp.close()
            await qp.wait_closed()


@pytest.mark.asyncio
async def test_closing_the_region_or_the_queue_pair_revokes_its_windows(
    device: aiordma.Device,
) -> None:
    before = rdma_counts(device.name)
    owner, peer = await aiordma.connect_loopback_pair(device)
    region, other = device.alloc(4096, BIND), device.alloc(4096, BIND)
    by_region = await owner.bind_window(region[:100])
    by_qp = await owner.bind_window(other[:100])
    region.close()
    assert not by_region.valid
    assert by_qp.valid
    owner.close()
    await owner.wait_closed()
    assert not by_qp.valid  # a type 2 window would otherwise keep the QP alive in the kernel
    peer.close()
    await peer.wait_closed()
    other.close()
    del by_region, by_qp
    gc.collect()
    after = rdma_counts(device.name)
    assert (after["qp"], after["mr"]) == (before["qp"], before["mr"])


@pytest.mark.asyncio
async def test_what_cannot_be_bound_is_refused_before_posting(
    device: aiordma.Device, pair: Pair
) -> None:
    owner, peer = pair
    plain = device.alloc(4096)  # no MW_BIND
    with pytest.raises(ValueError, match="MW_BIND"):
        await owner.bind_window(plain)
    bindable = device.alloc(4096, BIND)
    with pytest.raises(ValueError, match="remote access only"):
        await owner.bind_window(bindable, Access.LOCAL_WRITE)
    with pytest.raises(ValueError, match="at least one byte"):
        await owner.bind_window(bindable[10:10])
    with pytest.raises(TypeError, match="MemoryRegion or Segment"):
        await owner.bind_window(bytearray(10))  # type: ignore[arg-type]
    read_only = device.register(b"x" * 64, Access.MW_BIND)
    with pytest.raises(ValueError, match="LOCAL_WRITE"):
        await owner.bind_window(read_only, Access.REMOTE_WRITE)
    async with aiordma.Device(device.name) as elsewhere:
        foreign = elsewhere.alloc(64, BIND)
        with pytest.raises(ValueError, match="not registered on"):
            await owner.bind_window(foreign)
    closed = device.alloc(64, BIND)
    closed.close()
    with pytest.raises(ValueError, match="closed"):
        await owner.bind_window(closed)
    # None of that disturbed the queue pair.
    window = await owner.bind_window(bindable[:8], Access.REMOTE_READ)
    await peer.rdma_read(device.alloc(8)[:8], window.remote)
