"""The serving side: named async handlers, each call started at once and
given a task of its own only if it suspends."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar, overload

from aiordma import metrics
from aiordma.channel import (
    Accept,
    Connection,
    Device,
    MessageChannel,
    OpenKeywords,
    Prepare,
    PresharedKey,
    QueuePairOptions,
    Server,
    channel_of,
    start_channel_server,
)
from aiordma.channel.buffers import GIVE_BACK_AFTER, give_back_memory
from aiordma.exceptions import (
    CompletionError,
    MessageRevokedError,
    MessageTooLargeError,
    ProtocolError,
    QueuePairError,
    RdmaError,
    ResourceClosedError,
)
from aiordma.lifecycle import is_async_callable
from aiordma.metrics import Stats
from aiordma.rpc._eager import start_eagerly
from aiordma.rpc.codecs import Codec, RawCodec
from aiordma.rpc.frames import PROTOCOL, Frame, FrameKind, error_body

if TYPE_CHECKING:
    from typing_extensions import Unpack

log = logging.getLogger(__name__)

Handler = Callable[[Any], Awaitable[Any]]
"""An RPC method: ``async def handler(payload) -> result``, payload and result
as the service's codec decodes and encodes them."""
H = TypeVar("H", bound=Handler)

DEFAULT_MAX_CONCURRENCY = 256
DEFAULT_MAX_HELD = 64 << 20
"""Bytes of requests and results one connection's calls hold at once, by default."""


_serving: contextvars.ContextVar[MessageChannel] = contextvars.ContextVar("aiordma.rpc.serving")


def current_connection() -> Connection:
    """The :class:`~aiordma.Connection` whose call the running handler serves.

    For per-client state (keyed by the connection, or by its
    ``peer_address``), one-sided work on the caller's queue pair beside
    RPC (``current_connection().rdma_read(...)``), or binding a memory
    window for it. Raises ``LookupError`` outside a handler.
    """
    try:
        channel = _serving.get()
    except LookupError:
        raise LookupError("rpc.current_connection() is called from outside a handler") from None
    return channel.conn


