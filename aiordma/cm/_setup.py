"""The set-up steps both sides of an rdma_cm connection share.

:mod:`aiordma.cm.connect` (the active side) and :mod:`aiordma.cm.accept`
(the passive side) each drive a set-up; what they do alike lives here: argument checks,
address resolution, creating a queue pair on the route's port, the
``rdma_conn_param`` values, moving the QP to RTS with rdma_cm's attributes,
awaiting an expected event, and the exception a failed setup event means.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import inspect
import logging
import os
import socket
from typing import TYPE_CHECKING, Final

from pyverbs.addr import GID, AHAttr, GlobalRoute
from pyverbs.qp import QPAttr

from aiordma import _ibv
from aiordma.cm import _rdmacm
from aiordma.cm._events import CMId
from aiordma.cm._rdmacm import Event, EventType
from aiordma.cm.auth import failure, refused
from aiordma.cm.connection import Connection, Prepare
from aiordma.exceptions import (
    ConnectionLostError,
    ConnectionRejectedError,
    DeviceError,
    NoListenerError,
    ResourceBusyError,
    ResourceClosedError,
)
from aiordma.verbs.device import Device
from aiordma.verbs.discovery import known_devices
from aiordma.verbs.endpoint import gid_to_str
from aiordma.verbs.memory import Segment
from aiordma.verbs.options import QueuePairOptions
from aiordma.verbs.queue_pair import QueuePair, check_same_device
from aiordma.verbs.srq import SharedReceiveRing

if TYPE_CHECKING:
    from aiordma.verbs.completion import WorkCompletion

log = logging.getLogger(__name__)

# IB CM reject reasons rdma_cm reports as the REJECTED event's status.
_REJ_INVALID_SERVICE_ID: Final = 8
_REJ_CONSUMER_DEFINED: Final = 28


def check_private_data(data: bytes | bytearray | memoryview, limit: int, what: str) -> bytes:
    """``data`` as bytes: TypeError unless it is bytes-like, ValueError if it
    exceeds what rdma_cm can carry for ``what``."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(
            f"{what} private data must be bytes, bytearray or memoryview, not {type(data).__name__}"
        )
    data = bytes(data)
    if len(data) > limit:
        raise ValueError(
            f"{what} private data is {len(data)} bytes; rdma_cm carries at most {limit}"
        )
    return data


def check_port(port: int, *, listening: bool) -> int:
    """``port`` if it is a valid TCP-style port: 0-65535 to listen (0: any
    free port), 1-65535 to connect; TypeError or ValueError otherwise."""
    if not isinstance(port, int) or isinstance(port, bool):
        raise TypeError(f"port must be an int, not {type(port).__name__}")
    low = 0 if listening else 1
    if not low <= port <= 65535:
        raise ValueError(f"port {port} is outside {low}-65535")
    return port


def check_host(host: object) -> str:
    """``host`` if it is a host name or address as a str; TypeError otherwise."""
    if not isinstance(host, str):
        raise TypeError(f"host must be a str (a name or IP address), not {type(host).__name__}")
    if not host:
        raise ValueError("host must not be empty")
    return host


_QP_FIELDS: Final = (
    "qp_state", "path_mtu", "qkey", "rq_psn", "sq_psn", "dest_qp_num", "qp_access_flags",
    "pkey_index", "max_rd_atomic", "max_dest_rd_atomic", "port_num", "timeout", "retry_cnt",
    "rnr_retry",
)  # fmt: skip
"""The queue pair attributes ``rdma_init_qp_attr`` gives pyverbs' ``QPAttr``
under the same names (the receiver-not-ready timer is the options')."""
_AH_FIELDS: Final = ("dlid", "sl", "src_path_bits", "static_rate", "is_global", "port_num")
"""The fields rdma_cm's address handle gives pyverbs' ``AHAttr`` under the same names."""
_ROUTE_FIELDS: Final = ("flow_label", "sgid_index", "hop_limit", "traffic_class")
"""Likewise for its global route (``GlobalRoute``), besides the GID."""


