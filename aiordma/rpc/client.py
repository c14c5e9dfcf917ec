"""The calling side: many calls in flight on one connection, matched by id."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from aiordma.channel import (
    Connection,
    ConnectOptions,
    Into,
    MessageChannel,
    OpenTuningKeywords,
    Prepare,
    buffer_length,
    buffer_view,
    channel_of,
    check_into,
    open_channel_with,
    split_keywords,
)
from aiordma.exceptions import (
    BufferTooSmallError,
    MessageRevokedError,
    ProtocolError,
    ProtocolMismatchError,
    ResourceClosedError,
    again,
)
from aiordma.lifecycle import Closable, check_loop, check_thread
from aiordma.metrics import Stats
from aiordma.rpc._pending import Call, Pending
from aiordma.rpc.codecs import Codec, RawCodec, as_codec
from aiordma.rpc.errors import RemoteError, UnknownMethodError
from aiordma.rpc.frames import PROTOCOL, Frame, FrameKind, parse_error_body
from aiordma.rpc.server import SERVICE_ONLY

if TYPE_CHECKING:
    from typing_extensions import Unpack

log = logging.getLogger(__name__)


class Client(Closable):
    """Calls remote methods over one message channel (see :func:`connect`).

    ``channel`` is the :class:`~aiordma.MessageChannel` the calls travel on
    (a :class:`~aiordma.Connection` whose ``prepared`` is one is taken too).
    Any number of calls may be in flight; replies complete them in whatever
    order they arrive. Closing the client, or losing the connection, fails
    every outstanding call at once.
    """

    def __init__(self, channel: MessageChannel | Connection, *, codec: Codec | None = None) -> None:
        channel = channel_of(channel)
        self.channel = channel
        """The message channel the calls travel on."""
        self._stats = Stats("rpc_client")
        channel.link.add_stats(self._stats)
        self._channel: MessageChannel = channel
        self._codec: Codec = as_codec(codec)
        self._raw = type(self._codec) is RawCodec  # bytes pass it both ways: its calls skipped
        self._error: BaseException | None = None
        self._error_tb: TracebackType | None = None
        self._loop = asyncio.get_running_loop()
        self._pending = Pending(self._loop, self._stats)
        self._reader = self._loop.create_task(self._read_replies())
        self._background: set[asyncio.Task[None]] = set()
        self._channel.deliver_to(self._on_reply)

    def __repr__(self) -> str:
        return f"<rpc.Client {self._channel.link!r} pending={len(self._pending)}>"

    @property
    def conn(self) -> Connection:
        """The connection the calls travel on: one-sided work beside RPC
        (``client.conn.rdma_write(...)``) runs on its queue pair (TypeError
        if the channel runs on another kind of link)."""
        return self._channel.conn

    async def call(
        self,
        method: str,
        payload: Any = None,
        *,
        timeout: float | None = None,  # noqa: ASYNC109  (per call, as the issue asks)
        into: Into | None = None,
    ) -> Any:
        """Call ``method`` with ``payload`` and return its decoded result.

        With ``into``, the result's bytes land in that buffer (by RDMA read,
        with no copy, when large) and the call returns their count; a
        cancelled or timed-out call may still write into ``into`` until the
        read under way, if any, completes. Raises :class:`RemoteError` if the
        handler raised (or its result could not be sent, such as one larger
        than ``max_message``), :class:`UnknownMethodError` if there is no
        such method, ``TimeoutError`` naming the method after ``timeout``
        seconds (a late reply is then discarded; a ``timeout`` of 0 or less
        has expired already, as for :func:`asyncio.timeout`, and nothing is
        sent), and ``ValueError`` or
        ``TypeError``, before sending anything, for an empty or too long
        method name or an ``into`` nothing can land in. Cancelling a call
        leaves the other calls alone and asks the server to cancel its handler.
        """
        check_loop(self._loop)  # before the error: a closed loop's client was closed by it
        if self._error is not None:
            raise again(self._error, self._error_tb)  # not grown by each raise
        if type(method) is not str and not isinstance(method, str):
            raise TypeError(f"method must be a str, not {type(method).__name__}")
        if not method:
            raise ValueError("method must be a non-empty str")
        if timeout is not None:
            if not isinstance(timeout, int | float) or isinstance(timeout, bool):
                raise TypeError(f"timeout must be a number of seconds, not {timeout!r}")
            if timeout != timeout:
                raise ValueError("timeout must be a number of seconds, not NaN")
        if into is not None:
            check_into(into)
        if timeout is not None and timeout <= 0:  # expired already, as for asyncio.timeout()
            raise TimeoutError(
                f"call {method!r} was not sent: its timeout ({timeout} s) had expired"
            )
        body = payload if self._raw and type(payload) is bytes else self._codec.encode(payload)
        call_id, head, call = self._pending.start(method, into)
        fut = call.future
        try:
            if timeout is None:  # no asyncio.timeout: it costs two getpid calls on 3.11
                await self._channel.send_message(body, head=head)
                return await fut
            try:
                async with asyncio.timeout(timeout):
                    await self._channel.send_message(body, head=head)
                    return await fut
            except TimeoutError as exc:
                if exc.args:  # not asyncio.timeout's own
                    raise
                raise TimeoutError(f"call {method!r} got no reply within {timeout} s") from None
        except BaseException:
            if self._pending.drop(call_id):
                if self._error is None:
                    self._spawn(self._send_cancel(call_id))
            elif fut.done() and not fut.cancelled():
                # The reader failed it (the connection ended) while the request
                # was being sent: what this raises says so; no unretrieved report.
                fut.exception()
            self._stats.add("calls_failed")
            raise

    def stats(self) -> dict[str, Any]:
        """The connection's metrics (:meth:`aiordma.Connection.stats`), which
        include this client's: ``calls``, ``calls_failed`` and the ``call``
        latency histogram (from sending to the reply)."""
        return self.conn.stats()

    async def _send_cancel(self, call_id: int) -> None:
        try:
            await self._channel.send_message(b"", head=Frame(FrameKind.CANCEL, call_id).pack())
        except Exception as exc:
            log.debug("could not cancel call %d: %r", call_id, exc)

    def _choose(self, head: bytes, length: int) -> Into | None:
        frame = Frame.unpack(head)
        return self._into(frame, self._pending.get(frame.call_id), length)

    @staticmethod
    def _into(frame: Frame, call: Call | None, length: int) -> Into | None:
        """Where a reply of ``length`` bytes lands: the caller's ``into=``, or None
        for a new object (with ``call.error`` set if ``into`` is too small)."""
        if call is None or call.into is None or frame.kind != FrameKind.REPLY:
            return None
        if buffer_length(call.into) < length:
            call.error = BufferTooSmallError(length, buffer_length(call.into))
            return None
        return call.into

    def _on_reply(self, head: bytes, body: memoryview) -> bool:
        """A small reply, straight from the receive buffer (see MessageChannel.deliver_to)."""
        frame, call = self._pending.take(head)
        if call is None:
            return True  # the caller gave up: a late reply
        into = None if call.into is None else self._into(frame, call, len(body))
        if into is None:
            self._complete(call, frame.kind, bytes(body))
        else:
            with buffer_view(into) as target:
                target[: len(body)] = body
            self._complete(call, frame.kind, len(body))
        return True

    def _mismatch(self, exc: ProtocolError) -> ProtocolError:
        """``exc``, or the mismatch it shows: a plain channel server (which
        accepts any peer) answering with what is not an RPC frame."""
        theirs = self._channel.peer_protocol
        if isinstance(exc, ProtocolMismatchError) or theirs is None or theirs == PROTOCOL:
            return exc
        peer = "{}:{}".format(*self._channel.conn.peer_address)
        mismatch = ProtocolMismatchError(PROTOCOL, theirs, peer)
        mismatch.__cause__ = exc
        return mismatch

    async def _read_replies(self) -> None:
        """Replies the delivery hook leaves queued: large ones, read by RDMA."""
        try:
            while True:
                try:
                    head, body = await self._channel.recv_message_with_head(self._choose)
                except MessageRevokedError as revoked:  # that reply alone is lost
                    _, call = self._pending.take(revoked.head)
                    if call is not None:
                        call.future.set_exception(revoked)
                    continue
                frame, call = self._pending.take(head)
                if call is None:
                    continue  # the caller gave up: a late reply
                self._complete(call, frame.kind, body)
        except ProtocolError as exc:
            error = self._mismatch(exc)
            log.warning("closing %r: %s", self._channel.link, error)
            self._channel.close()
            self._fail(error)
        except BaseException as exc:
            self._fail(exc)

    def _complete(self, call: Call, kind: FrameKind, body: bytes | bytearray | int) -> None:
        if call.error is not None:
            call.future.set_exception(call.error)
        elif kind == FrameKind.ERROR:
            assert not isinstance(body, int)
            remote_type, message = parse_error_body(body)
            cls = UnknownMethodError if remote_type == "UnknownMethodError" else RemoteError
            call.future.set_exception(cls(call.method, remote_type, message))
        elif isinstance(body, int):
            call.future.set_result(body)
        else:
            try:
                call.future.set_result(body if self._raw else self._codec.decode(body))
            except Exception as exc:
                exc.add_note(
                    f"the client's codec ({type(self._codec).__name__}) could not decode the "
                    f"reply to {call.method!r}: do the client and the service use the same codec?"
                )
                call.future.set_exception(exc)

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = (
                exc if isinstance(exc, Exception) else ResourceClosedError("RPC client closed")
            )
            self._error_tb = self._error.__traceback__
        for call in self._pending.clear():
            if not call.future.done():
                call.future.set_exception(again(self._error, self._error_tb))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- lifecycle ---------------------------------------------------------

    def close(self) -> Awaitable[None]:
        """Close the connection (idempotent); outstanding calls fail with ResourceClosedError.

        As for :meth:`aiordma.Connection.close`, both ``client.close()``
        followed by ``await client.wait_closed()`` and ``await client.close()``
        work.
        """
        check_thread(self._loop, "rpc.Client.close()")
        self._fail(ResourceClosedError("RPC client closed"))
        closing = self._channel.close()
        if self._loop.is_closed():  # nothing runs there any more: what the connection returned
            return closing
        return self._loop.create_task(self.wait_closed())

    def is_closing(self) -> bool:
        """True once the client (or its connection) is closing or closed."""
        return self._error is not None or self._channel.is_closing()

    async def aclose(self) -> None:
        """Close, and wait until the connection is closed and the reader stopped."""
        await self.close()

    async def wait_closed(self) -> None:
        """Wait until the connection is closed and the reply reader has stopped."""
        await self._channel.wait_closed()
        if not self._reader.done():
            self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)


async def connect(
    host: str, port: int, *, codec: Codec | None = None, prepare: Prepare | None = None,
    **keywords: Unpack[OpenTuningKeywords],
) -> Client:  # fmt: skip
    """Connect to an RPC server (see :func:`aiordma.rpc.start_server`).

    ``keywords`` are :func:`aiordma.connect`'s settings
    (:class:`~aiordma.ConnectOptions`: ``auth`` authenticates both peers
    with a pre-shared key, ``private_data`` (at most 56 bytes, 35 with
    ``auth``) reaches the server's ``accept``, ``timeout``, ``device``...)
    and further :class:`~aiordma.MessageChannel` options (``max_exposed``,
    ``exposure_timeout``...; see :func:`aiordma.open_channel`), checked
    before anything connects.
    ``prepare`` runs on the connection after its message channel is set up
    (its result is discarded).
    """
    codec = as_codec(codec)
    settings, options = split_keywords(
        ConnectOptions, keywords, caller="rpc.connect", protocol=PROTOCOL, elsewhere=SERVICE_ONLY
    )
    channel = await open_channel_with(host, port, settings, options, prepare)
    return Client(channel, codec=codec)
