"""The passive side: :func:`start_server` and :class:`Server`, shaped like asyncio's.

A listening cm_id receives connection requests on the loop's rdma_cm
channel. Each request is set up in its own task (:mod:`aiordma.cm.accept`:
``accept`` decides, the queue pair is made ready, ``prepare`` runs, the
client confirms); the server adopts the connection and hands it to its
callback, which runs as its own task; the connection is closed when that
callback returns.
"""

from __future__ import annotations

import asyncio
import errno
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

from aiordma import metrics
from aiordma._checks import check_type
from aiordma.cm import _rdmacm
from aiordma.cm._events import CMEventChannel, CMId, release_removed_device
from aiordma.cm._rdmacm import Event, EventType
from aiordma.cm._setup import (
    check_port,
    rdma_addresses,
    resolve_address,
)
from aiordma.cm.accept import accept
from aiordma.cm.connection import Connection, Prepare
from aiordma.cm.options import (
    ConnectionRequest,
    ServeKeywords,
    ServeOptions,
)
from aiordma.exceptions import (
    DeviceError,
    RdmaError,
    ResourceClosedError,
    WrongLoopError,
)
from aiordma.lifecycle import Closable, check_loop, check_thread
from aiordma.metrics import Stats, merged
from aiordma.verbs.device import Device

if TYPE_CHECKING:
    from typing_extensions import Unpack

log = logging.getLogger(__name__)

ClientConnected = Callable[[Connection], Awaitable[object] | None]
"""The per-connection callback of :func:`start_server`: a coroutine function
(run as a task; the connection closes when it returns) or a plain function."""


