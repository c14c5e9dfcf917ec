"""Across a real link: host 1 (these tests) and host 2 of the two-host lab.

The peer programs are ``tests/peer.py``'s servers, started on host 2
through the lab's agent. Every byte is checked (SHA-256 or equality).
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

import aiordma
from aiordma import rpc
from aiordma.lab.remote import Fabric
from tests.conftest import PEER_TIMEOUT, ROOT
from tests.peer import blob

BIG = 64 << 20
KEEPALIVE = 1.0
LOSS_BOUND = 30.0
"""Seconds after the keepalive interval within which a dead peer must be
noticed: the transport's retries (``timeout`` 14, ``retry_cnt`` 6: about
0.5 s in theory) with a wide margin for the emulated CPUs."""


@asynccontextmanager
async def peer_server(fabric: Fabric, mode: str, addr: str) -> AsyncIterator[int]:
    """Run ``python -m tests.peer MODE ADDR 0`` on host 2; yields its port."""
    proc = fabric.start([sys.executable, "-m", "tests.peer", mode, addr, "0"], cwd=ROOT)
    try:
        async with asyncio.timeout(PEER_TIMEOUT):
            out = await proc.wait_for_output("listening ")
        yield int(out.split("listening ", 1)[1].split()[0])
    finally:
        rc = await proc.stop()
        assert rc in (0, -15), f"host 2's {mode} server exited with {rc}:\n{proc.output()}"


def _addrs(fabric: Fabric, family: int) -> tuple[str, str]:
    return (fabric.addr, fabric.peer_addr) if family == 4 else (fabric.addr6, fabric.peer_addr6)


@pytest.mark.asyncio
@pytest.mark.parametrize("family", [4, 6])
async def test_messages_cross_the_link_intact(fabric: Fabric, family: int) -> None:
    _, peer = _addrs(fabric, family)
    sizes = [0, 100, 8152, 70_000, 1 << 20] + ([BIG] if family == 4 else [])
    async with peer_server(fabric, "checksums", peer) as port:
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
@pytest.mark.parametrize("family", [4, 6])
async def test_rpc_across_the_link(fabric: Fabric, family: int) -> None:
    _, peer = _addrs(fabric, family)
    calls = 1000 if family == 4 else 50
    async with (
        peer_server(fabric, "rpc", peer) as port,
        await rpc.connect(peer, port, max_message=BIG) as client,
    ):
        for i in range(calls):
            payload = f"call {i}".encode() * (1 + i % 7)
            assert await client.call("echo", payload, timeout=PEER_TIMEOUT) == payload
        if family == 4:  # 64 MiB from host 2, read by host 1
            got = await client.call("blob", str(BIG).encode(), timeout=PEER_TIMEOUT)
            assert got == blob(BIG)


@pytest.mark.asyncio
async def test_a_crashed_peer_fails_idle_connections_within_the_keepalive_bound(
    fabric: Fabric,
) -> None:
    peer = fabric.peer_addr
    options = aiordma.QueuePairOptions(keepalive=KEEPALIVE)
    checksums = fabric.start([sys.executable, "-m", "tests.peer", "checksums", peer, "0"], cwd=ROOT)
    rpcs = fabric.start([sys.executable, "-m", "tests.peer", "rpc", peer, "0"], cwd=ROOT)
    try:
        ports = []
        for proc in (checksums, rpcs):
            async with asyncio.timeout(PEER_TIMEOUT):
                out = await proc.wait_for_output("listening ")
            ports.append(int(out.split("listening ", 1)[1].split()[0]))
        channel = await aiordma.open_channel(peer, ports[0], options=options)
        client = await rpc.connect(peer, ports[1], options=options)
        assert await client.call("echo", b"before", timeout=PEER_TIMEOUT) == b"before"
        receiving = asyncio.create_task(channel.recv_message())  # a pending await, idle
        await fabric.crash_peer()
        crashed = time.monotonic()
        async with asyncio.timeout(KEEPALIVE + LOSS_BOUND):
            with pytest.raises(aiordma.ConnectionLostError, match="keepalive"):
                await receiving
            await client.wait_closed()  # no call in flight: only the keepalive can tell
        noticed = time.monotonic() - crashed
        with pytest.raises(aiordma.ConnectionLostError):
            await client.call("echo", b"after")
        await channel.close()
        print(f"dead peer noticed {noticed:.1f} s after the crash (keepalive {KEEPALIVE} s)")
    finally:
        async with asyncio.timeout(240):
            await fabric.boot_peer()
