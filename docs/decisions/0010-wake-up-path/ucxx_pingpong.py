"""A ping-pong over UCXX (asyncio API, "blocking" progress: the worker's fd on the loop).

Not part of aiordma: run with a Python that has ``ucxx-cu12`` 0.52 and uvloop,
pointed at a UCX built with verbs (``../shared/peers.md``):

    RAPIDS_LIBUCX_PREFER_SYSTEM_LIBRARY=true LD_LIBRARY_PATH=UCX/lib \\
    UCX_TLS=rc_verbs,self UCX_NET_DEVICES=rxe0:1 UCXPY_PROGRESS_MODE=blocking \\
    python ucxx_pingpong.py ADDR --sizes 64,65536 --rounds 2000

It starts its own echo server as a child process, then times ``rounds``
round trips of each size (after a warm-up) and prints the median in the
same row format as ``aiordma bench``.
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


async def serve(max_size: int) -> None:
    done = asyncio.Event()

    async def echo(ep: ucxx.Endpoint) -> None:
        size = np.empty(1, dtype="u8")
        while True:
            try:
                await ep.recv(size)
                n = int(size[0])
                buf = np.empty(n, dtype="u1")
                await ep.recv(buf)
                await ep.send(buf)
            except Exception:
                return

    listener = ucxx.create_listener(echo, PORT)
    print("listening", flush=True)
    await done.wait()
    del listener


async def _once(ep: ucxx.Endpoint, header: np.ndarray, out: np.ndarray, back: np.ndarray) -> None:
    """One round trip: the length, the bytes, and their echo."""
    await ep.send(header)
    await ep.send(out)
    await ep.recv(back)


async def ping(addr: str, sizes: list[int], rounds: int) -> None:
    ep = await ucxx.create_endpoint(addr, PORT)
    for size in sizes:
        header = np.array([size], dtype="u8")
        out = np.zeros(size, dtype="u1")
        back = np.empty(size, dtype="u1")

        for _ in range(100):
            await _once(ep, header, out, back)
        samples = []
        for _ in range(rounds):
            start = time.perf_counter()
            await _once(ep, header, out, back)
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
        uvloop.run(serve(max(sizes)))
        return
    server = subprocess.Popen(
        [sys.executable, __file__, args.addr, "--serve", "--sizes", args.sizes],
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