class Server(Closable):
    """A listening rdma_cm endpoint; made by :func:`start_server`.

    ``close()`` stops listening, ``close_clients()`` closes the connections
    it accepted, ``wait_closed()`` waits for both; ``async with`` does all
    three. ``serve_forever()`` waits until the server is closed and raises
    if it stopped because of an error (such as the device's removal).
    """

    def __init__(
        self, client_connected_cb: ClientConnected, settings: ServeOptions, prepare: Prepare | None
    ) -> None:
        self._callback = client_connected_cb
        self._settings = settings
        self._prepare = prepare
        self._listeners: list[CMId] = []
        self._addresses: list[tuple[str, int]] = []
        self._connections: set[Connection] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self._reaper: asyncio.Task[None] | None = None
        self._loop = asyncio.get_running_loop()
        self._stopped: asyncio.Future[None] = self._loop.create_future()
        self._error: BaseException | None = None
        self._clients_closing = False
        self._serving_forever = False
        self._totals = Stats("server", lambda: {"connections": len(self._connections)})
        """Counts of closed connections, and the server's own (requests,
        refusals, set-up failures)."""

    def __repr__(self) -> str:
        where = ", ".join(f"{h}:{p}" for h, p in self._addresses)
        return f"<Server {where}{'' if self.is_serving() else ' closed'}>"

    def _listen(self, host: str, port: int, backlog: int) -> None:
        cm_id = CMEventChannel.for_running_loop().create_id()
        try:
            if ":" in host:
                _rdmacm.set_afonly(cm_id.id, False)
            _rdmacm.bind_addr(cm_id.id, host, port)
            _rdmacm.listen(cm_id.id, backlog)
        except OSError as exc:
            cm_id.destroy()
            raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from None
        if not _is_wildcard(host) and cm_id.device_name is None:
            cm_id.destroy()
            raise OSError(
                errno.EADDRNOTAVAIL,
                f"cannot listen on {host}:{port}: {host} is on no RDMA device, so no client "
                f"could ever connect; {rdma_addresses()}",
            )
        cm_id.set_handler(self._on_cm_event)
        self._listeners.append(cm_id)
        self._addresses.append(cm_id.local_address)

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """The (host, port) pairs the server listens on; the port is real even if 0
        was asked. Empty once closed, as asyncio's ``Server.sockets``."""
        return [] if self._stopped.done() else list(self._addresses)

    @property
    def connections(self) -> frozenset[Connection]:
        """Connections accepted by this server and not yet closed."""
        return frozenset(self._connections)

    def is_serving(self) -> bool:
        """True while the server is listening, as for :class:`asyncio.Server`."""
        return bool(self._listeners)

    def is_closing(self) -> bool:
        """True once :meth:`close` was called (the server stopped listening)."""
        return self._stopped.done()

    def _unclosed(self) -> bool:
        return bool(self._listeners)

    # -- requests ----------------------------------------------------------

    def _on_cm_event(self, event: Event, child: CMId | None) -> None:
        if event.type == EventType.CONNECT_REQUEST and child is not None:
            self._spawn(self._handle_request(event, child))
        elif event.type == EventType.DEVICE_REMOVAL:
            listener = next((cm for cm in self._listeners if cm.ptr == event.id), None)
            name = listener.device_name if listener is not None else None
            device = self._settings.device or (Device.shared_if_open(name) if name else None)
            self._device_removed(device)
            if device is not None:
                device._removed()
            if name is not None:
                release_removed_device(name)
        else:
            log.warning("unexpected rdma_cm %s on a listener", event.name)

    def _spawn(self, coro: Any) -> None:
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _handle_request(self, event: Event, child: CMId) -> None:
        conn = await accept(event, child, self._settings, self._prepare, self._totals.add)
        if conn is None:
            return
        if self._clients_closing:
            await conn.close()
            return
        self._connections.add(conn)
        self._totals.add("connections_accepted")
        conn._when_closed(lambda: self._retire(conn))
        task = self._loop.create_task(self._run_callback(conn))
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)
        # Closed also if the task is cancelled before it runs (at loop shutdown).
        task.add_done_callback(lambda _: conn.close())

    def _retire(self, conn: Connection) -> None:
        """A connection closed: its counts stay in the server's."""
        self._connections.discard(conn)
        for part in conn._stat_parts:
            self._totals.merge(part, gauges=False)

    # -- metrics -----------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """What this server and its connections have done, as plain data.

        As :meth:`aiordma.Connection.stats`, summed over every connection it
        accepted (open or closed), plus the server's own counters:
        ``connections_accepted``, ``connections_rejected`` (by ``accept``),
        ``auth_refused`` and ``auth_failed`` (see ``auth=``), ``setup_failed``;
        and the ``connections`` gauge (open now).
        """
        snapshot = self._merged().snapshot()
        snapshot["addresses"] = self.addresses
        return snapshot

    def _merged(self) -> Stats:
        parts = [part for conn in list(self._connections) for part in conn._stat_parts]
        return merged("server", [self._totals, *parts])

    def _metric_sources(self) -> Iterator[tuple[dict[str, str], Stats]]:
        """For exporters: this server's figures, summed over its connections."""
        where = ",".join("{}:{}".format(*address) for address in self._addresses)
        yield {"server": where}, self._merged()

    async def _run_callback(self, conn: Connection) -> None:
        try:
            result = self._callback(conn)
            if inspect.isawaitable(result):
                await result
        except (ResourceClosedError, ConnectionError) as exc:
            log.debug("handler of %r ended: %r", conn, exc)
        except RdmaError as exc:  # the peer's fault (a failed transfer, a protocol breach)
            log.warning("connection from %s:%d ended: %s", *conn.peer_address, exc)
        except Exception:
            log.exception("connection handler failed for %r", conn)
        finally:
            await conn.close()

    # -- lifecycle ---------------------------------------------------------

    def _check_loop(self, what: str) -> None:
        """WrongLoopError unless called from the server's loop, and while it is open."""
        if self._loop.is_closed():
            raise WrongLoopError(
                f"{self!r} belongs to an event loop that has closed (an earlier "
                "asyncio.run()): make servers and connections in the loop that uses them"
            )
        check_thread(self._loop, what)
        check_loop(self._loop)

    def close(self) -> None:
        """Stop listening (idempotent). Accepted connections stay open."""
        if self._listeners or not self._stopped.done():
            self._check_loop("Server.close()")
        listeners, self._listeners = self._listeners, []
        for cm_id in listeners:
            cm_id.destroy()
        if self._settings.device is not None:
            self._settings.device._unwatch(self)
        if not self._stopped.done():
            self._stopped.set_result(None)

    def close_clients(self) -> None:
        """Start closing every connection this server accepted (and any still being accepted).

        Handlers see their connection's operations fail and normally return
        at once; one still running ``shutdown_grace`` seconds (see
        :func:`start_server`) after its connection closed is cancelled, so
        :meth:`wait_closed` always finishes.
        """
        self._check_loop("Server.close_clients()")
        self._clients_closing = True
        for conn in list(self._connections):
            conn.close()
        if self._reaper is None:
            self._reaper = self._loop.create_task(self._reap_handlers())
            self._tasks.add(self._reaper)
            self._reaper.add_done_callback(self._tasks.discard)

    async def _reap_handlers(self) -> None:
        """Cancel the handlers still running ``shutdown_grace`` seconds after their
        connections closed (a handler awaiting a queue or an event, say)."""
        while self._connections or self._handlers:
            await asyncio.gather(
                *(c.wait_closed() for c in list(self._connections)), return_exceptions=True
            )
            handlers = list(self._handlers)
            if not handlers:
                continue
            _, late = await asyncio.wait(handlers, timeout=self._settings.shutdown_grace)
            for task in late:
                log.info("cancelling a connection handler still running %.1f s after "
                         "close_clients()", self._settings.shutdown_grace)  # fmt: skip
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)

    async def wait_closed(self) -> None:
        """Wait until the server stopped listening, its connections are closed and
        their handlers have returned."""
        self._check_loop("Server.wait_closed()")
        await asyncio.shield(self._stopped)
        while self._connections or self._tasks or self._handlers:
            await asyncio.gather(
                *(c.wait_closed() for c in list(self._connections)),
                *(asyncio.shield(t) for t in list(self._tasks | self._handlers)),
                return_exceptions=True,
            )

    async def serve_forever(self) -> None:
        """Serve until closed or cancelled (cancelling closes the server).

        Raises the error that stopped the server, if one did, and
        ``RuntimeError`` if it was closed already or another task awaits it
        already (as asyncio's servers do).
        """
        self._check_loop("Server.serve_forever()")
        if self._error is not None:
            raise self._error
        if self.is_closing():
            raise RuntimeError(f"{self!r} is closed")
        if self._serving_forever:
            raise RuntimeError(f"{self!r} is already awaited in serve_forever()")
        self._serving_forever = True
        try:
            await asyncio.shield(self._stopped)
        except asyncio.CancelledError:
            self.close()
            raise
        finally:
            self._serving_forever = False
        if self._error is not None:
            raise self._error

    def _device_removed(self, device: Device | None) -> None:
        if self._error is not None:
            return
        name = device.name if device is not None else "of the listening address"
        self._error = DeviceError(errno.ENODEV, f"server stopped: RDMA device {name} was removed")
        self.close()
        self.close_clients()

    async def aclose(self) -> None:
        """Stop listening, close every connection, and wait until all is released."""
        self.close()
        self.close_clients()
        await self.wait_closed()