def _to_pyverbs(raw: _rdmacm.QpAttr, opts: QueuePairOptions) -> QPAttr:
    attr = QPAttr()
    for name in _QP_FIELDS:
        setattr(attr, name, getattr(raw, name))
    attr.min_rnr_timer = opts.min_rnr_timer
    ah = raw.ah_attr
    route = None
    if ah.is_global:
        grh = ah.grh
        dgid = GID(gid_to_str(bytes(grh.dgid.raw)))
        route = GlobalRoute(dgid=dgid, **{name: getattr(grh, name) for name in _ROUTE_FIELDS})
    attr.ah_attr = AHAttr(gr=route, **{name: getattr(ah, name) for name in _AH_FIELDS})
    return attr


def check_shared_receive(shared_receive: SharedReceiveRing | None, device: Device | None) -> None:
    """Refuse a ``shared_receive`` that cannot serve these connections."""
    if shared_receive is None:
        return
    if not isinstance(shared_receive, SharedReceiveRing):
        raise TypeError(
            "shared_receive must be an aiordma.SharedReceiveQueue (or None), not "
            f"{type(shared_receive).__name__}"
        )
    if device is not None:
        check_same_device("the shared receive queue", shared_receive.device, device)
    if shared_receive.is_closing():
        raise ResourceClosedError("the shared receive queue is closed")


def create_qp_for(
    cm_id: CMId,
    device: Device,
    options: QueuePairOptions | None,
    shared_receive: SharedReceiveRing | None = None,
) -> QueuePair:
    """A queue pair on ``cm_id``'s port, in INIT (receiving from ``shared_receive`` if given)."""
    name = cm_id.device_name
    if name != device.name:
        raise DeviceError(
            errno.EXDEV, f"the route goes through RDMA device {name}, not {device.name}"
        )
    init, _ = _qp_attr(cm_id, _ibv.QPS_INIT)
    opts = dataclasses.replace(options or QueuePairOptions(), port=init.port_num)
    return device.create_qp(opts, shared_receive)


def _qp_attr(cm_id: CMId, state: int) -> tuple[_rdmacm.QpAttr, int]:
    """rdma_cm's QP attributes for ``state``; ConnectionLostError once the
    peer's side is gone (EINVAL: it cancelled its connect, or it died)."""
    try:
        return _rdmacm.init_qp_attr(cm_id.id, state)
    except OSError as exc:
        peer = "{}:{}".format(*cm_id.peer_address)
        raise ConnectionLostError(
            f"{peer} abandoned the connection while it was being set up ({exc.strerror})"
        ) from exc


def move_to_rts(qp: QueuePair, cm_id: CMId) -> None:
    """Apply rdma_cm's RTR and RTS attributes for this connection to ``qp``."""
    opts = qp.options
    rtr, rtr_mask = _qp_attr(cm_id, _ibv.QPS_RTR)
    rts, rts_mask = _qp_attr(cm_id, _ibv.QPS_RTS)
    rts_attr = _to_pyverbs(rts, opts)
    rts_attr.timeout = opts.timeout
    qp._move_to_rts(
        _to_pyverbs(rtr, opts),
        rtr_mask | _ibv.QP_MIN_RNR_TIMER,
        rts_attr,
        rts_mask | _ibv.QP_TIMEOUT,
    )


def conn_params(qp: QueuePair) -> dict[str, int]:
    """The rdma_conn_param values for ``qp``: its QP number and RDMA read/atomic depths."""
    attrs = qp.device.attributes
    depth = max(1, min(qp.options.max_rd_atomic, attrs.max_qp_rd_atom))
    return {
        "qp_num": qp.qp_num,
        "resources": depth,
        "depth": min(depth, attrs.max_qp_init_rd_atom),
        "retry": qp.options.retry_cnt,
        "rnr_retry": qp.options.rnr_retry,
        "srq": int(qp.shared_receive is not None),
    }


SETUP_FAILED: Final = b"aiordma-setup:"
"""How a server's rejection starts when it could not set the connection up
(out of locked memory, say); the reason follows, in UTF-8."""


