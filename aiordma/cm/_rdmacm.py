"""ctypes binding of the librdmacm calls the connection manager needs.

pyverbs 44's rdma_cm classes cannot drive many connections from one event
loop: ``CMEvent`` does not say which cm_id an event belongs to (nor its
listener or status), ``CMEventChannel`` hides its descriptor and cm_ids
cannot be migrated between channels. librdmacm's C interface is small and its
ABI is stable (symbol version ``RDMACM_1.0``), so this module calls it
directly. Verbs objects (QPs, CQs, MRs) stay pyverbs objects: rdma_cm only
computes the attributes that move our own QP through its states.

Every wrapper raises ``OSError`` with the call's errno on failure. Struct
layouts are checked against the C headers by ``tests/cm/test_rdmacm_abi.py``.
"""

from __future__ import annotations

import ctypes
import enum
import os
import socket
import struct
from ctypes import (
    POINTER,
    Structure,
    Union,
    c_char_p,
    c_int,
    c_size_t,
    c_uint8,
    c_uint16,
    c_uint32,
    c_uint64,
    c_void_p,
)
from dataclasses import dataclass
from typing import Any, Final

RDMA_PS_TCP: Final = 0x0106
RDMA_OPTION_ID: Final = 0
RDMA_OPTION_ID_REUSEADDR: Final = 1
RDMA_OPTION_ID_AFONLY: Final = 2

# Private data a consumer may send over RoCE/InfiniBand with RDMA_PS_TCP
# (the CM message's room minus rdma_cm's own header, where it has one).
MAX_CONNECT_DATA: Final = 56
MAX_ACCEPT_DATA: Final = 196
MAX_REJECT_DATA: Final = 148


class EventType(enum.IntEnum):
    """``enum rdma_cm_event_type``."""

    ADDR_RESOLVED = 0
    ADDR_ERROR = 1
    ROUTE_RESOLVED = 2
    ROUTE_ERROR = 3
    CONNECT_REQUEST = 4
    CONNECT_RESPONSE = 5
    CONNECT_ERROR = 6
    UNREACHABLE = 7
    REJECTED = 8
    ESTABLISHED = 9
    DISCONNECTED = 10
    DEVICE_REMOVAL = 11
    MULTICAST_JOIN = 12
    MULTICAST_ERROR = 13
    ADDR_CHANGE = 14
    TIMEWAIT_EXIT = 15


class _Gid(Union):
    _fields_ = (("raw", c_uint8 * 16), ("_align", c_uint64 * 2))


class GlobalRoute(Structure):
    _fields_ = (
        ("dgid", _Gid),
        ("flow_label", c_uint32),
        ("sgid_index", c_uint8),
        ("hop_limit", c_uint8),
        ("traffic_class", c_uint8),
    )


class AhAttr(Structure):
    _fields_ = (
        ("grh", GlobalRoute),
        ("dlid", c_uint16),
        ("sl", c_uint8),
        ("src_path_bits", c_uint8),
        ("static_rate", c_uint8),
        ("is_global", c_uint8),
        ("port_num", c_uint8),
    )


class QpCap(Structure):
    _fields_ = (
        ("max_send_wr", c_uint32),
        ("max_recv_wr", c_uint32),
        ("max_send_sge", c_uint32),
        ("max_recv_sge", c_uint32),
        ("max_inline_data", c_uint32),
    )


class QpAttr(Structure):
    """``struct ibv_qp_attr``, as filled by ``rdma_init_qp_attr``."""

    _fields_ = (
        ("qp_state", c_int),
        ("cur_qp_state", c_int),
        ("path_mtu", c_int),
        ("path_mig_state", c_int),
        ("qkey", c_uint32),
        ("rq_psn", c_uint32),
        ("sq_psn", c_uint32),
        ("dest_qp_num", c_uint32),
        ("qp_access_flags", c_uint32),
        ("cap", QpCap),
        ("ah_attr", AhAttr),
        ("alt_ah_attr", AhAttr),
        ("pkey_index", c_uint16),
        ("alt_pkey_index", c_uint16),
        ("en_sqd_async_notify", c_uint8),
        ("sq_draining", c_uint8),
        ("max_rd_atomic", c_uint8),
        ("max_dest_rd_atomic", c_uint8),
        ("min_rnr_timer", c_uint8),
        ("port_num", c_uint8),
        ("timeout", c_uint8),
        ("retry_cnt", c_uint8),
        ("rnr_retry", c_uint8),
        ("alt_port_num", c_uint8),
        ("alt_timeout", c_uint8),
        ("rate_limit", c_uint32),
    )