class Service:
    """A set of named async handlers: ``async def handler(payload) -> result``.

    Register with :meth:`method` (a decorator) or :meth:`add`, then serve
    with :func:`start_server`. A handler's exception reaches the caller as
    :class:`~aiordma.rpc.RemoteError`; a result that is registered memory
    (or any large bytes-like object) is read by the caller straight from
    it.
    """

    def __init__(
        self,
        *,
        codec: Codec | None = None,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        max_held: int = DEFAULT_MAX_HELD,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        if max_held < 1:
            raise ValueError(f"max_held must be at least 1 byte, not {max_held}")
        self.codec: Codec = codec or RawCodec()
        self.max_concurrency = max_concurrency
        """Calls run at once per connection; further requests wait (and so does their sender)."""
        self.max_held = max_held
        """Bytes the calls of one connection may hold before the next request
        is read: a call holds its request until it returns and its result
        until the client has it (or can no longer read it: a result left
        unread past ``exposure_timeout`` counts until the client answers its
        revocation, or ``exposure_timeout`` more). A request that would take
        the total past this waits unread (and so does its sender) until calls
        end, unless nothing is held (a larger request runs alone). Results
        made after their request was admitted come on top: a connection's
        calls hold at most ``max_held`` of requests, plus their results."""
        self._handlers: dict[str, Handler] = {}

    def add(self, name: str, handler: Handler) -> None:
        """Serve ``handler`` (an ``async def`` function) as ``name``."""
        if not isinstance(name, str):
            raise TypeError(f"a method name must be a str, not {type(name).__name__}")
        if not name or len(name.encode()) > 255:
            raise ValueError("a method name needs 1 to 255 bytes of UTF-8")
        if not callable(handler):
            raise TypeError(f"the handler of {name!r} must be callable, not {handler!r}")
        if not is_async_callable(handler):
            raise TypeError(
                f"the handler of {name!r} must be an async function "
                f"(async def {getattr(handler, '__name__', name)}(payload): ...)"
            )
        if name in self._handlers:
            raise ValueError(f"method {name!r} is already registered")
        self._handlers[name] = handler

    @overload
    def method(self, name: H, /) -> H: ...

    @overload
    def method(self, name: str | None = None) -> Callable[[H], H]: ...

    def method(self, name: str | H | None = None) -> H | Callable[[H], H]:
        """Decorator form of :meth:`add`, with or without parentheses; the
        name defaults to the function's."""
        if callable(name):  # @service.method, without parentheses
            self.add(name.__name__, name)
            return name
        if name is not None and not isinstance(name, str):
            raise TypeError(f"a method name must be a str, not {type(name).__name__}")

        def register(handler: H) -> H:
            self.add(name or handler.__name__, handler)
            return handler

        return register

    @property
    def methods(self) -> list[str]:
        """The names served, sorted."""
        return sorted(self._handlers)

    async def handle(self, conn: Connection) -> None:
        """:meth:`serve` the channel ``conn`` was prepared with (a callback for
        :func:`aiordma.start_server` with ``prepare=aiordma.prepare_channel``)."""
        await self.serve(channel_of(conn))

    async def serve(self, channel: MessageChannel) -> None:
        """Serve calls arriving on ``channel`` until it closes (a callback for
        :func:`aiordma.start_channel_server`).

        Small requests start their handler straight from the completion
        that delivered them; large ones, and requests beyond
        ``max_concurrency``, wait in the channel's queue for this task.
        """
        link = channel.link
        calls = _Calls(self, channel)
        channel.link.add_stats(calls.stats)
        channel.deliver_to(calls.on_message)
        try:
            while True:
                await channel.wait_message()
                await calls.room(channel.next_length())
                try:
                    head, body = await channel.recv_message_with_head()
                except MessageRevokedError as exc:  # the caller withdrew a large request
                    log.debug("request withdrawn on %r: %s", link, exc)
                    continue
                assert not isinstance(body, int)
                calls.dispatch(Frame.unpack(head), body)
        except ProtocolError as exc:
            log.warning("closing %r: %s", link, exc)
            link.close()
        except (ResourceClosedError, ConnectionError):
            pass
        except (QueuePairError, CompletionError) as exc:  # the connection failed: it is over
            log.warning("closing %r: its queue pair failed: %s", link, exc)
            link.close()
        finally:
            channel.deliver_to(None)
            await calls.cancel_all()
            if calls.held_large:  # their bodies are gone now: their memory goes back
                give_back_memory()

    async def _run(self, calls: _Calls, frame: Frame, body: bytes | bytearray) -> None:
        channel, stats = calls.channel, calls.stats
        _serving.set(channel)  # this call's own context (a task's, or start_eagerly's copy)
        handler = self._handlers.get(frame.method)
        head = Frame(FrameKind.REPLY, frame.call_id).pack()
        timed = metrics.enabled()
        start = time.perf_counter() if timed else 0.0
        try:
            if handler is None:
                raise _Unknown(f"no method named {frame.method!r}")
            result = self.codec.encode(await handler(self.codec.decode(body)))
            if result is not body:
                calls.hold_result(frame.call_id, _size(result))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            stats.add("requests_failed")
            name = "UnknownMethodError" if isinstance(exc, _Unknown) else type(exc).__qualname__
            if not isinstance(exc, _Unknown):
                log.debug("%s raised %r", frame.method, exc)
            head = Frame(FrameKind.ERROR, frame.call_id).pack()
            result = error_body(name, str(exc))
        finally:
            if timed:
                stats.add("requests")
                stats.observe("handler", time.perf_counter() - start)
        calls.sending.add(frame.call_id)
        try:
            # A large result holds its memory until the client read it, or
            # can no longer: the call (and what it counts against max_held)
            # lasts until then.
            await channel.send_message(result, head=head, until_unexposed=True)
        except (MessageTooLargeError, TypeError, ValueError) as exc:
            # The reply itself cannot be sent: tell the caller why instead.
            peer = "{}:{}".format(*channel.conn.peer_address)
            log.warning("reply to %s from %s not sent: %s", frame.method, peer, exc)
            with contextlib.suppress(RdmaError, ConnectionError):
                await channel.send_message(
                    error_body(type(exc).__qualname__, f"the reply could not be sent: {exc}"),
                    head=Frame(FrameKind.ERROR, frame.call_id).pack(),
                )
        except Exception as exc:
            log.debug("reply to call %d not sent: %r", frame.call_id, exc)


class _Unknown(Exception):
    pass


def _size(result: object) -> int:
    """Bytes a result holds (0 for what is not a buffer: the send will refuse it)."""
    try:
        return memoryview(result).nbytes  # type: ignore[arg-type]
    except TypeError:
        return 0


class _Calls:
    """The calls running on one connection: at most ``max_concurrency`` at
    once, holding at most about ``max_held`` bytes."""

    def __init__(self, service: Service, channel: MessageChannel) -> None:
        self._service = service
        self.channel = channel
        self.stats = Stats("rpc_server", self._gauges)
        self._loop = channel.link.qp.loop
        self._running: dict[int, asyncio.Task[None]] = {}
        self._holding: dict[int, tuple[int, int]] = {}
        """Bytes each running call holds: its request, its result."""
        self._requests = 0
        self._results = 0
        self._freed: asyncio.Future[None] | None = None
        self.sending: set[int] = set()
        """Calls whose handler returned, sending their reply."""
        self.held_large = False
        """Whether a request or result of ``GIVE_BACK_AFTER`` bytes or more was held."""

    def _gauges(self) -> dict[str, int]:
        return {
            "requests_held_bytes": self._requests,
            "results_held_bytes": self._results,
            "calls_running": len(self._running),
        }

    def on_message(self, head: bytes, body: memoryview) -> bool:
        frame = Frame.unpack(head)
        if frame.kind == FrameKind.REQUEST and self._full(len(body)):
            return False  # stays queued: its credit comes back only when a call ends
        self.dispatch(frame, bytes(body))
        return True

    def dispatch(self, frame: Frame, body: bytes | bytearray) -> None:
        if frame.kind == FrameKind.REQUEST:
            call_id = frame.call_id
            if len(body) >= GIVE_BACK_AFTER:
                self.held_large = True
            self._holding[call_id] = (len(body), 0)
            self._requests += len(body)
            coro = self._service._run(self, frame, body)
            if self._running:
                # Other calls (or cancellations) are scheduled: queue behind them.
                task: asyncio.Task[None] | None = self._loop.create_task(coro)
            else:
                # Started now, from the receive completion: a handler that
                # does not suspend has replied before this returns, no task.
                task = start_eagerly(self._loop, coro)
            if task is None:
                self._release(call_id)
            else:
                self._running[call_id] = task
                task.add_done_callback(functools.partial(self._finished, call_id))
        elif frame.kind == FrameKind.CANCEL:
            if (victim := self._running.get(frame.call_id)) is not None:
                victim.cancel()
        else:
            raise ProtocolError(f"a client sent a {frame.kind.name} frame")

    def hold_result(self, call_id: int, size: int) -> None:
        """Count a result of ``size`` bytes against the call ``call_id`` until it ends."""
        request, result = self._holding.get(call_id, (0, 0))
        self._holding[call_id] = (request, result + size)
        if size >= GIVE_BACK_AFTER:
            self.held_large = True
        self._results += size

    def _release(self, call_id: int) -> None:
        self.sending.discard(call_id)
        request, result = self._holding.pop(call_id, (0, 0))
        self._requests -= request
        self._results -= result

    def _full(self, size: int) -> bool:
        """Whether a request of ``size`` bytes must wait for a call to end."""
        if len(self._running) >= self._service.max_concurrency:
            return True
        held = self._requests + self._results
        return held > 0 and held + size > self._service.max_held

    async def room(self, size: int | None) -> None:
        """Wait until a request of ``size`` bytes may start (None: a small one)."""
        while self._full(size or 0):
            self._freed = self._loop.create_future()
            await self._freed

    def _finished(self, call_id: int, _: object) -> None:
        self._running.pop(call_id, None)
        self._release(call_id)
        if self._freed is not None and not self._freed.done():
            self._freed.set_result(None)

    async def cancel_all(self) -> None:
        """End every call: handlers are cancelled; a call already sending its
        reply ends by itself once the channel has failed (cancelled there, it
        would keep its reply in the cancellation's reference cycle)."""
        for call_id, task in self._running.items():
            if call_id not in self.sending:
                task.cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)


