"""Transfer agents on the lab device: scattered blocks, notes, failures (asyncio and uvloop)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable

import numpy as np
import pytest

from aiordma import (
    Access,
    AuthenticationError,
    MemoryLimitError,
    PresharedKey,
    RemoteAccessError,
    ResourceClosedError,
    TransferError,
    WrongLoopError,
    metrics,
)
from aiordma.transfer import Agent, DescriptorList, start_agent
from benchmarks.studies.transfers import start_target
from tests.conftest import Lab
from tests.transfer.conftest import RW, Pools

TIMEOUT = 60
BLOCK = 4096
BLOCKS = 1000


def pattern(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


@pytest.mark.asyncio
@pytest.mark.both_loops("completion fd")
async def test_scattered_write_of_a_thousand_blocks_then_its_note(
    agents: tuple[Agent, Agent],
) -> None:
    target, source = agents
    pool = target.alloc(BLOCK * BLOCKS * 2, remote=Access.REMOTE_WRITE)
    staging = source.alloc(BLOCK * BLOCKS)
    data = pattern(1, BLOCK * BLOCKS)
    staging.view()[:] = data
    slots = random.Random(2).sample(range(BLOCKS * 2), BLOCKS)  # scattered, in any order
    remote = DescriptorList.from_bytes(pool.blocks(BLOCK).take(slots).to_bytes())
    peer = source.peer(target.metadata())
    async with asyncio.timeout(TIMEOUT):
        await source.write(peer, staging.blocks(BLOCK), remote, notify=b"prefill 1 done")
        note = await target.next_notification(b"prefill 1 done")
    view = pool.view()
    for i, slot in enumerate(slots):  # the note came after every block was in place
        assert view[slot * BLOCK : (slot + 1) * BLOCK] == data[i * BLOCK : (i + 1) * BLOCK]
    assert note.peer.id == source.id
    stats = source.stats()
    assert stats["counters"]["transfers:write"] == 1
    assert stats["counters"]["bytes:write"] == BLOCK * BLOCKS
    assert target.stats()["counters"]["notifications_received"] == 1
    assert target.stats()["gauges"]["exposed_bytes"] == BLOCK * BLOCKS * 2
    exported = {labels.get("agent"): stats for labels, stats in metrics.collect()}
    assert (
        exported[f"{source.id:x}"].counters["bytes:write"] == BLOCK * BLOCKS
    )  # Prometheus sees it


@pytest.mark.asyncio
@pytest.mark.both_loops("completion fd")
async def test_scattered_read_of_a_thousand_blocks(agents: tuple[Agent, Agent]) -> None:
    target, source = agents
    cache = target.alloc(BLOCK * BLOCKS, remote=Access.REMOTE_READ)
    data = pattern(3, BLOCK * BLOCKS)
    cache.view()[:] = data
    wanted = random.Random(4).sample(range(BLOCKS), BLOCKS)
    remote = DescriptorList.from_bytes(cache.blocks(BLOCK).to_bytes()).take(wanted)
    landing = source.alloc(BLOCK * BLOCKS)
    peer = source.peer(target.metadata())
    async with asyncio.timeout(TIMEOUT):
        await source.read(peer, landing.blocks(BLOCK), remote, notify=b"served")
        assert (await target.next_notification()).data == b"served"
    view = landing.view()
    for i, block in enumerate(wanted):
        assert view[i * BLOCK : (i + 1) * BLOCK] == data[block * BLOCK : (block + 1) * BLOCK]


@pytest.mark.asyncio
async def test_bad_lists_are_refused_before_anything_is_posted(
    lab: Lab, pools: Callable[..., Pools]
) -> None:
    target, source, _, mine, remote, peer = pools(BLOCK * 4, BLOCK)
    readonly = target.alloc(BLOCK * 4, remote=Access.REMOTE_READ)
    async with await start_agent() as other:
        foreign = other.alloc(BLOCK * 4)
        others_remote = DescriptorList.from_bytes(
            other.alloc(BLOCK * 4, remote=RW).blocks(BLOCK).to_bytes()
        )
        cases = [
            (foreign.blocks(BLOCK), remote, "this agent's own blocks"),  # another agent's memory
            (mine.blocks(BLOCK), others_remote, "not the peer's"),  # the wrong agent
            (mine.blocks(BLOCK, 3), remote, "3 local blocks cannot pair with 4"),
            (mine.descriptors([(0, 8), (8, 16)]), remote[:2], "descriptor 0: 8 local bytes"),
            (remote, remote, "this agent's own blocks"),
        ]
        for local, far, message in cases:
            with pytest.raises(ValueError, match=message):
                await source.write(peer, local, far)
        read_only = DescriptorList.from_bytes(readonly.blocks(BLOCK).to_bytes())
        with pytest.raises(ValueError, match="does not allow REMOTE_WRITE"):
            await source.write(peer, mine.blocks(BLOCK), read_only)
        with pytest.raises(ValueError, match="outside its region"):
            mine.descriptors([(BLOCK * 4 - 8, 16)])
        with pytest.raises(ValueError, match="must not be negative"):
            mine.descriptors([(0, -1)])
        gone = source.alloc(BLOCK * 4)
        stale = gone.blocks(BLOCK)
        await source.unregister(gone)
        with pytest.raises(ValueError, match="has not registered"):
            await source.write(peer, stale, remote)
    assert not peer.connected  # nothing reached the peer, not even a connection
    assert "transfers:write" not in source.stats()["counters"]


@pytest.mark.asyncio
@pytest.mark.both_loops("cancellation")
async def test_deadline_and_cancel_mid_transfer_leave_both_agents_usable(
    pools: Callable[..., Pools],
) -> None:
    _, source, pool, staging, remote, peer = pools(32 << 20, 1 << 20)
    loop = asyncio.get_running_loop()
    with pytest.raises(TimeoutError):
        await source.write(peer, staging.blocks(1 << 20), remote, deadline=loop.time() + 0.05)
    task = source.start_read(peer, staging.blocks(1 << 20), remote)
    done, _ = await asyncio.wait([task], timeout=0.05)
    assert not done
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert staging.mr.inflight == 0  # returned only once the device was done with the memory
    staging.view()[:4096] = b"x" * 4096
    async with asyncio.timeout(TIMEOUT):
        small = DescriptorList.from_bytes(pool.blocks(4096, 1).to_bytes())
        await source.write(peer, staging.blocks(4096, 1), small)
        await source.read(peer, staging.blocks(4096, 1, offset=8192), small)
    assert pool.view()[:4096] == b"x" * 4096 == staging.view()[8192 : 8192 + 4096]


@pytest.mark.asyncio
async def test_unregister_during_a_peers_read_fails_it_with_a_typed_error(
    agents: tuple[Agent, Agent],
) -> None:
    target, _ = agents
    async with await start_agent(window=1, piece=4096) as source:  # 8,192 reads in turn
        size = 32 << 20
        cache = target.alloc(size, remote=Access.REMOTE_READ)
        spare = target.alloc(4096, remote=Access.REMOTE_READ)
        spare.view()[:] = b"s" * 4096
        landing = source.alloc(size)
        peer = source.peer(target.metadata())
        remote = DescriptorList.from_bytes(cache.blocks(1 << 20).to_bytes())
        task = source.start_read(peer, landing.blocks(1 << 20), remote)
        done, _ = await asyncio.wait([task], timeout=0.05)
        assert not done
        await target.unregister(cache)  # remote access ends now, under the peer's read
        with pytest.raises(TransferError) as info:
            await asyncio.wait_for(task, TIMEOUT)
        assert isinstance(info.value.__cause__, RemoteAccessError)
        assert info.value.index is not None
        assert 0 <= info.value.index < 32  # the 1 MiB block whose read failed first
        assert landing.mr.inflight == 0
        # both agents go on: the next transfer connects again
        async with asyncio.timeout(TIMEOUT):
            await source.read(peer, landing.blocks(4096, 1),
                              DescriptorList.from_bytes(spare.blocks(4096).to_bytes()))  # fmt: skip
        assert landing.view()[:4096] == b"s" * 4096


@pytest.mark.asyncio
async def test_a_killed_peer_fails_its_transfers_promptly(lab: Lab) -> None:
    proc, lines = await asyncio.to_thread(start_target, lab.addr)  # the study's target agent
    try:
        async with await start_agent(window=1, piece=4096) as agent:  # 16,384 reads in turn
            peer = agent.peer(bytes.fromhex(lines["agent"]))
            whole = DescriptorList.from_bytes(bytes.fromhex(lines["whole"]))
            tiny = DescriptorList.from_bytes(bytes.fromhex(lines["tiny"]))
            staging = agent.alloc(whole.nbytes)
            await asyncio.wait_for(agent.read(peer, staging.blocks(64, 1), tiny), TIMEOUT)
            task = agent.start_read(peer, staging.blocks(whole.nbytes), whole)
            done, _ = await asyncio.wait([task], timeout=0.05)
            assert not done
            proc.kill()
            with pytest.raises(TransferError):
                await asyncio.wait_for(task, 10)  # the retry bound is about 0.5 s
            assert staging.mr.inflight == 0
            with pytest.raises((TransferError, ConnectionError)):  # and so does the next one
                await asyncio.wait_for(agent.read(peer, staging.blocks(64, 1), tiny), 10)
    finally:
        proc.kill()
        await asyncio.to_thread(proc.wait)


@pytest.mark.asyncio
async def test_agents_with_a_key_serve_only_agents_that_hold_it(lab: Lab) -> None:
    key, other = PresharedKey(b"k" * 32), PresharedKey(b"o" * 32)
    async with (
        await start_agent(lab.addr, auth=key) as target,
        await start_agent(auth=key) as friend,
        await start_agent(auth=other) as stranger,
    ):
        pool = target.alloc(BLOCK, remote=Access.REMOTE_READ)
        pool.view()[:] = b"k" * BLOCK
        remote = DescriptorList.from_bytes(pool.blocks(BLOCK).to_bytes())
        mine = friend.alloc(BLOCK)
        async with asyncio.timeout(TIMEOUT):
            await friend.read(friend.peer(target.metadata()), mine.blocks(BLOCK), remote)
        assert mine.view()[:] == b"k" * BLOCK
        theirs = stranger.alloc(BLOCK)
        with pytest.raises(AuthenticationError):
            await asyncio.wait_for(
                stranger.read(stranger.peer(target.metadata()), theirs.blocks(BLOCK), remote),
                TIMEOUT,
            )
        assert theirs.view()[:] == bytes(BLOCK)


async def until(done: Callable[[], bool], what: str) -> None:
    """Wait (at most 10 s) until ``done()`` holds: for what the agent does on its
    own after a peer's connection ends, which no public event announces."""
    try:
        async with asyncio.timeout(10):
            while not done():  # noqa: ASYNC110  (agent bookkeeping: no event to await)
                await asyncio.sleep(0.01)
    except TimeoutError:
        pytest.fail(f"not within 10 s: {what}")


