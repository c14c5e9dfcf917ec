"""One process's side of array transfers: a transfer agent on its own loop thread.

The producer *exports* an object's arrays (registers them for remote reads,
no copy) and hands out an :class:`Export`; a consumer *fetches* them with
one descriptor-list READ into memory it then owns; the producer *frees* the
object when no reference is left. Every method may be called from any thread
but the exchange's own; each runs on the exchange's loop and the caller waits.

Contract: ``export`` → (any number of ``fetch`` in other processes) → ``free``;
``abort`` any time; ``close`` last.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import functools
import threading
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy

from aiordma._checks import check_seconds, check_type
from aiordma.channel import Access, PresharedKey, find_roce_endpoint
from aiordma.exceptions import ResourceClosedError, TransferError
from aiordma.ray.loop_thread import LoopThread
from aiordma.ray.specs import ArraySpec, check_target, exportable, layout, spec_of, views
from aiordma.transfer import Agent, DescriptorList, Registration, start_agent

Arrays = list[numpy.ndarray[Any, Any]]


@dataclass(frozen=True)
class Export:
    """What a consumer needs to read an exported object: the producer agent's
    metadata, the descriptor list's bytes (empty when every array is empty),
    and each array's spec."""

    agent: bytes
    descriptors: bytes
    specs: tuple[ArraySpec, ...]


class _Pin:
    """A registration for remote reads, shared by the objects that hold its memory."""

    __slots__ = ("array", "holders", "reg")

    def __init__(self, reg: Registration, array: numpy.ndarray[Any, Any]) -> None:
        self.reg = reg
        self.array = array  # keeps the memory alive while registered
        self.holders = 0


