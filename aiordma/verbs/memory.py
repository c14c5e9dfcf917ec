"""Memory regions, local segments and remote buffer descriptors.

Registration pins a buffer's pages and gives the adapter its translation:
an ``lkey`` lets local work requests use it, an ``rkey`` lets a peer read,
write or run atomics on it — only as far as the access flags allow. aiordma
registers for local access unless remote access is asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import mmap
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Final, Protocol, overload

from aiordma._checks import check_bytes_like
from aiordma._pyverbs import verbs_errors
from aiordma.exceptions import ResourceBusyError, ResourceClosedError
from aiordma.lifecycle import Closable, CloseWaiters
from aiordma.verbs._buffer import BufferExport
from aiordma.verbs._buffer import refuse_objects as refuse_objects  # for the layers above

if TYPE_CHECKING:
    from pyverbs.mr import MR
    from pyverbs.pd import PD


class Access(enum.IntFlag):
    """What a memory region may be used for (``ibv_access_flags``).

    No flag at all still allows the region to be the *source* of local
    sends and writes. ``LOCAL_WRITE`` lets the adapter write into it
    (receives, the local side of RDMA reads, atomic results). The ``REMOTE_*``
    flags let a peer holding the rkey act on it.
    """

    NONE = 0
    LOCAL_WRITE = 1
    REMOTE_WRITE = 2
    REMOTE_READ = 4
    REMOTE_ATOMIC = 8
    MW_BIND = 16
    """Memory windows may be bound over the region. This grants a peer
    nothing by itself: only a window, bound by this process, does."""
    REMOTE = REMOTE_READ | REMOTE_WRITE


_NEEDS_WRITABLE: Final = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_ATOMIC
_REMOTE_ANY: Final = Access.REMOTE_READ | Access.REMOTE_WRITE | Access.REMOTE_ATOMIC


def _slice_bounds(key: slice, length: int) -> tuple[int, int]:
    """A slice's bounds in ``length`` bytes. Unlike a sequence's, a bound past
    either end is refused (IndexError), not clamped: an RDMA range silently
    shorter than asked would move fewer bytes than the caller counts on."""
    for bound in (key.start, key.stop):
        if isinstance(bound, int) and not -length <= bound <= length:
            raise IndexError(
                f"memory slice [{_bound(key.start)}:{_bound(key.stop)}] reaches past the "
                f"{length} bytes sliced"
            )
    start, stop, step = key.indices(length)
    if step != 1:
        raise ValueError("memory slices must be contiguous (step 1)")
    return start, max(start, stop)


def _bound(value: object) -> str:
    return "" if value is None else str(value)


def buffer_span(obj: Any) -> tuple[int, int]:
    """The address and length of ``obj``'s memory now (TypeError if it is not
    one contiguous buffer); valid only while something holds an export of it."""
    export = BufferExport(obj)
    try:
        return export.address, export.length
    finally:
        export.release()


class Revocable(Protocol):
    """What a region revokes before it is deregistered (a memory window)."""

    def invalidate(self) -> None: ...


class MemoryRegion(Closable):
    """A registered buffer: ``addr``, ``length``, ``lkey``, ``rkey`` and its access flags.

    Created by :meth:`aiordma.Device.register` or :meth:`aiordma.Device.alloc`.
    ``mr[a:b]`` is a :class:`Segment` for work requests, ``mr.remote()`` a
    :class:`RemoteBuffer` to hand to a peer. The region cannot be
    deregistered while work requests that use it are in flight: :meth:`close`
    raises :class:`ResourceBusyError` then, :meth:`aclose` waits for them.
    """

    kind: ClassVar[str] = "memory region"

    def __init__(self, pd: PD, obj: Any, access: Access | None = None) -> None:
        from pyverbs.mr import MR

        export = BufferExport(obj)
        try:
            if export.length == 0:
                raise ValueError("cannot register an empty buffer")
            if access is None:
                access = Access.NONE if export.readonly else Access.LOCAL_WRITE
            access = Access(access)
            if access & (Access.REMOTE_WRITE | Access.REMOTE_ATOMIC):
                access |= Access.LOCAL_WRITE  # verbs require it alongside remote write/atomic
            if export.readonly and access & _NEEDS_WRITABLE:
                raise ValueError(
                    f"cannot register read-only {type(obj).__name__} with "
                    f"{(access & _NEEDS_WRITABLE)!r}: the adapter would write into it"
                )
            with verbs_errors(f"registering {export.length} bytes ({access!r})"):
                self._mr: MR | None = MR(pd, export.length, int(access), address=export.address)
        except BaseException:
            export.release()
            raise
        self._export = export
        self._pd = pd
        """The protection domain it is registered in (queue pairs of another cannot use it)."""
        self.obj: Any = obj
        """The registered object; kept alive, and unable to resize, until close."""
        self.access: Access = access
        self.addr: int = export.address
        self.length: int = export.length
        self.lkey: int = self._mr.lkey
        self.rkey: int = self._mr.rkey
        self._inflight = 0
        self._idle: asyncio.Event | None = None
        self._owned: mmap.mmap | None = None
        self._close_waiters = CloseWaiters()
        self._windows: set[Revocable] = set()
        """Memory windows bound over this region: revoked before it is deregistered."""
        self._scoped: list[memoryview] = []
        """Views released when the region is deregistered (``view(scoped=True)``)."""

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"lkey={self.lkey:#x} rkey={self.rkey:#x}"
        return f"<MemoryRegion addr={self.addr:#x} length={self.length} {self.access!r} {state}>"

    def __len__(self) -> int:
        return self.length

    @overload
    def __getitem__(self, key: slice) -> Segment: ...
    @overload
    def __getitem__(self, key: int) -> int: ...
    def __getitem__(self, key: slice | int) -> Segment | int:
        if isinstance(key, int):
            return int(self.view()[key])
        start, stop = _slice_bounds(key, self.length)
        return Segment(self, start, stop - start)

    @property
    def closed(self) -> bool:
        """True once the region is deregistered."""
        return self._mr is None

    @property
    def bound_windows(self) -> int:
        """Number of memory windows bound over this region and not yet revoked."""
        return len(self._windows)

    @property
    def inflight(self) -> int:
        """Number of posted work requests that still use this region."""
        return self._inflight

    def view(self, *, scoped: bool = False) -> memoryview:
        """A byte-wise view of the registered memory (no copy).

        A ``scoped`` view is released when the region is deregistered, so
        memory the region allocated (:meth:`Device.alloc`) is unmapped then,
        not whenever the garbage collector finds the view's last holder;
        using it afterwards raises ``ValueError``. For views an owner keeps
        for the region's whole life (a message channel's slots).
        """
        self._check_open()
        view = memoryview(self.obj).cast("B")
        if scoped:
            self._scoped.append(view)
        return view

    def segment(self, offset: int = 0, length: int | None = None) -> Segment:
        """The local segment ``[offset, offset + length)`` (to the end by default)."""
        if length is None:
            length = self.length - offset
        if offset < 0 or length < 0 or offset + length > self.length:
            raise ValueError(
                f"segment [{offset}, {offset + length}) is outside the region's {self.length} bytes"
            )
        return Segment(self, offset, length)

    def remote(self, offset: int = 0, length: int | None = None) -> RemoteBuffer:
        """A descriptor a peer can use for one-sided access to ``[offset, offset + length)``.

        Raises ValueError when the region was registered without remote access.
        """
        self._check_open()
        if not self.access & _REMOTE_ANY:
            raise ValueError(
                "this region has local access only; register it with "
                "Access.REMOTE_READ, REMOTE_WRITE or REMOTE_ATOMIC to share it"
            )
        seg = self.segment(offset, length)
        return RemoteBuffer(self.addr + seg.offset, seg.length, self.rkey)

    def _check_open(self) -> None:
        if self._mr is None:
            raise ResourceClosedError("memory region is closed")

    def _acquire(self) -> None:
        self._check_open()
        self._inflight += 1

    def _release(self) -> None:
        self._inflight -= 1
        if self._inflight == 0 and self._idle is not None:
            self._idle.set()

    def close(self) -> None:
        """Deregister now (idempotent). Raises ResourceBusyError if work is in flight."""
        if self._mr is None:
            return
        if self._inflight:
            raise ResourceBusyError(
                f"memory region has {self._inflight} work request(s) in flight; "
                "await aclose() to deregister once they complete"
            )
        self._deregister()

    def _owner_closing(self) -> None:
        self._deregister()

    def _deregister(self) -> None:
        """Deregister regardless of work in flight (its queue pairs are gone)."""
        mr, self._mr = self._mr, None
        if mr is None:
            return
        self._inflight = 0
        windows, self._windows = self._windows, set()
        for window in windows:
            window.invalidate()
        try:
            mr.close()
        finally:
            self._close_waiters.closed()
            self._export.release()
            scoped, self._scoped = self._scoped, []
            for view in scoped:
                with contextlib.suppress(BufferError):  # a view of it is in use: later
                    view.release()
            owned, self._owned = self._owned, None
            if owned is not None:
                # If views of it are still alive, it is unmapped when the last one goes.
                with contextlib.suppress(BufferError):
                    owned.close()

    def is_closing(self) -> bool:
        """True once the region is deregistered."""
        return self._mr is None

    async def wait_closed(self) -> None:
        """Wait until the region is deregistered (by :meth:`close`, :meth:`aclose`,
        or the connection or device it belongs to closing)."""
        if not self.closed:
            await self._close_waiters.wait()

    async def aclose(self) -> None:
        """Wait until no work request uses the region, then deregister it."""
        while self._inflight:
            if self._idle is None or self._idle.is_set():
                self._idle = asyncio.Event()
            await self._idle.wait()
        self.close()

    def __enter__(self) -> MemoryRegion:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True, slots=True)
class Segment:
    """A contiguous piece ``[offset, offset + length)`` of a memory region (one SGE)."""

    mr: MemoryRegion
    offset: int
    length: int

    @property
    def addr(self) -> int:
        """The segment's virtual address (the SGE's ``addr``)."""
        return self.mr.addr + self.offset

    @property
    def lkey(self) -> int:
        """The local key of the segment's region (the SGE's ``lkey``)."""
        return self.mr.lkey

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, key: slice) -> Segment:
        start, stop = _slice_bounds(key, self.length)
        return Segment(self.mr, self.offset + start, stop - start)

    def view(self) -> memoryview:
        """The segment's bytes (no copy)."""
        return self.mr.view()[self.offset : self.offset + self.length]

    def remote(self) -> RemoteBuffer:
        """The remote descriptor of exactly this segment."""
        return self.mr.remote(self.offset, self.length)