@pytest.mark.asyncio
@pytest.mark.both_loops("close")
async def test_next_notification_from_another_loop_is_refused_and_takes_nothing(
    pools: Callable[..., Pools],
) -> None:
    target, source, _, mine, remote, peer = pools(BLOCK, BLOCK, Access.REMOTE_WRITE)
    async with asyncio.timeout(TIMEOUT):
        await source.write(peer, mine.blocks(BLOCK), remote, notify=b"pending-one")
        await source.write(peer, mine.blocks(BLOCK), remote, notify=b"marker")
        await target.next_notification(b"marker")  # one peer's notes come in order

    def elsewhere() -> BaseException | bytes:
        try:
            return asyncio.run(target.next_notification(timeout=2)).data
        except BaseException as exc:
            return exc

    outcome = await asyncio.to_thread(elsewhere)
    assert isinstance(outcome, WrongLoopError), outcome
    with pytest.raises(WrongLoopError):
        await asyncio.to_thread(asyncio.run, source.write(peer, mine.blocks(BLOCK), remote))
    note = await target.next_notification(timeout=TIMEOUT)  # still owed to its own loop
    assert note.data == b"pending-one"


@pytest.mark.asyncio
async def test_peers_are_forgotten_when_their_connections_end(lab: Lab) -> None:
    async with await start_agent(lab.addr) as target:
        pool = target.alloc(BLOCK, remote=Access.REMOTE_WRITE)
        remote = DescriptorList.from_bytes(pool.blocks(BLOCK).to_bytes())
        for i in range(3):
            async with await start_agent() as dialer:
                mine = dialer.alloc(BLOCK)
                async with asyncio.timeout(TIMEOUT):
                    await dialer.write(dialer.peer(target.metadata()), mine.blocks(BLOCK),
                                       remote, notify=b"%d" % i)  # fmt: skip
                    await target.next_notification(b"%d" % i)
                assert target.stats()["gauges"]["peers"] == 1
        await until(
            lambda: target.stats()["gauges"]["known_peers"] == 0, "the listener forgot them"
        )
        assert target.stats()["gauges"]["peers"] == 0
        # and the dialing side forgets a listener that went away, yet reaches it again
        async with await start_agent() as dialer:
            mine = dialer.alloc(BLOCK)
            peer = dialer.peer(target.metadata())
            async with asyncio.timeout(TIMEOUT):
                await dialer.write(peer, mine.blocks(BLOCK), remote, notify=b"hello")
            assert dialer.stats()["gauges"]["peers"] == 1
            note = await target.next_notification(timeout=TIMEOUT)
            note.peer.close()  # the listener drops it: the dialer's channel ends
            await until(lambda: dialer.stats()["gauges"]["known_peers"] == 0,
                        "the dialer forgot the listener")  # fmt: skip
            assert dialer.stats()["gauges"]["peers"] == 0
            async with asyncio.timeout(TIMEOUT):
                await dialer.write(peer, mine.blocks(BLOCK), remote)  # the Peer connects again
            assert dialer.stats()["gauges"]["peers"] == 1


