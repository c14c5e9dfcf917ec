"""A Dask cluster on ``rdma://`` beside the same cluster on ``tcp://``.

    aiordma lab -- python -m benchmarks dask_cluster [--protocol rdma tcp] [--json]

For each protocol: starts a scheduler and two workers (each behind its
nanny, which spawns it, unless ``--no-nanny``) as separate processes, the
programs of the ``dask`` command line (``dask scheduler`` and ``dask
worker``), connects a client, and measures

- ``workload``: a dask.array rechunk (as tasks) from row slabs to column
  slabs of a 768 MiB integer array (``--rows``, 64 KiB each), summed per
  column: every output needs a slice of every input, so hundreds of MiB
  cross between the workers;
- ``transfer``: one 64 MiB array (``--transfer``) fetched by one worker from the other, as
  the fetching worker timed it (median of ``--rounds``, three by default);
- ``tiny``: ``--tiny`` tasks (1,000 by default) that each add one to an
  integer, spread over both workers, then summed on one of them (so half
  the results cross between the workers), as the client timed it (median of
  ``--rounds``): the cost per message, as the other two are the cost per byte.

It prints a table, or with ``--json`` one JSON line per protocol that
``tests/dask/test_cluster.py`` checks (the results must agree).

The scheduler and the nannies (or the workers, without nannies) are forks
of one interpreter that imported ``distributed`` once
(:mod:`aiordma.lab.forkserver`): in a lab guest that import is the
longest part of a process's start, which each would otherwise pay again. A
nanny still spawns its worker as Dask does, as a fresh interpreter: a fork
of a nanny would inherit its RDMA resources.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aiordma.bench.stats import percentile
from aiordma.lab.forkserver import ForkedPopen, ForkServer

ROWS, COLS, ROW_CHUNK, COL_CHUNK = 12288, 8192, 1024, 1024
TRANSFER = 64 << 20
TINY_TASKS = 1000
START_TIMEOUT = 300.0
"""Seconds for the scheduler and the workers to come up (the lab emulates its CPU)."""


SCHEDULER = ["-m", "distributed.cli.dask_scheduler"]
"""``dask scheduler``, as the interpreter's arguments."""
WORKER = ["-m", "distributed.cli.dask_worker"]
"""``dask worker``, as the interpreter's arguments."""


@contextlib.contextmanager
def cluster(protocol: str, host: str, workers: int = 2, nanny: bool = True) -> Iterator[str]:
    """A scheduler and ``workers`` workers (each behind a nanny unless not
    ``nanny``) on ``protocol``; yields the scheduler's address. Everything is
    stopped on exit."""
    tmp = Path(tempfile.mkdtemp(prefix="aiordma-dask-"))
    scheduler_file = tmp / "scheduler.json"
    procs: list[ForkedPopen] = []
    logs = []
    common = ["--no-dashboard"]
    forks = ForkServer.start(["distributed"], wait=False)
    import distributed  # noqa: F401 (the client's, imported while the fork server imports it)

    def start(name: str, argv: list[str]) -> None:
        log = open(tmp / f"{name}.log", "wb")  # noqa: SIM115 (closed below)
        logs.append(log)
        procs.append(
            forks.popen(
                *argv, stdout=log.fileno(), stderr=subprocess.STDOUT, start_new_session=True
            )
        )

    try:
        start("scheduler", [*SCHEDULER, "--protocol", protocol, "--host", host,
                            "--port", "0", "--scheduler-file", str(scheduler_file),
                            *common])  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT
        while (address := _written_address(scheduler_file)) is None:
            if procs[0].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the scheduler did not start:\n{_tail(tmp)}")
            time.sleep(0.2)
        for i in range(workers):
            start(f"worker{i}", [*WORKER, address, "--host", host,
                                 "--nthreads", "1", "--memory-limit", "0",
                                 "--nanny" if nanny else "--no-nanny", *common])  # fmt: skip
        yield address
    except BaseException:
        print(_tail(tmp), file=sys.stderr)
        raise
    finally:
        # The workers first, while the scheduler they report their close to
        # still answers (otherwise each waits out its timeout), then the scheduler.
        _stop(procs[1:])
        _stop(procs[:1])
        forks.close()
        for log in logs:
            log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _stop(procs: list[ForkedPopen]) -> None:
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _written_address(scheduler_file: Path) -> str | None:
    """The scheduler's address once its file is there and whole (the
    scheduler writes it in place: it may be seen empty or cut short)."""
    try:
        address: str = json.loads(scheduler_file.read_text())["address"]
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return None
    return address


def _tail(tmp: Path) -> str:
    parts = []
    for log in sorted(tmp.glob("*.log")):
        text = log.read_bytes()[-6000:].decode(errors="replace")
        parts.append(f"--- {log.name}\n{text}")
    return "\n".join(parts)


def _incoming(dask_worker: Any) -> list[dict[str, Any]]:
    return [
        {"total": e["total"], "duration": e["duration"]} for e in dask_worker.transfer_incoming_log
    ]


def _fetched(array: Any) -> int:
    return int(array.nbytes)


def _inc(x: int) -> int:
    return x + 1


def _total(values: list[int]) -> int:
    return sum(values)


