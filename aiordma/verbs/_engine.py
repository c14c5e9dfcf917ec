"""The work-request engine of one queue pair: validated work in, futures out.

:class:`WorkEngine` owns a pyverbs ``QP`` handle and everything between "a
validated list of segments and an opcode" and "a future resolved or
failed": building work requests (reusing pyverbs objects, which are costly
to make and never freed), posting them, tracking them by ``wr_id`` on the
completion queue, resolving their futures when completions arrive, settling
unsignalled sends, and failing or flushing what is pending when the queue
pair fails or closes. It checks nothing the caller should have checked and
starts no tasks: :class:`~aiordma.QueuePair` validates arguments and waits
for queue room (``sq``/``rq``), then calls :meth:`WorkEngine.post_sends` or
:meth:`WorkEngine.post_recvs`.

It posts through its queue pair's driver (``aiordma.verbs._driver``),
compiled or pure, and never asks which; only a memory-window bind
(:meth:`WorkEngine.post_bind`, rare) goes through pyverbs itself.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import errno
import functools
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyverbs.qp import QPAttr
from pyverbs.wr import SendWR

from aiordma import _ibv
from aiordma._pyverbs import verbs_errors
from aiordma.exceptions import DeviceError, QueuePairError, ResourceClosedError
from aiordma.metrics import Stats
from aiordma.verbs import _driver
from aiordma.verbs._bulk import BulkRun, Starved
from aiordma.verbs._bulk import Done as BulkDone
from aiordma.verbs._driver.pure import RECV_WR_CACHE
from aiordma.verbs._lane import Arrived, Failed, PacketLane, Sent
from aiordma.verbs._slots import SlotPool
from aiordma.verbs.completion import Opcode, WorkCompletion, completion_error, to_work_completion
from aiordma.verbs.memory import MemoryRegion, Segment

if TYPE_CHECKING:
    from pyverbs.cq import WC
    from pyverbs.mr import MW
    from pyverbs.qp import QP

    from aiordma.verbs.completion import CompletionQueue

SIGNAL_FRACTION = 4
"""However many unsignalled requests are posted, at least every
``send_depth // SIGNAL_FRACTION``-th is signalled, so their send-queue slots
come back."""
__all__ = ["RECV_WR_CACHE", "SIGNAL_FRACTION", "SendRequest", "WorkEngine", "closed_error",
           "total_length"]  # fmt: skip


def closed_error() -> BaseException:
    """The error pending and later work gets once its queue pair is closed."""
    return ResourceClosedError("queue pair is closed")


def _no_result() -> WorkCompletion:
    raise AssertionError("callback work has no WorkCompletion")


def _retrieve(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


def total_length(segments: tuple[Segment, ...]) -> int:
    """Bytes covered by a scatter/gather list."""
    return sum(seg.length for seg in segments)


@dataclass(frozen=True, slots=True)
class SendRequest:
    """A validated send-queue work request, ready to post."""

    opcode: int
    segments: tuple[Segment, ...]
    flags: int
    imm: int | None = None
    remote_addr: int = 0
    rkey: int = 0
    compare_add: int = 0
    swap: int = 0
    signaled: bool = True


Done = Callable[[BaseException | None, int], None]
"""How callback work reports: ``done(None, byte_len)`` on success, else
``done(error, 0)``; called from the completion drain, no future involved."""


class _Work:
    """One posted work request: the future to resolve (or the callback to
    call) and the memory to keep alive."""

    __slots__ = (
        "done", "engine", "future", "opcode", "recv", "reported", "scratch", "segments", "seq",
        "silent",
    )  # fmt: skip

    def __init__(
        self,
        engine: WorkEngine,
        future: asyncio.Future[WorkCompletion] | None,
        opcode: int,
        segments: tuple[Segment, ...],
        recv: bool,
        scratch: int | None = None,
        seq: int = 0,
        silent: bool = False,
        done: Done | None = None,
    ) -> None:
        self.engine = engine
        self.future = future
        self.done = done
        """Called instead of resolving a future (``future`` is None then)."""
        self.reported = False
        """Whether ``done`` was called."""
        self.opcode = opcode
        self.segments = segments
        self.recv = recv
        self.scratch = scratch
        self.seq = seq
        """Position on the send queue (send-side work only)."""
        self.silent = silent
        """Posted unsignalled: no completion entry unless it fails."""

    def complete(self, wc: WC) -> None:
        self.engine.complete(self, wc)

    @property
    def settled(self) -> bool:
        """Whether the outcome was given out (the future is done, or ``done`` was called)."""
        return self.reported if self.future is None else self.future.done()

    def succeed(self, byte_len: int, result: Callable[[], WorkCompletion]) -> None:
        """Report success: ``result()`` resolves the future, or ``done`` gets ``byte_len``."""
        if self.future is None:
            if not self.reported:
                self.reported = True
                self._call(None, byte_len)
        elif not self.future.done():
            self.future.set_result(result())

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


class WorkEngine:
    """Posts, tracks and completes the work requests of one pyverbs ``QP``.

    ``sq`` and ``rq`` count free send- and receive-queue slots: callers take
    slots (waiting if they must) before :meth:`post_sends` /
    :meth:`post_recvs`, and completions give them back. ``alloc(size)``
    registers local scratch memory (atomic results and the marker write of
    :meth:`post_marker`) on first need.
    """

    def __init__(
        self,
        qp: QP,
        cq: CompletionQueue,
        send_depth: int,
        recv_depth: int,
        alloc: Callable[[int], MemoryRegion],
        recv_cq: CompletionQueue | None = None,
    ) -> None:
        self.qp: QP | None = qp
        """The pyverbs handle (None once destroyed)."""
        self.qp_num: int = qp.qp_num
        self.cq = cq
        self.sq = SlotPool(send_depth)
        self.rq = SlotPool(recv_depth)
        self.works: dict[int, _Work] = {}
        """Posted work whose completion has not arrived, by ``wr_id``."""
        self.failure: BaseException | None = None
        """The first failed completion, once the queue pair is in the error state."""
        self.closing = False
        self.close_error: Callable[[], BaseException] = closed_error
        self.drained: asyncio.Future[None] | None = None
        """Set by a closer waiting for :attr:`works` to empty; resolved when it does."""
        self.last_send: _Work | None = None
        self.lanes: list[PacketLane | BulkRun] = []
        """Packet lanes (:meth:`open_lane`) and running bulk runs (:meth:`start_bulk`)."""
        self._loop = cq.loop
        self._alloc = alloc
        self._scratch: MemoryRegion | None = None
        self._scratch_free: list[int] = []
        self.driver = _driver.qp_driver(qp, cq._driver, (recv_cq or cq)._driver)
        """What posts this QP's work requests."""
        self._send_seq = 0
        self._silent: collections.deque[tuple[int, _Work]] = collections.deque()
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
            for lane in self.lanes:
                lane.stop()

    # -- send side ---------------------------------------------------------

    def ensure_scratch(self) -> None:
        """Register the scratch memory atomics land in (one 8-byte word per send slot)."""
        if self._scratch is None:
            self._scratch = self._alloc(8 * self.sq.size)
            self._scratch_free = list(range(0, 8 * self.sq.size, 8))

    def post_sends(self, chunk: Sequence[SendRequest]) -> list[asyncio.Future[WorkCompletion]]:
        """Post ``chunk`` (its send-queue slots already taken) as one linked list.

        Atomics need :meth:`ensure_scratch` to have been called. Returns one
        future per request. Raises (giving the slots back, posting nothing)
        when the queue pair is not usable or the provider refuses.
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
            requests.append((wr_id, b.opcode, flags, b.imm or 0, work.segments,
                             b.remote_addr, b.rkey, b.compare_add, b.swap))  # fmt: skip
        rc = self.driver.post_sends(requests)
        if rc:
            raise self._refused(works, self.sq, rc)
        return self._sends_posted(works)

    def _new_send(self, b: SendRequest) -> tuple[int, _Work, int]:
        """Book-keeping for one send-side request: its ``wr_id``, work and flags."""
        fut: asyncio.Future[WorkCompletion] = self._loop.create_future()
        scratch = None
        segments = b.segments
        if b.opcode in _ibv.ATOMIC_OPCODES:
            scratch = self._scratch_free.pop()
            assert self._scratch is not None
            segments = (self._scratch[scratch : scratch + 8],)
        seq, silent = self._next_send(b.signaled)
        work = _Work(self, fut, b.opcode, segments, False, scratch, seq, silent)
        flags = b.flags if silent else _ibv.SEND_SIGNALED | b.flags
        return self.cq.register(work), work, flags

    def _next_send(self, signaled: bool) -> tuple[int, bool]:
        """The next send-queue position, and whether that request goes
        unsignalled (asked for, and not the ``signal_every``-th in a row)."""
        self._send_seq += 1
        silent = not signaled and self._silent_run + 1 < self._signal_every
        self._silent_run = self._silent_run + 1 if silent else 0
        return self._send_seq, silent

    def _refused(self, works: Sequence[tuple[int, _Work]], pool: SlotPool, rc: int) -> DeviceError:
        """Undo work whose post the provider refused; the error to raise."""
        self._unpost(works, pool)
        if pool is self.sq:
            self._silent_run = 0
            return DeviceError(rc, f"ibv_post_send failed: {os.strerror(rc)}")
        return DeviceError(rc, f"ibv_post_recv failed: {os.strerror(rc)}")

    def _sends_posted(self, works: list[tuple[int, _Work]]) -> list[asyncio.Future[WorkCompletion]]:
        self.cq.kick()
        self.last_send = works[-1][1]
        self._silent.extend(item for item in works if item[1].silent)
        return self._track(works)

    def post_packet(
        self, seg: Segment, signaled: bool, done: Done, opcode: int = _ibv.WR_SEND
    ) -> None:
        """Post one send of ``seg`` (its send-queue slot already taken) whose
        outcome goes to ``done`` from the drain: the message channel's path,
        with no future, no request object and no per-post validation beyond
        the queue pair's state. ``opcode`` may also be a zero-length RDMA
        write (a probe: no remote address or key is needed for zero bytes)."""
        try:
            self.check_usable()
        except BaseException:
            self.sq.release(1)
            raise
        seq, silent = self._next_send(signaled)
        work = _Work(self, None, opcode, (seg,), False, None, seq, silent, done)
        wr_id = self.cq.register(work)
        flags = 0 if silent else _ibv.SEND_SIGNALED
        rc = self.driver.post_send(wr_id, opcode, flags, seg.addr, seg.length, seg.lkey)
        if rc:
            raise self._refused([(wr_id, work)], self.sq, rc)
        self.cq.kick()
        self.last_send = work
        if silent:
            self._silent.append((wr_id, work))
        self.works[wr_id] = work
        seg.mr._acquire()

    def post_bind(
        self, mw: MW, seg: Segment, access: int, kind: int
    ) -> tuple[asyncio.Future[WorkCompletion], int]:
        """Post a signalled bind of memory window ``mw`` (of type ``kind``)
        over ``seg`` (its send-queue slot already taken); returns the bind's
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
        seq, _ = self._next_send(True)
        work = _Work(self, fut, _ibv.WR_BIND_MW, (seg,), False, None, seq)
        wr_id = self.cq.register(work)
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
        """Post a signalled zero-length RDMA write (its send-queue slot
        already taken) whose acknowledgement, or failure, goes to ``done``."""
        try:
            self.ensure_scratch()
        except BaseException:
            self.sq.release(1)
            raise
        assert self._scratch is not None
        self.post_packet(self._scratch.segment(0, 0), True, done, _ibv.WR_RDMA_WRITE)

    def post_packet_recv(self, seg: Segment, done: Done) -> None:
        """Post one receive into ``seg`` (its receive-queue slot already
        taken) whose outcome goes to ``done`` from the drain."""
        try:
            self.check_usable()
        except BaseException:
            self.rq.release(1)
            raise
        work = _Work(self, None, -1, (seg,), True, done=done)
        wr_id = self.cq.register(work)
        rc = self.driver.post_recv(wr_id, seg.addr, seg.length, seg.lkey)
        if rc:
            raise self._refused([(wr_id, work)], self.rq, rc)
        self.works[wr_id] = work
        seg.mr._acquire()

    def silent_tail(self) -> bool:
        """Whether the newest send-side request is unsignalled (and pending)."""
        last = self.last_send
        return last is not None and bool(self._silent) and self._silent[-1][1] is last

    def post_marker(self) -> asyncio.Future[WorkCompletion]:
        """Post a signalled zero-length RDMA write (its send-queue slot already
        acquired): it touches no remote memory, and its completion settles
        every unsignalled request before it."""
        self.ensure_scratch()
        assert self._scratch is not None
        marker_request = SendRequest(_ibv.WR_RDMA_WRITE, (self._scratch.segment(0, 0),), 0)
        (marker,) = self.post_sends([marker_request])
        marker.add_done_callback(_retrieve)  # maybe nobody awaits it; a flush is no news
        return marker

    def _report_silent_tail(self) -> None:
        """Post a marker behind an unsignalled tail, so the tail is accounted
        for even if nothing else is ever posted."""
        if not self.silent_tail() or self.failure is not None or not self.sq.try_acquire(1):
            return
        with contextlib.suppress(DeviceError, QueuePairError, ResourceClosedError):
            self.post_marker()

    # -- receive side ------------------------------------------------------

    def post_recvs(
        self, chunk: Sequence[tuple[Segment, ...]]
    ) -> list[asyncio.Future[WorkCompletion]]:
        """Post one receive per scatter list (receive-queue slots already taken)."""
        try:
            self.check_usable()
        except BaseException:
            self.rq.release(len(chunk))
            raise
        works: list[tuple[int, _Work]] = []
        requests: list[tuple[int, tuple[Segment, ...]]] = []
        for segments in chunk:
            work = _Work(self, self._loop.create_future(), -1, segments, True)
            wr_id = self.cq.register(work)
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
            for seg in work.segments:
                seg.mr._acquire()
            assert work.future is not None
            futures.append(work.future)
        return futures

    def _unpost(self, works: Sequence[tuple[int, _Work]], pool: SlotPool) -> None:
        """Undo the bookkeeping of a chain the provider refused.

        Everything is validated before posting, so what remains to fail is the
        QP's state, which providers check on the first work request: the
        whole chain is taken as not posted. (pyverbs' ``bad_wr`` cannot be
        used: it copies the failed WR, SGE list pointer included, and frees
        that list a second time.)
        """
        for wr_id, work in works:
            self.cq.forget(wr_id)
            if work.scratch is not None:
                self._scratch_free.append(work.scratch)
            if work.future is not None:
                work.future.cancel()
            work.reported = True  # the caller gets the error
        pool.release(len(works))

    # -- completions -------------------------------------------------------

    def complete(self, work: _Work, wc: WC) -> None:
        """The completion of ``work`` arrived: resolve or fail its future."""
        if not work.recv:
            self._settle_silent(work.seq)
        self._finish(wc.wr_id, work)
        if wc.status == _ibv.WC_SUCCESS:
            if work.future is None:
                work.succeed(wc.byte_len, _no_result)
            elif not work.future.done():
                result = to_work_completion(wc)
                if work.scratch is not None:
                    assert self._scratch is not None
                    raw = self._scratch.view()[work.scratch : work.scratch + 8]
                    value = int.from_bytes(raw, sys.byteorder)
                    result = dataclasses.replace(result, atomic_value=value)
                work.future.set_result(result)
        else:
            opname = "recv" if work.recv else _ibv.WR_NAMES.get(work.opcode, str(work.opcode))
            exc, flushed = self._failed_completion(wc, opname)
            work.fail(exc, quiet=flushed)  # a dropped flushed future is no news
        if work.scratch is not None:
            self._scratch_free.append(work.scratch)
        if self.drained is not None and not self.works:
            self.lane_idle()

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
        self.lanes.append(lane)
        return lane

    def start_bulk(
        self, opcode: int, table: Any, count: int, window: int, chunk: int,
        mrs: tuple[MemoryRegion, ...], done: BulkDone, starved: Starved,
    ) -> BulkRun:  # fmt: skip
        """A :class:`BulkRun` of ``count`` records of ``table`` (see there),
        started, stopped and detached with this queue pair."""
        self.check_usable()
        run = BulkRun(self, opcode, table, count, window, chunk, mrs, done, starved)
        self.lanes.append(run)
        run.start()
        return run

    def bulk_error(self, wc: WC, opcode: int) -> BaseException:
        """What a bulk run's failed completion tells its owner."""
        return self._failed_completion(wc, _ibv.WR_NAMES.get(opcode, str(opcode)))[0]

    def lane_finished(self, lane: Any) -> None:
        """A bulk run ended: forget it (the engine may have already)."""
        with contextlib.suppress(ValueError):
            self.lanes.remove(lane)
        self.lane_idle()

    def packet_error(self, wc: WC, recv: bool) -> BaseException:
        """What a packet lane's failed completion tells its owner."""
        return self._failed_completion(wc, "recv" if recv else "send")[0]

    def pending(self) -> int:
        """Posted work whose completion is still due (lanes' included)."""
        return len(self.works) + sum(lane.outstanding for lane in self.lanes)

    def lane_idle(self) -> None:
        """Something completed: a closer waiting for the flush may go on."""
        if self.drained is not None and not self.drained.done() and not self.pending():
            self.drained.set_result(None)

    def _finish(self, wr_id: int, work: _Work) -> None:
        self.works.pop(wr_id, None)
        for seg in work.segments:
            seg.mr._release()
        (self.rq if work.recv else self.sq).release(1)

    def _settle_silent(self, seq: int) -> None:
        """A send-queue completion arrived for request ``seq``: the send queue
        completes in order, so every unsignalled request before it succeeded."""
        silent = self._silent
        while silent and silent[0][1].seq <= seq:
            wr_id, work = silent.popleft()
            if work.seq == seq:
                break  # its own (failed) completion: handled by the caller
            self.cq.forget(wr_id)
            self._finish(wr_id, work)
            length = total_length(work.segments)
            opcode = Opcode.SEND if work.opcode in _ibv.SEND_OPCODES else Opcode.RDMA_WRITE
            result = functools.partial(WorkCompletion, wr_id, opcode, length, None, self.qp_num)
            work.succeed(length, result)

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
        for lane in self.lanes:
            lane.stop()
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
            self.cq.forget(wr_id)
            for seg in work.segments:
                seg.mr._release()
        works = list(self.works.values())
        self.works.clear()
        for work in works:
            work.fail(err, later=True, quiet=True)
        self._silent.clear()
        self.last_send = None
        lanes, self.lanes = self.lanes, []
        for lane in lanes:
            lane.detach(err)
        self.driver.detach()
        try:
            qp.close()
        finally:
            if self._scratch is not None:
                self._scratch.close()
