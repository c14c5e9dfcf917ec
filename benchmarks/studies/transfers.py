"""Transfer agents: descriptor-list reads and writes beside perftest, calls per transfer, idle CPU.

    aiordma lab -- python -m benchmarks transfers [--rounds 5] [--loop uvloop] [--no-perftest]

A target agent runs in a process of its own with a 64 MiB pool that peers
may read and write, and publishes four lists of it: 1,000 scattered 16 KiB
blocks, 1,000 scattered 64 KiB blocks, the whole pool as one block, and
one 64 B block. This process's agent moves each list ``--rounds`` times
(READ, and WRITE for the 64 KiB blocks) from or into a staging region and
reports the median rate, with ``ib_read_bw`` / ``ib_write_bw`` /
``ib_read_lat`` of the same sizes from the same run. It also counts the
Python calls of one transfer of 1, 10 and 1,000 blocks (cProfile, this
process only: the target does nothing per transfer) and the CPU both
processes burn over three idle seconds with the connection open.

The target also prints each notification it receives with the SHA-256 of
the 16 KiB blocks at that moment (the lab's tests check writes with it).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import hashlib
import json
import os
import pstats
import random
import signal
import statistics
import subprocess
import sys
import time
from typing import Any

from aiordma import Access
from aiordma.bench import perftest
from aiordma.transfer import Agent, DescriptorList, Registration, start_agent
from aiordma.verbs import per_message_path
from benchmarks import lab_address

POOL = 64 << 20
SLOTS_16K = POOL // (16 << 10)
SLOTS_64K = POOL // (64 << 10)
BLOCKS = 1000
IDLE_SECONDS = 3.0


async def serve(host: str) -> None:
    """The target: publish the pool's lists on stdout, then serve until SIGTERM or SIGINT."""
    async with await start_agent(host) as agent:
        pool = agent.alloc(POOL, remote=Access.REMOTE_READ | Access.REMOTE_WRITE)
        rng = random.Random(44)
        lists = {
            "blocks16": pool.blocks(16 << 10).take(rng.sample(range(SLOTS_16K), BLOCKS)),
            "blocks64": pool.blocks(64 << 10).take(rng.sample(range(SLOTS_64K), BLOCKS)),
            "whole": pool.blocks(POOL),
            "tiny": pool.blocks(64, 1),
        }
        print("agent", agent.metadata().hex())
        for name, lst in lists.items():
            print(name, lst.to_bytes().hex())
        print("ready", flush=True)
        notes = asyncio.ensure_future(_report_notes(agent, pool, lists["blocks16"]))
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
        notes.cancel()


async def _report_notes(agent: Agent, pool: Registration, blocks: DescriptorList) -> None:
    """Print each notification with the SHA-256 of the 16 KiB blocks as it
    finds them then (what a writer can check its data against)."""
    async for note in agent.notifications():
        view, digest = pool.view(), hashlib.sha256()
        for addr, length, _key in blocks:
            digest.update(view[addr - pool.mr.addr : addr - pool.mr.addr + length])
        print("note", note.data.hex(), digest.hexdigest(), flush=True)


def _cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_target(host: str) -> tuple[subprocess.Popen[str], dict[str, str]]:
    """The target agent's process, and the lines it published."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.studies.transfers", "--serve", host],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    lines: dict[str, str] = {}
    for line in proc.stdout:
        name, _, value = line.strip().partition(" ")
        if name == "ready":
            return proc, lines
        lines[name] = value
    proc.wait()
    raise SystemExit("the target agent did not start")


async def measure(lines: dict[str, str], rounds: int, target: int) -> dict[str, Any]:
    """Every figure but perftest's, against the target process ``target``."""
    async with await start_agent() as agent:
        return await _measure(agent, lines, rounds, target)


