"""NIXL beside aiordma's transfer agents: the same reads, on the lab's rxe device.

    python nixl_reads.py [--rounds 5]

Runs a target agent as a child process (a 64 MiB pool, registered with
NIXL's UCX backend) and reads from it the workloads of ``aiordma bench
study transfers``: 1,000 scattered 16 KiB blocks, 1,000 scattered 64 KiB
blocks, one 64 MiB block and one 64 B block, each as one transfer request
made once and posted ``--rounds`` times (``transfer``, then
``check_xfer_state`` until done: NIXL's way to learn completion), the
median reported. Also the CPU each process burns over three idle
seconds. NIXL's defaults otherwise (its progress thread on). Needs
``nixl-cu12`` (1.5.1; ``--no-deps`` plus numpy) and, on Debian, its
bundled libibverbs pointed at the system's (``../shared/peers.md``):

    UCX_TLS=rc_v,self UCX_NET_DEVICES=rxe0:1 LD_LIBRARY_PATH=DIR python nixl_reads.py
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time

import numpy as np
from nixl_cu12._api import nixl_agent

POOL = 64 << 20
WORKLOADS = [("16 KiB x 1000", 16 << 10, 1000), ("64 KiB x 1000", 64 << 10, 1000),
             ("64 MiB x 1", POOL, 1), ("64 B x 1", 64, 1)]  # fmt: skip


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def target() -> None:
    agent = nixl_agent("target")
    pool = np.zeros(POOL, dtype=np.uint8)
    agent.register_memory([(pool.ctypes.data, POOL, 0, "")], "DRAM")
    print("META", agent.get_agent_metadata().hex(), pool.ctypes.data, flush=True)
    sys.stdin.read()  # until the initiator closes it


def initiator(rounds: int) -> None:
    child = subprocess.Popen([sys.executable, __file__, "--target"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert child.stdout is not None
    assert child.stdin is not None
    line = child.stdout.readline()
    while line and not line.startswith("META "):  # NIXL may log on stdout first
        line = child.stdout.readline()
    _, metadata, remote_base = line.split()
    agent = nixl_agent("initiator")
    local = np.zeros(POOL, dtype=np.uint8)
    agent.register_memory([(local.ctypes.data, POOL, 0, "")], "DRAM")
    name = agent.add_remote_agent(bytes.fromhex(metadata))
    for label, size, count in WORKLOADS:
        slots = random.Random(size).sample(range(POOL // size), count)
        far = [(int(remote_base) + s * size, size, 0) for s in slots]
        near = [(local.ctypes.data + i * size, size, 0) for i in range(count)]
        handle = agent.initialize_xfer("READ", agent.get_xfer_descs(near, "DRAM"),
                                       agent.get_xfer_descs(far, "DRAM"), name)  # fmt: skip
        times = []
        for _ in range(rounds + 1):  # the first also connects: left out
            start = time.perf_counter()
            state = agent.transfer(handle)
            while state == "PROC":
                state = agent.check_xfer_state(handle)
            if state != "DONE":
                raise SystemExit(f"{label}: transfer state {state}")
            times.append(time.perf_counter() - start)
        median = statistics.median(times[1:])
        figure = (
            f"{median * 1e6:.0f} us"
            if size * count <= 64
            else f"{size * count / median / 1e6:.1f} MB/s"
        )
        print(f"  NIXL read {label:14} {figure}", flush=True)
    mine, theirs = time.process_time(), cpu_seconds(child.pid)
    time.sleep(3)  # idle on purpose: the CPU an idle agent burns
    print(f"  idle CPU: initiator {100 * (time.process_time() - mine) / 3:.0f}%, target "
          f"{100 * (cpu_seconds(child.pid) - theirs) / 3:.0f}% of a core", flush=True)  # fmt: skip
    child.stdin.close()
    child.wait(timeout=60)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--target", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    target() if args.target else initiator(args.rounds)
