"""RPC over RDMA against the same RPC over asyncio TCP streams, and perftest.

    aiordma lab -- python benchmarks/rpc.py [--calls N] [--bulk-mib M] [--loop uvloop|asyncio]

Each server runs in a child process on the lab address. Printed, for both
transports: round-trip latency of a 64-byte ``echo`` (p50, p99, mean) and the
throughput of ``--bulk-mib`` payloads sent to a ``sink`` and fetched from a
``source`` (over RDMA, fetched once into a new buffer and once into registered
memory). Then the C reference on the same device: ``ib_send_lat`` 64 B and
``ib_read_bw`` / ``ib_write_bw`` at the bulk size, 8 in flight (all over rdma_cm).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiordma import rpc
from aiordma.bench import perftest
from aiordma.bench.peer import service
from aiordma.bench.stats import percentile

ROOT = Path(__file__).resolve().parent.parent

# -- the same three methods over TCP as aiordma.bench.peer.service() serves --------

_REQ = struct.Struct("<QQB")  # payload length, call id, method
_REP = struct.Struct("<QQ")  # payload length, call id
_METHODS = ("echo", "sink", "source")
_blobs: dict[int, bytes] = {}


async def tcp_handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A TCP RPC server: length-prefixed frames, calls answered as they complete."""

    async def answer(call_id: int, method: str, payload: bytes) -> None:
        if method == "echo":
            result = payload
        elif method == "sink":
            result = b""
        else:
            size = int(payload)
            result = _blobs.setdefault(size, bytes(size))
        writer.write(_REP.pack(len(result), call_id))
        writer.write(result)
        await writer.drain()

    try:
        while True:
            length, call_id, method = _REQ.unpack(await reader.readexactly(_REQ.size))
            payload = await reader.readexactly(length)
            await answer(call_id, _METHODS[method], payload)
    except asyncio.IncompleteReadError:
        pass
    finally:
        writer.close()


