"""Issue 64 item 4: Dask's worker-to-worker fetch of 64 MiB across the link, rdma:// and tcp://.

    aiordma lab --hosts 2 -- \
        .venv/bin/python benchmarks/records/0023-across-the-link/dask_across.py \
        [--size MIB] [--rounds N] [--protocols rdma tcp]

For each protocol: the two-host Dask cluster of ``tests/dask/test_two_hosts.py``
(scheduler and one worker on host 1, one worker on host 2, no nannies);
``--rounds`` times, an array of ``--size`` MiB is scattered to host 2's
worker and a task on host 1's worker takes it, so host 1's worker fetches
it across the link. Prints each fetch as host 1's worker logged it
(``transfer_incoming_log``: the fetch alone, not the task around it) and
what both hosts' link cards counted during each fetch.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from typing import Any

from aiordma.lab.remote import Fabric
from benchmarks.studies.dask_cluster import _fetched, _incoming

sys.path.insert(0, ".")
from tests.dask.test_two_hosts import cluster

START = 600.0


def fetches(address: str, fabric: Fabric, size: int, rounds: int) -> list[tuple[float, str]]:
    """Each fetch's seconds (host 1's worker's log) and its link line."""
    import numpy as np
    from distributed import Client

    out = []
    with Client(address, timeout=START) as client:
        client.wait_for_workers(2, timeout=START)
        workers = sorted(client.scheduler_info()["workers"])
        here = next(w for w in workers if fabric.addr in w)
        there = next(w for w in workers if w != here)
        print(f"  fetching worker {here}, holding worker {there}", flush=True)
        for i in range(rounds):
            data = client.scatter(np.full(size, i, dtype=np.uint8), workers=[there])
            seen = len(client.run(_incoming, workers=[here])[here])
            before = asyncio.run(fabric.link_bytes())
            fut = client.submit(_fetched, data, workers=[here], allow_other_workers=False)
            assert fut.result() == size
            moved = asyncio.run(fabric.link_bytes()).since(before)
            log: list[dict[str, Any]] = client.run(_incoming, workers=[here])[here][seen:]
            took = sum(e["duration"] for e in log if e["total"] >= size)
            out.append((took, moved.describe(size)))
            client.cancel([data, fut])
    return out


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=64, help="MiB")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--protocols", nargs="+", default=["rdma", "tcp"])
    args = parser.parse_args()
    fabric = Fabric.from_environment()
    assert fabric is not None, "run me on host 1 of the two-host lab"
    await fabric.wait_for_peer()
    size = args.size << 20
    for protocol in args.protocols:
        print(f"=== {protocol}://", flush=True)
        async with cluster(fabric, protocol) as (address, start_there):
            start_there("host2")
            rows = await asyncio.to_thread(fetches, address, fabric, size, args.rounds)
        for took, line in rows:
            rate = size / took / 1e6
            print(f"  {args.size} MiB fetched in {took:.2f} s ({rate:.1f} MB/s); {line}")
        median = statistics.median(t for t, _ in rows)
        print(f"  {protocol}:// median {median:.2f} s ({size / median / 1e6:.1f} MB/s)", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