Local = MemoryRegion | Segment | Sequence[MemoryRegion | Segment]
"""Local memory for a work request: a region, a slice of one, or a scatter/gather list."""


def as_segments(local: Local) -> tuple[Segment, ...]:
    """Normalise :data:`Local` to a tuple of segments (an SGE list)."""
    if isinstance(local, MemoryRegion):
        return (local.segment(),)
    if isinstance(local, Segment):
        return (local,)
    if isinstance(local, bytes | bytearray | memoryview | str) or not isinstance(local, Sequence):
        raise TypeError(
            f"local memory must be a MemoryRegion or Segment (or a list of them), not "
            f"{type(local).__name__}: register it first (device.register(data), or "
            "conn.register(data))"
        )
    segs = []
    for item in local:
        if isinstance(item, MemoryRegion):
            segs.append(item.segment())
        elif isinstance(item, Segment):
            segs.append(item)
        else:
            raise TypeError(f"expected MemoryRegion or Segment, got {type(item).__name__}")
    return tuple(segs)


def check_remote(remote: object) -> RemoteBuffer:
    """``remote`` itself; TypeError naming what it is when it is not a :class:`RemoteBuffer`."""
    if not isinstance(remote, RemoteBuffer):
        raise TypeError(
            f"remote must be a RemoteBuffer (region.remote(), or RemoteBuffer(addr, "
            f"length, rkey)), not {type(remote).__name__}"
        )
    return remote


