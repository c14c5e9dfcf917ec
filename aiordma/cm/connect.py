"""The active side: ``connect``, from address resolution to an established connection."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
from typing import TYPE_CHECKING, Final

from aiordma import metrics
from aiordma._checks import check_type
from aiordma.cm import _rdmacm, _setup
from aiordma.cm._events import CMEventChannel, CMId
from aiordma.cm._rdmacm import Event, EventType
from aiordma.cm.auth import (
    MESSAGE_BUFFER,
    VERDICT,
    Binding,
    ClientHandshake,
    Refusal,
    Refused,
    failure,
    refusal,
)
from aiordma.cm.connection import Connection, Prepare
from aiordma.cm.options import ConnectKeywords, ConnectOptions
from aiordma.exceptions import (
    AuthenticationError,
    ConnectionLostError,
    DeviceError,
    RdmaError,
)
from aiordma.verbs.device import Device
from aiordma.verbs.queue_pair import QueuePair

if TYPE_CHECKING:
    from typing_extensions import Unpack

log = logging.getLogger(__name__)


async def connect(
    host: str, port: int, *, prepare: Prepare | None = None,
    **settings: Unpack[ConnectKeywords],
) -> Connection:  # fmt: skip
    """Connect to an aiordma (or any rdma_cm) server, like :func:`asyncio.open_connection`.

    ``settings`` are :class:`~aiordma.ConnectOptions`' fields (``device``,
    ``options``, ``auth``, ``shared_receive``, ``private_data``,
    ``timeout``), checked before anything connects.
    ``prepare(conn)`` runs once the queue pair is ready but before the server
    can send, which is the moment to post receives; its result is kept as
    ``conn.prepared``. ``private_data`` (at most 56 bytes, 35 with ``auth``)
    reaches the server's accept decision.

    With ``auth`` (a :class:`~aiordma.PresharedKey`, or its bytes), the
    server must prove it holds the same key before anything is sent to it,
    and this side proves it in turn before ``connect`` returns (see
    the security guide); failing either way raises
    :class:`~aiordma.AuthenticationError`.

    With ``shared_receive`` (a :class:`~aiordma.SharedReceiveQueue`) the
    queue pair receives from that pool, on its device; a message channel
    made in ``prepare`` then draws its receive buffers from it.

    Raises :class:`~aiordma.NoListenerError` when nothing listens and
    :class:`ConnectionRejectedError` when the server rejects (both are
    ``ConnectionRefusedError``), ``TimeoutError`` when no answer comes within
    ``timeout`` seconds, ``OSError`` when the address or route cannot be
    resolved, and ``ValueError``/``TypeError`` for a port outside 1-65535 or
    a bad setting. Nothing is left behind on failure.
    """
    return await connect_with(host, port, ConnectOptions.of(settings, "aiordma.connect"), prepare)


async def connect_with(
    host: str, port: int, settings: ConnectOptions, prepare: Prepare | None = None
) -> Connection:
    """:func:`connect` with its settings made already (what the layers above
    call, passing the value they built once)."""
    check_type("settings", settings, ConnectOptions, "an aiordma.ConnectOptions")
    _setup.check_host(host)
    _setup.check_port(port, listening=False)
    key = settings.key
    handshake = ClientHandshake(key, settings.private_data) if key is not None else None
    where = f"{host}:{port}"
    timeout = settings.timeout
    try:
        async with asyncio.timeout(timeout):
            deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
            return await _connect(host, port, settings, handshake, prepare, where, deadline)
    except TimeoutError as exc:
        if exc.args:
            raise
        raise TimeoutError(
            errno.ETIMEDOUT, f"connecting to {where} timed out after {timeout} s"
        ) from None


_RESOLVE_MS: Final = 2000


def _ms_left(deadline: float | None) -> int:
    """Milliseconds rdma_cm may spend resolving: 2 s, or what is left of the timeout."""
    if deadline is None:
        return _RESOLVE_MS
    left = deadline - asyncio.get_running_loop().time()
    return max(1, min(_RESOLVE_MS, int(left * 1000)))


async def _connect(
    host: str, port: int, settings: ConnectOptions, handshake: ClientHandshake | None,
    prepare: Prepare | None, where: str, deadline: float | None,
) -> Connection:  # fmt: skip
    dst = await _setup.resolve_address(host, port)
    cm_id = CMEventChannel.for_running_loop().create_id()
    qp: QueuePair | None = None
    conn: Connection | None = None
    try:
        try:
            _rdmacm.resolve_addr(cm_id.id, dst, _ms_left(deadline))
            await _setup.expect(cm_id, EventType.ADDR_RESOLVED, where)
            _rdmacm.resolve_route(cm_id.id, _ms_left(deadline))
            await _setup.expect(cm_id, EventType.ROUTE_RESOLVED, where)
        except OSError as exc:
            if exc.errno not in (errno.ENODEV, errno.EADDRNOTAVAIL, errno.ENETUNREACH):
                raise
            raise DeviceError(exc.errno, _no_route(host, dst[0], exc)) from exc
        name = cm_id.device_name
        if name is None:
            raise DeviceError(errno.ENODEV, f"no RDMA device routes to {where}")
        shared_receive = settings.shared_receive
        dev = settings.device or (shared_receive.device if shared_receive else Device.shared(name))
        qp = _setup.create_qp_for(cm_id, dev, settings.options, shared_receive)
        request = handshake.request() if handshake is not None else settings.private_data
        _rdmacm.connect(cm_id.id, private_data=request, **_setup.conn_params(qp))
        reply = await _setup.expect(cm_id, EventType.CONNECT_RESPONSE, where)
        peer_data = reply.private_data
        if handshake is not None:
            peer_data = _check_server(handshake, cm_id, qp, reply, where)
        _setup.move_to_rts(qp, cm_id)
        conn = Connection(cm_id, qp, peer_data)
        if handshake is None:
            await _setup.run_prepare(prepare, conn)
            _establish(cm_id, where)
        else:
            await _prove(handshake, conn, cm_id, prepare, where)
        conn._activate()
        metrics.watch(conn)
        return conn
    except BaseException:
        _setup.abandon_setup(cm_id, qp, conn)
        raise


def _no_route(host: str, addr: str, exc: OSError) -> str:
    """Why no RDMA device reaches ``addr``, and which addresses would work."""
    why = exc.strerror or str(exc)
    hint = ""
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(addr.split("%")[0]).is_loopback:
            hint = " (a loopback address is on no RDMA device: use the device's own address)"
    usable = _setup.rdma_addresses()
    return f"cannot connect to {host}: no RDMA device routes there ({why}){hint}; {usable}"


def _establish(cm_id: CMId, where: str) -> None:
    """Confirm the connection to the server (rdma_establish)."""
    try:
        _rdmacm.establish(cm_id.id)
    except OSError as exc:  # EINVAL: the server's CM gave the connection up meanwhile
        raise ConnectionLostError(
            f"{where} gave the connection up before this side confirmed it (did the "
            f"prepare hook take longer than the server's handshake_timeout?): {exc}"
        ) from exc


def _check_server(
    handshake: ClientHandshake, cm_id: CMId, qp: QueuePair, reply: Event, where: str
) -> bytes:
    """The server's own private data once its proof of the key checks; else
    reject the connection, saying why, and raise AuthenticationError."""
    binding = Binding(qp.qp_num, reply.qp_num, cm_id.local_address, cm_id.peer_address)
    try:
        return handshake.check_accept(reply.private_data, binding)
    except Refused as refused:
        try:
            cm_id.reject(refusal(refused.reason))
        except OSError as exc:  # destroying the cm_id rejects too, without the reason
            log.debug("rdma_reject after a failed server proof: %s", exc)
        raise failure(where, refused.reason) from None


async def _prove(
    handshake: ClientHandshake, conn: Connection, cm_id: CMId, prepare: Prepare | None,
    where: str,
) -> None:  # fmt: skip
    """Prove the key to the (verified) server and wait for its verdict.

    The verdict's receive is posted before ``prepare`` posts any, so it is
    the one the server's first message lands in; the server sends nothing
    else before it.
    """
    scratch = conn.alloc(2 * MESSAGE_BUFFER)
    verdict = scratch[:MESSAGE_BUFFER]
    arrival = await _setup.post_handshake_receive(conn.qp, verdict)
    await _setup.run_prepare(prepare, conn)
    _establish(cm_id, where)
    proof = handshake.proof()
    scratch.view()[MESSAGE_BUFFER : MESSAGE_BUFFER + len(proof)] = proof
    try:
        await conn.qp.post_send(scratch[MESSAGE_BUFFER : MESSAGE_BUFFER + len(proof)])
    except RdmaError:
        answer = None
    else:
        answer = await _setup.handshake_message(cm_id, arrival)
    if answer is None:
        raise AuthenticationError(
            f"{where} ended the connection during authentication: it refused this "
            "client's proof of the key, or could not set the connection up"
        )
    if answer != VERDICT:
        raise failure(where, Refusal.MALFORMED)
    scratch.close()


__all__ = ["Connection", "connect", "connect_with"]
