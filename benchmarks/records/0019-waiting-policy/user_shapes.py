"""Record 0019 (issue 81): the two ping-pongs a user writes first, beside a
plain asyncio TCP ping-pong, server and client in two processes, rounds
alternated, and what each side's completion queue did.

- ``verbs``: a Connection; the client awaits ``post_recv_batch`` then
  ``post_send`` of registered memory and awaits the receive; the server
  posts its next receive before it replies (examples/echo_server.py).
- ``channel``: a MessageChannel; ``send_message`` then
  ``recv_message_into`` a bytearray.
- ``tcp``: asyncio streams, ``write`` + ``drain`` then ``readexactly``.

    aiordma lab -- .venv/bin/python benchmarks/records/0019-waiting-policy/user_shapes.py

``MODES`` (default ``auto off 300``) are ``AIORDMA_POLL`` values given to
both processes; ``ROUNDS`` (3) and ``TRIPS`` (1500) size the run. Each line
is one run: median and p90 of a round trip, its ratio to TCP's median in the
same round, and the client's and server's waiting counters.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time

import uvloop

import aiordma

ADDR = os.environ.get("AIORDMA_ADDR", "192.0.2.1")
TRIPS = int(os.environ.get("TRIPS", 1500))
WARM = 100
SIZE = 64
COUNTERS = ("spins", "hits", "misses", "late", "skipped", "arms")


def waiting(cq: aiordma.CompletionQueue) -> str:
    counts = cq.waiting()
    text = " ".join(f"{name} {int(counts[name])}" for name in COUNTERS)
    return f"{text} limit {counts['limit_seconds'] * 1e6:.0f}us"


async def serve(shape: str) -> None:
    done = asyncio.Event()
    report: list[str] = []

    if shape == "tcp":

        async def tcp(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while True:
                    writer.write(await reader.readexactly(SIZE))
                    await writer.drain()
            except asyncio.IncompleteReadError:
                done.set()

        server = await asyncio.start_server(tcp, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
    elif shape == "verbs":

        async def prepare(conn: aiordma.Connection) -> object:
            inbox = conn.alloc(SIZE)
            return inbox, (await conn.post_recv_batch([inbox]))[0]

        async def verbs(conn: aiordma.Connection) -> None:
            inbox, pending = conn.prepared
            outbox = conn.alloc(SIZE)
            try:
                while True:
                    await pending
                    (pending,) = await conn.post_recv_batch([inbox])
                    await conn.post_send(outbox)
            except aiordma.ConnectionLostError:
                pass
            report.append(waiting(conn.completion_queue))
            done.set()

        server = await aiordma.start_server(verbs, ADDR, 0, prepare=prepare)
        port = server.addresses[0][1]
    else:

        async def channel(chan: aiordma.MessageChannel) -> None:
            buffer = bytearray(SIZE)
            try:
                while True:
                    n = await chan.recv_message_into(buffer)
                    await chan.send_message(buffer[:n])
            except aiordma.ConnectionLostError:
                pass
            report.append(waiting(chan.conn.completion_queue))
            done.set()

        server = await aiordma.start_channel_server(channel, ADDR, 0)
        port = server.addresses[0][1]
    print(port, flush=True)
    await done.wait()
    print(report[0] if report else "", flush=True)
    server.close()


async def client(shape: str, port: int) -> tuple[list[float], str]:
    took: list[float] = []
    payload = bytes(SIZE)
    if shape == "tcp":
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for n in range(WARM + TRIPS):
            start = time.perf_counter()
            writer.write(payload)
            await writer.drain()
            await reader.readexactly(SIZE)
            if n >= WARM:
                took.append(time.perf_counter() - start)
        writer.close()
        await writer.wait_closed()
        return took, ""
    if shape == "verbs":
        async with await aiordma.connect(ADDR, port) as conn:
            inbox, outbox = conn.alloc(SIZE), conn.alloc(SIZE)
            for n in range(WARM + TRIPS):
                start = time.perf_counter()
                (reply,) = await conn.post_recv_batch([inbox])
                await conn.post_send(outbox)
                await reply
                if n >= WARM:
                    took.append(time.perf_counter() - start)
            return took, waiting(conn.completion_queue)
    async with await aiordma.open_channel(ADDR, port) as chan:
        buffer = bytearray(SIZE)
        for n in range(WARM + TRIPS):
            start = time.perf_counter()
            await chan.send_message(payload)
            await chan.recv_message_into(buffer)
            if n >= WARM:
                took.append(time.perf_counter() - start)
        return took, waiting(chan.conn.completion_queue)


def run(shape: str, mode: str) -> tuple[float, float, str, str]:
    env = {**os.environ, "AIORDMA_POLL": mode}
    server = subprocess.Popen([sys.executable, __file__, "serve", shape],
                              stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
    assert server.stdout is not None
    try:
        port = server.stdout.readline().strip()
        out = subprocess.run([sys.executable, __file__, "client", shape, port], env=env,
                             capture_output=True, text=True, check=True, timeout=600)  # fmt: skip
        theirs = server.stdout.readline().strip()
        server.wait(timeout=60)
    finally:
        server.kill()
    result = json.loads(out.stdout)
    return result["p50"], result["p90"], result["waiting"], theirs


def main() -> None:
    if sys.argv[1] == "serve":
        uvloop.run(serve(sys.argv[2]))
        return
    if sys.argv[1] == "client":
        took, counts = uvloop.run(client(sys.argv[2], int(sys.argv[3])))
        took.sort()
        print(json.dumps({"p50": statistics.median(took), "p90": took[len(took) * 9 // 10],
                          "waiting": counts}))  # fmt: skip
        return


if __name__ == "__main__" and len(sys.argv) > 1:
    main()
elif __name__ == "__main__":
    modes = os.environ.get("MODES", "auto off 300").split()
    for round_ in range(1, int(os.environ.get("ROUNDS", 3)) + 1):
        tcp, tcp90, _, _ = run("tcp", "off")
        print(f"round {round_}: tcp p50 {tcp * 1e6:.0f} us, p90 {tcp90 * 1e6:.0f} us", flush=True)
        for shape in ("verbs", "channel"):
            for mode in modes if round_ % 2 else modes[::-1]:
                p50, p90, mine, theirs = run(shape, mode)
                print(f"  {shape:7} {mode:5} p50 {p50 * 1e6:5.0f} us ({p50 / tcp:.2f}x tcp), "
                      f"p90 {p90 * 1e6:5.0f}\n    client: {mine}\n    server: {theirs}",
                      flush=True)  # fmt: skip
