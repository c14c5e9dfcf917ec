"""What each test pays for, beside its time: a pytest plugin.

Counted per test (set-up, call and teardown), and written as the test's
properties in the JUnit report (``--junitxml``), where ``scripts/ci-report``
sums them by cost:

- ``processes``: programs started in this process (the ``subprocess.Popen``,
  ``os.posix_spawn`` and ``os.fork`` audit events), and ``programs``, what
  they were (``python -m pytest``, ``ray``...), with the fork server's
  children (``aiordma.lab.forkserver.spawn``) as ``forked python ...``;
- ``connections``: rdma_cm connections established in this process (the
  ``aiordma.connection.established`` audit event);
- ``packets``: packets the machine's RDMA devices sent (rxe's ``sent_pkts``
  counters; every process and both directions of a loopback).

A fixture of wider scope is paid for by the first test that takes it.
"""

from __future__ import annotations

import collections
import glob
import os
import sys
from collections.abc import Generator
from typing import Any

import pytest

_counts: collections.Counter[str] = collections.Counter()
_programs: list[str] = []
_SPAWNS = {"subprocess.Popen", "os.posix_spawn", "os.fork", "os.forkpty"}


def program_name(argv: Any) -> str:
    """A started program's short name: ``python -m pytest``, ``python x.py``,
    ``ib_write_bw``; a forked process is ``fork``."""
    if isinstance(argv, (str, bytes, os.PathLike)):
        argv = [argv]
    args = [os.fsdecode(a) for a in argv or ()]
    if not args:
        return "?"
    name = os.path.basename(args[0])
    if name.startswith("python") and len(args) > 1:
        if args[1] == "-m" and len(args) > 2:
            return f"python -m {args[2]}"
        if args[1] == "-c":
            return "python -c"
        return f"python {os.path.basename(args[1])}"
    return name


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event in _SPAWNS:
        _counts["processes"] += 1
        _programs.append("fork" if event.startswith("os.fork") else program_name(args[1]))
    elif event == "aiordma.lab.forkserver.spawn":
        _counts["processes"] += 1
        _programs.append("forked " + program_name([sys.executable, *args[0]]))
    elif event == "aiordma.connection.established":
        _counts["connections"] += 1


def sent_packets() -> int:
    """Packets every RDMA device of this machine has sent (0 without one)."""
    total = 0
    for path in glob.glob("/sys/class/infiniband/*/ports/*/hw_counters/sent_pkts"):
        try:
            with open(path) as f:
                total += int(f.read())
        except (OSError, ValueError):
            pass
    return total


def pytest_configure(config: pytest.Config) -> None:
    sys.addaudithook(_audit)  # hooks cannot be removed: one for the whole run


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    item.stash[_START] = (_counts.copy(), len(_programs), sent_packets())
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    yield  # the teardown report, made after this, carries the properties
    start = item.stash.get(_START, None)
    if start is None:
        return
    counts, programs, packets = start
    spent = _counts - counts
    item.user_properties.append(("processes", spent["processes"]))
    if spent["processes"]:
        item.user_properties.append(("programs", ",".join(_programs[programs:])))
    item.user_properties.append(("connections", spent["connections"]))
    item.user_properties.append(("packets", sent_packets() - packets))


_START = pytest.StashKey[tuple[collections.Counter[str], int, int]]()
