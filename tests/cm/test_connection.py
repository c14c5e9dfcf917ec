"""The active side: connect to a server in another process (lab device, asyncio and uvloop)."""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import signal
from collections.abc import Awaitable, Callable

import pytest

import aiordma
from aiordma import Access, RemoteBuffer
from tests.conftest import Lab, rdma_counts, read_line, spawn_peer, stop_peer


async def _echo(conn: aiordma.Connection, data: bytes) -> bytes:
    inbox, outbox = conn.alloc(4096), conn.register(bytearray(data))
    (reply,) = await conn.post_recv_batch([inbox])
    await conn.post_send(outbox)
    wc = await asyncio.wait_for(reply, 30)
    return bytes(inbox.view()[: wc.byte_len])


@pytest.mark.asyncio
@pytest.mark.both_loops("completion fd")
async def test_connect_echo_and_one_sided_access(lab: Lab, peer_server: int) -> None:
    conn = await aiordma.connect(lab.addr, peer_server)
    assert conn.peer_address == (lab.addr, peer_server)
    assert conn.local_address[0] == lab.addr
    assert conn.local_address[1] != 0
    assert conn.device.name == lab.device
    for size in (1, 100, 4096):
        data = bytes(i % 251 for i in range(size))
        assert await _echo(conn, data) == data

    # The server's accept reply carries a RemoteBuffer of its memory.
    remote = RemoteBuffer.from_bytes(conn.peer_private_data[: RemoteBuffer.SIZE])
    local = conn.alloc(64)
    await conn.rdma_read(local[:13], remote[:13])
    assert bytes(local.view()[:13]) == b"server memory"
    local.view()[:7] = b"written"
    await conn.rdma_write(local[:7], remote[100:107])
    await conn.rdma_read(local[20:27], remote[100:107])
    assert bytes(local.view()[20:27]) == b"written"

    closing = conn.close()
    assert conn.is_closing()
    await closing
    assert conn.closed
    assert local.closed  # memory registered through the connection is released with it
    with pytest.raises(aiordma.ResourceClosedError):
        await conn.post_send(conn.device.register(b"late"))


@pytest.mark.asyncio
@pytest.mark.both_loops("close")
async def test_context_manager_closes_and_pending_work_fails(lab: Lab, peer_server: int) -> None:
    async with await aiordma.connect(lab.addr, peer_server) as conn:
        inbox = conn.alloc(64)
        (pending,) = await conn.post_recv_batch([inbox])  # no message will come
    assert conn.closed
    with pytest.raises(aiordma.ResourceClosedError):
        await pending