async def start_server(
    service: Service,
    host: str | None = None,
    port: int = 0,
    *,
    accept: Accept | None = None,
    backlog: int = 128,
    device: Device | None = None,
    options: QueuePairOptions | None = None,
    prepare: Prepare | None = None,
    auth: PresharedKey | bytes | None = None,
    **channel_options: Unpack[OpenKeywords],
) -> Server:
    """Serve ``service`` on ``host``/``port``, like :func:`aiordma.start_server`.

    ``prepare`` runs on each connection after its message channel is set up
    (its result is discarded); ``auth`` serves only clients that prove they
    hold the same pre-shared key, so unauthenticated peers never reach a
    method (see :func:`aiordma.start_server`); ``channel_options`` are further
    :class:`~aiordma.MessageChannel` options (``max_exposed``,
    ``exposure_timeout``...) or ``shared_receive``, a
    :class:`~aiordma.SharedReceiveQueue` all clients' channels draw on.
    Close the returned :class:`~aiordma.Server` and its clients
    (``close()``, ``close_clients()``) to stop: calls in flight are
    cancelled and their callers fail at once.
    """
    if not isinstance(service, Service):
        raise TypeError(f"service must be an rpc.Service, not {type(service).__name__}")
    return await start_channel_server(
        service.serve,
        host,
        port,
        accept=accept,
        backlog=backlog,
        device=device,
        options=options,
        prepare=prepare,
        auth=auth,
        protocol=PROTOCOL,
        **channel_options,
    )