class ConnParam(Structure):
    """``struct rdma_conn_param``."""

    _fields_ = (
        ("private_data", c_void_p),
        ("private_data_len", c_uint8),
        ("responder_resources", c_uint8),
        ("initiator_depth", c_uint8),
        ("flow_control", c_uint8),
        ("retry_count", c_uint8),
        ("rnr_retry_count", c_uint8),
        ("srq", c_uint8),
        ("qp_num", c_uint32),
    )


class _EventParam(Union):
    # The UD variant (56 bytes) is never read but sets the union's size.
    _fields_ = (("conn", ConnParam), ("_ud", c_uint8 * 56))


class CmEvent(Structure):
    """``struct rdma_cm_event``."""

    _fields_ = (
        ("id", c_void_p),
        ("listen_id", c_void_p),
        ("event", c_int),
        ("status", c_int),
        ("param", _EventParam),
    )


class CmIdHead(Structure):
    """The leading fields of ``struct rdma_cm_id`` (the rest is never read).

    ``rdma_get_local_addr`` and ``rdma_get_peer_addr`` are inline functions in
    the header, not exported symbols: they return these two fields' addresses.
    """

    _fields_ = (
        ("verbs", c_void_p),
        ("channel", c_void_p),
        ("context", c_void_p),
        ("qp", c_void_p),
        ("src_addr", ctypes.c_char * 128),
        ("dst_addr", ctypes.c_char * 128),
    )


class EventChannelStruct(Structure):
    _fields_ = (("fd", c_int),)


def _load(name: str) -> ctypes.CDLL:
    try:
        return ctypes.CDLL(name, use_errno=True)
    except OSError as exc:
        raise ImportError(
            f"{name} is missing: install rdma-core's libraries (Debian: librdmacm1, libibverbs1)"
        ) from exc


_cm = _load("librdmacm.so.1")
_verbs = _load("libibverbs.so.1")


def _proto(lib: ctypes.CDLL, name: str, restype: Any, *argtypes: Any) -> Any:
    fn = getattr(lib, name)
    fn.restype = restype
    fn.argtypes = argtypes
    return fn


_create_event_channel = _proto(_cm, "rdma_create_event_channel", POINTER(EventChannelStruct))
_destroy_event_channel = _proto(
    _cm, "rdma_destroy_event_channel", None, POINTER(EventChannelStruct)
)
_create_id = _proto(
    _cm, "rdma_create_id", c_int, POINTER(EventChannelStruct), POINTER(c_void_p), c_void_p, c_int
)
_destroy_id = _proto(_cm, "rdma_destroy_id", c_int, c_void_p)
_bind_addr = _proto(_cm, "rdma_bind_addr", c_int, c_void_p, c_void_p)
_listen = _proto(_cm, "rdma_listen", c_int, c_void_p, c_int)
_resolve_addr = _proto(_cm, "rdma_resolve_addr", c_int, c_void_p, c_void_p, c_void_p, c_int)
_resolve_route = _proto(_cm, "rdma_resolve_route", c_int, c_void_p, c_int)
_connect = _proto(_cm, "rdma_connect", c_int, c_void_p, POINTER(ConnParam))
_accept = _proto(_cm, "rdma_accept", c_int, c_void_p, POINTER(ConnParam))
_reject = _proto(_cm, "rdma_reject", c_int, c_void_p, c_void_p, c_uint8)
_establish = _proto(_cm, "rdma_establish", c_int, c_void_p)
_disconnect = _proto(_cm, "rdma_disconnect", c_int, c_void_p)
_get_cm_event = _proto(
    _cm, "rdma_get_cm_event", c_int, POINTER(EventChannelStruct), POINTER(POINTER(CmEvent))
)
_ack_cm_event = _proto(_cm, "rdma_ack_cm_event", c_int, POINTER(CmEvent))
_init_qp_attr = _proto(_cm, "rdma_init_qp_attr", c_int, c_void_p, POINTER(QpAttr), POINTER(c_int))
_set_option = _proto(_cm, "rdma_set_option", c_int, c_void_p, c_int, c_int, c_void_p, c_size_t)
_event_str = _proto(_cm, "rdma_event_str", c_char_p, c_int)
_get_devices = _proto(_cm, "rdma_get_devices", POINTER(c_void_p), POINTER(c_int))
_free_devices = _proto(_cm, "rdma_free_devices", None, POINTER(c_void_p))
_get_device_name = _proto(_verbs, "ibv_get_device_name", c_char_p, c_void_p)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def event_name(event: int) -> str:
    raw = _event_str(event)
    return raw.decode() if raw else f"event {event}"


# -- socket addresses ---------------------------------------------------------

_SOCKADDR_SIZE: Final = 128  # sockaddr_storage


