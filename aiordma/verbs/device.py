"""RDMA devices and their protection domain."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import errno
import itertools
import mmap
import resource
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Protocol

from aiordma._checks import check_int
from aiordma._pyverbs import verbs_errors
from aiordma.exceptions import DeviceError, MemoryLimitError, ResourceClosedError
from aiordma.lifecycle import Closable, CloseWaiters, check_thread
from aiordma.verbs._lifecycle import Child, Children
from aiordma.verbs.attributes import DeviceAttributes
from aiordma.verbs.completion import CompletionQueue
from aiordma.verbs.discovery import (
    DeviceInfo,
    PortInfo,
    find_roce_endpoint,
    forget_devices,
    list_devices,
    lookup,
)
from aiordma.verbs.memory import Access, MemoryRegion
from aiordma.verbs.options import QueuePairOptions
from aiordma.verbs.queue_pair import QueuePair, ReceiveSource

if TYPE_CHECKING:
    from pyverbs.device import Context
    from pyverbs.pd import PD


_cq_numbers = itertools.count(1)
"""Numbers completion queues' metric labels (``rxe0#3``)."""


class _RemovalWatcher(Protocol):
    def _device_removed(self, device: Device) -> None: ...


_shared: dict[str, Device] = {}
_shared_default: str | None = None
"""The name ``Device.shared()`` resolved its default to."""
_open: weakref.WeakSet[Device] = weakref.WeakSet()
"""Every open device, so that exit can close what the program left open."""


@atexit.register
def _close_shared() -> None:
    """Release devices before interpreter teardown frees pyverbs objects in
    any order (which can crash inside libibverbs): shared ones silently,
    others left open by the program with a ResourceWarning."""
    for dev in list(_shared.values()):
        with contextlib.suppress(Exception):
            dev.close()
    _shared.clear()
    for dev in list(_open):
        warnings.warn(f"unclosed {dev!r} closed at exit", ResourceWarning, stacklevel=1)
        with contextlib.suppress(Exception):
            dev.close()


def _default_device_name() -> str:
    """The first device with a RoCE v2 address (IPv4 first), else with an active port."""

    def choose(devices: list[DeviceInfo]) -> str | None:
        endpoint = find_roce_endpoint(devices) or find_roce_endpoint(devices, family=6)
        if endpoint is not None:
            return endpoint.device
        return next((d.name for d in devices if any(p.active for p in d.ports)), None)

    name = lookup(choose)
    if name is None:
        raise DeviceError(19, "no RDMA device with an active port (try 'aiordma devices')")
    return name


