# cython: annotation_typing=True
"""A message channel's packets on one queue pair: fixed slots, no work records.

A :class:`PacketLane` sends from numbered slots of one registered region
and receives into numbered slots of another. It owns one ``wr_id`` per
slot for its lifetime, so a post is a few integers handed to the queue
pair's driver, and a completion is one call from the drain to
:meth:`PacketLane.complete`, which tells the owner ``sent(slot)``,
``arrived(slot, byte_len)`` or ``failed(error)``. No future, no work
record, no segment per packet: the work engine (``_engine.py``) creates
the lane, shares the send queue with it, and stops, flushes and detaches
it with the queue pair.

Sends are signalled every ``sends // 2``-th; the send queue completes in
order, so a signalled completion also reports the unsignalled sends
before it. The lane holds its regions busy (``MemoryRegion.inflight``)
and its receive slots' share of the receive queue while it lives.

Sends made between :meth:`PacketLane.hold` and :meth:`PacketLane.flush`
are staged and posted by ``flush`` as one chain, one doorbell (a message's
packets; nothing else may post in between).

Call order: ``(send | hold -> send* -> flush | recv | complete)* -> stop
-> complete* -> detach`` (``stop`` when the queue pair closes or fails;
``detach`` before it is destroyed).
"""

from __future__ import annotations

import collections
import os
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiordma import _ibv
from aiordma.exceptions import DeviceError, ProtocolError, ResourceBusyError
from aiordma.verbs.memory import MemoryRegion

if TYPE_CHECKING:
    from typing import Protocol

    from aiordma import _cython_shim as cython
    from aiordma.verbs import _engine_view
    from aiordma.verbs._room import QueueRoom

    class EngineView(_engine_view.EngineView, Protocol):
        """What a lane needs of the work engine that made it."""

        @property
        def rq(self) -> QueueRoom: ...

        def check_usable(self) -> None: ...

        def poster_error(self, wc: Any, opcode: int) -> BaseException: ...
else:
    try:
        import cython
    except ImportError:  # no Cython: the declarations below mean nothing
        from aiordma import _cython_shim as cython

_WR_SEND = cython.declare(cython.int, _ibv.WR_SEND)  # C integers for typed code
_RECV_WITH_IMM = cython.declare(cython.int, _ibv.WC_RECV_RDMA_WITH_IMM)
_SIGNALED = cython.declare(cython.int, _ibv.SEND_SIGNALED)


def _told_nothing(*_: object) -> None:
    """A detached lane's callbacks."""


Sent = Callable[[int], None]
LaneArrived = Callable[[int, int], None]
"""``(slot, bytes)``: a packet landed in a lane's receive slot."""
LaneWritten = Callable[[int, int, int], None]
"""``(slot, imm, bytes)``: an RDMA write with immediate ``imm`` of ``bytes``
consumed a lane's receive slot (its bytes are where the write put them)."""
Failed = Callable[[BaseException], None]


