"""The two-host lab's control path (agent and remote client), on one machine.

The agent is what host 2 runs; here it runs as a local process on a
temporary control directory, which is all the two guests share.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from aiordma.exceptions import LabError
from aiordma.lab.remote import Fabric, poll_until
from tests.conftest import ROOT

STARTUP = 180
"""Seconds an agent may take to start (it answers at once once it runs)."""


@pytest_asyncio.fixture
async def local_fabric(tmp_path: Path) -> AsyncIterator[Fabric]:
    """A Fabric whose 'host 2' is an agent process on this machine."""
    agent = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aiordma.lab.agent", str(tmp_path),
        env={"AIORDMA_NIC": "eth9", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    fab = Fabric(tmp_path, "192.0.2.1", "2001:db8::1", "192.0.2.2", "2001:db8::2", "")
    try:
        # The agent imports the package first: in an emulated guest sharing
        # its cores with other guests that took over 30 s (a loaded CI run).
        async with asyncio.timeout(STARTUP):
            await fab.wait_for_peer()
        yield fab
    finally:
        (tmp_path / "stop").touch()
        async with asyncio.timeout(30):
            assert await agent.wait() == 0


@pytest.mark.asyncio
async def test_runs_a_program_and_reports_output_and_status(local_fabric: Fabric) -> None:
    assert local_fabric.peer_info()["nic"] == "eth9"
    async with asyncio.timeout(30):
        rc, out = await local_fabric.run(["sh", "-c", "echo hello from 2; echo err >&2; exit 3"])
    assert rc == 3
    assert out.splitlines() == ["hello from 2", "err"]


@pytest.mark.asyncio
@pytest.mark.both_loops("subprocess")
async def test_a_long_running_program_is_watched_and_stopped(local_fabric: Fabric) -> None:
    proc = local_fabric.start(["sh", "-c", "echo ready; exec sleep 600"])
    async with asyncio.timeout(30):
        assert "ready" in await proc.wait_for_output("ready")
        assert proc.returncode is None
        assert await proc.stop() == -signal.SIGTERM


@pytest.mark.asyncio
async def test_a_program_that_exits_early_fails_the_output_wait(local_fabric: Fabric) -> None:
    proc = local_fabric.start(["sh", "-c", "echo oops; exit 1"])
    async with asyncio.timeout(30):
        with pytest.raises(LabError, match="exited with 1 before printing 'listening'"):
            await proc.wait_for_output("listening")


@pytest.mark.asyncio
async def test_bad_requests_fail_with_status_127(local_fabric: Fabric, tmp_path: Path) -> None:
    async with asyncio.timeout(30):
        rc, out = await local_fabric.run(["/no/such/program"])
        assert rc == 127
        assert "cannot start /no/such/program" in out
        (tmp_path / "jobs" / "broken.json").write_text(json.dumps({"no argv": 1}))
        broken = tmp_path / "jobs" / "broken.rc"
        await poll_until(broken.exists)
    assert broken.read_text() == "127"


@pytest.mark.asyncio
@pytest.mark.both_loops("subprocess")
async def test_stopping_the_agent_kills_what_still_runs(tmp_path: Path) -> None:
    agent = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aiordma.lab.agent", str(tmp_path)
    )
    fab = Fabric(tmp_path, "192.0.2.1", "2001:db8::1", "192.0.2.2", "2001:db8::2", "eth9")
    async with asyncio.timeout(30):
        await fab.wait_for_peer()
        proc = fab.start(["sleep", "600"])
        await poll_until((tmp_path / "jobs" / f"{proc.id}.taken").exists)
        (tmp_path / "stop").touch()
        assert await agent.wait() == 0
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.asyncio
async def test_a_preloaded_module_runs_forked_in_its_own_session(tmp_path: Path) -> None:
    agent = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aiordma.lab.agent", str(tmp_path), "tests.lab.forked_child",
        cwd=ROOT,
    )  # fmt: skip
    fab = Fabric(tmp_path, "192.0.2.1", "2001:db8::1", "192.0.2.2", "2001:db8::2", "eth9")
    child = [sys.executable, "-m", "tests.lab.forked_child"]
    try:
        async with asyncio.timeout(STARTUP):
            await fab.wait_for_peer()
            await poll_until((tmp_path / "host2.forks").exists)  # until then: fresh ones
        async with asyncio.timeout(30):
            report = fab.start([*child, "report", "x"], cwd=str(tmp_path))
            assert await report.wait() == 3
            lines = report.output().splitlines()
            assert lines[:4] == ["report x", str(tmp_path), str(tmp_path), "__main__"]
            forked = fab.start([*child, "family"])
            pid, sid, parent = map(int, (await forked.wait_for_output("\n")).split())
            assert sid == pid  # a session of its own: the agent's kill reaches its group
            assert parent != agent.pid  # a child of the fork server, not of the agent
            assert await forked.stop() == -signal.SIGTERM
            # PYTHONPATH changes what the preloaded modules would have found: fresh
            fresh = fab.start([*child, "family"], env={"PYTHONPATH": ROOT})
            _, _, parent = map(int, (await fresh.wait_for_output("\n")).split())
            assert parent == agent.pid
            assert await fresh.stop() == -signal.SIGTERM
    finally:
        (tmp_path / "stop").touch()
        async with asyncio.timeout(30):
            assert await agent.wait() == 0


def test_from_environment_needs_host_1_of_two() -> None:
    env = {
        "AIORDMA_HOSTS": "2",
        "AIORDMA_HOST": "1",
        "AIORDMA_FABRIC": "/x",
        "AIORDMA_ADDR": "192.0.2.1",
        "AIORDMA_ADDR6": "2001:db8::1",
        "AIORDMA_PEER_ADDR": "192.0.2.2",
        "AIORDMA_PEER_ADDR6": "2001:db8::2",
        "AIORDMA_NIC": "enp0s3",
    }
    fab = Fabric.from_environment(env)
    assert fab is not None
    assert (fab.peer_addr, fab.nic, fab.control) == ("192.0.2.2", "enp0s3", Path("/x"))
    assert Fabric.from_environment(env | {"AIORDMA_HOST": "2"}) is None
    assert Fabric.from_environment({}) is None