REJECTED: Final = b"aiordma-rejected"
"""What an aiordma server's rejection carries when its ``accept`` gave no
data: a rejection with none (CM reason 28, zeros) is then the kernel's own,
for a request no listener took."""


def rejection(private_data: bytes) -> bytes:
    """Private data for an application's rejection (:data:`REJECTED` for none)."""
    return private_data if private_data.strip(b"\0") else REJECTED


def accept_refusal(exc: BaseException) -> bytes:
    """Private data for rejecting a request whose ``accept`` callback failed:
    its exception's type (the server's log has the rest)."""
    return _setup_failed(f"{type(exc).__name__}: its accept callback failed (its log says why)")


def setup_refusal(exc: BaseException) -> bytes:
    """Private data for rejecting a request that failed on the server's side,
    saying why in general terms (no detail of the server's state leaks to an
    unauthenticated client; the server's log has it)."""
    if isinstance(exc, MemoryError):
        why = "it is out of lockable memory (its 'ulimit -l')"
    elif isinstance(exc, ResourceBusyError):
        why = "it has no room for another connection (a full shared receive queue?)"
    else:
        why = "it could not create the connection's resources"
    return _setup_failed(f"{type(exc).__name__}: {why}")


def _setup_failed(reason: str) -> bytes:
    """:data:`SETUP_FAILED` and ``reason``, cut to what a rejection carries."""
    return SETUP_FAILED + reason.encode()[: _rdmacm.MAX_REJECT_DATA - len(SETUP_FAILED)]


def setup_error(event: Event, where: str, *, requested: bool = False) -> OSError:
    """The exception an asyncio user expects for a failed connection-setup
    event (``requested``: the answer to this side's connection request)."""
    kind, status = event.type, event.status
    if kind == EventType.REJECTED and (reason := refused(event.private_data)) is not None:
        return failure(where, reason, event.private_data, status)
    if kind == EventType.REJECTED and event.private_data.startswith(SETUP_FAILED):
        said = event.private_data[len(SETUP_FAILED) :].rstrip(b"\0").decode(errors="replace")
        return ConnectionRejectedError(
            f"{where} could not set the connection up on its side: {said}",
            event.private_data,
            status,
        )
    if kind == EventType.REJECTED:
        if status == _REJ_CONSUMER_DEFINED and event.private_data.startswith(REJECTED):
            return ConnectionRejectedError(f"{where} rejected the connection", b"", status)
        if requested and status == _REJ_CONSUMER_DEFINED and not event.private_data.strip(b"\0"):
            return NoListenerError(
                f"nothing listening on {where} took the request (the kernel refused it: a "
                "listener at that port of the other address family, as one on an IPv4 "
                "address takes no IPv6 request, or one whose backlog is full)",
                status,
            )
        if status == _REJ_CONSUMER_DEFINED:
            return ConnectionRejectedError(
                f"{where} rejected the connection", event.private_data, status
            )
        if status == _REJ_INVALID_SERVICE_ID:
            return NoListenerError(f"nothing listens on {where}", status)
        return ConnectionRejectedError(
            f"{where} refused the connection (CM reject reason {status})",
            event.private_data,
            status,
        )
    if kind == EventType.DISCONNECTED:
        return ConnectionLostError(f"{where} disconnected while the connection was being set up")
    code = -status if status < 0 else 0
    if kind == EventType.UNREACHABLE and code in (0, errno.ETIMEDOUT):
        return TimeoutError(errno.ETIMEDOUT, f"{where} did not answer the connection request")
    if kind == EventType.DEVICE_REMOVAL:
        return DeviceError(errno.ENODEV, f"the RDMA device was removed while connecting to {where}")
    code = code or _DEFAULT_ERRNO.get(int(kind), errno.EPROTO)
    return OSError(code, f"{event.name} for {where}: {os.strerror(code)}")


_DEFAULT_ERRNO: Final[dict[int, int]] = {
    EventType.ADDR_ERROR: errno.EHOSTUNREACH,
    EventType.ROUTE_ERROR: errno.ENETUNREACH,
    EventType.UNREACHABLE: errno.EHOSTUNREACH,
    EventType.CONNECT_ERROR: errno.ECONNABORTED,
}