@cython.cclass
class PacketLane:
    """The packets of one owner (a message channel) on one queue pair.

    ``sends`` slots of ``slot_size`` bytes from the start of ``send_mr``;
    ``recvs`` of them from the start of ``recv_mr`` (none: the owner's
    packets arrive elsewhere, e.g. from a shared receive queue). Made by
    :meth:`WorkEngine.open_lane`.
    """

    def __init__(
        self, engine: EngineView, send_mr: MemoryRegion, sends: cython.int,
        recv_mr: MemoryRegion | None, recvs: cython.int, slot_size: cython.Py_ssize_t,
        sent: Sent, arrived: LaneArrived, failed: Failed, written: LaneWritten | None = None,
    ) -> None:  # fmt: skip
        if sends < 1 or recvs < 0 or (recvs and recv_mr is None):
            raise ValueError("a packet lane needs send slots, and a region for its receive slots")
        if sends * slot_size > send_mr.length or (
            recv_mr is not None and recvs * slot_size > recv_mr.length
        ):
            raise ValueError("a packet lane's slots must lie inside its regions")
        self._engine = engine
        driver = engine.driver
        self._post_send = driver.post_send
        self._post_list = driver.post_send_list
        self._post_recv = driver.post_recv
        self._kick = engine.cq.expect if engine.cq.expects else None
        """What to tell the CQ after a send (two-sided), if it may spin for the answer."""
        self._sq = engine.sq
        self._handlers = engine.cq.handlers
        self._size = slot_size
        self._sends = sends
        self._recvs = recvs
        self._send_base = send_mr.addr
        self._send_lkey = send_mr.lkey
        self._recv_base = recv_mr.addr if recv_mr is not None else 0
        self._recv_lkey = recv_mr.lkey if recv_mr is not None else 0
        self._sent = sent
        self._arrived = arrived
        self._failed = failed
        self._written = written
        self._seq = [0] * sends
        """Each send slot's position among this lane's sends, when last posted."""
        self._next_seq = 0
        self._silent: collections.deque[int] = collections.deque()
        """Send slots posted unsignalled, in order, not yet reported."""
        self._silent_run = 0
        self._signal_every = max(1, sends // 2)
        self._posted = bytearray(sends + recvs)
        """1 for each slot (receives first) whose work request is posted."""
        self.outstanding = 0
        """Posted receives and signalled sends whose completion has not come."""
        self._stopped = False
        self._holding = False
        self._staged_ids: list[int] = []
        """The staged sends' ``wr_id``, flags, address and length, in order."""
        self._staged_flags: list[int] = []
        self._staged_addrs: list[int] = []
        self._staged_lengths: list[int] = []
        self.unposted: list[int] = []
        """The send slots the last failed :meth:`flush` did not post."""
        if recvs and not engine.rq.try_acquire(recvs):
            raise ResourceBusyError(f"receive queue has no room for {recvs} buffers")
        self._first = engine.cq.claim_ids(sends + recvs)
        self._mrs: tuple[MemoryRegion, ...] = (send_mr,) if recv_mr is None else (send_mr, recv_mr)
        for mr in self._mrs:
            mr._acquire()

    # -- posting -------------------------------------------------------------

    @cython.ccall
    def send(self, slot: cython.int, length: cython.Py_ssize_t) -> None:
        """Post the first ``length`` bytes of send slot ``slot`` (not in use).

        Raises the queue pair's error once it is closing or failed,
        :class:`ResourceBusyError` when the send queue is full (check
        :meth:`send_room`), :class:`DeviceError` when the provider refuses.
        """
        if slot < 0 or slot >= self._sends or length < 0 or length > self._size:
            raise ValueError(f"send slot {slot} of {length} bytes is outside the lane")
        if not self._sq.try_acquire(1):  # raises the queue pair's error once it has one
            raise ResourceBusyError("send queue is full")
        index: cython.Py_ssize_t = self._recvs + slot
        wr_id: cython.ulonglong = self._first + index
        run: cython.int = self._silent_run + 1
        silent: cython.bint = run < self._signal_every
        flags: cython.int = 0 if silent else _SIGNALED
        addr: cython.ulonglong = self._send_base + slot * self._size
        self._handlers[wr_id] = self
        if self._holding:  # posted by flush(); undone there if refused
            self._staged_ids.append(wr_id)
            self._staged_flags.append(flags)
            self._staged_addrs.append(addr)
            self._staged_lengths.append(length)
        else:
            rc: cython.int = self._post_send(wr_id, _WR_SEND, flags, addr, length,
                                             self._send_lkey)  # fmt: skip
            if rc:
                del self._handlers[wr_id]
                self._sq.release(1)
                self._silent_run = 0
                raise DeviceError(rc, f"ibv_post_send failed: {os.strerror(rc)}")
        self._silent_run = run if silent else 0
        self._next_seq += 1
        self._seq[slot] = self._next_seq
        self._posted[index] = 1
        if silent:
            self._silent.append(slot)
        else:
            self.outstanding += 1
        if self._kick is not None and not self._holding:
            self._kick()

    @cython.ccall
    def hold(self) -> None:
        """Stage the sends that follow until :meth:`flush` (not nested)."""
        self._holding = True

    @cython.ccall
    @cython.exceptval(-1, check=True)
    def flush(self) -> cython.int:
        """Post the sends staged since :meth:`hold` as one chain and stop
        staging. Returns 0, or the provider's errno: then the sends from the
        one it refused on are undone (their slots in :attr:`unposted`) and
        the signalling restarts."""
        self._holding = False
        ids = self._staged_ids
        count: cython.Py_ssize_t = len(ids)
        if count == 0:
            return 0
        rc: cython.int
        posted: cython.Py_ssize_t
        if count == 1:
            rc = self._post_send(ids[0], _WR_SEND, self._staged_flags[0],
                                 self._staged_addrs[0], self._staged_lengths[0],
                                 self._send_lkey)  # fmt: skip
            posted = 0 if rc else 1
        else:
            rc, posted = self._post_list(ids, self._staged_flags, self._staged_addrs,
                                         self._staged_lengths, self._send_lkey)  # fmt: skip
        if rc:
            self._unstage(posted)
        ids.clear()  # the lists are reused: the driver is done with them
        self._staged_flags.clear()
        self._staged_addrs.clear()
        self._staged_lengths.clear()
        if posted and self._kick is not None:
            self._kick()
        return rc

    @cython.cfunc
    def _unstage(self, posted: cython.Py_ssize_t) -> None:
        """Undo the staged sends from ``posted`` on: the provider refused them."""
        unposted: list[int] = []
        i: cython.Py_ssize_t
        for i in range(len(self._staged_ids) - 1, posted - 1, -1):
            wr_id: cython.ulonglong = self._staged_ids[i]
            index: cython.Py_ssize_t = wr_id - self._first
            slot: cython.int = index - self._recvs
            self._handlers.pop(wr_id, None)
            self._posted[index] = 0
            if self._staged_flags[i] & _SIGNALED:
                self.outstanding -= 1
            else:
                self._silent.pop()  # the unposted are the newest silent ones
            unposted.append(slot)
        unposted.reverse()
        self._sq.release(len(unposted))
        self._silent_run = 0
        self.unposted = unposted

    @cython.ccall
    def recv(self, slot: cython.int) -> None:
        """Post receive slot ``slot`` (not in use). Raises the queue pair's
        error once it is closing or failed, :class:`DeviceError` when the
        provider refuses."""
        if slot < 0 or slot >= self._recvs:
            raise ValueError(f"receive slot {slot} is outside the lane")
        if self._stopped:
            self._engine.check_usable()
            raise self._engine.close_error()
        wr_id: cython.ulonglong = self._first + slot
        addr: cython.ulonglong = self._recv_base + slot * self._size
        self._handlers[wr_id] = self
        rc: cython.int = self._post_recv(wr_id, addr, self._size, self._recv_lkey)
        if rc:
            del self._handlers[wr_id]
            raise DeviceError(rc, f"ibv_post_recv failed: {os.strerror(rc)}")
        self._posted[slot] = 1
        self.outstanding += 1

    @cython.ccall
    def send_room(self) -> cython.bint:
        """Whether a send posted now finds room in the send queue."""
        return self._sq.can_acquire(1)

    # -- completions ---------------------------------------------------------

    def complete(self, wc: Any) -> None:
        """One of this lane's work requests completed (called by the CQ's drain)."""
        index: cython.Py_ssize_t = wc.wr_id - self._first
        status: cython.int = wc.status
        if index < 0 or index >= self._sends + self._recvs or not self._posted[index]:
            return  # not posted (any more): the lane was detached meanwhile
        self._posted[index] = 0
        if index < self._recvs:
            self.outstanding -= 1
            if status == 0 and wc.opcode == _RECV_WITH_IMM:
                if self._written is None:
                    self._failed(ProtocolError("the peer wrote where this side exposed nothing"))
                else:
                    self._written(index, socket.ntohl(wc.imm_data), wc.byte_len)
            elif status == 0:
                self._arrived(index, wc.byte_len)
            else:
                self._failed(self._engine.poster_error(wc, -1))
        else:
            self._send_completed(index - self._recvs, status, wc)
        if self._stopped and self.outstanding == 0:
            self._engine.poster_idle()

    @cython.cfunc
    def _send_completed(self, slot: cython.int, status: cython.int, wc: Any) -> None:
        seq: cython.longlong = self._seq[slot]
        silent = self._silent
        settled: list[int] = []
        while silent and self._seq[silent[0]] < seq:
            earlier: cython.int = silent.popleft()
            self._posted[self._recvs + earlier] = 0
            # No completion of its own comes for it: its entry goes now.
            self._handlers.pop(self._first + self._recvs + earlier, None)
            settled.append(earlier)
        if silent and silent[0] == slot:
            silent.popleft()  # its own completion: it failed (or was flushed)
        else:
            self.outstanding -= 1
        self._sq.release(len(settled) + 1)
        for earlier in settled:
            self._sent(earlier)
        if status == 0:
            self._sent(slot)
        else:
            self._failed(self._engine.poster_error(wc, _WR_SEND))

    # -- closing -------------------------------------------------------------

    def stop(self) -> None:
        """The queue pair is closing or failed: post nothing more (what is
        posted still completes, or is flushed)."""
        self._stopped = True

    def detach(self, error: BaseException) -> None:
        """The queue pair is being destroyed: forget what is posted (its
        owner gets ``failed(error)`` on the loop's next turn if anything
        was) and release the regions (idempotent)."""
        self._stopped = True
        mrs, self._mrs = self._mrs, ()
        if not mrs:
            return
        pending = False
        handlers = self._handlers
        for index in range(self._sends + self._recvs):
            # Every id, posted or not: an unsignalled send's entry stays until
            # a later completion settles it, and the CQ outlives the lane.
            if handlers.get(self._first + index) is self:
                del handlers[self._first + index]
            if self._posted[index]:
                self._posted[index] = 0
                pending = True
        self._silent.clear()
        self.outstanding = 0
        if self._recvs:
            self._engine.rq.release(self._recvs)
        for mr in mrs:
            mr._release()
        failed = self._failed
        # The owner is told nothing more: no reference back to it outlives the lane's use.
        self._sent = self._arrived = self._failed = _told_nothing
        self._written = None
        loop = self._engine.cq.loop
        if pending and not loop.is_closed():  # closed: at exit, nothing runs there any more
            loop.call_soon(failed, error)
