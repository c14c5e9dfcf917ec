"""A Dask cluster across the two-host lab's link, on ``rdma://`` (``tcp://`` too with ``--slow``).

The scheduler and one worker run on host 1, another worker on host 2 (each
with ``--no-nanny``, so that killing it kills the worker); the test is the
client. Data made on one host is consumed on the other, both ways, and the
digests must agree with the data's. Then, on ``rdma://``, host 2's worker
is killed in the middle of a task, and a new one on host 2 is cut off (the
link goes down) in the middle of another: each time the client's future
must finish on host 1's worker within distributed's own timeouts.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from aiordma.lab.forkserver import ForkedPopen, ForkServer
from aiordma.lab.remote import Fabric, PeerProcess, poll_until
from benchmarks.studies.dask_cluster import SCHEDULER, WORKER
from tests.conftest import ROOT

START = 600.0
"""Seconds for the scheduler and the workers to come up (the lab emulates its CPU)."""
SIZE = 4 << 20
"""Bytes of each array that crosses the link: past the eager limit, so they go by rendezvous."""


def _scheduler_address(path: Path) -> str | None:
    """The address in the scheduler's file, once it is written whole."""
    try:
        found: str = json.loads(path.read_text())["address"]
    except (FileNotFoundError, ValueError, KeyError):
        return None
    return found


def _tail(path: str) -> str:
    return f"--- {path}\n" + Path(path).read_bytes()[-4000:].decode(errors="replace")


def _make(size: int, seed: int) -> Any:
    import numpy as np

    return np.random.default_rng(seed).integers(0, 255, size, dtype=np.uint8)


def _digest(array: Any) -> str:
    return hashlib.sha256(memoryview(array).cast("B")).hexdigest()


def _held_digest(array: Any, started: str, release: str) -> str:
    """The digest, held the first time until the test creates ``release``
    (so that its worker can be killed or cut off in the middle of it, and
    a worker let go returns at once on its SIGTERM instead of finishing a
    fixed wait); at once when run again after its first worker was lost."""
    path = Path(started)
    if not path.exists():
        path.write_text("started")
        deadline = time.monotonic() + START
        while not Path(release).exists() and time.monotonic() < deadline:
            time.sleep(0.05)  # a worker thread: the file is the event
    return _digest(array)


@contextlib.asynccontextmanager
async def cluster(
    fabric: Fabric, protocol: str
) -> AsyncIterator[tuple[str, Callable[[str], PeerProcess]]]:
    """A scheduler and a worker on host 1; yields the scheduler's address and
    a function that starts a worker of a given name on host 2."""
    tmp = Path(tempfile.mkdtemp(prefix="aiordma-dask2-"))
    scheduler_file = tmp / "scheduler.json"
    common = ["--no-dashboard"]
    # ``dask scheduler`` and ``dask worker`` as modules, run from ROOT (where
    # the workers find this module's functions to unpickle), each a fork of
    # one interpreter that imported distributed: host 1 has one CPU, which
    # would otherwise import it once per process.
    forks = ForkServer.start(["distributed"], cwd=ROOT, wait=False)
    local: list[ForkedPopen] = []
    remote: list[PeerProcess] = []
    logs = []

    def start_here(name: str, argv: list[str]) -> None:
        log = open(tmp / f"{name}.log", "wb")  # noqa: SIM115 (closed below)
        logs.append(log)
        local.append(forks.popen(*argv, cwd=ROOT, stdout=log.fileno(), stderr=subprocess.STDOUT))

    start_here("scheduler", [*SCHEDULER, "--protocol", protocol, "--host",
                             fabric.addr, "--port", "0", "--scheduler-file", str(scheduler_file),
                             *common])  # fmt: skip
    try:
        async with asyncio.timeout(START):
            await poll_until(lambda: _scheduler_address(scheduler_file) is not None)
        address = _scheduler_address(scheduler_file)
        assert address is not None
        start_here("worker1", [*WORKER, address, "--host", fabric.addr, "--nthreads",
                               "1", "--no-nanny", "--name", "host1", *common])  # fmt: skip

        def start_there(name: str) -> PeerProcess:
            # ``dask worker`` as a module: run from ROOT, it finds this module
            # to unpickle, and host 2's agent starts it as a fork of its
            # interpreter that imported distributed (``aiordma lab --preload``).
            argv = [sys.executable, *WORKER, address, "--host", fabric.peer_addr,
                    "--nthreads", "1", "--no-nanny", "--name", name, *common]  # fmt: skip
            remote.append(fabric.start(argv, cwd=ROOT))
            return remote[-1]

        yield address, start_there
    except BaseException:
        for log in logs:  # shown with the failure
            log.flush()
            print(_tail(log.name))
        for worker in remote:
            print(f"--- host 2's worker {worker!r}\n" + worker.output()[-4000:])
        raise
    finally:
        for worker in remote:
            if worker.returncode is None:
                worker.send_signal(signal.SIGTERM)
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(60):
                        await worker.wait()
        # Host 1's worker before the scheduler, which it reports its close to
        # (a worker whose scheduler is gone waits out a timeout).
        for proc in reversed(local):
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        forks.close()
        for log in logs:
            log.close()


