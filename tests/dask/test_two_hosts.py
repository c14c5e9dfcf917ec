"""A Dask cluster across the two-host lab's link, on ``rdma://`` and on ``tcp://``.

The scheduler and one worker run on host 1, another worker on host 2 (each
with ``--no-nanny``, so that killing it kills the worker); the test is the
client. Data made on one host is consumed on the other, both ways, and the
digests must agree between the protocols. Then host 2's worker is killed in
the middle of a task: the client's future must finish on host 1's worker
(distributed reschedules it) within distributed's own timeouts.
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
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from aiordma.lab.remote import Fabric, PeerProcess, poll_until
from tests.conftest import ROOT

START = 600.0
"""Seconds for the scheduler and the workers to come up (the lab emulates its CPU)."""
SIZE = 16 << 20


def _dask() -> list[str]:
    found = Path(sys.executable).parent / "dask"
    return [str(found)] if found.exists() else [sys.executable, "-m", "dask"]


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


def _slow_digest(array: Any, started: str) -> str:
    Path(started).write_text("started")
    time.sleep(20)  # the workload: long enough to be killed in the middle of
    return _digest(array)


@contextlib.asynccontextmanager
async def cluster(fabric: Fabric, protocol: str) -> AsyncIterator[tuple[str, PeerProcess]]:
    """A scheduler and a worker on host 1, a worker on host 2; yields the
    scheduler's address and host 2's worker."""
    tmp = Path(tempfile.mkdtemp(prefix="aiordma-dask2-"))
    scheduler_file = tmp / "scheduler.json"
    common = ["--no-dashboard"]
    # The workers unpickle this module's functions by reference.
    env = {**os.environ, "PYTHONPATH": ROOT}
    local: list[subprocess.Popen[bytes]] = []
    logs = []

    def start_here(name: str, argv: list[str]) -> None:
        log = open(tmp / f"{name}.log", "wb")  # noqa: SIM115 (closed below)
        logs.append(log)
        local.append(
            subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        )

    start_here("scheduler", [*_dask(), "scheduler", "--protocol", protocol, "--host",
                             fabric.addr, "--port", "0", "--scheduler-file", str(scheduler_file),
                             *common])  # fmt: skip
    remote: PeerProcess | None = None
    try:
        async with asyncio.timeout(START):
            await poll_until(lambda: _scheduler_address(scheduler_file) is not None)
        address = _scheduler_address(scheduler_file)
        assert address is not None
        start_here("worker1", [*_dask(), "worker", address, "--host", fabric.addr, "--nthreads",
                               "1", "--no-nanny", "--name", "host1", *common])  # fmt: skip
        remote = fabric.start([*_dask(), "worker", address, "--host", fabric.peer_addr,
                               "--nthreads", "1", "--no-nanny", "--name", "host2", *common],
                              env={"PYTHONPATH": ROOT}, cwd=ROOT)  # fmt: skip
        yield address, remote
    except BaseException:
        for log in logs:  # shown with the failure
            log.flush()
            print(_tail(log.name))
        if remote is not None:
            print("--- host 2's worker\n" + remote.output()[-4000:])
        raise
    finally:
        if remote is not None and remote.returncode is None:
            remote.send_signal(signal.SIGTERM)
            with contextlib.suppress(Exception):
                async with asyncio.timeout(60):
                    await remote.wait()
        for proc in reversed(local):
            proc.send_signal(signal.SIGTERM)
        for proc in local:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in logs:
            log.close()


def _workers_by_host(info: dict[str, Any], fabric: Fabric) -> tuple[str, str]:
    by_name = {w["name"]: address for address, w in info["workers"].items()}
    return by_name["host1"], by_name["host2"]


async def _running_on(client: Any, fabric: Fabric, data: Any, worker: str, name: str) -> Any:
    """``_slow_digest(data)`` submitted to ``worker`` (others allowed), once it
    runs there: a file on the filesystem both hosts share says when."""
    started = fabric.control / f"dask-{name}-{os.getpid()}"
    started.unlink(missing_ok=True)
    slow = client.submit(_slow_digest, data, str(started), workers=[worker],
                         allow_other_workers=True, pure=False)  # fmt: skip
    async with asyncio.timeout(START):
        await poll_until(started.exists)
    return slow


async def _run(fabric: Fabric, protocol: str) -> dict[str, Any]:
    from distributed import Client

    async with (
        cluster(fabric, protocol) as (address, remote),
        Client(address, asynchronous=True, timeout=START) as client,
    ):
        await client.wait_for_workers(2, timeout=START)
        here, there = _workers_by_host(await client.scheduler.identity(), fabric)
        assert here.startswith(f"{protocol}://{fabric.addr}:")
        assert there.startswith(f"{protocol}://{fabric.peer_addr}:")
        # Made on one host, digested on the other: both ways across the link.
        made_there = client.submit(_make, SIZE, 1, workers=[there], pure=False)
        made_here = client.submit(_make, SIZE, 2, workers=[here], pure=False)
        crossed = await client.gather(
            [
                client.submit(_digest, made_there, workers=[here], allow_other_workers=False),
                client.submit(_digest, made_here, workers=[there], allow_other_workers=False),
            ]
        )
        # Host 2's worker dies in the middle of a task that needs data from host 1.
        slow = await _running_on(client, fabric, made_here, there, f"task-{protocol}")
        remote.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        async with asyncio.timeout(START):
            survived = await slow
        recovered = time.monotonic() - killed_at
        return {"crossed": crossed, "survived": survived, "recovered_s": recovered}


async def _cut_off(fabric: Fabric) -> dict[str, Any]:
    from distributed import Client

    async with (
        cluster(fabric, "rdma") as (address, _),
        Client(address, asynchronous=True, timeout=START) as client,
    ):
        await client.wait_for_workers(2, timeout=START)
        here, there = _workers_by_host(await client.scheduler.identity(), fabric)
        made_here = client.submit(_make, SIZE, 2, workers=[here], pure=False)
        slow = await _running_on(client, fabric, made_here, there, "cut")
        await fabric.link(False)
        cut_at = time.monotonic()
        try:
            async with asyncio.timeout(START):
                survived = await slow
            recovered = time.monotonic() - cut_at
            workers = set((await client.scheduler.identity())["workers"])
        finally:
            await fabric.link(True)
        return {"survived": survived, "recovered_s": recovered, "workers": workers,
                "here": here, "there": there}  # fmt: skip


@pytest.mark.asyncio
@pytest.mark.timeout(2400)
@pytest.mark.uvloop_only
async def test_a_cluster_across_two_hosts_computes_what_tcp_does_and_survives_a_lost_worker(
    fabric: Fabric,
) -> None:
    expected = [_digest(_make(SIZE, 1)), _digest(_make(SIZE, 2))]
    results = {protocol: await _run(fabric, protocol) for protocol in ("rdma", "tcp")}
    for protocol, result in results.items():
        assert result["crossed"] == expected, protocol
        assert result["survived"] == expected[1], protocol
        assert result["recovered_s"] < START, protocol


@pytest.mark.asyncio
@pytest.mark.timeout(1200)
@pytest.mark.uvloop_only
async def test_a_worker_whose_host_is_cut_off_mid_task_is_replaced_by_the_other(
    fabric: Fabric,
) -> None:
    result = await _cut_off(fabric)
    assert result["survived"] == _digest(_make(SIZE, 2))
    # The scheduler let host 2's worker go (its keepalive failed) and ran the
    # task again on host 1; it did not wait for distributed's worker TTL.
    assert result["workers"] == {result["here"]}
    assert result["recovered_s"] < 240, result
