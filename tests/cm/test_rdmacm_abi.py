"""The librdmacm binding's pure parts: struct layouts, socket addresses, error mapping.

No device needed. The expected layouts were printed by a C program compiled
against rdma-core's headers (``offsetof``/``sizeof`` on x86-64); the ABI is
stable, so a difference means the ctypes declarations were edited wrongly.
"""

from __future__ import annotations

import ctypes
import errno

import pytest

from aiordma.cm import _rdmacm
from aiordma.cm._rdmacm import AhAttr, CmEvent, CmIdHead, ConnParam, Event, EventType, QpAttr
from aiordma.cm._setup import check_port, check_private_data, setup_error
from aiordma.exceptions import (
    CompletionError,
    ConnectionRejectedError,
    DeviceError,
    NoListenerError,
    RemoteAccessError,
)


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
    assert isinstance(nobody, NoListenerError)
    assert isinstance(nobody, ConnectionRefusedError)
    assert not isinstance(nobody, ConnectionRejectedError)
    assert "nothing listens on h:1" in str(nobody)
    rejected = setup_error(_event(EventType.REJECTED, 28, b"no\0\0"), "h:1")
    assert isinstance(rejected, ConnectionRejectedError)
    assert rejected.private_data == b"no\0\0"
    assert rejected.reason == 28
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


def test_ports_and_private_data_are_checked_before_anything_is_sent() -> None:
    assert check_port(0, listening=True) == 0
    assert check_port(65535, listening=False) == 65535
    for port in (-1, 65536, 70000):
        with pytest.raises(ValueError, match=f"port {port} is outside"):
            check_port(port, listening=True)
    with pytest.raises(ValueError, match="outside 1-65535"):
        check_port(0, listening=False)
    with pytest.raises(TypeError, match="port must be an int"):
        check_port(True, listening=False)
    with pytest.raises(TypeError, match="not int"):
        check_private_data(5, 56, "connect")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not list"):
        check_private_data([1, 2, 3], 56, "connect")  # type: ignore[arg-type]


def test_completion_errors_say_what_usually_causes_them() -> None:
    rnr = CompletionError(13, "IBV_WC_RNR_RETRY_EXC_ERR", 0, "SEND", 1)
    assert "did both sides set up a message channel" in str(rnr)
    access = RemoteAccessError(10, "IBV_WC_REM_ACCESS_ERR", 0, "RDMA_READ", 2)
    for cause in ("remote access flag", "another device or protection domain", "outside"):
        assert cause in str(access)
    plain = CompletionError(5, "IBV_WC_WR_FLUSH_ERR", 0, "RECV", 3)
    assert str(plain) == "RECV failed: IBV_WC_WR_FLUSH_ERR (status 5, vendor error 0x0)"
