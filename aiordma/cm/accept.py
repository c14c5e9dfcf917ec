"""The passive side's set-up: a connection request to an established connection.

The mirror of :mod:`aiordma.cm.connect`, for :class:`~aiordma.Server`:
``accept`` (the server's callback) decides from the client's address and
private data, a queue pair is created and brought to RTS with rdma_cm's
attributes, ``prepare`` may post receives (after the client's proof, with
``auth``), and only then is the request accepted; the connection is
returned once the client confirms it. The server only adopts it.

Call order: ``CONNECT_REQUEST -> [auth: start] -> decide -> QP to RTS ->
[prepare] -> rdma_accept -> ESTABLISHED -> [auth: verify -> prepare ->
verdict] -> active``; refused or failed, the client learns why (a reject
with a reason where it can) and nothing is left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Callable

from aiordma.cm import _rdmacm, _setup
from aiordma.cm._events import CMId
from aiordma.cm._rdmacm import Event, EventType
from aiordma.cm.auth import (
    ACCEPT_SIZE,
    MESSAGE_BUFFER,
    VERDICT,
    Binding,
    PresharedKey,
    Refused,
    ServerHandshake,
    explain,
    failure,
    refusal,
)
from aiordma.cm.connection import Connection, Prepare
from aiordma.cm.options import ConnectionRequest, ServeOptions
from aiordma.exceptions import (
    AuthenticationError,
    ConnectionLostError,
    ConnectionRejectedError,
    RdmaError,
)
from aiordma.verbs.device import Device
from aiordma.verbs.memory import MemoryRegion
from aiordma.verbs.queue_pair import QueuePair

log = logging.getLogger("aiordma.cm.server")  # set-up lines are the server's, for users' filters

Count = Callable[[str], None]
"""Adds one to the server's counter of that name."""

_DEADLINE_CHECK = 0.5
"""Seconds before the set-up deadline at which the kernel's queued events are
read; the deadline then moves to this long after, for their delivery."""


class RejectConnection(RdmaError):
    """Raise from a server's ``accept`` callback to turn a request down.

    ``private_data`` (at most 148 bytes) reaches the client in
    ``ConnectionRejectedError.private_data``.
    """

    def __init__(self, private_data: bytes = b"") -> None:
        super().__init__(private_data)
        self.private_data = _setup.check_private_data(
            private_data, _rdmacm.MAX_REJECT_DATA, "reject"
        )


async def accept(
    event: Event, child: CMId, settings: ServeOptions, prepare: Prepare | None, count: Count
) -> Connection | None:
    """The connection a CONNECT_REQUEST (``event``, on ``child``) becomes,
    established, proven (with ``settings.key``) and prepared; None when it
    was refused or its set-up failed (logged, and counted through
    ``count(name)``: ``connections_rejected``, ``auth_refused``,
    ``auth_failed``, ``setup_failed``). Cancellation abandons the set-up and
    goes on."""
    qp: QueuePair | None = None
    conn: Connection | None = None
    where = "{}:{}".format(*child.peer_address)
    handshake: ServerHandshake | None = None
    accepted = False
    try:
        data = event.private_data
        if settings.key is not None:
            handshake = _start_handshake(settings.key, child, data, where, count)
            if handshake is None:
                return None
            data = handshake.private_data
        reply = await _decide(child, data, settings, count)
        if reply is None:
            child.destroy()
            return None
        name = child.device_name
        shared = settings.shared_receive
        device = settings.device or (shared.device if shared else Device.shared(name or ""))
        qp = _setup.create_qp_for(child, device, settings.options, shared)
        _setup.move_to_rts(qp, child)
        conn = Connection(child, qp, data)
        if handshake is None:
            await _setup.run_prepare(prepare, conn)
        else:
            scratch = conn.alloc(MESSAGE_BUFFER)
            arrival = await _setup.post_handshake_receive(qp, scratch[:])
            binding = Binding(event.qp_num, qp.qp_num, child.peer_address,
                              child.local_address)  # fmt: skip
            reply = handshake.accept(reply, binding)
        _rdmacm.accept(child.id, private_data=reply, **_setup.conn_params(qp))
        accepted = True
        try:
            async with asyncio.timeout(settings.handshake_timeout) as deadline:
                await _established(child, conn, where, deadline)
                if handshake is not None:
                    await _verify(prepare, handshake, conn, child, scratch, arrival, where)
        except TimeoutError as exc:
            if handshake is not None:
                raise TimeoutError(
                    f"{where} did not prove the key within {settings.handshake_timeout} s"
                ) from exc
            # A client that gave up sends a reject the server may never get
            # (a lost datagram): from here it is one that went silent.
            raise ConnectionLostError(
                f"{where} did not confirm the connection within {settings.handshake_timeout} s"
            ) from exc
        conn._activate()
    except BaseException as exc:
        if not accepted and isinstance(exc, RdmaError | MemoryError) and child.ptr is not None:
            with contextlib.suppress(OSError):  # the client may be gone already
                child.reject(_setup.setup_refusal(exc))  # it learns why, not just "rejected"
        _setup.abandon_setup(child, qp, conn)
        if isinstance(exc, Exception):
            count("auth_failed" if isinstance(exc, AuthenticationError) else "setup_failed")
            if isinstance(exc, ConnectionLostError):  # the client gave up or left: its business
                log.info("connection from %s ended during setup: %s", where, exc)
            else:
                log.warning("connection from %s failed during setup: %r", where, exc)
            return None
        raise
    return conn


