"""The serving side: named async handlers, each call started at once and
given a task of its own only if it suspends."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar, overload

from aiordma._checks import check_int
from aiordma.channel import (
    Connection,
    MessageChannel,
    Prepare,
    ServeOptions,
    Server,
    ServeTuningKeywords,
    channel_of,
    give_back_memory,
    split_keywords,
    start_channel_server_with,
)
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
from aiordma.rpc._calls import Calls
from aiordma.rpc.codecs import Codec, RawCodec, as_codec
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

SERVICE_ARGUMENTS = {
    name: f"an argument of rpc.Service: pass rpc.Service({name}=...) as the service"
    for name in ("codec", "max_concurrency", "max_held")
}
"""What :func:`start_server` says of its :class:`Service`'s arguments given to it."""
SERVICE_ONLY = {
    name: f"an argument of the server's rpc.Service({name}=...), not a client's setting"
    for name in ("max_concurrency", "max_held")
}
"""What :func:`~aiordma.rpc.connect` says of them."""
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
    :class:`~aiordma.rpc.RemoteError`; a large result (registered memory
    or any bytes-like object above the channel's ``medium_limit``) is read
    by the caller straight from it.
    """

    def __init__(
        self,
        *,
        codec: Codec | None = None,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        max_held: int = DEFAULT_MAX_HELD,
    ) -> None:
        self.codec: Codec = as_codec(codec)
        check_int("max_concurrency", max_concurrency, 1)
        check_int("max_held", max_held, 1)
        self.max_concurrency = max_concurrency
        """Calls run at once per connection; further requests wait (and so does
        their sender). Both limits are read when a connection starts."""
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
        calls = Calls(channel, self._run, self.max_concurrency, self.max_held)
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

    async def _run(self, calls: Calls, frame: Frame, body: bytes | bytearray) -> None:
        channel, stats, codec = calls.channel, calls.stats, self.codec
        raw = type(codec) is RawCodec  # bytes pass it both ways: its calls skipped
        _serving.set(channel)  # this call's own context (a task's, or start_eagerly's copy)
        handler = self._handlers.get(frame.method)
        head = Frame(FrameKind.REPLY, frame.call_id).pack()
        start = time.perf_counter()
        try:
            if handler is None:
                raise _Unknown(f"no method named {frame.method!r}")
            if raw:
                argument: Any = body
            else:
                try:
                    argument = codec.decode(body)
                except Exception as exc:
                    raise _Undecodable(
                        f"the service's codec ({type(codec).__name__}) could not decode the "
                        f"request ({type(exc).__name__}: {exc}): do the client and the "
                        "service use the same codec?"
                    ) from exc
            result = await handler(argument)
            if not raw or type(result) is not bytes:
                result = codec.encode(result)
            if result is not body:
                calls.hold_result(frame.call_id, _size(result))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            stats.add("requests_failed")
            name = "UnknownMethodError" if isinstance(exc, _Unknown) else type(exc).__qualname__
            if isinstance(exc, _Undecodable):
                name = type(exc.__cause__).__qualname__
            if not isinstance(exc, _Unknown):
                log.debug("%s raised %r", frame.method, exc)
            head = Frame(FrameKind.ERROR, frame.call_id).pack()
            result = error_body(name, str(exc))
        finally:
            calls.handled(start)
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


class _Undecodable(Exception):
    """A request the service's codec could not decode (its cause says why)."""


def _size(result: object) -> int:
    """Bytes a result holds (0 for what is not a buffer: the send will refuse it)."""
    try:
        return memoryview(result).nbytes  # type: ignore[arg-type]
    except TypeError:
        return 0


async def start_server(
    service: Service, host: str | None = None, port: int = 0, *,
    prepare: Prepare | None = None, **keywords: Unpack[ServeTuningKeywords],
) -> Server:  # fmt: skip
    """Serve ``service`` on ``host``/``port``, like :func:`aiordma.start_server`.

    ``keywords`` are :func:`aiordma.start_server`'s settings
    (:class:`~aiordma.ServeOptions`: ``auth`` serves only clients that prove
    they hold the same pre-shared key, so unauthenticated peers never reach
    a method; ``accept``, ``handshake_timeout``, ``shared_receive`` (a
    :class:`~aiordma.SharedReceiveQueue` all clients' channels draw on)...)
    and further :class:`~aiordma.MessageChannel` options (``max_exposed``,
    ``exposure_timeout``...), checked before anything listens. ``prepare``
    runs on each connection after its message channel is set up (its
    result is discarded). Close the returned :class:`~aiordma.Server` and
    its clients (``close()``, ``close_clients()``) to stop: calls in flight
    are cancelled and their callers fail at once.
    """
    if not isinstance(service, Service):
        raise TypeError(f"service must be an rpc.Service, not {type(service).__name__}")
    settings, options = split_keywords(
        ServeOptions,
        keywords,
        caller="rpc.start_server",
        protocol=PROTOCOL,
        elsewhere=SERVICE_ARGUMENTS,
    )
    return await start_channel_server_with(service.serve, host, port, settings, options, prepare)
