# cython: annotation_typing=True
"""The calls an RPC server runs on one connection.

Every request passes through here, from the completion that delivered it,
so :class:`Calls` is an extension type when compiled (``_calls.pxd``; see
:mod:`aiordma._compiled`): it admits a request (at most
``max_concurrency`` calls at once, holding at most about ``max_held``
bytes), starts its handler at once (a task only if it suspends), counts
what the call holds until it ends, and cancels what is left when the
connection goes.

Call order: ``(on_message | dispatch | room)* -> cancel_all``; per call,
``dispatch -> [hold_result] -> ends`` (the handler returns, or its task is done).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from aiordma import metrics
from aiordma.channel import GIVE_BACK_AFTER, MessageChannel
from aiordma.exceptions import ProtocolError
from aiordma.metrics import Stats, record
from aiordma.rpc._eager import start_eagerly
from aiordma.rpc.frames import Frame, FrameKind

if TYPE_CHECKING:
    from aiordma import _cython_shim as cython

    Run = Callable[["Calls", Frame, bytes | bytearray], Coroutine[Any, Any, None]]
    """What runs one call: its handler, then its reply."""
else:
    try:
        import cython
    except ImportError:  # no Cython: the declarations below mean nothing
        from aiordma import _cython_shim as cython

__all__ = ["Calls"]

_REQUEST = cython.declare(cython.int, FrameKind.REQUEST)  # C integers for typed code
_CANCEL = cython.declare(cython.int, FrameKind.CANCEL)
_GIVE_BACK_AFTER = cython.declare(cython.Py_ssize_t, GIVE_BACK_AFTER)


@cython.cclass
class Calls:
    """The calls running on ``channel``, each run by ``run(calls, frame,
    body)``: at most ``max_concurrency`` at once, holding at most about
    ``max_held`` bytes."""

    def __init__(
        self, channel: MessageChannel, run: Run, max_concurrency: int, max_held: int
    ) -> None:
        self._run = run
        self._max_concurrency = max_concurrency
        self._max_held = max_held
        self.channel = channel
        self.stats = Stats("rpc_server", self._gauges)
        self._loop = asyncio.get_running_loop()
        self._running: dict[int, asyncio.Task[None]] = {}
        self._holding: dict[int, tuple[int, int]] = {}
        """Bytes each running call holds: its request, its result."""
        self._requests = 0
        self._results = 0
        self._freed: asyncio.Future[None] | None = None
        self.sending: set[int] = set()
        """Calls whose handler returned, sending their reply."""
        self.held_large = False
        """Whether a request or result of ``GIVE_BACK_AFTER`` bytes or more was held."""

    def _gauges(self) -> dict[str, int]:
        return {
            "requests_held_bytes": self._requests,
            "results_held_bytes": self._results,
            "calls_running": len(self._running),
        }

    @cython.ccall
    def on_message(self, head: Any, body: Any) -> cython.bint:
        """A small message, straight from its receive buffer (the channel's
        delivery hook): False leaves a request that must wait queued."""
        frame: Frame = Frame.unpack(head)
        size: cython.Py_ssize_t = len(body)
        if frame.kind == _REQUEST and self._full(size):
            return False  # stays queued: its credit comes back only when a call ends
        self.dispatch(frame, bytes(body))
        return True

    @cython.ccall
    def dispatch(self, frame: Frame, body: bytes | bytearray) -> None:
        """Start the call a REQUEST asks for, or cancel the one a CANCEL names."""
        kind: cython.int = frame.kind
        if kind == _REQUEST:
            call_id: cython.ulonglong = frame.call_id
            size: cython.Py_ssize_t = len(body)
            if size >= _GIVE_BACK_AFTER:
                self.held_large = True
            self._holding[call_id] = (size, 0)
            self._requests += size
            coro = self._run(self, frame, body)
            if self._running:
                # Other calls (or cancellations) are scheduled: queue behind them.
                task: asyncio.Task[None] | None = self._loop.create_task(coro)
            else:
                # Started now, from the receive completion: a handler that
                # does not suspend has replied before this returns, no task.
                task = start_eagerly(self._loop, coro)
            if task is None:
                self._release(call_id)
            else:
                self._running[call_id] = task
                task.add_done_callback(functools.partial(self._finished, call_id))
        elif kind == _CANCEL:
            victim = self._running.get(frame.call_id)
            if victim is not None:
                victim.cancel()
        else:
            raise ProtocolError(f"a client sent a {frame.kind.name} frame")

    @cython.ccall
    def hold_result(self, call_id: cython.ulonglong, size: cython.Py_ssize_t) -> None:
        """Count a result of ``size`` bytes against the call ``call_id`` until it ends."""
        request, result = self._holding.get(call_id, (0, 0))
        self._holding[call_id] = (request, result + size)
        if size >= _GIVE_BACK_AFTER:
            self.held_large = True
        self._results += size

    @cython.cfunc
    def _release(self, call_id: cython.ulonglong) -> None:
        self.sending.discard(call_id)
        request, result = self._holding.pop(call_id, (0, 0))
        self._requests -= request
        self._results -= result

    @cython.cfunc
    def _full(self, size: cython.Py_ssize_t) -> cython.bint:
        """Whether a request of ``size`` bytes must wait for a call to end."""
        if len(self._running) >= self._max_concurrency:
            return True
        held: cython.Py_ssize_t = self._requests + self._results
        return held > 0 and held + size > self._max_held

    @cython.ccall
    def handled(self, started: cython.double) -> None:
        """A handler returned or raised: count its request (``requests``) and
        its time from ``started`` (``time.perf_counter()``, the ``handler``
        histogram), while metrics are on."""
        if metrics._on:
            self.stats.counters["requests"] += 1
            record(self.stats.histograms, "handler", time.perf_counter() - started)

    async def room(self, size: int | None) -> None:
        """Wait until a request of ``size`` bytes may start (None: a small one)."""
        while self._full(size or 0):
            self._freed = self._loop.create_future()
            await self._freed

    def _finished(self, call_id: int, _: object) -> None:
        self._running.pop(call_id, None)
        self._release(call_id)
        if self._freed is not None and not self._freed.done():
            self._freed.set_result(None)

    async def cancel_all(self) -> None:
        """End every call: handlers are cancelled; a call already sending its
        reply ends by itself once the channel has failed (cancelled there, it
        would keep its reply in the cancellation's reference cycle)."""
        for call_id, task in self._running.items():
            if call_id not in self.sending:
                task.cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)
