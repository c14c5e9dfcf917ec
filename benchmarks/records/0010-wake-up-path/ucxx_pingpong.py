"""A ping-pong over UCXX (asyncio API, "blocking" progress: the worker's fd on the loop).

Not part of aiordma: run with a Python that has ``ucxx-cu12`` 0.52 and uvloop,
pointed at a UCX built with verbs (``../shared/peers.md``):

    RAPIDS_LIBUCX_PREFER_SYSTEM_LIBRARY=true LD_LIBRARY_PATH=UCX/lib \\
    UCX_TLS=rc_verbs,self UCX_NET_DEVICES=rxe0:1 UCXPY_PROGRESS_MODE=blocking \\
    python ucxx_pingpong.py ADDR --sizes 64,65536 --rounds 2000

It starts its own echo server as a child process, then times ``rounds``
round trips of each size (after a warm-up), one tagged send each way, and
prints the median in the same row format as ``aiordma bench``.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time

import numpy as np
import ucxx
import uvloop

PORT = 13337


WARMUP = 100


async def serve(sizes: list[int], rounds: int) -> None:
    """Echo ``WARMUP + rounds`` messages of each size, in the client's order."""
    done = asyncio.Event()

    async def echo(ep: ucxx.Endpoint) -> None:
        for size in sizes:
            buf = np.empty(size, dtype="u1")
            for _ in range(WARMUP + rounds):
                await ep.recv(buf)
                await ep.send(buf)
        done.set()

    listener = ucxx.create_listener(echo, PORT)
    print("listening", flush=True)
    await done.wait()
    del listener


async def ping(addr: str, sizes: list[int], rounds: int) -> None:
    """Time ``rounds`` round trips of each size: one tagged send each way,
    the sizes known to both ends (no length header)."""
    ep = await ucxx.create_endpoint(addr, PORT)
    for size in sizes:
        out = np.zeros(size, dtype="u1")
        back = np.empty(size, dtype="u1")
        for _ in range(WARMUP):
            await ep.send(out)
            await ep.recv(back)
        samples = []
        for _ in range(rounds):
            start = time.perf_counter()
            await ep.send(out)
            await ep.recv(back)
            samples.append(time.perf_counter() - start)
        samples.sort()
        p50 = samples[len(samples) // 2] * 1e6
        print(f"ucxx       msg_lat   {size:>11} B  depth 1   p50 {p50:9.1f} us", flush=True)
    await ep.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("addr")
    parser.add_argument("--sizes", default="64,65536")
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--serve", action="store_true")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.serve:
        uvloop.run(serve(sizes, args.rounds))
        return
    server = subprocess.Popen(
        [
            sys.executable,
            __file__,
            args.addr,
            "--serve",
            "--sizes",
            args.sizes,
            "--rounds",
            str(args.rounds),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        server.stdout.readline()
        uvloop.run(ping(args.addr, sizes, args.rounds))
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    main()