async def start_server(
    client_connected_cb: ClientConnected, host: str | None = None, port: int = 0, *,
    prepare: Prepare | None = None, **settings: Unpack[ServeKeywords],
) -> Server:  # fmt: skip
    """Listen for rdma_cm connections, like :func:`asyncio.start_server`.

    ``settings`` are :class:`~aiordma.ServeOptions`' fields (``accept``,
    ``backlog``, ``handshake_timeout``, ``shutdown_grace``, and ``device``,
    ``options``, ``auth``, ``shared_receive`` for every connection),
    checked before anything listens.

    ``client_connected_cb(conn)`` runs as its own task for each established
    :class:`Connection` (it may be a coroutine function); the connection is
    closed when it returns. ``accept(request)`` decides per
    :class:`ConnectionRequest`: return private data (at most 196 bytes) or
    ``None`` to accept, raise :class:`RejectConnection` to reject. ``prepare``
    runs before the client can send (post receives there).
    ``handshake_timeout`` bounds how long an accepted client has to confirm
    the connection (and, with ``auth``, to prove its key; None: no bound);
    a confirmation the kernel holds when it expires, while this loop was
    busy with other clients, still counts. ``host=None``
    listens on every address of both families; ``port=0`` picks a free port,
    see :attr:`Server.addresses`. After ``close_clients()``, a handler still
    running ``shutdown_grace`` seconds after its connection closed is
    cancelled (5 s by default).

    With ``auth`` (a :class:`~aiordma.PresharedKey`, or its bytes) only
    clients that prove they hold the same key are served: the server proves
    it too, and until the client's proof checks it gets no message, no rkey
    and no ``prepare`` or callback runs for it (see the security guide).
    Clients that fail are refused and logged; ``accept`` then sees only the
    client's own private data, and may answer with at most 143 bytes.

    With ``shared_receive`` (a :class:`~aiordma.SharedReceiveQueue`) every
    client's queue pair receives from that one pool, on its device; message
    channels made in ``prepare`` draw their receive buffers from it (see
    :func:`aiordma.start_channel_server`). A client arriving when the pool
    has no room for another channel is refused.

    Raises ``ValueError``/``TypeError`` for a port outside 0-65535 or a bad
    setting, and ``OSError`` (``EADDRNOTAVAIL``) when ``host`` is an address
    of no RDMA device (such as ``127.0.0.1``), naming the addresses that are.
    """
    if not callable(client_connected_cb):
        raise TypeError(
            f"client_connected_cb must be callable (a coroutine function taking the "
            f"connection), not {client_connected_cb!r}"
        )
    return await start_server_with(
        client_connected_cb, host, port, ServeOptions.of(settings, "aiordma.start_server"), prepare
    )


async def start_server_with(
    client_connected_cb: ClientConnected, host: str | None, port: int, settings: ServeOptions,
    prepare: Prepare | None = None,
) -> Server:  # fmt: skip
    """:func:`start_server` with its settings made already (what the layers
    above call, passing the value they built once)."""
    check_type("settings", settings, ServeOptions, "an aiordma.ServeOptions")
    if host is not None and not isinstance(host, str):
        raise TypeError(f"host must be a str or None (every address), not {type(host).__name__}")
    check_port(port, listening=True)
    server = Server(client_connected_cb, settings, prepare)
    addr = "::" if host is None else (await resolve_address(host, port))[0]
    server._listen(addr, port, settings.backlog)
    if settings.device is not None:
        settings.device._watch(server)
    metrics.watch(server)
    return server


def _is_wildcard(host: str) -> bool:
    return host.split("%")[0] in ("0.0.0.0", "::")


__all__ = ["ConnectionRequest", "Server", "start_server", "start_server_with"]


def __getattr__(name: str) -> object:
    if name == "serve_with":  # its name before 0.1 (one rule now: X and X_with)
        import warnings

        warnings.warn("aiordma.cm.server.serve_with is now start_server_with",
                      DeprecationWarning, stacklevel=2)  # fmt: skip
        return start_server_with
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
