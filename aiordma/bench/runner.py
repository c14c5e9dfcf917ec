"""The measurements ``aiordma bench`` makes, against :mod:`aiordma.bench.peer`."""

from __future__ import annotations

import asyncio
import collections
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiordma
from aiordma import RemoteBuffer, rpc
from aiordma.bench.stats import Latency, Result
from aiordma.queue_pair import Read, Write


class Peer:
    """The peer process, started on ``addr`` for messages up to ``max_size``."""

    def __init__(self, addr: str, max_size: int) -> None:
        self.addr = addr
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "aiordma.bench.peer", addr, str(max_size)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline().split()
        if line[:1] != ["listening"]:
            self.close()
            raise RuntimeError("the benchmark peer did not start")
        self.port = int(line[1])

    def close(self) -> None:
        self._proc.kill()
        self._proc.wait()


async def _latencies(iterations: int, warmup: int, op: Callable[[], Awaitable[Any]]) -> list[float]:
    for _ in range(warmup):
        await op()
    samples = []
    clock = time.perf_counter
    for _ in range(iterations):
        start = clock()
        await op()
        samples.append(clock() - start)
    return samples


async def _window(iterations: int, depth: int, post: Callable[[], Awaitable[Any]]) -> float:
    """Keep ``depth`` operations in flight for ``iterations`` operations; seconds taken."""
    pending: collections.deque[asyncio.Future[Any]] = collections.deque()
    start = time.perf_counter()
    for _ in range(iterations):
        if len(pending) >= depth:
            await pending.popleft()
        pending.append(await post())
    for fut in pending:
        await fut
    return time.perf_counter() - start


async def measure(
    peer: Peer, mode: str, size: int, *, iterations: int, warmup: int, depth: int
) -> Result:
    """Run ``mode`` at ``size`` bytes against ``peer``."""
    if mode.startswith("rpc"):
        return await _measure_rpc(peer, mode, size, iterations, warmup, depth)
    kind = b"echo" if mode == "send_lat" else b"mem"
    async with await aiordma.connect(peer.addr, peer.port, private_data=kind) as conn:
        remote = RemoteBuffer.from_bytes(conn.peer_private_data[: RemoteBuffer.SIZE])[:size]
        local = conn.alloc(size)
        if mode == "write_lat":
            samples = await _latencies(iterations, warmup, lambda: conn.rdma_write(local, remote))
        elif mode == "read_lat":
            samples = await _latencies(iterations, warmup, lambda: conn.rdma_read(local, remote))
        elif mode == "send_lat":
            inbox = conn.alloc(size)

            async def ping() -> None:
                (reply,) = await conn.post_recv_batch([inbox])
                await conn.post_send(local)
                await reply

            samples = await _latencies(iterations, warmup, ping)
        else:
            op = Write(local, remote) if mode == "write_bw" else Read(local, remote)

            async def post() -> asyncio.Future[Any]:
                (fut,) = await conn.post_batch([op])
                return fut

            await _window(warmup, depth, post)
            seconds = await _window(iterations, depth, post)
            return Result("aiordma", mode, size, depth, iterations, seconds)
        return Result("aiordma", mode, size, 1, iterations, sum(samples), Latency.of(samples))


async def _measure_rpc(
    peer: Peer, mode: str, size: int, iterations: int, warmup: int, depth: int
) -> Result:
    async with await rpc.connect(peer.addr, peer.port) as client:
        if mode == "rpc_lat":
            payload = bytes(size)
            samples = await _latencies(iterations, warmup, lambda: client.call("echo", payload))
            return Result("aiordma", mode, size, 1, iterations, sum(samples), Latency.of(samples))
        into = client.conn.alloc(size)
        request = str(size).encode()
        window = asyncio.Semaphore(depth)

        async def fetch() -> None:
            async with window:
                await client.call("source", request, into=into)

        for _ in range(warmup):
            await fetch()
        start = time.perf_counter()
        await asyncio.gather(*(fetch() for _ in range(iterations)))
        return Result("aiordma", mode, size, depth, iterations, time.perf_counter() - start)
