"""Shared test set-up: the lab's RDMA device and the event loops every async test runs on.

Tests that take the ``lab`` fixture need a real RDMA device and are marked
``rdma``. Without a device they fail (never skip): run them with
``./dev test``, which provides one, or deselect them with ``-m "not rdma"``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass

import pytest
import pytest_asyncio
import uvloop

import aiordma
from aiordma.lab.runner import native_environment


@dataclass(frozen=True)
class Lab:
    """Where the real RDMA device of this test run is."""

    device: str
    addr: str
    addr6: str | None


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "lab" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.rdma)


@pytest.fixture(scope="session")
def lab() -> Lab:
    env = dict(os.environ) if os.environ.get("AIORDMA_DEVICE") else native_environment()
    if not env or not env.get("AIORDMA_ADDR"):
        pytest.fail(
            "this test needs a real RDMA device and none was found: run the suite with "
            "'./dev test' (it boots the rxe lab when the host has no RDMA), or deselect "
            "device tests with -m 'not rdma'",
            pytrace=False,
        )
    device = env["AIORDMA_DEVICE"]
    if not os.path.exists(f"/sys/class/infiniband/{device}"):
        pytest.fail(f"AIORDMA_DEVICE={device} names no RDMA device on this host", pytrace=False)
    return Lab(device=device, addr=env["AIORDMA_ADDR"], addr6=env.get("AIORDMA_ADDR6"))


@pytest_asyncio.fixture
async def device(lab: Lab) -> AsyncIterator[aiordma.Device]:
    """The lab device, opened for one test on that test's loop."""
    async with aiordma.Device(lab.device) as dev:
        yield dev


@pytest_asyncio.fixture
async def pair(device: aiordma.Device) -> tuple[aiordma.QueuePair, aiordma.QueuePair]:
    """Two queue pairs on the lab device, connected to each other."""
    return await aiordma.connect_loopback_pair(device)


def rdma_counts(device: str) -> dict[str, int]:
    """The device's resource counts (pd, cq, qp, cm_id, mr) across all processes."""
    out = subprocess.run(
        ["rdma", "-j", "resource", "show"], capture_output=True, text=True, check=True
    ).stdout
    row = next(r for r in json.loads(out) if r["ifname"] == device)
    return {key: row[key] for key in ("pd", "cq", "qp", "cm_id", "mr")}


PEER_TIMEOUT = 120.0
"""Seconds a peer process may take for one step (generous: the lab emulates its CPU)."""
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


async def spawn_peer(*args: str) -> asyncio.subprocess.Process:
    """Start ``python -m tests.peer ARGS`` (see tests/peer.py) as another process."""
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.peer", *args, cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


async def read_line(proc: asyncio.subprocess.Process) -> str:
    """The peer's next output line; fails with its stderr if it exits first."""
    assert proc.stdout is not None
    assert proc.stderr is not None
    async with asyncio.timeout(PEER_TIMEOUT):
        line = await proc.stdout.readline()
        if not line:
            await proc.wait()
            err = await proc.stderr.read()
            pytest.fail(f"peer exited ({proc.returncode}): {err.decode()}", pytrace=False)
    return line.decode().strip()


async def run_peer(*args: str) -> str:
    """Run a peer to completion; its stdout (it must exit 0)."""
    proc = await spawn_peer(*args)
    async with asyncio.timeout(PEER_TIMEOUT):
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def stop_peer(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.terminate()
    async with asyncio.timeout(30):
        await proc.communicate()


def start_peer_server(lab: Lab, mode: str) -> Iterator[int]:
    """Run ``tests.peer MODE`` (a server) for as long as the generator lives; yields its port."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.peer", mode, lab.addr, "0"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stderr is not None
    line = proc.stdout.readline()
    if not line.startswith("listening"):
        proc.kill()
        pytest.fail(f"peer {mode} server did not start: {proc.stderr.read()}", pytrace=False)
    try:
        yield int(line.split()[1])
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
        if proc.returncode not in (0, -15):
            pytest.fail(f"peer {mode} server failed ({proc.returncode}): {err}", pytrace=False)


@pytest.fixture(scope="module")
def peer_server(lab: Lab) -> Iterator[int]:
    """An echo server in another process (``tests.peer serve``) for a module; yields its port."""
    yield from start_peer_server(lab, "serve")
