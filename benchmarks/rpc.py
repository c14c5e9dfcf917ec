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
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiordma import rpc
from aiordma.bench import perftest, tcp
from aiordma.bench.peer import service
from aiordma.bench.stats import percentile

ROOT = Path(__file__).resolve().parent.parent


async def serve(kind: str, addr: str) -> None:
    if kind == "rdma":
        server = await rpc.start_server(service(), addr, 0)
        port = server.addresses[0][1]
    else:
        baseline = await tcp.start_server(addr)
        port = baseline.sockets[0].getsockname()[1]
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
    async with await tcp.Client.connect(addr, tcp_port) as baseline:
        await _timed(warm, lambda: baseline.call("echo", small))
        _latency("echo 64 B round trip", await _timed(calls, lambda: baseline.call("echo", small)))
        _throughput(
            f"{bulk >> 20} MiB to sink",
            bulk,
            await _timed(bulk_runs, lambda: baseline.call("sink", big)),
        )
        _throughput(
            f"{bulk >> 20} MiB from source",
            bulk,
            await _timed(bulk_runs, lambda: baseline.call("source", size)),
        )


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
