"""What open connections cost while nothing flows, per polling setting.

For each setting (``AIORDMA_POLL``: ``off``, ``auto``, microseconds), in
both this process and its echo peer: open ``--connections`` connections,
make one 64 B round trip on each (so every queue has waited for an answer
once), let the completion queues settle, then measure ``--seconds`` of
nothing: the whole machine's busy CPU (``/proc/stat``: both processes and
the device's kernel work) and what this side's completion queue did
(spins, armings). Run it in ``aiordma lab``; issue 63's idle target is no
spin and at most 1% of a core.
"""

from __future__ import annotations

import argparse
import asyncio
import os

import aiordma
from aiordma.bench.runner import Peer, machine_busy
from aiordma.verbs.completion import CompletionQueue, set_polling
from benchmarks import lab_address


async def _idle(addr: str, connections: int, seconds: float) -> tuple[float, dict[str, float]]:
    peer = Peer.start(addr, 64, "uvloop")
    try:
        conns = [
            await aiordma.connect(peer.addr, peer.port, private_data=b"echo")
            for _ in range(connections)
        ]
        try:
            for conn in conns:
                local, inbox = conn.alloc(64), conn.alloc(64)
                (reply,) = await conn.post_recv_batch([inbox])
                await conn.post_send(local)
                await asyncio.wait_for(reply, 60)
            cq: CompletionQueue = conns[0].qp.completion_queue
            async with asyncio.timeout(10):
                while cq.spinning:  # noqa: ASYNC110 - a spin ends by itself, raising no event
                    await asyncio.sleep(0)
            before, busy = cq.waiting(), machine_busy()
            await asyncio.sleep(seconds)  # the idle time measured
            after, busy_after = cq.waiting(), machine_busy()
        finally:
            for conn in conns:
                await conn.close()
    finally:
        peer.close()
    cpu = 0.0 if busy is None or busy_after is None else (busy_after - busy) / seconds
    return cpu, {key: after[key] - before[key] for key in ("spins", "skipped", "arms")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--polling", default="off,auto,300",
                        help="settings to measure, comma-separated")  # fmt: skip
    args = parser.parse_args()
    addr = lab_address()
    for setting in args.polling.split(","):
        os.environ["AIORDMA_POLL"] = setting  # the peer's setting
        set_polling(setting)  # this process's
        cpu, did = asyncio.run(_idle(addr, args.connections, args.seconds))
        print(f"AIORDMA_POLL={setting:<6} {args.connections} connections idle "
              f"{args.seconds:g} s: machine CPU {cpu:.1%} of a core; this side's CQ "
              f"{did['spins']:.0f} spins, {did['skipped']:.0f} skipped, {did['arms']:.0f} arms",
              flush=True)  # fmt: skip
    set_polling(None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
