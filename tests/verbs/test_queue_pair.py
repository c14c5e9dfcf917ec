"""Awaitable verbs on real RC queue pairs (lab device, asyncio and uvloop)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable

import pytest

import aiordma
from aiordma import Access, Opcode, Read, Send, Write
from tests.conftest import Pair

REMOTE_ALL = Access.REMOTE_READ | Access.REMOTE_WRITE | Access.REMOTE_ATOMIC


@pytest.mark.asyncio
@pytest.mark.both_loops("completion fd")
async def test_send_recv_delivers_bytes(device: aiordma.Device, pair: Pair) -> None:
    a, b = pair
    inbox = device.alloc(256)
    outbox = device.register(bytearray(b"payload-123"))
    (recv,) = await b.post_recv_batch([inbox])
    sent = await a.post_send(outbox)
    got = await asyncio.wait_for(recv, 10)
    assert sent.opcode == Opcode.SEND
    assert got.opcode == Opcode.RECV
    assert got.byte_len == 11
    assert got.imm_data is None
    assert bytes(inbox.view()[:11]) == b"payload-123"
    assert inbox.inflight == 0
    assert outbox.inflight == 0


@pytest.mark.asyncio
async def test_send_with_imm_and_scatter_gather(device: aiordma.Device, pair: Pair) -> None:
    a, b = pair
    src = device.register(bytearray(b"0123456789"))
    dst1, dst2 = device.alloc(4), device.alloc(64)
    (recv,) = await b.post_recv_batch([[dst1[:4], dst2[:]]])  # scatter into two regions
    await a.send_with_imm([src[0:2], src[5:10]], imm=0xDEADBEEF)  # gather from two slices
    wc = await asyncio.wait_for(recv, 10)
    assert wc.imm_data == 0xDEADBEEF
    assert wc.byte_len == 7
    assert bytes(dst1.view()) + bytes(dst2.view()[:3]) == b"0156789"


@pytest.mark.asyncio
async def test_rdma_write_read_and_write_with_imm(device: aiordma.Device, pair: Pair) -> None:
    a, b = pair
    target = device.alloc(1 << 16, Access.REMOTE_READ | Access.REMOTE_WRITE)
    remote = aiordma.RemoteBuffer.from_bytes(target.remote().to_bytes())
    local = device.alloc(1 << 16)
    local.view()[:] = bytes(range(256)) * 256
    wc = await a.rdma_write(local, remote)
    assert wc.opcode == Opcode.RDMA_WRITE
    assert bytes(target.view()) == bytes(local.view())

    target.view()[1000:1004] = b"READ"
    back = device.alloc(4)
    wc = await a.rdma_read(back, remote[1000:1004])
    assert wc.opcode == Opcode.RDMA_READ
    assert bytes(back.view()) == b"READ"

    note = device.alloc(16)
    (recv,) = await b.post_recv_batch([note])
    await a.rdma_write(local[:8], remote[:8], imm=42)
    wc = await asyncio.wait_for(recv, 10)
    assert wc.opcode == Opcode.RECV_RDMA_WITH_IMM
    assert wc.imm_data == 42


@pytest.mark.asyncio
async def test_atomics_return_old_values(device: aiordma.Device, pair: Pair) -> None:
    a, _ = pair
    word = device.alloc(64, REMOTE_ALL)
    remote = word.remote()
    assert await a.atomic_fetch_add(remote, 7) == 0
    assert await a.atomic_fetch_add(remote, 2**64 - 1) == 7  # wraps: adds -1
    assert await a.atomic_cmp_swap(remote, compare=99, swap=1) == 6  # no swap
    assert await a.atomic_cmp_swap(remote, compare=6, swap=1234) == 6
    assert int.from_bytes(word.view()[:8], sys.byteorder) == 1234
    results = await asyncio.gather(*(a.atomic_fetch_add(remote[8:16], 1) for _ in range(50)))
    assert sorted(results) == list(range(50))
    with pytest.raises(ValueError, match="8-byte aligned"):
        await a.atomic_fetch_add(remote[4:12], 1)


@pytest.mark.asyncio
async def test_batch_posts_more_than_the_queue_holds(device: aiordma.Device) -> None:
    opts = aiordma.QueuePairOptions(send_depth=8, recv_depth=8)
    a, b = await aiordma.connect_loopback_pair(device, opts)
    target = device.alloc(4096, Access.REMOTE_WRITE | Access.REMOTE_READ)
    src = device.alloc(4096)
    src.view()[:] = bytes(range(256)) * 16
    remote = target.remote()
    futs = await a.post_batch(
        [Write(src[i * 64 : i * 64 + 64], remote[i * 64 :]) for i in range(64)]
    )
    done = await asyncio.wait_for(asyncio.gather(*futs), 30)
    assert len(done) == 64
    assert bytes(target.view()) == bytes(src.view())
    back = device.alloc(128)
    wcs = await asyncio.gather(*await a.post_batch([Read(back[:64], remote[:64]),
                                                    Read(back[64:], remote[64:128])]))  # fmt: skip
    assert [w.opcode for w in wcs] == [Opcode.RDMA_READ] * 2
    assert bytes(back.view()) == bytes(src.view()[:128])

    # 40 sends through 8-deep queues on both sides: posters wait for room.
    inbox = device.alloc(40 * 16)
    msgs = device.register(bytearray(b"".join(b"msg-%012d" % i for i in range(40))))
    receiver = asyncio.ensure_future(
        b.post_recv_batch([inbox[i * 16 : i * 16 + 16] for i in range(40)])
    )
    sends = await a.post_batch([Send(msgs[i * 16 : i * 16 + 16]) for i in range(40)])
    await asyncio.wait_for(asyncio.gather(*sends), 30)
    recvs = await asyncio.wait_for(receiver, 30)
    await asyncio.wait_for(asyncio.gather(*recvs), 30)
    assert bytes(inbox.view()) == bytes(msgs.view())  # in order


@pytest.mark.asyncio
@pytest.mark.both_loops("completion fd")
async def test_many_completions_at_once(device: aiordma.Device) -> None:
    opts = aiordma.QueuePairOptions(send_depth=1024)
    a, _ = await aiordma.connect_loopback_pair(device, opts)
    target = device.alloc(8, Access.REMOTE_WRITE)
    src = device.alloc(8)
    count = 3 * aiordma.verbs.completion.DRAIN_BUDGET  # forces the drain to yield and resume
    futs = await a.post_batch([Write(src, target.remote())] * count)
    wcs = await asyncio.wait_for(asyncio.gather(*futs), 60)
    assert len({w.wr_id for w in wcs}) == count


@pytest.mark.asyncio
async def test_unsignalled_writes_complete_with_the_next_signalled_one(
    device: aiordma.Device, pair: Pair
) -> None:
    a, _ = pair
    target = device.alloc(4096, Access.REMOTE_WRITE)
    src = device.alloc(4096)
    src.view()[:] = bytes(range(256)) * 16
    remote = target.remote()
    ops = [Write(src[i * 512 : (i + 1) * 512], remote[i * 512 :], signaled=False) for i in range(7)]
    silent = await a.post_batch(ops)
    (last,) = await a.post_batch([Write(src[3584:], remote[3584:])])
    await asyncio.wait_for(last, 10)
    assert all(f.done() for f in silent)  # settled by the signalled completion, in order
    wcs = [f.result() for f in silent]
    assert [w.opcode for w in wcs] == [Opcode.RDMA_WRITE] * 7
    assert [w.byte_len for w in wcs] == [512] * 7
    assert bytes(target.view()) == bytes(src.view())
    assert src.inflight == 0
    assert a.sends_in_flight == 0


@pytest.mark.asyncio
async def test_unsignalled_posts_never_starve_the_send_queue(device: aiordma.Device) -> None:
    opts = aiordma.QueuePairOptions(send_depth=8, recv_depth=8)
    a, _ = await aiordma.connect_loopback_pair(device, opts)
    target = device.alloc(40 * 8, Access.REMOTE_WRITE)
    src = device.register(bytearray(b"".join(b"%08d" % i for i in range(40))))
    futures = []
    for i in range(40):  # five times the queue's depth, none asked to be signalled
        futures += await asyncio.wait_for(
            a.post_batch([Write(src[i * 8 : i * 8 + 8], target.remote(i * 8, 8), signaled=False)]),
            10,
        )
    await asyncio.wait_for(a.flush_sends(), 10)
    assert all(f.done() and f.exception() is None for f in futures)
    assert bytes(target.view()) == bytes(src.view())
    await a.flush_sends()  # nothing pending: returns at once


@pytest.mark.asyncio
async def test_flush_sends_reports_an_unsignalled_tail(device: aiordma.Device, pair: Pair) -> None:
    a, b = pair
    inbox = device.alloc(64)
    (recv,) = await b.post_recv_batch([inbox])
    (sent,) = await a.post_batch([Send(device.register(bytearray(b"tail")), signaled=False)])
    await asyncio.wait_for(a.flush_sends(), 10)
    assert sent.done()
    assert sent.result().opcode == Opcode.SEND
    assert (await asyncio.wait_for(recv, 10)).byte_len == 4
    assert bytes(inbox.view()[:4]) == b"tail"


@pytest.mark.asyncio
async def test_unsignalled_failure_raises_promptly(device: aiordma.Device, pair: Pair) -> None:
    a, _ = pair
    target = device.alloc(64, Access.REMOTE_WRITE)
    src = device.alloc(64)
    forged = aiordma.RemoteBuffer(target.addr, 64, target.rkey ^ 0x5500)
    (fut,) = await a.post_batch([Write(src, forged, signaled=False)])
    with pytest.raises(aiordma.RemoteAccessError):
        await asyncio.wait_for(fut, 10)  # a failure always has a completion of its own
    with pytest.raises(aiordma.QueuePairError):
        await a.flush_sends()


@pytest.mark.asyncio
async def test_bad_rkey_raises_remote_access_error(device: aiordma.Device, pair: Pair) -> None:
    a, _ = pair
    target = device.alloc(64, Access.REMOTE_WRITE)
    src = device.alloc(64)
    forged = aiordma.RemoteBuffer(target.addr, 64, target.rkey ^ 0x5500)
    with pytest.raises(aiordma.RemoteAccessError) as info:
        await asyncio.wait_for(a.rdma_write(src, forged), 10)
    assert info.value.status_name == "IBV_WC_REM_ACCESS_ERR"
    assert info.value.opcode == "rdma_write"
    with pytest.raises(aiordma.QueuePairError):
        await a.rdma_write(src, target.remote())  # the QP is in the error state now


@pytest.mark.asyncio
async def test_missing_permission_and_out_of_bounds(device: aiordma.Device) -> None:
    read_only = device.alloc(64, Access.REMOTE_READ)
    src = device.alloc(128)
    a, _ = await aiordma.connect_loopback_pair(device)
    with pytest.raises(aiordma.RemoteAccessError):
        await asyncio.wait_for(a.rdma_write(src[:8], read_only.remote()), 10)
    a, _ = await aiordma.connect_loopback_pair(device)
    beyond = aiordma.RemoteBuffer(read_only.addr + 32, 128, read_only.rkey)
    with pytest.raises(aiordma.RemoteAccessError):
        await asyncio.wait_for(a.rdma_read(src, beyond), 10)
    with pytest.raises(ValueError, match="do not fit"):
        await a.rdma_write(src, read_only.remote()[:8])


@pytest.mark.asyncio
async def test_error_fails_pending_receives_promptly(device: aiordma.Device, pair: Pair) -> None:
    a, _b = pair
    inbox = device.alloc(64)
    recvs = await a.post_recv_batch([inbox[:32], inbox[32:]])
    with pytest.raises(aiordma.RemoteAccessError) as first:
        await asyncio.wait_for(a.rdma_write(inbox[:8], aiordma.RemoteBuffer(0, 8, 0)), 10)
    for fut in recvs:  # flushed by the error, not left hanging, and failed as the QP's failure
        with pytest.raises(aiordma.QueuePairError) as info:
            await asyncio.wait_for(fut, 10)
        assert info.value.__cause__ is first.value
    assert inbox.inflight == 0


@pytest.mark.asyncio
@pytest.mark.both_loops("close")
async def test_close_fails_pending_work_and_releases_memory(
    device: aiordma.Device, pair: Pair
) -> None:
    _a, b = pair
    inbox = device.alloc(64)
    waiting = asyncio.ensure_future(b.post_recv(inbox))
    await asyncio.sleep(0)
    assert inbox.inflight == 1
    with pytest.raises(aiordma.ResourceBusyError):
        inbox.close()
    b.close()
    with pytest.raises(aiordma.ResourceClosedError):
        await asyncio.wait_for(waiting, 10)
    await asyncio.wait_for(b.wait_closed(), 10)
    assert inbox.inflight == 0
    assert b.is_closing()
    await inbox.aclose()
    with pytest.raises(aiordma.ResourceClosedError):
        await b.post_send(device.alloc(8))


@pytest.mark.asyncio
@pytest.mark.both_loops("cancellation")
async def test_cancelled_recv_absorbs_its_late_completion(
    device: aiordma.Device, pair: Pair
) -> None:
    a, b = pair
    first, second = device.alloc(16), device.alloc(16)
    task = asyncio.ensure_future(b.post_recv(first))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert first.inflight == 1  # the receive stays posted; its buffer stays owned
    (later,) = await b.post_recv_batch([second])
    msg = device.register(bytearray(b"to-first"))
    await a.post_send(msg)  # lands in the cancelled receive's buffer
    await a.post_send(device.register(bytearray(b"to-second")))
    wc = await asyncio.wait_for(later, 10)
    assert bytes(second.view()[: wc.byte_len]) == b"to-second"
    assert bytes(first.view()[:8]) == b"to-first"
    assert first.inflight == 0
    assert b.pending == 0


@pytest.mark.asyncio
@pytest.mark.both_loops("close")
async def test_wrong_loop_is_refused(device: aiordma.Device, pair: Pair) -> None:
    a, _ = pair
    src = device.alloc(8)
    with pytest.raises(aiordma.WrongLoopError):
        await asyncio.to_thread(asyncio.run, a.post_send(src))


@pytest.mark.asyncio
async def test_bad_arguments_are_rejected_before_posting(
    device: aiordma.Device, pair: Pair
) -> None:
    a, b = pair
    src = device.register(b"read-only")
    with pytest.raises(ValueError, match="LOCAL_WRITE"):
        await b.post_recv(src)
    with pytest.raises(ValueError, match="32 bits"):
        await a.send_with_imm(src, imm=1 << 32)
    with pytest.raises(ValueError, match="segments exceed"):
        await a.post_send([src[i : i + 1] for i in range(5)])
    with pytest.raises(ValueError, match="max_inline"):
        await a.post_send(device.alloc(4096), inline=True)
    with pytest.raises(ValueError, match="send_depth"):
        device.create_qp(aiordma.QueuePairOptions(send_depth=0))
    assert a.pending == 0


@pytest.mark.asyncio
async def test_wrong_kinds_of_argument_are_type_errors_naming_them(
    device: aiordma.Device, pair: Pair
) -> None:
    a, _ = pair
    target = device.alloc(64, Access.REMOTE_WRITE | Access.REMOTE_ATOMIC)
    src = device.alloc(64)
    with pytest.raises(TypeError, match="not bytes: register it first"):
        await a.rdma_write(b"abc", target.remote())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"remote must be a RemoteBuffer.*not tuple"):
        await a.rdma_write(src, (target.addr, 64, target.rkey))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a send-side operation"):
        await a.post_batch(["x"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="size must be an int, not str"):
        device.alloc("4096")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="remote must be a RemoteBuffer"):
        await a.atomic_fetch_add(None, 1)  # type: ignore[arg-type]
    assert a.pending == 0
    assert await a.rdma_write(src[:3], target.remote()[:3])  # the QP is unharmed


@pytest.mark.asyncio
async def test_atomic_operands_wider_than_64_bits_are_refused(
    device: aiordma.Device, pair: Pair
) -> None:
    a, _ = pair
    word = device.alloc(8, Access.REMOTE_ATOMIC | Access.REMOTE_WRITE)
    remote = word.remote()
    with pytest.raises(ValueError, match=r"add .* does not fit the 64-bit word"):
        await a.atomic_fetch_add(remote, 2**70)
    with pytest.raises(ValueError, match=r"compare .* does not fit"):
        await a.atomic_cmp_swap(remote, 2**64 + 5, 1)
    with pytest.raises(ValueError, match=r"swap .* does not fit"):
        await a.atomic_cmp_swap(remote, 0, -(2**63) - 1)
    with pytest.raises(TypeError, match="add must be an int"):
        await a.atomic_fetch_add(remote, 1.5)  # type: ignore[arg-type]
    assert await a.atomic_fetch_add(remote, 2**64 - 1) == 0
    assert await a.atomic_fetch_add(remote, -1) == 2**64 - 1  # a negative add subtracts
    assert await a.atomic_cmp_swap(remote, 2**64 - 2, 7) == 2**64 - 2
    assert int.from_bytes(word.view()[:8], "little") == 7


# -- callback work (no futures: what message channels use per packet) -------


Done = Callable[[BaseException | None, int], None]


def _recorder() -> tuple[list[tuple[BaseException | None, int]], asyncio.Event, Done]:
    outcomes: list[tuple[BaseException | None, int]] = []
    event = asyncio.Event()

    def done(error: BaseException | None, length: int) -> None:
        outcomes.append((error, length))
        event.set()

    return outcomes, event, done


@pytest.mark.asyncio
@pytest.mark.both_loops("completion fd")
async def test_a_callback_receive_reports_from_the_drain(
    device: aiordma.Device, pair: Pair
) -> None:
    a, b = pair
    inbox = device.alloc(64)
    outbox = device.register(bytearray(b"callback!"))
    received, got, on_recv = _recorder()
    b.post_recv_callback(inbox[:], on_recv)
    assert inbox.inflight == 1
    sent = await asyncio.wait_for(a.post_send(outbox[:]), 10)
    await asyncio.wait_for(got.wait(), 10)
    assert received == [(None, 9)]
    assert sent.byte_len == 9
    assert bytes(inbox.view()[:9]) == b"callback!"
    assert inbox.inflight == outbox.inflight == 0
    assert a.pending == b.pending == 0


@pytest.mark.asyncio
async def test_unsignalled_sends_are_settled_by_flush(device: aiordma.Device, pair: Pair) -> None:
    a, b = pair
    inbox = device.alloc(64)
    outbox = device.alloc(64)
    for _ in range(3):
        b.post_recv_callback(inbox[:], lambda error, length: None)
    sends = await a.post_batch([aiordma.Send(outbox[:8], signaled=False) for _ in range(3)])
    await asyncio.wait_for(a.flush_sends(), 10)
    assert [send.done() and send.exception() is None for send in sends] == [True] * 3
    assert a.sends_in_flight == 0


@pytest.mark.asyncio
@pytest.mark.both_loops("close")
async def test_closing_fails_pending_callback_work_once(device: aiordma.Device, pair: Pair) -> None:
    a, _ = pair
    inbox = device.alloc(64)
    outcomes, failed, done = _recorder()
    a.post_recv_callback(inbox[:], done)
    a.close()
    await asyncio.wait_for(failed.wait(), 10)
    await asyncio.wait_for(a.wait_closed(), 10)
    assert len(outcomes) == 1  # the flush completion that follows is not reported again
    error, length = outcomes[0]
    assert isinstance(error, aiordma.ResourceClosedError)
    assert length == 0
    assert inbox.inflight == 0


@pytest.mark.asyncio
async def test_callback_receives_refuse_bad_memory_and_a_full_queue(
    device: aiordma.Device,
) -> None:
    options = aiordma.QueuePairOptions(send_depth=1, recv_depth=1)
    a, b = await aiordma.connect_loopback_pair(device, options)
    readonly = device.register(b"read only")
    with pytest.raises(ValueError, match="LOCAL_WRITE"):
        b.post_recv_callback(readonly[:], lambda error, length: None)
    closed = device.alloc(64)
    segment = closed[:]
    closed.close()
    with pytest.raises(aiordma.ResourceClosedError):
        b.post_recv_callback(segment, lambda error, length: None)
    inbox = device.alloc(64)
    b.post_recv_callback(inbox[:], lambda error, length: None)
    with pytest.raises(aiordma.ResourceBusyError, match="receive queue"):
        b.post_recv_callback(inbox[:], lambda error, length: None)
    for qp in (a, b):
        qp.close()
        await asyncio.wait_for(qp.wait_closed(), 10)


@pytest.mark.asyncio
async def test_work_flushed_by_a_failure_fails_with_one_error_naming_it(
    device: aiordma.Device, pair: Pair
) -> None:
    """After a one-sided failure, pending and later work all fail with
    QueuePairError caused by the first failure, and only that one counts
    as an error (flushes are counted apart)."""
    a, _ = pair
    pending = await a.post_recv_batch([device.alloc(64) for _ in range(3)])
    target = device.alloc(64, Access.REMOTE_WRITE)
    src = device.alloc(64)
    forged = aiordma.RemoteBuffer(target.addr, 64, target.rkey ^ 0x5500)
    with pytest.raises(aiordma.RemoteAccessError) as first:
        await asyncio.wait_for(a.rdma_write(src, forged), 10)
    for fut in pending:
        with pytest.raises(aiordma.QueuePairError) as flushed:
            await asyncio.wait_for(fut, 10)
        assert flushed.value.__cause__ is first.value
    with pytest.raises(aiordma.QueuePairError) as later:
        await a.post_send(src)
    assert later.value.__cause__ is first.value
    assert "IBV_WC_REM_ACCESS_ERR" in str(later.value)
    counters = a.stats()["counters"]
    assert {k: v for k, v in counters.items() if k.startswith("errors:")} == {
        "errors:IBV_WC_REM_ACCESS_ERR": 1
    }
    assert counters["flushed"] == 3


@pytest.mark.parametrize(
    ("field", "bad", "error", "says"),
    [
        ("retry_cnt", 8, ValueError, "retry_cnt must be at most 7, not 8"),
        ("rnr_retry", 9, ValueError, "rnr_retry must be at most 7, not 9"),
        ("timeout", 40, ValueError, "timeout must be at most 31, not 40"),
        ("timeout", -1, ValueError, "timeout must be at least 0, not -1"),
        ("min_rnr_timer", 32, ValueError, "min_rnr_timer must be at most 31"),
        ("path_mtu", 6, ValueError, "path_mtu must be at most 5"),
        ("port", 0, ValueError, "port must be at least 1"),
        ("send_depth", 0, ValueError, "send_depth must be at least 1"),
        ("max_rd_atomic", 1.5, TypeError, "max_rd_atomic must be an int, not float"),
        ("gid_index", "1", TypeError, "gid_index must be an int, not str"),
        ("keepalive", "10", TypeError, "keepalive must be a positive number of seconds"),
    ],
)
def test_each_transport_field_is_checked_when_made(
    field: str, bad: object, error: type[Exception], says: str
) -> None:
    """Issue 62: only ``min_rnr_timer`` was; ``timeout=40`` failed at
    connect with a bare EINVAL."""
    with pytest.raises(error, match=says):
        aiordma.QueuePairOptions(**{field: bad})  # type: ignore[arg-type]
    assert aiordma.QueuePairOptions(retry_cnt=7, timeout=31, path_mtu=None).retry_cnt == 7