@pytest.mark.asyncio
async def test_an_idle_connection_probes_its_peer_and_stays_up(
    lab: Lab, peer_server: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = aiordma.QueuePairOptions(keepalive=0.05)
    async with await aiordma.connect(lab.addr, peer_server, options=options) as conn:
        acknowledged = asyncio.Event()
        outcomes: list[BaseException | None] = []
        probed = conn._probed

        def watched(error: BaseException | None, length: int) -> None:
            outcomes.append(error)
            if len(outcomes) == 3:
                acknowledged.set()
            probed(error, length)

        monkeypatch.setattr(conn, "_probed", watched)
        async with asyncio.timeout(60):
            await acknowledged.wait()
        assert outcomes[:3] == [None, None, None]
        assert not conn.is_closing()
        assert await _echo(conn, b"still here") == b"still here"


def test_keepalive_must_be_positive_or_none() -> None:
    assert aiordma.QueuePairOptions(keepalive=None).keepalive is None
    assert aiordma.QueuePairOptions().keepalive == 10.0
    for bad in (0, -1.0):
        with pytest.raises(ValueError, match="keepalive must be a positive"):
            aiordma.QueuePairOptions(keepalive=bad)


@pytest.mark.asyncio
async def test_memory_of_another_device_object_is_refused_before_posting(
    lab: Lab, peer_server: int
) -> None:
    # Issue 41: it was accepted and posted. Another Device (even of the same
    # adapter) is another protection domain: its lkey means nothing here.
    async with (
        aiordma.Device(lab.device) as other,
        await aiordma.connect(lab.addr, peer_server) as conn,
    ):
        foreign = other.alloc(64)
        remote = RemoteBuffer.from_bytes(conn.peer_private_data[: RemoteBuffer.SIZE])
        posts: list[Callable[[], Awaitable[object]]] = [
            lambda: conn.post_send(foreign),
            lambda: conn.rdma_read(foreign[:13], remote[:13]),
            lambda: conn.rdma_write([conn.alloc(8), foreign[:8]], remote[:16]),
            lambda: conn.post_recv(foreign),
        ]
        for post in posts:
            with pytest.raises(ValueError, match="registered on another Device"):
                await post()
        data = b"still fine"  # nothing was posted: the queue pair did not fail
        assert await _echo(conn, data) == data


@pytest.mark.asyncio
async def test_rejection_carries_the_servers_data(lab: Lab, peer_server: int) -> None:
    with pytest.raises(aiordma.ConnectionRejectedError) as info:
        await aiordma.connect(lab.addr, peer_server, private_data=b"reject please")
    assert isinstance(info.value, ConnectionRefusedError)
    assert info.value.private_data.rstrip(b"\0") == b"not today"
    # The server keeps serving after a rejection.
    async with await aiordma.connect(lab.addr, peer_server, private_data=b"hello") as conn:
        assert await _echo(conn, b"still there") == b"still there"


@pytest.mark.asyncio
async def test_nothing_listening_is_refused(lab: Lab) -> None:
    server = await aiordma.start_server(lambda conn: None, lab.addr, 0)
    port = server.addresses[0][1]
    server.close()
    await server.wait_closed()
    with pytest.raises(aiordma.NoListenerError, match="nothing listens") as info:
        await aiordma.connect(lab.addr, port)
    # Distinguishable from a rejection by the server's accept, yet a ConnectionRefusedError.
    assert not isinstance(info.value, aiordma.ConnectionRejectedError)
    assert isinstance(info.value, ConnectionRefusedError)
    assert info.value.reason == 8


@pytest.mark.asyncio
@pytest.mark.both_loops("cancellation")
async def test_unanswered_connect_times_out_and_leaves_nothing(lab: Lab) -> None:
    silent = str(ipaddress.ip_address(lab.addr) + 1)  # on the lab's dummy link: no one answers
    before = rdma_counts(lab.device)
    with pytest.raises(TimeoutError, match=r"timed out after 1\.0 s"):  # its own timeout
        await aiordma.connect(silent, 7471, timeout=1.0)
    assert rdma_counts(lab.device) == before


@pytest.mark.asyncio
@pytest.mark.both_loops("cancellation")
async def test_cancelled_connect_leaves_nothing(lab: Lab) -> None:
    silent = str(ipaddress.ip_address(lab.addr) + 1)
    before = rdma_counts(lab.device)
    task = asyncio.create_task(aiordma.connect(silent, 7471, timeout=None))
    done, _ = await asyncio.wait([task], timeout=0.5)  # still waiting for an answer
    assert not done
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert rdma_counts(lab.device) == before


@pytest.mark.asyncio
async def test_oversized_private_data_is_refused_before_sending(lab: Lab) -> None:
    with pytest.raises(ValueError, match="at most 56"):
        await aiordma.connect(lab.addr, 7471, private_data=bytes(57))


@pytest.mark.asyncio
async def test_unresolvable_host_is_an_oserror(lab: Lab) -> None:
    with pytest.raises(OSError, match="cannot resolve"):
        await aiordma.connect("no-such-host.invalid", 7471)


@pytest.mark.asyncio
async def test_an_address_no_rdma_device_reaches_names_the_ones_that_would(lab: Lab) -> None:
    # Issue 41: this said only "rdma_resolve_route: No such device".
    with pytest.raises(aiordma.DeviceError) as info:
        await aiordma.connect("127.0.0.1", 7471)
    message = str(info.value)
    assert "cannot connect to 127.0.0.1: no RDMA device routes there" in message
    assert "loopback" in message
    assert f"RDMA addresses here: {lab.addr} ({lab.device})" in message
    assert info.value.errno == errno.ENODEV


@pytest.mark.asyncio
@pytest.mark.both_loops("subprocess")
async def test_server_killed_fails_pending_awaits(lab: Lab) -> None:
    proc = await spawn_peer("serve", lab.addr, "0")
    try:
        port = int((await read_line(proc)).split()[1])
        conn = await aiordma.connect(lab.addr, port)
        remote = RemoteBuffer.from_bytes(conn.peer_private_data[: RemoteBuffer.SIZE])
        inbox = conn.alloc(64)
        (pending,) = await conn.post_recv_batch([inbox])
        proc.send_signal(signal.SIGKILL)
        with pytest.raises(aiordma.ConnectionLostError):
            await asyncio.wait_for(pending, 20)
        await asyncio.wait_for(conn.wait_closed(), 20)
        with pytest.raises(aiordma.ConnectionLostError):
            await conn.rdma_write(conn.register(b"x"), remote)
    finally:
        await stop_peer(proc)


@pytest.mark.asyncio
async def test_remote_access_is_least_privilege(lab: Lab, peer_server: int) -> None:
    """Memory registered through a connection grants no remote access unless asked."""
    async with await aiordma.connect(lab.addr, peer_server) as conn:
        assert not conn.alloc(64).access & Access.REMOTE
        assert conn.alloc(64, Access.REMOTE_READ).access & Access.REMOTE_READ
