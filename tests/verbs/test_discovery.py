"""Device listing: sysfs parsing on a synthetic tree, and the real lab device."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

from aiordma.verbs.discovery import find_roce_endpoint, format_devices, gid_to_ip, list_devices
from tests.conftest import Lab, run_python


def _fake_sysfs(root: Path) -> Path:
    port = root / "mlx0" / "ports" / "1"
    (port / "gids").mkdir(parents=True)
    (port / "gid_attrs" / "types").mkdir(parents=True)
    (port / "gid_attrs" / "ndevs").mkdir(parents=True)
    (root / "mlx0" / "node_type").write_text("1: CA\n")
    (port / "state").write_text("4: ACTIVE\n")
    (port / "phys_state").write_text("5: LinkUp\n")
    (port / "link_layer").write_text("Ethernet\n")
    gids = {
        0: ("fe80:0000:0000:0000:a866:21ff:fe67:2270", "RoCE v2"),
        1: ("0000:0000:0000:0000:0000:ffff:c000:0201", "RoCE v2"),
        2: ("0000:0000:0000:0000:0000:ffff:c000:0201", "IB/RoCE v1"),
        3: ("2001:0db8:0000:0000:0000:0000:0000:0001", "RoCE v2"),
        4: ("0000:0000:0000:0000:0000:0000:0000:0000", None),
    }
    for i, (gid, gid_type) in gids.items():
        (port / "gids" / str(i)).write_text(gid + "\n")
        if gid_type is not None:
            (port / "gid_attrs" / "types" / str(i)).write_text(gid_type + "\n")
            (port / "gid_attrs" / "ndevs" / str(i)).write_text("eth0\n")
    return root


def test_gid_to_ip() -> None:
    assert gid_to_ip("0000:0000:0000:0000:0000:ffff:c000:0201") == ipaddress.ip_address("192.0.2.1")
    assert gid_to_ip("2001:0db8:0000:0000:0000:0000:0000:0001") == ipaddress.ip_address(
        "2001:db8::1"
    )
    assert gid_to_ip("0000:0000:0000:0000:0000:0000:0000:0000") is None
    assert gid_to_ip("not a gid") is None


def test_list_devices_parses_sysfs(tmp_path: Path) -> None:
    (dev,) = list_devices(_fake_sysfs(tmp_path))
    assert dev.name == "mlx0"
    assert dev.node_type == "CA"
    (port,) = dev.ports
    assert port.active
    assert port.phys_state == "LinkUp"
    assert port.link_layer == "Ethernet"
    assert [g.index for g in port.gids] == [0, 1, 2, 3]  # the empty entry is dropped
    assert str(port.gids[1].ip) == "192.0.2.1"
    assert port.gids[1].netdev == "eth0"


def test_find_roce_endpoint_prefers_routable_v2(tmp_path: Path) -> None:
    devices = list_devices(_fake_sysfs(tmp_path))
    ep4 = find_roce_endpoint(devices)
    assert ep4 is not None
    assert (ep4.device, ep4.port, ep4.gid_index) == ("mlx0", 1, 1)
    ep6 = find_roce_endpoint(devices, family=6)
    assert ep6 is not None
    assert ep6.gid_index == 3
    assert find_roce_endpoint(devices, device="other") is None


def test_inactive_ports_are_not_endpoints(tmp_path: Path) -> None:
    root = _fake_sysfs(tmp_path)
    (root / "mlx0" / "ports" / "1" / "state").write_text("1: DOWN\n")
    assert find_roce_endpoint(list_devices(root)) is None


def test_format_devices(tmp_path: Path) -> None:
    text = format_devices(list_devices(_fake_sysfs(tmp_path)))
    assert "mlx0" in text
    assert "-> 192.0.2.1" in text
    assert "port 1: ACTIVE" in text
    assert "no RDMA devices" in format_devices([])


def test_missing_sysfs_means_no_devices(tmp_path: Path) -> None:
    assert list_devices(tmp_path / "absent") == []


def test_lab_device_is_active_with_its_address(lab: Lab) -> None:
    (dev,) = [d for d in list_devices() if d.name == lab.device]
    ips = {str(g.ip) for p in dev.ports if p.active for g in p.gids}
    assert lab.addr in ips
    if lab.addr6:
        assert lab.addr6 in ips


def test_pyverbs_sees_lab_device(lab: Lab) -> None:
    from pyverbs.device import Context

    with Context(name=lab.device) as ctx:
        port = ctx.query_port(1)
        assert port.state == 4  # IBV_PORT_ACTIVE
        gids = {ctx.query_gid(1, i).gid for i in range(port.gid_tbl_len) if i < 8}
    assert any(gid_to_ip(g) == ipaddress.ip_address(lab.addr) for g in gids), gids


def test_devices_command_json(lab: Lab) -> None:
    done = run_python(["-m", "aiordma", "devices", "--json"], timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    rows = json.loads(out)
    (row,) = [r for r in rows if r["name"] == lab.device]
    assert any(g["ip"] == lab.addr for p in row["ports"] for g in p["gids"])
