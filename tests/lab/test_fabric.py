"""The two-host lab's link settings (no guest needed)."""

from __future__ import annotations

import socket

import pytest

from aiordma.exceptions import LabError
from aiordma.lab.fabric import FabricConfig, _link_opts, listening


def test_a_listening_port_is_seen_without_connecting_to_it() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        port = server.getsockname()[1]
        assert not listening(port)  # bound, not yet listening
        server.listen()
        assert listening(port)
    assert not listening(port)


def test_host_1_listens_and_host_2_connects_on_a_stream() -> None:
    one, two = _link_opts("stream", 1, 5000, 5000), _link_opts("stream", 2, 5000, 5000)
    assert "stream" in one[0]
    assert "server=on" in one[0]
    assert "addr.port=5000" in one[0]
    assert "server=off" in two[0]
    assert "addr.port=5000" in two[0]
    udp = _link_opts("dgram", 2, 6001, 6000)[0]
    assert "local.port=6001" in udp
    assert "remote.port=6000" in udp


def test_an_unknown_link_is_refused() -> None:
    with pytest.raises(LabError, match="stream, dgram"):
        FabricConfig(link="carrier pigeon")
