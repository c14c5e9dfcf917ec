"""The fork server (aiordma.lab.forkserver): children that behave as
``python -m MODULE`` would, started from a preloaded interpreter. No device."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from aiordma.exceptions import LabError
from aiordma.lab.forkserver import ForkServer
from tests.conftest import ROOT

CHILD = ("-m", "tests.lab.forked_child")


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
        *CHILD, "report", "a b", "c", cwd=str(tmp_path), env=env,
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
    proc = await server.spawn(*CHILD, "shutdown", stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert (proc.returncode, out, err) == (0, b"atexit ran\n", b"")


@pytest.mark.asyncio
async def test_a_signal_reaches_the_child_and_its_status_says_so(server: ForkServer) -> None:
    proc = await server.spawn(*CHILD, "wait", stdout=subprocess.PIPE)
    assert proc.stdout is not None
    assert await asyncio.wait_for(proc.stdout.readline(), 30) == b"waiting\n"
    proc.send_signal(signal.SIGSTOP)  # a stopped child is not an exited one
    proc.send_signal(signal.SIGKILL)
    assert await asyncio.wait_for(proc.wait(), 30) == -signal.SIGKILL
    proc.terminate()  # after the exit: nothing to signal, no error


SAID = "import sys; print(__name__, sys.argv, repr(sys.path[0]), 'serve' in globals())"
"""A program that says how it was run (and whether it sees the server's names)."""


@pytest.fixture
def script(tmp_path: Path) -> str:
    path = tmp_path / "prog.py"
    path.write_text(SAID + "\nraise SystemExit('bye')\n")
    return str(path)


@pytest.mark.asyncio
async def test_code_and_a_script_run_as_python_runs_them(server: ForkServer, script: str) -> None:
    said = SAID
    proc = await server.spawn("-c", said, "x", stdout=subprocess.PIPE)
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    assert out.decode() == "__main__ ['-c', 'x'] '' False\n"  # not the server's __main__
    proc = await server.spawn(script, "y", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert out.decode() == f"__main__ [{script!r}, 'y'] {os.path.dirname(script)!r} False\n"
    assert (proc.returncode, err) == (1, b"bye\n")


def test_arguments_longer_than_a_socket_buffer_arrive_whole(server: ForkServer) -> None:
    long = "x" * (1 << 20)  # as a program handed a serialized handle in its arguments
    proc = server.popen("-c", "import sys; print(len(sys.argv[1]))", long, stdout=subprocess.PIPE)
    assert proc.communicate(timeout=30) == (f"{1 << 20}\n", "")


def test_the_popen_shape_reads_text_and_waits_with_a_timeout(server: ForkServer) -> None:
    proc = server.popen(*CHILD, "wait", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "waiting\n"
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.05)
    proc.terminate()
    assert proc.communicate(timeout=30) == ("", "")
    assert proc.returncode == -signal.SIGTERM


def test_the_popen_shape_takes_lines_on_stdin_and_ends_at_its_close(server: ForkServer) -> None:
    """A command-line peer (as the Ray tests' producer): one answer per line
    written, then end of file once stdin is closed."""
    echo = "import sys\nfor line in sys.stdin: print(line.strip().upper(), flush=True)"
    proc = server.popen("-c", echo, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None
    assert proc.stdout is not None
    for word in ("one", "two"):
        proc.stdin.write(word + "\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == word.upper() + "\n"  # answered before the next
    proc.stdin.write("three\n")
    assert proc.communicate(timeout=30) == ("THREE\n", "")  # stdin closed: it ended
    assert proc.returncode == 0
    quiet = server.popen("-c", "import sys; print(repr(sys.stdin.read()))", stdout=subprocess.PIPE)
    assert quiet.stdin is None
    assert quiet.communicate(timeout=30) == ("''\n", "")  # /dev/null unless asked


def test_a_fork_is_refused_where_a_fresh_interpreter_would_differ(server: ForkServer) -> None:
    assert server.can_run(CHILD)
    assert server.can_run(CHILD, dict(os.environ, FORKED="1"))
    assert server.can_run(["-m", "tests.peer"])  # not preloaded: it imports it itself
    assert not server.can_run(["-u", "-m", "tests.peer"])  # an interpreter option
    assert not server.can_run([])  # a program from stdin
    with pytest.raises(ValueError, match="not \\['-X', 'dev'\\]"):
        server.popen("-X", "dev")
    other = "0" if os.environ.get("AIORDMA_PURE") == "1" else "1"
    assert not server.can_run(CHILD, dict(os.environ, AIORDMA_PURE=other))
    assert not server.can_run(CHILD, dict(os.environ, PYTHONPATH="/nowhere"))


def test_closing_the_server_kills_its_children_and_later_requests_fail() -> None:
    server = ForkServer.start(["tests.lab.forked_child"], cwd=ROOT)
    proc = server.popen(*CHILD, "wait", stdout=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "waiting\n"
    server.close()
    assert proc.wait(timeout=30) == -signal.SIGKILL
    assert not server.can_run(CHILD)
    with pytest.raises(LabError, match="has exited"):
        server.popen(*CHILD, "report")


def test_a_server_that_cannot_preload_says_so() -> None:
    with pytest.raises(LabError, match="did not start"):
        ForkServer.start(["tests.lab.no_such_module"], cwd=ROOT)
