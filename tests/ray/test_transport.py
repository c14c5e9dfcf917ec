"""The Ray transport on the lab device, driven as Ray drives it, without Ray's scheduler.

A producer process (``tests.ray.producer``) extracts and frees objects; this
process receives them through the manager's methods, from threads other
than the exchange's, as Ray's ``_ray_system`` thread and ``ray.get`` do.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import os
import pickle
import queue
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy
import pytest
from ray.experimental.rdt.tensor_transport_manager import CommunicatorMetadata

from aiordma import RemoteAccessError, TransferError
from aiordma.ray import AiordmaFetch, AiordmaMetadata, AiordmaTransport, ArrayExchange, Export
from aiordma.ray.loop_thread import default_loop_factory
from tests.conftest import PEER_TIMEOUT, ROOT, Lab, popen_python
from tests.ray.producer import arrays, digests

KIB, MIB = 1 << 10, 1 << 20
COMM = CommunicatorMetadata()
"""What Ray passes a one-sided transport: nothing."""
LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": default_loop_factory,
}


READY_TIMEOUT = 600.0
"""Seconds a producer may take to start: importing Ray takes 13-15 s in a
quiet guest, and minutes on a host busy with other guests (issue 62)."""


class Producer:
    """A producer process and its command lines (see ``tests/ray/producer.py``)."""

    def __init__(self, *args: str) -> None:
        # A fork of the run's fork server (aiordma imported), which then
        # imports Ray's transport manager itself.
        self.proc = popen_python(
            ["-m", "tests.ray.producer", *args], stdin=subprocess.PIPE, cwd=ROOT
        )
        self._lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        assert self.answer(READY_TIMEOUT) == "ready"

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.strip())
        self._lines.put("")  # it exited

    def answer(self, timeout: float = PEER_TIMEOUT) -> str:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"the producer did not answer within {timeout:g} s", pytrace=False)
        if not line:
            assert self.proc.stderr is not None
            pytest.fail(f"the producer exited: {self.proc.stderr.read()}", pytrace=False)
        return line

    def ask(self, line: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.answer()

    def export(self, obj_id: str, seed: int, sizes: list[int]) -> Any:
        word, data = self.ask(f"export {obj_id} {seed} {' '.join(map(str, sizes))}").split()
        assert word == "meta"
        return pickle.loads(bytes.fromhex(data))

    def free(self, obj_id: str) -> None:
        assert self.ask(f"free {obj_id}") == "freed"

    def exported(self) -> int:
        _, count = self.ask("exported").split()
        return int(count)

    def close(self) -> None:
        """Ask it to exit (unless it is gone), wait, and close its pipes."""
        assert self.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):  # it may have just died
            if self.proc.poll() is None:
                self.proc.stdin.write("exit\n")
                self.proc.stdin.flush()
            self.proc.stdin.close()
        rc = self.proc.wait(timeout=PEER_TIMEOUT)
        self._reader.join(timeout=PEER_TIMEOUT)  # it ends at the pipe's end
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()
        assert rc in (0, -signal.SIGKILL), f"the producer exited with {rc}"


@pytest.fixture(scope="module")
def producer(lab: Lab) -> Iterator[Producer]:
    """A producer process using the Ray manager, for the module."""
    proc = Producer()
    try:
        yield proc
    finally:
        proc.close()


@pytest.fixture
def consumer(lab: Lab) -> Iterator[AiordmaTransport]:
    """This process's manager, as Ray makes it (closed after the test)."""
    manager = AiordmaTransport()
    try:
        yield manager
    finally:
        manager.exchange.close()


