"""Client of the echo server: sends each message and prints the echo.

    python examples/echo_client.py HOST [PORT] [MESSAGE ...]

The receive for the echo is posted before the message is sent, so the
server's reply always finds it.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import aiordma

MAX_MESSAGE = 4096


async def main(host: str, port: int, messages: list[str]) -> None:
    started = time.perf_counter()
    async with await aiordma.connect(host, port) as conn:
        setup_ms = (time.perf_counter() - started) * 1000
        print(f"connected to {host}:{port} in {setup_ms:.1f} ms", flush=True)
        inbox = conn.alloc(MAX_MESSAGE)
        outbox = conn.alloc(MAX_MESSAGE)
        for text in messages:
            data = text.encode()
            if len(data) > MAX_MESSAGE:
                raise SystemExit(f"messages are limited to {MAX_MESSAGE} bytes")
            (reply,) = await conn.post_recv_batch([inbox])
            outbox.view()[: len(data)] = data
            await conn.post_send(outbox[: len(data)])
            wc = await reply
            print("echo:", bytes(inbox.view()[: wc.byte_len]).decode(), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("host")
    parser.add_argument("port", nargs="?", type=int, default=7471)
    parser.add_argument("messages", nargs="*", default=["hello", "over", "RDMA"])
    args = parser.parse_args()
    asyncio.run(main(args.host, args.port, args.messages))
