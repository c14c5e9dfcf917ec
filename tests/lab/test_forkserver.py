"""The fork server (aiordma.lab.forkserver): children that behave as
``python -m MODULE`` would, started from a preloaded interpreter. No device."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections.abc import Iterator

import pytest

from aiordma.exceptions import LabError
from aiordma.lab.forkserver import ForkServer
from tests.conftest import ROOT

CHILD = "tests.lab.forked_child"


@pytest.fixture(scope="module")
def server() -> Iterator[ForkServer]:
    started = ForkServer.start(["tests.lab.forked_child"], cwd=ROOT)
    yield started
    started.close()


@pytest.mark.asyncio
async def test_a_child_runs_as_python_dash_m_with_its_own_cwd_env_and_status(
    server: ForkServer, tmp_path: os.PathLike[str]
) -> None:
    env = dict(os.environ, FORKED="yes")
    proc = await server.spawn(
        CHILD, "report", "a b", "c", cwd=str(tmp_path), env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 3
    lines = out.decode().splitlines()
    assert lines == ["report a b c", str(tmp_path), str(tmp_path), "__main__", "yes"]
    assert err == b"to stderr\n"
    assert proc.pid != os.getpid()


@pytest.mark.asyncio
async def test_stderr_into_stdout_and_the_shutdown_runs(server: ForkServer) -> None:
    proc = await server.spawn(CHILD, "shutdown", stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert (proc.returncode, out, err) == (0, b"atexit ran\n", b"")


@pytest.mark.asyncio
async def test_a_signal_reaches_the_child_and_its_status_says_so(server: ForkServer) -> None:
    proc = await server.spawn(CHILD, "wait", stdout=subprocess.PIPE)
    assert proc.stdout is not None
    assert await asyncio.wait_for(proc.stdout.readline(), 30) == b"waiting\n"
    proc.send_signal(signal.SIGSTOP)  # a stopped child is not an exited one
    proc.send_signal(signal.SIGKILL)
    assert await asyncio.wait_for(proc.wait(), 30) == -signal.SIGKILL
    proc.terminate()  # after the exit: nothing to signal, no error


def test_the_popen_shape_reads_text_and_waits_with_a_timeout(server: ForkServer) -> None:
    proc = server.popen(CHILD, "wait", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "waiting\n"
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.05)
    proc.terminate()
    assert proc.communicate(timeout=30) == ("", "")
    assert proc.returncode == -signal.SIGTERM


def test_only_preloaded_modules_in_an_environment_they_read_alike(server: ForkServer) -> None:
    assert server.can_run(CHILD)
    assert server.can_run(CHILD, dict(os.environ, FORKED="1"))
    assert not server.can_run("tests.peer")
    other = "0" if os.environ.get("AIORDMA_PURE") == "1" else "1"
    assert not server.can_run(CHILD, dict(os.environ, AIORDMA_PURE=other))
    assert not server.can_run(CHILD, dict(os.environ, PYTHONPATH="/nowhere"))


def test_closing_the_server_kills_its_children_and_later_requests_fail() -> None:
    server = ForkServer.start(["tests.lab.forked_child"], cwd=ROOT)
    proc = server.popen(CHILD, "wait", stdout=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "waiting\n"
    server.close()
    assert proc.wait(timeout=30) == -signal.SIGKILL
    assert not server.can_run(CHILD)
    with pytest.raises(LabError, match="has exited"):
        server.popen(CHILD, "report")


def test_a_server_that_cannot_preload_says_so() -> None:
    with pytest.raises(LabError, match="did not start"):
        ForkServer.start(["tests.lab.no_such_module"], cwd=ROOT)
