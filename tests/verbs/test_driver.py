"""The compile boundary: which driver runs, the handles the compiled one
uses, and the contract both drivers keep (lab device)."""

from __future__ import annotations

import asyncio
import importlib
import os
import subprocess
import sys

import pytest

import aiordma
from aiordma.verbs import _driver as _accel
from aiordma.verbs._driver.handles import official_handle
from aiordma.verbs.srq import SharedReceiveRing
from tests.conftest import Lab, run_python

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
    # The child inherits our environment.
    assert f"per-message path: {aiordma.verbs.per_message_path()}" in out


@pytest.mark.asyncio
async def test_queue_pairs_use_the_compiled_core_unless_forced(
    device: aiordma.Device, pair: tuple[aiordma.QueuePair, aiordma.QueuePair]
) -> None:
    a, _ = pair
    cq = a._engine.cq
    assert cq.compiled is not FORCED_PURE
    assert a._engine.driver.compiled is not FORCED_PURE


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
    # A handle pyverbs exposes is checked like a found one, and only that one.
    assert core.find_cq(cq.cq, cq._fd, address) == address
    assert core.find_cq(cq.cq, cq._fd, address + 8) == 0
    qp_address = core.find_qp(a.qp, address, address)
    assert core.find_qp(a.qp, address, address, qp_address) == qp_address
    assert core.find_qp(a.qp, address, address, qp_address + 8) == 0


class _Exposing:
    cq: object = 0x7F00_0000_1000
    qp: object = True
    fd: object = None


def test_official_handles_are_positive_addresses_only() -> None:
    assert official_handle(_Exposing(), "cq") == 0x7F00_0000_1000
    assert official_handle(_Exposing(), "qp") == 0  # a bool is no address
    assert official_handle(_Exposing(), "fd") == 0
    assert official_handle(object(), "cq") == 0  # pyverbs without the attribute


# -- the contract both drivers keep -------------------------------------------

DRIVERS = ["pure", "compiled"]


