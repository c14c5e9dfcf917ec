"""A connection set up by rdma_cm: the object (``connect.py`` and ``server.py`` make them).

A :class:`Connection` pairs one rdma_cm identifier with one of our own
queue pairs (an "external QP" to rdma_cm): rdma_cm resolves the address and
route and runs the CM handshake; ``rdma_init_qp_attr`` supplies the
attributes that move the QP to RTR and RTS. The QP's completions arrive on
the device's completion queue of the running loop like any other QP's.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import sys
import weakref
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final

from aiordma import metrics
from aiordma.cm import _rdmacm
from aiordma.cm._events import CMId, release_removed_device
from aiordma.cm._rdmacm import Event, EventType
from aiordma.exceptions import (
    ConnectionLostError,
    NotPreparedError,
    RdmaError,
    ResourceBusyError,
    ResourceClosedError,
)
from aiordma.lifecycle import Closable, check_thread
from aiordma.metrics import Stats, merged
from aiordma.verbs.completion import CompletionQueue
from aiordma.verbs.device import Device
from aiordma.verbs.memory import Access, Local, MemoryRegion, RemoteBuffer, Segment
from aiordma.verbs.options import SendOp
from aiordma.verbs.queue_pair import QueuePair
from aiordma.verbs.window import MemoryWindow

if TYPE_CHECKING:
    from aiordma.verbs.completion import WorkCompletion

log = logging.getLogger(__name__)

Address = tuple[str, int]
Prepare = Callable[["Connection"], Any]
"""Called with a connection before the peer can use it (e.g. to post receives)."""

LINGER: Final = 2.0
"""Seconds ``close()`` waits for posted sends to complete before disconnecting."""


_NOT_PREPARED: Final[Any] = object()


class _Released:
    """What ``prepare`` made, held weakly once the connection closed."""

    __slots__ = ("ref",)

    def __init__(self, ref: weakref.ref[Any]) -> None:
        self.ref = ref


class _LostError:
    """Makes the error a closed connection's queue pair raises, holding the
    connection weakly (the queue pair must not keep it alive)."""

    __slots__ = ("_conn", "_final")

    def __init__(self, conn: Connection) -> None:
        self._conn = weakref.ref(conn)
        self._final: Callable[[], BaseException] | None = None

    def __call__(self) -> BaseException:
        if self._final is not None:
            return self._final()
        conn = self._conn()
        return ResourceClosedError("connection is closed") if conn is None else conn._lost_error()

    def freeze(self, error: BaseException) -> None:
        """From now on, errors like ``error`` (the connection is going away)."""
        if isinstance(error, ConnectionLostError):
            self._final = functools.partial(ConnectionLostError, str(error.strerror))
        else:
            self._final = functools.partial(ResourceClosedError, str(error))


class Connection(Closable):
    """A connected reliable queue pair, set up through rdma_cm.

    Made by :func:`connect` or handed to a server's callback. It carries the
    queue pair's operations, memory registration on its device, both
    addresses and the private data the peer sent while connecting. Close it
    with ``await conn.close()`` (or ``async with``): that disconnects, fails
    pending work with :class:`ResourceClosedError` and releases the queue pair
    and the memory registered through the connection. If the peer
    disconnects or dies, or the device is removed, pending and later
    operations fail with :class:`ConnectionLostError` and :meth:`wait_closed`
    returns.
    """

    def __init__(self, cm_id: CMId, qp: QueuePair, peer_private_data: bytes) -> None:
        self._cm_id: CMId | None = cm_id
        self.qp: QueuePair = qp
        """The underlying queue pair."""
        device = qp.device
        assert isinstance(device, Device)  # a queue pair's owner is the device that made it
        self.device: Device = device
        self.local_address: Address = cm_id.local_address
        self.peer_address: Address = cm_id.peer_address
        self.peer_private_data: bytes = peer_private_data
        """Private data from the peer's connect (server side) or accept (client side),
        zero-padded by rdma_cm to the CM message's fixed size."""
        self._prepared: Any = _NOT_PREPARED
        self._loop = cm_id.channel.loop
        self._closed: asyncio.Future[None] = self._loop.create_future()
        self._closing = False
        self._error: ConnectionLostError | None = None
        self._mrs: weakref.WeakSet[MemoryRegion] = weakref.WeakSet()
        self._task: asyncio.Task[None] | None = None
        self._established = False
        self._on_established: list[Callable[[], None]] = []
        self._keepalive: asyncio.TimerHandle | None = None
        self._errors = _LostError(self)
        """What the queue pair raises once this connection closes."""
        self._stat_parts: list[Stats] = [qp._stats]
        """The stats of what runs on this connection (its QP, channel, RPC)."""
        self._probing = qp.options.keepalive is not None
        if self._probing:
            # Registered now, before either side can see the connection, so
            # its memory does not appear mid-life.
            try:
                qp._ready_probes()
            except RdmaError as exc:  # 8 bytes per send slot; only a memlock limit refuses
                log.warning("%r: no keepalive (%s)", self, exc)
                self._probing = False
        self.device._watch(self)

    def __repr__(self) -> str:
        state = "closed" if self._closed.done() else "closing" if self._closing else "open"
        peer = f"{self.peer_address[0]}:{self.peer_address[1]}"
        return f"<Connection {peer} qp_num={self.qp.qp_num} {state}>"

    @property
    def completion_queue(self) -> CompletionQueue:
        """The completion queue this connection's sends complete on: its
        ``waiting()`` says what the waiting policy did for it (a channel's
        is ``channel.conn.completion_queue``, an RPC client's
        ``client.conn.completion_queue``)."""
        return self.qp.completion_queue

    @property
    def loopback(self) -> bool:
        """Whether the peer is at this connection's own address: the same
        device, with no wire between (a channel reads large messages in
        larger pieces then)."""
        return self.local_address[0] == self.peer_address[0]

    @property
    def prepared(self) -> Any:
        """What the ``prepare`` hook returned (awaited if it was awaitable).

        Raises :class:`~aiordma.NotPreparedError` when the connection was made
        without a ``prepare`` hook: a message channel, for instance, exists
        only if ``prepare=prepare_channel`` was given on this side.
        """
        if type(self._prepared) is _Released:
            prepared = self._prepared.ref()
            if prepared is None:
                raise ResourceClosedError(
                    f"{self!r} is closed, and what its prepare hook made is gone (nothing "
                    "else held it): keep a reference to it to use it after close"
                )
            return prepared
        if self._prepared is _NOT_PREPARED:
            raise NotPreparedError(
                f"no prepare hook was given for {self!r}, so nothing was prepared: "
                "pass prepare= (for messages, prepare=aiordma.prepare_channel on both "
                "sides, or use aiordma.open_channel / aiordma.start_channel_server)"
            )
        return self._prepared

    @prepared.setter
    def prepared(self, value: Any) -> None:
        self._prepared = value

    def _activate(self) -> None:
        """The connection is established: from now on rdma_cm events are handled here."""
        assert self._cm_id is not None
        self._cm_id.set_handler(self._on_cm_event)
        self._established = True
        sys.audit("aiordma.connection.established", self)  # as CPython's socket.connect
        if self._probing:
            self._keep_alive()
        callbacks, self._on_established = self._on_established, []
        for callback in callbacks:
            callback()

    # -- keepalive ---------------------------------------------------------
    #
    # RC only notices a dead peer while work is outstanding: a machine that
    # lost power leaves an idle connection open forever. So every
    # ``options.keepalive`` seconds a connection posts a zero-length RDMA
    # write; the transport retries it (``timeout`` and ``retry_cnt``) and,
    # if the peer never acknowledges it, the connection is lost. One such
    # write per interval costs nothing measurable, busy or idle (whether
    # sends are "in flight" says little: unsignalled ones stay counted until
    # a later completion, and this probe is that completion).

    def _keep_alive(self) -> None:
        interval = self.qp.options.keepalive
        if interval is not None and not self._closing:
            self._keepalive = self._loop.call_later(interval, self._probe)

    def _probe(self) -> None:
        self._keepalive = None
        if self._closing:
            return
        try:
            self.qp.post_probe(self._probed)
        except ResourceBusyError:
            self._keep_alive()
        except RdmaError as exc:  # failed or closing: reported there
            log.debug("%r: no keepalive probe: %r", self, exc)

    def _probed(self, error: BaseException | None, _length: int) -> None:
        if error is None:
            self._keep_alive()
        elif not self._closing:
            self._lost(f"{self.peer_address[0]} did not acknowledge a keepalive probe ({error})")
            # Fail pending work now, as lost, before the completions the
            # failed queue pair flushes are reported as mere flushes.
            self.qp._close(self._errors)

    def on_established(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once both peers can send (now, if they already can).

        The connection is usable when :func:`connect` returns or a handler
        starts; the peer may still be finishing its side, and a send before
        it has posted its receives meets receiver-not-ready retries. A
        protocol's first message waits for this.
        """
        if self._established:
            callback()
        else:
            self._on_established.append(callback)

    def _when_closed(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once everything is released (internal entry for servers)."""
        self._closed.add_done_callback(lambda _: callback())

    def _on_cm_event(self, event: Event, _child: CMId | None) -> None:
        if event.type == EventType.DISCONNECTED:
            self._lost(f"{self.peer_address[0]}:{self.peer_address[1]} disconnected")
        elif event.type == EventType.DEVICE_REMOVAL:
            self.device._removed()
            release_removed_device(self.device.name)
        elif event.type not in (EventType.TIMEWAIT_EXIT, EventType.ESTABLISHED):
            log.warning("unexpected rdma_cm %s on %r", event.name, self)

    def _lost(self, reason: str) -> None:
        if self._closing:
            return
        self._error = ConnectionLostError(f"connection lost: {reason}")
        self._start_close(disconnect=False)

    def _device_removed(self, device: Device) -> None:
        """Called by the device before it closes itself: fail and release everything now."""
        if self._closed.done():
            return
        if not self._closing:
            self._error = ConnectionLostError(f"connection lost: device {device.name} was removed")
            self._closing = True
            self.qp._close(self._errors)
        self.qp.destroy()
        self._release()

    def _lost_error(self) -> BaseException:
        if self._error is not None:
            return ConnectionLostError(str(self._error.strerror))
        return ResourceClosedError("connection is closed")

    # -- lifecycle ---------------------------------------------------------

    def is_closing(self) -> bool:
        """True once the connection is closing or closed, as for asyncio transports."""
        return self._closing

    @property
    def closed(self) -> bool:
        """True once everything is released."""
        return self._closed.done()

    def close(self) -> Awaitable[None]:
        """Disconnect and release the queue pair (idempotent).

        Sends already posted get up to :data:`LINGER` seconds to complete
        first, so a message sent just before closing is delivered; then
        every pending operation fails. Returns an awaitable that completes
        when everything is released, so both ``conn.close()`` followed by
        ``await conn.wait_closed()`` and ``await conn.close()`` work.
        From another thread than the loop's it raises :class:`WrongLoopError`
        and changes nothing.
        """
        check_thread(self._loop, "Connection.close()")
        self._start_close(disconnect=True)
        return asyncio.shield(self._closed)

    async def wait_closed(self) -> None:
        """Wait until the connection is closed, by either side or by a failure."""
        await asyncio.shield(self._closed)

    def _start_close(self, disconnect: bool) -> None:
        if self._closing:
            return
        self._closing = True
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None
        self._task = self._loop.create_task(self._shutdown(disconnect))
        # A task cancelled before its first step never runs its body (the
        # loop's shutdown cancels every task): release then, or whoever
        # awaits the close would wait forever.
        self._task.add_done_callback(self._shutdown_ended)

    def _shutdown_ended(self, _: asyncio.Task[None]) -> None:
        self._release()  # idempotent: done already unless the task never ran

    async def _shutdown(self, disconnect: bool) -> None:
        try:
            cm_id = self._cm_id
            if disconnect and cm_id is not None and cm_id.ptr is not None:
                await self._linger()
                try:
                    _rdmacm.disconnect(cm_id.ptr)
                except OSError as exc:
                    log.debug("rdma_disconnect: %s", exc)
            self.qp._close(self._errors)
            await self.qp.wait_closed()
        finally:
            self._release()

    async def _linger(self) -> None:
        """Let sends already posted complete before disconnecting, as closing a
        socket delivers what was written (bounded by :data:`LINGER`)."""
        qp = self.qp
        if qp.is_closing() or not qp.sends_in_flight:
            return
        try:
            async with asyncio.timeout(LINGER):
                await qp.flush_sends()
        except (TimeoutError, RdmaError, ResourceClosedError):
            pass

    def _abandon(self) -> None:
        """Internal entry for a set-up that failed after this object was made:
        release everything now, without disconnecting."""
        self._closing = True
        self._release()

    def _release(self) -> None:
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None
        if self._closed.done():
            return
        try:
            self.qp.destroy()
            for mr in list(self._mrs):
                try:
                    mr._deregister()
                except Exception:
                    log.exception("could not deregister %r", mr)
            cm_id, self._cm_id = self._cm_id, None
            if cm_id is not None:
                cm_id.destroy()
        finally:
            self.device._unwatch(self)
            metrics.unwatch(self)
            self._let_go()
            self._closed.set_result(None)

    def _let_go(self) -> None:
        """Closed: let go of what refers back to this connection, so that
        reference counting frees it (and what ran on it) once the
        application drops it: what ``prepare`` made is held weakly from now
        on (whoever uses it holds it), and the metrics keep their values."""
        for stats in self._stat_parts:
            stats.freeze()
        self._errors.freeze(self._lost_error())
        self._on_established.clear()
        if self._prepared is not _NOT_PREPARED:
            with contextlib.suppress(TypeError):  # not weakly referable: it stays
                self._prepared = _Released(weakref.ref(self._prepared))

    def _unclosed(self) -> bool:
        return not self._closed.done()

    # -- metrics -----------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """What this connection has done, as plain data (see :mod:`aiordma.metrics`).

        ``counters`` sums its queue pair's (awaited verbs by kind, failed
        completions by status), its message channel's (messages, bytes and
        large messages each way, credit stalls, revocations) and its RPC
        client's or service's (calls, failures); ``gauges`` are current
        values (bytes and messages exposed); ``latency`` has a histogram
        per awaited verb and for RPC calls. Zero while metrics are off.
        """
        snapshot = merged("connection", self._stat_parts).snapshot()
        snapshot["peer_address"] = self.peer_address
        snapshot["qp_num"] = self.qp.qp_num
        return snapshot

    def add_stats(self, stats: Stats) -> None:
        """Count ``stats`` (a channel's, an RPC side's) in :meth:`stats` and in
        the connection's exports, as its own."""
        self._stat_parts.append(stats)

    def _metric_sources(self) -> Iterator[tuple[dict[str, str], Stats]]:
        """For exporters (a client connection: servers export their own)."""
        yield {"peer": "{}:{}".format(*self.peer_address)}, merged("connection", self._stat_parts)

    # -- memory ------------------------------------------------------------

    def register(self, obj: Any, access: Access | None = None) -> MemoryRegion:
        """Register ``obj`` on this connection's device; deregistered when the connection closes.

        ``access`` is least-privilege by default, as in :meth:`aiordma.Device.register`.
        """
        mr = self.device.register(obj, access)
        self._mrs.add(mr)
        return mr

    def alloc(self, size: int, access: Access = Access.LOCAL_WRITE) -> MemoryRegion:
        """Allocate and register ``size`` bytes for the life of this connection."""
        mr = self.device.alloc(size, access)
        self._mrs.add(mr)
        return mr

    async def bind_window(
        self, local: MemoryRegion | Segment, access: Access = Access.REMOTE_READ
    ) -> MemoryWindow:
        """Give the peer revocable access to exactly ``local``'s bytes through a
        memory window (see :meth:`aiordma.QueuePair.bind_window`); it is revoked
        at the latest when the connection closes."""
        return await self.qp.bind_window(local, access)

    # -- operations (see QueuePair) -----------------------------------------

    async def post_send(self, local: Local, *, imm: int | None = None,
                        inline: bool | None = None) -> WorkCompletion:  # fmt: skip
        """Send ``local`` into the peer's next posted receive."""
        return await self.qp.post_send(local, imm=imm, inline=inline)

    async def send_with_imm(self, local: Local, imm: int) -> WorkCompletion:
        """Send with 32-bit immediate data."""
        return await self.qp.send_with_imm(local, imm)

    async def post_recv(self, local: Local) -> WorkCompletion:
        """Post one receive buffer and wait for the message that lands in it."""
        return await self.qp.post_recv(local)

    async def post_recv_batch(
        self, locals_: Sequence[Local]
    ) -> list[asyncio.Future[WorkCompletion]]:
        """Post receives; one future per buffer, resolved as messages land."""
        return await self.qp.post_recv_batch(locals_)

    async def rdma_write(self, local: Local, remote: RemoteBuffer, *, imm: int | None = None,
                         inline: bool | None = None) -> WorkCompletion:  # fmt: skip
        """Write ``local`` into the peer's ``remote`` buffer."""
        return await self.qp.rdma_write(local, remote, imm=imm, inline=inline)

    async def rdma_read(self, local: Local, remote: RemoteBuffer) -> WorkCompletion:
        """Read the peer's ``remote`` buffer into ``local``."""
        return await self.qp.rdma_read(local, remote)

    async def atomic_fetch_add(self, remote: RemoteBuffer, add: int) -> int:
        """Atomically add to the peer's 64-bit word; returns the old value."""
        return await self.qp.atomic_fetch_add(remote, add)

    async def atomic_cmp_swap(self, remote: RemoteBuffer, compare: int, swap: int) -> int:
        """Atomically compare-and-swap the peer's 64-bit word; returns the old value."""
        return await self.qp.atomic_cmp_swap(remote, compare, swap)

    async def post_batch(self, ops: Sequence[SendOp]) -> list[asyncio.Future[WorkCompletion]]:
        """Post many sends/writes/reads at once; one future per operation."""
        return await self.qp.post_batch(ops)