@pytest.mark.asyncio
async def test_empty_and_oversized_blocks_are_refused(pools: Callable[..., Pools]) -> None:
    _, source, _, mine, remote, peer = pools(BLOCK, BLOCK)
    with pytest.raises(ValueError, match=f"blocks of {BLOCK * 2} bytes .* do not fit"):
        mine.blocks(BLOCK * 2)
    with pytest.raises(ValueError, match="0 blocks"):
        mine.blocks(BLOCK, 0)
    with pytest.raises(ValueError, match="descriptor 0 at offset 0 is empty"):
        mine.descriptors([(0, 0)])
    with pytest.raises(ValueError, match="the lists are empty"):
        await source.write(peer, mine.blocks(BLOCK)[:0], remote[:0], notify=b"nothing")
    assert not peer.connected  # refused before anything, the note included


@pytest.mark.asyncio
async def test_wrong_types_name_the_argument(pools: Callable[..., Pools]) -> None:
    target, source, _, mine, remote, peer = pools(BLOCK, BLOCK)
    local = mine.blocks(BLOCK)
    bad: list[tuple[Callable[[], Awaitable[object]], type[Exception], str]] = [
        (lambda: source.write(peer, local, remote, notify=5), TypeError,  # type: ignore[arg-type]
         "notify must be bytes .* not int"),
        (lambda: source.write(peer, local, remote, notify="done"), TypeError,  # type: ignore[arg-type]
         "notify must be bytes, not str"),
        (lambda: source.write(None, local, remote), TypeError, "peer must be a Peer"),  # type: ignore[arg-type]
        (lambda: source.write(target.metadata(), local, remote), TypeError,  # type: ignore[arg-type]
         "peer must be a Peer .* not bytes"),
        (lambda: source.write(peer, target.metadata(), remote), TypeError,  # type: ignore[arg-type]
         "the local list must be a DescriptorList"),
        (lambda: source.write(peer, local, target.metadata()), TypeError,  # type: ignore[arg-type]
         "the remote list must be a DescriptorList"),
        (lambda: source.write(peer, local, remote, timeout="5"), TypeError,  # type: ignore[arg-type]
         "timeout must be a number of seconds or None, not str"),
        (lambda: source.write(peer, local, remote, timeout=float("nan")), ValueError, "NaN"),
        (lambda: source.write(peer, local, remote, timeout=5, deadline=1e9), ValueError,
         "not both"),
        (lambda: source.write(peer, local, remote, deadline=time.time() + 5), ValueError,
         r"deadline=.* ahead of the event loop's clock \(loop.time\(\) is"),
        (lambda: target.next_notification("done"), TypeError, "data must be bytes, not str"),  # type: ignore[arg-type]
        (lambda: target.next_notification(timeout="5"), TypeError, "timeout must be a number"),  # type: ignore[arg-type]
        (lambda: start_agent(max_exposed="1G"), TypeError, "max_exposed must be an int"),  # type: ignore[arg-type]
        (lambda: start_agent(max_exposed=-1), ValueError, "max_exposed must be 0 or more"),
        (lambda: start_agent(window=2.5), TypeError, "window must be an int"),  # type: ignore[arg-type]
    ]  # fmt: skip
    for make, kind, message in bad:
        with pytest.raises(kind, match=message):
            await make()
    with pytest.raises(TypeError, match=r"take\(\) takes block indices \(ints\), not str"):
        local.take(["a"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="size must be an int"):
        mine.blocks("4096")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"obj must be a buffer .* not str"):
        source.register("text")
    with pytest.raises(TypeError, match="holds Python objects"):
        source.register(np.array([object()], dtype=object))
    with pytest.raises(TypeError, match=r"peer\(\) takes another agent's metadata"):
        source.peer(None)  # type: ignore[arg-type]
    assert not peer.connected
    assert source.stats()["counters"].get("notifications_sent", 0) == 0


