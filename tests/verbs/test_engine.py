"""The work engine's quick paths: a single awaited verb checked, posted and
resolved in one call (lab device)."""

from __future__ import annotations

import asyncio

import pytest

import aiordma
from aiordma import Access, Opcode, Send
from aiordma.verbs._engine import ID_BLOCK
from tests.conftest import Pair


@pytest.mark.asyncio
@pytest.mark.usefixtures("recording")
async def test_quick_and_checked_paths_resolve_alike_and_are_counted_alike(
    device: aiordma.Device, pair: Pair
) -> None:
    a, b = pair
    inbox = device.alloc(64)
    out = device.register(bytearray(b"x" * 32))
    results = []
    for local in (out, out[:16], [out[:8], out[8:16]]):  # region and segment quick; a list checked
        (arrived,) = await b.post_recv_batch([inbox])
        results.append(await a.post_send(local))
        assert (await asyncio.wait_for(arrived, 10)).byte_len in (32, 16)
    assert [(r.opcode, r.byte_len, r.qp_num) for r in results] == [
        (Opcode.SEND, 32, a.qp_num), (Opcode.SEND, 16, a.qp_num), (Opcode.SEND, 16, a.qp_num),
    ]  # fmt: skip
    assert len({r.wr_id for r in results}) == 3
    stats = a.stats()
    assert stats["counters"]["ops:send"] == 3
    assert stats["latency"]["send"]["count"] == 3
    assert b.stats()["counters"]["ops:recv"] == 3
    assert out.inflight == inbox.inflight == 0


@pytest.mark.asyncio
@pytest.mark.usefixtures("recording")
async def test_a_list_of_plain_sends_resolves_as_the_checked_path_does(
    device: aiordma.Device, pair: Pair
) -> None:
    """Plain sends in one call (unsignalled ones settled by the signalled
    last, immediate data carried); anything not plain in the list sends the
    whole list the checked way, which works the same."""
    a, b = pair
    inbox = device.alloc(64 * 8)
    out = device.register(bytearray(b"y" * 64))
    slots = [inbox[i * 64 : (i + 1) * 64] for i in range(8)]
    quick = [Send(out[:8], signaled=False), Send(out, imm=7), Send(out[:1])]
    checked = [Send(out[:8], signaled=False), Send(out, imm=7), Send([out[:1]])]  # a list: checked
    for batch in (quick, checked):
        arrivals = await b.post_recv_batch(slots[:3])
        sent = await asyncio.wait_for(asyncio.gather(*await a.post_batch(batch)), 10)
        assert [wc.opcode for wc in sent] == [Opcode.SEND] * 3
        got = await asyncio.wait_for(asyncio.gather(*arrivals), 10)
        assert [(wc.byte_len, wc.imm_data) for wc in got] == [(8, None), (64, 7), (1, None)]
        assert len({wc.wr_id for wc in sent}) == 3
    assert a.stats()["counters"]["ops:batched"] == 6
    assert out.inflight == inbox.inflight == 0
    closed = device.alloc(8)
    closed.close()
    with pytest.raises(aiordma.ResourceClosedError):
        await a.post_batch([Send(out), Send(closed)])  # the checked path names it
    with pytest.raises(ValueError, match="32 bits"):
        await a.post_batch([Send(out, imm=1 << 32)])
    assert a.pending == 0
    assert out.inflight == 0


@pytest.mark.asyncio
async def test_a_cancelled_quick_read_keeps_its_region_busy_until_it_completes(
    device: aiordma.Device, pair: Pair
) -> None:
    a, _ = pair
    source = device.register(bytearray(b"r" * 64), Access.REMOTE_READ)
    local = device.alloc(64)
    task = asyncio.ensure_future(a.rdma_read(local, source.remote()))
    await asyncio.sleep(0)  # posted: the task now awaits the completion
    assert local.inflight == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(local.aclose(), 10)  # waits for the completion, then deregisters
    assert local.closed
    assert a.pending == 0


@pytest.mark.asyncio
async def test_work_request_ids_stay_unique_past_a_block(
    device: aiordma.Device, pair: Pair
) -> None:
    a, _ = pair
    target = device.alloc(8, Access.REMOTE_WRITE)
    src = device.alloc(8)
    seen = set()
    for _ in range(ID_BLOCK + 2):
        seen.add((await a.rdma_write(src, target.remote())).wr_id)
    assert len(seen) == ID_BLOCK + 2
    assert a.pending == 0


@pytest.mark.asyncio
async def test_what_the_quick_path_passes_over_the_checked_path_refuses_by_name(
    device: aiordma.Device, pair: Pair
) -> None:
    a, _ = pair
    other = aiordma.Device(device.name)
    try:
        foreign = other.alloc(8)
        with pytest.raises(ValueError, match="another Device"):
            await a.post_send(foreign)
        with pytest.raises(ValueError, match="another Device"):
            await a.post_recv_batch([foreign])
    finally:
        other.close()
    with pytest.raises(TypeError, match="RemoteBuffer"):
        await a.rdma_write(device.alloc(8), (0, 8, 0))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="do not fit"):
        await a.rdma_read(device.alloc(16), device.alloc(8, Access.REMOTE_READ).remote())
    with pytest.raises(ValueError, match="LOCAL_WRITE"):
        await a.rdma_read(device.register(b"ro"), device.alloc(8, Access.REMOTE_READ).remote())
    closed = device.alloc(8)
    closed.close()
    with pytest.raises(aiordma.ResourceClosedError):
        await a.post_send(closed)
    assert a.pending == 0


@pytest.mark.asyncio
async def test_a_full_send_queue_makes_a_single_verb_wait_its_turn(device: aiordma.Device) -> None:
    a, b = await aiordma.connect_loopback_pair(
        device, aiordma.QueuePairOptions(send_depth=1, recv_depth=4)
    )
    try:
        target = device.alloc(8, Access.REMOTE_WRITE)
        src = device.alloc(8)
        both = await asyncio.wait_for(
            asyncio.gather(a.rdma_write(src, target.remote()), a.rdma_write(src, target.remote())),
            10,
        )
        assert [wc.opcode for wc in both] == [Opcode.RDMA_WRITE, Opcode.RDMA_WRITE]
    finally:
        a.close()
        b.close()
        await asyncio.gather(a.wait_closed(), b.wait_closed())
