"""Memory windows: revocable remote access to part of a registered region.

A region's rkey opens the whole region until it is deregistered. A memory
window is a second key over a chosen part of a region, with its own
access, that can be revoked on its own and at once, without deregistering
(and so without unpinning and pinning memory again). Type 2 windows are
also tied to the one queue pair that bound them: a peer on another
connection cannot use the key even if it learns it.

Bind one with :meth:`aiordma.QueuePair.bind_window` (or the same method of
a :class:`~aiordma.Connection`); the region must have been registered with
:attr:`Access.MW_BIND <aiordma.Access.MW_BIND>`.
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, Protocol

from aiordma import _ibv
from aiordma._pyverbs import verbs_errors
from aiordma.exceptions import DeviceError
from aiordma.verbs.memory import Access, MemoryRegion, RemoteBuffer, Segment

if TYPE_CHECKING:
    from pyverbs.mr import MW
    from pyverbs.qp import QP

    from aiordma.verbs._lifecycle import Owner
    from aiordma.verbs._room import QueueRoom
    from aiordma.verbs.completion import WorkCompletion

WINDOW_ACCESS: Final = Access.REMOTE_READ | Access.REMOTE_WRITE | Access.REMOTE_ATOMIC
"""The access a window may grant (a subset of its region's, remote only)."""


class MemoryWindow:
    """A window bound over part of a registered region, with its own rkey.

    :attr:`remote` is the :class:`~aiordma.RemoteBuffer` to hand to the peer: it
    covers exactly the window's bytes, with the window's access (on devices
    where :attr:`~aiordma.DeviceAttributes.bounded_windows` is False, such as rxe,
    the rkey reaches the whole region: bind windows over whole regions there).
    :meth:`invalidate` (or :meth:`close`, or leaving a ``with`` block)
    revokes it: from then on any access through its rkey fails on the
    peer's side with :class:`~aiordma.RemoteAccessError`. A window is also
    revoked when its region is deregistered or its queue pair destroyed.
    """

    def __init__(
        self, mw: MW, segment: Segment, access: Access, rkey: int, kind: int, qp_num: int,
        binder: set[MemoryWindow], bound: asyncio.Future[WorkCompletion],
    ) -> None:  # fmt: skip
        self._mw: MW | None = mw
        self.segment = segment
        """The bytes the window covers."""
        self.access = access
        """What the window lets the peer do."""
        self.type = kind
        """1 or 2: type 2 windows work only through the queue pair that bound them."""
        self.qp_num = qp_num
        """The queue pair that bound the window."""
        self.remote = RemoteBuffer(segment.addr, len(segment), rkey)
        """The address, length and rkey a peer accesses the window with."""
        self._binder = binder
        """The binding queue pair's set of windows."""
        self.bound = bound
        """The bind's completion: resolved once the window works, failed if
        the bind failed (which also fails the queue pair)."""
        segment.mr._windows.add(self)
        binder.add(self)

    def __repr__(self) -> str:
        state = "revoked" if self._mw is None else "valid"
        return (
            f"<MemoryWindow type {self.type} {len(self.segment)} bytes at {self.segment.addr:#x} "
            f"rkey={self.remote.rkey:#x} {self.access!r} {state}>"
        )

    @property
    def region(self) -> MemoryRegion:
        """The registered region the window is bound over."""
        return self.segment.mr

    @property
    def valid(self) -> bool:
        """True until the window is revoked."""
        return self._mw is not None

    def invalidate(self) -> None:
        """Revoke the window now (idempotent): its rkey stops working at once.

        The window is deallocated, which revokes it without a work request
        and without touching the region. Local work on the region goes on.
        """
        mw, self._mw = self._mw, None
        if mw is None:
            return
        self.segment.mr._windows.discard(self)
        self._binder.discard(self)
        if not self.bound.done():
            # Deallocating under a pending bind would fail the bind, and with
            # it the queue pair: deallocate as soon as the bind is over (the
            # peer cannot have the rkey yet: it travels in a later send).
            def deallocate(bound: asyncio.Future[WorkCompletion]) -> None:
                if not bound.cancelled():
                    bound.exception()  # reported to whoever awaits it, if anyone
                _deallocate(mw)

            self.bound.add_done_callback(deallocate)
            return
        _deallocate(mw)

    close = invalidate

    def __enter__(self) -> MemoryWindow:
        return self

    def __exit__(self, *exc: object) -> None:
        self.invalidate()


def _deallocate(mw: MW) -> None:
    with verbs_errors("deallocating a memory window"):
        mw.close()


def check_window(local: MemoryRegion | Segment, access: Access) -> tuple[Segment, Access]:
    """The segment and access of a window to bind; TypeError/ValueError saying what is wrong."""
    if isinstance(local, MemoryRegion):
        if local.closed:
            raise ValueError("cannot bind a window over a closed memory region")
        local = local[:]
    if not isinstance(local, Segment):
        raise TypeError(
            f"a window is bound over a MemoryRegion or Segment, not {type(local).__name__}"
        )
    access = Access(access)
    region = local.mr
    if region.closed:
        raise ValueError("cannot bind a window over a closed memory region")
    if not access or access & ~WINDOW_ACCESS:
        raise ValueError(
            f"a window grants remote access only (REMOTE_READ, REMOTE_WRITE, REMOTE_ATOMIC), "
            f"not {access!r}"
        )
    if not region.access & Access.MW_BIND:
        raise ValueError(
            f"the region was registered with {region.access!r}, without Access.MW_BIND: "
            "register it with Access.MW_BIND to bind windows over it"
        )
    if access & (Access.REMOTE_WRITE | Access.REMOTE_ATOMIC) and not (
        region.access & Access.LOCAL_WRITE
    ):
        raise ValueError("a writable window needs a region registered with Access.LOCAL_WRITE")
    if len(local) == 0:
        raise ValueError("a window must cover at least one byte")
    return local, access


class Binder(Protocol):
    """What binding a window needs of the queue pair's work engine."""

    @property
    def qp(self) -> QP | None: ...

    @property
    def sq(self) -> QueueRoom: ...

    def check_usable(self) -> None: ...

    def post_with(
        self, seg: Segment, opcode: int, post: Callable[[int], int]
    ) -> tuple[asyncio.Future[WorkCompletion], int]: ...


def check_bind(
    device: Owner, engine: Binder, local: MemoryRegion | Segment, access: Access
) -> tuple[Segment, Access, int]:
    """:func:`check_window`, on ``device``'s queue pair: the segment, the
    access and the device's window type, or the error saying why not."""
    segment, access = check_window(local, access)
    if not device._holds(segment.mr):
        raise ValueError(f"the region is not registered on {device.name}, this queue pair's device")
    kind = device.attributes.memory_windows
    if not kind:
        raise DeviceError(95, f"{device.name} does not support memory windows")
    engine.check_usable()
    return segment, access, kind


def start_bind(
    device: Owner, engine: Binder, segment: Segment, access: Access, kind: int, qp_num: int,
    windows: set[MemoryWindow],
) -> MemoryWindow:  # fmt: skip
    """Allocate a window of ``kind`` and post its bind through ``engine``
    (one send-queue entry already taken, given back if the allocation
    fails); the window, whose ``bound`` is the bind's outcome."""
    from pyverbs.mr import MW

    try:
        with verbs_errors(f"allocating a memory window on {device.name}"):
            mw = MW(device.pd, kind)
    except BaseException:
        engine.sq.release(1)
        raise
    try:
        bound, rkey = engine.post_with(
            segment, _ibv.WR_BIND_MW,
            lambda wr_id: _post_bind(engine, mw, segment, access, kind, wr_id),
        )  # fmt: skip
    except BaseException:
        mw.close()
        raise
    return MemoryWindow(mw, segment, access, rkey, kind, qp_num, windows, bound)


def _post_bind(
    engine: Binder, mw: MW, seg: Segment, access: Access, kind: int, wr_id: int
) -> int:  # fmt: skip
    """Post a signalled bind of ``mw`` over ``seg`` as work request ``wr_id``;
    the rkey the window will have. Through pyverbs, not the driver: a bind
    is rare, and a type 1 bind is ``ibv_bind_mw``, not a work request."""
    from pyverbs.mr import MWBind, MWBindInfo
    from pyverbs.wr import SendWR

    qp, mr = engine.qp, seg.mr._mr
    assert qp is not None
    assert mr is not None
    with verbs_errors("binding a memory window", errno.EINVAL):
        info = MWBindInfo(mr, seg.addr, seg.length, int(access))
        if kind == _ibv.MW_TYPE_2:
            wr = SendWR(wr_id=wr_id, opcode=_ibv.WR_BIND_MW, send_flags=_ibv.SEND_SIGNALED)
            wr.set_bind_wr(mw, info)
            qp.post_send(wr)
            return int(wr.rkey)
        qp.bind_mw(mw, MWBind(info, _ibv.SEND_SIGNALED, wr_id))
        return int(mw.rkey)


__all__ = ["MemoryWindow"]