@pytest.mark.asyncio
@pytest.mark.both_loops("cancellation")
async def test_timeouts_name_what_timed_out_and_are_counted(pools: Callable[..., Pools]) -> None:
    target, source, _, staging, remote, peer = pools(32 << 20, 1 << 20)
    with pytest.raises(TimeoutError, match=r"write of 32 blocks \(33554432 bytes\) with "
                       r"<Peer .* did not finish within 0.05 s"):  # fmt: skip
        await source.write(peer, staging.blocks(1 << 20), remote, timeout=0.05)
    assert staging.mr.inflight == 0
    with pytest.raises(TimeoutError, match=r"no notification b'never' arrived within 0\.05 s"):
        await target.next_notification(b"never", timeout=0.05)
    task = source.start_read(peer, staging.blocks(1 << 20), remote)
    done, _ = await asyncio.wait([task], timeout=0.05)
    assert not done
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    counters = source.stats()["counters"]
    assert counters["timeouts:write"] == 1
    assert counters["cancelled:read"] == 1
    assert "transfers:write" not in counters


@pytest.mark.asyncio
async def test_a_closed_agent_and_impossible_memory_say_so(lab: Lab) -> None:
    agent = await start_agent()
    try:
        with pytest.raises(MemoryLimitError, match=f"cannot allocate {1 << 50} bytes"):
            agent.alloc(1 << 50)
        reg = agent.alloc(BLOCK)
    finally:
        await agent.aclose()
    for call in (lambda: reg.blocks(BLOCK), lambda: agent.alloc(BLOCK),
                 lambda: reg.descriptors([(0, 1)])):  # fmt: skip
        with pytest.raises(ResourceClosedError, match="the transfer agent is closed"):
            call()


