# cython: annotation_typing=True
"""The calls an RPC client has in flight, by id (pure logic).

Every call and every reply passes through here, so the table is an
extension type when compiled (``_pending.pxd``; see :mod:`aiordma._compiled`):
:meth:`Pending.start` gives a call its id, its request frame and its future
and starts its clock; :meth:`Pending.take` matches a reply's frame to its
call and records the call's latency, with no Python frame in between.

Call order, per call: ``start -> (take | drop)``; ``clear`` takes the rest.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from aiordma import metrics
from aiordma.channel import Into
from aiordma.exceptions import ProtocolError
from aiordma.metrics import Stats, record
from aiordma.rpc.frames import Frame, FrameKind

if TYPE_CHECKING:
    from aiordma import _cython_shim as cython
else:
    try:
        import cython
    except ImportError:  # no Cython: the declarations below mean nothing
        from aiordma import _cython_shim as cython

__all__ = ["Call", "Pending"]

if TYPE_CHECKING:
    Started = tuple[int, bytes, "Call"]
    """A new call's id, request frame and record."""
    Taken = tuple[Frame, "Call | None"]
    """A reply's frame, and the call it answers."""

_REPLY = cython.declare(cython.int, FrameKind.REPLY)  # C integers for typed code
_ERROR = cython.declare(cython.int, FrameKind.ERROR)


@cython.cclass
class Call:
    """One call in flight: its ``method``, the ``future`` its caller awaits,
    the buffer its result lands in (``into``), and an ``error`` its reply
    turned out to carry (set before it completes)."""

    def __init__(self, method: str, future: asyncio.Future[Any], into: Into | None) -> None:
        self.method = method
        self.future = future
        self.into = into
        self.error: BaseException | None = None
        self.started = 0.0
        """When it was sent (``time.perf_counter()``; 0.0: not timed)."""


@cython.cclass
class Pending:
    """The calls of one client that await their reply, by call id, on ``loop``;
    counted (``calls``) and timed (``call``, from sending to the reply) in
    ``stats`` while metrics are on."""

    def __init__(self, loop: asyncio.AbstractEventLoop, stats: Stats) -> None:
        self._loop = loop
        self._stats = stats
        self._next_id = 1
        self.calls: dict[int, Call] = {}

    def __len__(self) -> int:
        return len(self.calls)

    @cython.ccall
    def start(self, method: str, into: Into | None) -> Started:
        """A new call of ``method``: its id, its request frame (packed) and
        its record (ValueError, nothing recorded, for a method name too long)."""
        call_id: cython.ulonglong = self._next_id
        head = Frame(FrameKind.REQUEST, call_id, method).pack()
        self._next_id += 1
        call = Call(method, self._loop.create_future(), into)
        if metrics._on:
            self._stats.counters["calls"] += 1
            call.started = time.perf_counter()
        self.calls[call_id] = call
        return call_id, head, call

    @cython.ccall
    def take(self, head: Any) -> Taken:
        """The frame of a reply and the call it answers, no longer pending
        (None if there is none, or its caller gave up: a late reply).
        ProtocolError for a frame a server does not send."""
        frame: Frame = Frame.unpack(head)
        kind: cython.int = frame.kind
        if kind != _REPLY and kind != _ERROR:
            raise ProtocolError(f"a server sent a {frame.kind.name} frame")
        call = self.calls.pop(frame.call_id, None)
        if call is None:
            return frame, None
        if call.started and metrics._on:
            record(self._stats.histograms, "call", time.perf_counter() - call.started)
        return frame, None if call.future.done() else call

    def get(self, call_id: int) -> Call | None:
        """The pending call ``call_id``, left pending."""
        return self.calls.get(call_id)

    def drop(self, call_id: int) -> bool:
        """Forget call ``call_id`` (its caller gave up); whether it was pending."""
        return self.calls.pop(call_id, None) is not None

    def clear(self) -> list[Call]:
        """Every pending call, no longer pending."""
        calls = list(self.calls.values())
        self.calls = {}
        return calls