async def _decide(
    child: CMId, private_data: bytes, settings: ServeOptions, count: Count
) -> bytes | None:
    """Private data to accept with, or None when the request was rejected."""
    if settings.accept is None:
        return b""
    request = ConnectionRequest(child.peer_address, child.local_address, private_data)
    limit = _rdmacm.MAX_ACCEPT_DATA - (ACCEPT_SIZE if settings.key is not None else 0)
    try:
        reply = settings.accept(request)
        if inspect.isawaitable(reply):
            reply = await reply
        return _setup.check_private_data(reply or b"", limit, "accept")
    except RejectConnection as rejection:
        count("connections_rejected")
        child.reject(_setup.rejection(rejection.private_data))
    except Exception as exc:
        log.exception("accept callback failed; request from %s rejected", request.peer_address)
        child.reject(_setup.accept_refusal(exc))
    return None


async def _established(
    child: CMId, conn: Connection, where: str, deadline: asyncio.Timeout
) -> None:
    """Wait for ``child``'s ESTABLISHED event, unless ``conn`` closes first.

    A connection can close before it is established: the ``prepare``
    hook's receives may take the client's first packets, and a message
    channel closes a connection whose packet breaks the protocol. Its
    cm_id is then gone and no event will come, so stop waiting at once.

    ``deadline`` bounds the client's delay, not ours: once it is near, the
    events the kernel already holds are read, so a client that confirmed
    in time while this loop was busy with other clients is not dropped.
    """
    loop = asyncio.get_running_loop()

    def check() -> None:  # a callback, so it runs before the deadline's own
        child.channel.read_pending()
        deadline.reschedule(loop.time() + _DEADLINE_CHECK)

    when = deadline.when()
    checking = None if when is None else loop.call_at(when - _DEADLINE_CHECK, check)
    established = asyncio.ensure_future(_setup.expect(child, EventType.ESTABLISHED, where))
    closed = asyncio.ensure_future(conn.wait_closed())
    try:
        await asyncio.wait((established, closed), return_when=asyncio.FIRST_COMPLETED)
    finally:
        if checking is not None:
            checking.cancel()
        established.cancel()
        closed.cancel()
    if closed.done() and not closed.cancelled():
        raise ConnectionLostError(f"the connection from {where} closed during set-up")
    try:
        established.result()
    except AuthenticationError:
        raise
    except ConnectionRejectedError as exc:  # the client's connect was cancelled or timed out
        raise ConnectionLostError(
            f"{where} gave the connection up during set-up (it rejected the accept)"
        ) from exc


def _start_handshake(
    key: PresharedKey, child: CMId, data: bytes, where: str, count: Count
) -> ServerHandshake | None:
    """The handshake a request starts; None when it started none (it is then rejected)."""
    try:
        return ServerHandshake(key, data)
    except Refused as refused:
        count("auth_refused")
        log.warning("connection from %s refused: %s", where, explain(refused.reason))
        child.reject(refusal(refused.reason))
        child.destroy()
        return None


async def _verify(
    prepare: Prepare | None, handshake: ServerHandshake, conn: Connection, child: CMId,
    scratch: MemoryRegion, arrival: asyncio.Future[bytes], where: str,
) -> None:  # fmt: skip
    """Check the client's proof, then prepare the connection and tell the client.

    Until the proof checks the client has been sent nothing but our own
    proof: no message, no rkey, and no ``prepare`` has run for it.
    """
    proof = await _setup.handshake_message(child, arrival)
    if proof is None:
        raise ConnectionLostError(f"{where} left during authentication")
    try:
        handshake.check_proof(proof)
    except Refused as refused:
        raise failure(where, refused.reason) from None
    await _setup.run_prepare(prepare, conn)
    scratch.view()[: len(VERDICT)] = VERDICT
    await conn.qp.post_send(scratch[: len(VERDICT)])
    scratch.close()
