"""One-block 64 B transfer READ latency: the median of 300 reads by this
process's agent from the transfers study's target process.

    aiordma lab -- sh -c 'for p in "" 200 2000 20000; do
        AIORDMA_POLL_US=$p python benchmarks/records/0013-awaited-operations/one_block.py; done'
"""

from __future__ import annotations

import os
import statistics
import time

import uvloop

from aiordma.transfer import DescriptorList, start_agent
from benchmarks import lab_address
from benchmarks.studies.transfers import start_target


async def main() -> None:
    target, lines = start_target(lab_address())
    try:
        async with await start_agent() as agent:
            peer = agent.peer(bytes.fromhex(lines["agent"]))
            remote = DescriptorList.from_bytes(bytes.fromhex(lines["tiny"]))
            local = agent.alloc(64).blocks(64, 1)
            for _ in range(50):  # warm up (and connect)
                await agent.read(peer, local, remote)
            times = []
            for _ in range(300):
                start = time.perf_counter()
                await agent.read(peer, local, remote)
                times.append(time.perf_counter() - start)
        poll = os.environ.get("AIORDMA_POLL_US", "")
        print(f"AIORDMA_POLL_US={poll:6} one-block 64 B read: "
              f"p50 {statistics.median(times) * 1e6:.0f} us")  # fmt: skip
    finally:
        target.terminate()


if __name__ == "__main__":
    uvloop.run(main())