def in_thread(call: Callable[[], Any]) -> Any:
    """``call()`` on a thread of its own (as Ray's ``_ray_system`` thread), its result here."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(call).result(timeout=PEER_TIMEOUT)


def recv(manager: AiordmaTransport, obj_id: str, meta: Any, targets: Any = None) -> Any:
    return in_thread(lambda: manager.recv_multiple_tensors(obj_id, meta, COMM, targets))


@pytest.mark.parametrize(
    "sizes",
    [[KIB], [MIB, 3, 0, 5 * KIB + 1], [16 * MIB], [64 * MIB]],
    ids=["1KiB", "mixed", "16MiB", "64MiB"],
)
def test_an_object_arrives_byte_for_byte(
    producer: Producer, consumer: AiordmaTransport, sizes: list[int]
) -> None:
    obj_id = f"round-{len(sizes)}-{sizes[0]}"
    meta = producer.export(obj_id, 7, sizes)
    assert isinstance(meta, AiordmaMetadata)
    expected = arrays(7, sizes)
    assert [tuple(s) for s, _ in meta.tensor_meta] == [a.shape for a in expected]
    got = recv(consumer, obj_id, meta)
    assert [a.dtype for a in got] == [a.dtype for a in expected]
    assert [a.shape for a in got] == [a.shape for a in expected]
    assert digests(got) == digests(expected)
    assert all(a.flags.writeable and a.flags.c_contiguous for a in got)  # the caller's own
    producer.free(obj_id)


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_the_exchange_runs_on_either_loop(producer: Producer, lab: Lab, loop: str) -> None:
    meta = producer.export(f"loop-{loop}", 3, [MIB, 4 * KIB])
    exchange = ArrayExchange(loop_factory=LOOPS[loop])
    try:
        got = in_thread(
            lambda: exchange.receive(f"loop-{loop}", meta.export(), timeout=PEER_TIMEOUT)
        )
        assert digests(got) == digests(arrays(3, [MIB, 4 * KIB]))
        assert exchange.fetching == 0
    finally:
        exchange.close()
        producer.free(f"loop-{loop}")


def test_fetches_overlap_and_land_in_target_buffers(
    producer: Producer, consumer: AiordmaTransport
) -> None:
    metas = [producer.export(f"overlap-{i}", i, [2 * MIB, 64 * KIB]) for i in range(3)]

    def start(i: int) -> AiordmaFetch:
        return consumer.fetch_multiple_tensors(f"overlap-{i}", metas[i], COMM)

    requests = [in_thread(functools.partial(start, i)) for i in range(2)]
    targets = [numpy.empty_like(a, order="C") for a in arrays(2, [2 * MIB, 64 * KIB])]
    got = recv(consumer, "overlap-2", metas[2], targets)
    assert all(g is t for g, t in zip(got, targets, strict=True))
    for i, request in enumerate(requests):
        assert digests(consumer.wait_fetch_complete(request)) == digests(
            arrays(i, [2 * MIB, 64 * KIB])
        )
    assert digests(got) == digests(arrays(2, [2 * MIB, 64 * KIB]))
    with pytest.raises(ValueError, match="target buffer 0 is"):
        recv(consumer, "overlap-2", metas[2], [numpy.empty(3), targets[1]])
    for i in range(3):
        producer.free(f"overlap-{i}")


def test_a_freed_object_read_late_fails_cleanly(
    producer: Producer, consumer: AiordmaTransport
) -> None:
    meta = producer.export("late", 5, [MIB])
    assert digests(recv(consumer, "late", meta)) == digests(arrays(5, [MIB]))  # connected
    before = producer.exported()
    producer.free("late")
    assert producer.exported() == before - 1
    with pytest.raises(TransferError) as caught:
        recv(consumer, "late", meta)
    assert isinstance(caught.value.__cause__, RemoteAccessError)
    # the consumer's connection was replaced: a live object still arrives
    meta = producer.export("after-late", 6, [4 * KIB])
    assert digests(recv(consumer, "after-late", meta)) == digests(arrays(6, [4 * KIB]))
    producer.free("after-late")


def test_abort_stops_a_fetch_and_leaves_the_exchange_usable(
    producer: Producer, consumer: AiordmaTransport
) -> None:
    small = producer.export("abort-warm", 1, [4 * KIB])
    recv(consumer, "abort-warm", small)  # connected: the big read is all that runs
    meta = producer.export("abort", 2, [64 * MIB])
    request = consumer.fetch_multiple_tensors("abort", meta, COMM)
    in_thread(lambda: consumer.abort_transport("abort", COMM))
    assert consumer.exchange.fetching == 0  # abort returned after the posted work completed
    with pytest.raises(TransferError, match="aborted"):
        consumer.wait_fetch_complete(request)
    assert digests(recv(consumer, "abort", meta)) == digests(arrays(2, [64 * MIB]))
    consumer.abort_transport("never-fetched", COMM)  # a no-op
    producer.free("abort")
    producer.free("abort-warm")


def test_a_killed_producer_fails_the_fetch_promptly(lab: Lab, consumer: AiordmaTransport) -> None:
    doomed = Producer("--exchange")
    try:
        warm = doomed.export("warm", 1, [4 * KIB])
        meta = doomed.export("dead", 2, [16 * MIB])
        exchange = consumer.exchange
        assert digests(
            in_thread(lambda: exchange.receive("warm", warm, timeout=PEER_TIMEOUT))
        ) == digests(arrays(1, [4 * KIB]))
        doomed.proc.send_signal(signal.SIGKILL)
        doomed.proc.wait(timeout=PEER_TIMEOUT)
        with pytest.raises((TransferError, ConnectionError)) as caught:
            in_thread(lambda: exchange.receive("dead", meta, timeout=PEER_TIMEOUT))
        assert not isinstance(caught.value, TimeoutError)
        assert isinstance(caught.value, ConnectionError | TransferError)
        assert exchange.fetching == 0
    finally:
        doomed.close()


def test_an_object_of_this_process_is_copied(lab: Lab) -> None:
    exchange = ArrayExchange()
    try:
        values = arrays(9, [64 * KIB, 12])
        export = exchange.export("mine", values)
        got = exchange.receive("mine", export, timeout=PEER_TIMEOUT)
        assert digests(got) == digests(values)
        assert all(not numpy.shares_memory(g, v) for g, v in zip(got, values, strict=True))
        exchange.free("mine")
        assert exchange.exported == 0
    finally:
        exchange.close()


def test_the_same_array_twice_is_registered_once(lab: Lab) -> None:
    exchange = ArrayExchange()
    try:
        value = arrays(4, [MIB])[0]
        first, second = exchange.export("a", [value]), exchange.export("b", [value])
        assert first.descriptors == second.descriptors  # one registration, one rkey
        exchange.free("a")
        assert exchange.receive("b", second, timeout=PEER_TIMEOUT)[0].tobytes() == value.tobytes()
        exchange.free("b")
        third = exchange.export("c", [value])
        assert third.descriptors != first.descriptors  # registered anew once all were freed
        exchange.free("c")
    finally:
        exchange.close()


def test_bad_input_is_refused_before_anything_is_registered(lab: Lab) -> None:
    exchange = ArrayExchange()
    try:
        with pytest.raises(TypeError, match="numpy arrays, not list"):
            exchange.export("x", [[1, 2, 3]])
        with pytest.raises(TypeError, match="Python objects"):
            exchange.export("x", [numpy.array([object()])])
        exchange.export("x", [numpy.zeros(4)])
        with pytest.raises(ValueError, match="exported already"):
            exchange.export("x", [numpy.zeros(4)])
        assert exchange.exported == 1
        with pytest.raises(TypeError, match="AiordmaMetadata"):
            AiordmaTransport.fetch_multiple_tensors(AiordmaTransport(), "x", object(), COMM)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"export must be an aiordma.ray.Export .* not None"):
            exchange.receive("x", None, timeout=PEER_TIMEOUT)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="timeout must be a number of seconds"):
            exchange.receive("x", exchange.export("z", [numpy.zeros(4)]), timeout="5")  # type: ignore[arg-type]
    finally:
        exchange.close()
    with pytest.raises(Exception, match="closed"):
        exchange.export("y", [numpy.zeros(4)])


def test_a_wait_names_whose_timeout_passed() -> None:
    """Issue 62: a fetch's own timeout (``timeout=0``) was reported as the
    wait's, "not done after None s"."""
    own: concurrent.futures.Future[Any] = concurrent.futures.Future()
    own.set_exception(TimeoutError("connecting to the producer timed out after 0 s"))
    with pytest.raises(TimeoutError, match="timed out after 0 s"):
        ArrayExchange.wait("x", own)
    running: concurrent.futures.Future[Any] = concurrent.futures.Future()
    with pytest.raises(TimeoutError, match=r"object x is not done after 0\.01 s"):
        ArrayExchange.wait("x", running, 0.01)