class ArrayExchange:
    """A process's transfer agent for arrays, started on first use (see the module).

    ``auth``: the key every connection between exchanges proves. ``host``:
    where the agent listens (the first active RoCE port's IPv4 address when
    None). ``loop_factory``: the loop the agent runs on (uvloop when
    installed). ``reuse``: share one registration between objects exporting
    the same memory (the same array returned again before it was freed).
    """

    def __init__(
        self,
        *,
        auth: PresharedKey | bytes | None = None,
        host: str | None = None,
        loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
        reuse: bool = True,
    ) -> None:
        self._auth = PresharedKey(auth) if isinstance(auth, bytes | bytearray) else auth
        self._host = host
        self._loop_factory = loop_factory
        self._reuse = reuse
        self._start_lock = threading.Lock()
        self._thread: LoopThread | None = None
        self._agent: Agent | None = None
        self._closed = False
        # Touched on the loop thread only:
        self._exports: dict[str, list[_Pin]] = {}
        self._arrays: dict[str, Arrays] = {}
        """Each export's arrays as registered (for a fetch from this same process)."""
        self._pins: dict[tuple[int, int], _Pin] = {}
        self._fetches: dict[str, set[asyncio.Task[Arrays]]] = {}

    def __repr__(self) -> str:
        state = "closed" if self._closed else "started" if self._agent else "not started"
        return f"<ArrayExchange {state} exports={len(self._exports)}>"

    # -- start and stop --------------------------------------------------------

    def _started(self) -> tuple[LoopThread, Agent]:
        with self._start_lock:
            if self._closed:
                raise ResourceClosedError("this array exchange is closed")
            if self._thread is None or self._agent is None:
                thread = LoopThread(self._loop_factory, name="aiordma-ray")
                try:
                    self._agent = thread.run(self._start_agent())
                except BaseException:
                    thread.close()
                    raise
                self._thread = thread
                atexit.register(_close_at_exit, weakref.ref(self))
            return self._thread, self._agent

    async def _start_agent(self) -> Agent:
        host = self._host
        if host is None:
            found = find_roce_endpoint(family=4) or find_roce_endpoint(family=6)
            if found is None:
                raise OSError(
                    "this host has no active RoCE port with an IP address: the "
                    "aiordma transport cannot listen"
                )
            host = str(found.address)
        return await start_agent(host, 0, auth=self._auth)

    @property
    def metadata(self) -> bytes:
        """This process's agent metadata (starts the exchange)."""
        return self._started()[1].metadata()

    @property
    def thread_id(self) -> int | None:
        """The kernel's id of the exchange's loop thread (None before it started)."""
        thread = self._thread
        return None if thread is None else thread.native_id

    def close(self) -> None:
        """Cancel running fetches, unregister every export, close the agent and its loop."""
        with self._start_lock:
            if self._closed:
                return
            self._closed = True
            thread, self._thread = self._thread, None
        if thread is None:
            return
        try:
            thread.run(self._close_agent())
        finally:
            thread.close()

    async def _close_agent(self) -> None:
        running = [task for tasks in self._fetches.values() for task in tasks]
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)  # their posted work completed
        agent, self._agent = self._agent, None
        self._exports.clear()
        self._arrays.clear()
        self._pins.clear()
        if agent is not None:
            agent.close()
            await agent.wait_closed()

    # -- the producer ----------------------------------------------------------

    def export(self, obj_id: str, arrays: Sequence[Any]) -> Export:
        """Register ``arrays`` (numpy, any layout: a non-C-contiguous one is
        copied) for remote reads until :meth:`free` of ``obj_id``."""
        if not isinstance(obj_id, str):
            raise TypeError(f"obj_id must be a str, not {type(obj_id).__name__}")
        held = [exportable(a) for a in arrays]
        thread, agent = self._started()
        return thread.run(self._export(agent, obj_id, held))

    async def _export(self, agent: Agent, obj_id: str, arrays: Arrays) -> Export:
        if obj_id in self._exports:
            raise ValueError(f"object {obj_id} is exported already")
        pins: list[_Pin] = []
        lists: list[DescriptorList] = []
        try:
            for array in arrays:
                if array.nbytes == 0:
                    continue
                pin = self._pin(agent, array)
                pins.append(pin)
                offset = array.ctypes.data - pin.reg.mr.addr
                lists.append(pin.reg.descriptors([(offset, array.nbytes)]))
        except BaseException:
            await self._unpin(agent, pins)
            raise
        self._exports[obj_id] = pins
        self._arrays[obj_id] = arrays
        joined = lists[0] if lists else None
        for more in lists[1:]:
            joined = joined + more if joined is not None else more
        return Export(
            agent.metadata(),
            b"" if joined is None else joined.to_bytes(),
            tuple(spec_of(a) for a in arrays),
        )

    def _pin(self, agent: Agent, array: numpy.ndarray[Any, Any]) -> _Pin:
        key = (array.ctypes.data, array.nbytes)
        pin = self._pins.get(key) if self._reuse else None
        if pin is None:
            pin = _Pin(agent.register(array, remote=Access.REMOTE_READ), array)
            if self._reuse:
                self._pins[key] = pin
        pin.holders += 1
        return pin

    async def _unpin(self, agent: Agent, pins: list[_Pin]) -> None:
        for pin in pins:
            pin.holders -= 1
            if pin.holders == 0:
                key = (pin.array.ctypes.data, pin.array.nbytes)
                if self._pins.get(key) is pin:
                    del self._pins[key]
                await agent.unregister(pin.reg)

    def free(self, obj_id: str) -> None:
        """End ``obj_id``'s export: from now on a reader of it gets a
        :class:`~aiordma.TransferError`, never the memory (a no-op for an
        object not exported, or freed already)."""
        with self._start_lock:
            thread, agent = self._thread, self._agent
        if thread is None or agent is None:
            return
        thread.run(self._free(agent, obj_id))

    async def _free(self, agent: Agent, obj_id: str) -> None:
        pins = self._exports.pop(obj_id, None)
        self._arrays.pop(obj_id, None)
        if pins is not None:
            await self._unpin(agent, pins)

    @property
    def exported(self) -> int:
        """Objects exported and not yet freed."""
        return len(self._exports)

    @property
    def fetching(self) -> int:
        """Fetches running now."""
        return sum(len(tasks) for tasks in list(self._fetches.values()))

    # -- the consumer ----------------------------------------------------------

    def fetch(
        self,
        obj_id: str,
        export: Export,
        *,
        timeout: float | None,
        targets: Sequence[Any] | None = None,
    ) -> concurrent.futures.Future[Arrays]:
        """Start reading ``export``'s arrays (into ``targets`` when given,
        else into new arrays the caller owns); the future gives them.
        ``timeout`` (seconds; None: no bound) bounds the connection and the read."""
        check_type("export", export, Export, "an aiordma.ray.Export (ArrayExchange.export's)")
        timeout = check_seconds("timeout", timeout, expired=True)
        if targets is not None:
            if len(targets) != len(export.specs):
                raise ValueError(f"{len(targets)} target buffers for {len(export.specs)} arrays")
            targets = [
                check_target(t, s, i)
                for i, (t, s) in enumerate(zip(targets, export.specs, strict=True))
            ]
        thread, agent = self._started()
        read = functools.partial(self._read, agent, obj_id, export, timeout, targets)
        return thread.submit(self._tracked(obj_id, read))

    def receive(
        self,
        obj_id: str,
        export: Export,
        *,
        timeout: float | None,
        targets: Sequence[Any] | None = None,
    ) -> Arrays:
        """:meth:`fetch` and wait for the arrays (an :meth:`abort` meanwhile
        raises :class:`~aiordma.TransferError`)."""
        return self.wait(obj_id, self.fetch(obj_id, export, timeout=timeout, targets=targets))

    @staticmethod
    def wait(obj_id: str, fetch: concurrent.futures.Future[Arrays],
             timeout: float | None = None) -> Arrays:  # fmt: skip
        """The arrays of a :meth:`fetch` of ``obj_id``, waiting at most
        ``timeout`` seconds (None: until it ends) or raising TimeoutError (the
        fetch goes on); an aborted fetch raises :class:`~aiordma.TransferError`."""
        try:
            return fetch.result(timeout)
        except TimeoutError:  # (concurrent.futures.TimeoutError is this one)
            if fetch.done():  # the fetch's own: its read timed out
                raise
            raise TimeoutError(
                f"the fetch of object {obj_id} is not done after {timeout} s"
            ) from None
        except concurrent.futures.CancelledError:
            raise TransferError(f"the fetch of object {obj_id} was aborted") from None

    async def _tracked(self, obj_id: str, fetch: Callable[[], Awaitable[Arrays]]) -> Arrays:
        """Run ``fetch()`` as one of ``obj_id``'s fetches (those an abort cancels)."""
        task = asyncio.current_task()
        assert task is not None
        running = self._fetches.setdefault(obj_id, set())
        running.add(task)
        try:
            return await fetch()
        finally:
            running.discard(task)
            if not running:
                self._fetches.pop(obj_id, None)

    async def _read(
        self,
        agent: Agent,
        obj_id: str,
        export: Export,
        seconds: float | None,
        targets: Arrays | None,
    ) -> Arrays:
        specs = export.specs
        if targets is None:
            offsets, total = layout(specs)
            landing = numpy.empty(total, numpy.uint8)
            out = views(landing, specs, offsets)
            buffers = [landing] if total else []
            spans = [[(o, s.nbytes) for o, s in zip(offsets, specs, strict=True) if s.nbytes]]
        else:
            out = targets
            buffers = [t for t in targets if t.nbytes]
            spans = [[(0, t.nbytes)] for t in buffers]
        if not export.descriptors:
            if any(s.nbytes for s in specs):
                raise ValueError("the export names no memory but its arrays are not empty")
            return out
        if export.agent == agent.metadata():  # this process's own object: a copy
            mine = self._arrays.get(obj_id)
            if mine is None:
                raise TransferError(f"object {obj_id} of this process was freed")
            for target, array in zip(out, mine, strict=True):
                target[...] = array
            return out
        remote = DescriptorList.from_bytes(export.descriptors)
        peer = agent.peer(export.agent)
        regs: list[Registration] = []
        try:
            regs.extend(agent.register(b) for b in buffers)  # each one unregistered below
            local = regs[0].descriptors(spans[0])
            for reg, span in zip(regs[1:], spans[1:], strict=True):
                local = local + reg.descriptors(span)
            await agent.read(peer, local, remote, timeout=seconds)
        finally:
            for reg in regs:
                await agent.unregister(reg)
        return out

    def abort(self, obj_id: str) -> None:
        """Cancel ``obj_id``'s running fetches and return once the work they
        posted has completed (a no-op when none runs)."""
        with self._start_lock:
            thread = self._thread
        if thread is not None:
            thread.run(self._abort(obj_id))

    async def _abort(self, obj_id: str) -> None:
        tasks = list(self._fetches.get(obj_id, ()))
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _close_at_exit(exchange: weakref.ref[ArrayExchange]) -> None:
    """Close an exchange still open when the interpreter exits (a Ray worker
    ending): its memory is unregistered and its connections closed in order."""
    alive = exchange()
    if alive is not None:
        alive.close()