async def expect(cm_id: CMId, wanted: EventType, where: str) -> Event:
    """The next event of ``cm_id``, which must be ``wanted``; else the matching error."""
    event, _ = await cm_id.next_event()
    if event.type != wanted:
        if event.type not in _SETUP_FAILURES:
            log.warning("unexpected rdma_cm %s while waiting for %s", event.name, wanted.name)
        raise setup_error(event, where, requested=wanted == EventType.CONNECT_RESPONSE)
    return event


_SETUP_FAILURES: Final = frozenset(
    {
        EventType.ADDR_ERROR,
        EventType.ROUTE_ERROR,
        EventType.CONNECT_ERROR,
        EventType.UNREACHABLE,
        EventType.REJECTED,
        EventType.DEVICE_REMOVAL,
        EventType.DISCONNECTED,
    }
)


async def post_handshake_receive(qp: QueuePair, buffer: Segment) -> asyncio.Future[bytes]:
    """Post the receive the peer's authentication message lands in (into
    ``buffer``, or a buffer of the pool the QP receives from); the future
    gives its bytes."""
    shared = qp.shared_receive
    if shared is not None:
        assert isinstance(shared, SharedReceiveRing)  # what connect and start_server pass
        message = shared.expect(qp)
    else:
        (landed,) = await qp.post_recv_batch([buffer])
        message = asyncio.get_running_loop().create_future()

        def copy(done: asyncio.Future[WorkCompletion]) -> None:
            if message.done():
                return
            if done.cancelled():
                message.cancel()
            elif (error := done.exception()) is not None:
                message.set_exception(error)
            else:
                message.set_result(bytes(buffer.view()[: done.result().byte_len]))

        landed.add_done_callback(copy)
    # Its failure (a flush, once setup fails) is reported by handshake_message, if at all.
    message.add_done_callback(lambda f: f.cancelled() or f.exception())
    return message


async def handshake_message(cm_id: CMId, arrival: asyncio.Future[bytes]) -> bytes | None:
    """The peer's next authentication message (see :func:`post_handshake_receive`);
    None if the connection ended (or its receive failed) first."""
    event = asyncio.ensure_future(cm_id.next_event())
    try:
        await asyncio.wait((arrival, event), return_when=asyncio.FIRST_COMPLETED)
    finally:
        event.cancel()
    if event.done() and not event.cancelled():
        log.debug("rdma_cm %s during authentication", event.result()[0].name)
        return None
    if not arrival.done() or arrival.exception() is not None:
        return None
    return arrival.result()


def rdma_addresses() -> str:
    """The IP addresses of this host's RDMA devices, for an error message."""
    found = sorted(
        {
            f"{gid.ip} ({dev.name})"
            for dev in known_devices()
            for port in dev.ports
            for gid in port.gids
            if gid.ip is not None and not gid.ip.is_link_local
        }
    )
    if not found:
        return "this host has no RDMA device with an IP address ('aiordma devices' lists them)"
    return "RDMA addresses here: " + ", ".join(found)


async def resolve_address(host: str, port: int) -> tuple[str, int]:
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise OSError(exc.errno, f"cannot resolve {host!r}: {exc.strerror}") from exc
    family, _, _, _, sockaddr = infos[0]
    addr = str(sockaddr[0])
    if family == socket.AF_INET6 and len(sockaddr) == 4 and sockaddr[3]:
        addr = f"{addr}%{sockaddr[3]}"
    return addr, int(sockaddr[1])


def abandon_setup(cm_id: CMId, qp: QueuePair | None, conn: Connection | None) -> None:
    """Release what a connection setup that failed had made so far."""
    if conn is not None:
        conn._abandon()
        return
    if qp is not None:
        qp.destroy()
    cm_id.destroy()


async def run_prepare(prepare: Prepare | None, conn: Connection) -> None:
    if prepare is not None:
        result = prepare(conn)
        if inspect.isawaitable(result):
            result = await result
        conn.prepared = result