class TcpClient:
    """The client side of :func:`tcp_handle`; many calls may be in flight."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer
        self._pending: dict[int, asyncio.Future[bytes]] = {}
        self._ids = itertools.count()
        self._task = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        while True:
            length, call_id = _REP.unpack(await self._reader.readexactly(_REP.size))
            self._pending.pop(call_id).set_result(await self._reader.readexactly(length))

    async def call(self, method: str, payload: bytes = b"") -> bytes:
        call_id = next(self._ids)
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._pending[call_id] = fut
        self._writer.write(_REQ.pack(len(payload), call_id, _METHODS.index(method)))
        self._writer.write(payload)
        await self._writer.drain()
        return await fut

    async def close(self) -> None:
        self._task.cancel()
        self._writer.close()
        await self._writer.wait_closed()


async def serve(kind: str, addr: str) -> None:
    if kind == "rdma":
        server = await rpc.start_server(service(), addr, 0)
        port = server.addresses[0][1]
    else:
        tcp = await asyncio.start_server(tcp_handle, addr, 0)
        port = tcp.sockets[0].getsockname()[1]
    print(f"listening {port}", flush=True)
    await asyncio.Event().wait()


# -- measuring ---------------------------------------------------------------------


def _latency(name: str, seconds: list[float]) -> None:
    us = [s * 1e6 for s in seconds]
    print(
        f"  {name:<34} p50 {percentile(us, 0.5):8.1f} us   p99 {percentile(us, 0.99):8.1f} us"
        f"   mean {statistics.fmean(us):8.1f} us   (n={len(us)})"
    )


def _throughput(name: str, size: int, seconds: list[float]) -> None:
    best, mean = size / min(seconds) / 1e6, size / statistics.fmean(seconds) / 1e6
    print(f"  {name:<34} {mean:8.1f} MB/s mean   {best:8.1f} MB/s best   (n={len(seconds)})")


async def _timed(count: int, call: Callable[[], Awaitable[Any]]) -> list[float]:
    samples = []
    for _ in range(count):
        start = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - start)
    return samples


async def measure(addr: str, rdma_port: int, tcp_port: int, calls: int, bulk: int) -> None:
    small, big, size = b"x" * 64, bytes(bulk), str(bulk).encode()
    warm = max(10, calls // 10)
    print(f"RPC over RDMA (aiordma.rpc, {addr})")
    async with await rpc.connect(addr, rdma_port) as client:
        await _timed(warm, lambda: client.call("echo", small))
        _latency("echo 64 B round trip", await _timed(calls, lambda: client.call("echo", small)))
        bulk_runs = max(3, min(10, (64 << 20) // bulk))
        _throughput(
            f"{bulk >> 20} MiB to sink",
            bulk,
            await _timed(bulk_runs, lambda: client.call("sink", big)),
        )
        _throughput(
            f"{bulk >> 20} MiB from source",
            bulk,
            await _timed(bulk_runs, lambda: client.call("source", size)),
        )
        region = client.conn.alloc(bulk)
        _throughput(
            f"{bulk >> 20} MiB from source, into=",
            bulk,
            await _timed(bulk_runs, lambda: client.call("source", size, into=region)),
        )
    print(f"RPC over TCP (asyncio streams, {addr})")
    reader, writer = await asyncio.open_connection(addr, tcp_port)
    tcp = TcpClient(reader, writer)
    try:
        await _timed(warm, lambda: tcp.call("echo", small))
        _latency("echo 64 B round trip", await _timed(calls, lambda: tcp.call("echo", small)))
        _throughput(
            f"{bulk >> 20} MiB to sink",
            bulk,
            await _timed(bulk_runs, lambda: tcp.call("sink", big)),
        )
        _throughput(
            f"{bulk >> 20} MiB from source",
            bulk,
            await _timed(bulk_runs, lambda: tcp.call("source", size)),
        )
    finally:
        await tcp.close()


def _start(kind: str, addr: str, loop: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "serve", kind, "--addr", addr, "--loop", loop],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline().split()[1])


# -- perftest --------------------------------------------------------------------------


def run_perftest(device: str, addr: str, calls: int, bulk: int) -> None:
    print(f"perftest on {device} (C, same device, rdma_cm)")
    lat = perftest.run("send_lat", device, addr, 64, calls, 1)
    if lat is not None and lat.latency is not None:
        print(
            f"  {'ib_send_lat 64 B round trip':<34} p50 {lat.latency.p50:8.1f} us   "
            f"p99 {lat.latency.p99:8.1f} us   (twice the one-way figures)"
        )
    for mode in ("read_bw", "write_bw"):
        bw = perftest.run(mode, device, addr, bulk, 10, 8)
        if bw is not None:
            name = f"{perftest.TOOLS[mode]} {bulk >> 20} MiB"
            print(f"  {name:<34} {bw.mb_per_s:8.1f} MB/s average")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", nargs="*", help=argparse.SUPPRESS)
    parser.add_argument("--addr", default=os.environ.get("AIORDMA_ADDR", "192.0.2.1"))
    parser.add_argument("--device", default=os.environ.get("AIORDMA_DEVICE", "rxe0"))
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--bulk-mib", type=int, default=16)
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="uvloop")
    parser.add_argument("--no-perftest", action="store_true")
    args = parser.parse_args()
    runner: Callable[[Any], Any] = asyncio.run
    if args.loop == "uvloop":
        import uvloop

        runner = uvloop.run
    if args.role:
        runner(serve(args.role[1], args.addr))
        return
    print(f"loop: {args.loop}; servers in child processes")
    rdma_server, rdma_port = _start("rdma", args.addr, args.loop)
    tcp_server, tcp_port = _start("tcp", args.addr, args.loop)
    try:
        runner(measure(args.addr, rdma_port, tcp_port, args.calls, args.bulk_mib << 20))
    finally:
        for proc in (rdma_server, tcp_server):
            proc.terminate()
            proc.wait()
    if not args.no_perftest:
        run_perftest(args.device, args.addr, args.calls, args.bulk_mib << 20)


if __name__ == "__main__":
    main()
