# cython: annotation_typing=True
"""The work-request engine of one queue pair: validated work in, futures out.

:class:`WorkEngine` owns a pyverbs ``QP`` handle and everything between "a
validated list of segments and an opcode" and "a future resolved or
failed": building work requests (reusing pyverbs objects, which are costly
to make and never freed), posting them, tracking them by ``wr_id`` on the
completion queue, resolving their futures when completions arrive, settling
unsignalled sends, and failing or flushing what is pending when the queue
pair fails or closes. It starts no tasks. On the checked path it checks
nothing the caller should have: :class:`~aiordma.QueuePair` validates
arguments and waits for queue room (``sq``/``rq``), then calls
:meth:`WorkEngine.post_sends` or :meth:`WorkEngine.post_recvs`.

It posts through its queue pair's driver (``aiordma.verbs._driver``),
compiled or pure, and never asks which; only a memory-window bind
(:meth:`WorkEngine.post_bind`, rare) goes through pyverbs itself.

Every awaited verb passes through here, so the module is compiled when the
build could (``_engine.pxd``; see :mod:`aiordma._compiled`): a single
awaited operation on plain arguments (:meth:`WorkEngine.quick_send`,
:meth:`WorkEngine.quick_recvs`, and a transfer agent's single block,
:meth:`WorkEngine.quick_block`) is checked, recorded and posted in one call,
and its completion resolves the future from the drain with no Python in
between; what is not plain goes back to the checked path.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import os
import sys
import time
from collections.abc import Callable, Sequence
from threading import get_ident
from typing import TYPE_CHECKING, Any

from pyverbs.qp import QPAttr
from pyverbs.wr import SendWR

from aiordma import _ibv, metrics
from aiordma._pyverbs import verbs_errors
from aiordma.exceptions import DeviceError, QueuePairError, ResourceClosedError
from aiordma.lifecycle import check_loop, consume_outcome
from aiordma.metrics import Stats, record
from aiordma.verbs import _driver
from aiordma.verbs._bulk import BulkRun, Starved
from aiordma.verbs._bulk import Done as BulkDone
from aiordma.verbs._completed import Opcode, WorkCompletion, from_wc
from aiordma.verbs._lane import Arrived, Failed, PacketLane, Sent
from aiordma.verbs._room import QueueRoom
from aiordma.verbs.completion import completion_error
from aiordma.verbs.memory import Access, MemoryRegion, RemoteBuffer, Segment

if TYPE_CHECKING:
    from pyverbs.cq import WC
    from pyverbs.mr import MW
    from pyverbs.pd import PD
    from pyverbs.qp import QP

    from aiordma import _cython_shim as cython
    from aiordma.verbs.completion import CompletionQueue
else:
    try:
        import cython
    except ImportError:  # no Cython: the declarations below mean nothing
        from aiordma import _cython_shim as cython

SIGNAL_FRACTION = 4
"""However many unsignalled requests are posted, at least every
``send_depth // SIGNAL_FRACTION``-th is signalled, so their send-queue entries
come back."""
ID_BLOCK = 4096
"""Work request ids an engine claims from its CQ at once (one Python call per block)."""

_SIGNALED = cython.declare(cython.int, _ibv.SEND_SIGNALED)  # C integers for typed code
_INLINE = cython.declare(cython.int, _ibv.SEND_INLINE)
_WR_SEND = cython.declare(cython.int, _ibv.WR_SEND)
_WR_SEND_IMM = cython.declare(cython.int, _ibv.WR_SEND_WITH_IMM)
_WR_WRITE = cython.declare(cython.int, _ibv.WR_RDMA_WRITE)
_WR_WRITE_IMM = cython.declare(cython.int, _ibv.WR_RDMA_WRITE_WITH_IMM)
_WR_READ = cython.declare(cython.int, _ibv.WR_RDMA_READ)
_LOCAL_WRITE = cython.declare(cython.int, int(Access.LOCAL_WRITE))
_SUCCESS = cython.declare(cython.int, _ibv.WC_SUCCESS)
__all__ = ["ID_BLOCK", "SIGNAL_FRACTION", "SendRequest", "WorkEngine", "closed_error",
           "total_length"]  # fmt: skip


def closed_error() -> BaseException:
    """The error pending and later work gets once its queue pair is closed."""
    return ResourceClosedError("queue pair is closed")


@cython.cfunc
def _let_go(mr: MemoryRegion) -> None:
    """``mr._release()``, without its Python frame unless it may wake a closer."""
    inflight: cython.Py_ssize_t = mr._inflight
    if inflight > 1 or mr._idle is None:
        mr._inflight = inflight - 1
    else:
        mr._release()


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


_OP_COUNTERS: dict[str, str] = {
    kind: "ops:" + kind
    for kind in (
        "send",
        "rdma_write",
        "rdma_read",
        *(_ibv.WR_NAMES[op] for op in _ibv.ATOMIC_OPCODES),
    )
}
"""The counter of each awaited verb, named once rather than per operation."""

Done = Callable[[BaseException | None, int], None]
"""How callback work reports: ``done(None, byte_len)`` on success, else
``done(error, 0)``; called from the completion drain, no future involved."""


@cython.cclass
class _Work:
    """One posted work request: the future to resolve (or the callback to
    call), the regions it keeps busy (and alive) until its completion, and,
    for an awaited verb, the histogram its latency goes to."""

    def __init__(
        self, engine: WorkEngine, future: asyncio.Future[WorkCompletion] | None,
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
                elif not self.engine._loop.is_closed():  # else nothing runs there any more
                    self.engine._loop.call_soon(self._call, exc, 0)
        elif not self.future.done() and not self.future.get_loop().is_closed():
            self.future.set_exception(exc)  # the first failure: later ones name it as their cause
            if quiet:
                self.future.exception()

    def _call(self, exc: BaseException | None, byte_len: int) -> None:
        assert self.done is not None
        try:
            self.done(exc, byte_len)
        except Exception as error:  # the callback's bug must not corrupt the engine
            self.engine._loop.call_exception_handler(
                {"message": "aiordma work callback failed", "exception": error}
            )


@cython.cclass
class WorkEngine:
    """Posts, tracks and completes the work requests of one pyverbs ``QP``.

    ``sq`` and ``rq`` count free send- and receive-queue entries: callers take
    them (waiting if they must) before :meth:`post_sends` /
    :meth:`post_recvs`, and completions give them back. ``alloc(size)``
    registers local scratch memory (atomic results and the marker write of
    :meth:`post_marker`) on first need. ``pd`` is the protection domain the
    queue pair is in: the quick paths post only from regions registered there.
    """

    def __init__(
        self,
        qp: QP,
        cq: CompletionQueue,
        send_depth: int,
        recv_depth: int,
        alloc: Callable[[int], MemoryRegion],
        recv_cq: CompletionQueue | None = None,
        pd: PD | None = None,
        max_inline: int = 0,
    ) -> None:
        self.qp = qp
        """The pyverbs handle (None once destroyed)."""
        self.qp_num = qp.qp_num
        self.cq = cq
        self.sq = QueueRoom(send_depth)
        self.rq = QueueRoom(recv_depth)
        self.works: dict[int, _Work] = {}
        """Posted work whose completion has not arrived, by ``wr_id``."""
        self.failure: BaseException | None = None
        """The first failed completion, once the queue pair is in the error state."""
        self.closing = False
        self.close_error: Callable[[], BaseException] = closed_error
        self.drained: asyncio.Future[None] | None = None
        """Set by a closer waiting for :attr:`works` to empty; resolved when it does."""
        self.last_send: _Work | None = None
        self.posters: list[PacketLane | BulkRun] = []
        """The compiled posters it made and that still run: packet lanes
        (:meth:`open_lane`) and bulk runs (:meth:`start_bulk`)."""
        self._loop = cq.loop
        self._alloc = alloc
        self._pd = pd
        self._max_inline = max_inline
        self._scratch: MemoryRegion | None = None
        self._scratch_free: list[int] = []
        self.driver = _driver.qp_driver(qp, cq._driver, (recv_cq or cq)._driver)
        """What posts this QP's work requests."""
        self._post_one = self.driver.post_send
        self._post_recv = self.driver.post_recv
        self._handlers = cq.handlers
        self._kick = cq.kick if cq.polls else None
        """What to tell the CQ after a one-sided post, if it polls a fixed window."""
        self._expect = cq.expect if cq.expects else None
        """What to tell the CQ after a two-sided send, if it may spin for the answer."""
        self._next_id = 0
        self._last_id = 0
        """This engine's block of work request ids: ``[_next_id, _last_id)``."""
        self._thread = 0
        """The thread the loop was last confirmed running in (:meth:`_on_loop`)."""
        self._send_seq = 0
        self._silent: collections.deque[_Work] = collections.deque()
        self._silent_run = 0
        self._signal_every = max(1, send_depth // SIGNAL_FRACTION)
        self.stats = Stats("queue_pair")
        """Operations by kind, errors by status, latency of awaited verbs."""

    # -- state -------------------------------------------------------------

    def check_usable(self) -> None:
        """Raise unless work may be posted now (right loop, open, not failed)."""
        self.cq.check_loop()
        if self.closing or self.qp is None:
            raise self.close_error()
        if self.failure is not None:
            raise self.failed_error()

    @cython.cfunc
    def _usable_now(self) -> cython.bint:
        """Whether work may be posted now, by the quick paths' test: open,
        not failed, and called from the thread the CQ's loop was confirmed
        running in while it runs (else the checked path says what is wrong)."""
        if self.closing or self.qp is None or self.failure is not None:
            return False
        if self._thread == get_ident() and self._loop.is_running():
            return True
        try:
            check_loop(self._loop)
        except Exception:
            return False
        self._thread = get_ident()
        return True

    def failed_error(self, flushed: BaseException | None = None) -> QueuePairError:
        """The error of work refused or flushed by a QP in the error state,
        naming the first failure (its cause), or the flush if none was seen."""
        first = self.failure or flushed
        error = QueuePairError(f"queue pair failed earlier: {first}")
        error.__cause__ = first
        return error

    def _fail(self, exc: BaseException) -> None:
        """The QP is in the error state: refuse new work; pending work will flush."""
        if self.failure is None:
            self.failure = exc
            err = QueuePairError(f"queue pair failed: {exc}")
            err.__cause__ = exc
            self.sq.fail(err)
            self.rq.fail(err)
            for poster in self.posters:
                poster.stop()

    # -- records -------------------------------------------------------------

    @cython.cfunc
    def _register(self, work: _Work) -> cython.ulonglong:
        """A fresh ``wr_id`` whose completion the CQ's drain gives to ``work``."""
        if self._next_id == self._last_id:
            self._next_id = self.cq.claim_ids(ID_BLOCK)
            self._last_id = self._next_id + ID_BLOCK
        wr_id: cython.ulonglong = self._next_id
        self._next_id += 1
        self._handlers[wr_id] = work
        work.wr_id = wr_id
        return wr_id

    @cython.cfunc
    def _next_send(self, signaled: cython.bint) -> cython.bint:
        """Advance the send-queue position; whether the next request goes
        unsignalled (asked for, and not the ``signal_every``-th in a row)."""
        self._send_seq += 1
        silent: cython.bint = not signaled and self._silent_run + 1 < self._signal_every
        self._silent_run = self._silent_run + 1 if silent else 0
        return silent

    @cython.cfunc
    def _timed(self, work: _Work, kind: str | None) -> None:
        """Count an awaited verb as ``kind`` and time it from now to its
        completion, while metrics are on."""
        if kind is not None and metrics._on:
            self.stats.counters[_OP_COUNTERS[kind]] += 1
            work.kind = kind
            work.started = time.perf_counter()

    # -- send side ---------------------------------------------------------

    def ensure_scratch(self) -> None:
        """Register the scratch memory atomics land in (one 8-byte word per send-queue entry)."""
        if self._scratch is None:
            self._scratch = self._alloc(8 * self.sq.size)
            self._scratch_free = list(range(0, 8 * self.sq.size, 8))

    @cython.ccall
    def quick_send(
        self, opcode: cython.int, local: object, remote: object, imm: object, kind: str
    ) -> asyncio.Future[WorkCompletion] | None:
        """Post one send, RDMA write or RDMA read of ``local`` (a
        :class:`MemoryRegion` or a :class:`Segment` of one) and return its
        future, when everything is plain: the queue pair usable from here,
        the region open and registered in its protection domain (writable,
        for a read), ``remote`` a :class:`RemoteBuffer` it fits (for writes
        and reads), ``imm`` None or 32 bits, and a send-queue entry free.
        Sends and writes that fit ``max_inline`` go inline. Returns None,
        having done nothing, otherwise: the caller takes the checked path,
        which waits for room and raises what is wrong. ``kind`` names the
        counter and latency histogram of an awaited verb (see
        :meth:`QueuePair.stats`)."""
        mr: MemoryRegion
        offset: cython.longlong
        length: cython.longlong
        if type(local) is Segment:
            mr = local.mr
            offset = local.offset
            length = local.length
        elif type(local) is MemoryRegion:
            mr = local
            offset = 0
            length = mr.length
        else:
            return None
        if mr._mr is None or mr._pd is not self._pd or not self._usable_now():
            return None
        flags: cython.int = _SIGNALED
        raddr: cython.ulonglong = 0
        rkey: cython.uint = 0
        if imm is not None and (type(imm) is not int or not 0 <= imm < 1 << 32):
            return None
        if opcode != _WR_SEND and opcode != _WR_SEND_IMM:
            if type(remote) is not RemoteBuffer or length > remote.length:
                return None
            raddr = remote.addr
            rkey = remote.rkey
            if opcode == _WR_READ and not int(mr.access) & _LOCAL_WRITE:
                return None
        if opcode != _WR_READ and length <= self._max_inline:
            flags |= _INLINE
        return self._post_quick(opcode, mr, mr.addr + offset, length, flags,
                                0 if imm is None else imm, raddr, rkey, kind)  # fmt: skip

    @cython.ccall
    def quick_block(
        self, opcode: cython.int, mr: MemoryRegion, addr: cython.ulonglong,
        length: cython.longlong, raddr: cython.ulonglong, rkey: cython.uint, counter: str,
    ) -> asyncio.Future[WorkCompletion] | None:  # fmt: skip
        """Post one RDMA write or read of ``length`` bytes at ``addr``, inside
        ``mr``, to or from the peer's ``raddr`` (all checked by the caller, as
        for :meth:`start_bulk`) and return its future, when the queue pair is
        usable from here, ``mr`` open (writable, for a read) and a send-queue
        entry free; None otherwise, having done nothing. ``counter`` counts it."""
        if mr._mr is None or not self._usable_now():
            return None
        if opcode == _WR_READ and not int(mr.access) & _LOCAL_WRITE:
            return None
        flags: cython.int = _SIGNALED
        if opcode != _WR_READ and length <= self._max_inline:
            flags |= _INLINE
        fut = self._post_quick(opcode, mr, addr, length, flags, 0, raddr, rkey, None)
        if fut is not None and metrics._on:
            self.stats.counters[counter] += 1
        return fut

    @cython.ccall
    def quick_sends(self, ops: Any, send_type: Any) -> list[asyncio.Future[WorkCompletion]] | None:
        """Post ``ops`` (a list or tuple of ``send_type``, :class:`Send`) as
        one chain and return their futures, when every one is plain: a
        :class:`MemoryRegion` or a :class:`Segment` of one, open and
        registered in this protection domain, ``imm`` None or 32 bits,
        ``inline`` left to the queue pair (inline if it fits ``max_inline``);
        the queue pair usable from here and send-queue room for all. Returns
        None, having done nothing, otherwise: the caller takes the checked
        path, which waits for room and raises what is wrong."""
        if type(ops) is not list and type(ops) is not tuple:
            return None
        count: cython.Py_ssize_t = len(ops)
        if count == 0 or count > self.sq.size or not self._usable_now():
            return None
        op: Any
        for op in ops:
            if type(op) is not send_type or op.inline is not None:
                return None
            imm = op.imm
            if imm is not None and (type(imm) is not int or not 0 <= imm < 1 << 32):
                return None
            local = op.local
            mr = local.mr if type(local) is Segment else local
            if type(mr) is not MemoryRegion or mr._mr is None or mr._pd is not self._pd:
                return None
        if not self.sq.try_acquire(count):
            return None
        works: list[tuple[int, _Work]] = []
        requests: list[tuple[Any, ...]] = []
        futures: list[asyncio.Future[WorkCompletion]] = []
        length: cython.longlong
        flags: cython.int
        for op in ops:
            local = op.local
            if type(local) is Segment:
                mr = local.mr
                length = local.length
            else:
                mr = local
                length = mr.length
            imm = op.imm
            opcode: cython.int = _WR_SEND if imm is None else _WR_SEND_IMM
            fut = self._loop.create_future()
            silent: cython.bint = self._next_send(op.signaled)
            work = _Work(self, fut, opcode, (mr,), length, False, -1, self._send_seq, silent)
            wr_id = self._register(work)
            flags = _INLINE if length <= self._max_inline else 0
            if not silent:
                flags |= _SIGNALED
            works.append((wr_id, work))
            requests.append((wr_id, opcode, flags, 0 if imm is None else imm, (local,), 0, 0, 0, 0))
            futures.append(fut)
        rc = self.driver.post_sends(requests)
        if rc:
            raise self._refused(works, self.sq, rc)
        for wr_id, work in works:
            for mr in work.mrs:
                mr._inflight += 1  # open: checked above
            self.works[wr_id] = work
            if work.silent:
                self._silent.append(work)
        self.last_send = works[-1][1]
        if metrics._on:
            self.stats.counters["ops:batched"] += count
        if self._expect is not None:
            self._expect()
        return futures

    @cython.cfunc
    def _post_quick(
        self, opcode: cython.int, mr: MemoryRegion, addr: cython.ulonglong,
        length: cython.longlong, flags: cython.int, imm: cython.uint, raddr: cython.ulonglong,
        rkey: cython.uint, kind: str | None,
    ) -> asyncio.Future[WorkCompletion] | None:  # fmt: skip
        """The posting of the quick paths (everything checked): a future, or
        None when the send queue has no free entry."""
        if not self.sq.try_acquire(1):
            return None
        fut = self._loop.create_future()
        self._next_send(True)
        work = _Work(self, fut, opcode, (mr,), length, False, -1, self._send_seq)
        wr_id = self._register(work)
        rc = self._post_one(wr_id, opcode, flags, addr, length, mr.lkey, imm, raddr, rkey)
        if rc:
            raise self._refused([(wr_id, work)], self.sq, rc)
        mr._inflight += 1  # open: checked by the caller (what _acquire does, without its frames)
        self.works[wr_id] = work
        self.last_send = work
        self._timed(work, kind)
        if opcode in (_WR_SEND, _WR_SEND_IMM, _WR_WRITE_IMM):
            if self._expect is not None:
                self._expect()
        elif self._kick is not None:
            self._kick()
        return fut

    def post_sends(
        self, chunk: Sequence[SendRequest], kind: str | None = None
    ) -> list[asyncio.Future[WorkCompletion]]:
        """Post ``chunk`` (its send-queue entries already taken) as one linked list.

        Atomics need :meth:`ensure_scratch` to have been called. Returns one
        future per request (a single awaited verb's counted and timed as
        ``kind``). Raises (giving the entries back, posting nothing) when the
        queue pair is not usable or the provider refuses.
        """
        try:
            self.check_usable()
        except BaseException:
            self.sq.release(len(chunk))
            raise
        works: list[tuple[int, _Work]] = []
        requests: list[tuple[Any, ...]] = []
        for b in chunk:
            wr_id, work, flags = self._new_send(b)
            works.append((wr_id, work))
            segments = b.segments if work.scratch < 0 else (self._scratch_word(work.scratch),)
            requests.append((wr_id, b.opcode, flags, b.imm or 0, segments,
                             b.remote_addr, b.rkey, b.compare_add, b.swap))  # fmt: skip
        rc = self.driver.post_sends(requests)
        if rc:
            raise self._refused(works, self.sq, rc)
        futures = self._sends_posted(works)
        if kind is not None and len(works) == 1:
            self._timed(works[0][1], kind)
        return futures

    def _scratch_word(self, offset: int) -> Segment:
        assert self._scratch is not None
        return self._scratch[offset : offset + 8]

    def _new_send(self, b: SendRequest) -> tuple[int, _Work, int]:
        """Book-keeping for one send-side request: its ``wr_id``, work and flags."""
        fut: asyncio.Future[WorkCompletion] = self._loop.create_future()
        scratch = -1
        mrs = tuple(seg.mr for seg in b.segments)
        if b.opcode in _ibv.ATOMIC_OPCODES:
            assert self._scratch is not None
            scratch = self._scratch_free.pop()
            mrs = (self._scratch,)
        silent = self._next_send(b.signaled)
        work = _Work(self, fut, b.opcode, mrs, total_length(b.segments), False, scratch,
                     self._send_seq, silent)  # fmt: skip
        flags = b.flags if silent else _ibv.SEND_SIGNALED | b.flags
        return self._register(work), work, flags

    def _refused(self, works: Sequence[tuple[int, _Work]], room: QueueRoom, rc: int) -> DeviceError:
        """Undo work whose post the provider refused; the error to raise."""
        self._unpost(works, room)
        if room is self.sq:
            self._silent_run = 0
            return DeviceError(rc, f"ibv_post_send failed: {os.strerror(rc)}")
        return DeviceError(rc, f"ibv_post_recv failed: {os.strerror(rc)}")

    def _sends_posted(self, works: list[tuple[int, _Work]]) -> list[asyncio.Future[WorkCompletion]]:
        if self._expect is not None and any(w.opcode in _ibv.ANSWERED_OPCODES for _, w in works):
            self._expect()
        elif self._kick is not None:
            self._kick()
        self.last_send = works[-1][1]
        self._silent.extend(work for _, work in works if work.silent)
        return self._track(works)

    def post_send_to(
        self, seg: Segment, signaled: bool, done: Done, opcode: int = _ibv.WR_SEND
    ) -> None:
        """Post one send of ``seg`` (its send-queue entry already taken) whose
        outcome goes to ``done`` from the drain, with no future, no request
        object and no per-post validation beyond the queue pair's state.
        ``opcode`` may also be a zero-length RDMA write (a probe: no remote
        address or key is needed for zero bytes)."""
        try:
            self.check_usable()
        except BaseException:
            self.sq.release(1)
            raise
        silent = self._next_send(signaled)
        work = _Work(self, None, opcode, (seg.mr,), seg.length, False, -1, self._send_seq,
                     silent, done)  # fmt: skip
        wr_id = self._register(work)
        flags = 0 if silent else _ibv.SEND_SIGNALED
        rc = self.driver.post_send(wr_id, opcode, flags, seg.addr, seg.length, seg.lkey)
        if rc:
            raise self._refused([(wr_id, work)], self.sq, rc)
        if opcode == _WR_SEND:
            if self._expect is not None:
                self._expect()
        elif self._kick is not None:
            self._kick()
        self.last_send = work
        if silent:
            self._silent.append(work)
        self.works[wr_id] = work
        seg.mr._acquire()

    def post_bind(
        self, mw: MW, seg: Segment, access: int, kind: int
    ) -> tuple[asyncio.Future[WorkCompletion], int]:
        """Post a signalled bind of memory window ``mw`` (of type ``kind``)
        over ``seg`` (its send-queue entry already taken); returns the bind's
        future and the rkey the window will have. Always through pyverbs: a
        bind is rare, and type 1 binds go through ``ibv_bind_mw``."""
        from pyverbs.mr import MWBind, MWBindInfo

        try:
            self.check_usable()
        except BaseException:
            self.sq.release(1)
            raise
        qp, mr = self.qp, seg.mr._mr
        assert qp is not None
        assert mr is not None
        fut: asyncio.Future[WorkCompletion] = self._loop.create_future()
        self._next_send(True)
        work = _Work(self, fut, _ibv.WR_BIND_MW, (seg.mr,), seg.length, False, -1,
                     self._send_seq)  # fmt: skip
        wr_id = self._register(work)
        try:
            with verbs_errors("binding a memory window", errno.EINVAL):
                info = MWBindInfo(mr, seg.addr, seg.length, access)
                if kind == _ibv.MW_TYPE_2:
                    wr = SendWR(wr_id=wr_id, opcode=_ibv.WR_BIND_MW, send_flags=_ibv.SEND_SIGNALED)
                    wr.set_bind_wr(mw, info)
                    qp.post_send(wr)
                    rkey = wr.rkey
                else:
                    qp.bind_mw(mw, MWBind(info, _ibv.SEND_SIGNALED, wr_id))
                    rkey = mw.rkey
        except DeviceError:
            self._unpost([(wr_id, work)], self.sq)
            self._silent_run = 0
            raise
        return self._sends_posted([(wr_id, work)])[0], rkey

    def post_probe(self, done: Done) -> None:
        """Post a signalled zero-length RDMA write (its send-queue entry
        already taken) whose acknowledgement, or failure, goes to ``done``."""
        try:
            self.ensure_scratch()
        except BaseException:
            self.sq.release(1)
            raise
        assert self._scratch is not None
        self.post_send_to(self._scratch.segment(0, 0), True, done, _ibv.WR_RDMA_WRITE)

    def post_recv_to(self, seg: Segment, done: Done) -> None:
        """Post one receive into ``seg`` (its receive-queue entry already
        taken) whose outcome goes to ``done`` from the drain."""
        try:
            self.check_usable()
        except BaseException:
            self.rq.release(1)
            raise
        work = _Work(self, None, -1, (seg.mr,), seg.length, True, done=done)
        wr_id = self._register(work)
        rc = self.driver.post_recv(wr_id, seg.addr, seg.length, seg.lkey)
        if rc:
            raise self._refused([(wr_id, work)], self.rq, rc)
        self.works[wr_id] = work
        seg.mr._acquire()

    def silent_tail(self) -> bool:
        """Whether the newest send-side request is unsignalled (and pending)."""
        last = self.last_send
        return last is not None and bool(self._silent) and self._silent[-1] is last

    def post_marker(self) -> asyncio.Future[WorkCompletion]:
        """Post a signalled zero-length RDMA write (its send-queue entry already
        acquired): it touches no remote memory, and its completion settles
        every unsignalled request before it."""
        self.ensure_scratch()
        assert self._scratch is not None
        marker_request = SendRequest(_ibv.WR_RDMA_WRITE, (self._scratch.segment(0, 0),), 0)
        (marker,) = self.post_sends([marker_request])
        marker.add_done_callback(consume_outcome)  # maybe nobody awaits it; a flush is no news
        return marker

    def _report_silent_tail(self) -> None:
        """Post a marker behind an unsignalled tail, so the tail is accounted
        for even if nothing else is ever posted."""
        if not self.silent_tail() or self.failure is not None or not self.sq.try_acquire(1):
            return
        with contextlib.suppress(DeviceError, QueuePairError, ResourceClosedError):
            self.post_marker()

    # -- receive side ------------------------------------------------------

    @cython.ccall
    def quick_recvs(self, locals_: object) -> list[asyncio.Future[WorkCompletion]] | None:
        """Post one receive into each of ``locals_`` (a list or tuple of
        :class:`MemoryRegion` or :class:`Segment`) and return their futures,
        when everything is plain: the queue pair usable from here, every
        region open, writable and registered in its protection domain, and
        receive-queue entries free for all. Returns None, having done nothing,
        otherwise (the caller takes the checked path)."""
        if type(locals_) is not list and type(locals_) is not tuple:
            return None
        count: cython.Py_ssize_t = len(locals_)
        if count == 0 or count > self.rq.size or not self._usable_now():
            return None
        for local in locals_:
            mr = local.mr if type(local) is Segment else local
            if (type(mr) is not MemoryRegion or mr._mr is None or mr._pd is not self._pd
                    or not int(mr.access) & _LOCAL_WRITE):  # fmt: skip
                return None
        if not self.rq.try_acquire(count):
            return None
        futures: list[asyncio.Future[WorkCompletion]] = []
        for local in locals_:
            if type(local) is Segment:
                mr = local.mr
                addr = mr.addr + local.offset
                length = local.length
            else:
                mr = local
                addr = mr.addr
                length = mr.length
            fut = self._loop.create_future()
            work = _Work(self, fut, -1, (mr,), length, True)
            wr_id = self._register(work)
            rc = self._post_recv(wr_id, addr, length, mr.lkey)
            if rc:
                self.rq.release(count - len(futures) - 1)  # the rest were never posted
                raise self._refused([(wr_id, work)], self.rq, rc)
            mr._inflight += 1  # open: checked above
            self.works[wr_id] = work
            futures.append(fut)
        if metrics._on:
            self.stats.counters["ops:recv"] += count
        return futures

    def post_recvs(
        self, chunk: Sequence[tuple[Segment, ...]]
    ) -> list[asyncio.Future[WorkCompletion]]:
        """Post one receive per scatter list (receive-queue entries already taken)."""
        try:
            self.check_usable()
        except BaseException:
            self.rq.release(len(chunk))
            raise
        works: list[tuple[int, _Work]] = []
        requests: list[tuple[int, tuple[Segment, ...]]] = []
        for segments in chunk:
            work = _Work(self, self._loop.create_future(), -1, tuple(s.mr for s in segments),
                         total_length(segments), True)  # fmt: skip
            wr_id = self._register(work)
            works.append((wr_id, work))
            requests.append((wr_id, segments))
        rc = self.driver.post_recvs(requests)
        if rc:
            raise self._refused(works, self.rq, rc)
        return self._track(works)

    # -- tracking ----------------------------------------------------------

    def _track(self, works: Sequence[tuple[int, _Work]]) -> list[asyncio.Future[WorkCompletion]]:
        """Record posted work and mark its memory busy until the completion arrives."""
        futures = []
        for wr_id, work in works:
            self.works[wr_id] = work
            for mr in work.mrs:
                mr._acquire()
            assert work.future is not None
            futures.append(work.future)
        return futures

    def _unpost(self, works: Sequence[tuple[int, _Work]], room: QueueRoom) -> None:
        """Undo the bookkeeping of a chain the provider refused.

        Everything is validated before posting, so what remains to fail is the
        QP's state, which providers check on the first work request: the
        whole chain is taken as not posted. (pyverbs' ``bad_wr`` cannot be
        used: it copies the failed WR, SGE list pointer included, and frees
        that list a second time.)
        """
        for wr_id, work in works:
            self._handlers.pop(wr_id, None)
            if work.scratch >= 0:
                self._scratch_free.append(work.scratch)
            if work.future is not None:
                work.future.cancel()
            work.reported = True  # the caller gets the error
        room.release(len(works))

    # -- completions -------------------------------------------------------

    @cython.ccall
    def complete(self, work: _Work, wc: Any) -> None:
        """The completion of ``work`` arrived: resolve or fail its future."""
        if not work.recv:
            self._settle_silent(work.seq)
        self._finish(wc.wr_id, work)
        if work.kind is not None and metrics._on:
            record(self.stats.histograms, work.kind, time.perf_counter() - work.started)
        if wc.status == _SUCCESS:
            if work.future is None:
                work.succeed(wc.byte_len, None)
            elif not work.future.done():
                value = None
                if work.scratch >= 0:
                    assert self._scratch is not None
                    raw = self._scratch.view()[work.scratch : work.scratch + 8]
                    value = int.from_bytes(raw, sys.byteorder)
                work.future.set_result(from_wc(wc, value))
        else:
            opname = "recv" if work.recv else _ibv.WR_NAMES.get(work.opcode, str(work.opcode))
            exc, flushed = self._failed_completion(wc, opname)
            work.fail(exc, quiet=flushed)  # a dropped flushed future is no news
        if work.scratch >= 0:
            self._scratch_free.append(work.scratch)
        if self.drained is not None and not self.works:
            self.poster_idle()

    def _failed_completion(self, wc: WC, opname: str) -> tuple[BaseException, bool]:
        """The error a failed completion reports, and whether it was a flush
        (the QP was in the error state: a consequence, not a new failure)."""
        exc: BaseException = completion_error(wc, opname)
        flushed: bool = exc.flushed  # type: ignore[attr-defined]
        if not flushed:
            self.stats.add("errors:" + exc.status_name)  # type: ignore[attr-defined]
            self._fail(exc)
        else:
            self.stats.add("flushed")
            exc = self.close_error() if self.closing else self.failed_error(exc)
        return exc, flushed

    # -- packet lanes --------------------------------------------------------

    def open_lane(
        self, send_mr: MemoryRegion, sends: int, recv_mr: MemoryRegion | None, recvs: int,
        slot_size: int, sent: Sent, arrived: Arrived, failed: Failed,
    ) -> PacketLane:  # fmt: skip
        """A :class:`PacketLane` over these slots (see there), stopped,
        flushed and detached with this queue pair."""
        self.check_usable()
        lane = PacketLane(self, send_mr, sends, recv_mr, recvs, slot_size, sent, arrived, failed)
        self.posters.append(lane)
        return lane

    def start_bulk(
        self, opcode: int, table: Any, count: int, window: int, chunk: int,
        mrs: tuple[MemoryRegion, ...], done: BulkDone, starved: Starved,
    ) -> BulkRun:  # fmt: skip
        """A :class:`BulkRun` of ``count`` records of ``table`` (see there),
        started, stopped and detached with this queue pair."""
        self.check_usable()
        run = BulkRun(self, opcode, table, count, window, chunk, mrs, done, starved)
        self.posters.append(run)
        run.start()
        return run

    def bulk_error(self, wc: WC, opcode: int) -> BaseException:
        """What a bulk run's failed completion tells its owner."""
        return self._failed_completion(wc, _ibv.WR_NAMES.get(opcode, str(opcode)))[0]

    def poster_finished(self, poster: Any) -> None:
        """A bulk run ended: forget it (the engine may have already)."""
        with contextlib.suppress(ValueError):
            self.posters.remove(poster)
        self.poster_idle()

    def packet_error(self, wc: WC, recv: bool) -> BaseException:
        """What a packet lane's failed completion tells its owner."""
        return self._failed_completion(wc, "recv" if recv else "send")[0]

    def pending(self) -> int:
        """Posted work whose completion is still due (the posters' included)."""
        return len(self.works) + sum(poster.outstanding for poster in self.posters)

    def poster_idle(self) -> None:
        """Something completed: a closer waiting for the flush may go on."""
        if self.drained is not None and not self.drained.done() and not self.pending():
            self.drained.set_result(None)

    @cython.cfunc
    def _finish(self, wr_id: cython.ulonglong, work: _Work) -> None:
        self.works.pop(wr_id, None)
        for mr in work.mrs:
            _let_go(mr)
        (self.rq if work.recv else self.sq).release(1)

    @cython.cfunc
    def _settle_silent(self, seq: cython.longlong) -> None:
        """A send-queue completion arrived for request ``seq``: the send queue
        completes in order, so every unsignalled request before it succeeded."""
        silent = self._silent
        while silent and silent[0].seq <= seq:
            work: _Work = silent.popleft()
            if work.seq == seq:
                break  # its own (failed) completion: handled by the caller
            wr_id = work.wr_id
            self._handlers.pop(wr_id, None)
            self._finish(wr_id, work)
            result = None
            if work.future is not None:
                opcode = Opcode.SEND if work.opcode in _ibv.SEND_OPCODES else Opcode.RDMA_WRITE
                result = WorkCompletion(wr_id, opcode, work.length, None, self.qp_num)
            work.succeed(work.length, result)

    # -- closing -----------------------------------------------------------

    def close(self, error: Callable[[], BaseException]) -> bool:
        """Fail pending and later work with ``error()`` and move the QP to the
        error state so the adapter flushes what was posted.

        Returns True when the QP can be destroyed now (nothing to flush, or
        the state change failed), False when flush completions are due.
        """
        self._report_silent_tail()
        self.closing = True
        self.close_error = error
        err = error()
        self.sq.fail(err)
        self.rq.fail(err)
        for work in list(self.works.values()):
            work.fail(err, later=True, quiet=True)
        for poster in self.posters:
            poster.stop()
        if not self.pending() or self.qp is None:
            return True
        try:
            with verbs_errors("moving a queue pair to the error state"):
                attr = QPAttr()
                attr.qp_state = _ibv.QPS_ERR
                self.qp.modify(attr, _ibv.QP_STATE)
        except DeviceError:
            return True
        return False

    def destroy(self) -> None:
        """Forget pending work (failing its futures), destroy the QP and the
        scratch memory (idempotent)."""
        qp, self.qp = self.qp, None
        if qp is None:
            return
        self.closing = True
        err = self.close_error()
        self.sq.fail(err)
        self.rq.fail(err)
        for wr_id, work in self.works.items():
            self._handlers.pop(wr_id, None)
            for mr in work.mrs:
                mr._release()
        works = list(self.works.values())
        self.works.clear()
        for work in works:
            work.fail(err, later=True, quiet=True)
        self._silent.clear()
        self.last_send = None
        posters, self.posters = self.posters, []
        for poster in posters:
            poster.detach(err)
        self.driver.detach()
        try:
            qp.close()
        finally:
            if self._scratch is not None:
                self._scratch.close()
