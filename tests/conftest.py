"""Shared test set-up: the lab's RDMA device, the event loops async tests run on, slow tests.

Tests that take the ``lab`` fixture need a real RDMA device and are marked
``rdma``. Without a device they fail (never skip): run them with
``./dev test``, which provides one, or deselect them with ``-m "not rdma"``.
Async tests run on uvloop, and on asyncio's loop too where the loop is
their subject (:data:`LOOP_SUBJECTS`). Tests marked ``slow`` are
deselected unless ``--slow`` is given.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import gc
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
import uvloop

import aiordma
from aiordma.lab.forkserver import ForkedPopen, ForkedProcess, ForkServer
from aiordma.lab.remote import Fabric
from aiordma.lab.runner import native_environment

pytest_plugins = ["tests.costs"]  # what each test pays for, in the JUnit report


@dataclass(frozen=True)
class Lab:
    """Where the real RDMA device of this test run is."""

    device: str
    addr: str
    addr6: str | None


LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}
DEFAULT_LOOP = "uvloop"
"""The loop an async test runs on unless the loop is its subject: the one the docs recommend."""

LOOP_SUBJECTS: dict[str, str] = {
    "completion fd": "the completion and rdma_cm descriptors on the loop: reader "
    "registration, wake-ups, remove_reader on close",
    "cancellation": "cancellation and timeouts",
    "close": "close / wait_closed and the wrong-loop errors",
    "streams": "the asyncio streams adapter",
    "subprocess": "subprocesses and signals driven from the loop",
    "exception handler": "what reaches the loop's exception handler",
}
"""Where the loop is the subject: a test marked ``both_loops(AREA)`` with one
of these areas runs on asyncio's loop and on uvloop; every other async test
runs on :data:`DEFAULT_LOOP` alone. ``tests/test_loops.py`` checks that each
area keeps tests on both loops."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--loop", choices=sorted(LOOPS), action="append", dest="loops",
        help="run every async test on this event loop only (repeatable; default: "
        f"{DEFAULT_LOOP}, and both loops for tests marked both_loops)",
    )  # fmt: skip
    parser.addoption(
        "--slow", action="store_true",
        help="also run the tests marked slow (soaks and large workloads)",
    )  # fmt: skip


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    chosen = config.getoption("loops")
    if not chosen:
        chosen = list(LOOPS) if item.get_closest_marker("both_loops") else [DEFAULT_LOOP]
    return {name: LOOPS[name] for name in chosen}


def _check_both_loops(item: pytest.Item) -> None:
    for marker in item.iter_markers("both_loops"):
        if len(marker.args) != 1 or marker.args[0] not in LOOP_SUBJECTS:
            raise pytest.UsageError(
                f"{item.nodeid}: both_loops takes one area of tests.conftest.LOOP_SUBJECTS "
                f"({', '.join(map(repr, LOOP_SUBJECTS))}), not {marker.args!r}"
            )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("slow"):  # deselected, as -m "not slow" would: never skipped
        slow = [item for item in items if item.get_closest_marker("slow") is not None]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if item.get_closest_marker("slow") is None]
    for item in items:
        _check_both_loops(item)
        names = getattr(item, "fixturenames", None)
        if names is None:
            continue
        if "lab" in names or "fabric" in names:
            item.add_marker(pytest.mark.rdma)
        if "fabric" in names:
            item.add_marker(pytest.mark.two_hosts)
        if item.get_closest_marker("asyncio") is not None and "loop_errors" not in names:
            names.insert(0, "loop_errors")