def test_the_exchange_uses_its_own_thread(lab: Lab) -> None:
    exchange = ArrayExchange()
    try:
        export = exchange.export("t", [numpy.arange(10)])
        names = {t.name for t in threading.enumerate()}
        assert "aiordma-ray" in names
        assert isinstance(export, Export)
    finally:
        exchange.close()
    assert "aiordma-ray" not in {t.name for t in threading.enumerate()}
    assert os.getpid() > 0


def test_a_wait_that_times_out_leaves_the_fetch_running(
    producer: Producer, consumer: AiordmaTransport
) -> None:
    warm = producer.export("wait-warm", 1, [4 * KIB])
    recv(consumer, "wait-warm", warm)  # connected: only the big read is left to wait for
    meta = producer.export("wait", 3, [64 * MIB])
    request = consumer.fetch_multiple_tensors("wait", meta, COMM)
    with pytest.raises(TimeoutError, match="not done after 0 s"):
        consumer.wait_fetch_complete(request, timeout=0)
    assert digests(consumer.wait_fetch_complete(request)) == digests(arrays(3, [64 * MIB]))
    producer.free("wait")
    producer.free("wait-warm")


def test_closing_the_exchange_stops_its_fetches(producer: Producer, lab: Lab) -> None:
    warm = producer.export("closing-warm", 1, [4 * KIB])
    meta = producer.export("closing", 4, [64 * MIB])
    exchange = ArrayExchange()
    try:
        exchange.receive("closing-warm", warm.export(), timeout=PEER_TIMEOUT)  # connected
        fetch = exchange.fetch("closing", meta.export(), timeout=PEER_TIMEOUT)
    finally:
        exchange.close()
    with pytest.raises(TransferError, match="aborted"):
        ArrayExchange.wait("closing", fetch)
    assert exchange.fetching == 0
    producer.free("closing")
    producer.free("closing-warm")