def pack_sockaddr(host: str, port: int) -> ctypes.Array[ctypes.c_char]:
    """A ``sockaddr_in``/``sockaddr_in6`` for a numeric IPv4 or IPv6 address."""
    buf = ctypes.create_string_buffer(_SOCKADDR_SIZE)
    if ":" in host:
        addr, _, scope = host.partition("%")
        if scope and not scope.isdigit():
            scope_id = socket.if_nametoindex(scope)
        else:
            scope_id = int(scope or 0)
        packed = socket.inet_pton(socket.AF_INET6, addr)
        raw = (
            struct.pack("=H", socket.AF_INET6)
            + struct.pack("!HI16s", port, 0, packed)
            + struct.pack("=I", scope_id)
        )
    else:
        raw = struct.pack("=H", socket.AF_INET) + struct.pack(
            "!H4s", port, socket.inet_pton(socket.AF_INET, host)
        )
    ctypes.memmove(buf, raw, len(raw))
    return buf


def unpack_sockaddr(ptr: int | None) -> tuple[str, int]:
    """(host, port) from a ``sockaddr *``; ``("", 0)`` when unset."""
    if not ptr:
        return ("", 0)
    (family,) = struct.unpack("=H", ctypes.string_at(ptr, 2))
    if family == socket.AF_INET:
        port, addr = struct.unpack("!H4s", ctypes.string_at(ptr + 2, 6))
        return (socket.inet_ntop(socket.AF_INET, addr), port)
    if family == socket.AF_INET6:
        port, _flow, addr = struct.unpack("!HI16s", ctypes.string_at(ptr + 2, 22))
        return (socket.inet_ntop(socket.AF_INET6, addr), port)
    return ("", 0)


# -- objects --------------------------------------------------------------------


class EventChannel:
    """An ``rdma_event_channel``; its descriptor is public in the C struct."""

    def __init__(self) -> None:
        ptr = _create_event_channel()
        if not ptr:
            err = ctypes.get_errno()
            raise OSError(err, f"rdma_create_event_channel: {os.strerror(err)}")
        self._ptr: Any = ptr
        self.fd: int = ptr.contents.fd

    @property
    def closed(self) -> bool:
        return self._ptr is None

    def create_id(self) -> int:
        """A new RDMA_PS_TCP cm_id on this channel; returns its address."""
        out = c_void_p()
        _check(_create_id(self._ptr, ctypes.byref(out), None, RDMA_PS_TCP), "rdma_create_id")
        assert out.value is not None
        return out.value

    def get_event(self) -> Event | None:
        """The next event, copied and acknowledged; None when none is pending."""
        evp = POINTER(CmEvent)()
        if _get_cm_event(self._ptr, ctypes.byref(evp)) != 0:
            err = ctypes.get_errno()
            if err in (11, 4):  # EAGAIN, EINTR
                return None
            raise OSError(err, f"rdma_get_cm_event: {os.strerror(err)}")
        try:
            return Event.from_struct(evp.contents)
        finally:
            _check(_ack_cm_event(evp), "rdma_ack_cm_event")

    def close(self) -> None:
        ptr, self._ptr = self._ptr, None
        if ptr is not None:
            _destroy_event_channel(ptr)


@dataclass(frozen=True, slots=True)
class Event:
    """A copy of one ``rdma_cm_event`` (the original is acknowledged at once)."""

    type: EventType | int
    status: int
    id: int
    listen_id: int
    private_data: bytes
    qp_num: int
    responder_resources: int
    initiator_depth: int
    retry_count: int
    rnr_retry_count: int

    @classmethod
    def from_struct(cls, ev: CmEvent) -> Event:
        conn = ev.param.conn
        kind: EventType | int
        try:
            kind = EventType(ev.event)
        except ValueError:
            kind = ev.event
        data = b""
        if conn.private_data and conn.private_data_len and kind in _CONN_EVENTS:
            data = ctypes.string_at(conn.private_data, conn.private_data_len)
        return cls(
            kind,
            ev.status,
            ev.id or 0,
            ev.listen_id or 0,
            data,
            conn.qp_num if kind in _CONN_EVENTS else 0,
            conn.responder_resources,
            conn.initiator_depth,
            conn.retry_count,
            conn.rnr_retry_count,
        )

    @property
    def name(self) -> str:
        return event_name(int(self.type))


_CONN_EVENTS: Final = frozenset(
    {
        EventType.CONNECT_REQUEST,
        EventType.CONNECT_RESPONSE,
        EventType.REJECTED,
        EventType.ESTABLISHED,
    }
)


def destroy_id(cm_id: int) -> None:
    _check(_destroy_id(cm_id), "rdma_destroy_id")


