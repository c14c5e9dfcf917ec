"""Issue 64 item 2: the transport's timer on a lossy link, and on a lossless one with a busy peer.

    aiordma lab --hosts 2 -- .venv/bin/python benchmarks/records/0023-across-the-link/timers.py \
        [--size MIB] [--calls N] [--timeouts 10 12 14 16] [--losses none 1% 5%]

For each loss (``tc netem`` both ways; ``none``: the clean link) and each
``QueuePairOptions.timeout`` of host 1's queue pair: host 1 connects to an
RPC server on host 2 (``tests/peer.py rpc``), fetches one ``--size`` MiB
result (host 1 reads it across the link in 64 KiB pieces, four in
flight: a lost READ response costs host 1's timer unless a later packet of
the same READ shows the gap), then makes ``--calls`` 64 B calls. Prints the
seconds and rate of each, whether the connection failed (and how), and
the rxe counters that moved on host 1 (retry timers that fired, READs
resent after a gap, sequence errors) and on host 2 (duplicate requests:
resends that found the first copy already served, so spurious ones).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time

import aiordma
from aiordma import rpc
from aiordma.lab.remote import Fabric

sys.path.insert(0, ".")
from tests.conftest import remote_server
from tests.peer import blob

COUNTERS = "/sys/class/infiniband/rxe0/ports/1/hw_counters"
READ = f"cd {COUNTERS} && grep -H . *"
WATCHED = ("completer_retry_err", "retry_exceeded_err", "rcvd_seq_err", "duplicate_request",
           "out_of_seq_request", "rcvd_rnr_err", "send_rnr_err", "ack_deferred",
           "link_downed")  # fmt: skip


def parse(text: str) -> dict[str, int]:
    return {name: int(value) for name, value in re.findall(r"(\w+):(\d+)", text)}


async def counters(fabric: Fabric) -> tuple[dict[str, int], dict[str, int]]:
    proc = await asyncio.create_subprocess_exec("sh", "-c", READ, stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    _, there = await fabric.run(["sh", "-c", READ])
    return parse(out.decode()), parse(there)


def moved(before: dict[str, int], after: dict[str, int]) -> str:
    changed = [f"{k}+{after[k] - before.get(k, 0)}" for k in WATCHED
               if k in after and after[k] != before.get(k, 0)]  # fmt: skip
    return " ".join(changed) or "none"


async def one(fabric: Fabric, port: int, exponent: int, size: int, calls: int) -> str:
    options = aiordma.QueuePairOptions(timeout=exponent)
    client = await rpc.connect(fabric.peer_addr, port, options=options, max_message=size,
                               exposure_timeout=900.0)  # fmt: skip
    fetched = called = "not reached"
    try:
        async with client:
            started = time.monotonic()
            got = await client.call("blob", str(size).encode(), timeout=900.0)
            took = time.monotonic() - started
            assert got == blob(size), "the fetched bytes differ"
            fetched = f"{size >> 20} MiB fetched in {took:.1f} s ({size / took / 1e6:.2f} MB/s)"
            started = time.monotonic()
            for i in range(calls):
                assert await client.call("echo", b"%d" % i, timeout=120.0) == b"%d" % i
            took = time.monotonic() - started
            called = f"{calls} calls in {took:.1f} s ({took / calls * 1e3:.1f} ms each)"
    except Exception as exc:  # what the study reports: how the connection failed
        return f"FAILED ({type(exc).__name__}: {exc}); {fetched}; {called}"
    return f"{fetched}; {called}"


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=64, help="MiB")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--timeouts", type=int, nargs="+", default=[10, 12, 14, 16])
    parser.add_argument("--losses", nargs="+", default=["none", "1%", "5%"])
    args = parser.parse_args()
    fabric = Fabric.from_environment()
    assert fabric is not None, "run me on host 1 of the two-host lab"
    await fabric.wait_for_peer()
    size = args.size << 20
    async with remote_server(fabric, "rpc", fabric.peer_addr) as port:
        for loss in args.losses:
            await fabric.netem(None if loss == "none" else f"loss {loss}")
            try:
                for timeout in args.timeouts:
                    wait = 4.096e-6 * 2**timeout  # one try: the transport's timer
                    b1, b2 = await counters(fabric)
                    line = await one(fabric, port, timeout, size, args.calls)
                    a1, a2 = await counters(fabric)
                    print(f"loss {loss}, timeout {timeout} ({wait * 1e3:.1f} ms a try): {line}")
                    print(f"  host 1: {moved(b1, a1)}")
                    print(f"  host 2: {moved(b2, a2)}", flush=True)
            finally:
                await fabric.netem(None)


if __name__ == "__main__":
    asyncio.run(main())
