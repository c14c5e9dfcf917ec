# cython: annotation_typing=True
"""A table of one-sided reads or writes on one queue pair, with no Python per request.

A :class:`BulkRun` moves a table of RDMA READs or WRITEs (records of
:mod:`aiordma.bulk_table`) through one queue pair. It keeps at most ``window`` records posted, in
chunks of at most ``chunk`` whose last is signalled; the send queue
completes in order, so a signalled completion settles every record of its
chunk. Each settled chunk gives its send-queue slots back and the run
posts the next from the drain: a table of any length costs its owner one
call to start and one ``done`` at the end.

A failed record completes even unsignalled, naming itself (its ``tag``:
the owner's index, e.g. the descriptor it came from); the queue pair then
flushes the rest, and ``done`` comes once every posted record is settled.
:meth:`cancel` stops posting; ``done`` still waits for what was posted, so
the caller's buffers are never released under the device. When the send
queue has no room and nothing of the run's is in flight, ``starved(n)``
asks the owner to wait for ``n`` slots and hand them over with
:meth:`resume`.

Call order: ``start -> (complete | resume)* -> [cancel] -> complete* ->
done(error, tag)`` exactly once (``stop`` and ``detach`` from the work
engine when the queue pair closes end it the same way).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiordma.bulk_table import LAYOUT, Layout
from aiordma.exceptions import DeviceError
from aiordma.verbs.memory import MemoryRegion

if TYPE_CHECKING:
    from typing import Protocol

    from aiordma import _cython_shim as cython
    from aiordma.verbs import _engine_view
    from aiordma.verbs._work import Done

    class EngineView(_engine_view.EngineView, Protocol):
        """What a run needs of the work engine that made it."""

        def poster_error(self, wc: Any, opcode: int) -> BaseException: ...

        def poster_finished(self, poster: Any) -> None: ...
else:
    try:
        import cython
    except ImportError:  # no Cython: the declarations below mean nothing
        from aiordma import _cython_shim as cython

Starved = Callable[[int], None]
"""``starved(n)``: wait for ``n`` send-queue slots, then :meth:`BulkRun.resume`."""

_LAYOUT = cython.declare(Layout, LAYOUT)  # bulk_table's words as C integers


@cython.cclass
class BulkRun:
    """One table of one-sided requests on one queue pair (see the module's
    docstring). Made by :meth:`WorkEngine.start_bulk`."""

    def __init__(
        self, engine: EngineView, opcode: cython.int, table: Any, count: cython.Py_ssize_t,
        window: cython.int, chunk: cython.int, mrs: tuple[MemoryRegion, ...],
        done: Done, starved: Starved,
    ) -> None:  # fmt: skip
        if count < 1 or window < 1 or chunk < 1 or chunk > window:
            raise ValueError("a run needs records, and 1 <= chunk <= window")
        if len(table) < count * _LAYOUT.record_words:
            raise ValueError(f"the table holds fewer than {count} records")
        self._engine = engine
        self._post = engine.driver.post_table
        self._handlers = engine.cq.handlers
        self._sq = engine.sq
        self._kick = engine.cq.kick if engine.cq.polls else None
        self._opcode = opcode
        self._table = table
        self._count = count
        self._window = window
        self._chunk = chunk
        self._done = done
        self._starved = starved
        self._posted = 0
        self._settled = 0
        self.outstanding = 0
        """Records posted and not settled."""
        self._error: BaseException | None = None
        self._tag = -1
        self._cancelled = False
        self._stopped = False
        self._waiting = False
        self._finished = False
        self._first = engine.cq.claim_ids(window)
        for mr in mrs:
            mr._acquire()
        self._mrs = mrs

    @property
    def posted(self) -> int:
        """Records posted so far."""
        return self._posted

    @property
    def finished(self) -> bool:
        """Whether ``done`` was called (or is scheduled)."""
        return self._finished

    # -- posting -------------------------------------------------------------

    @cython.ccall
    def start(self) -> None:
        """Post the first chunks (then the drain posts the rest)."""
        self._pump()
        self._maybe_finish()

    @cython.cfunc
    def _pump(self) -> None:
        while self._error is None and not (self._cancelled or self._stopped or self._waiting):
            n: cython.Py_ssize_t = min(self._chunk, self._count - self._posted,
                                       self._window - self.outstanding)  # fmt: skip
            if n <= 0:
                return
            try:
                room: cython.bint = self._sq.try_acquire(n)
            except Exception as exc:  # the queue pair failed or is closing
                self._error = exc
                return
            if not room:
                if self.outstanding == 0:
                    self._waiting = True
                    self._starved(n)
                return  # else the next settled chunk tries again
            self._post_chunk(n)

    @cython.cfunc
    def _post_chunk(self, n: cython.Py_ssize_t) -> None:
        """Post the next ``n`` records (their slots taken)."""
        start: cython.Py_ssize_t = self._posted
        i: cython.Py_ssize_t
        for i in range(start, start + n):
            self._handlers[self._first + i % self._window] = self
        rc: cython.int = self._post(self._first, self._window, self._opcode, self._table, start, n)
        if rc:
            for i in range(start, start + n):
                self._handlers.pop(self._first + i % self._window, None)
            self._sq.release(n)
            self._error = DeviceError(rc, f"ibv_post_send failed: {_strerror(rc)}")
            return
        self._posted = start + n
        self.outstanding += n
        if self._kick is not None:
            self._kick()

    def resume(self, n: cython.Py_ssize_t) -> None:
        """The owner took ``n`` send-queue slots for the run (after ``starved(n)``)."""
        if self._finished:
            self._sq.release(n)
            return
        self._waiting = False
        if self._error is None and not (self._cancelled or self._stopped):
            self._post_chunk(n)
            self._pump()
        else:
            self._sq.release(n)
        self._maybe_finish()

    def fail_wait(self, error: BaseException) -> None:
        """Waiting for slots failed (the queue pair closed): end with ``error``."""
        if self._finished:
            return
        self._waiting = False
        if self._error is None:
            self._error = error
        self._maybe_finish()

    def cancel(self) -> None:
        """Post nothing more; ``done`` comes once what was posted is settled
        (a wait for slots is given up: its :meth:`resume` gives them back)."""
        self._cancelled = True
        self._waiting = False
        self._maybe_finish()

    # -- completions ---------------------------------------------------------

    def complete(self, wc: Any) -> None:
        """A signalled or failed record completed (called by the CQ's drain)."""
        settled: cython.Py_ssize_t = self._settled
        window: cython.Py_ssize_t = self._window
        k: cython.Py_ssize_t = wc.wr_id - self._first
        r: cython.Py_ssize_t = settled + (k - settled % window) % window
        if self._finished or k < 0 or k >= window or r >= self._posted:
            return  # not posted (any more): the run was detached meanwhile
        i: cython.Py_ssize_t
        for i in range(settled, r):  # earlier records, unsignalled: done in order
            self._handlers.pop(self._first + i % window, None)
        n: cython.Py_ssize_t = r + 1 - settled
        self._settled = r + 1
        self.outstanding -= n
        self._sq.release(n)
        if wc.status != 0:
            error = self._engine.poster_error(wc, self._opcode)
            if self._error is None:
                self._error = error
                self._tag = self._table[r * _LAYOUT.record_words + _LAYOUT.rkey_tag] >> 32
        else:
            self._pump()
        self._maybe_finish()

    @cython.cfunc
    def _maybe_finish(self) -> None:
        if self._finished or self.outstanding or self._waiting:
            return
        if self._posted < self._count and not (
            self._cancelled or self._stopped or self._error is not None
        ):
            return
        self._finish()

    @cython.cfunc
    def _finish(self) -> None:
        self._finished = True
        mrs, self._mrs = self._mrs, ()
        for mr in mrs:
            mr._release()
        self._engine.poster_finished(self)
        if self._stopped and self._error is None and self._posted < self._count:
            self._error = self._engine.close_error()
        self._done(self._error, self._tag)

    # -- closing -------------------------------------------------------------

    def stop(self) -> None:
        """The queue pair is closing or failed: post nothing more (what is
        posted still completes, or is flushed)."""
        self._stopped = True

    def detach(self, error: BaseException) -> None:
        """The queue pair is being destroyed: forget what is posted and end
        with ``error`` on the loop's next turn (idempotent)."""
        self._stopped = True
        if self._finished:
            return
        i: cython.Py_ssize_t
        for i in range(self._settled, self._posted):
            self._handlers.pop(self._first + i % self._window, None)
        self._settled = self._posted
        self.outstanding = 0
        self._waiting = False
        if self._error is None:
            self._error = error
        self._finished = True
        mrs, self._mrs = self._mrs, ()
        for mr in mrs:
            mr._release()
        loop = self._engine.cq.loop
        if not loop.is_closed():  # closed: at exit, nothing runs there any more
            loop.call_soon(self._done, self._error, self._tag)


def _strerror(rc: int) -> str:
    import os

    return os.strerror(rc)
