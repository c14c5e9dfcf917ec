# cython: annotation_typing=True
"""The records of the work engine: a validated send request, one posted
work request with what its completion must do, and the account of the
send queue's unsignalled requests.

:class:`Work` is made by the engine (``_engine.py``) for each awaited or
callback post, given a ``wr_id`` there, and handed its completion by the
CQ's drain through :meth:`Work.complete`, which calls back into the
engine that made it (a :class:`Completer`: the engine's base type, so the
call stays a C call when compiled). Compiled with the engine
(``_work.pxd``; see :mod:`aiordma._compiled`).

Call order of a :class:`Work`: ``made -> registered -> posted -> complete
-> (succeed | fail)`` (``fail`` alone when the queue pair closes first).
Of :class:`Unsignalled`: ``(next -> [queue | refused] | settled)* -> clear``.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiordma.verbs.memory import MemoryRegion, Segment

if TYPE_CHECKING:
    from aiordma import _cython_shim as cython
    from aiordma.verbs._completed import WorkCompletion
else:
    try:
        import cython
    except ImportError:  # no Cython: the declarations below mean nothing
        from aiordma import _cython_shim as cython

__all__ = ["Completer", "Done", "SendRequest", "Unsignalled", "Work", "total_length"]

Done = Callable[[BaseException | None, int], None]
"""How callback work reports, from the completion drain with no future
involved: ``done(None, n)`` on success, else ``done(error, n)``. ``n`` is
what the work names: a receive's byte length (0 on failure), or a bulk run's
failed record's tag (-1: none)."""


def total_length(segments: tuple[Segment, ...]) -> int:
    """Bytes covered by a scatter/gather list."""
    return sum(seg.length for seg in segments)


@cython.cclass
class SendRequest:
    """A validated send-queue work request, ready to post."""

    def __init__(
        self, opcode: int, segments: tuple[Segment, ...], flags: int, imm: int | None = None,
        remote_addr: int = 0, rkey: int = 0, compare_add: int = 0, swap: int = 0,
        signaled: bool = True,
    ) -> None:  # fmt: skip
        self.opcode = opcode
        self.segments = segments
        self.flags = flags
        self.imm = imm
        self.remote_addr = remote_addr
        self.rkey = rkey
        self.compare_add = compare_add
        self.swap = swap
        self.signaled = signaled


@cython.cclass
class Completer:
    """What a :class:`Work`'s completion goes to: the work engine, which
    subclasses this; ``loop`` is the event loop its work reports on."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    @cython.ccall
    def complete(self, work: Work, wc: Any) -> None:
        raise NotImplementedError


@cython.cclass
class Work:
    """One posted work request: the future to resolve (or the callback to
    call), the regions it keeps busy (and alive) until its completion, and,
    for an awaited verb, the histogram its latency goes to."""

    def __init__(
        self, engine: Completer, future: asyncio.Future[WorkCompletion] | None,
        opcode: cython.int, mrs: tuple[MemoryRegion, ...], length: cython.longlong,
        recv: cython.bint, scratch: cython.int = -1, seq: cython.longlong = 0,
        silent: cython.bint = False, done: Done | None = None,
    ) -> None:  # fmt: skip
        self.engine = engine
        self.wr_id: int = 0
        """Set when the engine registers it."""
        self.future = future
        self.done = done
        """Called instead of resolving a future (``future`` is None then)."""
        self.reported = False
        """Whether ``done`` was called."""
        self.opcode = opcode
        self.mrs = mrs
        self.length = length
        """Bytes of local memory the request covers."""
        self.recv = recv
        self.scratch = scratch
        """Offset of the atomic's result word in the scratch region (-1: none)."""
        self.seq = seq
        """Position on the send queue (send-side work only)."""
        self.silent = silent
        """Posted unsignalled: no completion entry unless it fails."""
        self.kind: str | None = None
        """The latency histogram of an awaited verb (None: not timed)."""
        self.started = 0.0

    def complete(self, wc: Any) -> None:
        self.engine.complete(self, wc)

    @property
    def settled(self) -> bool:
        """Whether the outcome was given out (the future is done, or ``done`` was called)."""
        return self.reported if self.future is None else bool(self.future.done())

    @cython.ccall
    def succeed(self, byte_len: cython.longlong, result: WorkCompletion | None) -> None:
        """Report success: ``result`` (a :class:`WorkCompletion`, made only
        for a future) resolves the future, or ``done`` gets ``byte_len``."""
        if self.future is None:
            if not self.reported:
                self.reported = True
                self._call(None, byte_len)
        elif not self.future.done():
            assert result is not None
            self.future.set_result(result)

    def fail(self, exc: BaseException, *, later: bool = False, quiet: bool = False) -> None:
        """Report failure (``done`` on the loop's next turn if ``later``; a
        future marked retrieved if ``quiet``: a consequence of closing)."""
        if self.future is None:
            if not self.reported:
                self.reported = True
                if not later:
                    self._call(exc, 0)
                elif not self.engine.loop.is_closed():  # else nothing runs there any more
                    self.engine.loop.call_soon(self._call, exc, 0)
        elif not self.future.done() and not self.future.get_loop().is_closed():
            self.future.set_exception(exc)  # the first failure: later ones name it as their cause
            if quiet:
                self.future.exception()

    def _call(self, exc: BaseException | None, byte_len: int) -> None:
        assert self.done is not None
        try:
            self.done(exc, byte_len)
        except Exception as error:  # the callback's bug must not corrupt the engine
            self.engine.loop.call_exception_handler(
                {"message": "aiordma work callback failed", "exception": error}
            )


@cython.cclass
class Unsignalled:
    """Which send-queue requests go unsignalled, and which a completion settles.

    A request that asks to go unsignalled does, unless it would be the
    ``every``-th in a row: then it is signalled, so the send queue's
    entries come back. The send queue completes in order, so a completion
    for the request at position ``seq`` settles every unsignalled one
    queued before it (no completion of their own comes). Pure accounting:
    the engine posts, and settles what this gives back.
    """

    def __init__(self, every: cython.int) -> None:
        self.every = max(1, every)
        self.seq = 0
        """The send-queue position of the newest request."""
        self._run = 0
        self._queued: collections.deque[Work] = collections.deque()

    @cython.ccall
    def next(self, signaled: cython.bint) -> cython.bint:
        """Count a new request (:attr:`seq` is its position); whether it goes
        unsignalled (asked for, and not the ``every``-th in a row)."""
        self.seq += 1
        silent: cython.bint = not signaled and self._run + 1 < self.every
        self._run = self._run + 1 if silent else 0
        return silent

    @cython.ccall
    def refused(self) -> None:
        """A post was refused: the next request is signalled, whatever it asks."""
        self._run = 0

    @cython.ccall
    def queue(self, work: Work) -> None:
        """``work`` was posted unsignalled: a later completion settles it."""
        self._queued.append(work)

    @cython.ccall
    def settled(self, seq: cython.longlong) -> Work | None:
        """The next unsignalled request a completion at ``seq`` settles, taken
        off the queue; None when there is none (the request at ``seq`` itself,
        unsignalled and failed, is taken off too: its completion is its own)."""
        queued = self._queued
        if queued:
            work: Work = queued[0]
            if work.seq <= seq:
                queued.popleft()
                if work.seq < seq:
                    return work
        return None

    def is_tail(self, work: Work | None) -> bool:
        """Whether ``work`` is the newest request and waits unsignalled."""
        return work is not None and bool(self._queued) and self._queued[-1] is work

    def clear(self) -> None:
        """Forget every queued request (the queue pair is destroyed)."""
        self._queued.clear()