@pytest.mark.asyncio
async def test_a_single_block_moves_fails_and_cancels_as_a_list_does(
    agents: tuple[Agent, Agent],
) -> None:
    target, source = agents
    pool = target.alloc(4096, remote=RW)
    pool.view()[:64] = pattern(3, 64)
    landing = source.alloc(4096)
    peer = source.peer(target.metadata())
    one = DescriptorList.from_bytes(pool.blocks(64, 1).to_bytes())
    async with asyncio.timeout(TIMEOUT):
        await source.read(peer, landing.blocks(64, 1), one)
        assert landing.view()[:64] == pattern(3, 64)
        task = source.start_write(peer, landing.blocks(64, 1), one)
        await asyncio.sleep(0)  # the task has posted its one write and awaits it
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert landing.mr.inflight == 0  # returned only once the device was done with it
        await target.unregister(pool)  # remote access ends: the next read fails on the device
        with pytest.raises(TransferError) as info:
            await source.read(peer, landing.blocks(64, 1), one)
    assert isinstance(info.value.__cause__, RemoteAccessError)
    assert info.value.index == 0
    assert landing.mr.inflight == 0
    counters = source.stats()["counters"]
    assert counters["transfers:read"] == 1
    assert counters["failures:read"] == 1
    assert counters["cancelled:write"] == 1