def measure(
    address: str,
    rounds: int = 3,
    tiny_tasks: int = TINY_TASKS,
    rows: int = ROWS,
    transfer: int = TRANSFER,
    reference: bool = False,
) -> dict[str, Any]:
    """Run the workload on a ``rows`` x 8,192 array, then ``rounds``
    transfers of ``transfer`` bytes and rounds of ``tiny_tasks`` tiny tasks,
    on the cluster at ``address``; with ``reference``, also compute the
    workload in this process (dask's synchronous scheduler) for its digest."""
    import dask.array as da
    import numpy as np
    from distributed import Client

    with Client(address, timeout=START_TIMEOUT) as client:
        client.wait_for_workers(2, timeout=START_TIMEOUT)
        workers = sorted(client.scheduler_info()["workers"])
        before = sum(len(v) for v in client.run(_incoming).values())

        rng = da.random.default_rng(2026)
        # At least four row slabs, so that a small array still crosses between the workers.
        slab = min(ROW_CHUNK, max(1, rows // 4))
        x = rng.integers(0, 1000, size=(rows, COLS), chunks=(slab, COLS), dtype=np.int64)
        # "tasks": the slices move as task results, which workers log (a p2p
        # rechunk moves them inside its own messages, which they do not).
        y = x.rechunk((rows, COL_CHUNK), method="tasks").sum(axis=0)
        started = time.perf_counter()
        column_sums = y.compute()
        workload = time.perf_counter() - started
        moved = sum(e["total"] for v in client.run(_incoming).values() for e in v[before:])
        local = _sha(y.compute(scheduler="sync")) if reference else None

        transfers = []
        for i in range(rounds):
            data = client.scatter(np.full(transfer, i, dtype=np.uint8), workers=[workers[0]])
            seen = len(client.run(_incoming, workers=[workers[1]])[workers[1]])
            fut = client.submit(_fetched, data, workers=[workers[1]], allow_other_workers=False)
            assert fut.result() == transfer
            log = client.run(_incoming, workers=[workers[1]])[workers[1]][seen:]
            transfers.append(sum(e["duration"] for e in log if e["total"] >= transfer))
            client.cancel([data, fut])

        tiny = []
        for _ in range(rounds):
            started = time.perf_counter()
            parts = client.map(_inc, range(tiny_tasks), pure=False)
            total = client.submit(_total, parts, workers=[workers[0]], pure=False)
            assert total.result() == tiny_tasks * (tiny_tasks + 1) // 2
            tiny.append(time.perf_counter() - started)
            client.cancel([*parts, total])
    return {
        "workers": workers,
        "column_sums_sha": _sha(column_sums),
        "reference_sha": local,
        "column_sums_total": int(column_sums.sum()),
        "workload_s": workload,
        "moved_bytes": moved,
        "transfer_bytes": transfer,
        "transfer_s": percentile(transfers, 0.5),
        "tiny_tasks": tiny_tasks,
        "tiny_s": percentile(tiny, 0.5),
    }


def _sha(array: Any) -> str:
    import hashlib

    return hashlib.sha256(array.tobytes()).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocol", nargs="+", default=["rdma", "tcp"])
    parser.add_argument("--host", default=os.environ.get("AIORDMA_ADDR", "192.0.2.1"))
    parser.add_argument("--json", action="store_true", help="one JSON line per protocol")
    parser.add_argument("--rounds", type=int, default=3, help="fetches and tiny-task rounds")
    parser.add_argument("--tiny", type=int, default=TINY_TASKS, help="tasks per tiny-task round")
    parser.add_argument(
        "--rows", type=int, default=ROWS, help="rows of the workload's array (64 KiB each)"
    )
    parser.add_argument(
        "--transfer", type=int, default=TRANSFER, help="bytes of the fetched array (64 MiB)"
    )
    parser.add_argument(
        "--reference", action="store_true",
        help="also compute the workload in the client's process (its digest: reference_sha)",
    )  # fmt: skip
    parser.add_argument(
        "--nanny", action=argparse.BooleanOptionalAction, default=True,
        help="start each worker behind a nanny (dask's default)",
    )  # fmt: skip
    args = parser.parse_args()
    rows = []
    for protocol in args.protocol:
        with cluster(protocol, args.host, nanny=args.nanny) as address:
            row = {
                "protocol": protocol,
                "address": address,
                "nanny": args.nanny,
                **measure(
                    address, args.rounds, args.tiny, args.rows, args.transfer, args.reference
                ),
            }
        rows.append(row)
        if args.json:
            print(json.dumps(row), flush=True)
    if not args.json:
        print(
            f"{'':10} {'workload':>10} {'moved':>9} "
            f"{f'{args.transfer >> 20} MiB transfer':>16} {'MB/s':>7}"
            f" {f'{args.tiny} tiny tasks':>16}"
        )
        for row in rows:
            print(
                f"{row['protocol'] + '://':10} {row['workload_s']:9.1f}s "
                f"{row['moved_bytes'] / 2**20:6.0f}MiB {row['transfer_s'] * 1e3:14.0f}ms "
                f"{args.transfer / row['transfer_s'] / 1e6:7.1f} {row['tiny_s']:15.1f}s"
            )


if __name__ == "__main__":
    main()
