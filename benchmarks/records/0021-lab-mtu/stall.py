"""Record 0021: ``msg_bw`` at 1 MiB across the link (the peer on host 2 reads each message
from host 1 in pieces), TRIES times at each MTU, rxe's counters on both hosts around each.

    aiordma lab --hosts 2 -- .venv/bin/python benchmarks/records/0021-lab-mtu/stall.py 3 1500 9000
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time

from aiordma.lab.remote import Fabric

COUNTERS = "/sys/class/infiniband/rxe0/ports/1/hw_counters"
READ = f"cd {COUNTERS} && grep -H . * | tr '\\n' ' '"
BENCH = [sys.executable, "-m", "aiordma", "bench", "--remote", "msg_bw",
         "--sizes", "1048576", "--duration", "5"]  # fmt: skip


def parse(text: str) -> dict[str, int]:
    return {name: int(value) for name, value in re.findall(r"([\w.]+):(\d+)", text)}


def moved(before: dict[str, int], after: dict[str, int]) -> str:
    return " ".join(f"{k}+{after[k] - before.get(k, 0)}" for k in sorted(after)
                    if after[k] != before.get(k, 0))  # fmt: skip


async def counters(fabric: Fabric) -> tuple[dict[str, int], dict[str, int]]:
    mine = await asyncio.to_thread(subprocess.run, ["sh", "-c", READ], capture_output=True,
                                   text=True)  # fmt: skip
    _, theirs = await fabric.run(["sh", "-c", READ])
    return parse(mine.stdout), parse(theirs)


async def main() -> None:
    fabric = Fabric.from_environment()
    assert fabric is not None, "run in the two-host lab"
    tries = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    for mtu in map(int, sys.argv[2:] or ["1500", "9000"]):
        await fabric.set_mtu(mtu, host=1)
        await fabric.set_mtu(mtu, host=2)
        for i in range(tries):
            before = await counters(fabric)
            started = time.monotonic()
            proc = await asyncio.create_subprocess_exec(
                *BENCH, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
            )
            try:
                out, _ = await asyncio.wait_for(proc.communicate(), 150)
                text = out.decode()
            except TimeoutError:
                proc.kill()
                await proc.wait()
                text = "TIMEOUT"
            after = await counters(fabric)
            rows = [row for row in text.splitlines() if "MB/s" in row] or [text[-400:]]
            took = time.monotonic() - started
            print(f"mtu {mtu} try {i + 1} ({took:.0f} s): {rows[0].strip()[:120]}")
            print(f"   host1: {moved(before[0], after[0])}")
            print(f"   host2: {moved(before[1], after[1])}", flush=True)


asyncio.run(main())