class Device(Closable):
    """An opened RDMA device with one protection domain.

    ``Device()`` opens the first device with an active port; ``Device("rxe0")``
    a named one. Memory registered and queue pairs created through it share
    its protection domain. Use it as an (async) context manager or call
    :meth:`close`, which releases queue pairs, memory regions, completion
    queues, the protection domain and the device context, in that order.
    """

    def __init__(self, name: str | None = None) -> None:
        from pyverbs.device import Context
        from pyverbs.pd import PD

        self.name: str = name or _default_device_name()
        with verbs_errors(f"opening RDMA device {self.name!r}", errno.ENODEV):
            self._context: Context | None = Context(name=self.name)
        try:
            with verbs_errors(f"allocating a protection domain on {self.name}"):
                self._pd: PD | None = PD(self._context)
                attr = self._context.query_device()
        except BaseException:
            self._context.close()
            raise
        self.attributes = DeviceAttributes.of(attr)
        self._cqs: dict[asyncio.AbstractEventLoop, list[CompletionQueue]] = {}
        self._children = Children()
        # Weak: a watcher that was collected needs no news of a removal.
        self._watchers: weakref.WeakSet[_RemovalWatcher] = weakref.WeakSet()
        self._close_waiters = CloseWaiters()
        self.removed = False
        """True once the device was removed from the system (its connections failed)."""
        _open.add(self)

    @classmethod
    def shared(cls, name: str | None = None) -> Device:
        """The process-wide :class:`Device` for ``name``, opened on first use.

        ``None`` means the default device, as for ``Device()``.

        Connections made by :func:`aiordma.connect` and :func:`aiordma.start_server`
        without an explicit ``device`` use it, so memory registered on it
        serves every such connection. It stays open until closed explicitly or
        until the device is removed.
        """
        global _shared_default
        if name is None and _shared_default is not None:  # no sysfs scan on every call
            dev = _shared.get(_shared_default)
            if dev is not None and not dev.closed:
                return dev
        key = name or _default_device_name()
        dev = _shared.get(key)
        if dev is None or dev.closed:
            dev = _shared[key] = cls(key)
        if name is None:
            _shared_default = key
        return dev

    def __repr__(self) -> str:
        return f"<Device {self.name}{' closed' if self.closed else ''}>"

    @classmethod
    def shared_if_open(cls, name: str) -> Device | None:
        """The shared device for ``name`` if it is open, without opening it."""
        dev = _shared.get(name)
        return None if dev is None or dev.closed else dev

    @property
    def closed(self) -> bool:
        """True once the device is closed."""
        return self._context is None

    @property
    def context(self) -> Context:
        """The pyverbs ``Context`` (for what aiordma does not wrap)."""
        if self._context is None:
            raise ResourceClosedError(f"device {self.name} is closed")
        return self._context

    @property
    def pd(self) -> PD:
        """The pyverbs ``PD`` everything of this device is created in."""
        if self._pd is None:
            raise ResourceClosedError(f"device {self.name} is closed")
        return self._pd

    @property
    def ports(self) -> tuple[PortInfo, ...]:
        """Ports with their state and GID table, read now."""
        for info in list_devices():
            if info.name == self.name:
                return info.ports
        return ()

    def gid_index(self, port: int = 1, family: int = 4) -> int:
        """Index of the port's RoCE v2 GID for an IP address of ``family``; 0 on InfiniBand."""
        endpoint = find_roce_endpoint(device=self.name, port=port, family=family)
        if endpoint is not None:
            return endpoint.gid_index
        if any(p.number == port and p.link_layer == "InfiniBand" for p in self.ports):
            return 0
        raise DeviceError(
            99, f"{self.name} port {port} has no active RoCE v2 GID for an IPv{family} address"
        )

    def register(self, obj: Any, access: Access | None = None) -> MemoryRegion:
        """Register ``obj``'s memory (any contiguous buffer) without copying it.

        ``access`` defaults to ``Access.LOCAL_WRITE`` for writable buffers and
        ``Access.NONE`` (usable as a source only) for read-only ones. Remote
        access is granted only when asked for.
        """
        try:
            mr = MemoryRegion(self.pd, obj, access)
        except DeviceError as exc:
            if exc.errno != errno.ENOMEM:
                raise
            raise self._memory_limit_error(memoryview(obj).nbytes) from exc
        self._children.adopt(mr)
        return mr

    @property
    def registered(self) -> int:
        """Bytes registered on this device now (what counts against ``ulimit -l``)."""
        return sum(mr.length for mr in self._children.of("memory region") if not mr.closed)

    def _memory_limit_error(self, requested: int) -> MemoryLimitError:
        registered = self.registered
        soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        limit = None if soft == resource.RLIM_INFINITY else soft
        shown = "unlimited" if limit is None else f"{limit // 1024} KiB"
        return MemoryLimitError(
            f"cannot register {requested} bytes on {self.name}: out of lockable memory "
            f"(ENOMEM). This process already has {registered} bytes registered there, and "
            f"its locked-memory limit is {shown}: the usual cause is that limit ('ulimit -l'; "
            "raise it with 'ulimit -l unlimited', systemd's LimitMEMLOCK= or "
            "/etc/security/limits.conf, or grant CAP_IPC_LOCK). Each message channel pins "
            "2 x (window + control_window) x buffer_size bytes (640 KiB by default), and "
            "each connection a page more for its keepalive probes.",
            requested,
            registered,
            limit,
        )

    def alloc(self, size: int, access: Access = Access.LOCAL_WRITE) -> MemoryRegion:
        """Allocate ``size`` page-aligned bytes and register them
        (:class:`~aiordma.MemoryLimitError` naming ``size`` when the system
        has no room for them)."""
        check_int("size", size, 1)
        try:
            buf = mmap.mmap(-1, size)
        except (OSError, OverflowError) as exc:
            if isinstance(exc, OSError) and exc.errno != errno.ENOMEM:
                raise
            raise MemoryLimitError(
                f"cannot allocate {size} bytes for {self.name}: the system has no room "
                "for them", size, self.registered, None,
            ) from None  # fmt: skip
        try:
            mr = self.register(buf, access)
        except BaseException:
            buf.close()
            raise
        mr._owned = buf
        return mr

    def completion_queue(self, entries: int = 0) -> CompletionQueue:
        """A completion queue of this device on the running loop with room for ``entries`` more.

        Queue pairs share it; another one is created once the device's CQ size
        limit would be exceeded.
        """
        loop = asyncio.get_running_loop()
        for stale in [lp for lp in self._cqs if lp.is_closed()]:
            for cq in self._cqs.pop(stale):
                cq.close()
        cqs = self._cqs.setdefault(loop, [])
        cqs[:] = [cq for cq in cqs if not cq.closed]
        for cq in cqs:
            if cq.has_room(entries):
                return cq
        cq = CompletionQueue(self.context, loop, name=f"{self.name}#{next(_cq_numbers)}")
        cqs.append(cq)
        return cq

    def create_qp(
        self,
        options: QueuePairOptions | None = None,
        shared_receive: ReceiveSource | None = None,
    ) -> QueuePair:
        """A new reliable-connected queue pair on the running loop (in INIT
        state), receiving from ``shared_receive`` if given."""
        return QueuePair(self, options, shared_receive)

    # -- the ownership protocol (aiordma.verbs._lifecycle.Owner) -----------

    def _adopt(self, child: Child) -> None:
        self._children.adopt(child)

    def _disown(self, child: Child) -> None:
        self._children.disown(child)

    def _holds(self, child: Child) -> bool:
        return child in self._children

    def _lease_cq(self, entries: int) -> CompletionQueue:
        """A completion queue on the running loop with ``entries`` reserved for the caller."""
        cq = self.completion_queue(entries)
        cq.reserve(entries)
        return cq

    def _release_cq(self, cq: CompletionQueue, entries: int) -> None:
        """Give back a lease of :meth:`_lease_cq`. The queue closes once nobody
        uses it, unless it is its loop's first (kept for the next queue pair: a
        CQ costs a completion channel to make)."""
        if not cq.closed:
            cq.unreserve(entries)
        if cq.closed or cq.reserved > 0 or cq.loop.is_closed():
            return
        # Not now: this may run inside the CQ's own drain.
        cq.loop.call_soon(self._close_if_unused, cq)

    def _close_if_unused(self, cq: CompletionQueue) -> None:
        if cq.closed or cq.reserved > 0 or cq.pending > 0:
            return
        cqs = self._cqs.get(cq.loop)
        if cqs and cqs[0] is not cq and cq in cqs:
            cqs.remove(cq)
            cq.close()

    def _watch(self, watcher: _RemovalWatcher) -> None:
        self._watchers.add(watcher)

    def _unwatch(self, watcher: _RemovalWatcher) -> None:
        self._watchers.discard(watcher)

    def _removed(self) -> None:
        """The device is going away: fail everything on it, then release it.

        The kernel finishes removing a device only once every user context on
        it is closed, so this closes the device rather than leave it half-open.
        """
        if self.removed:
            return
        self.removed = True
        forget_devices()
        for watcher in list(self._watchers):
            watcher._device_removed(self)
        self._watchers.clear()
        self.close()
        if _shared.get(self.name) is self:
            del _shared[self.name]

    def close(self) -> None:
        """Release everything (idempotent): queue pairs, memory, CQs, PD, context.

        A device whose completion queues serve a loop running in another
        thread is refused (:class:`WrongLoopError`, nothing released).
        """
        if self._context is None:
            return
        for loop in self._cqs:
            check_thread(loop, "Device.close()")
        _open.discard(self)
        try:
            self._children.release_all()  # all of them, even if one fails
        finally:
            cqs, self._cqs = [cq for cqs in self._cqs.values() for cq in cqs], {}
            pd, ctx = self._pd, self._context
            self._pd = self._context = None
            try:
                for cq in cqs:
                    cq.close()
                if pd is not None:
                    pd.close()
            finally:
                ctx.close()
                self._close_waiters.closed()

    def is_closing(self) -> bool:
        """True once the device is closed (or was removed)."""
        return self._context is None

    def _unclosed(self) -> bool:
        return self._context is not None

    async def wait_closed(self) -> None:
        """Wait until the device is closed (by :meth:`close`, :meth:`aclose` or removal)."""
        if not self.closed:
            await self._close_waiters.wait()

    async def aclose(self) -> None:
        """Close gracefully: let queue pairs flush their pending work, then :meth:`close`."""
        for qp in self._children.of("queue pair"):
            qp.close()
            await qp.wait_closed()
        self.close()

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def connect_loopback_pair(
    device: Device, options: QueuePairOptions | None = None
) -> tuple[QueuePair, QueuePair]:
    """Two queue pairs on ``device`` connected to each other (for tests and examples)."""
    a = device.create_qp(options)
    try:
        b = device.create_qp(options)
    except BaseException:
        a.destroy()
        raise
    try:
        a.connect(b.local_endpoint)
        b.connect(a.local_endpoint)
    except BaseException:
        a.destroy()
        b.destroy()
        raise
    return a, b
