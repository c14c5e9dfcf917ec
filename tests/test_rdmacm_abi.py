"""The librdmacm binding's pure parts: struct layouts, socket addresses, error mapping.

No device needed. The expected layouts were printed by a C program compiled
against rdma-core's headers (``offsetof``/``sizeof`` on x86-64); the ABI is
stable, so a difference means the ctypes declarations were edited wrongly.
"""

from __future__ import annotations

import ctypes
import errno

import pytest

from aiordma import _rdmacm
from aiordma._rdmacm import AhAttr, CmEvent, CmIdHead, ConnParam, Event, EventType, QpAttr
from aiordma.connection import check_private_data, setup_error
from aiordma.exceptions import ConnectionRejectedError, DeviceError


def test_struct_layouts_match_the_c_headers() -> None:
    assert ctypes.sizeof(CmEvent) == 80
    assert (CmEvent.id.offset, CmEvent.listen_id.offset) == (0, 8)
    assert (CmEvent.event.offset, CmEvent.status.offset, CmEvent.param.offset) == (16, 20, 24)
    assert ctypes.sizeof(ConnParam) == 24
    assert ConnParam.private_data_len.offset == 8
    assert ConnParam.responder_resources.offset == 9
    assert ConnParam.qp_num.offset == 16
    assert ctypes.sizeof(QpAttr) == 144
    assert QpAttr.qp_access_flags.offset == 32
    assert QpAttr.cap.offset == 36
    assert (QpAttr.ah_attr.offset, QpAttr.alt_ah_attr.offset) == (56, 88)
    assert QpAttr.pkey_index.offset == 120
    assert QpAttr.max_rd_atomic.offset == 126
    assert QpAttr.port_num.offset == 129
    assert QpAttr.rate_limit.offset == 136
    assert ctypes.sizeof(AhAttr) == 32
    assert (AhAttr.dlid.offset, AhAttr.port_num.offset) == (24, 30)
    assert (CmIdHead.verbs.offset, CmIdHead.context.offset, CmIdHead.qp.offset) == (0, 16, 24)
    assert (CmIdHead.src_addr.offset, CmIdHead.dst_addr.offset) == (32, 160)


@pytest.mark.parametrize(
    ("host", "port"), [("192.0.2.1", 7471), ("2001:db8::1", 1), ("::", 0), ("0.0.0.0", 65535)]
)
def test_socket_addresses_round_trip(host: str, port: int) -> None:
    buf = _rdmacm.pack_sockaddr(host, port)
    assert _rdmacm.unpack_sockaddr(ctypes.addressof(buf)) == (host, port)


def test_unset_socket_address_reads_empty() -> None:
    assert _rdmacm.unpack_sockaddr(None) == ("", 0)
    assert _rdmacm.unpack_sockaddr(ctypes.addressof(ctypes.create_string_buffer(128))) == ("", 0)


def test_private_data_limits_are_enforced() -> None:
    assert check_private_data(bytearray(56), 56, "connect") == bytes(56)
    with pytest.raises(ValueError, match="connect private data is 57 bytes"):
        check_private_data(bytes(57), 56, "connect")


def _event(kind: EventType, status: int, data: bytes = b"") -> Event:
    return Event(kind, status, 1, 0, data, 0, 0, 0, 0, 0)


def test_setup_failures_map_to_the_exceptions_asyncio_users_expect() -> None:
    nobody = setup_error(_event(EventType.REJECTED, 8), "h:1")
    assert isinstance(nobody, ConnectionRefusedError)
    assert "nothing listens on h:1" in str(nobody)
    rejected = setup_error(_event(EventType.REJECTED, 28, b"no\0\0"), "h:1")
    assert isinstance(rejected, ConnectionRejectedError)
    assert rejected.private_data == b"no\0\0"
    timeout = setup_error(_event(EventType.UNREACHABLE, -errno.ETIMEDOUT), "h:1")
    assert isinstance(timeout, TimeoutError)
    addr = setup_error(_event(EventType.ADDR_ERROR, -errno.ENETUNREACH), "h:1")
    assert type(addr) is OSError
    assert addr.errno == errno.ENETUNREACH
    route = setup_error(_event(EventType.ROUTE_ERROR, 0), "h:1")
    assert route.errno == errno.ENETUNREACH
    removed = setup_error(_event(EventType.DEVICE_REMOVAL, 0), "h:1")
    assert isinstance(removed, DeviceError)
    assert removed.errno == errno.ENODEV


def test_event_names_come_from_librdmacm() -> None:
    assert _rdmacm.event_name(EventType.ESTABLISHED) == "RDMA_CM_EVENT_ESTABLISHED"
