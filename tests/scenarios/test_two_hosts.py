"""Across a real link: host 1 (these tests) and host 2 of the two-host lab.

The peer programs are ``tests/peer.py``'s, started on host 2 through the
lab's agent. Every byte is checked (SHA-256 or equality). Faults on the
link are ``test_link_faults.py``'s.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import subprocess
import sys
import time

import pytest

import aiordma
from aiordma import Access, RemoteBuffer, rpc
from aiordma.channel.open import prepare_channel
from aiordma.channel.options import DEFAULT_READ_AHEAD
from aiordma.channel.sizing import READ_PIECE
from aiordma.lab.remote import Fabric
from aiordma.lab.vm import LAB_MTU
from tests.conftest import PEER_TIMEOUT, ROOT, remote_server
from tests.peer import blob, digest_each

BIG = 64 << 20
PIECE = 1 << 20
PAST_READ_AHEAD = DEFAULT_READ_AHEAD + READ_PIECE + 1
"""The largest message the link tests move: past the read ahead (a message
read when it is asked for, not before), its last piece a partial one."""


def _addrs(fabric: Fabric, family: int) -> tuple[str, str]:
    return (fabric.addr, fabric.peer_addr) if family == 4 else (fabric.addr6, fabric.peer_addr6)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("family", "largest"), [(4, PAST_READ_AHEAD), (6, 3 << 20)], ids=["4", "6"]
)
async def test_messages_cross_the_link_intact(fabric: Fabric, family: int, largest: int) -> None:
    """Eager, medium and rendezvous messages (1 MiB: read ahead). Over IPv4 up
    to :data:`PAST_READ_AHEAD` in 258 pieces, read as asked for (the link
    would drop the message read at once); over IPv6, whose subject is the
    addressing, up to 3 MiB (still many pieces in flight)."""
    _, peer = _addrs(fabric, family)
    sizes = [0, 100, 8152, 70_000, 1 << 20, largest]
    async with remote_server(fabric, "checksums", peer) as port:
        channel = await aiordma.open_channel(peer, port, max_message=BIG)
        async with channel:
            for size in sizes:
                data = blob(size)
                await channel.send_message(data)
                async with asyncio.timeout(PEER_TIMEOUT):
                    digest = await channel.recv_message()
                assert digest == hashlib.sha256(data).digest(), size
            assert channel.conn.peer_address[0] == peer


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("family", "calls", "largest"),
    [(4, 1000, PAST_READ_AHEAD), (6, 100, 3 << 20)],
    ids=["4", "6"],
)
async def test_rpc_across_the_link(fabric: Fabric, family: int, calls: int, largest: int) -> None:
    """Small calls (over IPv4 a thousand: the credits go round many times),
    then a large result from host 2 read by host 1 (over IPv4
    :data:`PAST_READ_AHEAD`; over IPv6, whose subject is the addressing, 100
    calls and 3 MiB)."""
    _, peer = _addrs(fabric, family)
    async with (
        remote_server(fabric, "rpc", peer) as port,
        await rpc.connect(peer, port, max_message=BIG) as client,
    ):
        for i in range(calls):
            payload = f"call {i}".encode() * (1 + i % 7)
            assert await client.call("echo", payload, timeout=PEER_TIMEOUT) == payload
        got = await client.call("blob", str(largest).encode(), timeout=PEER_TIMEOUT)
        assert got == blob(largest)


async def read_in_pieces(
    conn: aiordma.Connection, local: aiordma.MemoryRegion, remote: RemoteBuffer
) -> None:
    """RDMA-read ``remote`` into ``local`` 1 MiB at a time, four in flight.

    One 64 MiB read makes rxe's responder send all 65,536 packets at once,
    which the link drops (see ``aiordma.channel.sizing.READ_PIECE``); pieces are
    what a user moving that much should post.
    """
    pending: collections.deque[asyncio.Future[aiordma.WorkCompletion]] = collections.deque()
    for start in range(0, remote.length, PIECE):
        if len(pending) == 4:
            await pending.popleft()
        end = min(start + PIECE, remote.length)
        (piece,) = await conn.post_batch([aiordma.Read(local[start:end], remote[start:end])])
        pending.append(piece)
    for piece in pending:
        await piece


@pytest.mark.asyncio
@pytest.mark.parametrize(("family", "size"), [(4, BIG), (6, 8 << 20)], ids=["4", "6"])
async def test_one_sided_transfers_cross_the_link_intact(
    fabric: Fabric, family: int, size: int
) -> None:
    """64 MiB over IPv4 (a write of that size is one request); over IPv6,
    whose subject is the addressing, 8 MiB (eight reads of 1 MiB)."""
    _, peer = _addrs(fabric, family)
    async with remote_server(fabric, "region", peer, str(size)) as port:
        channel = await aiordma.open_channel(peer, port)
        async with channel:
            conn = channel.conn
            remote = RemoteBuffer.from_bytes(conn.peer_private_data[: RemoteBuffer.SIZE])
            assert remote.length == size
            local = conn.alloc(size, Access.LOCAL_WRITE)
            started = time.monotonic()
            async with asyncio.timeout(PEER_TIMEOUT):
                await read_in_pieces(conn, local, remote)  # host 2 -> host 1
            read = time.monotonic() - started
            assert local.view() == blob(size)
            mine = blob(size + 1)[1:]  # other bytes, from here
            local.view()[:] = mine
            started = time.monotonic()
            async with asyncio.timeout(PEER_TIMEOUT):
                await conn.rdma_write(local, remote)  # host 1 -> host 2, one request
                written = time.monotonic() - started
                await channel.send_message(b"digest?")
                assert await channel.recv_message() == hashlib.sha256(mine).digest()
    print(f"{size >> 10} KiB across the link: read {read:.1f} s, written {written:.1f} s")


def _active_mtu(devinfo: str) -> int:
    return int(devinfo.split("active_mtu:", 1)[1].split()[0])


@pytest.mark.asyncio
async def test_hosts_with_different_mtus_transfer_intact(fabric: Fabric) -> None:
    """Host 1's card at 9000 bytes (rxe: 4096-byte packets), host 2's at
    1500 (1024): each side as client and as server."""
    sizes = [1, 1000, 1024, 4096, 5000, 70_000, 1 << 20]
    await fabric.set_mtu(9000, host=1)
    await fabric.set_mtu(1500)
    try:
        rc, theirs = await fabric.run(["ibv_devinfo", "-d", "rxe0"])
        ours = await asyncio.to_thread(
            subprocess.run, ["ibv_devinfo", "-d", "rxe0"], capture_output=True, text=True
        )
        assert rc == 0, theirs
        assert (_active_mtu(ours.stdout), _active_mtu(theirs)) == (4096, 1024)
        async with remote_server(fabric, "checksums", fabric.peer_addr) as port:
            channel = await aiordma.open_channel(fabric.peer_addr, port, max_message=1 << 20)
            async with channel:
                for size in sizes:
                    data = blob(size)
                    await channel.send_message(data)
                    async with asyncio.timeout(PEER_TIMEOUT):
                        assert await channel.recv_message() == hashlib.sha256(data).digest()
        server = await aiordma.start_server(digest_each, fabric.addr, 0, prepare=prepare_channel)
        async with server:
            argv = ["tests.peer", "digests", fabric.addr, str(server.addresses[0][1])]
            proc = fabric.start([sys.executable, "-m", *argv, *map(str, sizes)], cwd=ROOT)
            async with asyncio.timeout(PEER_TIMEOUT):
                rc = await proc.wait()
            assert (rc, proc.output().strip()) == (0, "ok")
            server.close_clients()
    finally:  # both back to the lab's own
        await fabric.set_mtu(LAB_MTU, host=1)
        await fabric.set_mtu(LAB_MTU)
