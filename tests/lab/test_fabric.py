"""The two-host lab's link settings (no guest needed)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from aiordma.exceptions import LabError
from aiordma.lab.fabric import FabricConfig, _dgram_opts, _stream_opts, listening


def test_a_listening_socket_is_seen_without_connecting_to_it(tmp_path: Path) -> None:
    path = tmp_path / "link.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        assert not listening(path)  # bound, not yet listening
        server.listen()
        assert listening(path)
        assert not listening(tmp_path / "other.sock")
    assert not listening(path)


def test_host_1_listens_and_host_2_connects_on_a_stream() -> None:
    path = Path("/tmp/fabric/link.sock")
    one, two = _stream_opts(1, path), _stream_opts(2, path)
    assert "stream" in one[0]
    assert "server=on" in one[0]
    assert "addr.type=unix,addr.path=/tmp/fabric/link.sock" in one[0]
    assert "server=off" in two[0]
    assert "addr.path=/tmp/fabric/link.sock" in two[0]
    udp = _dgram_opts(2, 6001, 6000)[0]
    assert "local.port=6001" in udp
    assert "remote.port=6000" in udp


def test_an_unknown_link_is_refused() -> None:
    with pytest.raises(LabError, match="stream, dgram"):
        FabricConfig(link="carrier pigeon")