async def _workers(client: Any) -> dict[str, str]:
    """The cluster's workers: address by name."""
    info = await client.scheduler.identity()
    return {w["name"]: address for address, w in info["workers"].items()}


async def _running_on(
    client: Any, fabric: Fabric, data: Any, worker: str, name: str, release: Path
) -> Any:
    """``_held_digest(data)`` submitted to ``worker`` (others allowed), once
    it runs there: a file on the filesystem both hosts share says when."""
    started = fabric.control / f"dask-{name}-{os.getpid()}"
    started.unlink(missing_ok=True)
    slow = client.submit(_held_digest, data, str(started), str(release), workers=[worker],
                         allow_other_workers=True, pure=False)  # fmt: skip
    async with asyncio.timeout(START):
        await poll_until(started.exists)
    return slow


async def _crossed(client: Any, here: str, there: str) -> tuple[list[str], Any]:
    """Data made on each host, digested on the other: both ways across the
    link. Returns the digests and the data made on host 1."""
    made_there = client.submit(_make, SIZE, 1, workers=[there], pure=False)
    made_here = client.submit(_make, SIZE, 2, workers=[here], pure=False)
    crossed = await client.gather(
        [
            client.submit(_digest, made_there, workers=[here], allow_other_workers=False),
            client.submit(_digest, made_here, workers=[there], allow_other_workers=False),
        ]
    )
    return crossed, made_here


async def _run(fabric: Fabric, protocol: str, faults: bool) -> dict[str, Any]:
    """The crossing workload on ``protocol``; with ``faults``, then host 2's
    worker killed mid-task, then a new one on host 2 cut off mid-task."""
    from distributed import Client

    async with (
        cluster(fabric, protocol) as (address, start_there),
        Client(address, asynchronous=True, timeout=START) as client,
    ):
        first = start_there("host2")
        await client.wait_for_workers(2, timeout=START)
        workers = await _workers(client)
        here, there = workers["host1"], workers["host2"]
        assert here.startswith(f"{protocol}://{fabric.addr}:")
        assert there.startswith(f"{protocol}://{fabric.peer_addr}:")
        crossed, made_here = await _crossed(client, here, there)
        result: dict[str, Any] = {"crossed": crossed}
        if not faults:
            return result

        release = fabric.control / f"dask-release-{protocol}-{os.getpid()}"
        release.unlink(missing_ok=True)
        try:
            # Host 2's worker dies in the middle of a task that needs data from host 1.
            slow = await _running_on(
                client, fabric, made_here, there, f"killed-{protocol}", release
            )
            first.send_signal(signal.SIGKILL)
            killed_at = time.monotonic()
            async with asyncio.timeout(START):
                result["survived_kill"] = await slow
            result["recovered_kill_s"] = time.monotonic() - killed_at

            # Another worker on host 2 (the killed one is gone: its task was
            # rescheduled), whose host is cut off in the middle of a task.
            start_there("host2-again")
            await client.wait_for_workers(2, timeout=START)
            there = (await _workers(client))["host2-again"]
            slow = await _running_on(client, fabric, made_here, there, f"cut-{protocol}", release)
            await fabric.link(False)
            cut_at = time.monotonic()
            try:
                async with asyncio.timeout(START):
                    result["survived_cut"] = await slow
                result["recovered_cut_s"] = time.monotonic() - cut_at
                result["workers_after_cut"] = set(await _workers(client))
            finally:
                await fabric.link(True)
            return result
        finally:
            release.touch()  # the held tasks end, and their workers with them


@pytest.mark.asyncio
@pytest.mark.timeout(2400)
async def test_a_cluster_across_two_hosts_computes_right_and_outlives_lost_workers(
    fabric: Fabric,
) -> None:
    expected = [_digest(_make(SIZE, 1)), _digest(_make(SIZE, 2))]
    rdma = await _run(fabric, "rdma", faults=True)
    assert rdma["crossed"] == expected
    # A killed worker's task is run again on host 1 (distributed reschedules it).
    assert rdma["survived_kill"] == expected[1]
    assert rdma["recovered_kill_s"] < START, rdma
    # A cut-off worker is let go by the scheduler once its keepalive fails,
    # without waiting for distributed's worker TTL, and its task runs on host 1.
    assert rdma["survived_cut"] == expected[1]
    assert rdma["workers_after_cut"] == {"host1"}, rdma
    assert rdma["recovered_cut_s"] < 240, rdma


@pytest.mark.asyncio
@pytest.mark.slow  # the same crossing on tcp://: Dask's own transport, as a reference
@pytest.mark.timeout(2400)
async def test_the_same_cluster_on_tcp_computes_the_same(fabric: Fabric) -> None:
    expected = [_digest(_make(SIZE, 1)), _digest(_make(SIZE, 2))]
    tcp = await _run(fabric, "tcp", faults=False)
    assert tcp["crossed"] == expected
