"""Record 0021: the two-host link's cards at 1500 bytes (RoCE MTU 1024) and at 9000 (4096),
alternated in one boot, perftest and TCP across the link beside each run.

    aiordma lab --hosts 2 -- .venv/bin/python benchmarks/records/0021-lab-mtu/two_hosts.py
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

from aiordma.lab.remote import Fabric

BENCH = [sys.executable, "-m", "aiordma", "bench", "--remote", "--duration", "5",
         "--compare", "perftest", "--compare", "tcp"]  # fmt: skip


async def main() -> None:
    fabric = Fabric.from_environment()
    assert fabric is not None, "run in the two-host lab"
    for round_ in (1, 2):
        for mtu in (1500, 9000):
            await fabric.set_mtu(mtu, host=1)
            await fabric.set_mtu(mtu, host=2)
            _, theirs = await fabric.run(["sh", "-c", "ibv_devinfo -d rxe0 | grep active_mtu"])
            ours = await asyncio.to_thread(
                subprocess.run, ["sh", "-c", "ibv_devinfo -d rxe0 | grep active_mtu"],
                capture_output=True, text=True)  # fmt: skip
            print(
                f"=== round {round_}, cards at {mtu}: host 1 {ours.stdout.split()[1:3]}, "
                f"host 2 {theirs.split()[1:3]}",
                flush=True,
            )
            for argv in (
                ["write_bw", "read_bw", "msg_bw", "--sizes", "65536,1048576"],
                ["send_lat", "msg_lat", "--sizes", "64", "--iterations", "200"],
            ):
                proc = await asyncio.create_subprocess_exec(
                    *BENCH, *argv, stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT)  # fmt: skip
                out, _ = await proc.communicate()
                for line in out.decode().splitlines():
                    if "MB/s" in line or " us " in line or "rror" in line:
                        print(line, flush=True)


asyncio.run(main())