def check_segments(segments: tuple[Segment, ...], limit: int) -> None:
    """ValueError unless ``segments`` is a usable scatter/gather list of at
    most ``limit`` entries; ResourceClosedError if a region is closed."""
    if not segments:
        raise ValueError("a work request needs at least one segment")
    if len(segments) > limit:
        raise ValueError(f"{len(segments)} segments exceed the queue pair's limit of {limit}")
    for seg in segments:
        seg.mr._check_open()


def check_writable(segments: tuple[Segment, ...], what: str) -> None:
    """ValueError unless the adapter may write into every segment (``what`` needs it)."""
    for seg in segments:
        if not seg.mr.access & Access.LOCAL_WRITE:
            raise ValueError(
                f"{what} writes into local memory: register it with Access.LOCAL_WRITE"
            )


_REMOTE_FORMAT: Final = struct.Struct("<QQI")


@dataclass(frozen=True, slots=True)
class RemoteBuffer:
    """Where a peer's registered memory is: virtual address, length and rkey.

    Obtained from :meth:`MemoryRegion.remote` on the owning side, sent to the
    peer as :meth:`RemoteBuffer.to_bytes` (``RemoteBuffer.SIZE`` bytes, little-endian),
    rebuilt there with :meth:`RemoteBuffer.from_bytes`. Slicing narrows it.
    """

    addr: int
    length: int
    rkey: int

    SIZE: ClassVar[int] = _REMOTE_FORMAT.size

    def __post_init__(self) -> None:
        if not (0 <= self.addr < 1 << 64 and 0 <= self.length < 1 << 64):
            raise ValueError("remote address and length must fit in 64 bits")
        if not 0 <= self.rkey < 1 << 32:
            raise ValueError("rkey must fit in 32 bits")

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, key: slice) -> RemoteBuffer:
        start, stop = _slice_bounds(key, self.length)
        return RemoteBuffer(self.addr + start, stop - start, self.rkey)

    def to_bytes(self) -> bytes:
        """Pack into ``RemoteBuffer.SIZE`` bytes (little-endian), to send to the peer."""
        return _REMOTE_FORMAT.pack(self.addr, self.length, self.rkey)

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> RemoteBuffer:
        """Unpack what :meth:`to_bytes` made; raises ValueError on a wrong length."""
        check_bytes_like("data", data)
        if len(data) != cls.SIZE:
            raise ValueError(f"a packed RemoteBuffer is {cls.SIZE} bytes, got {len(data)}")
        return cls(*_REMOTE_FORMAT.unpack(data))