def bind_addr(cm_id: int, host: str, port: int) -> None:
    _check(_bind_addr(cm_id, pack_sockaddr(host, port)), f"rdma_bind_addr({host}, {port})")


def listen(cm_id: int, backlog: int) -> None:
    _check(_listen(cm_id, backlog), "rdma_listen")


def resolve_addr(cm_id: int, dst: tuple[str, int], timeout_ms: int) -> None:
    _check(
        _resolve_addr(cm_id, None, pack_sockaddr(*dst), timeout_ms),
        f"rdma_resolve_addr({dst[0]})",
    )


def resolve_route(cm_id: int, timeout_ms: int) -> None:
    _check(_resolve_route(cm_id, timeout_ms), "rdma_resolve_route")


def _conn_param(
    qp_num: int, private_data: bytes, resources: int, depth: int, retry: int, rnr_retry: int,
    srq: int,
) -> tuple[ConnParam, Any]:  # fmt: skip
    data = ctypes.create_string_buffer(private_data, len(private_data)) if private_data else None
    param = ConnParam(
        private_data=ctypes.cast(data, c_void_p) if data is not None else None,
        private_data_len=len(private_data),
        responder_resources=resources,
        initiator_depth=depth,
        flow_control=1,
        retry_count=retry,
        rnr_retry_count=rnr_retry,
        srq=srq,
        qp_num=qp_num,
    )
    return param, data


def connect(cm_id: int, qp_num: int, private_data: bytes, resources: int, depth: int,
            retry: int, rnr_retry: int, srq: int = 0) -> None:  # fmt: skip
    param, _keep = _conn_param(qp_num, private_data, resources, depth, retry, rnr_retry, srq)
    _check(_connect(cm_id, ctypes.byref(param)), "rdma_connect")


def accept(cm_id: int, qp_num: int, private_data: bytes, resources: int, depth: int,
           retry: int, rnr_retry: int, srq: int = 0) -> None:  # fmt: skip
    param, _keep = _conn_param(qp_num, private_data, resources, depth, retry, rnr_retry, srq)
    _check(_accept(cm_id, ctypes.byref(param)), "rdma_accept")


def reject(cm_id: int, private_data: bytes) -> None:
    data = ctypes.create_string_buffer(private_data, len(private_data)) if private_data else None
    _check(_reject(cm_id, data, len(private_data)), "rdma_reject")


def establish(cm_id: int) -> None:
    _check(_establish(cm_id), "rdma_establish")


def disconnect(cm_id: int) -> None:
    _check(_disconnect(cm_id), "rdma_disconnect")


def init_qp_attr(cm_id: int, state: int) -> tuple[QpAttr, int]:
    """The attributes (and their mask) that move a QP to ``state`` for this connection."""
    attr = QpAttr(qp_state=state)
    mask = c_int()
    _check(_init_qp_attr(cm_id, ctypes.byref(attr), ctypes.byref(mask)), "rdma_init_qp_attr")
    return attr, mask.value


def set_afonly(cm_id: int, afonly: bool) -> None:
    value = c_int(int(afonly))
    _check(
        _set_option(cm_id, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, ctypes.byref(value), 4),
        "rdma_set_option(AFONLY)",
    )


def local_addr(cm_id: int) -> tuple[str, int]:
    return unpack_sockaddr(cm_id + CmIdHead.src_addr.offset)


def peer_addr(cm_id: int) -> tuple[str, int]:
    return unpack_sockaddr(cm_id + CmIdHead.dst_addr.offset)


def device_name(cm_id: int) -> str | None:
    """Name of the RDMA device the cm_id is bound to, once it is bound to one."""
    verbs = CmIdHead.from_address(cm_id).verbs
    if not verbs:
        return None
    device = c_void_p.from_address(verbs).value
    raw = _get_device_name(device) if device else None
    return raw.decode() if raw else None


def device_names() -> list[str] | None:
    """Names of the devices librdmacm knows, after it re-reads the system's list.

    Re-reading is also what makes librdmacm close its own context on a removed
    device (once no cm_id uses it); until then the kernel cannot finish the
    removal. None when librdmacm found no device at all: it then skips the
    re-reading (rdma-core 44 to 64 at least), so it keeps the context on the
    last removed device until the process exits.
    """
    contexts = _get_devices(None)
    if not contexts:
        return None
    names = []
    try:
        i = 0
        while contexts[i]:
            device = c_void_p.from_address(contexts[i]).value
            raw = _get_device_name(device) if device else None
            if raw:
                names.append(raw.decode())
            i += 1
    finally:
        _free_devices(contexts)
    return names
