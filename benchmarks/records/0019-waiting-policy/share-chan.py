"""A channel ping-pong as the tutorial writes it, printing both sides' waiting counters.

``share-chan.py server ADDR`` echoes one client and prints its CQ's counters when
the client leaves; ``share-chan.py client ADDR`` times ``ROUNDS`` round trips
(300 by default). ``OLDPOLICY=PATH`` (an earlier ``_waiting.py``) swaps in that
policy, to compare two policies in one boot.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import sys
import time

import uvloop

import aiordma
import aiordma.verbs.completion

PORT = 18515


def _swap_policy(path: str) -> None:
    spec = importlib.util.spec_from_file_location("old_waiting", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"OLDPOLICY: cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_waiting"] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    aiordma.verbs.completion.WaitPolicy = module.WaitPolicy  # type: ignore[misc]


def counters(channel: aiordma.MessageChannel) -> dict[str, float]:
    return channel.conn.qp.completion_queue.waiting()


async def server(addr: str) -> None:
    done = asyncio.Event()

    async def echo(channel: aiordma.MessageChannel) -> None:
        try:
            while True:
                await channel.send_message(await channel.recv_message())
        except (aiordma.ConnectionLostError, aiordma.ResourceClosedError):
            pass
        finally:
            print("server", json.dumps(counters(channel)), flush=True)
            done.set()

    srv = await aiordma.start_channel_server(echo, addr, PORT)
    print("listening", flush=True)
    await done.wait()
    srv.close()
    await srv.wait_closed()


async def client(addr: str, rounds: int) -> None:
    async with await aiordma.open_channel(addr, PORT) as channel:
        payload = bytes(64)
        for _ in range(100):
            await channel.send_message(payload)
            await channel.recv_message()
        before = counters(channel)
        samples = []
        for _ in range(rounds):
            start = time.perf_counter()
            await channel.send_message(payload)
            await channel.recv_message()
            samples.append(time.perf_counter() - start)
        samples.sort()
        after = counters(channel)
        p10, p50, p90 = (samples[int(len(samples) * q)] * 1e6 for q in (0.1, 0.5, 0.9))
        print(f"client p50 {p50:.0f} us p10 {p10:.0f} p90 {p90:.0f}")
        gauges = ("window_seconds", "limit_seconds")
        spent = {k: after[k] if k in gauges else round(after[k] - before[k], 6) for k in after}
        print("client", json.dumps(spent), flush=True)


if __name__ == "__main__":
    if os.environ.get("OLDPOLICY"):
        _swap_policy(os.environ["OLDPOLICY"])
    role, addr = sys.argv[1], sys.argv[2]
    if role == "server":
        uvloop.run(server(addr))
    else:
        uvloop.run(client(addr, int(os.environ.get("ROUNDS", "300"))))