async def _measure(agent: Agent, lines: dict[str, str], rounds: int, target: int) -> dict[str, Any]:
    peer = agent.peer(bytes.fromhex(lines["agent"]))
    remote = {
        k: DescriptorList.from_bytes(bytes.fromhex(v)) for k, v in lines.items() if k != "agent"
    }
    staging = agent.alloc(POOL)
    cases = [
        ("read", "blocks16", staging.blocks(16 << 10, BLOCKS)),
        ("read", "blocks64", staging.blocks(64 << 10, BLOCKS)),
        ("write", "blocks64", staging.blocks(64 << 10, BLOCKS)),
        ("read", "whole", staging.blocks(POOL)),
        ("read", "tiny", staging.blocks(64, 1)),
    ]
    rows: dict[str, Any] = {}
    for kind, name, local in cases:
        move = agent.read if kind == "read" else agent.write
        await move(peer, local, remote[name])  # warm up (and connect)
        times = []
        for _ in range(rounds if name != "tiny" else 200):
            start = time.perf_counter()
            await move(peer, local, remote[name])
            times.append(time.perf_counter() - start)
        median = statistics.median(times)
        rows[f"{kind} {name}"] = {"seconds": median, "bytes": local.nbytes,
                                  "mb_per_s": local.nbytes / median / 1e6}  # fmt: skip
    calls = {}
    for count in (1, 10, BLOCKS):
        local, far = staging.blocks(16 << 10, count), remote["blocks16"][:count]
        await agent.read(peer, local, far)
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(10):
            await agent.read(peer, local, far)
        profile.disable()
        calls[count] = pstats.Stats(profile).total_calls / 10  # type: ignore[attr-defined]
    before = (time.process_time(), _cpu_seconds(target))
    await asyncio.sleep(IDLE_SECONDS)  # idle on purpose: the CPU an idle agent burns
    idle = {
        "this process": (time.process_time() - before[0]) / IDLE_SECONDS,
        "target process": (_cpu_seconds(target) - before[1]) / IDLE_SECONDS,
    }
    return {"path": per_message_path(), "transfers": rows, "calls_per_transfer": calls,
            "idle_cpu_share": idle}  # fmt: skip


def references(host: str) -> dict[str, float]:
    """perftest's figures for the same sizes (MB/s; ib_read_lat: us round trip)."""
    from aiordma.verbs.discovery import find_roce_endpoint

    endpoint = find_roce_endpoint()
    device = endpoint.device if endpoint is not None else "rxe0"
    out: dict[str, float] = {}
    for mode, size, iterations in (("read_bw", 16 << 10, 4000), ("read_bw", 64 << 10, 2000),
                                   ("write_bw", 64 << 10, 2000), ("read_bw", POOL, 10),
                                   ("read_lat", 64, 1000)):  # fmt: skip
        result = perftest.run(mode, device, host, size, iterations, 64)
        if result is None:
            continue
        if result.latency is not None:
            out[f"ib_{mode} {size}"] = result.latency.p50  # already in us
        else:
            out[f"ib_{mode} {size}"] = result.mb_per_s
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="uvloop")
    parser.add_argument("--no-perftest", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--serve", metavar="HOST", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.loop == "uvloop":
        import uvloop

        runner: Any = uvloop.run
    else:
        runner = asyncio.run
    if args.serve:
        runner(serve(args.serve))
        return
    host = lab_address()
    proc, lines = start_target(host)
    try:
        row = runner(measure(lines, args.rounds, proc.pid))
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    row["perftest"] = {} if args.no_perftest else references(host)
    if args.json:
        print(json.dumps(row))
        return
    print(f"{row['path']}")
    for name, r in row["transfers"].items():
        extra = (
            f"{r['seconds'] * 1e6:9.0f} us" if r["bytes"] <= 64 else f"{r['mb_per_s']:9.1f} MB/s"
        )
        print(f"  {name:16} {r['bytes']:>10} bytes {extra}")
    for name, value in row["perftest"].items():
        unit = "us" if "lat" in name else "MB/s"
        print(f"  {name:24} {value:9.1f} {unit}")
    for count, calls in row["calls_per_transfer"].items():
        print(f"  Python calls per read of {count} blocks: {calls:.0f}")
    for who, share in row["idle_cpu_share"].items():
        print(f"  idle CPU, {who}: {100 * share:.1f}% of a core")


if __name__ == "__main__":
    main()