@pytest_asyncio.fixture
async def loop_errors() -> AsyncIterator[list[dict[str, Any]]]:
    """Fails the test if its event loop's exception handler was called.

    aiordma reports bugs in callbacks it runs (a delivery hook that raised,
    a task that failed unobserved) through the loop's exception handler;
    such a report during a test is a failure, not log noise. A test that
    provokes one on purpose takes this fixture and empties the list.
    """
    loop = asyncio.get_running_loop()
    seen: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()

    def record(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        seen.append(context)
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(record)
    try:
        yield seen
    finally:
        loop.set_exception_handler(previous)
    if seen:
        reports = "; ".join(f"{c.get('message')}: {c.get('exception')!r}" for c in seen)
        pytest.fail(f"the event loop's exception handler was called: {reports}", pytrace=False)


def open_fds() -> collections.Counter[str]:
    """This process's open descriptors, counted by what they are (inode
    numbers left out: a device re-created by a test gets new ones)."""
    kinds: collections.Counter[str] = collections.Counter()
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
            kinds[re.sub(r":\[\d+\]$", "", os.readlink(f"/proc/self/fd/{name}"))] += 1
    return kinds


@functools.cache
def _process_singletons(addr: str) -> None:
    """Make what libraries open once per process and keep, before any count
    starts: libuv's signal pipe (made by the first uvloop loop that runs) and
    librdmacm's own verbs context per device (opened by the first cm_id bound
    to it, kept until the process exits), and the run's fork server (started
    here, importing while the tests run; see :func:`fork_server`)."""
    _start_fork_server(wait=False)

    async def listen_once() -> None:
        server = await aiordma.start_server(lambda conn: None, addr, 0)
        server.close()
        await server.wait_closed()

    uvloop.run(listen_once())


@pytest.fixture(scope="module", autouse=True)
def no_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    """In every module with device tests: the device's resource counts (pd,
    cq, qp, mr, cm_id, across processes) and this process's open descriptors
    are back where they started once the module is done."""
    items = [i for i in request.session.items if getattr(i, "module", None) is request.module]
    device = os.environ.get("AIORDMA_DEVICE")
    if not device or not any(i.get_closest_marker("rdma") for i in items):
        yield
        return
    _process_singletons(os.environ.get("AIORDMA_ADDR", ""))
    before, fds = rdma_counts(device), open_fds()
    yield
    aiordma.verbs.device._close_shared()  # devices opened by connect()/start_server() on demand
    gc.collect()
    deadline = time.monotonic() + 10  # peers' resources go when their processes are reaped
    while True:
        after = rdma_counts(device)
        leaked = {k: after[k] - before[k] for k in before if after[k] > before[k]}
        if not leaked or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not leaked, f"{request.module.__name__} left RDMA resources behind: {leaked}"
    opened = dict(open_fds() - fds)
    assert not opened, f"{request.module.__name__} left descriptors open: {opened}"


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


@pytest.fixture(scope="session")
def fabric() -> Fabric:
    """The two-host lab, driven from host 1 (where the tests run)."""
    found = Fabric.from_environment()
    if found is None:
        pytest.fail(
            "this test needs the two-host lab and runs on its host 1: './dev test' runs "
            "it (its second part boots two guests), or run "
            "'aiordma lab --hosts 2 -- .venv/bin/python -m pytest -m two_hosts'",
            pytrace=False,
        )
    return found


@pytest.fixture
def recording() -> Iterator[None]:
    """Metrics recorded for the test, whatever ``AIORDMA_METRICS`` says."""
    was = aiordma.metrics.enabled()
    aiordma.metrics.enable(True)
    yield
    aiordma.metrics.enable(was)


@pytest_asyncio.fixture
async def device(lab: Lab) -> AsyncIterator[aiordma.Device]:
    """The lab device, opened for one test on that test's loop."""
    async with aiordma.Device(lab.device) as dev:
        yield dev


async def echo_messages(channel: aiordma.MessageChannel) -> None:
    """A channel server's handler that sends every message back."""
    async for message in channel:
        await channel.send_message(message)


Pair = tuple[aiordma.QueuePair, aiordma.QueuePair]
"""What the :func:`pair` fixture gives: two connected queue pairs."""


@pytest_asyncio.fixture
async def pair(device: aiordma.Device) -> Pair:
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


@contextlib.asynccontextmanager
async def remote_server(fabric: Fabric, mode: str, addr: str, *args: str) -> AsyncIterator[int]:
    """Run ``python -m tests.peer MODE ADDR 0 ARGS`` on host 2 of the
    two-host lab for the block; yields its port."""
    proc = fabric.start([sys.executable, "-m", "tests.peer", mode, addr, "0", *args], cwd=ROOT)
    try:
        async with asyncio.timeout(PEER_TIMEOUT):
            out = await proc.wait_for_output("listening ")
        yield int(out.split("listening ", 1)[1].split()[0])
    finally:
        rc = await proc.stop()
        assert rc in (0, -15), f"host 2's {mode} server exited with {rc}:\n{proc.output()}"


_forks: list[ForkServer] = []


def fork_server() -> ForkServer | None:
    """The run's fork server (``aiordma.lab.forkserver``), preloaded with
    ``tests.peer`` and started on first use, so a peer process costs a fork
    rather than an interpreter's start and ``import aiordma`` (seconds in a
    guest); None with ``AIORDMA_TEST_FORKS=0``, or if it died."""
    server = _start_fork_server(wait=True)
    return server if server is not None and server.can_run(["-m", "tests.peer"]) else None


def run_python(
    args: Sequence[str], *, timeout: float, cwd: str | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """``subprocess.run([python, *args], capture_output=True, text=True)``:
    a fork of the run's fork server where that is the same program
    (:meth:`ForkServer.can_run`), a fresh interpreter otherwise. For tests
    whose subject is what a program does, not how an interpreter starts."""
    server = fork_server()
    if server is None or not server.can_run(args, env):
        return subprocess.run(
            [sys.executable, *args], capture_output=True, text=True, timeout=timeout,
            cwd=cwd, env=env, check=False,
        )  # fmt: skip
    proc = server.popen(*args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return subprocess.CompletedProcess([sys.executable, *args], proc.wait(), out, err)


def popen_python(
    args: Sequence[str], *, stdin: int = subprocess.DEVNULL, cwd: str | None = None
) -> subprocess.Popen[str] | ForkedPopen:
    """``subprocess.Popen([python, *args], stdout=PIPE, stderr=PIPE, text=True)``
    with ``stdin`` (``PIPE`` or ``DEVNULL``) in ``cwd``, forked where
    :func:`run_python` would fork."""
    server = fork_server()
    if server is None or not server.can_run(args):
        return subprocess.Popen(
            [sys.executable, *args], stdin=stdin, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, cwd=cwd,
        )  # fmt: skip
    return server.popen(*args, cwd=cwd, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _start_fork_server(wait: bool) -> ForkServer | None:
    if os.environ.get("AIORDMA_TEST_FORKS", "1") == "0":
        return None
    if not _forks:
        _forks.append(ForkServer.start(["tests.peer"], cwd=ROOT, wait=wait))
    return _forks[0]


def pytest_unconfigure(config: pytest.Config) -> None:
    while _forks:
        _forks.pop().close()


Peer = asyncio.subprocess.Process | ForkedProcess
"""A peer process: forked from the fork server, or a fresh interpreter."""


async def spawn_python(
    args: Sequence[str], *, stdout: int | None = subprocess.PIPE,
    stderr: int | None = subprocess.PIPE,
) -> Peer:  # fmt: skip
    """``asyncio.create_subprocess_exec(python, *args, cwd=ROOT)``, forked where
    :func:`run_python` would fork."""
    server = fork_server()
    if server is not None and server.can_run(args):
        return await server.spawn(*args, cwd=ROOT, stdout=stdout, stderr=stderr)
    return await asyncio.create_subprocess_exec(
        sys.executable, *args, cwd=ROOT, stdout=stdout, stderr=stderr
    )


async def spawn_peer(*args: str) -> Peer:
    """Start ``python -m tests.peer ARGS`` (see tests/peer.py) as another process."""
    return await spawn_python(["-m", "tests.peer", *args])


async def read_line(proc: Peer) -> str:
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


async def stop_peer(proc: Peer) -> None:
    if proc.returncode is None:
        proc.terminate()
    async with asyncio.timeout(30):
        await proc.communicate()


def start_peer_server(lab: Lab, mode: str) -> Iterator[int]:
    """Run ``tests.peer MODE`` (a server) for as long as the generator lives; yields its port."""
    server = fork_server()
    proc: subprocess.Popen[str] | ForkedPopen
    if server is not None:
        proc = server.popen(
            "-m", "tests.peer", mode, lab.addr, "0", cwd=ROOT,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
    else:
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
