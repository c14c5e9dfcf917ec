"""Which per-message path runs, and the compiled core's handles (lab device)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest

import aiordma
from aiordma.verbs import _driver as _accel
from tests.conftest import Lab

FORCED_PURE = os.environ.get(_accel.PURE_ENV, "").strip() not in ("", "0")


def _path_in_child(env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != _accel.PURE_ENV}
    if env_value is not None:
        env[_accel.PURE_ENV] = env_value
    code = "from aiordma.verbs import _driver; print(_driver.core is None, _driver.path)"
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_the_environment_variable_forces_the_pure_path() -> None:
    assert _path_in_child("1") == f"True pure Python (forced by {_accel.PURE_ENV})"


def test_the_compiled_core_is_built_by_the_project_set_up() -> None:
    # ./dev setup (scripts/bootstrap) installs the compiler and the verbs
    # headers and builds aiordma/verbs/_driver/_core.pyx: CI must exercise the compiled path.
    assert _path_in_child("0") == "False compiled (aiordma.verbs._driver._core)"


def test_the_cli_names_the_path_in_use() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "aiordma", "info"], capture_output=True, text=True, check=True
    ).stdout
    assert f"per-message path: {_accel.path}" in out  # the child inherits our environment


@pytest.mark.asyncio
async def test_queue_pairs_use_the_compiled_core_unless_forced(
    device: aiordma.Device, pair: tuple[aiordma.QueuePair, aiordma.QueuePair]
) -> None:
    a, _ = pair
    cq = a._engine.cq
    assert cq.compiled is not FORCED_PURE
    assert (a._engine.driver is None) is FORCED_PURE


@pytest.mark.asyncio
async def test_handles_are_accepted_only_when_they_match(
    device: aiordma.Device, pair: tuple[aiordma.QueuePair, aiordma.QueuePair]
) -> None:
    core = importlib.import_module("aiordma.verbs._driver._core")  # built, even when not in use
    a, _ = pair
    cq = a._engine.cq
    address = core.find_cq(cq.cq, cq._fd)
    assert address != 0
    assert core.find_cq(cq.cq, cq._fd + 1000) == 0  # a descriptor that is not its channel's
    assert core.find_cq(a.qp, cq._fd) == 0  # not a CQ at all
    assert core.find_qp(a.qp, address, address) != 0
    assert core.find_qp(a.qp, address + 8, address + 8) == 0  # CQ pointers that do not match
    assert core.find_qp(cq.cq, address, address) == 0
    other = device.create_qp()
    try:
        assert core.find_qp(a.qp, address, address) != core.find_qp(other.qp, address, address)
    finally:
        other.destroy()


_LEFT_OPEN = """
import asyncio, sys
import aiordma

async def main():
    device = aiordma.Device(sys.argv[1])
    a, b = await aiordma.connect_loopback_pair(device)
    src, dst = device.alloc(64), device.alloc(64)
    for _ in range(3):
        (recv,) = await b.post_recv_batch([dst])
        await a.post_send(src)
        await recv
    print("exiting with everything open")

asyncio.run(main())
"""


@pytest.mark.parametrize("pure", ["0", "1"])
def test_exiting_with_resources_open_is_clean(lab: Lab, pure: str) -> None:
    env = dict(os.environ, **{_accel.PURE_ENV: pure})
    proc = subprocess.run(
        [sys.executable, "-c", _LEFT_OPEN, lab.device],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "exiting with everything open"
    assert "Error" not in proc.stderr, proc.stderr
