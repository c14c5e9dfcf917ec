"""Issue 29's load scenarios, to run while the machine is busy (a soak, not a test).

    aiordma lab -- python -m benchmarks load_scenarios [--clients 300] [--at-once 40]

1. ``--clients`` RPC clients connect at once to a server whose clients'
   channels draw on one :class:`~aiordma.SharedReceiveQueue`, and each
   makes one call. Every client must either get a working connection (its
   call answers) or a typed error from ``connect``: a client told it is
   connected whose first call fails is a defect ("dead").
2. ``--at-once`` clients connect at once to a raw server whose handler
   posts its first receive only once it runs (after the connection is
   established), and each sends as soon as ``connect`` returns: every send
   must arrive (the default RNR patience covers a loaded server).
3. One RPC client calls ``echo`` with 8 MiB and ``timeout=0.3``, three
   times: how long each call takes to raise ``TimeoutError``, and whether
   the connection still answers afterwards.

The server runs in a child process, as a real server would. Prints one JSON
line per scenario; exits 1 if a scenario saw a defect.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import time

import aiordma
from aiordma import rpc
from benchmarks import lab_address
from benchmarks.peer import StudyPeer, requests


async def serve(host: str) -> None:
    service = rpc.Service()

    @service.method()
    async def echo(payload: bytes) -> bytes:
        return payload

    async def late(conn: aiordma.Connection) -> None:
        inbox = conn.alloc(64)  # posted only now: the client may have sent already
        completion = await conn.post_recv(inbox)
        await conn.post_send(inbox[: completion.byte_len])
        await conn.wait_closed()

    async with (
        aiordma.SharedReceiveQueue(buffers=4096) as pool,
        await rpc.start_server(service, host, 0, shared_receive=pool) as pooled,
        await aiordma.start_server(late, host, 0) as raw,
    ):
        async for _ in requests([pooled.addresses[0][1], raw.addresses[0][1]]):
            pass


async def pooled_clients(host: str, port: int, count: int) -> dict[str, object]:
    outcomes: collections.Counter[str] = collections.Counter()

    async def one(i: int) -> None:
        try:
            client = await rpc.connect(host, port, timeout=120)
        except (aiordma.RdmaError, OSError) as exc:  # typed: fine
            outcomes["refused: " + type(exc).__name__] += 1
            return
        try:
            answer = await asyncio.wait_for(client.call("echo", b"%d" % i), 120)
            outcomes["worked" if answer == b"%d" % i else "wrong answer"] += 1
        except Exception as exc:
            outcomes["dead: " + type(exc).__name__] += 1
        finally:
            await client.close()

    start = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(count)))
    return {"scenario": "shared receive queue", "clients": count,
            "seconds": round(time.monotonic() - start, 1), **outcomes}  # fmt: skip


async def late_receivers(host: str, port: int, count: int) -> dict[str, object]:
    outcomes: collections.Counter[str] = collections.Counter()

    async def one(i: int) -> None:
        async def prepare(conn: aiordma.Connection) -> object:
            inbox = conn.alloc(64)
            (reply,) = await conn.post_recv_batch([inbox])
            return reply

        try:
            conn = await aiordma.connect(host, port, prepare=prepare, timeout=120)
        except (aiordma.RdmaError, OSError) as exc:
            outcomes["refused: " + type(exc).__name__] += 1
            return
        async with conn:
            try:
                await conn.post_send(conn.register(b"%d" % i))  # at once, before the handler runs
                await asyncio.wait_for(conn.prepared, 120)
                outcomes["worked"] += 1
            except Exception as exc:
                name = getattr(exc, "status_name", type(exc).__name__)
                outcomes["lost: " + name] += 1

    start = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(count)))
    return {"scenario": "late first receive", "clients": count,
            "seconds": round(time.monotonic() - start, 1), **outcomes}  # fmt: skip


async def large_timeouts(host: str, port: int) -> dict[str, object]:
    seconds: list[float] = []
    outcomes: collections.Counter[str] = collections.Counter()
    payload = bytes(8 << 20)
    async with await rpc.connect(host, port, timeout=120) as client:
        for _ in range(3):
            start = time.monotonic()
            try:
                await client.call("echo", payload, timeout=0.3)
                outcomes["answered in time"] += 1
            except TimeoutError:
                outcomes["timed out"] += 1
            except Exception as exc:  # the connection died under the call
                outcomes["dead: " + type(exc).__name__] += 1
            seconds.append(round(time.monotonic() - start, 2))
            try:
                await asyncio.wait_for(client.call("echo", b"alive"), 60)
                outcomes["alive after"] += 1
            except Exception as exc:
                outcomes["dead: " + type(exc).__name__] += 1
    return {"scenario": "8 MiB call, timeout=0.3", "seconds": seconds, **outcomes}


async def measure(args: argparse.Namespace) -> int:
    host = lab_address()
    defects = 0
    async with await StudyPeer.start(__spec__.name, host) as child:
        pooled, raw = child.hello
        for result in (
            await pooled_clients(host, pooled, args.clients),
            await late_receivers(host, raw, args.at_once),
            await large_timeouts(host, pooled),
        ):
            print(json.dumps(result), flush=True)
            bad = ("dead", "lost", "wrong")
            defects += sum(int(str(v)) for k, v in result.items() if k.startswith(bad))
    return 1 if defects else 0


def main() -> int:
    if sys.argv[1:2] == ["--serve"]:
        asyncio.run(serve(sys.argv[2]))
        return 0
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--clients", type=int, default=300)
    parser.add_argument("--at-once", type=int, default=40)
    return asyncio.run(measure(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