@pytest.fixture(params=DRIVERS)
def driver_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Objects created in the test get this driver (the selector reads ``core`` at creation)."""
    kind = str(request.param)
    if kind == "pure":
        monkeypatch.setattr(_accel, "core", None)
    elif _accel.core is None:
        monkeypatch.setattr(_accel, "core", importlib.import_module("aiordma.verbs._driver._core"))
    return kind


@pytest.mark.asyncio
async def test_each_driver_completes_every_kind_of_work(
    device: aiordma.Device, driver_kind: str
) -> None:
    a, b = await aiordma.connect_loopback_pair(device)
    try:
        assert a._engine.cq.compiled is (driver_kind == "compiled")
        assert a._engine.driver.compiled is (driver_kind == "compiled")
        src = device.alloc(4096)
        access = aiordma.Access.LOCAL_WRITE | aiordma.Access.REMOTE | aiordma.Access.REMOTE_ATOMIC
        dst = device.alloc(4096, access)
        src.view()[:8] = b"abcdefgh"
        # 40 receives and sends: more than one stack of work requests in C,
        # a longer chain than the pure driver has built so far.
        recvs = await b.post_recv_batch([dst[i * 64 : (i + 1) * 64] for i in range(40)])
        sends = await a.post_batch([aiordma.Send(src[:8], imm=i) for i in range(40)])
        done = await asyncio.wait_for(asyncio.gather(*sends, *recvs), 30)
        landed = done[40:]
        assert [wc.imm_data for wc in landed] == list(range(40))
        assert all(wc.byte_len == 8 for wc in landed)
        assert bytes(dst.view()[64 * 39 : 64 * 39 + 8]) == b"abcdefgh"
        # one-sided: a write, a read back, an atomic
        await a.rdma_write(src[:8], dst.remote()[1000:1008])
        await a.rdma_read(src[100:108], dst.remote()[1000:1008])
        assert bytes(src.view()[100:108]) == b"abcdefgh"
        dst.view()[2048:2056] = (41).to_bytes(8, sys.byteorder)
        assert await a.atomic_fetch_add(dst.remote()[2048:2056], 1) == 41
        assert int.from_bytes(dst.view()[2048:2056], sys.byteorder) == 42
        # a send gathered from two buffers
        (recv,) = await b.post_recv_batch([dst[3000:3100]])
        await a.post_send([src[:4], src[4:8]])
        assert (await asyncio.wait_for(recv, 30)).byte_len == 8
    finally:
        for qp in (a, b):
            qp.close()
            await qp.wait_closed()


@pytest.mark.asyncio
async def test_each_driver_counts_the_work_it_posts_and_completes(
    device: aiordma.Device, driver_kind: str
) -> None:
    a, b = await aiordma.connect_loopback_pair(device)
    try:
        src = device.alloc(64)
        dst = device.alloc(64 * 20)

        def posted(qp: aiordma.QueuePair) -> tuple[int, int, int]:
            g = qp.stats()["gauges"]
            return g["posted_sends"], g["posted_receives"], g["send_doorbells"]

        cqs = {id(qp.completion_queue): qp.completion_queue for qp in (a, b)}.values()

        def completed() -> tuple[int, int]:
            counts = [cq.waiting() for cq in cqs]
            completions = sum(int(c["completions"]) for c in counts)
            return completions, sum(int(c["wakeups"]) for c in counts)

        before_a, before_b, before_cq = posted(a), posted(b), completed()
        recvs = await b.post_recv_batch([dst[i * 64 : (i + 1) * 64] for i in range(20)])
        sends = await a.post_batch([aiordma.Send(src[:8]) for _ in range(20)])
        await asyncio.wait_for(asyncio.gather(*sends, *recvs), 30)
        after_a, after_b, after_cq = posted(a), posted(b), completed()
        assert after_a[0] - before_a[0] == 20  # sends posted
        assert after_a[2] - before_a[2] == 1  # as one chain: one doorbell
        assert after_b[1] - before_b[1] == 20  # receives posted
        assert (after_a[1], after_b[0]) == (before_a[1], before_b[0])
        assert after_cq[0] - before_cq[0] == 40  # every send signalled, every receive
        assert 1 <= after_cq[1] - before_cq[1] <= 40  # at most one wake-up per completion
    finally:
        for qp in (a, b):
            qp.close()
            await qp.wait_closed()


@pytest.mark.asyncio
async def test_each_driver_reposts_a_shared_receive_queue(
    device: aiordma.Device, driver_kind: str
) -> None:
    ring = SharedReceiveRing(device, buffers=4, buffer_size=64)
    a = device.create_qp()
    b = device.create_qp(shared_receive=ring)
    arrived: list[int] = []
    all_arrived = asyncio.get_running_loop().create_future()

    def on_packet(index: int, error: BaseException | None, length: int) -> None:
        arrived.append(length)
        ring.repost(index)
        if len(arrived) == 12 and not all_arrived.done():
            all_arrived.set_result(None)

    def on_failure(error: BaseException) -> None:  # also told when b closes, at the end
        if not all_arrived.done():
            all_arrived.set_exception(error)

    try:
        a.connect(b.local_endpoint)
        b.connect(a.local_endpoint)
        ring.attach(b, on_packet, on_failure, 4, lambda: 4)
        src = device.alloc(64)
        for i in range(12):  # three times the ring: every buffer is posted again
            await a.post_send(src[: i + 1])
        await asyncio.wait_for(all_arrived, 30)
        assert sorted(arrived) == list(range(1, 13))
    finally:
        for qp in (a, b):
            qp.close()
            await qp.wait_closed()
        await ring.aclose()


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
    proc = run_python(["-c", _LEFT_OPEN, lab.device], env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "exiting with everything open"
    assert "Error" not in proc.stderr, proc.stderr
